"""Measurements reused across studies (store/reuse.py): only what was measured alike."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import optuna
import pytest
from helpers import DIMENSIONS, GIB, SPACE, SPEC, cand, drop_once

from autotune.core.device import measuring_environment
from autotune.core.enums import Outcome
from autotune.core.parity import Curve
from autotune.core.parity_state import ParityState
from autotune.core.parity_verdict import Parity, Status
from autotune.core.spec import SearchSpec
from autotune.core.trial import LEVERS, TrialResult
from autotune.store.reuse import Reuse
from autotune.store.samplers import make_sampler
from autotune.store.store import StudyStore
from autotune.tuning.selection import verdict


def measured(peak_gib: float, outcome: Outcome = Outcome.OK, **versions: str) -> TrialResult:
    return TrialResult(
        outcome,
        samples_per_s=10.0 if outcome == Outcome.OK else None,
        peak_memory_bytes=int(peak_gib * GIB),
        step_time_median_s=0.1,
        step_times_s=(0.1,) * 5,
        versions={**measuring_environment(), "device": "test cpu", **versions},
    )


def study(url: str, name: str, spec: SearchSpec, results: dict[int, TrialResult]) -> StudyStore:
    """A study that measured these batch sizes (fp32, no checkpointing)."""
    store = StudyStore.open(url=url, name=name, spec=spec, sampler=make_sampler("tpe", 0))
    for batch, result in results.items():
        store.queue.enqueue(cand(batch))
        trial = store.queue.ask()
        store.tell(trial, result, verdict(result, spec, implied=False))
    return store


def test_another_study_of_the_same_measurements_is_reused_with_a_new_budget(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'studies.db'}"  # SPEC: an 8 GiB budget
    study(url, "first", SPEC, {8: measured(1.0), 16: measured(6.0), 32: measured(7.0, Outcome.OOM)})
    smaller = dataclasses.replace(SPEC, memory_budget_bytes=4 * GIB)
    reuse = Reuse.gather(study(url, "smaller", smaller, {}))
    found = reuse.found.get(cand(8))
    assert found is not None and found.reused_from == "study first trial 0"
    assert found.samples_per_s == 10.0
    # a peak near or over the new limit is probed again, under it: the budget enforced,
    # not compared (the limit counts reserved pages, above the resident peak)
    assert reuse.found.get(cand(16)) is None
    # out of memory under 7.6 GiB: out of memory under 3.8 GiB too
    assert reuse.found.get(cand(32)) is not None
    # a larger budget: that out-of-memory says nothing, the batch is probed again
    larger = dataclasses.replace(SPEC, memory_budget_bytes=12 * GIB)
    again = Reuse.gather(study(url, "larger", larger, {}))
    assert again.found.get(cand(32)) is None and again.found.get(cand(8)) is not None
    assert again.found.get(cand(64)) is None  # never measured


def test_nothing_is_reused_from_another_model_device_length_or_version(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    model = dataclasses.replace(SPEC.model, config={"model_type": "gpt2", "n_layer": 3})
    others = {
        "model": dataclasses.replace(SPEC, model=model),
        "device": dataclasses.replace(
            SPEC, device=dataclasses.replace(SPEC.device, name="other cpu")
        ),
        "length": dataclasses.replace(SPEC, seq_len=256),
        "recipe": dataclasses.replace(SPEC, base_arguments={"max_grad_norm": 0.5}),
    }
    for name, spec in others.items():
        study(url, name, spec, {8: measured(1.0)})
    study(url, "old-torch", SPEC, {8: measured(1.0, torch="1.13.0")})
    # DeepSpeed installed or not changes every probe (accelerate imports it when present)
    other = "none" if measuring_environment()["deepspeed"] != "none" else "0.19.8"
    study(url, "other-deepspeed", SPEC, {8: measured(1.0, deepspeed=other)})
    study(url, "concurrent", SPEC, {8: dataclasses.replace(measured(1.0), concurrent=2)})
    reuse = Reuse.gather(study(url, "new", SPEC, {}))
    assert len(reuse) == 0
    # the same search as each of those others finds its measurement
    for name, spec in others.items():
        assert Reuse.gather(study(url, f"{name}-again", spec, {})).found.get(cand(8)) is not None


# What a probe's figures depend on beyond the spec, written out here rather than read from
# the code's list, so dropping one from it (a result reused under another transformers
# release, whose kernels and memory differ) fails this test.
MEASURED_WITH = (
    "torch",
    "transformers",
    "accelerate",
    "deepspeed",
    "peft",
    "trl",
    "bitsandbytes",
    "liger-kernel",
    "python",
    "cpus",
)


def test_a_result_is_reused_only_under_the_same_release_of_everything_it_depends_on(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    for name in MEASURED_WITH:
        other = measuring_environment()[name] + ".other"
        study(url, f"other-{name}", SPEC, {8: measured(1.0, **{name: other})})
    assert len(Reuse.gather(study(url, "new", SPEC, {}))) == 0
    study(url, "same", SPEC, {8: measured(1.0)})
    assert Reuse.gather(study(url, "newer", SPEC, {})).found[cand(8)].reused_from == (
        "study same trial 0"
    )


def test_a_measurement_stands_only_for_its_own_settings(tmp_path: Path) -> None:
    """Every dimension and lever of the space is part of what a reused result matches (a
    lever lost on the way through the study's params would make one config stand for
    another)."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    space = dataclasses.replace(
        SPACE,
        precisions=DIMENSIONS["precision"],
        checkpointing=DIMENSIONS["activation_checkpointing"],
        optimizers=DIMENSIONS["optim"],
        samplings=DIMENSIONS["train_sampling_strategy"],
        levers=tuple((name, DIMENSIONS[name]) for name in LEVERS),
    )
    spec = dataclasses.replace(SPEC, space=space)
    plain = space.candidate(8, "fp32", False, "adamw_torch")
    variants = {dataclasses.replace(plain, **{n: v[1]}) for n, v in DIMENSIONS.items()}
    first = StudyStore.open(url=url, name="first", spec=spec, sampler=make_sampler("tpe", 0))
    for variant in variants:
        first.queue.enqueue(variant)
        trial = first.queue.ask()
        first.tell(trial, measured(1.0), verdict(measured(1.0), spec, implied=False))
    new = StudyStore.open(url=url, name="new", spec=spec, sampler=make_sampler("tpe", 0))
    assert set(Reuse.gather(new).found) == variants


