"""Dashboard fixtures: an owner and a teammate of ``project``, an outsider (member of
``other_project`` only), and ``known_run``: scenario s2 (docs/definitions.md#worked-example: the
restart resumes at 80,048 instead of 80,000, 48 positions omitted) plus a generation g1255 of the
resumed attempt that lacks shard rank7, with a stored analysis that is the recovery core's real
output for those events (``known_result``: ``analyze(RunInput.from_events(...)).to_dict()``),
never a hand-written dict. The tables are projected from the same events, as ingest would write
them."""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

T0 = datetime(2026, 11, 1, 0, 0, 5, tzinfo=UTC)          # s2's first event
COMMIT = datetime(2026, 11, 1, 0, 21, 1, tzinfo=UTC)     # g1250 committed
#: When the stored analysis was computed (a minute after s2's last event).
ANALYSED_AT = datetime(2026, 11, 1, 0, 23, 21, tzinfo=UTC)
PASSWORD = "correct horse battery"
SHARDS = [f"rank{r}" for r in range(8)]
COMPONENTS = ["model", "optimizer", "scheduler", "rng", "data_progress"]
#: g1255's object whose storage check fails (and the detail the verifier gave).
MISSING_URI = "file:///ckpt/g1255/rank3/model"


def _user(username, project=None, **extra):
    from django.contrib.auth import get_user_model

    from recoverydash.runs.models import Membership

    user = get_user_model().objects.create_user(username, password=PASSWORD, **extra)
    if project is not None:
        Membership.objects.create(project=project, user=user)
    return user


@pytest.fixture
def owner(project):
    return _user("olivia", project)


@pytest.fixture
def teammate(project):
    return _user("tariq", project)


@pytest.fixture
def outsider(other_project):
    return _user("oscar", other_project)


@pytest.fixture
def admin_user(db):
    return _user("root", None, is_superuser=True, is_staff=True)


def g1255_events() -> list:
    """Attempt 1 saves g1255 at update 1255 (cursor 80,048 + 5 x 64 = 80,368): rank7 never
    writes its shard, and rank3's model object is missing in storage."""
    def obj(shard, component):
        uri = f"file:///ckpt/g1255/{shard}/{component}"
        return {"uri": uri, "shard": shard, "component": component, "size": 4096,
                "sha256": hashlib.sha256(uri.encode()).hexdigest()}

    base = {"run_id": "s2-omission", "attempt": 1}
    written = SHARDS[:7]
    events = [dict(base, event_id="g1255-start", type="checkpoint_started",
                   time="2026-11-01T00:22:17Z", generation_id="g1255", update=1255,
                   required_shards=SHARDS, components=COMPONENTS)]
    events += [dict(base, event_id=f"g1255-{s}", type="shard_written",
                    time="2026-11-01T00:22:18Z", generation_id="g1255", shard=s, update=1255,
                    objects=[obj(s, c) for c in COMPONENTS]) for s in written]
    events.append(dict(base, event_id="g1255-commit", type="checkpoint_committed",
                       time="2026-11-01T00:22:19Z", manifest={
                           "schema_revision": 1, "generation_id": "g1255", "update": 1255,
                           "world_size": 8, "required_shards": SHARDS, "components": COMPONENTS,
                           "objects": [obj(s, c) for s in written for c in COMPONENTS],
                           "data_progress": {"cursor": [{"stratum": "main", "epoch": 0,
                                                         "position": 80_368}]},
                           "dataset_version": "ds-v1",
                           "committed_at": "2026-11-01T00:22:19+00:00"}))
    return events


def storage_checks(events) -> dict:
    """What the storage verifier finds for every manifest object: s2's files as the scenario
    loader wrote them, g1255's objects ok except ``MISSING_URI``."""
    out = {}
    for event in events:
        for o in (event.get("manifest") or {}).get("objects") or []:
            if o["uri"].startswith("file:///ckpt/g1255/"):
                out[o["uri"]] = "object_missing" if o["uri"] == MISSING_URI else "ok"
                continue
            path = Path(o["uri"][len("file://"):])
            data = path.read_bytes() if path.exists() else None
            out[o["uri"]] = ("object_missing" if data is None else "size_mismatch"
                             if len(data) != o["size"] else "digest_mismatch"
                             if hashlib.sha256(data).hexdigest() != o["sha256"] else "ok")
    return out


