"""The user's own Trainer factory: `--trainer train.py:make_trainer` (or
`package.module:make_trainer`, the convention of uvicorn and gunicorn).

`make_trainer(args) -> Trainer` builds their job around the arguments autotune passes:
their model (PEFT adapters, a quantized base), their data, collator and Trainer class.
Every probe calls it in its own process with the candidate's arguments; this module
loads it, finds the arguments class it takes, calls it and checks what it returned.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle

from autotune.core.errors import UsageError
from autotune.core.files import write_atomic
from autotune.core.precisions import MIXED_FLAGS

# Deferred imports: transformers loads only when a factory's Trainer is built or checked; `show`
# and `export` import this module to name the user's job

DEFAULT_ARGS_CLASS = "transformers.TrainingArguments"
# What `--args-class` may name by a short name (the full dotted name always works)
ARGS_CLASSES = {
    "TrainingArguments": "transformers.TrainingArguments",
    "Seq2SeqTrainingArguments": "transformers.Seq2SeqTrainingArguments",
    "SFTConfig": "trl.SFTConfig",
}
# Fields whose value the factory must leave as autotune passed them: a Trainer built on
# other arguments would train another config than the one measured
SCRIPT_PREFIX = "autotune_user_"  # the module name a --trainer script is imported as
# A factory defined in a notebook or another interactive session has no file to import it
# from: it is pickled by value (cloudpickle, as Ray, Dask and submitit ship functions)
# into studies/factories/<name>.pkl, and the reference names that file
PICKLED = ".pkl"
FACTORIES_FOLDER = "factories"
# What autotune sets per candidate (and the run length a probe owns): a factory that
# builds its Trainer with other values, or changes them in `args`, trains something else
CHECKED_FIELDS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "max_steps",
    *MIXED_FLAGS,
    "optim",
    "activation_checkpointing",
)


class FactoryError(UsageError):
    """The factory cannot be loaded, or does not build a Trainer around its arguments."""


def split_reference(reference: str) -> tuple[str, str]:
    """("train.py" or "package.module", "make_trainer"); FactoryError when malformed."""
    location, colon, name = reference.rpartition(":")
    if not colon or not location or not name.isidentifier():
        raise FactoryError(
            f"--trainer {reference!r}: give FILE.py:FUNCTION or package.module:FUNCTION, "
            "a function that takes the training arguments and returns a Trainer"
        )
    return location, name


def resolve_reference(reference: str) -> str:
    """The reference as probes will load it: a script's (or a pickled factory's) path
    made absolute, so a probe started in another directory finds it; FactoryError when
    the file is missing."""
    location, name = split_reference(reference)
    if not location.endswith((".py", PICKLED)):
        return reference
    path = Path(location).expanduser()
    if not path.is_file():
        raise FactoryError(f"--trainer {reference}: no such file {location}")
    return f"{path.resolve()}:{name}"


def reference_of(factory: Callable[..., Any], studies_dir: Path) -> str:
    """The reference of a Python function, for probes to load it again: its module's
    name, or its script's path when it was defined in the script being run; one defined
    in a notebook or an interactive session is pickled by value under `studies_dir`."""
    name = getattr(factory, "__qualname__", "")
    if not callable(factory) or not name.isidentifier():  # a lambda, a method, a partial
        raise FactoryError(
            f"autotune.search() needs a function defined at the top level of a module, "
            f"script or notebook cell (probes load it again in their own process); got "
            f"{factory!r}"
        )
    module = factory.__module__
    if module == "__main__" or module.startswith(SCRIPT_PREFIX):  # a script: by its path
        found = sys.modules.get(module)
        path = getattr(found, "__file__", None)
        if path is None or getattr(found, name, None) is not factory:
            return _pickled(factory, name, studies_dir)  # a notebook cell, a prompt
        return f"{Path(path).resolve()}:{name}"
    return f"{module}:{name}"


def _pickled(factory: Callable[..., Any], name: str, studies_dir: Path) -> str:
    """Write the factory by value, with what it uses of its session, to
    studies/factories/<name>.pkl (replaced whole on every search) and name that file."""
    try:
        data = cloudpickle.dumps(factory)
    except Exception as exc:  # pickle raises TypeError, PicklingError, AttributeError...
        raise FactoryError(
            f"your factory {name} is defined in this session, so it is sent to the probes "
            f"by value, and what it uses could not be pickled ({type(exc).__name__}: "
            f"{exc}); build that inside {name}, or define {name} in a .py file"
        ) from None
    path = (studies_dir / FACTORIES_FOLDER / f"{name}{PICKLED}").resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, data)
    return f"{path}:{name}"


def load_factory(reference: str) -> Callable[..., Any]:
    """Import the module or script and return its function; FactoryError if either is
    missing (an exception the module raises while importing propagates)."""
    location, name = split_reference(reference)
    if location.endswith(PICKLED):
        return _unpickled(Path(location), name)
    if location.endswith(".py"):
        module = _import_script(Path(location))
    else:
        try:
            module = importlib.import_module(location)
        except ModuleNotFoundError as exc:
            if exc.name and location.startswith(exc.name):
                raise FactoryError(
                    f"--trainer {reference}: no module named {exc.name!r} (give a path "
                    "ending in .py, or a module importable from here)"
                ) from None
            raise
    factory = getattr(module, name, None)
    if not callable(factory):
        raise FactoryError(f"--trainer {reference}: {location} has no function {name!r}")
    return factory  # type: ignore[no-any-return]


def _unpickled(path: Path, name: str) -> Callable[..., Any]:
    """A factory pickled by value (`_pickled`); FactoryError when the file is missing."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise FactoryError(
            f"--trainer {path}:{name}: the pickled factory is gone; run autotune.search() "
            "with your function again"
        ) from None
    factory = cloudpickle.loads(data)
    if not callable(factory):
        raise FactoryError(f"--trainer {path}:{name}: the file holds no function")
    return factory  # type: ignore[no-any-return]


