"""The import graph, read from the source (ast, nothing is imported): dependencies point one way,
recovery <- runs <- storage / ingest / alerts <- dashboard <- workers.

Every ``import`` counts, at module level or inside a function (a lazy import is still a
dependency a reader must know about). A module of a lower layer never imports a higher one,
apps of one layer never import each other in a cycle, no two modules import each other (directly
or around a loop), nothing in ``recoverydash`` imports ``workers`` (work is sent by task name),
and the trainer side (``recoverydash.sdk``, ``recoverydash.integrations``,
``recoverydash.formats``) reaches only itself and the pure layer 0 (the core and
``storage/objects.py``), and through them no server library. The SDK's install test
(``tests/sdk/test_light_install.py``) proves the same at run time, in a venv without the server.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("recoverydash", "workers")

# app -> layer; an app may import apps of its own layer or below, never above. Layer 0 is pure
# (no server library): the core, and storage's object access, which the trainer side shares.
LAYERS = {
    "recovery": 0, "storage.objects": 0,
    "runs": 1,
    "storage": 2, "ingest": 2, "alerts": 2,
    "dashboard": 3, "metrics": 3,
    "project": 4,  # recoverydash.settings, urls, wsgi, serve and the package itself
    "demo": 4,
    "workers": 5,
}
PURE_MODULES = {"recoverydash.storage.objects": "storage.objects",
                "recoverydash.storage.paths": "storage.objects"}  # canonical URIs, safe opens
# The trainer side stands apart: the SDK, its framework integrations and the checkpoint-format
# readers of its command line are installed without the server (pyproject's base dependencies),
# so they may import only each other and layer 0, and only the demo (which drives a trainer)
# uses them.
TRAINER_SIDE = {"sdk", "integrations", "formats"}
TRAINER_SIDE_USED_BY = TRAINER_SIDE | {"demo"}
# The format adapters are pure readers of a folder (no server library, like storage.objects):
# the server's adoption of another tool's checkpoints (ingest.adoption) and the check of an
# adopt location's format (storage.locations) use them too.
FORMATS_USED_BY = TRAINER_SIDE_USED_BY | {"ingest", "storage"}
# Libraries of the server: neither layer 0 nor the trainer side may reach one.
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
    if name in PURE_MODULES:
        return PURE_MODULES[name]
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


def node_of(name: str) -> str:
    """The app of a module in the graph of apps, where a command-line entry point
    (``x.__main__``) is a node of its own, ``x:main``, above its package: nothing imports an
    entry point, so it closes no loop."""
    return app_of(name) + (":main" if name.endswith(".__main__") else "")


def test_it_knows_every_app_of_the_project():
    assert {app_of(n) for n in MODULES} <= set(LAYERS) | TRAINER_SIDE
    assert len(MODULES) > 50 and "recoverydash.runs.analysis" in MODULES


def test_it_finds_no_import_pointing_up_the_layers():
    wrong = [f"{where(a, line)}: {app_of(a)} (layer {LAYERS[app_of(a)]}) imports {b} "
             f"({app_of(b)}, layer {LAYERS[app_of(b)]})"
             for a, b, line in project_edges()
             if app_of(a) in LAYERS and app_of(b) in LAYERS
             and LAYERS[app_of(a)] < LAYERS[app_of(b)]]
    assert wrong == []


def test_it_finds_no_import_of_workers_from_recoverydash():
    wrong = [f"{where(a, line)} imports {b}" for a, b, line in project_edges()
             if a.startswith("recoverydash") and b.startswith("workers")]
    assert wrong == []


def test_it_finds_no_cycle_between_apps():
    graph: dict[str, set[str]] = {}
    for a, b, _ in project_edges():
        if node_of(a) != node_of(b):
            graph.setdefault(node_of(a), set()).add(node_of(b))
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


def test_it_keeps_the_trainer_side_to_itself_and_the_pure_layer():
    wrong = [f"{where(a, line)} imports {b}" for a, b, line in project_edges()
             if app_of(a) in TRAINER_SIDE and app_of(b) not in TRAINER_SIDE
             and LAYERS.get(app_of(b)) != 0]
    assert wrong == []
    users = {app_of(a) for a, b, _ in project_edges()
             if app_of(b) in TRAINER_SIDE - {"formats"}}
    assert users <= TRAINER_SIDE_USED_BY
    users = {app_of(a) for a, b, _ in project_edges() if app_of(b) == "formats"}
    assert users <= FORMATS_USED_BY


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


def test_it_uses_no_private_name_of_the_pure_layer_from_another_module():
    """What the trainer side and the server share of layer 0 (storage.objects, storage.paths)
    is its public functions: a private helper used from outside is made public first."""
    wrong = [f"{where(n, line)} uses {target}" for n in MODULES
             for target, line in private_uses(n)
             if app_of(resolve(target.rpartition(".")[0])) in ("storage.objects",)
             and app_of(n) != "storage.objects"]
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


@pytest.mark.parametrize("app", sorted({app_of(n) for n in MODULES if app_of(n) in TRAINER_SIDE
                                        or LAYERS.get(app_of(n)) == 0}))
def test_it_reaches_no_server_library_from_the_trainer_side_or_the_pure_layer(app):
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
