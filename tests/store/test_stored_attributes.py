"""What a study holds, read back after another version (or damage) wrote it, generated:
a trial's result, the study's spec, parity runs, rehearsals, parity plan and objective.
`show` and `export` read them whole, or stop with a one-line StudyError naming the study
and what of it cannot be read; never a traceback, never a file written."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import optuna
import pytest
from bad_files import JSON_VALUES, bad_content, examples, one_line, refused, run_cli
from helpers import SPEC, cand
from hypothesis import given
from hypothesis import strategies as st

from autotune.commands import show_command
from autotune.core.enums import Outcome
from autotune.core.errors import StudyError
from autotune.core.parity_state import ParityPlan
from autotune.core.rehearsal import Event, Rehearsal
from autotune.core.trial import TrialResult
from autotune.store._params import candidate_params, distributions
from autotune.store.keys import Attr, StudyAttr
from autotune.store.samplers import make_sampler
from autotune.store.storage import quiet_optuna
from autotune.store.store import StudyStore, stored_spec
from autotune.views.show import print_view

GOOD = TrialResult(
    Outcome.OK,
    samples_per_s=12.5,
    step_time_median_s=0.08,
    step_times_s=(0.08, 0.081, 0.079),
    peak_memory_bytes=2**30,
)
GOOD_RAW = json.loads(GOOD.to_json())
REHEARSAL = Rehearsal((Event("train", "ok", 2**30), Event("evaluation", "ok", 2**30)))
# a stored attribute: text another version wrote (JSON or not), or any JSON value
ATTRIBUTE = bad_content(GOOD_RAW).map(lambda b: b.decode("utf-8", "replace")) | JSON_VALUES


URL = "sqlite:///studies/autotune.db"


@pytest.fixture
def stores(monkeypatch: pytest.MonkeyPatch) -> dict[str, StudyStore]:
    """Studies in Optuna's in-memory storage (fast), which `StudyStore.load` finds by
    name: the commands read them as they read a stored study, past the storage."""
    made: dict[str, StudyStore] = {}

    def load(cls: type[StudyStore], *, url: str, name: str) -> StudyStore:
        if name not in made:
            raise StudyError(f"no study named {name!r}")
        return made[name]

    monkeypatch.setattr(StudyStore, "load", classmethod(load))
    quiet_optuna()
    return made


def _study(
    stores: dict[str, StudyStore], trial_attrs: dict[str, Any], study_attrs: dict[str, Any]
) -> str:
    """A new study of SPEC with a good trial and one holding `trial_attrs`; then
    `study_attrs` set on the study."""
    name = f"s-{uuid.uuid4().hex[:8]}"
    study = optuna.create_study(study_name=name, directions=["maximize", "minimize"])
    for candidate, attrs in ((cand(16), {}), (cand(32), trial_attrs)):
        if candidate != cand(16) and not attrs:
            continue
        study.add_trial(
            optuna.trial.create_trial(
                params=candidate_params(candidate, SPEC.space),
                distributions=distributions(SPEC.space),
                values=[12.5, 1.0],
                user_attrs={Attr.OUTCOME: "ok", Attr.RESULT: GOOD.to_json(), **attrs},
            )
        )
    for key, value in study_attrs.items():
        study.set_user_attr(key, value)
    stores[name] = StudyStore(study, study._storage, URL, SPEC)
    return name


def _read_all(name: str) -> None:
    """What `show` reads and prints, and what a resumed search reads besides."""
    view = show_command(study_name=name, storage=URL, objective=None)
    print_view(view, "table")
    print_view(view, "json")
    store = StudyStore.load(url=URL, name=name)
    store.settings.parity_plan()
    store.next_round()


def _shown_or_refused(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        _read_all(name)
    except StudyError as exc:
        assert one_line(str(exc)) and repr(name) in str(exc), str(exc)
    capsys.readouterr()


@examples(60)
@given(
    key=st.sampled_from([Attr.RESULT, Attr.CONFIRMS, Attr.ROUND]),
    value=ATTRIBUTE,
)
def test_a_trials_attribute_of_another_shape_is_read_or_named(
    stores: dict[str, StudyStore], key: str, value: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    attrs = {key: value} if key != Attr.ROUND else {key: value, Attr.CONFIRMS: 0}
    _shown_or_refused(_study(stores, attrs, {}), capsys)


@examples(60)
@given(
    key=st.sampled_from(
        [
            StudyAttr.SPEC,
            StudyAttr.PARITY,
            StudyAttr.REHEARSALS,
            StudyAttr.PARITY_PLAN,
            StudyAttr.OBJECTIVE,
            StudyAttr.REHEARSE,
        ]
    ),
    value=ATTRIBUTE | st.dictionaries(st.sampled_from(["0", "1", "x"]), ATTRIBUTE, max_size=2),
)
def test_a_studys_attribute_of_another_shape_is_read_or_named(
    stores: dict[str, StudyStore], key: str, value: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    _shown_or_refused(_study(stores, {}, {key: value}), capsys)


@examples(60)
@given(
    which=st.sampled_from(["rehearsal", "plan", "spec"]),
    content=st.data(),
)
def test_a_stored_value_of_another_version_is_read_or_named(
    stores: dict[str, StudyStore],
    which: str,
    content: st.DataObject,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each stored value turned into another version's: keys dropped or added, a value
    of another type, cut short."""
    good = {
        "rehearsal": (StudyAttr.REHEARSALS, REHEARSAL.to_json(), lambda t: {"0": t}),
        "plan": (StudyAttr.PARITY_PLAN, ParityPlan(20, False, "planned").to_json(), str),
        "spec": (StudyAttr.SPEC, SPEC.to_json(), str),
    }[which]
    key, text, wrap = good
    bad = content.draw(bad_content(json.loads(text))).decode("utf-8", "replace")
    _shown_or_refused(_study(stores, {}, {key: wrap(bad)}), capsys)


