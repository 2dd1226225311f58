"""The user's job in a child process: their Trainer, built by their factory.

A probe, parity run or confirmation of a search with `--trainer` calls
`factory_trainer` with the candidate's arguments. Before the search, the plan runs
`python -m autotune.probe.job REQUEST.json` once: it builds the job with the user's
own arguments and writes what was built (`JobFacts`: the model, its trainable
parameters and adapters, the arguments class, the data's lengths) beside the request,
or the one-line reason it could not.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from autotune.core.files import write_atomic
from autotune.core.job import FACTS_NAME
from autotune.core.trial import TrialConfig


def factory_trainer(config: TrialConfig, fields: dict[str, Any], callbacks: list[Any]) -> Any:
    """The user's Trainer, built by their factory around `fields` in their arguments
    class, from the probe's seed (their model's initialisation, LoRA's included, is the
    same in every probe), with the probe's callbacks added."""
    from transformers import set_seed

    from autotune.hf.factory import build_trainer, import_class, load_factory

    factory = load_factory(config.model.trainer)
    args = import_class(config.model.args_class)(**fields)
    set_seed(config.seed)
    trainer = build_trainer(factory, args)
    for callback in callbacks:
        trainer.add_callback(callback)
    return trainer


def survey(request: dict[str, Any]) -> dict[str, Any]:
    """Build the job with the request's arguments and read what was built."""
    import transformers.trainer  # noqa: F401 - before the user's module, as in a probe
    from transformers import set_seed

    from autotune.hf.factory import args_class_of, build_trainer, load_factory
    from autotune.hf.job import job_facts

    factory = load_factory(request["trainer"])
    cls = args_class_of(factory, request.get("args_class"))
    known = {f for f in cls.__dataclass_fields__ if cls.__dataclass_fields__[f].init}
    fields = {k: v for k, v in request["fields"].items() if k in known}
    with tempfile.TemporaryDirectory(prefix="autotune-survey-") as scratch:
        args = cls(**{**fields, "output_dir": scratch, "report_to": "none", "max_steps": 1})
        set_seed(int(request.get("seed", 0)))
        trainer = build_trainer(factory, args)
        facts = job_facts(trainer)
    return {"facts": json.loads(facts.to_json())}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m autotune.probe.job REQUEST.json", file=sys.stderr)
        return 2
    path = Path(argv[0])
    request = json.loads(path.read_text(encoding="utf-8"))
    os.environ["ARROW_DEFAULT_MEMORY_POOL"] = "system"
    if request.get("visible_devices") is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = request["visible_devices"]
    try:
        answer = survey(request)
    except Exception as exc:
        from autotune.hf.factory import FactoryError

        traceback.print_exc()
        message = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300]
        answer = {"error": str(exc) if isinstance(exc, FactoryError) else message}
        answer["raised"] = not isinstance(exc, FactoryError)
    write_atomic(path.with_name(FACTS_NAME), json.dumps(answer, sort_keys=True))
    return 0 if "facts" in answer else 1


if __name__ == "__main__":
    sys.exit(main())
