"""The Optuna study: storage, parameter names, what each trial records, and resume.

Params are named after the TrainingArguments fields they set (`precision` stands for
the fp16/bf16/tf32 flags). Figures and the outcome are user attributes with units in
their names; the study's values are (samples/s, peak memory GiB), and a trial is
feasible when its peak is within the budget less the headroom.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import socket
import time
import warnings
from collections.abc import Iterator
from typing import Any

import optuna
import sqlalchemy.exc
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.storages._heartbeat import BaseHeartbeat, get_heartbeat_thread
from optuna.trial import TrialState
from optuna_dashboard import save_note

from autotune.search.confirm import combine, pooled
from autotune.core.errors import StudyError
from autotune.core.space import SearchSpace
from autotune.core.spec import SearchSpec
from autotune.core.trial import Candidate, Outcome, TrialResult

SPEC_ATTR = "autotune_spec"
IDENTITY_ATTR = "autotune_identity"
GIB = float(2**30)

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
# We record heartbeats ourselves around each probe (ask/tell, not Study.optimize).
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
METRIC_NAMES = ["samples_per_s", "peak_memory_gib"]
# A searching process records a heartbeat for its running trial this often; a trial
# whose heartbeat is older than three intervals belongs to a dead worker (any host).
HEARTBEAT_S = max(1, int(os.environ.get("AUTOTUNE_HEARTBEAT_S", "10")))
CLAIM_ATTR = "claim"


@dataclasses.dataclass(frozen=True)
class TrialRecord:
    """A finished trial as the search and the reports see it."""

    number: int
    candidate: Candidate
    result: TrialResult  # pooled over the confirmation runs, when there are any
    runs: int = 1


def distributions(spec: SearchSpec) -> dict[str, BaseDistribution]:
    space = spec.space
    found: dict[str, BaseDistribution] = {
        "per_device_train_batch_size": CategoricalDistribution(list(space.all_batches)),
        "precision": CategoricalDistribution(list(space.precisions)),
        "activation_checkpointing": CategoricalDistribution(list(space.checkpointing)),
        "optim": CategoricalDistribution(list(space.optimizers)),
    }
    if len(space.samplings) > 1:  # a dimension only when the user's data is given
        found["train_sampling_strategy"] = CategoricalDistribution(list(space.samplings))
    return found


def candidate_params(candidate: Candidate, space: SearchSpace | None = None) -> dict[str, Any]:
    """The trial params of a candidate (the sampling only where the space varies it)."""
    params: dict[str, Any] = {
        "per_device_train_batch_size": candidate.per_device_train_batch_size,
        "precision": candidate.precision,
        "activation_checkpointing": candidate.activation_checkpointing,
        "optim": candidate.optim,
    }
    if space is not None and len(space.samplings) > 1:
        params["train_sampling_strategy"] = candidate.train_sampling_strategy
    return params


def candidate_of(spec: SearchSpec, params: dict[str, Any]) -> Candidate:
    return spec.space.candidate(
        int(params["per_device_train_batch_size"]),
        str(params["precision"]),
        bool(params["activation_checkpointing"]),
        str(params["optim"]),
        str(params.get("train_sampling_strategy", "random")),
    )


def make_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    if name == "tpe":
        # constant_liar: trials running in other workers count as poor points, so two
        # workers sharing the study are not steered to the same config.
        return optuna.samplers.TPESampler(
            seed=seed, multivariate=True, n_startup_trials=4, constant_liar=True
        )
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=8)
    raise StudyError(f"unknown sampler {name!r}; choose tpe, random or nsga2")


def open_study(
    *, storage: str, name: str, spec: SearchSpec, sampler: optuna.samplers.BaseSampler
) -> optuna.Study:
    """Create the study, or resume it when it holds the same search; refuse otherwise."""
    identity = json.dumps(spec.identity(), sort_keys=True)
    try:
        study = optuna.create_study(
            storage=make_storage(storage),
            study_name=name,
            sampler=sampler,
            load_if_exists=True,
            directions=["maximize", "minimize"],
        )
    except (optuna.exceptions.DuplicatedStudyError, sqlalchemy.exc.IntegrityError):
        # Another worker created the study at the same moment: join it.
        study = optuna.load_study(study_name=name, storage=make_storage(storage), sampler=sampler)
    except StudyError:
        raise
    except (optuna.exceptions.StorageInternalError, ValueError, ImportError) as exc:
        raise StudyError(f"cannot open storage {storage!r}: {_first_line(exc)}") from None
    except Exception as exc:  # sqlalchemy errors: a path that cannot be created or written
        raise StudyError(f"cannot open storage {storage!r}: {_first_line(exc)}") from None
    stored = study.user_attrs.get(IDENTITY_ATTR)
    if stored is None:
        study.set_user_attr(IDENTITY_ATTR, identity)
        study.set_user_attr(SPEC_ATTR, spec.to_json())
        study.set_user_attr("description", spec.describe())
        study.set_metric_names(METRIC_NAMES)
        save_note(study, _note(spec))
    elif not _same_search(stored, identity):
        raise StudyError(
            f"study {name!r} already holds a different search ({_difference(stored, identity)}); "
            f"pass --study with a new name to start another, or repeat the original options"
        )
    return study


def make_storage(url: str) -> optuna.storages.RDBStorage:
    """An Optuna RDB storage (SQLite, PostgreSQL, MySQL) with heartbeats for running trials."""
    engine: dict[str, Any] = {}
    if url.startswith("sqlite"):
        # Several workers on one SQLite file wait for each other's writes.
        engine = {"connect_args": {"timeout": 60}}
    elif "://" in url:
        engine = {"pool_pre_ping": True}
    for attempt in range(3):
        try:
            return optuna.storages.RDBStorage(
                url,
                engine_kwargs=engine,
                heartbeat_interval=HEARTBEAT_S,
                grace_period=3 * HEARTBEAT_S,
            )
        except ImportError as exc:
            driver = url.split(":", 1)[0]
            raise StudyError(
                f"cannot open storage {url!r}: the driver for {driver} is not installed "
                f"({_first_line(exc)}); for PostgreSQL: pip install psycopg2-binary"
            ) from None
        except sqlalchemy.exc.SQLAlchemyError as exc:
            # Two workers creating the tables of a new storage at once: one loses the race.
            if (
                "already exists" not in str(exc) and "duplicate key" not in str(exc)
            ) or attempt == 2:
                raise StudyError(f"cannot open storage {url!r}: {_first_line(exc)}") from None
            time.sleep(0.5 + attempt)
        except Exception as exc:
            raise StudyError(f"cannot open storage {url!r}: {_first_line(exc)}") from None
    raise AssertionError("unreachable")


def load_study(*, storage: str, name: str) -> tuple[optuna.Study, SearchSpec]:
    """An existing study and the spec it was created with (for export and review)."""
    try:
        study = optuna.load_study(study_name=name, storage=make_storage(storage))
    except StudyError:
        raise
    except KeyError:
        raise StudyError(
            f"no study named {name!r} in {storage}; run `autotune search` first or check --storage"
        ) from None
    except Exception as exc:
        raise StudyError(f"cannot open storage {storage!r}: {_first_line(exc)}") from None
    raw = study.user_attrs.get(SPEC_ATTR)
    if raw is None:
        raise StudyError(f"study {name!r} was not made by autotune (it has no {SPEC_ATTR})")
    return study, SearchSpec.from_json(raw)


def records(study: optuna.Study, spec: SearchSpec) -> list[TrialRecord]:
    """Every trial with a result: measured, or skipped because an OOM implies it.

    Redundant proposals (a duplicate, an unneeded fallback) are pruned trials and are
    left out, as are running and interrupted ones.
    """
    finished = [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL))
        if "result" in t.user_attrs
    ]
    confirmations: dict[int, list[TrialResult]] = {}
    for trial in finished:
        if "confirms" in trial.user_attrs:
            confirmations.setdefault(int(trial.user_attrs["confirms"]), []).append(
                TrialResult.from_json(trial.user_attrs["result"])
            )
    found = []
    for trial in finished:
        if "confirms" in trial.user_attrs:
            continue
        extra = confirmations.get(trial.number, [])
        first = TrialResult.from_json(trial.user_attrs["result"])
        found.append(
            TrialRecord(
                trial.number,
                candidate_of(spec, trial.params),
                combine(first, extra),
                len(pooled(first, extra)),
            )
        )
    return found


def add_confirmation(
    study: optuna.Study, spec: SearchSpec, record: TrialRecord, result: TrialResult
) -> None:
    """Store a confirmation run as a finished trial pointing at the trial it confirms."""
    values = None
    if result.outcome == Outcome.OK and result.peak_memory_bytes is not None:
        values = [float(result.samples_per_s or 0.0), result.peak_memory_bytes / GIB]
    study.add_trial(
        optuna.trial.create_trial(
            params=candidate_params(record.candidate, spec.space),
            distributions=distributions(spec),
            values=values,
            state=TrialState.COMPLETE if values is not None else TrialState.FAIL,
            user_attrs={
                "confirms": record.number,
                "outcome": result.outcome.value,
                "reason": result.reason or f"confirms trial {record.number}",
                "result": result.to_json(),
                "samples_per_s": round(result.samples_per_s or 0.0, 3),
            },
        )
    )


def tell(
    study: optuna.Study,
    trial: optuna.Trial,
    spec: SearchSpec,
    result: TrialResult,
    *,
    state: TrialState | None = None,
) -> None:
    """Record a result on the trial (user attributes) and tell the sampler."""
    peak = result.peak_memory_bytes
    attrs: dict[str, Any] = {
        "outcome": result.outcome.value,
        "reason": result.reason,
        "result": result.to_json(),
        "gradient_accumulation_steps": spec.space.global_batch_size
        // int(trial.params["per_device_train_batch_size"]),
        "training_arguments": candidate_of(spec, trial.params).training_arguments(
            device_kind=spec.device.kind
        ),
    }
    if result.samples_per_s is not None:
        attrs["samples_per_s"] = round(result.samples_per_s, 3)
        attrs["tokens_per_s"] = round(result.tokens_per_s or 0.0, 1)
        attrs["step_time_median_s"] = round(result.step_time_median_s or 0.0, 5)
        attrs["step_time_spread_pct"] = round(100 * (result.step_time_spread or 0.0), 2)
    if peak is not None:
        attrs["peak_memory_gib"] = round(peak / GIB, 3)
        attrs["budget_used_pct"] = round(100 * peak / spec.memory_budget_bytes, 1)
    limit_gib = spec.fit_limit_bytes / GIB
    values: list[float] | None = None
    if result.outcome == Outcome.OK and peak is not None:
        attrs["constraint_gib"] = peak / GIB - limit_gib
        values = [float(result.samples_per_s or 0.0), peak / GIB]
    elif result.outcome in (Outcome.OOM, Outcome.UNSTABLE) or (
        result.outcome == Outcome.SKIPPED and state is None
    ):
        # Measured (or implied) not to be usable: a complete, infeasible point teaches the
        # sampler to look elsewhere.
        attrs["constraint_gib"] = max((peak or 0) / GIB - limit_gib, 0.0) + 1.0
        values = [0.0, max(peak or 0, spec.memory_budget_bytes) / GIB]
    for key, value in attrs.items():
        trial.set_user_attr(key, value)
    if "constraint_gib" in attrs:
        # Feasible (<= 0) when the peak is within the budget less the headroom.
        trial.set_constraint("peak_over_limit_gib", attrs["constraint_gib"])
    if values is not None:
        study.tell(trial, values)
    else:
        study.tell(trial, state=state or TrialState.FAIL)


def claim_key(candidate: Candidate) -> str:
    c = candidate
    key = f"{c.per_device_train_batch_size}|{c.precision}|{c.activation_checkpointing}|{c.optim}"
    return key if c.train_sampling_strategy == "random" else f"{key}|{c.train_sampling_strategy}"


def mark_running(trial: optuna.Trial, candidate: Candidate) -> None:
    """Claim the config for this trial: who runs it (host, pid) and a first heartbeat."""
    trial.set_user_attr("host", socket.gethostname())
    trial.set_user_attr("pid", os.getpid())
    trial.set_user_attr(CLAIM_ATTR, claim_key(candidate))
    _heartbeats(trial.study).record_heartbeat(trial._trial_id)


def ask(study: optuna.Study, spec: SearchSpec) -> optuna.Trial:
    """The next trial to run, never the one another worker just took.

    Optuna hands out a queued trial by reading its state and then setting it running;
    PostgreSQL and MySQL lock the row in between, SQLite does not, and two workers on
    one SQLite file were seen taking the same trial. On SQLite the workers take turns
    through a lock file beside the database."""
    backend = getattr(study._storage, "_backend", study._storage)
    url = str(getattr(backend, "url", ""))
    if not url.startswith("sqlite:///"):
        return study.ask(distributions(spec))
    with open(url.removeprefix("sqlite:///") + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return study.ask(distributions(spec))
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def heartbeat(trial: optuna.Trial) -> Iterator[None]:
    """Record the trial's heartbeat every HEARTBEAT_S seconds while the block runs."""
    beat = get_heartbeat_thread(trial._trial_id, trial.study._storage)
    beat.start()
    try:
        yield
    finally:
        beat.join()


