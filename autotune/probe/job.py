"""The user's job in a child process: their Trainer, built by their factory.

A probe, parity run or confirmation of a search with `--trainer` calls
`factory_trainer` with the candidate's arguments. Before the search, the plan runs
`python -m autotune.probe.job REQUEST.json` once: it builds the job with the user's
own arguments and writes what was built (`JobFacts`: the model, its trainable
parameters and adapters, the arguments class, the data's lengths) beside the request,
or the one-line reason it could not.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from autotune.core.files import write_atomic
from autotune.core.job import FACTS_NAME
from autotune.core.precisions import FLAGS as PRECISION_FLAGS
from autotune.core.trial import ModelSpec
from autotune.hf.factory import (
    FactoryError,
    args_class_of,
    build_trainer,
    import_class,
    load_factory,
)
from autotune.hf.job import job_facts
from autotune.hf.training_args import checkpointing_field

# Deferred imports: transformers loads in the survey's or the probe's process, before the user's
# module, as the user's script imports it


def factory_trainer(
    model: ModelSpec, seed: int, fields: dict[str, Any], callbacks: list[Any]
) -> Any:
    """The user's Trainer, built by their factory (`model.trainer`) around `fields` in
    their arguments class, from the probe's `seed` (their model's initialisation, LoRA's
    included, is the same in every probe), with the probe's callbacks added."""
    from transformers import set_seed

    factory = load_factory(model.trainer)
    args = import_class(model.args_class)(**fields)
    set_seed(seed)
    trainer = build_trainer(factory, args)
    for callback in callbacks:
        trainer.add_callback(callback)
    return trainer


def survey(request: dict[str, Any]) -> dict[str, Any]:
    """Build the job with the request's arguments and read what was built, and the
    recipe the user's own arguments make in their class (its defaults included)."""
    import transformers.trainer  # noqa: F401 - before the user's module, as in a probe
    from transformers import set_seed

    factory = load_factory(request["trainer"])
    cls = args_class_of(factory, request.get("args_class"))
    fields_of: dict[str, dataclasses.Field[Any]] = cls.__dataclass_fields__  # type: ignore[attr-defined]
    known = {name for name, f in fields_of.items() if f.init}  # InitVars too
    fields = {k: v for k, v in request["fields"].items() if k in known}
    ckpt = checkpointing_field()
    with tempfile.TemporaryDirectory(prefix="autotune-survey-") as scratch:
        theirs = {k: v for k, v in request.get("recipe", {}).items() if k in known}
        recipe = _recipe(cls, theirs, scratch, ckpt)
        # checkpointing off, as a candidate without it asks: a factory that turns it on
        # itself (prepare_model_for_kbit_training) is seen doing so
        own = {"output_dir": scratch, "report_to": "none", "max_steps": 1, ckpt: False}
        args = cls(**{**fields, **own})
        set_seed(int(request.get("seed", 0)))
        trainer = build_trainer(factory, args)
        facts = dataclasses.replace(job_facts(trainer), recipe=recipe)
    return {"facts": json.loads(facts.to_json())}


# The fields of a recipe the search tunes, read from the user's arguments as their class
# builds them: SFTConfig's own defaults (bf16, gradient checkpointing) included
RECIPE_FIELDS = (
    *PRECISION_FLAGS,
    "optim",
    "train_sampling_strategy",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
)


def _recipe(cls: Any, fields: dict[str, Any], scratch: str, ckpt: str) -> dict[str, Any]:
    """The tuned fields of the user's arguments in their class, or {} where their class
    refuses them on this machine (bf16 where it has none)."""
    try:
        args = cls(**{**fields, "output_dir": scratch, "report_to": "none"})
    except (ValueError, TypeError):
        return {}
    values = {k: getattr(args, k, None) for k in (*RECIPE_FIELDS, ckpt)}
    values = {k: getattr(v, "value", v) for k, v in values.items() if v is not None}
    return {k: v for k, v in values.items() if isinstance(v, (bool, int, str))}


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
        traceback.print_exc()
        message = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300]
        answer = {"error": str(exc) if isinstance(exc, FactoryError) else message}
        answer["raised"] = not isinstance(exc, FactoryError)
    write_atomic(path.with_name(FACTS_NAME), json.dumps(answer, sort_keys=True))
    return 0 if "facts" in answer else 1


if __name__ == "__main__":
    sys.exit(main())
