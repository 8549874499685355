"""``restore_plan`` against the real server (pytest-django's live_server on the test database):
a generation committed but not verified yet (the worker is behind) is named from storage with
``server_undecided``, and the commit a killed attempt left in its spool reaches the server before
the next launch's question, so the plan names that generation.

Needs Django and a database: run without ``-p no:django``, e.g.
``DATABASE_URL=postgres://postgres@127.0.0.1:5432/test .venv/bin/python -m pytest
tests/sdk/test_restore_plan_live.py``."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("django")
if "pytest_django.plugin" not in sys.modules:  # run with -p no:django: nothing to serve
    pytest.skip("needs the pytest-django plugin (run without -p no:django)",
                allow_module_level=True)

from recoverydash.sdk.checkpoint import restore_plan
from recoverydash.sdk.client import Client
from recoverydash.sdk.ledger import CountingRecorder
from recoverydash.sdk.spool import run_folder, unsent_events

from .conftest import REPO
from .test_live_ingest import SwitchableProxy, stored
from .test_restore_selection import make_generation


def raw_plan(url, token, run_id):
    """``(status, body)`` of ``GET /api/v1/runs/{run_id}/restore-plan``."""
    import json
    import urllib.error
    import urllib.request

    req = urllib.request.Request(f"{url}/api/v1/runs/{run_id}/restore-plan",
                                 headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture
def worker_behind(settings, tmp_path):
    """No task runs: the Celery app publishes to a filesystem broker under ``tmp_path`` that no
    worker reads (a worker that is behind), so a committed generation stays unverified."""
    from workers.broker import install
    from workers.celery import app

    settings.CELERY_TASK_ALWAYS_EAGER = False
    settings.RECOVERYDASH_RATE_LIMIT_PER_SECOND = 0
    settings.RECOVERYDASH_REDIS_URL = ""
    folder = tmp_path / "broker"
    for sub in ("queue", "processed", "control"):
        (folder / sub).mkdir(parents=True)
    install()
    saved = (app.conf.broker_url, app.conf.broker_transport_options)
    app.conf.broker_url = "filesystem://"
    app.conf.broker_transport_options = {
        "data_folder_in": str(folder / "queue"), "data_folder_out": str(folder / "queue"),
        "processed_folder": str(folder / "processed"),
        "control_folder": str(folder / "control"), "store_processed": False}
    app._pool = None
    app.amqp._producer_pool = None
    yield folder / "queue"
    app.conf.broker_url, app.conf.broker_transport_options = saved
    app._pool = None
    app.amqp._producer_pool = None


@pytest.mark.django_db(transaction=True)
def test_a_generation_committed_but_not_verified_is_named_from_storage(
        live_server, full_token, tmp_path, project, declare_location, worker_behind):
    run, loc = "live-undecided", str(tmp_path / "ckpt")
    declare_location(project, loc)
    c = Client(live_server.url, full_token, run, attempt=0, rank=0,
               spool_dir=str(tmp_path / "spool"), sync=True, handle_sigterm=False)
    rec = CountingRecorder(c, rank=0, world_size=2, dataset_length=1000, shuffle=False,
                           dataset_version="ds-1", heartbeat_interval=0)
    rec.start(global_batch_size=8)
    for update in range(1, 8):
        rec.consumed(8)
        rec.commit(update)
    manifest = make_generation(loc, "g7", 7, run_id=run)
    c.checkpoint_committed(manifest)
    c.close(1)
    assert sorted(stored(run)) == sorted([f"{run}:0:0:start", f"{run}:0:0:g:g7:committed"]
                                         + [f"{run}:0:0:u{u}" for u in range(1, 8)])
    assert any(worker_behind.iterdir())  # the verification waits in the broker

    status, body = raw_plan(live_server.url, full_token, run)
    assert status == 409
    assert [(g["generation_id"], g["status"]) for g in body["rejected"]] == [("g7", "committed")]

    plan = restore_plan(live_server.url, full_token, run, location=loc, world_size=2,
                        dataset_version="ds-1")
    assert (plan["source"], plan["generation_id"], plan["update"]) == ("storage", "g7", 7)
    assert plan["warnings"] == [{"code": "server_undecided", "detail":
                                 "the server found no restorable generation but has not decided "
                                 "g7 (committed); storage decides"}]
    assert plan["cursor"] == [{"stratum": "main", "epoch": 0, "position": 56}]
    assert (plan["logger_rewind_update"], plan["attempt"]) == (7, 0)


KILLED = """
import hashlib, os, sys, time
from recoverydash.sdk import Client, CountingRecorder, now_rfc3339, write_manifest_atomically
url, token, spool, loc, run = sys.argv[1:6]
c = Client(url, token, run, attempt=0, rank=0, spool_dir=spool, flush_interval=0.05,
           backoff_base=0.05, backoff_cap=0.3, request_timeout=10, handle_sigterm=False)
