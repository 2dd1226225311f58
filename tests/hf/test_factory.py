"""The user's Trainer factory, loaded and checked in this process: references, the
arguments class, and what a factory must return."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from autotune.hf.factory import (
    FactoryError,
    args_class_of,
    build_trainer,
    class_name,
    import_class,
    load_factory,
    reference_of,
    resolve_reference,
    split_reference,
)

SCRIPT = """
from transformers import Seq2SeqTrainingArguments


def typed(args: Seq2SeqTrainingArguments):
    return args


def untyped(args):
    return args


def no_arguments():
    return None


VALUE = 3
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(SCRIPT, encoding="utf-8")
    return path


def test_a_reference_is_file_or_module_colon_function(script: Path) -> None:
    assert split_reference("train.py:make") == ("train.py", "make")
    assert split_reference("pkg.mod:make") == ("pkg.mod", "make")
    for bad in ("train.py", ":make", "train.py:", "train.py:not-a-name"):
        with pytest.raises(FactoryError, match=r"give FILE\.py:FUNCTION or package\.module"):
            split_reference(bad)
    assert resolve_reference(f"{script}:typed") == f"{script.resolve()}:typed"
    assert resolve_reference("pkg.mod:make") == "pkg.mod:make"  # imported by the probes
    with pytest.raises(FactoryError, match=r"no such file missing\.py"):
        resolve_reference("missing.py:make")


def test_a_script_or_module_is_loaded_and_a_missing_function_named(script: Path) -> None:
    assert load_factory(f"{script}:typed")("x") == "x"
    assert load_factory("json:dumps")([1]) == "[1]"
    with pytest.raises(FactoryError, match=r"has no function 'nope'"):
        load_factory(f"{script}:nope")
    with pytest.raises(FactoryError, match=r"has no function 'VALUE'"):  # not callable
        load_factory(f"{script}:VALUE")
    with pytest.raises(FactoryError, match="no module named 'no_such_pkg'"):
        load_factory("no_such_pkg.train:make")


def test_the_arguments_class_is_asked_then_annotated_then_training_arguments(
    script: Path,
) -> None:
    from transformers import Seq2SeqTrainingArguments, TrainingArguments
    from trl import SFTConfig

    assert args_class_of(load_factory(f"{script}:typed"), None) is Seq2SeqTrainingArguments
    assert args_class_of(load_factory(f"{script}:untyped"), None) is TrainingArguments
    assert args_class_of(load_factory(f"{script}:untyped"), "SFTConfig") is SFTConfig
    assert class_name(SFTConfig) == "trl.SFTConfig"  # what the study records
    assert import_class(class_name(SFTConfig)) is SFTConfig
    with pytest.raises(FactoryError, match="takes no argument"):
        args_class_of(load_factory(f"{script}:no_arguments"), None)
    with pytest.raises(FactoryError, match=r"json\.JSONDecoder is not a TrainingArguments"):
        import_class("json.JSONDecoder")


def test_a_function_is_referenced_so_a_probe_can_import_it_again(script: Path) -> None:
    loaded = load_factory(f"{script}:typed")
    studies = script.parent / "studies"
    assert reference_of(loaded, studies) == f"{script.resolve()}:typed"  # a script: its path
    assert reference_of(split_reference, studies) == "autotune.hf.factory:split_reference"
    with pytest.raises(FactoryError, match="defined at the top level"):
        reference_of(lambda args: args, studies)
    assert not studies.exists()  # nothing pickled for what can be imported


def test_a_function_defined_in_a_session_travels_by_value(tmp_path: Path) -> None:
    # as a notebook cell defines it: in __main__, which has no file to import again
    session: dict[str, object] = {"__name__": "__main__", "SCALE": 3}
    exec("def make_trainer(args):\n    return args * SCALE\n", session)
    factory = session["make_trainer"]
    assert getattr(sys.modules["__main__"], "make_trainer", None) is not factory
    reference = reference_of(factory, tmp_path / "studies")  # type: ignore[arg-type]
    pickled = tmp_path / "studies" / "factories" / "make_trainer.pkl"
    assert reference == f"{pickled.resolve()}:make_trainer"
    assert resolve_reference(reference) == reference
    assert load_factory(reference)(2) == 6  # with what it uses of its session (SCALE)
    session["LOCK"] = threading.Lock()
    exec("def locked(args):\n    return LOCK\n", session)
    with pytest.raises(FactoryError, match=r"sent to the probes by value.*cannot pickle"):
        reference_of(session["locked"], tmp_path / "studies")  # type: ignore[arg-type]


