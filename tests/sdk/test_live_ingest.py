"""The SDK against the real Django ingest app (pytest-django's live_server), through a switchable
proxy that plays "server down": every event is stored exactly once.

Needs Django and a database: run without ``-p no:django``, e.g.
``DATABASE_URL=postgres://postgres@127.0.0.1:5432/test .venv/bin/python -m pytest
tests/sdk/test_live_ingest.py``."""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

import pytest
from django.db import connection  # noqa: F401 - read by the skipif condition

pytest.importorskip("django")
if "pytest_django.plugin" not in sys.modules:  # run with -p no:django: nothing to serve
    pytest.skip("needs the pytest-django plugin (run without -p no:django)",
                allow_module_level=True)

from recoverydash.sdk.client import Client
from recoverydash.sdk.ledger import CountingRecorder

from .conftest import REPO, free_port


class SwitchableProxy:
    """Forwards POSTs (and GETs: the restore plan) to the live server while up; while down
    nothing listens on its port."""

    def __init__(self, target: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        t = urlparse(target)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                self.do_POST("GET")

            def do_POST(self, method="POST"):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                conn = http.client.HTTPConnection(t.hostname, t.port, timeout=30)
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("host", "connection")}
                conn.request(method, self.path, body=body if method == "POST" else None,
                             headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                if method == "POST":
                    proxy.statuses.append(resp.status)
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.handler = Handler
        self.statuses: list[int] = []
        self.server = None

    def up(self):
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), self.handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def down(self):
        if self.server:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


