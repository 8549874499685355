"""A token the server refuses (401: mistyped, unknown, revoked; 403: without the ingest scope)
strands nothing: the sender pauses with an error at every retry, ``flush()`` says False, every
event stays in the spool (none in ``rejected/``), and ``python -m recoverydash.sdk resend`` sends
them (and what ``rejected/`` holds) once the token is right."""

from __future__ import annotations

import json
import logging
import os
import time

import pytest

from recoverydash.sdk.__main__ import main as cli
from recoverydash.sdk.client import Client

from .conftest import wait_for

RUN = "run-tok"
IDS = [f"{RUN}:0:0:u{u}" for u in range(1, 21)]

_made: list[Client] = []


@pytest.fixture(autouse=True)
def _close_clients():
    yield
    while _made:
        _made.pop().close(0.2)


def make(ingest, spool, token="typo", **kw) -> Client:
    kw.setdefault("flush_interval", 0.05)
    kw.setdefault("backoff_base", 0.05)
    kw.setdefault("backoff_cap", 0.2)
    c = Client(ingest.url, token, RUN, attempt=0, rank=0, spool_dir=spool,
               handle_sigterm=False, **kw)
    _made.append(c)
    return c


def send_twenty(c: Client) -> None:
    for u in range(1, 21):
        c.update_committed(u, [{"stratum": "main", "epoch": 0, "ranges": [[u, u + 1]]}])


def rejected_files(spool: str) -> list[str]:
    folder = os.path.join(spool, RUN, "rejected")
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_token_keeps_every_event_in_the_spool_and_flush_says_false(
        ingest, spool, caplog, status):
    ingest.tokens, ingest.token_status = {"tok-1"}, status
    c = make(ingest, spool)
    send_twenty(c)
    t0 = time.monotonic()
    assert c.flush(10) is False
    assert time.monotonic() - t0 < 5  # said at once, not at the timeout
    counters = c.counters()
    assert (counters["spooled"], counters["spool_events"], counters["failed"],
            counters["quarantined"], counters["dropped"], counters["pending"]) == \
        (20, 20, 0, 0, 0, 0)
    assert rejected_files(spool) == []
    assert c.refused == status
    assert ingest.stored == {}
    said = [r for r in caplog.records if "refused the token" in r.getMessage()]
    assert said and said[0].levelno == logging.ERROR
    assert f"HTTP {status}" in said[0].getMessage()
    assert "20 event(s) wait in the spool" in said[0].getMessage()
    assert f"python -m recoverydash.sdk resend --run {RUN}" in said[0].getMessage()


def test_the_warning_repeats_at_every_retry_and_sending_resumes_when_the_token_is_taken(
        ingest, spool, caplog):
    ingest.tokens = {"tok-1"}
    c = make(ingest, spool, auth_retry_s=0.2)
    send_twenty(c)
    assert c.flush(2) is False
    assert wait_for(lambda: len(ingest.refused_tokens) >= 4, timeout=10)
    errors = [r for r in caplog.records if "refused the token" in r.getMessage()]
    assert len(errors) >= 3 and {r.levelno for r in errors} == {logging.ERROR}
    assert rejected_files(spool) == [] and ingest.stored == {}
    ingest.tokens.add("typo")  # the operator gives the token the scope it lacked
    assert wait_for(lambda: len(ingest.stored) == 20, timeout=10)
    assert c.flush(5) is True and c.refused is None
    assert sorted(ingest.stored) == sorted(IDS)
    assert any("accepts the token and URL again" in r.getMessage() for r in caplog.records)


def test_sync_mode_also_answers_false_and_keeps_the_events(ingest, spool):
    ingest.tokens = {"tok-1"}
    c = make(ingest, spool, sync=True)
    send_twenty(c)
    assert c.flush(1) is False
    assert c.counters()["spool_events"] == 20 and rejected_files(spool) == []


def test_resend_sends_the_spool_once_the_token_is_right(ingest, spool, capsys, caplog):
    ingest.tokens = {"tok-1"}
    c = make(ingest, spool)
    send_twenty(c)
    assert c.flush(5) is False
    assert c.close(1) is True
    assert any(f"resend --run {RUN}" in r.getMessage() for r in caplog.records
               if r.levelno == logging.ERROR and "wait in the spool" in r.getMessage())
    # the same mistyped token again: nothing is sent, nothing is lost, exit status 1
    assert cli(["resend", "--run", RUN, "--url", ingest.url, "--token", "typo",
                "--spool-dir", spool]) == 1
    err = capsys.readouterr().err
    assert "refused the token (HTTP 401)" in err
    assert ingest.stored == {} and c.counters()["spool_events"] == 20
    # the right one: everything arrives, each event once, nothing is left
    assert cli(["resend", "--run", RUN, "--url", ingest.url + "/api/v1/", "--token", "tok-1",
                "--spool-dir", spool]) == 0
    out = capsys.readouterr().out
    assert f"run {RUN}: 20 spooled event(s) sent, 0 left" in out
    assert sorted(ingest.stored) == sorted(IDS)
    assert set(ingest.deliveries.values()) == {1}