rec = CountingRecorder(c, rank=0, world_size=1, dataset_length=1000, shuffle=False,
                       dataset_version="ds-1", heartbeat_interval=0)
rec.start(global_batch_size=4)


def save(gen, update):
    objects = []
    for comp in ["model", "optimizer", "scheduler", "rng", "data_progress"]:
        path = os.path.join(loc, gen, comp)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = (gen + comp).encode() * 100
        open(path, "wb").write(data)
        objects.append({"uri": "file://" + path, "shard": "rank0", "component": comp,
                        "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                        "update": update})
    manifest = {"schema_revision": 1, "generation_id": gen, "update": update, "world_size": 1,
                "required_shards": ["rank0"], "components": [o["component"] for o in objects],
                "objects": objects, "data_progress": {"cursor": rec.cursor()},
                "dataset_version": "ds-1", "committed_at": now_rfc3339(),
                "run_id": run, "attempt": 0}
    write_manifest_atomically(loc, manifest)
    c.checkpoint_committed(manifest)


for update in range(1, 5):
    rec.consumed(4)
    rec.commit(update)
save("g4", 4)
print("FLUSHED" if c.flush(10) else "SPOOLED", flush=True)
sys.stdin.readline()  # the test takes the server down
for update in range(5, 9):
    rec.consumed(4)
    rec.commit(update)
save("g8", 8)
# the sender spools what it could not send; on a loaded machine that takes a while
deadline = time.monotonic() + 60
while c.counters().get("spool_events", 0) < 5 and time.monotonic() < deadline:
    c.flush(0.5)
print("FLUSHED" if c.flush(0.5) else "SPOOLED", c.counters()["spool_events"], flush=True)
time.sleep(600)  # killed here, the commit of g8 in the spool
"""


@pytest.mark.django_db(transaction=True)
def test_the_commit_a_killed_attempt_spooled_is_named_by_the_next_launchs_plan(
        live_server, full_token, tmp_path, trainer_env):
    run, spool, loc = "live-killed-commit", str(tmp_path / "spool"), str(tmp_path / "ckpt")
    proxy = SwitchableProxy(live_server.url)
    proxy.up()
    first = subprocess.Popen([sys.executable, "-c", textwrap.dedent(KILLED), proxy.url,
                              full_token, spool, loc, run], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=trainer_env, cwd=REPO)
    try:
        assert first.stdout.readline().split() == ["FLUSHED"]
        proxy.down()
        first.stdin.write("go\n")
        first.stdin.flush()
        # 4 updates + the commit of g8, with the server down
        assert first.stdout.readline().split() == ["SPOOLED", "5"]
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        proxy.down()
    # what the server knows before the next launch: g4 (g8's commit never reached it)
    assert raw_plan(live_server.url, full_token, run)[1]["generation_id"] == "g4"
    assert unsent_events(run_folder(spool, run)) == 5

    proxy.up()
    try:
        plan = restore_plan(proxy.url, full_token, run, location=loc, world_size=1,
                            dataset_version="ds-1", spool_dir=spool)
    finally:
        proxy.down()
    assert (plan["source"], plan["generation_id"], plan["update"]) == ("server", "g8", 8)
    assert plan["warnings"] == [] and plan["attempt"] == 0
    assert f"{run}:0:0:g:g8:committed" in stored(run)
    assert unsent_events(run_folder(spool, run)) == 0
    assert all(s == 202 for s in proxy.statuses)


@pytest.mark.django_db(transaction=True)
def test_a_newer_generation_not_verified_yet_is_listed_beside_the_plan(
        live_server, full_token, tmp_path, project, declare_location, worker_behind):
    """g100 committed and verified at update 100, g200 committed at update 200 and not verified
    (the worker is behind): the 200 names g100 and lists g200 in ``newer_undecided``; the SDK
    keeps g100 and warns. Once g200 is verified the plan names it and lists nothing."""
    from recoverydash.runs.models import Generation
    from recoverydash.storage.verification import verify_generation

    run, loc = "live-newer-undecided", str(tmp_path / "ckpt")
    declare_location(project, loc)
    c = Client(live_server.url, full_token, run, attempt=0, rank=0,
               spool_dir=str(tmp_path / "spool"), handle_sigterm=False)
    rec = CountingRecorder(c, rank=0, world_size=1, dataset_length=10_000, shuffle=False,
                           dataset_version="ds-1", heartbeat_interval=0)
    rec.start(global_batch_size=8)

    def updates(first, last):
        for update in range(first, last + 1):
            rec.consumed(8)
            rec.commit(update)

    def verified(gen):  # the worker's part, run here, once the events are in
        assert c.flush(30)
        verify_generation(Generation.objects.get(run__run_id=run, generation_id=gen).pk)

    updates(1, 100)
    c.checkpoint_committed(make_generation(loc, "g100", 100, world=1, run_id=run))
    verified("g100")
    updates(101, 200)
    c.checkpoint_committed(make_generation(loc, "g200", 200, world=1, run_id=run))
    assert c.flush(30)
    c.close(1)

    status, body = raw_plan(live_server.url, full_token, run)
    assert (status, body.get("generation_id"), body.get("update")) == (200, "g100", 100), body
    assert body["newer_undecided"] == [{"generation_id": "g200", "update": 200,
                                        "status": "committed"}]
    plan = restore_plan(live_server.url, full_token, run, location=loc, world_size=1,
                        dataset_version="ds-1", spool_dir=False)
    assert (plan["source"], plan["generation_id"], plan["update"]) == ("server", "g100", 100)
    assert plan["newer_undecided"] == body["newer_undecided"]
    assert plan["warnings"] == [{"code": "newer_undecided", "detail":
                                 "the server names g100 (update 100) while newer generations "
                                 "are not decided yet: g200 (update 200, committed); resuming "
                                 "now redoes the updates after 100 should one prove "
                                 "restorable"}]

    verified("g200")
    status, body = raw_plan(live_server.url, full_token, run)
    assert (status, body["generation_id"], body["update"], body["newer_undecided"]) == (
        200, "g200", 200, [])
    plan = restore_plan(live_server.url, full_token, run, location=loc, world_size=1,
                        dataset_version="ds-1", spool_dir=False)
    assert (plan["source"], plan["generation_id"], plan["newer_undecided"], plan["warnings"]) \
        == ("server", "g200", [], [])
    assert plan["cursor"] == [{"stratum": "main", "epoch": 0, "position": 1600}]


@pytest.mark.django_db(transaction=True)
def test_a_first_launch_asks_the_real_server_and_is_told_fresh_start(live_server, full_token,
                                                                     tmp_path):
    """The server has never heard of the run (404 ``not_found``): a fresh start without a
    warning, also with the base URL given with ``/api/v1`` at its end."""
    empty = tmp_path / "ckpt"
    empty.mkdir()
    status, body = raw_plan(live_server.url, full_token, "never-seen")
    assert (status, body["error"]) == (404, "not_found")
    for url in (live_server.url, live_server.url + "/api/v1/"):
        plan = restore_plan(url, full_token, "never-seen", location=str(empty),
                            spool_dir=str(tmp_path / "spool"))
        assert (plan["source"], plan["generation_id"], plan["warnings"]) == \
            ("storage", None, [])