@pytest.fixture
def proxy(live_server, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.RECOVERYDASH_RATE_LIMIT_PER_SECOND = 0
    settings.RECOVERYDASH_REDIS_URL = ""
    p = SwitchableProxy(live_server.url)
    yield p
    p.down()


def stored(run_id):
    from recoverydash.runs.models import Event

    return list(Event.objects.filter(run__run_id=run_id).values_list("event_id", flat=True))


def recovery(live_server, token, run_id):
    import json
    import urllib.request

    req = urllib.request.Request(f"{live_server.url}/api/v1/runs/{run_id}/recovery",
                                 headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif("connection.vendor == 'sqlite'", reason=(
    "two ranks post at once, and Django's live server shares its one in-memory SQLite "
    "connection across its request threads: their statements interleave on that connection "
    "('SQL statements in progress', 'database table is locked'), which no deployment does "
    "(a file database, a connection per thread); PostgreSQL runs this test"))
def test_server_down_for_the_first_half_then_up_every_event_arrives_once(
        proxy, live_server, full_token, tmp_path):
    spool = str(tmp_path / "spool")
    world, n = 2, 64
    clients = [Client(proxy.url, full_token, "live-half", attempt=0, rank=r, spool_dir=spool,
                      flush_interval=0.05, backoff_base=0.05, backoff_cap=0.3,
                      request_timeout=10) for r in range(world)]
    recs = [CountingRecorder(c, rank=r, world_size=world, dataset_length=n, seed=1,
                           dataset_version="ds-1", heartbeat_interval=0)
            for r, c in enumerate(clients)]
    for rec in recs:
        rec.start(global_batch_size=2 * 2 * world, micro_batch_size=2, grad_accum_steps=2)
    for update in range(1, 17):  # 16 updates x 8 positions = 2 epochs of 64
        if update == 9:
            for c in clients:
                assert c.flush(3) is False  # the first half waits in the spool
            assert stored("live-half") == []
            proxy.up()
        for rec in recs:
            if update == 9:
                rec.set_epoch(1)
            rec.consumed(2)
            rec.consumed(2)
            rec.commit(update)
    for rec in recs:
        rec.end("completed")
    for c in clients:
        assert c.flush(20), c.counters()
        c.close(1)
    ids = stored("live-half")
    expected = {f"live-half:0:{r}:{s}" for r in range(world)
                for s in ["start", "end"] + [f"u{u}" for u in range(1, 17)]}
    assert sorted(ids) == sorted(expected)  # each once, none lost
    assert sum(c.counters()["spooled"] for c in clients) >= 2 * 9
    report = recovery(live_server, full_token, "live-half")
    (main,) = report["strata"]
    assert (main["duplicates"], main["omissions"], main["consumed"]) == (0, 0, 128)


TRAINER = """
import hashlib, os, sys, time
from recoverydash.sdk import (Client, CountingRecorder, now_rfc3339, resumed_from,
                              select_restorable, write_manifest_atomically)
url, token, spool, loc, attempt, first, last = sys.argv[1:8]
attempt, first, last = int(attempt), int(first), int(last)
c = Client(url, token, "live-kill", attempt=attempt, rank=0, spool_dir=spool,
           flush_interval=0.05, backoff_base=0.05, backoff_cap=0.3, request_timeout=10)
rec = CountingRecorder(c, rank=0, world_size=1, dataset_length=1000, shuffle=False,
                     dataset_version="ds-1", heartbeat_interval=0)
sel = select_restorable(loc) if attempt else None
if sel is not None:
    rec.restore(sel.cursor, sel.update)
rec.start(resumed_from=resumed_from(sel), global_batch_size=4)
for update in range(first, last + 1):
    rec.consumed(4)
    rec.commit(update)
if attempt == 0:  # a checkpoint at the last update: one small object per component
    objects = []
    for comp in ["model", "optimizer", "scheduler", "rng", "data_progress"]:
        path = os.path.join(loc, "g10", comp)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = comp.encode() * 100
        open(path, "wb").write(data)
        objects.append({"uri": "file://" + path, "shard": "rank0", "component": comp,
                        "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                        "update": last})
    manifest = {"schema_revision": 1, "generation_id": "g10", "update": last, "world_size": 1,
                "required_shards": ["rank0"], "components": [o["component"] for o in objects],
                "objects": objects, "data_progress": {"cursor": rec.cursor()},
                "dataset_version": "ds-1", "committed_at": now_rfc3339(),
                "run_id": "live-kill", "attempt": 0}
    write_manifest_atomically(loc, manifest)
    c.checkpoint_committed(manifest)
ok = c.flush(5)
print("FLUSHED" if ok else "SPOOLED", c.counters()["spool_events"], flush=True)
if attempt == 0:
    time.sleep(600)  # killed here, its events in the spool
"""


@pytest.mark.django_db(transaction=True)
def test_a_trainer_killed_with_a_full_spool_delivers_the_rest_when_restarted(
        proxy, live_server, full_token, tmp_path):
    spool, loc = str(tmp_path / "spool"), str(tmp_path / "ckpt")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    code = textwrap.dedent(TRAINER)
    first = subprocess.Popen([sys.executable, "-c", code, proxy.url, full_token, spool, loc,
                              "0", "1", "10"], stdout=subprocess.PIPE, text=True, env=env)
    line = first.stdout.readline()
    # attempt_started + 10 updates + checkpoint_committed, with the server down
    assert line.split() == ["SPOOLED", "12"]
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert stored("live-kill") == []
    proxy.up()
    second = subprocess.run([sys.executable, "-c", code, proxy.url, full_token, spool, loc,
                             "1", "11", "20"], capture_output=True, text=True, env=env, timeout=60,
                            check=False)
    assert second.returncode == 0, second.stderr
    assert second.stdout.split() == ["FLUSHED", "0"]
    ids = stored("live-kill")
    expected = {"live-kill:0:0:start", "live-kill:1:0:start", "live-kill:0:0:g:g10:committed"} \
        | {f"live-kill:0:0:u{u}" for u in range(1, 11)} \
        | {f"live-kill:1:0:u{u}" for u in range(11, 21)}
    assert sorted(ids) == sorted(expected)
    assert not [f for f in os.listdir(os.path.join(spool, "live-kill")) if f.endswith(".batch")]
    assert all(s == 202 for s in proxy.statuses)
    report = recovery(live_server, full_token, "live-kill")
    (main,) = report["strata"]
    assert (main["duplicates"], main["omissions"], main["consumed"]) == (0, 0, 80)
    (restart,) = report["restarts"]
    assert (restart["resumed_from"], restart["verdict"]) == ("g10", "exact")


SIGTERMED = """
import sys, time
from recoverydash.sdk import Client, CountingRecorder
url, token, spool = sys.argv[1:4]
c = Client(url, token, "live-term", attempt=0, rank=0, spool_dir=spool, flush_interval=60.0,
           max_flush_interval=60.0, batch_max_events=5000, write_ahead_s=0, handle_sigterm=True)
rec = CountingRecorder(c, rank=0, world_size=1, dataset_length=1000, shuffle=False,
                       dataset_version="ds-1", heartbeat_interval=0)
rec.start(global_batch_size=4)
c.flush(10)   # attempt_started is on the server; the updates below stay in memory
for update in range(1, 41):
    rec.consumed(4)
    rec.commit(update)
print("ready", c.counters()["pending"], flush=True)
time.sleep(600)   # ended here by SIGTERM, as torchrun ends the other ranks
"""


@pytest.mark.django_db(transaction=True)
def test_a_rank_ended_by_sigterm_has_its_queued_updates_stored_by_the_next_attempt(
        proxy, live_server, full_token, tmp_path):
    """Against the real ingest app: 40 update_committed events queued (a 60 s flush interval),
    the process ended by SIGTERM; it dies of SIGTERM, and the next attempt's client sends the 40
    from the spool: stored under attempt 0, each once."""
    spool = str(tmp_path / "spool")
    proxy.up()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("RECOVERYDASH_HANDLE_SIGTERM", None)
    first = subprocess.Popen([sys.executable, "-c", textwrap.dedent(SIGTERMED), proxy.url,
                              full_token, spool], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert first.stdout.readline().split() == ["ready", "40"]
        assert stored("live-term") == ["live-term:0:0:start"]
        first.send_signal(signal.SIGTERM)
        assert first.wait(30) == -signal.SIGTERM
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    later = Client(proxy.url, full_token, "live-term", attempt=1, rank=0, spool_dir=spool,
                   flush_interval=0.05, handle_sigterm=False)
    try:
        assert later.flush(30), later.counters()
    finally:
        later.close(1)
    assert sorted(stored("live-term")) == sorted(
        ["live-term:0:0:start"] + [f"live-term:0:0:u{u}" for u in range(1, 41)])
    assert all(s == 202 for s in proxy.statuses)
    report = recovery(live_server, full_token, "live-term")
    (main,) = report["strata"]
    assert (main["duplicates"], main["omissions"], main["consumed"]) == (0, 0, 160)
