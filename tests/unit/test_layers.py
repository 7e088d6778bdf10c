"""The layers stay layered: the floor (core) lowest, then what talks to SGLang (inference), what a run reads
(intake), the node tools, workers, the producer, devstack (dev tooling) above all; no import circle (not even
through an import inside a function), no Celery app where none is needed."""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The modules that exist to talk to Celery (or are the processes' edges); every other may not build an app.
MODULES_THAT_NEED_AN_APP = {"producer.enqueue.publisher", "workers.celery"}
# The layers, lowest first: each imports only itself and the layers before it. A module is in the layer of
# the longest name it starts with: the node tools (`node`) stand on what a run reads (`intake`),
# which stands on what talks to SGLang (`inference`), on the floor (`core`).
LAYERS = ("core", "inference", "intake", "node", "workers", "producer", "devstack")
PACKAGES = ("core", "inference", "intake", "node", "workers", "producer", "devstack")


def layer_of(module: str) -> str | None:
    matches = [layer for layer in LAYERS if module == layer or module.startswith(layer + ".")]
    return max(matches, key=len, default=None)


def imported_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def modules_of(package: str) -> list[str]:
    return sorted(
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for path in (ROOT / package).rglob("*.py")
    )


def test_no_module_imports_a_layer_above_its_own() -> None:
    upward = sorted(
        (str(path.relative_to(ROOT)), imported)
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        for imported in imported_names(path)
        if (above := layer_of(imported)) is not None
        and LAYERS.index(above) > LAYERS.index(layer_of(module_name(path)) or package)
    )
    assert upward == []


# workers/ is rooms, lowest first. A room imports only itself, the rooms it lists, and the floor; the
# Celery edge (the package's own modules, bootsteps/) imports anything, and no room imports it.
WORKERS_FLOOR = {"workers", "workers.errors", "workers.periodic"}
WORKERS_ROOMS: dict[str, set[str]] = {
    "workers.state": set(),
    "workers.broker": {"workers.state"},
    "workers.record": {"workers.state"},
    "workers.recovery": {"workers.state", "workers.broker"},
    "workers.generate": {"workers.state", "workers.recovery"},
}
# What the producer may import of workers: the floor, the rooms below the Celery edge that it uses (the
# run state, the broker, the output record, recovery for a re-run's stranded batches), and the one
# reader of the DRAFTGEN_* environment both sides share.
PRODUCER_SEES = {"workers.state", "workers.broker", "workers.record", "workers.recovery"}
PRODUCER_ALSO_IMPORTS = {"workers.settings"}


def room_of(module: str) -> str:
    """`workers.state.keys` -> `workers.state`; a module of the package itself is the edge, `workers`."""
    parts = module.split(".")
    if len(parts) > 2 and f"workers.{parts[1]}" in WORKERS_ROOMS:
        return f"workers.{parts[1]}"
    return module if module in WORKERS_FLOOR else "edge"


def workers_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("workers."))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.update({node.module} if node.module.startswith("workers.") else set())
    return found


def test_each_workers_room_imports_only_the_rooms_below_it() -> None:
    crossings = sorted(
        (str(path.relative_to(ROOT)), imported)
        for path in (ROOT / "workers").rglob("*.py")
        if (room := room_of(".".join(path.relative_to(ROOT).with_suffix("").parts))) in WORKERS_ROOMS
        for imported in workers_imports(path)
        if room_of(imported) not in WORKERS_FLOOR | {room} | WORKERS_ROOMS[room]
    )
    assert crossings == []


def test_the_producer_imports_workers_only_through_its_rooms_and_the_environment_reader() -> None:
    crossings = sorted(
        (str(path.relative_to(ROOT)), imported)
        for path in (ROOT / "producer").rglob("*.py")
        for imported in workers_imports(path)
        if room_of(imported) not in WORKERS_FLOOR | PRODUCER_SEES and imported not in PRODUCER_ALSO_IMPORTS
    )
    assert crossings == []


def test_every_workers_module_lives_in_a_room_or_is_the_edge() -> None:
    rooms = {path.parent.name for path in (ROOT / "workers").glob("*/__init__.py")}
    assert rooms == {name.split(".")[1] for name in WORKERS_ROOMS} | {"bootsteps"}


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
        name: ROOT / (name.replace(".", "/") + ".py") for package in PACKAGES for name in modules_of(package)
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
        for package in PACKAGES[:-1]
        for name in modules_of(package)
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


def test_the_producer_is_a_folder_per_command_whose_parser_names_handlers_of_its_own_folder() -> None:
    from producer.cli import COMMAND_MODULES, build_parser
    from producer.deferred import Deferred

    folders = {module.rsplit(".", 1)[0] for module in COMMAND_MODULES}
    assert all(module.endswith(".parser") for module in COMMAND_MODULES)
    assert all((ROOT / folder.replace(".", "/") / "command.py").exists() for folder in folders)
    assert sorted(path.name for path in (ROOT / "producer").rglob("*_cli.py")) == []
    commands = next(
        action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction)
    )
    handlers = {name: parser.get_default("handler") for name, parser in commands.choices.items()}
    assert all(isinstance(handler, Deferred) for handler in handlers.values())
    strays = {
        name: f"{handler.module}.{handler.function}"
        for name, handler in handlers.items()
        if handler.module.rsplit(".", 1)[0] not in folders or not handler.function.startswith("cmd_")
    }
    assert strays == {}