def in_flight(study: optuna.Study, spec: SearchSpec, exclude: int = -1) -> dict[Candidate, int]:
    """Configs being probed now (by any worker): config -> trial number."""
    return {
        candidate_of(spec, t.params): t.number
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if CLAIM_ATTR in t.user_attrs and t.number != exclude
    }


def contested(
    study: optuna.Study, number: int, candidate: Candidate, max_trials: int
) -> str | None:
    """Why this freshly claimed trial must yield, or None when the claim holds.

    Every worker writes its claim before it reads the others', and yields on seeing
    any rival claim. Two workers that pick one config at the same moment may both
    yield (and pick again), but both can never run it: the second to read always
    sees the first one's claim.
    """
    mine = claim_key(candidate)
    probes = 1  # this one
    for other in study.get_trials(deepcopy=False):
        if other.number == number:
            continue
        attrs = other.user_attrs
        if other.state == TrialState.RUNNING and CLAIM_ATTR in attrs:
            probes += 1
            if attrs[CLAIM_ATTR] == mine:
                return f"trial {other.number} is probing the same config"
        elif other.state in (TrialState.COMPLETE, TrialState.FAIL) and "result" in attrs:
            if "confirms" in attrs or attrs.get("outcome") == Outcome.SKIPPED.value:
                continue
            probes += 1
            if attrs.get(CLAIM_ATTR) == mine:
                return f"trial {other.number} measured the same config"
    if probes > max_trials:
        return f"other workers reached --max-trials {max_trials}"
    return None


