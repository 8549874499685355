"""The import graph, read from the source (ast, nothing is imported), held against one list: the
floors of the house, lowest first (``LAYERS``, which the README copies).

Every ``import`` counts, at module level or inside a function (a lazy import is still a
dependency a reader must know about). An app imports only apps of its own floor or lower ones,
never a higher one; no apps and no modules import each other in a loop; nothing in
``recoverydash`` imports ``workers`` (work is sent by task name) or a command line's
``__main__``. Each floor is on a side: ``pure`` (serves both sides: the core and the
checkpoints layer), ``trainer`` (the base install, ``pip install recoverydash``) or ``server``
(the ``server`` extra); the demo drives both. A pure or trainer app reaches no server library,
and the server never imports the trainer side. The SDK's install test
(``tests/sdk/test_light_install.py``) proves the first at run time, in a venv without the server.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("recoverydash", "workers")

PURE, TRAINER, SERVER, BOTH = "pure", "trainer", "server", "both"
# The floors, lowest first: (apps, side). ``project`` is recoverydash.settings, urls, wsgi, serve
# and the package itself.
LAYERS = [
    ("recovery", PURE),                     # the core: figures, generation rules, verdicts
    ("checkpoints", PURE),                  # objects, paths, formats, offline restore selection
    ("sdk", TRAINER),                       # the trainer's sender, ledger, checkpoints
    ("integrations", TRAINER),              # PyTorch, Hugging Face, Lightning, torchdata
    ("runs", SERVER),                       # the data model, analysis, the work queue
    ("storage ingest alerts", SERVER),      # verification, the API, alert rules and delivery
    ("dashboard metrics", SERVER),          # pages, Prometheus
    ("project", SERVER),                    # settings, URLs, serve
    ("demo", BOTH),                         # a real trainer against a real server
    ("workers", SERVER),                    # Celery tasks
]
FLOOR = {app: i for i, (apps, _) in enumerate(LAYERS) for app in apps.split()}
SIDE = {app: side for apps, side in LAYERS for app in apps.split()}
# Libraries of the server: neither the pure layers nor the trainer side may reach one.
SERVER_LIBRARIES = {"django", "ninja", "celery", "kombu", "plotly", "psycopg", "psycopg2",
                    "redis", "pydantic", "dj_database_url", "whitenoise", "gunicorn",
                    "standardwebhooks", "httpx", "prometheus_client", "markdown", "axes"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def resolve(name: str) -> str | None:
    """The project module ``name`` refers to (itself, or the package holding an attribute of
    that name), None for a third-party or standard module."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(name: str) -> list[tuple[str, int]]:
    """``(imported module, line)`` for every import in module ``name``: project modules by their
    full name (``from pkg import sub`` names the submodule when there is one), others by their
    top-level name. Importing ``a.b.c`` also runs ``a`` and ``a.b``: those count too."""
    tree = ast.parse(MODULES[name].read_text(), str(MODULES[name]))
    package = name if is_package(name) else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                       for a in node.names]
        for target in targets:
            project = resolve(target)
            if project is None:
                found.append((target.split(".")[0], node.lineno))
                continue
            parts = project.split(".")
            found.extend((".".join(parts[:i]), node.lineno) for i in range(1, len(parts) + 1))
    return [(t, line) for t, line in found if t != name]


GRAPH = {name: imports_of(name) for name in MODULES}


def app_of(name: str) -> str:
    """The app of a module: its package below ``recoverydash`` (``workers``; ``project`` for the
    modules beside settings)."""
    parts = name.split(".")
    if parts[0] == "workers":
        return "workers"
    if len(parts) > 1 and (ROOT / "recoverydash" / parts[1]).is_dir():
        return parts[1]
    return "project"


def inert(name: str) -> bool:
    """A package whose ``__init__`` imports nothing (the package root, ``storage``): importing a
    module inside it runs nothing of it, so it is no dependency."""
    return is_package(name) and not GRAPH[name]


def project_edges():
    for name, targets in GRAPH.items():
        for target, line in targets:
            if target in MODULES and not inert(target):
                yield name, target, line


def where(name: str, line: int) -> str:
    return f"{MODULES[name].relative_to(ROOT)}:{line}"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan), each sorted."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_it_knows_every_app_of_the_project():
    assert {app_of(n) for n in MODULES} <= set(FLOOR)
    assert len(MODULES) > 50 and "recoverydash.runs.analysis" in MODULES