@pytest.fixture(scope="session")
def known_events(scenario_loader, tmp_path_factory):
    """``(events, checks)``: scenario s2's events followed by ``g1255_events``, and the storage
    checks of every manifest object."""
    events, _ = scenario_loader("s2_resume_at_read_cursor_omission",
                                str(tmp_path_factory.mktemp("s2")))
    events = list(events) + g1255_events()
    return events, storage_checks(events)


@pytest.fixture(scope="session")
def known_result(known_events) -> dict:
    """The recovery core's analysis of ``known_events`` at ``ANALYSED_AT``, as stored."""
    from recoverydash.recovery import RunInput, analyze

    events, checks = known_events
    return analyze(RunInput.from_events(events, checks), ANALYSED_AT.timestamp()).to_dict()


def _at(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


@pytest.fixture
def known_run(project, known_events, known_result):
    """The run's tables projected from ``known_events`` (attempts, generations with the core's
    statuses and reasons, shard reports, objects with their checks), audit windows around the
    restart, a firing restart_omission alert and the stored analysis ``known_result``."""
    from recoverydash.alerts.models import Alert
    from recoverydash.runs.models import (
        Analysis,
        Attempt,
        AuditWindow,
        CheckpointObject,
        Generation,
        Run,
        ShardReport,
    )

    events, checks = known_events
    now = datetime.now(UTC)
    run = Run.objects.create(project=project, run_id="s2-omission", first_event_at=T0,
                             last_event_at=now - timedelta(seconds=30),
                             last_received_at=now - timedelta(seconds=30), ingest_seq=7,
                             contract={"max_checkpoint_age_s": 3600})
    attempts: dict = {}
    for e in events:
        a = attempts.setdefault(e["attempt"], {"attempt": e["attempt"], "last_update": 0})
        a["last_event_at"] = max(a.get("last_event_at") or _at(e["time"]), _at(e["time"]))
        if e["type"] == "attempt_started":
            a.update(started_at=_at(e["time"]), world_size=e["world_size"],
                     dataset_version=e["dataset_version"],
                     global_batch_size=e.get("global_batch_size"),
                     resumed_from=e.get("resumed_from"))
        elif e["type"] == "attempt_ended":
            a.update(ended_at=_at(e["time"]), end_reason=e["reason"], end_update=e["update"],
                     fetched=e.get("fetched") or [])
        elif e["type"] == "update_committed" and e["update"] > a["last_update"]:
            a.update(last_update=e["update"], last_update_at=_at(e["time"]))
    for a in attempts.values():
        Attempt.objects.create(run=run, **a)
    status = {g["generation_id"]: g for g in known_result["generations"]}
    for started in (e for e in events if e["type"] == "checkpoint_started"):
        gid = started["generation_id"]
        commit = next(e for e in events if e["type"] == "checkpoint_committed"
                      and e["manifest"]["generation_id"] == gid)
        gen = Generation.objects.create(
            run=run, generation_id=gid, attempt=started["attempt"], update=started["update"],
            started_at=_at(started["time"]), required_shards=started["required_shards"],
            components=started["components"], committed_at=_at(commit["time"]),
            commit_reported_at=_at(commit["time"]), manifest=commit["manifest"],
            status=status[gid]["status"], reasons=status[gid]["reasons"],
            verified_at=_at(commit["time"]) + timedelta(seconds=2))
        for e in events:
            if e["type"] == "shard_written" and e["generation_id"] == gid:
                ShardReport.objects.create(generation=gen, shard=e["shard"], update=e["update"],
                                           reported_at=_at(e["time"]), object_list=e["objects"])
        for o in commit["manifest"]["objects"]:
            check = checks[o["uri"]]
            CheckpointObject.objects.create(
                generation=gen, uri=o["uri"], shard=o["shard"], component=o["component"],
                size=o["size"], sha256=o["sha256"], in_manifest=True, check_status=check,
                observed_size=o["size"] if check == "ok" else None,
                check_detail="no such file" if check == "object_missing" else "",
                checked_at=gen.verified_at)
    for attempt, update in ((0, 1249), (0, 1250), (1, 1251), (1, 1252)):
        for rank in range(2):
            for slot in range(2):
                base = (update - 1) * 64 + (48 if attempt == 1 else 0)
                AuditWindow.objects.create(run=run, attempt=attempt, update=update, rank=rank,
                                           accum_slot=slot, time=COMMIT,
                                           sample_ids=[f"s{base + slot * 16 + rank}",
                                                       f"s{base + slot * 16 + rank + 8}"])
    Analysis.objects.create(run=run, computed_at=now - timedelta(seconds=20), ingest_seq=7,
                            health=known_result["health"], result=known_result)
    Alert.objects.create(run=run, rule="restart_omission", subject="1",
                         dedup_key="s2-omission:restart_omission:1", severity="critical",
                         summary="Attempt 1 skipped 48 positions that were never trained on "
                                 "(contract allows 0).")
    return run


@pytest.fixture
def owner_client(client, owner):
    client.force_login(owner)
    return client


def without_definition_links(html: str) -> str:
    """A page's HTML without the "?" links to docs/definitions.md beside its figures, so that
    tests can read a sentence as people do."""
    return re.sub(r'<a class="def" [^>]*>\?</a>', "", html)


def analyse(run):
    """Analyse a run the way the workers do, synchronously: verify every generation's objects in
    storage (``storage.verification.verify_generation``), then
    ``alerts.evaluation.analyze_and_alert`` (the recovery core, the stored Analysis and generation
    statuses, the alert rules)."""
    from recoverydash.alerts.evaluation import analyze_and_alert
    from recoverydash.runs.models import Generation, Run
    from recoverydash.storage.verification import verify_generation

    for pk in Generation.objects.filter(run=run).values_list("pk", flat=True):
        verify_generation(pk)
    analyze_and_alert(run.pk)
    return Run.objects.get(pk=run.pk)


def post_scenario(client, token, loader, name, objects_dir):
    """Post a worked scenario's events through the real ingest API and analyse the run."""
    import json

    from recoverydash.runs.models import ApiToken, Run
    from recoverydash.storage.models import StorageLocation

    events, expect = loader(name, str(objects_dir))
    StorageLocation.objects.get_or_create(project=ApiToken.authenticate(token).project,
                                          url=objects_dir.resolve().as_uri())
    response = client.post("/api/v1/events", data=json.dumps({"events": events}),
                           content_type="application/json",
                           HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 202, response.content
    run = Run.objects.get(run_id=events[0]["run_id"])
    return analyse(run), expect


@pytest.fixture
def s2_run(client, full_token, scenario_loader, tmp_path, project):
    """Scenario s2 (the worked example, resume at 80,048: 48 positions omitted), ingested and
    analysed."""
    run, _ = post_scenario(client, full_token, scenario_loader,
                           "s2_resume_at_read_cursor_omission", tmp_path)
    return run


@pytest.fixture
def browser():
    """Headless Chromium. The test body runs inside Playwright's sync context, where Django's
    connection is another one than the session's (asgiref's Local is per context): it is closed
    here, else it stays open and the per-process test database cannot be dropped at the end
    ('is being accessed by other users': test databases were left behind)."""
    # Playwright's sync API runs an event loop in this thread; the ORM work is done before.
    import os

    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from django.db import connections
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium", args=[
            "--no-sandbox", "--disable-background-networking", "--disable-gpu"])
        try:
            yield b
        finally:
            b.close()
            connections.close_all()