def recover_stale(study: optuna.Study) -> list[int]:
    """Fail RUNNING trials whose worker is gone, and re-queue their params.

    Gone: a search process on this host that no longer exists (seen at once), or a
    worker anywhere whose heartbeat is older than the storage's grace period.
    """
    storage = _heartbeats(study)
    stale = set(storage._get_stale_trial_ids(study._study_id))
    recovered = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        pid = trial.user_attrs.get("pid")
        dead_here = trial.user_attrs.get("host") == socket.gethostname() and not (
            isinstance(pid, int) and _alive(pid)
        )
        if trial._trial_id not in stale and not dead_here:
            continue
        why = "search process died" if dead_here else "worker stopped sending heartbeats"
        try:
            storage.set_trial_user_attr(trial._trial_id, "outcome", "error")
            reason = f"{why} during the trial; re-queued"
            storage.set_trial_user_attr(trial._trial_id, "reason", reason)
            if not storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL):
                continue
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # another worker recovered it (or it finished) first
        if trial.params:
            study.enqueue_trial(trial.params, skip_if_exists=False)
        recovered.append(trial.number)
    return recovered


def _heartbeats(study: optuna.Study) -> Any:
    """The study's storage, which records heartbeats (every storage make_storage builds)."""
    storage = study._storage
    if not isinstance(storage, BaseHeartbeat):
        raise StudyError("this storage keeps no heartbeats; use an RDB storage URL")
    return storage


