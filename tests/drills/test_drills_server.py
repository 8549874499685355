"""The server side of drills: ``attempt_started``'s ``drill`` mark and ``drill_result`` events
(docs/ingest-v1.md#drill_result) project into ``Run.drill_id`` and ``DrillResult``, the runs list
exposes ``drill_id``, and the Drills page shows the latest drill per trainer with links to the
drill runs. The SDK's ``result_event`` is what is posted, so the wire shape is the runner's."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("django")

from recoverydash.runs.models import DrillResult, Generation, Membership, Run  # noqa: E402
from recoverydash.sdk.drill import result_event  # noqa: E402

T0 = "2026-11-01T00:00:05Z"


def post(client, token, events):
    return client.generic("POST", "/api/v1/events", data=json.dumps({"events": events}),
                          content_type="application/json",
                          headers={"Authorization": f"Bearer {token}"})


def envelope(ev, run_id, attempt=1, event_id=None, time=T0):
    return {"event_id": event_id or f"{run_id}:{attempt}:{ev['type']}:{ev.get('point', '')}",
            "run_id": run_id, "attempt": attempt, "time": time, **ev}


REPORT = {"drill_id": "d1", "config_digest": "6463e25a02b832a7",
          "state_compare": "exact: sha256 of the parameters", "control": {"run_id": "d1-control"}}


def point(name, passed=True, **over):
    d = {"point": name, "run_id": f"d1-{name.replace('_', '-')}", "passed": passed,
         "expected": "u000000002-a0", "restored": "u000000002-a0",
         "server": {"verdict": "exact", "replayed": 0, "omitted": 0, "recomputed": 32},
         "first_divergence": None,
         "state": {"match": True, "first_mismatch": None, "updates_compared": 6},
         "cost": {"lost_updates": 2, "lost_seconds": 0.4, "restore_seconds": 0.2,
                  "fast_forward_seconds": 0.01, "crash_launch_seconds": 9.0}, "failures": []}
    d.update(over)
    return d


@pytest.mark.django_db
def test_it_marks_drill_runs_and_stores_each_crash_points_result(client, ingest_token,
                                                                 read_token):
    start = envelope({"type": "attempt_started", "world_size": 2, "dataset_version": "v",
                      "drill": {"drill_id": "d1", "role": "control"}}, "d1-control", attempt=0)
    ordinary = envelope({"type": "attempt_started", "world_size": 2, "dataset_version": "v"},
                        "prod-run", attempt=0)
    bad = point("before_commit", passed=False, first_divergence={
        "update": 3, "rank": 0, "index": 0, "control": ["main", 0, 32],
        "drill": ["main", 0, 48]}, state={"match": False, "first_mismatch": 3,
                                          "updates_compared": 0},
        server={"verdict": "omission", "replayed": 0, "omitted": 16, "recomputed": 16},
        failures=["the consumed sequence diverges from the control's"])
    r = post(client, ingest_token, [start, ordinary,
                                    envelope(result_event(REPORT, bad), "d1-before-commit")])
    assert r.status_code == 202, r.content
    assert {r: (d, b) for r, d, b in Run.objects.values_list("run_id", "drill_id", "is_drill")} \
        == {"d1-control": ("d1", True), "prod-run": ("", False), "d1-before-commit": ("d1", True)}
    row = DrillResult.objects.get()
    assert (row.run.run_id, row.drill_id, row.point, row.attempt, row.passed) == \
        ("d1-before-commit", "d1", "before_commit", 1, False)
    assert (row.verdict, row.replayed, row.omitted, row.recomputed) == ("omission", 0, 16, 16)
    assert row.first_divergence == {"update": 3, "rank": 0, "index": 0,
                                    "control": ["main", 0, 32], "drill": ["main", 0, 48]}
    assert row.state == {"match": False, "first_mismatch": 3, "updates_compared": 0,
                         "compare": "exact: sha256 of the parameters"}
    assert row.cost == {"lost_updates": 2, "lost_seconds": 0.4, "restore_seconds": 0.2,
                        "fast_forward_seconds": 0.01}
    assert (row.control_run_id, row.expected_generation) == ("d1-control", "u000000002-a0")
    # a later report of the same drill and point replaces it
    fixed = envelope(result_event(REPORT, point("before_commit")), "d1-before-commit",
                     event_id="again", time="2026-11-01T00:01:00Z")
    assert post(client, ingest_token, [fixed]).status_code == 202
    row = DrillResult.objects.get()
    assert row.passed is True and row.verdict == "exact" and row.first_divergence is None
    runs = client.get("/api/v1/runs", headers={"Authorization": f"Bearer {read_token}"}).json()
    assert {r["run_id"]: r["drill_id"] for r in runs} == {
        "d1-control": "d1", "prod-run": None, "d1-before-commit": "d1"}


@pytest.mark.django_db
def test_it_refuses_a_drill_result_naming_an_unknown_crash_point(client, ingest_token):
    ev = envelope(result_event(REPORT, point("before_commit")), "d1-x")
    ev["point"] = "sideways"
    r = post(client, ingest_token, [ev])
    assert r.status_code == 400
    text = json.dumps(r.json())
    assert "point" in text and "before_shards" in text, text
    assert not DrillResult.objects.exists()


@pytest.mark.django_db
def test_the_drills_page_shows_the_latest_drill_per_trainer_with_links(client, project,
                                                                      ingest_token):
    from django.contrib.auth.models import User

    user = User.objects.create_user("olivia", password="pw-long-enough-1")
    Membership.objects.create(project=project, user=user)
    old = dict(REPORT, drill_id="d0")
    events = [envelope({"type": "attempt_started", "world_size": 2, "dataset_version": "v",
                        "drill": {"drill_id": "d1", "role": "control"}}, "d1-control", 0)]
    events.append(envelope(result_event(old, point("before_commit", passed=False,
                                                   failures=["old"])),
                           "d0-before-commit", time="2026-10-01T00:00:00Z"))
    for name in ("after_commit", "before_shards"):
        events.append(envelope(result_event(REPORT, point(name)), f"d1-{name.replace('_', '-')}"))
    events.append(envelope(result_event(REPORT, point(
        "corrupt_after_commit", passed=False, restored="u000000004-a0",
        failures=["restored u000000004-a0, the rules say u000000002-a0"])),
        "d1-corrupt-after-commit"))
    assert post(client, ingest_token, events).status_code == 202
    client.force_login(user)
    page = client.get(f"/projects/{project.pk}/drills/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "drill <code>d1</code>" in html and "drill <code>d0</code>" not in html
    assert "1 earlier drill of this trainer" in html
    # crash points in protocol order, each linking its run's page
    runs = {r.run_id: f"/p/{r.project.name}/runs/{r.run_id}/"
            for r in Run.objects.select_related("project")}
    at = [html.index(f'href="{runs[f"d1-{p}"]}"') for p in
          ("before-shards", "after-commit", "corrupt-after-commit")]
    assert at == sorted(at)
    assert f'control run <a href="{runs["d1-control"]}">d1-control</a>' in html
    assert "✖ rules: <code>u000000002-a0</code>" in html
    assert "restored u000000004-a0, the rules say u000000002-a0" in html
    assert client.get("/drills/").status_code == 200
    assert 'href="/drills/"' in html  # the nav link
    assert client.get("/projects/999999/drills/").status_code == 404


@pytest.mark.django_db
def test_it_finds_a_generation_whose_manifest_is_in_storage_without_its_commit(
        client, project, ingest_token, tmp_path, declare_location):
    """A coordinator killed after writing the manifest, before checkpoint_committed reached the
    server (the drill's after_commit): before a restore plan, the pending generation is looked
    up beside its reported objects and its manifest ingested (the plan naming it end to end:
    tests/drills/test_drill_train_ddp.py, after_commit)."""
    from recoverydash.checkpoints import objects as storage
    from recoverydash.ingest.discovery import committed_in_storage

    declare_location(project, tmp_path)
    loc = tmp_path / "run-a"
    objs = {}
    for gen, update in (("g2", 2), ("g4", 4)):
        (loc / gen / "model").mkdir(parents=True)
        path = loc / gen / "model" / "rank0.pt"
        path.write_bytes(bytes([update]) * 64)
        digest, size = storage.sha256_file(str(path))
        objs[gen] = [{"uri": storage.file_uri(str(path)), "shard": "rank0", "component": "model",
                      "size": size, "sha256": digest, "update": update}]
    def manifest(gen, update):
        return {"schema_revision": 1, "generation_id": gen, "update": update, "world_size": 1,
                "required_shards": ["rank0"], "components": ["model"], "objects": objs[gen],
                "data_progress": {"cursor": []}, "dataset_version": "v",
                "committed_at": f"2026-11-01T00:00:0{update:d}Z",
                "required_components": ["model"], "run_id": "run-a", "attempt": 0}
    events = [envelope({"type": "attempt_started", "world_size": 1, "dataset_version": "v",
                        "contract": {"required_components": ["model"]}}, "run-a", 0,
                       event_id="s")]
    for gen, update in (("g2", 2), ("g4", 4)):
        events += [
            envelope({"type": "checkpoint_started", "generation_id": gen, "update": update,
                      "required_shards": ["rank0"], "components": ["model"]}, "run-a", 0,
                     event_id=f"{gen}s"),
            envelope({"type": "shard_written", "generation_id": gen, "shard": "rank0",
                      "update": update, "objects": objs[gen]}, "run-a", 0, event_id=f"{gen}w")]
    events.append(envelope({"type": "checkpoint_committed", "manifest": manifest("g2", 2)},
                           "run-a", 0, event_id="g2c"))
    assert post(client, ingest_token, events).status_code == 202
    storage.write_manifest_atomically(str(loc), manifest("g2", 2))
    storage.write_manifest_atomically(str(loc), manifest("g4", 4))  # no commit event for it
    assert committed_in_storage(Run.objects.get(run_id="run-a")) == 1
    g4 = Generation.objects.get(generation_id="g4")
    assert (g4.manifest["update"], g4.discovered) == (4, True)
    assert g4.found_at == storage.file_uri(str(loc / "g4"))
    assert committed_in_storage(Run.objects.get(run_id="run-a")) == 0  # found once
