"""The sender against a local HTTP server: batching, gzip, retries, spool, fork, atexit, and the
promise that nothing raises into or blocks the caller."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from recoverydash.sdk.client import Client
from recoverydash.sdk.delivery import batch_body

from .conftest import REPO, wait_for

_made: list[Client] = []


@pytest.fixture(autouse=True)
def _close_clients():
    yield
    while _made:
        _made.pop().close(0.2)  # not left for the interpreter's atexit


def make(ingest, spool, **kw):
    kw.setdefault("flush_interval", 0.05)
    kw.setdefault("backoff_base", 0.05)
    kw.setdefault("backoff_cap", 0.2)
    c = Client(ingest.url, "tok-1", kw.pop("run_id", "run-a"), attempt=kw.pop("attempt", 0),
               rank=kw.pop("rank", 0), spool_dir=spool, **kw)
    _made.append(c)
    return c


def run_py(code: str, timeout: float = 60.0, **env):
    """Run a Python snippet in a NEW process with the repository on the path."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **{k: str(v) for k, v in env.items()}}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, env=full_env, check=False)


def test_it_batches_gzips_and_authenticates(ingest, spool):
    c = make(ingest, spool, batch_max_events=10, flush_interval=5.0)
    for u in range(1, 26):
        assert c.update_committed(u, [{"stratum": "main", "epoch": 0, "ranges": [[u, u + 1]]}])
    assert c.flush(5)
    assert [len(r["events"]) for r in ingest.requests] == [10, 10, 5]
    r = ingest.requests[0]
    assert r["path"] == "/api/v1/events"
    assert r["headers"]["Content-Encoding"] == "gzip"
    assert r["headers"]["Authorization"] == "Bearer tok-1"
    assert r["headers"]["Content-Type"] == "application/json"
    assert sorted(ingest.stored) == sorted(f"run-a:0:0:u{u}" for u in range(1, 26))
    ev = ingest.stored["run-a:0:0:u1"]
    assert ev["type"] == "update_committed" and ev["rank"] == 0 and ev["attempt"] == 0
    assert ev["time"].endswith("+00:00")  # RFC 3339 with offset
    assert c.counters()["sent"] == 25 and c.counters()["pending"] == 0


def test_it_sends_a_batch_when_its_time_has_come_without_a_flush(ingest, spool):
    c = make(ingest, spool, flush_interval=0.2)
    c.heartbeat(0)
    assert wait_for(lambda: len(ingest.stored) == 1, timeout=3)


def test_it_splits_batches_by_bytes(ingest, spool):
    c = make(ingest, spool, batch_max_bytes=2000, flush_interval=5.0)
    for i in range(10):
        c.audit_window(1, i, [f"sample-{i}-{j:04d}" for j in range(40)])
    assert c.flush(5)
    assert len(ingest.requests) >= 3 and len(ingest.stored) == 10


def test_it_retries_after_a_500(ingest, spool):
    ingest.script = [(500, {}), (503, {})]
    c = make(ingest, spool)
    c.update_committed(1, [])
    assert wait_for(lambda: len(ingest.stored) == 1, timeout=5)
    assert len(ingest.requests) == 3 and ingest.deliveries == {"run-a:0:0:u1": 1}
    assert c.flush(5) and c.counters()["sent"] == 1


def test_it_pauses_for_retry_after_on_a_429(ingest, spool):
    ingest.script = [(429, {"Retry-After": "1"})]
    c = make(ingest, spool)
    c.update_committed(1, [])
    assert wait_for(lambda: len(ingest.requests) == 1, timeout=3)
    c.update_committed(2, [])  # arrives during the pause: must wait too
    assert wait_for(lambda: len(ingest.stored) == 2, timeout=5)
    first, *rest = ingest.requests
    assert all(r["t"] - first["t"] >= 0.9 for r in rest)  # nothing sent during the pause
    assert sorted(ingest.stored) == ["run-a:0:0:u1", "run-a:0:0:u2"]


