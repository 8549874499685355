"""docs/definitions.md#resume-from-a-generation-the-server-had-not-seen through ingest and the
worker's ``analyze_run``: attempt 0 was killed within a second of its first event (nothing of it
arrived); attempt 1 resumes gX, whose manifest is in the run's declared storage location (a
location that is not listed periodically), or nowhere."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.core.cache import cache

from recoverydash.checkpoints import objects as storage
from recoverydash.ingest.actions import ingest_batch
from recoverydash.ingest.discovery import resumed_in_storage
from recoverydash.runs.models import Analysis, Generation, Run
from workers.tasks import analyze_run

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 1, tzinfo=UTC)
CURSOR = [{"stratum": "main", "epoch": 0, "position": 60}]


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat()


def resumed_run(project, run_id: str) -> Run:
    """Attempt 1, the only attempt the server hears of, resumes gX at update 3 (cursor epoch 0
    at 60) and commits updates 4..6 of 20 positions each from 60."""
    events = [{"event_id": f"{run_id}-s1", "type": "attempt_started", "run_id": run_id,
               "attempt": 1, "time": at(50), "world_size": 1, "dataset_version": "v",
               "contract": {"required_components": ["model"]},
               "resumed_from": {"generation_id": "gX", "update": 3, "cursor": CURSOR}}]
    events += [{"event_id": f"{run_id}-u{u}", "type": "update_committed", "run_id": run_id,
                "attempt": 1, "rank": 0, "time": at(100 + u), "update": u,
                "spans": [{"stratum": "main", "epoch": 0,
                           "ranges": [[60 + 20 * (u - 4), 60 + 20 * (u - 3)]]}]}
               for u in range(4, 7)]
    assert ingest_batch(project, events).accepted
    return Run.objects.get(project=project, run_id=run_id)


def write_gx(folder, run_id: str) -> str:
    """gX of run ``run_id`` as attempt 0 published it: one model object and its manifest
    (cursor at 60)."""
    (folder / "gX" / "model").mkdir(parents=True)
    path = folder / "gX" / "model" / "rank0.pt"
    path.write_bytes(b"\x03" * 64)
    digest, size = storage.sha256_file(str(path))
    manifest = {"schema_revision": 1, "generation_id": "gX", "update": 3, "world_size": 1,
                "required_shards": ["rank0"], "components": ["model"],
                "objects": [{"uri": storage.file_uri(str(path)), "shard": "rank0",
                             "component": "model", "size": size, "sha256": digest}],
                "data_progress": {"cursor": CURSOR}, "dataset_version": "v",
                "committed_at": at(40), "run_id": run_id, "attempt": 0}
    return storage.write_manifest_atomically(str(folder), manifest)


@pytest.fixture(autouse=True)
def fresh_cache():
    cache.clear()
    yield
    cache.clear()


def test_the_worker_finds_the_resumed_manifest_in_the_run_folder_and_lists_it(
        project, tmp_path, declare_location):
    declare_location(project, tmp_path, discover=False)  # never listed: the lookup finds it
    uri = write_gx(tmp_path / "found", "found")
    run = resumed_run(project, "found")
    analyze_run(run.pk)  # the worker's task, called in-process
    gen = Generation.objects.get(run=run, generation_id="gX")
    assert (gen.update, gen.discovered, gen.found_at) == (3, True, uri.rsplit("/", 1)[0])
    result = Analysis.objects.get(run=run).result
    assert [g["generation_id"] for g in result["generations"]] == ["gX"]
    (restart,) = result["restarts"]
    assert (restart["attempt"], restart["resumed_from"], restart["verdict"], restart["replayed"],
            restart["omitted"], restart["lost_updates"]) == (1, "gX", "exact", 0, 0, 0)
    assert restart["expected_cursor"] == CURSOR == restart["resume_cursor"]
    assert "resumed_from_unknown" not in {f["code"] for f in restart["findings"]}
    (main,) = result["strata"]
    assert (main["consumed"], main["duplicates"], main["omissions"]) == (120, 0, 0)
    assert resumed_in_storage(run) == 0  # known now: nothing to look up


def test_without_the_manifest_the_restart_row_is_unverified_and_nothing_is_omitted(
        project, tmp_path, declare_location):
    declare_location(project, tmp_path, discover=False)
    run = resumed_run(project, "lost")
    analyze_run(run.pk)
    result = Analysis.objects.get(run=run).result
    assert result["generations"] == []
    (restart,) = result["restarts"]
    assert (restart["attempt"], restart["resumed_from"], restart["verdict"], restart["replayed"],
            restart["omitted"], restart["lost_updates"], restart["lost_seconds"]) == \
        (1, "gX", "unverified", 0, 0, 0, None)
    assert [f["code"] for f in restart["findings"]] == ["predecessor_unknown",
                                                        "resumed_from_unknown"]
    (main,) = result["strata"]
    assert (main["consumed"], main["duplicates"], main["omissions"]) == (120, 0, 0)
    # a miss is not looked up again on every analysis, only once the retry time passed
    write_gx(tmp_path, "other")  # <location>/gX names another run: not this one's
    uri = write_gx(tmp_path / "lost", "lost")
    assert resumed_in_storage(run) == 0
    cache.clear()  # RESUMED_LOOKUP_RETRY_S later
    assert resumed_in_storage(run) == 1
    gen = Generation.objects.get(run=run, generation_id="gX")
    assert (gen.discovered, gen.found_at) == (True, uri.rsplit("/", 1)[0])
