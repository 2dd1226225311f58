"""The layout's promises, checked statically: no import cycle, small modules, a pure core,
private modules kept private, public names that resolve, an Optuna adapter that fails
loudly when Optuna moves, review commands without torch, and probe functions that take
what they use."""

from __future__ import annotations

import ast
import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from conftest import ROOT

from autotune.core.trial import TrialConfig

PACKAGE = ROOT / "autotune"
SUBPACKAGES = sorted(path.parent.name for path in PACKAGE.glob("*/__init__.py"))
OUTSIDERS = ("autotune", "benchmarks", "examples")  # tests/ may reach inside a package
LIGHT = ("core", "store", "views")  # `show` and `export` stand on these: no torch


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


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The autotune modules a module imports: every import, at module level, inside
    functions and under TYPE_CHECKING; `from package import module` names the module."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in known}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in known:
            inner = [f"{node.module}.{alias.name}" for alias in node.names]
            whole = all(module in known for module in inner)
            found |= set(inner) if whole else {node.module, *(m for m in inner if m in known)}
    return found - {name}


def test_no_import_cycle_counting_every_import() -> None:
    """Modules import in one direction: a cycle hidden in a function or under
    TYPE_CHECKING is a cycle (a search through the import graph from each module)."""
    known = modules()
    graph = {name: imports_of(name, path, known) for name, path in known.items()}
    for start in graph:
        seen: set[str] = set()
        todo = list(graph[start])
        while todo:
            module = todo.pop()
            assert module != start, f"{start} imports itself through {sorted(seen)}"
            if module not in seen:
                seen.add(module)
                todo.extend(graph[module])


# Libraries that take long to import, or touch a device when imported: the only ones a
# function may import inside itself (so `--help`, `show` and the planner stay light)
HEAVY = frozenset(
    {
        *("torch", "transformers", "datasets", "peft", "trl", "accelerate", "deepspeed"),
        *("bitsandbytes", "liger_kernel", "pynvml", "pyarrow", "huggingface_hub"),
        *("optuna", "optuna_dashboard", "matplotlib"),
    }
)
MODULE_REASON = "# Deferred imports: "  # one reason for every deferred import of a module


def module_level_imports(path: Path) -> list[str]:
    """What a module imports when it is imported (not inside functions, not for types)."""
    found = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        for each in ast.walk(node):
            if isinstance(each, ast.Import):
                found += [alias.name for alias in each.names]
            elif isinstance(each, ast.ImportFrom) and each.level == 0 and each.module:
                found += [each.module, *(f"{each.module}.{a.name}" for a in each.names)]
    return found


def heavy_loads(known: dict[str, Path]) -> dict[str, set[str]]:
    """The heavy libraries each module loads when imported, through every module it
    imports (a package's __init__ included)."""
    direct = {name: module_level_imports(path) for name, path in known.items()}
    loads: dict[str, set[str]] = {}

    def of(name: str) -> set[str]:
        if name not in loads:
            loads[name] = set()
            parts = name.split(".")
            found = set().union(*(of(".".join(parts[:i])) for i in range(1, len(parts))))
            for target in direct.get(name, []):
                top = target.split(".")[0]
                found |= {top} if top in HEAVY else of(target) if target in known else set()
            loads[name] = found
        return loads[name]

    for name in known:
        of(name)
    return loads


def has_reason(lines: list[str], node: ast.stmt) -> bool:
    """A comment on the import's line, or above it (over the imports of its block)."""
    if "#" in lines[node.lineno - 1]:
        return True
    above = node.lineno - 2
    while above >= 0 and (
        not lines[above].strip() or lines[above].strip().startswith(("import ", "from "))
    ):
        above -= 1
    return above >= 0 and lines[above].strip().startswith("#")


