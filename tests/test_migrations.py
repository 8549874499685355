"""Migrations stay what they were when they were written: a data migration imports no product
code (what it needs is frozen inside it), every app's migrations form one line, and no number is
given twice again (the two runs migrations numbered 0009 stay as they are: CONTRIBUTING.md,
"Migrations", says why)."""

from __future__ import annotations

import ast
import importlib
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MIGRATIONS = sorted(p for p in (REPO / "recoverydash").glob("*/migrations/0*.py"))
PROJECT_PACKAGES = ("recoverydash", "workers")
#: Numbers given twice before this test existed. Both were applied by deployed databases under
#: these names, which Django records: renaming one would make it run again there.
SHARED_NUMBERS = {("runs", "0009"): {"0009_ingest_seq_sequence", "0009_analysis_clock"}}


def project_imports(path: Path) -> list[tuple[str, int]]:
    """``(module, line)`` of every import of project code in the file, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [(n, node.lineno) for n in names if n.split(".")[0] in PROJECT_PACKAGES]
    return found


def test_no_data_migration_imports_product_code():
    """A data migration (one with RunPython) works on the historical models it is given and on
    copies of the helpers it needs; importing a live helper would let a later edit of it change
    what the old migration does. A schema migration may name a field's default callable by its
    path, as Django writes it (``recoverydash.alerts.models.new_webhook_secret``)."""
    data = [p for p in MIGRATIONS if "RunPython" in p.read_text()]
    assert len(data) >= 5
    offending = {str(p.relative_to(REPO)): project_imports(p) for p in data if project_imports(p)}
    assert not offending, offending


def test_each_app_has_one_line_of_migrations_and_no_new_number_is_shared():
    from django.db.migrations.loader import MigrationLoader

    graph = MigrationLoader(None, ignore_no_migrations=True).graph
    ours = {app for app, _ in graph.nodes if (REPO / "recoverydash" / app / "migrations").is_dir()}
    leaves = Counter(app for app, _ in graph.leaf_nodes() if app in ours)
    assert leaves and all(n == 1 for n in leaves.values()), leaves
    numbers: dict[tuple[str, str], set[str]] = {}
    for app, name in graph.nodes:
        if app in ours:
            numbers.setdefault((app, name[:4]), set()).add(name)
    shared = {key: names for key, names in numbers.items() if len(names) > 1}
    assert shared == SHARED_NUMBERS
    # the pair is one chain, in this order, with 0010 after both
    assert ("runs", "0009_ingest_seq_sequence") in \
        graph.node_map[("runs", "0009_analysis_clock")].parents
    assert ("runs", "0009_analysis_clock") in \
        graph.node_map[("runs", "0010_analysis_compaction")].parents


def migration(app: str, name: str):
    return importlib.import_module(f"recoverydash.{app}.migrations.{name}")


def test_the_frozen_clock_helpers_give_what_they_gave_when_frozen():
    clock_of = migration("runs", "0009_analysis_clock").clock_of
    result = {"last_restorable": {"committed_at": "2026-11-01T00:00:05Z"},
              "first_event_at": "2026-11-01T00:00:00+00:00", "ended_at": "not a time",
              "update_interval": {"median_s": 2.0}}
    assert clock_of(result) == {"last_restorable": {"committed_at": 1793491205.0},
                                "first_event_at": 1793491200.0, "ended_at": None,
                                "update_interval": {"median_s": 2.0}}
    assert clock_of(None, 12.5) == {"last_restorable": None, "first_event_at": 12.5,
                                    "ended_at": None}
    frozen = migration("runs", "0011_fleet_order_columns")
    assert frozen.checkpoint_age_limit_of({"max_checkpoint_age_s": 600}) == 600.0
    assert frozen.checkpoint_age_limit_of({"max_checkpoint_age_s": "600"}) is None
    assert frozen.clock_columns({"last_restorable": None, "first_event_at": 3.0,
                                 "ended_at": 9.0}) == {"clock_since_s": 3.0, "clock_ended_s": 9.0}


def test_the_frozen_path_rules_give_what_they_gave_when_frozen():
    used_prefix = migration("storage", "0003_declare_used_prefixes").used_prefix
    assert used_prefix("file:///data//ckpt/run1/g4/model/__0_0.distcp", "g4") == \
        "file:///data/ckpt/run1"
    assert used_prefix("file:///data/ckpt/x.pt", "g9") == "file:///data/ckpt"
    assert used_prefix("s3://bucket/team/g4/model.pt", "g4") == "s3://bucket/team"
    assert used_prefix("file:///ckpt.pt", "g1") == "file:///"
    assert used_prefix("file://otherhost/data/x", "g1") is None
    assert used_prefix("s3://bucket/a/../b", "g1") is None
    assert used_prefix("gs://bucket/x", "g1") is None
    paths = migration("storage", "0003_declare_used_prefixes").paths
    assert paths.is_unsafe_folder("/etc/ckpt", []) == "the system folder /etc"
    assert paths.rest_under("file:///data/ckpt/a", "file:///data/ckpt") == "a"