def test_a_nan_needs_the_same_seed_and_a_whole_window_search_takes_only_whole_windows(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    early = dataclasses.replace(measured(1.0), measure_stop="clearly slower than the best so far")
    study(url, "first", SPEC, {8: measured(1.0, Outcome.UNSTABLE), 16: early})
    assert Reuse.gather(study(url, "same-seed", SPEC, {})).found.get(cand(8)) is not None
    other_seed = dataclasses.replace(SPEC, seed=1)
    assert Reuse.gather(study(url, "other-seed", other_seed, {})).found.get(cand(8)) is None
    new = study(url, "fixed", SPEC, {})
    assert Reuse.gather(new).found.get(cand(16)) is not None
    assert Reuse.gather(new, whole_windows=True).found.get(cand(16)) is None


def test_a_new_study_takes_over_every_reusable_config_before_its_sampler_proposes(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    study(url, "first", SPEC, {8: measured(1.0), 16: measured(2.0), 32: measured(7.0, Outcome.OOM)})
    new = study(url, "new", SPEC, {16: measured(2.5)})  # its own measurement of 16 stays
    reuse = Reuse.gather(new)
    judge = functools.partial(verdict, spec=SPEC, implied=False)
    taken = new.take_over(reuse.found, judge)
    assert sorted(c.per_device_train_batch_size for _, c, _ in taken) == [8, 32]
    records = {r.candidate.per_device_train_batch_size: r for r in new.records()}
    assert records[8].result.reused_from == "study first trial 0"
    assert records[32].result.outcome == Outcome.OOM  # the sampler learns the wall too
    assert records[16].result.reused_from == "" and records[16].result.peak_memory_bytes == int(
        2.5 * GIB
    )
    assert new.queue.waiting() == 0 and new.queue.in_flight() == {}  # recorded, not queued
    assert all(t.state.is_finished() for t in new.study.get_trials())
    assert new.take_over(reuse.found, judge) == []  # a second worker adds nothing again
    # another study's config outside this space (another global batch: 8x4, not 8x8)
    wider = dataclasses.replace(SPEC.space, global_batch_size=32)
    other = study(url, "wider", dataclasses.replace(SPEC, space=wider), {8: measured(1.0)})
    (foreign,) = [r.candidate for r in other.records()]
    assert new.take_over({foreign: measured(1.0)}, judge) == []


def test_a_config_has_one_record_when_workers_raced_to_take_it_over(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    a = dataclasses.replace(measured(1.0), reused_from="study a trial 0")
    b = dataclasses.replace(measured(1.5), reused_from="study a trial 0")
    store = study(url, "new", SPEC, {8: a, 16: b})
    store.queue.enqueue(cand(8))  # a second worker took 8 over too (no lock on a server)
    trial = store.queue.ask()
    store.tell(trial, a, verdict(a, SPEC, implied=False))
    store.queue.enqueue(cand(16))  # and another probed 16 meanwhile: its own figure wins
    trial = store.queue.ask()
    store.tell(trial, measured(2.0), verdict(measured(2.0), SPEC, implied=False))
    records = store.records()
    assert sorted(r.candidate.per_device_train_batch_size for r in records) == [8, 16]
    (sixteen,) = [r for r in records if r.candidate.per_device_train_batch_size == 16]
    assert sixteen.result.reused_from == "" and sixteen.result.peak_memory_bytes == 2 * GIB


def test_a_queued_trial_is_told_from_a_sampled_one(tmp_path: Path) -> None:
    """A first guess already taken over is dropped without steering the next ask to a
    random config: the sampler, which learned from what was taken over, proposes next."""
    store = study(f"sqlite:///{tmp_path / 'studies.db'}", "new", SPEC, {})
    store.queue.enqueue(cand(8))
    queued = store.queue.ask()
    sampled = store.queue.ask()
    assert store.queue.was_queued(queued) and not store.queue.was_queued(sampled)


def test_a_reused_trial_is_not_a_probe_for_the_trial_cap(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    reused = dataclasses.replace(measured(1.0), reused_from="study a trial 0")
    store = study(url, "new", SPEC, {8: reused})
    store.queue.enqueue(cand(16))
    trial = store.queue.ask()
    # --max-trials 1: the reused trial leaves room for this first probe
    assert store.queue.claim(trial, 1, str(tmp_path / "t")) is None


def test_a_reused_finalist_keeps_its_confirmation_and_is_not_confirmed_again(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    first = study(url, "first", SPEC, {8: measured(1.0)})
    (record,) = first.records()
    confirmation = measured(1.1)
    first.add_confirmation(record, confirmation, verdict(confirmation, SPEC, implied=False), "c")
    assert first.records()[0].runs == 2
    found = Reuse.gather(study(url, "probe", SPEC, {})).found.get(cand(8))
    assert found is not None and found.pooled_runs == 2
    again = study(url, "again", SPEC, {8: found})
    (taken,) = again.records()
    assert taken.runs == 2  # the confirm loop takes only finalists with fewer than 2 runs
    assert taken.result.peak_memory_bytes == int(1.1 * GIB)  # the highest of both runs


def test_parity_runs_are_reused_only_when_made_alike_with_the_same_versions(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    curve = Curve(((0, 5.0), (10, 4.0)), steps=10)
    ran = ParityState(
        cand(8),
        steps=10,
        learning_rate=1e-4,
        seed=0,
        curves={"reference": curve, "bf16|adamw_torch": curve},
        verdicts={"bf16|adamw_torch": Parity(Status.OK)},
    )
    study(url, "first", SPEC, {8: measured(1.0)}).settings.save_parity(ran)
    study(url, "old", SPEC, {8: measured(1.0, torch="1.13.0")}).settings.save_parity(ran)
    reuse = Reuse.gather(study(url, "new", SPEC, {}))
    wanted = ParityState(cand(16), steps=10, learning_rate=1e-4, seed=0)  # split aside
    found = reuse.parity_runs(wanted)
    assert found is not None and found[0] == "first"  # not "old": other versions
    assert found[1].verdict(dataclasses.replace(cand(8), precision="bf16")) == Parity(Status.OK)
    for other in ({"steps": 20}, {"seed": 1}, {"learning_rate": 1e-3}):
        assert reuse.parity_runs(dataclasses.replace(wanted, **other)) is None
    unfinished = dataclasses.replace(ran, curves={"reference": Curve((), error="OOM")})
    alone = f"sqlite:///{tmp_path / 'failed.db'}"
    study(alone, "failed", SPEC, {16: measured(1.0)}).settings.save_parity(unfinished)
    reuse = Reuse.gather(study(alone, "newer", SPEC, {}))
    assert reuse.found.get(cand(16)) is not None and reuse.parity_runs(wanted) is None


def test_gathering_rides_out_a_storage_restart_and_drops_no_study(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A storage away while the other studies are read is waited out and the whole read
    again; before, a study whose records could not be read then was passed over."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    study(url, "first", SPEC, {8: measured(1.0)})
    new = study(url, "new", SPEC, {})
    summaries = drop_once(monkeypatch, optuna, "get_all_study_summaries")
    trials = drop_once(monkeypatch, optuna.study.Study, "get_trials")
    found = Reuse.gather(new).found
    assert list(found) == [cand(8)]
    assert len(summaries) >= 2 and len(trials) >= 2  # each dropped once, the read redone