def test_it_never_retries_a_400_and_counts_it(ingest, spool, caplog):
    ingest.script = [(400, {}), (400, {})]
    c = make(ingest, spool, sync=True)
    c.update_committed(1, [])
    c.update_committed(2, [])
    c.update_committed(3, [])
    assert len(ingest.requests) == 3  # one request per event, none repeated
    assert sorted(ingest.stored) == ["run-a:0:0:u3"]
    assert c.counters()["failed"] == 2
    assert sum("400" in r.message for r in caplog.records) == 1  # logged once


def test_it_splits_a_batch_the_server_refuses_as_a_conflict(ingest, spool):
    ingest.script = [(409, {}), (202, {}), (409, {})]
    c = make(ingest, spool, flush_interval=5.0)
    for u in range(1, 5):
        c.update_committed(u, [])
    assert c.flush(5)
    # 4 -> 409; [1,2] -> 202; [3,4] -> 409; [3] and [4] -> 202
    assert sorted(ingest.stored) == [f"run-a:0:0:u{u}" for u in range(1, 5)]
    assert c.counters()["failed"] == 0


def test_it_spools_when_the_server_is_down_and_a_new_process_sends_the_rest(ingest, spool):
    ingest.stop()
    c = make(ingest, spool, flush_interval=5.0, request_timeout=1.0)
    for u in range(1, 21):
        c.update_committed(u, [{"stratum": "main", "epoch": 0, "ranges": [[u, u + 1]]}])
    assert c.flush(3) is False  # spooled, not delivered
    counters = c.counters()
    assert counters["spooled"] == 20 and counters["spool_events"] == 20
    assert counters["pending"] == 0 and counters["dropped"] == 0
    c.close(1)
    ingest.restart()
    out = run_py(f"""
        from recoverydash.sdk.client import Client
        c = Client({ingest.url!r}, "tok-1", "run-a", attempt=1, rank=0, spool_dir={spool!r})
        assert c.flush(10), c.counters()
        print(c.counters()["sent"])
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "20"
    assert sorted(ingest.stored) == sorted(f"run-a:0:0:u{u}" for u in range(1, 21))
    assert set(ingest.deliveries.values()) == {1}


def test_a_full_queue_drops_and_counts_without_blocking(ingest, spool):
    ingest.gate = threading.Event()  # the server answers nothing until the gate opens
    try:
        c = make(ingest, spool, max_queue=5, batch_max_events=1)
        results = [c.heartbeat(0) for _ in range(200)]
        # all 200 calls returned while the server had answered no request: none waited on it
        assert ingest.requests == []
    finally:
        ingest.gate.set()
    assert results.count(False) >= 150
    assert c.counters()["dropped"] == results.count(False)
    assert c.counters()["queued"] == 200


def test_the_sender_thread_is_restarted_after_fork(ingest, spool):
    c = make(ingest, spool)
    c.heartbeat(1)
    assert c.flush(5)
    parent_thread = c._worker.thread
    pid = os.fork()
    if pid == 0:  # child: the parent's thread does not exist here
        code = 1
        try:
            c.update_committed(99, [])
            if c.flush(5) and c._worker.thread is not parent_thread and \
                    c._worker.thread.is_alive():
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert "run-a:0:0:u99" in ingest.stored
    c.heartbeat(2)  # the parent still sends
    assert c.flush(5)


def test_atexit_flush_keeps_its_deadline_and_says_what_is_pending(ingest, spool):
    ingest.delay = 10  # the server hangs
    t0 = time.monotonic()
    out = run_py(f"""
        import logging
        logging.basicConfig(level=logging.WARNING)
        from recoverydash.sdk.client import Client
        c = Client({ingest.url!r}, "tok-1", "run-x", attempt=0, rank=0, spool_dir={spool!r},
                   atexit_deadline=0.5, flush_interval=0.01)
        for u in range(1, 4):
            c.update_committed(u, [])
        import time; time.sleep(0.3)   # the sender is now stuck in its request
        for u in range(4, 7):
            c.update_committed(u, [])
    """)
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - t0 < 8
    # the batch in flight was written back, the rest went to the spool: the next process sends it
    assert "the 3 events in flight were written back to the spool" in out.stderr
    assert "6 events wait in the spool" in out.stderr


def test_atexit_spools_what_it_cannot_send_to_a_dead_server(ingest, spool):
    ingest.stop()
    out = run_py(f"""
        from recoverydash.sdk.client import Client
        c = Client({ingest.url!r}, "t", "run-y", attempt=0, rank=0, spool_dir={spool!r},
                   atexit_deadline=1.0, flush_interval=30)
        for u in range(1, 6):
            c.update_committed(u, [])
    """)
    assert out.returncode == 0, out.stderr
    folder = os.path.join(spool, "run-y")
    assert sum(int(n.split("-n")[1].split(".")[0]) for n in os.listdir(folder)) == 5


def test_public_methods_never_raise(spool):
    c = Client("http://[::1", "t", "r", attempt=0, rank=0, spool_dir=spool, sync=True)
    assert c.emit({"type": "heartbeat", "update": object()}) in (True, False)
    assert c.update_committed(1, [{"bad": object()}]) in (True, False)
    assert c.flush(0.1) in (True, False)
    assert isinstance(c.counters(), dict)
    assert c.close(0.1) in (True, False)
    off = Client(None, None, "r")
    assert off.heartbeat(1) is False and off.flush(0.1) and off.counters()["dropped"] == 1


@pytest.mark.parametrize("spool_dir", [False, "disk"])
def test_sync_mode_delivers_in_the_callers_thread(ingest, spool, spool_dir):
    c = make(ingest, spool if spool_dir == "disk" else False, sync=True)
    c.attempt_started(world_size=4, dataset_version="ds-1")
    assert ingest.stored["run-a:0:0:start"]["resumed_from"] is None
    ingest.script = [(503, {})]
    c.update_committed(1, [])
    assert "run-a:0:0:u1" not in ingest.stored
    assert c.flush(3) and "run-a:0:0:u1" in ingest.stored


def test_an_idle_sender_does_not_list_the_spool_folder_each_cycle(ingest, spool, monkeypatch):
    c = make(ingest, spool, flush_interval=0.02)
    c.heartbeat(0)
    assert c.flush(5)
    listed = []
    real = os.listdir
    monkeypatch.setattr(os, "listdir", lambda p: listed.append(p) or real(p))
    time.sleep(0.5)  # ~25 sender cycles with an empty spool
    assert len(listed) <= 1
    # a batch another process left in the spool is still sent by a flush (it lists the folder)
    folder = os.path.join(spool, "run-a")
    event = (b'{"type":"heartbeat","update":1,"run_id":"run-a","attempt":0,"rank":0,'
             b'"time":"2026-11-01T00:00:00.000+00:00","event_id":"run-a:0:0:other"}')
    body = batch_body([event])
    with open(os.path.join(folder, f"{time.time_ns():020d}-999999-00000000-n1.batch"), "wb") as f:
        f.write(body)
    assert c.flush(5)
    assert "run-a:0:0:other" in ingest.stored


def test_a_heartbeat_reports_dropped_events_without_listing_the_spool(ingest, spool, monkeypatch):
    c = make(ingest, spool, max_queue=1, flush_interval=5.0)
    c.heartbeat(0)
    c.heartbeat(1)  # dropped: the queue holds one event
    monkeypatch.setattr(c, "counters", lambda: pytest.fail("counters() on the hot path"))
    c._worker._buf.clear()
    assert c.heartbeat(2)
    monkeypatch.undo()
    assert c.flush(5)
    hb = [e for e in ingest.stored.values() if e["type"] == "heartbeat"]
    assert [e.get("sdk_dropped") for e in hb] == [1]


def test_the_trainers_seeded_global_random_is_never_drawn_from(ingest, spool):
    """The sender's jitter and back-off draw from the SDK's own generator: a seeded trainer's
    ``random`` sequence is the same with a client sending beside it (a draw at the sender's
    times made seeded runs differ from one launch to the next)."""
    import random

    random.seed(1234)
    want = [random.random() for _ in range(5)]
    random.seed(1234)
    c = make(ingest, spool, flush_interval=0.01)
    for u in range(1, 30):
        c.update_committed(u, [{"stratum": "main", "epoch": 0, "ranges": [[u, u + 1]]}])
        time.sleep(0.005)
    assert c.flush(5)
    ingest.stop()  # a refused send: the back-off's draw too
    c.heartbeat(30)
    c.flush(0.5)
    assert [random.random() for _ in range(5)] == want