def write_rejected(spool: str, name: str, status: int, events: list[dict]) -> None:
    """A refusal file as ``DiskSpool.reject`` writes it (an older SDK filed a 401 there)."""
    folder = os.path.join(spool, RUN, "rejected")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "w") as f:
        json.dump({"rejected_at": "2026-11-01T00:00:00Z", "status": status,
                   "reason": f"refused by the server with HTTP {status}",
                   "answer": {"error": "unauthorized"}, "events": events}, f)


def test_resend_offers_rejected_events_again_and_keeps_what_is_refused_again(ingest, spool,
                                                                               capsys):
    ev = [{"type": "heartbeat", "update": u, "run_id": RUN, "attempt": 0, "rank": 0,
           "time": "2026-11-01T00:00:00.000+00:00", "event_id": f"{RUN}:0:0:hb{u}"}
          for u in range(3)]
    write_rejected(spool, "00000000000000000001-7-00000000-n2.json", 401, ev[:2])
    write_rejected(spool, "00000000000000000002-7-00000001-n1.json", 400, ev[2:])
    ingest.script = [(202, {}), (400, {})]  # the second file's events are invalid: refused again
    assert cli(["resend", "--run", RUN, "--url", ingest.url, "--token", "tok-1",
                "--spool-dir", spool]) == 1
    out = capsys.readouterr().out
    assert "rejected/: 1 file(s) sent (2 event(s)), 1 left" in out
    assert "00000000000000000002-7-00000001-n1.json: refused again (HTTP 400)" in out
    assert sorted(ingest.stored) == [f"{RUN}:0:0:hb0", f"{RUN}:0:0:hb1"]
    assert rejected_files(spool) == ["00000000000000000002-7-00000001-n1.json"]
    assert cli(["resend", "--run", RUN, "--url", ingest.url, "--token", "tok-1",
                "--spool-dir", spool, "--no-rejected"]) == 0


def test_a_new_process_with_the_right_token_sends_what_a_refused_one_spooled(ingest, spool):
    ingest.tokens = {"tok-1"}
    first = make(ingest, spool)
    send_twenty(first)
    assert first.flush(5) is False
    first.close(1)
    second = make(ingest, spool, token="tok-1")
    assert second.flush(10) is True
    assert sorted(ingest.stored) == sorted(IDS) and rejected_files(spool) == []


@pytest.mark.parametrize("tail", ["/api/v1", "/api/v1/", "/API/v1/events", "/"])
def test_a_base_url_given_with_the_api_path_is_understood(ingest, spool, tail):
    c = make(ingest, spool, token="tok-1")
    c2 = Client(ingest.url + tail, "tok-1", RUN, attempt=0, rank=0, spool_dir=spool,
                handle_sigterm=False, flush_interval=0.05)
    _made.append(c2)
    assert c2.url == ingest.url and c2.endpoint == ingest.url + "/api/v1/events"
    c2.heartbeat(1)
    assert c2.flush(5) is True
    assert [r["path"] for r in ingest.requests] == ["/api/v1/events"]
    assert c.url == ingest.url


def test_a_url_leading_to_no_api_keeps_the_events_and_quotes_no_html(ingest, spool, caplog):
    c = Client(ingest.url + "/recoverydash", "tok-1", RUN, attempt=0, rank=0, spool_dir=spool,
               handle_sigterm=False, flush_interval=0.05)
    _made.append(c)
    send_twenty(c)
    assert c.flush(5) is False and c.refused == 404
    assert c.counters()["spool_events"] == 20 and rejected_files(spool) == []
    [said] = [r.getMessage() for r in caplog.records if "refused the URL" in r.getMessage()]
    assert "<html" not in said.lower() and "(an HTML page of 4" in said
    assert f"no recoverydash API at {ingest.url}/recoverydash/api/v1/events" in said
    c.close(1)
    assert cli(["resend", "--run", RUN, "--url", ingest.url, "--token", "tok-1",
                "--spool-dir", spool]) == 0
    assert sorted(ingest.stored) == sorted(IDS)
