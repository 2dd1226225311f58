"""The layout's promises, checked statically: no import cycle, small modules, a pure core,
an Optuna adapter that fails loudly when Optuna moves, and review commands without torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from conftest import ROOT

PACKAGE = ROOT / "autotune"


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def test_the_layers_of_the_architecture_hold() -> None:
    """docs/ARCHITECTURE.md's layers, as import-linter contracts (pyproject.toml): every
    import counts, inside functions and under TYPE_CHECKING too."""
    lint_imports = Path(sys.executable).parent / "lint-imports"  # import-linter's command
    command = [str(lint_imports), "--no-cache"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]


def test_the_formatter_and_the_linter_pass() -> None:
    """ruff format decides the layout and ruff check the rest, over the whole tree."""
    for argv in (["format", "--check", "."], ["check", "."]):
        command = [sys.executable, "-m", "ruff", *argv]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]


def test_no_function_passes_60_lines_without_saying_why() -> None:
    """A function that grew a second job is split; one that is long by nature (a chart
    drawn call by call) says so in a `# long: ...` comment on its first lines."""
    for name, path in modules().items():
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                head = " ".join(lines[node.lineno - 1 : node.lineno + 2])
                assert length <= 60 or "# long: " in head, f"{name}.{node.name}: {length} lines"


def test_the_optuna_adapter_still_finds_what_it_uses(tmp_path: Path) -> None:
    """store/compat.py reaches past Optuna's documented API; an upgrade that moves any of
    it must fail here, not in a user's search."""
    from autotune.store import compat
    from autotune.store.storage import open_storage

    storage = open_storage(f"sqlite:///{tmp_path / 'c.db'}")
    study = optuna.create_study(storage=storage, study_name="c")
    trial = study.ask()
    tid = compat.trial_id(storage, study, trial.number)
    compat.record_heartbeat(storage, tid)
    assert compat.heartbeat_interval(storage) >= 1
    assert compat.stale_trial_ids(storage, study) == []  # beating now: not stale
    assert compat.study_id(storage, study) == storage.get_study_id_from_name("c")


@pytest.mark.parametrize("command", [["show"], ["export", "--output", "x.json"]])
def test_review_commands_import_neither_torch_nor_transformers(
    command: list[str], tmp_path: Path
) -> None:
    """`show` and `export` on a stored study start fast: they must not import torch."""
    (tmp_path / "studies").mkdir()
    db = ROOT / "examples" / "demo" / "autotune.db"
    (tmp_path / "studies" / "autotune.db").write_bytes(db.read_bytes())
    code = (
        "import sys\n"
        "from autotune.cli import main\n"
        f"main({[*command, '--study', 'mt5-small']!r})\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