def test_an_import_inside_a_function_defers_a_heavy_library_and_says_why() -> None:
    """Imports sit at the top, where a reader finds them; one inside a function must
    keep a heavy library out of the importing module's import, and say why there."""
    known = modules()
    loads = heavy_loads(known)
    for name, path in known.items():
        lines = path.read_text().splitlines()
        said_once = any(line.startswith(MODULE_REASON) for line in lines)
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(function):
                if not isinstance(node, ast.Import | ast.ImportFrom):
                    continue
                targets = {
                    alias.name if isinstance(node, ast.Import) else f"{node.module}.{alias.name}"
                    for alias in node.names
                }
                brings = set()
                for target in targets:
                    module = target if target in known else target.rsplit(".", 1)[0]
                    top = target.split(".")[0]
                    brings |= {top} if top in HEAVY else loads.get(module, set())
                where = f"{name}:{node.lineno} ({function.name})"
                assert brings - loads[name], f"{where}: defers nothing heavy; import at the top"
                assert said_once or has_reason(lines, node), f"{where}: say why it is deferred"


def test_the_formatter_and_the_linter_pass() -> None:
    """ruff format decides the layout and ruff check the rest, over the whole tree."""
    for argv in (["format", "--check", "."], ["check", "."]):
        command = [sys.executable, "-m", "ruff", *argv]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]


def test_no_function_passes_60_lines() -> None:
    """A function that grew a second job is split along it (a chart: its parts)."""
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                assert length <= 60, f"{name}.{node.name}: {length} lines"


def test_no_class_passes_250_lines_or_15_methods() -> None:
    """A class that holds two concerns is split along the seam between them (Progress
    and the search's Pace; a Candidate and what its set levers do)."""
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                methods = [n for n in node.body if isinstance(n, ast.FunctionDef)]
                assert length <= 250, f"{name}.{node.name}: {length} lines"
                assert len(methods) <= 15, f"{name}.{node.name}: {len(methods)} methods"


def test_the_trainers_defaults_are_read_never_written_out_again() -> None:
    """The optimizer's name is declared once (core/optimizers.py, the plain default
    among the declarations); the recipe reads their class's default from the installed
    transformers (`core/recipe.Recipe`, `tuning/resolve.default_optim`). A second copy
    went stale once: transformers 5 trains the fused AdamW by default from torch 2.8."""
    for name, path in modules().items():
        if name != "autotune.core.optimizers":
            assert '"adamw_torch"' not in path.read_text(), f"{name} writes out adamw_torch"


def imported(importer: str, tree: ast.AST) -> Iterator[tuple[str, int]]:
    """Every module (or name) each import in `tree` reaches, with its line: inside
    functions too, `from package import module` as the module, relative ones resolved."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = importer.split(".")[: len(importer.split(".")) - node.level]
            module = ".".join([*base, node.module] if node.level else [node.module or ""])
            yield module, node.lineno
            yield from ((f"{module}.{alias.name}", node.lineno) for alias in node.names)


def private_imports(importer: str, tree: ast.AST) -> list[str]:
    """Imports of a `_private` module (or name) by a module outside the package that
    owns it (the package above the first `_name`)."""
    found = []
    for target, line in imported(importer, tree):
        parts = target.split(".")
        private = [i for i, part in enumerate(parts) if part.startswith("_")]
        private = [i for i in private if not parts[i].startswith("__")]
        owner = ".".join(parts[: private[0]]) if private else None
        if owner and importer != owner and not importer.startswith(owner + "."):
            found.append(f"{importer}:{line} imports {target}")
    return found


@pytest.mark.parametrize(
    "source",
    [
        "from autotune.store._params import candidate_of",
        "import autotune.store._params",
        "from autotune.store import _params",
        "def later():\n    from autotune.store._params import candidate_of",
    ],
)
def test_the_private_import_check_sees_every_form(source: str) -> None:
    """The check below, on an import it must refuse from outside the package."""
    assert private_imports("autotune.tuning.run", ast.parse(source))
    assert not private_imports("autotune.store.store", ast.parse(source))


def test_no_module_outside_a_package_imports_its_private_modules() -> None:
    """A `_name` module is its package's inside: the package re-exports what it offers."""
    found = []
    for path in sorted(p for folder in OUTSIDERS for p in (ROOT / folder).rglob("*.py")):
        importer = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found += private_imports(importer.removesuffix(".__init__"), ast.parse(path.read_text()))
    assert found == []


TRIAL_FIELDS = frozenset(field.name for field in dataclasses.fields(TrialConfig))


FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


def functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, FunctionNode]]:
    """Every function in `tree` with its qualified name (methods and nested ones too)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield f"{prefix}{node.name}", node
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield from functions(node, f"{prefix}{node.name}.")
        else:
            yield from functions(node, prefix)


def narrow_misses(tree: ast.AST) -> list[str]:
    """Each function with a parameter annotated `TrialConfig` that reads fewer than half
    of its fields (distinct `param.field` reads anywhere in the function's body)."""
    found = []
    for name, function in functions(tree):
        arguments = function.args
        for param in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
            names = set() if param.annotation is None else set(ast.walk(param.annotation))
            if not any(getattr(n, "id", getattr(n, "attr", "")) == "TrialConfig" for n in names):
                continue
            read = {
                node.attr
                for node in ast.walk(function)
                if isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == param.arg
                and node.attr in TRIAL_FIELDS
            }
            if 2 * len(read) < len(TRIAL_FIELDS):
                found.append(
                    f"{name}({param.arg}: TrialConfig) reads {len(read)} of its "
                    f"{len(TRIAL_FIELDS)} fields: {sorted(read)}"
                )
    return found


def reading(count: int) -> str:
    """A function that takes a TrialConfig and reads `count` of its fields."""
    read = [f"config.{name}" for name in sorted(TRIAL_FIELDS)[:count]]
    return "def f(config: TrialConfig):\n    return " + " + ".join(read)


HALF = (len(TRIAL_FIELDS) + 1) // 2  # the fewest fields a function may read of it


@pytest.mark.parametrize(
    ("source", "passes"),
    [
        (reading(1), False),
        ("def f(c: trial.TrialConfig | None):\n    return c.seed", False),
        ("class C:\n    def f(self, *, c: TrialConfig):\n        return c.seed", False),
        ("def f(config: TrialConfig):\n    return config.device_kind", False),  # no field
        (reading(HALF - 1), False),
        (reading(HALF), True),
        (reading(len(TRIAL_FIELDS)), True),
        ("def f(config):\n    return config.seed", True),  # takes no TrialConfig
        ("def f(seed: int):\n    return seed", True),
    ],
)
def test_the_narrow_input_check_refuses_a_function_that_reads_little(
    source: str, passes: bool
) -> None:
    """The check below, on functions it must refuse and ones it must let pass."""
    assert (narrow_misses(ast.parse(source)) == []) is passes


def test_a_probe_function_takes_what_it_uses_not_the_whole_trial_config() -> None:
    """A reader sees what a probe function depends on from its parameters: one that
    takes the whole `TrialConfig` reads at least half of its fields (an entry point
    that unpacks it), else it takes the values it uses."""
    found = []
    for path in sorted((PACKAGE / "probe").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found += [f"{module}.{miss}" for miss in narrow_misses(ast.parse(path.read_text()))]
    assert found == [], "\n".join(found)


def exported(package: str) -> dict[str, str]:
    """What the package's `__init__` imports (eagerly, or for type checkers under
    TYPE_CHECKING): each name and the module it comes from."""
    tree = ast.parse((PACKAGE / package / "__init__.py").read_text())
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("autotune."):
            names.update({alias.asname or alias.name: node.module for alias in node.names})
    names.pop("lazy_exports", None)  # the mechanism, not a public name
    return names


@pytest.mark.parametrize("package", SUBPACKAGES)
def test_every_public_name_resolves_to_where_its_package_says(package: str) -> None:
    """Each name in `__all__` is imported (and typed) from its module, and resolves to
    that module's object; the light packages do so without torch or transformers."""
    names = exported(package)
    code = (
        "import importlib, json, sys\n"
        f"package = importlib.import_module('autotune.{package}')\n"
        f"names = {names!r}\n"
        "wrong = [n for n in package.__all__ if n not in names or getattr(package, n)\n"
        "         is not getattr(importlib.import_module(names[n]), n)]\n"
        "heavy = sorted(m for m in ('torch', 'transformers') if m in sys.modules)\n"
        "print(json.dumps([sorted(package.__all__), wrong, heavy]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    public, wrong, heavy = json.loads(done.stdout.splitlines()[-1])
    assert public == sorted(names)  # __all__ and the imports name the same things
    assert wrong == []
    if package in LIGHT:
        assert heavy == []


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
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
