"""Runs with checkpoints in files, built through the real ingest path, and a watch on every file
this process opens (``sys.addaudithook``): a test that says "nothing was opened" proves it."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest

COMPONENTS = ["model", "optimizer", "scheduler", "rng", "data_progress"]
T0 = "2026-11-01T00:00:00Z"


# --- opened files ---------------------------------------------------------------------------

_WATCHED: list[str] = []
_OPENED: list[str] = []


def _audit(event, args):
    if event == "open" and _WATCHED and args and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.fsdecode(args[0])
        if any(path.endswith(name) or name.endswith("/" + path.lstrip("/")) for name in _WATCHED):
            _OPENED.append(path)


if not getattr(sys, "_recoverydash_storage_audit", False):
    sys.addaudithook(_audit)  # hooks cannot be removed: one for the whole test process
    sys._recoverydash_storage_audit = True


@pytest.fixture
def opened():
    """``watch(*paths)`` starts recording every ``open`` of those files (by ``open()`` or
    ``os.open``, also component by component with ``dir_fd``) in this process; the fixture's
    list holds what was opened."""
    _OPENED.clear()

    def watch(*paths):
        _WATCHED.extend(str(p) for p in paths)
        return _OPENED

    yield watch
    _WATCHED.clear()
    _OPENED.clear()


# --- runs -----------------------------------------------------------------------------------

def data_of(generation_id: str, component: str) -> bytes:
    return hashlib.sha256(f"{generation_id}/{component}".encode()).digest() * 8  # 256 bytes


def write_generation(location: Path, generation_id: str, *, relative: bool = False,
                     uri_root: str | None = None) -> list[dict]:
    """Write a one-shard generation's five objects under ``location/generation_id`` and return
    its manifest objects: ``file://`` URIs (under ``uri_root`` instead of ``location`` when
    given: what a trainer that sees another path would write), or relative ones."""
    objects = []
    for component in COMPONENTS:
        rel = f"{component}/__0_0.distcp"
        path = location / generation_id / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        data = data_of(generation_id, component)
        path.write_bytes(data)
        if relative:
            uri = rel
        else:
            uri = f"file://{uri_root or location.resolve()}/{generation_id}/{rel}"
        objects.append({"uri": uri, "shard": "rank0", "component": component,
                        "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    return objects


def manifest(generation_id: str, update: int, objects: list[dict], **extra) -> dict:
    return {"schema_revision": 1, "generation_id": generation_id, "update": update,
            "world_size": 1, "required_shards": ["rank0"], "components": COMPONENTS,
            "objects": objects, "dataset_version": "ds-v1",
            "data_progress": {"cursor": [{"stratum": "main", "epoch": 0,
                                          "position": 4 * update}]},
            "committed_at": f"2026-11-01T00:01:{update:02d}Z", **extra}


def run_events(run_id: str, manifests: list[dict], updates: int, *, ended: bool = True) -> list:
    """One attempt of one rank consuming 4 positions per update, the given manifests committed
    at their updates, and (``ended``) a completed end."""
    events = [{"event_id": f"{run_id}:start", "type": "attempt_started", "run_id": run_id,
               "attempt": 0, "time": T0, "world_size": 1, "dataset_version": "ds-v1",
               "global_batch_size": 4}]
    for u in range(1, updates + 1):
        events.append({"event_id": f"{run_id}:u{u}", "type": "update_committed",
                       "run_id": run_id, "attempt": 0, "time": f"2026-11-01T00:01:{u:02d}Z",
                       "update": u, "rank": 0,
                       "spans": [{"stratum": "main", "epoch": 0, "ranges": [[4 * u - 4, 4 * u]]}]})
        for m in manifests:
            if m["update"] == u:
                events.append({"event_id": f"{run_id}:commit:{m['generation_id']}",
                               "type": "checkpoint_committed", "run_id": run_id, "attempt": 0,
                               "time": f"2026-11-01T00:01:{u:02d}.5Z", "manifest": m})
    if ended:
        events.append({"event_id": f"{run_id}:end", "type": "attempt_ended", "run_id": run_id,
                       "attempt": 0, "time": f"2026-11-01T00:02:{updates:02d}Z",
                       "reason": "completed", "update": updates})
    return events


@pytest.fixture
def ingest(settings):
    """``ingest(project, events)``: the events through the real ingest action, with the work it
    enqueues (verification, analysis, alerts) run eagerly here."""
    from recoverydash.ingest.actions import ingest_batch

    settings.CELERY_TASK_ALWAYS_EAGER = True

    def run(project, events):
        result = ingest_batch(project, events)
        assert not getattr(result, "errors", None), result
        return result

    return run


def checks(run_id: str) -> dict:
    """uri -> (check_status, check_detail) of a run's manifest objects."""
    from recoverydash.runs.models import CheckpointObject

    return {o.uri: (o.check_status, o.check_detail) for o in CheckpointObject.objects.filter(
        generation__run__run_id=run_id, in_manifest=True)}


def generation(run_id: str, generation_id: str):
    from recoverydash.runs.models import Generation

    return Generation.objects.get(run__run_id=run_id, generation_id=generation_id)