def _import_script(path: Path) -> Any:
    """A script imported as a module named after its file (its folder on sys.path, so its
    own imports of neighbouring files work, as `python train.py` would)."""
    if not path.is_file():
        raise FactoryError(f"--trainer: no such file {path}")
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]
    name = f"{SCRIPT_PREFIX}{path.stem}_{digest}"  # two train.py in two folders: two modules
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise FactoryError(f"--trainer: {path} cannot be imported as Python")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def args_class_of(factory: Callable[..., Any], asked: str | None) -> type:
    """The arguments class the factory takes: --args-class when given, else its first
    parameter's annotation, else transformers.TrainingArguments."""
    if asked:
        return import_class(ARGS_CLASSES.get(asked, asked))
    try:
        parameters = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):
        parameters = []
    if not parameters:
        raise FactoryError(
            f"the factory {getattr(factory, '__name__', factory)!r} takes no argument; it "
            "must take the training arguments (def make_trainer(args): ...)"
        )
    try:
        hints = typing.get_type_hints(factory)
    except Exception:  # an annotation that does not resolve here: fall back to the default
        hints = {}
    annotation = hints.get(parameters[0].name)
    if isinstance(annotation, type) and _is_training_arguments(annotation):
        return annotation
    return import_class(DEFAULT_ARGS_CLASS)


def import_class(dotted: str) -> type:
    """A class by its dotted name ("trl.SFTConfig"); it must be a TrainingArguments."""
    module_name, _, name = dotted.rpartition(".")
    try:
        found = getattr(importlib.import_module(module_name), name) if module_name else None
    except ImportError as exc:
        raise FactoryError(
            f"--args-class {dotted}: cannot import {module_name} ({exc}); install it, or "
            f"name one of {', '.join(ARGS_CLASSES)}"
        ) from None
    if not isinstance(found, type) or not _is_training_arguments(found):
        raise FactoryError(
            f"--args-class {dotted} is not a TrainingArguments class; name one of "
            f"{', '.join(ARGS_CLASSES)}, or your own subclass as module.Class"
        )
    return found


def class_name(cls: type) -> str:
    """The dotted name `import_class` reads back (the public module where there is one)."""
    for short, dotted in ARGS_CLASSES.items():
        if cls.__name__ == short and _same(dotted, cls):
            return dotted
    return f"{cls.__module__}.{cls.__qualname__}"


def _same(dotted: str, cls: type) -> bool:
    try:
        return import_class(dotted) is cls
    except FactoryError:
        return False


def _is_training_arguments(cls: type) -> bool:
    from transformers import TrainingArguments

    return issubclass(cls, TrainingArguments)


def build_trainer(factory: Callable[..., Any], args: Any) -> Any:
    """Call the factory and check that it returned a Trainer built around `args`.

    An exception the factory raises propagates (the probe classifies it: an OOM while
    loading the model is an OOM); a wrong return or ignored arguments is a FactoryError."""
    from transformers import Trainer

    given = {field: getattr(args, field, None) for field in CHECKED_FIELDS}
    trainer = factory(args)
    name = getattr(factory, "__name__", "the factory")
    if not isinstance(trainer, Trainer):
        raise FactoryError(
            f"{name} returned {type(trainer).__name__}, not a transformers Trainer; "
            "return the Trainer (or SFTTrainer, ...) you build around args"
        )
    for field, value in given.items():
        used = getattr(trainer.args, field, None)
        if used == value:
            continue
        if trainer.args is not args:
            raise FactoryError(
                f"{name} ignored the arguments it was given ({field} is {used!r}, "
                f"autotune passed {value!r}); your factory must pass `args` to the Trainer"
            )
        raise FactoryError(
            f"{name} changed {field} of the arguments it was given ({value!r} -> {used!r}); "
            "autotune sets it for each config: set it in --base-args instead"
        )
    return trainer