def test_a_factory_must_return_a_trainer_built_on_its_arguments(tmp_path: Path) -> None:
    import torch
    from transformers import Trainer, TrainingArguments

    def args_of(batch: int) -> TrainingArguments:
        return TrainingArguments(
            output_dir=str(tmp_path), per_device_train_batch_size=batch, use_cpu=True
        )

    model = torch.nn.Linear(2, 2)

    def good(args: TrainingArguments) -> Trainer:
        return Trainer(model=model, args=args)

    def not_a_trainer(args: TrainingArguments) -> dict[str, object]:
        return {}

    def its_own(args: TrainingArguments) -> Trainer:
        return Trainer(model=model, args=args_of(3))

    given = args_of(8)
    assert build_trainer(good, given).args is given
    with pytest.raises(FactoryError, match="not_a_trainer returned dict, not a transformers"):
        build_trainer(not_a_trainer, given)
    with pytest.raises(FactoryError, match=r"per_device_train_batch_size is 3, autotune passed 8"):
        build_trainer(its_own, given)


def test_a_factory_that_changes_a_tuned_field_in_place_is_caught(tmp_path: Path) -> None:
    """Every candidate would train what the factory set while the export claimed another."""
    import torch
    from transformers import Trainer, TrainingArguments

    model = torch.nn.Linear(2, 2)

    def forces_adafactor(args: TrainingArguments) -> Trainer:
        args.optim = "adafactor"
        return Trainer(model=model, args=args)

    given = TrainingArguments(output_dir=str(tmp_path), optim="adamw_torch", use_cpu=True)
    with pytest.raises(FactoryError, match=r"forces_adafactor changed optim of the arguments"):
        build_trainer(forces_adafactor, given)


def test_a_trainer_built_with_its_own_optimizer_is_seen(tmp_path: Path) -> None:
    import torch
    from transformers import Trainer, TrainingArguments

    from autotune.hf.job import job_facts

    model = torch.nn.Linear(2, 2)
    model.config = type("Config", (), {"to_dict": lambda self: {}, "_name_or_path": "lin"})()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)

    def own(args: TrainingArguments) -> Trainer:
        return Trainer(model=model, args=args, optimizers=(sgd, None))

    given = TrainingArguments(output_dir=str(tmp_path), use_cpu=True)
    assert job_facts(build_trainer(own, given)).own_optimizer == "SGD"


def test_a_trainer_that_saves_in_its_own_way_is_seen(tmp_path: Path) -> None:
    """What such a save holds is the user's (a gathering of sharded weights, say): its
    rehearsal cannot be settled by the checkpoint's size, and the study is bound to it."""
    import torch
    from transformers import Trainer, TrainingArguments

    from autotune.hf.job import job_facts
    from autotune.tuning._user_job import job_profile

    model = torch.nn.Linear(2, 2)
    model.config = type("Config", (), {"to_dict": lambda self: {}, "_name_or_path": "lin"})()

    class Gathering(Trainer):
        def _save_checkpoint(self, model: object, trial: object) -> None:
            super()._save_checkpoint(model, trial)

    given = TrainingArguments(output_dir=str(tmp_path), use_cpu=True)
    plain = job_facts(build_trainer(lambda args: Trainer(model=model, args=args), given))
    assert plain.own_save == "" and "own_save" not in job_profile(plain)
    theirs = job_facts(build_trainer(lambda args: Gathering(model=model, args=args), given))
    assert theirs.own_save == "Gathering._save_checkpoint"
    assert job_profile(theirs)["own_save"] == "Gathering._save_checkpoint"