def test_it_finds_no_import_pointing_up_the_layers():
    wrong = [f"{where(a, line)}: {app_of(a)} (floor {FLOOR[app_of(a)]}) imports {b} "
             f"({app_of(b)}, floor {FLOOR[app_of(b)]})"
             for a, b, line in project_edges() if FLOOR[app_of(a)] < FLOOR[app_of(b)]]
    assert wrong == []


def test_it_finds_no_import_of_workers_from_recoverydash():
    wrong = [f"{where(a, line)} imports {b}" for a, b, line in project_edges()
             if a.startswith("recoverydash") and b.startswith("workers")]
    assert wrong == []


def test_it_finds_no_cycle_between_apps():
    graph: dict[str, set[str]] = {}
    for a, b, _ in project_edges():
        if app_of(a) != app_of(b):
            graph.setdefault(app_of(a), set()).add(app_of(b))
    assert cycles(graph) == []
    entry_points_imported = [f"{where(a, line)} imports {b}" for a, b, line in project_edges()
                             if b.endswith(".__main__")]
    assert entry_points_imported == []


def test_it_finds_no_cycle_between_modules():
    graph: dict[str, set[str]] = {}
    for a, b, _ in project_edges():
        # a package's __init__ re-exporting its submodules is not a loop of dependencies
        if not (is_package(b) and a.startswith(b + ".")):
            graph.setdefault(a, set()).add(b)
    assert cycles(graph) == []


def test_it_keeps_the_server_from_importing_the_trainer_side():
    wrong = [f"{where(a, line)} imports {b}" for a, b, line in project_edges()
             if SIDE[app_of(a)] == SERVER and SIDE[app_of(b)] == TRAINER]
    assert wrong == []


def private_uses(name: str) -> list[tuple[str, int]]:
    """``(module._name, line)`` for every private name (one leading underscore, not a dunder) of
    another project module that module ``name`` uses: ``from m import _x`` or ``m._x`` on a
    module imported as ``m``."""
    tree = ast.parse(MODULES[name].read_text(), str(MODULES[name]))
    package = name if is_package(name) else name.rpartition(".")[0]
    aliases, out = {}, []

    def private(attr: str) -> bool:
        return attr.startswith("_") and not attr.startswith("__")

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                full = f"{base}.{a.name}"
                if full in MODULES:
                    aliases[a.asname or a.name] = full
                elif base in MODULES and base != name and private(a.name):
                    out.append((full, node.lineno))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in MODULES and a.asname:
                    aliases[a.asname] = a.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id in aliases and private(node.attr) \
                and aliases[node.value.id] != name:
            out.append((f"{aliases[node.value.id]}.{node.attr}", node.lineno))
    return out


def test_it_uses_no_private_name_of_the_pure_layers_from_another_app():
    """What the trainer side and the server share of the pure layers (the core, checkpoints) is
    their public functions: a private helper used from another app is made public first."""
    wrong = [f"{where(n, line)} uses {target}" for n in MODULES
             for target, line in private_uses(n)
             if SIDE[app_of(resolve(target.rpartition(".")[0]))] == PURE
             and app_of(resolve(target.rpartition(".")[0])) != app_of(n)]
    assert wrong == []


def reachable(start: list[str]) -> dict[str, tuple[str, int]]:
    """Every module and library reachable from ``start``: name -> (importer, line)."""
    seen: dict[str, tuple[str, int]] = {}
    todo = list(start)
    while todo:
        name = todo.pop()
        for target, line in GRAPH.get(name, ()):
            if target not in seen and target not in start:
                seen[target] = (name, line)
                if target in MODULES:
                    todo.append(target)
    return seen


@pytest.mark.parametrize("app", sorted(a for a, side in SIDE.items() if side in (PURE, TRAINER)))
def test_it_reaches_no_server_library_from_the_trainer_side_or_the_pure_layers(app):
    start = [n for n in MODULES if app_of(n) == app]
    found = reachable(start)
    wrong = [f"{target} via {where(*found[target])}" for target in sorted(found)
             if target in SERVER_LIBRARIES]
    assert wrong == []


def test_it_keeps_the_package_root_import_light():
    assert [t for t, _ in GRAPH["recoverydash"]] == []


def test_it_registers_every_task_the_service_sends_by_name():
    from celery import current_app

    from recoverydash.runs import queue
    from workers.celery import BEAT_SCHEDULE, app

    assert current_app._get_current_object() is app  # loaded by Django as an installed app
    sent = set(queue.TASK_NAMES) | {entry["task"] for entry in BEAT_SCHEDULE.values()}
    assert sent - set(app.tasks) == set()
