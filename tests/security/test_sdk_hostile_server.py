"""A restarting trainer asks the server which generation to load (``restore_plan``) and which
attempt it is (``latest_on_server``) before its first update. A server that accepts the
connection and then trickles its answer, a byte just inside each socket timeout, or answers
without end, must not hold the launch: each question ends within twice its timeout and falls
back to storage (the urllib timeout is per socket operation, so a trickle held it for as long
as the server kept sending)."""

from __future__ import annotations

import threading
import time

import pytest

from recoverydash.sdk.attempt import latest_on_server
from recoverydash.sdk.checkpoint import restore_plan


def trickle(receiver, conn):
    """Headers announcing a large JSON body, then one byte every 0.3 s for up to 20 s."""
    receiver.write(conn, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000000\r\n\r\n[")
    end = time.monotonic() + 20
    while time.monotonic() < end and not receiver.stop.is_set():
        receiver.write(conn, b" ")
        time.sleep(0.3)


def endless_headers(receiver, conn):
    receiver.write(conn, b"HTTP/1.1 200 OK\r\n")
    end = time.monotonic() + 20
    while time.monotonic() < end and not receiver.stop.is_set():
        receiver.write(conn, b"X-A: b\r\n")
        time.sleep(0.3)


def flood(receiver, conn):
    """A 200 whose body never ends (no length, no close), as fast as the socket takes it."""
    receiver.write(conn, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n[")
    chunk = b" " * 65536
    end = time.monotonic() + 20
    while time.monotonic() < end and not receiver.stop.is_set():
        receiver.write(conn, chunk)


def _within(seconds, fn):
    """fn()'s result and how long it took, or a failure when it takes longer than seconds."""
    out = {}

    def run():
        start = time.monotonic()
        out["value"] = fn()
        out["took"] = time.monotonic() - start

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s"
    return out["value"], out["took"]


@pytest.mark.parametrize("behave", [trickle, endless_headers, flood])
def test_it_ends_a_restore_plan_question_within_twice_its_timeout(raw_receiver, tmp_path,
                                                                  behave):
    server = raw_receiver(behave)
    url = f"http://127.0.0.1:{server.port}"
    plan, took = _within(8, lambda: restore_plan(url, "t", "run-1", location=str(tmp_path),
                                                 timeout=1.0))
    assert took < 2.5
    assert plan["source"] == "storage" and plan["generation_id"] is None
    assert plan["warnings"][0]["code"] == "server_unreachable"


@pytest.mark.parametrize("behave", [trickle, endless_headers, flood])
def test_it_ends_the_attempt_question_within_twice_its_timeout(raw_receiver, behave):
    server = raw_receiver(behave)
    value, took = _within(8, lambda: latest_on_server(f"http://127.0.0.1:{server.port}", "t",
                                                      "run-1", timeout=1.0))
    assert value is None and took < 2.5


def test_a_server_answering_an_endless_body_does_not_grow_the_trainers_memory(raw_receiver,
                                                                              tmp_path):
    """The sender reads at most ``MAX_ANSWER_BYTES`` of an answer (the server's are a few
    hundred bytes): a URL pointing at something that answers without end is dropped, not
    drained into the training process until it runs out of memory."""
    from recoverydash.sdk.client import Client

    server = raw_receiver(flood)
    client = Client(f"http://127.0.0.1:{server.port}", "t", "run-1",
                    spool_dir=str(tmp_path / "spool"), request_timeout=1.0)
    try:
        client.heartbeat(1)
        _within(8, lambda: client.flush(timeout=3))
        time.sleep(1)
        assert server.sent < 256 * 1024 * 1024  # the cap, and what loopback buffers hold
    finally:
        _within(8, lambda: client.close(timeout=2))
