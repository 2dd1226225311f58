"""A user's own job, as the job benchmarks build it (jobs, lora, packing, evaluation_job):
the tests' tokenizer, data and factories (tests/job_script.py) with a checkpoint built
from a config, then their own run of it: their factory's trainer, their fields, in a
process of its own, optionally under RLIMIT_DATA set after the imports (as a user's
script runs under a machine's memory).

    python benchmarks/_user_job.py WORK MODULE:FACTORY SPEC.json OUT.json  # the child
"""

from __future__ import annotations

import importlib
import json
import random
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness import ENV, ROOT

sys.path.insert(0, str(ROOT / "tests"))
from job_script import BASE_ARGS, WORDS, write_job

__all__ = ["BASE_ARGS", "WORDS", "checkpoint", "texts", "their_run", "write_job"]


def checkpoint(work: Path, name: str, model_type: str, bf16: bool = False, **fields: Any) -> None:
    """A causal LM of `model_type` with random weights, saved in `work/name` (in place of
    the tests' own), its special tokens the tokenizer's, its head untied, its
    vocabulary the tokenizer's unless `fields` say otherwise."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(work / "tokenizer")
    config = AutoConfig.for_model(
        model_type,
        vocab_size=fields.pop("vocab_size", len(tokenizer)),
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        **fields,
    )
    model = AutoModelForCausalLM.from_config(config)
    shutil.rmtree(work / name, ignore_errors=True)
    (model.to(torch.bfloat16) if bf16 else model).save_pretrained(work / name)


def texts(path: Path, count: int, words: tuple[int, int], seed: int = 0) -> None:
    """`count` samples of random words, `words` (fewest, most) each, as jsonl."""
    rng = random.Random(seed)
    lines = [" ".join(rng.choices(WORDS, k=rng.randint(*words))) for _ in range(count)]
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in lines))


def their_run(work: Path, factory: str, fields: dict[str, Any], limit: int = 0) -> dict[str, Any]:
    """The user's `factory` ("job:make_trainer") trained with these SFTConfig fields in a
    process of its own, under `limit` bytes (0: none): samples/s after the first
    optimizer step, the evaluations it ran and the checkpoints it saved; or the error it
    died of."""
    spec, out = work / "their-run.json", work / "their-run.out.json"
    spec.write_text(json.dumps({"fields": fields, "limit": limit}))
    out.unlink(missing_ok=True)
    done = subprocess.run(
        [sys.executable, __file__, str(work), factory, str(spec), str(out)],
        capture_output=True,
        text=True,
        check=False,
        env={**ENV, "ARROW_DEFAULT_MEMORY_POOL": "system"},  # as harness.train says why
    )
    if done.returncode == 0:
        result: dict[str, Any] = json.loads(out.read_text())
        return result
    errors = [line for line in done.stderr.splitlines() if "Error" in line]
    return {"error": (errors[-1] if errors else f"exit {done.returncode}")[:200]}


def _child(work: Path, factory: str, spec_path: Path, out: Path) -> None:
    sys.path.insert(0, str(work))
    from transformers import HfArgumentParser, TrainerCallback
    from trl import SFTConfig

    module, name = factory.split(":")
    job = importlib.import_module(module)  # the user's script
    spec = json.loads(spec_path.read_text())
    (args,) = HfArgumentParser(SFTConfig).parse_dict(spec["fields"])
    if spec["limit"]:
        resource.setrlimit(resource.RLIMIT_DATA, (spec["limit"], spec["limit"]))
    trainer = getattr(job, name)(args)
    ends: list[float] = []
    samples: list[int] = []  # a packed row's samples: where its position ids restart

    class Steps(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            ends.append(time.perf_counter())

    def count(module: Any, _args: Any, kwargs: dict[str, Any]) -> None:
        if module.training:
            positions, ids = kwargs.get("position_ids"), kwargs["input_ids"]
            samples.append(int((positions == 0).sum()) if positions is not None else len(ids))

    trainer.add_callback(Steps())
    trainer.model.register_forward_pre_hook(count, with_kwargs=True)
    trainer.train()
    after_first = sum(samples[args.gradient_accumulation_steps :])
    folder = Path(args.output_dir)
    result = {
        "samples_per_s": after_first / (ends[-1] - ends[0]) if len(ends) > 1 else None,
        "evaluations": sum("eval_loss" in h for h in trainer.state.log_history),
        "saved": sorted(p.name for p in folder.glob("checkpoint-*")) if folder.exists() else [],
    }
    out.write_text(json.dumps(result))


if __name__ == "__main__":
    _child(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]))