@pytest.mark.parametrize(
    ("trial_attrs", "study_attrs", "what"),
    [
        # found by the generated cases: a traceback out of `show` for each of these
        ({Attr.RESULT: '{"outcome": "ok", "samples_per_s": "x"}'}, {}, "trial 1's result"),
        ({Attr.RESULT: "[" * 5000}, {}, "trial 1's result"),
        ({Attr.CONFIRMS: "first"}, {}, "trial 1's result"),
        ({}, {StudyAttr.REHEARSALS: {"x": REHEARSAL.to_json()}}, "its rehearsals"),
        ({}, {StudyAttr.REHEARSALS: {"0": "[]"}}, "its rehearsals"),
        ({}, {StudyAttr.PARITY_PLAN: '{"steps": 20}'}, "its parity plan"),
        ({}, {StudyAttr.OBJECTIVE: "fastest"}, "its objective"),
    ],
    ids=["text-figure", "deep", "confirms", "rehearsal-key", "rehearsal", "plan", "goal"],
)
def test_what_a_study_cannot_read_is_named_in_one_line(
    stores: dict[str, StudyStore],
    trial_attrs: dict[str, Any],
    study_attrs: dict[str, Any],
    what: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    name = _study(stores, trial_attrs, study_attrs)
    with pytest.raises(StudyError) as info:
        _read_all(name)
    said = str(info.value)
    assert one_line(said) and f"study {name!r}" in said and f"{what} cannot be read" in said


@examples(15)
@given(value=ATTRIBUTE)
def test_show_and_export_say_a_damaged_study_in_one_line(
    stores: dict[str, StudyStore],
    value: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Through the command: exit status 1 and one line naming the study, or its rows;
    an export refused writes no file."""
    monkeypatch.chdir(tmp_path)
    for old in tmp_path.glob("out*.json"):  # an earlier example's export
        old.unlink()
    name = _study(stores, {Attr.RESULT: value}, {StudyAttr.REHEARSE: False})
    for argv in (["show"], ["export", "--output", "out.json"]):
        code, err = run_cli([*argv, "--study", name, "--storage", URL], capsys)
        assert "Traceback" not in err
        if code != 0:
            assert code == 1 and refused(code, err, Path(name)), err
            assert not (tmp_path / "out.json").exists()


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, StudyStore]:
    """A study in a real SQLite storage, made once: its spec is rewritten per example."""
    url = f"sqlite:///{tmp_path_factory.mktemp('store') / 'studies.db'}"
    store = StudyStore.open(url=url, name="s", spec=SPEC, sampler=make_sampler("tpe", 0))
    return url, store


@examples(20)
@given(
    content=bad_content(json.loads(SPEC.to_json())) | JSON_VALUES.map(json.dumps).map(str.encode)
)
def test_a_spec_of_another_version_is_read_or_named(
    stored: tuple[str, StudyStore], content: bytes
) -> None:
    """StudyStore.load with the spec another version stored: read, or a StudyError."""
    url, store = stored
    store.study.set_user_attr(StudyAttr.SPEC, content.decode("utf-8", "replace"))
    try:
        StudyStore.load(url=url, name="s")
        stored_spec(url=url, name="s")
    except StudyError as exc:
        said = str(exc)
        assert one_line(said) and "study 's'" in said and "its search spec" in said, said


def test_a_spec_too_deep_to_parse_is_named(stored: tuple[str, StudyStore]) -> None:
    """Found by the generated cases: RecursionError, TypeError and KeyError escaped."""
    url, store = stored
    for text in ("[" * 5000 + "]" * 5000, "[]", '{"model": {}}'):
        store.study.set_user_attr(StudyAttr.SPEC, text)
        with pytest.raises(StudyError, match="its search spec cannot be read"):
            StudyStore.load(url=url, name="s")