def _note(spec: SearchSpec) -> str:
    """The study's description, as optuna-dashboard shows it."""
    return (
        f"# autotune: {spec.model.name}\n\n"
        f"- task: {spec.model.task} (model from {spec.model.source})\n"
        f"- device: {spec.device.kind} {spec.device.name}\n"
        f"- memory budget: {spec.memory_budget_bytes / GIB:.2f} GiB "
        f"(fits below {spec.fit_limit_bytes / GIB:.2f} GiB)\n"
        f"- global batch: {spec.global_batch_size}"
        + (f" ({spec.nproc_per_node} DDP processes)" if spec.nproc_per_node > 1 else "")
        + "\n"
        f"- sequence length: {spec.seq_len}"
        + (f", target length {spec.target_len}" if spec.model.task == "seq2seq" else "")
        + "\n\nValues: samples_per_s (maximise), peak_memory_gib (minimise); the budget is a "
        "constraint. Each trial's user attributes hold its outcome, reason and figures.\n"
    )


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _same_search(stored: str, wanted: str) -> bool:
    """Equal identities; a setting newer than the stored study matches when left empty."""
    old, new = json.loads(stored), json.loads(wanted)
    return all(old.get(k) == v if k in old else not v for k, v in new.items()) and all(
        k in new for k in old
    )


def _difference(stored: str, wanted: str) -> str:
    old, new = json.loads(stored), json.loads(wanted)
    keys = [k for k in new if old.get(k) != new.get(k)]
    return ", ".join(f"{k}: {old.get(k)!r} vs {new.get(k)!r}" for k in keys[:2]) or "spec"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
