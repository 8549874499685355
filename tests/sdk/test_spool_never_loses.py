"""The SDK never loses what it was given: a poison event in the spool is isolated and set aside
while the rest is delivered, a hung server at exit leaves the batch in the spool for the next
process, a 400 costs only the events it names, and what could not be delivered is reported in
the next heartbeat."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import pytest

from recoverydash.sdk.client import POISON_AFTER, Client

from .test_client import _made, make, run_py, wait_for


@pytest.fixture(autouse=True)
def _close_clients():
    yield
    while _made:
        _made.pop().close(0.2)  # not left for the interpreter's atexit


def rejected_files(spool: str, run_id: str = "run-a") -> list[dict]:
    folder = os.path.join(spool, run_id, "rejected")
    if not os.path.isdir(folder):
        return []
    return [json.load(open(os.path.join(folder, name))) for name in sorted(os.listdir(folder))
            if name.endswith(".json")]


def test_a_poison_event_is_isolated_and_set_aside_while_the_rest_is_delivered(ingest, spool):
    """The break test: one event the server answers 500 to, 202 events in all, the spool in
    order: before, 0 of 202 were delivered. Now 201 are, the poison one waits in rejected/ with
    the server's answer, and it is counted."""
    ingest.poison = lambda e: e.get("update") == 13
    c = make(ingest, spool, batch_max_events=50)
    for u in range(1, 203):
        c.update_committed(u, [{"stratum": "main", "epoch": 0, "ranges": [[u * 8, u * 8 + 8]]}])
    assert wait_for(lambda: len(ingest.stored) == 201, timeout=30), len(ingest.stored)
    assert c.flush(10)
    assert "run-a:0:0:u13" not in ingest.stored
    assert c.counters()["quarantined"] == 1
    [doc] = rejected_files(spool)
    assert doc["status"] == 500
    assert doc["reason"].startswith("HTTP 500 again and again while the server accepted")
    assert doc["answer"] == {"errors": [{"index": None, "path": "", "message": "scripted"}]}
    assert [e["event_id"] for e in doc["events"]] == ["run-a:0:0:u13"]
    assert doc["events"][0]["spans"] == [{"stratum": "main", "epoch": 0, "ranges": [[104, 112]]}]
    # it took POISON_AFTER answers to the batch, then a probe and a few halvings: not a flood
    assert len(ingest.requests) < 40


def test_a_server_answering_500_to_everything_sets_nothing_aside(ingest, spool):
    ingest.poison = lambda e: True
    c = make(ingest, spool, sync=True)
    for u in range(1, 5):
        c.update_committed(u, [])
    assert not c.flush(2 + POISON_AFTER * 0.3)
    assert c.counters()["quarantined"] == 0 and rejected_files(spool) == []
    assert c.counters()["spool_events"] == 4  # all of it still waits
    ingest.poison = None
    assert c.flush(10)
    assert len(ingest.stored) == 4


def test_the_poison_and_the_lost_updates_reach_the_server_in_the_next_heartbeat(ingest, spool):
    ingest.poison = lambda e: e.get("update") in (7, 9)
    c = make(ingest, spool, batch_max_events=20)
    for u in range(1, 21):
        c.update_committed(u, [])
    assert wait_for(lambda: len(ingest.stored) == 18 and c.counters()["quarantined"] == 2,
                    timeout=30)
    c.heartbeat(20)
    assert c.flush(10)
    [beat] = [e for e in ingest.stored.values() if e["type"] == "heartbeat"]
    assert beat["sdk_quarantined"] == 2 and beat["sdk_lost_updates"] == [7, 9]
    assert "sdk_dropped" not in beat
    assert sorted(e["update"] for doc in rejected_files(spool) for e in doc["events"]) == [7, 9]


def test_a_400_sets_aside_only_the_events_it_names(ingest, spool):
    answer = {"errors": [{"index": 1, "path": "events[1].update", "message": "expected an "
                          "integer >= 1, got 0"}]}
    ingest.script = [(400, {}, answer)]
    c = make(ingest, spool, flush_interval=5.0)
    for u in (1, 0, 2):
        c.update_committed(u, [])
    assert c.flush(5)
    assert sorted(ingest.stored) == ["run-a:0:0:u1", "run-a:0:0:u2"]
    [doc] = rejected_files(spool)
    assert doc["status"] == 400 and doc["answer"] == answer
    assert [e["update"] for e in doc["events"]] == [0]
    assert c.counters()["failed"] == 1 and c.counters()["quarantined"] == 1


class SilentServer:
    """Accepts connections and reads requests, never answers (until closed)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.held, self.requests = [], 0
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        self.sock.settimeout(0.1)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.held.append(conn)
            self.requests += 1

    def close(self):
        self.stop.set()
        for conn in self.held:
            conn.close()
        self.sock.close()


def test_a_hung_server_at_exit_loses_nothing_the_next_process_sends_it(ingest, spool):
    """A server that accepts but never answers while the trainer exits: before, the batch in
    flight was lost (500 of 2,001 events, then false omissions). Now it is written back to the
    spool within the exit deadline and the next process of the run delivers every event."""
    silent = SilentServer()
    try:
        t0 = time.monotonic()
        out = run_py(f"""
            import logging, time
            logging.basicConfig(level=logging.WARNING)
            from recoverydash.sdk.client import Client
            c = Client("http://127.0.0.1:{silent.port}", "tok-1", "run-h", attempt=0, rank=0,
                       spool_dir={spool!r}, atexit_deadline=1.0, flush_interval=0.01,
                       batch_max_events=500)
            for u in range(1, 501):
                c.update_committed(u, [])
            time.sleep(0.5)   # the sender is now inside its request, waiting for an answer
            for u in range(501, 2002):
                c.update_committed(u, [])
        """)
        assert out.returncode == 0, out.stderr
        assert time.monotonic() - t0 < 15
        assert silent.requests >= 1
        assert "the 500 events in flight were written back to the spool" in out.stderr
    finally:
        silent.close()
    later = Client(ingest.url, "tok-1", "run-h", attempt=0, rank=0, spool_dir=spool,
                   flush_interval=0.05)
    try:
        assert later.flush(20)
        assert len(ingest.stored) == 2001
        assert sorted(e["update"] for e in ingest.stored.values()) == list(range(1, 2002))
    finally:
        later.close(0.5)


def test_a_full_spool_counts_what_it_drops_with_the_updates(ingest, spool):
    ingest.stop()  # nothing answers: everything goes to the spool, which holds 1 KiB
    c = make(ingest, spool, spool_max_bytes=1024, batch_max_events=10, flush_interval=0.02)
    for u in range(1, 101):
        c.update_committed(u, [{"stratum": "main", "epoch": 0, "ranges": [[u, u + 1]]}])
    assert wait_for(lambda: c.counters()["dropped"] > 0, timeout=10)
    c.flush(1)
    lo, hi = c._worker.counters.lost_updates
    assert 1 <= lo <= hi <= 100
