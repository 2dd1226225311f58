"""What makes a stored study the same search (`check`), and the note optuna-dashboard
shows."""

from __future__ import annotations

import json

import optuna
from optuna_dashboard import save_note

from autotune.core.enums import Task
from autotune.core.errors import StudyError
from autotune.core.spec import SearchSpec
from autotune.store.keys import METRIC_NAMES, StudyAttr

GIB = float(2**30)


def same_search(stored: str, wanted: str) -> bool:
    """Equal identities; a setting newer than the stored study matches when left empty."""
    old, new = json.loads(stored), json.loads(wanted)
    return all(old.get(k) == v if k in old else not v for k, v in new.items()) and all(
        k in new for k in old
    )


def differs_only_in(stored: str, wanted: str, keys: tuple[str, ...]) -> bool:
    """Whether the two identities are the same search but for these settings."""
    old, new = json.loads(stored), json.loads(wanted)
    return same_search(
        json.dumps({k: v for k, v in old.items() if k not in keys}),
        json.dumps({k: v for k, v in new.items() if k not in keys}),
    )


def difference(stored: str, wanted: str) -> str:
    """The first two settings that differ, a nested one by its inner key ("job.held")."""
    old, new = json.loads(stored), json.loads(wanted)
    found = []
    for key in new:
        was, now = old.get(key), new.get(key)
        if was == now:
            continue
        if isinstance(was, dict) and isinstance(now, dict):
            inner = [k for k in {**was, **now} if was.get(k) != now.get(k)]
            found += [f"{key}.{k}: {was.get(k)!r} vs {now.get(k)!r}" for k in inner]
        else:
            found.append(f"{key}: {was!r} vs {now!r}")
    return ", ".join(found[:2]) or "spec"


def note(spec: SearchSpec) -> str:
    """The study's description, as optuna-dashboard shows it."""
    ddp = f" ({spec.processes} DDP processes)" if spec.processes > 1 else ""
    target = f", target length {spec.target_len}" if spec.model.task == Task.SEQ2SEQ else ""
    return (
        f"# autotune: {spec.model.name}\n\n"
        f"- task: {spec.model.task} (model from {spec.model.source})\n"
        f"- device: {spec.device.kind} {spec.device.name}\n"
        f"- memory budget: {spec.memory_budget_bytes / GIB:.2f} GiB "
        f"(fits below {spec.fit_limit_bytes / GIB:.2f} GiB)\n"
        f"- global batch: {spec.global_batch_size}{ddp}\n"
        f"- sequence length: {spec.seq_len}{target}\n\n"
        "Values: samples_per_s (maximise), peak_memory_gib (minimise); the budget is a "
        "constraint. Each trial's user attributes hold its outcome, reason and figures.\n"
    )


def check(study: optuna.Study, spec: SearchSpec) -> None:
    """Mark a new study with the search it holds, or refuse one that holds another
    (StudyError naming the first settings that differ, and what to do)."""
    wanted = json.dumps(spec.identity(), sort_keys=True)
    stored = study.user_attrs.get(StudyAttr.IDENTITY)
    if stored is None:
        study.set_user_attr(StudyAttr.IDENTITY, wanted)
        study.set_user_attr(StudyAttr.SPEC, spec.to_json())
        study.set_user_attr(StudyAttr.DESCRIPTION, spec.describe())
        study.set_metric_names(list(METRIC_NAMES))
        save_note(study, note(spec))
    elif not same_search(stored, wanted):
        budget_only = differs_only_in(stored, wanted, ("memory_budget_bytes", "headroom"))
        reused = (
            ": what it measured that still holds under the new budget is reused, not probed again"
            if budget_only
            else ", or repeat the original options"
        )
        raise StudyError(
            f"study {study.study_name!r} already holds a different search "
            f"({difference(stored, wanted)}); pass --study with a new name to "
            f"start another{reused}"
        )
