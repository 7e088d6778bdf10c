"""The layers stay layered: inference lowest, workers below producer, devstack (dev tooling) above all,
no import circle (not even through an import inside a function), no Celery app where none is needed."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The modules that exist to talk to Celery (or are the processes' edges); every other may not build an app.
MODULES_THAT_NEED_AN_APP = {"producer.publisher", "workers.celery"}
FORBIDDEN_BELOW = {
    "inference": {"workers", "producer", "devstack"},
    "workers": {"producer", "devstack"},
    "producer": {"devstack"},  # development tooling is not shipped: nothing shipped may need it
}


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def modules_of(package: str) -> list[str]:
    return sorted(
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for path in (ROOT / package).rglob("*.py")
    )


def test_no_module_imports_a_layer_above_its_own() -> None:
    upward = sorted(
        (str(path.relative_to(ROOT)), imported)
        for package, above in FORBIDDEN_BELOW.items()
        for path in (ROOT / package).rglob("*.py")
        for imported in imported_packages(path) & above
    )
    assert upward == []


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """Our modules this file imports, at the top or inside a function; `from a import b` means a.b if
    that is a module."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.update(
                f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in known else node.module
                for alias in node.names
            )
    return names & known


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph, as the modules along it, or None."""
    done: set[str] = set()

    def visit(module: str, trail: list[str]) -> list[str] | None:
        if module in trail:
            return [*trail[trail.index(module) :], module]
        if module in done:
            return None
        for imported in sorted(graph[module]):
            cycle = visit(imported, [*trail, module])
            if cycle:
                return cycle
        done.add(module)
        return None

    return next((cycle for module in sorted(graph) if (cycle := visit(module, []))), None)


def test_no_module_imports_itself_back_through_others() -> None:
    paths = {
        name: ROOT / (name.replace(".", "/") + ".py")
        for package in ("inference", "workers", "producer", "devstack")
        for name in modules_of(package)
    }
    paths = {
        name: path if path.exists() else path.with_suffix("") / "__init__.py" for name, path in paths.items()
    }
    known = set(paths)
    graph = {name: imported_modules(path, known) - {name} for name, path in paths.items()}

    assert import_cycle(graph) is None


def test_importing_any_module_that_does_not_send_messages_builds_no_celery_app() -> None:
    modules = [
        name
        for name in modules_of("producer") + modules_of("workers") + modules_of("inference")
        if name not in MODULES_THAT_NEED_AN_APP and not name.endswith("__main__")  # those run a command
    ]
    probe = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "from celery import Celery\n"
        "import gc\n"
        "apps = [o for o in gc.get_objects() if isinstance(o, Celery) and o.main == 'draftgen']\n"
        "print(len(apps))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0", "a module builds a Celery app at import"
