"""``restore_plan`` against scripted servers (no Django): a 409 the server has not decided is
decided by storage, and a resumed launch sends the run's spool before it asks, or lets storage
decide when the spool still holds a newer commit (docs/ingest-v1.md#restore-plan)."""

from __future__ import annotations

import gzip
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest

from recoverydash.sdk.checkpoint import restore_plan
from recoverydash.sdk.client import Client
from recoverydash.sdk.resend import send_spool
from recoverydash.sdk.spool import newest_spooled_commit, run_folder, unsent_events

from .conftest import LocalServer, free_port, stopped_after
from .test_restore_selection import make_generation

RUN = "plan-run"


class PlanServer(LocalServer):
    """Answers ``GET .../restore-plan`` with ``plan(stored_events) -> (status, body)`` and
    ``POST /api/v1/events`` with ``post_status`` (202 stores the events, idempotent on
    event_id); ``hold_posts``: a POST is never answered (until the server stops)."""

    def __init__(self, plan, post_status=202, hold_posts=False):
        self.stored: dict[str, dict] = {}
        self.posts: list[int] = []
        self.gets: list[str] = []
        self.post_status = post_status
        self.release = threading.Event()
        srv = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _answer(self, status, body):
                page = isinstance(body, bytes)  # a web server's page, not the API's JSON
                out = body if page else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/html" if page else "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def do_GET(self):
                srv.gets.append(self.path)
                self._answer(*plan(srv.stored))

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                events = json.loads(gzip.decompress(raw))["events"]
                srv.posts.append(len(events))
                if hold_posts:
                    srv.release.wait(60)
                    return
                if srv.post_status == 202:
                    for e in events:
                        srv.stored.setdefault(e["event_id"], e)
                self._answer(srv.post_status, {"accepted": len(events), "duplicates": 0})

        self.serve(H)

    def stop(self):
        self.release.set()
        super().stop()


@pytest.fixture
def servers():
    yield from stopped_after(PlanServer)


def plan_200(gen, update):
    return 200, {"generation_id": gen, "update": update, "logger_rewind_update": update,
                 "committed_at": "2026-11-01T00:00:00Z", "objects": [], "cursor": [],
                 "warnings": []}


def knows_commits(stored):
    """A server naming the newest generation whose commit it received (g7 before that)."""
    commits = sorted((e["manifest"]["update"], e["generation_id"]) for e in stored.values()
                     if e.get("type") == "checkpoint_committed")
    update, gen = commits[-1] if commits else (7, "g7")
    return plan_200(gen, update)


def spool_a_killed_attempt(spool, loc, *, commit=True):
    """Attempt 0 of RUN, its server unreachable: updates 1-8 and (with ``commit``) the
    commit of g8 wait in the spool. Returns the manifest of g8."""
    manifest = make_generation(loc, "g8", 8)
    c = Client(f"http://127.0.0.1:{free_port()}", "tok", RUN, attempt=0, rank=0,
               spool_dir=spool, sync=True, handle_sigterm=False)
    for u in range(1, 9):
        c.update_committed(u, [{"stratum": "main", "epoch": 0, "first": (u - 1) * 8,
                                "count": 8}])
    if commit:
        c.checkpoint_committed(manifest)
    c.close(0.5)
    assert unsent_events(run_folder(spool, RUN)) == (9 if commit else 8)
    return manifest


def undecided_409(*rejected):
    return lambda stored: (409, {"error": "no_restorable_generation", "rejected": list(rejected)})


def test_a_409_listing_a_generation_committed_but_not_verified_is_decided_by_storage(
        tmp_path, servers):
    loc = str(tmp_path / "ckpt")
    make_generation(loc, "g7", 7)
    srv = servers(undecided_409({"generation_id": "g7", "status": "committed", "reasons": []}))
    plan = restore_plan(srv.url, "tok", RUN, location=loc)
    assert (plan["source"], plan["generation_id"], plan["update"]) == ("storage", "g7", 7)
    assert plan["warnings"] == [{"code": "server_undecided", "detail":
                                 "the server found no restorable generation but has not decided "
                                 "g7 (committed); storage decides"}]
    assert plan["logger_rewind_update"] == 7 and plan["attempt"] == 0
    assert plan["cursor"] == [{"stratum": "main", "epoch": 0, "position": 56}]


def test_storage_never_chooses_what_the_server_decided_against(tmp_path, servers):
    """g9 is sound in storage but the server rejected it (stale_state: the ledger says so) and
    g8 is restorable only in another lineage; g7 is committed, not verified yet: storage names
    g7, and lists g9 and g8 with the server's reasons."""
    loc = str(tmp_path / "ckpt")
    for gen, update in (("g7", 7), ("g8", 8), ("g9", 9)):
        make_generation(loc, gen, update)
    stale = [{"code": "stale_state", "detail": "optimizer files identical to g8's"}]
    elsewhere = [{"code": "not_in_live_lineage", "detail": "the live attempt 2 started fresh"}]
    srv = servers(undecided_409(
        {"generation_id": "g7", "status": "pending", "reasons": []},
        {"generation_id": "g8", "status": "restorable", "reasons": elsewhere},
        {"generation_id": "g9", "status": "rejected", "reasons": stale}))
    plan = restore_plan(srv.url, "tok", RUN, location=loc)
    assert (plan["source"], plan["generation_id"]) == ("storage", "g7")
    assert [w["code"] for w in plan["warnings"]] == ["server_undecided"]
    assert plan["rejected"] == [{"generation_id": "g9", "reasons": stale},
                                {"generation_id": "g8", "reasons": elsewhere}]


@pytest.mark.parametrize("status,code", [("rejected", "data_cursor_mismatch"),
                                         ("abandoned", "never_committed"),
                                         ("restorable", "not_in_live_lineage")])
def test_a_409_listing_decided_generations_only_is_a_fresh_start(tmp_path, servers, status,
                                                                 code):
    loc = str(tmp_path / "ckpt")
    make_generation(loc, "g7", 7)
    listed = {"generation_id": "g7", "status": status,
              "reasons": [{"code": code, "detail": "x"}]}
    srv = servers(undecided_409(listed))
    plan = restore_plan(srv.url, "tok", RUN, location=loc)
    assert (plan["source"], plan["generation_id"], plan["warnings"]) == ("server", None, [])
    assert plan["rejected"] == [listed]


def test_the_spool_of_a_killed_attempt_is_sent_before_the_question(tmp_path, servers):
    spool, loc = str(tmp_path / "spool"), str(tmp_path / "ckpt")
    make_generation(loc, "g7", 7)
    spool_a_killed_attempt(spool, loc)
    srv = servers(knows_commits)
    plan = restore_plan(srv.url, "tok", RUN, location=loc, spool_dir=spool)
    assert (plan["source"], plan["generation_id"], plan["update"]) == ("server", "g8", 8)
    assert plan["warnings"] == []
    assert sorted(srv.stored) == sorted([f"{RUN}:0:0:u{u}" for u in range(1, 9)]
                                        + [f"{RUN}:0:0:g:g8:committed"])
    assert unsent_events(run_folder(spool, RUN)) == 0


@pytest.mark.parametrize("post_status", [503, 403])
def test_a_spooled_commit_the_server_does_not_take_lets_storage_decide(tmp_path, servers,
                                                                       post_status):
    """503: the server cannot store events now; 403: the plan's token lacks the ingest scope.
    Either way nothing is set aside or lost: the batches stay for the run's client."""
    spool, loc = str(tmp_path / "spool"), str(tmp_path / "ckpt")
    make_generation(loc, "g7", 7)
    spool_a_killed_attempt(spool, loc)
    srv = servers(knows_commits, post_status=post_status)
    plan = restore_plan(srv.url, "tok", RUN, location=loc, spool_dir=spool)
    assert (plan["source"], plan["generation_id"], plan["update"]) == ("storage", "g8", 8)
    assert plan["warnings"] == [{"code": "spool_commit_unsent", "detail":
                                 "the spool holds the commit of g8 (update 8), newer than the "
                                 "server's g7 (update 7)"}]
    assert srv.posts == [1] and srv.stored == {}  # one try (the oldest batch), then left alone
    folder = run_folder(spool, RUN)
    assert unsent_events(folder) == 9 and not os.path.exists(os.path.join(folder, "rejected"))


def test_a_409_and_a_spooled_commit_the_server_never_heard_of(tmp_path, servers):
    spool, loc = str(tmp_path / "spool"), str(tmp_path / "ckpt")
    spool_a_killed_attempt(spool, loc)
    srv = servers(undecided_409(), post_status=503)
    plan = restore_plan(srv.url, "tok", RUN, location=loc, spool_dir=spool)
    assert (plan["source"], plan["generation_id"]) == ("storage", "g8")
    assert plan["warnings"] == [{"code": "spool_commit_unsent", "detail":
                                 "the spool holds the commit of g8 (update 8), which the server "
                                 "has not heard of"}]


def test_unsent_events_without_a_newer_commit_keep_the_servers_answer(tmp_path, servers):
    spool, loc = str(tmp_path / "spool"), str(tmp_path / "ckpt")
    make_generation(loc, "g7", 7)
    spool_a_killed_attempt(spool, loc, commit=False)
    srv = servers(knows_commits, post_status=503)
    plan = restore_plan(srv.url, "tok", RUN, location=loc, spool_dir=spool)
    assert (plan["source"], plan["generation_id"]) == ("server", "g7")
    assert plan["warnings"] == [{"code": "spool_unsent", "detail":
                                 "8 spooled event(s) of this run are not on the server "
                                 "(answered 503); none is a commit newer than its answer"}]


def test_a_server_that_never_answers_the_spool_gets_half_the_timeout(tmp_path, servers):
    """A POST held without an answer: the sending ends at half of the timeout (the batch stays
    claimed by the thread still waiting), the question is asked, the spool is read: storage
    decides. No timing is asserted here: the join only keeps a hang from hanging the suite."""
    spool, loc = str(tmp_path / "spool"), str(tmp_path / "ckpt")
    make_generation(loc, "g7", 7)
    spool_a_killed_attempt(spool, loc)
    srv = servers(knows_commits, hold_posts=True)
    out = {}
    t = threading.Thread(target=lambda: out.update(plan=restore_plan(
        srv.url, "tok", RUN, location=loc, spool_dir=spool, timeout=2.0)), daemon=True)
    t.start()
    t.join(60)
    plan = out["plan"]
    assert (plan["source"], plan["generation_id"]) == ("storage", "g8")
    assert [w["code"] for w in plan["warnings"]] == ["spool_commit_unsent"]
    assert srv.posts == [1] and srv.gets == [f"/api/v1/runs/{RUN}/restore-plan"]
    assert unsent_events(run_folder(spool, RUN)) == 9  # claimed, not lost


def test_no_spool_to_send(tmp_path, servers):
    srv = servers(knows_commits)
    assert send_spool(srv.url, "tok", RUN, spool_dir=str(tmp_path / "none")).left == 0
    assert not os.path.exists(tmp_path / "none")  # nothing made
    assert send_spool(srv.url, "tok", RUN, spool_dir=False).folder is None
    plan = restore_plan(srv.url, "tok", RUN, location=str(tmp_path), spool_dir=False)
    assert (plan["source"], plan["generation_id"]) == ("server", "g7")
    assert srv.posts == []


def test_a_live_client_of_the_run_in_this_process_sends_its_own_spool(tmp_path, servers):
    """The client flushes (its sender owns the folder's claims); the events it still queued go
    too."""
    spool = str(tmp_path / "spool")
    srv = servers(knows_commits)
    c = Client(srv.url, "tok", RUN, attempt=3, rank=0, spool_dir=spool, flush_interval=30,
               max_flush_interval=30, handle_sigterm=False)
    try:
        c.update_committed(1, [{"stratum": "main", "epoch": 0, "first": 0, "count": 8}])
        sent = send_spool(srv.url, "tok", RUN, spool_dir=spool, timeout=10)
        assert (sent.left, sent.stopped) == (0, "")
        assert list(srv.stored) == [f"{RUN}:3:0:u1"]
    finally:
        c.close(1)


def test_the_newest_spooled_commit_is_read_newest_file_first(tmp_path):
    folder = str(tmp_path / "run")
    os.makedirs(folder)

    def batch(name, *events):
        body = json.dumps({"events": list(events)}).encode()
        with open(os.path.join(folder, name), "wb") as f:
            f.write(gzip.compress(body))

    def commit(gen, update):
        return {"type": "checkpoint_committed", "generation_id": gen, "attempt": 1,
                "manifest": {"generation_id": gen, "update": update}}

    batch("00000000000000000001-1-00000000-n2.batch", commit("g4", 4), commit("g5", 5))
    batch("00000000000000000002-1-00000001-n2.batch.claimed-99", commit("g6", 6),
          {"type": "update_committed", "update": 7})
    batch("00000000000000000003-1-00000002-n1.batch.ahead-98",
          {"type": "update_committed", "update": 8})
    with open(os.path.join(folder, "00000000000000000004-1-00000003-n1.batch"), "wb") as f:
        f.write(b"torn")
    assert newest_spooled_commit(folder) == ({"generation_id": "g6", "update": 6,
                                              "attempt": 1}, 0)
    assert unsent_events(folder) == 6
    assert newest_spooled_commit(folder, deadline=time.monotonic() - 1) == (None, 4)


@pytest.mark.parametrize("body,detail", [
    ({"generation_id": "g1"}, "update is None, not an update number"),
    ({"generation_id": "g1", "update": 1, "warnings": [1, 2]},
     "warnings holds an item that is not an object"),
    ({"generation_id": 5, "update": 9, "objects": "abc", "cursor": 7},
     "generation_id is 5, not a generation's id"),
    ({"generation_id": "g1", "update": 1, "objects": "abc"}, "objects is str, not a list"),
    ({"generation_id": "g1", "update": True}, "update is True, not an update number"),
    ([], "the answer is list, not an object"),
])
def test_a_2xx_that_is_not_a_plan_is_not_taken_storage_decides(tmp_path, servers, body, detail):
    """A malformed 200 is never the plan, not even when nothing is left unsent: here the
    killed attempt's spool is sent (the server takes it) and storage names g8."""
    spool, loc = str(tmp_path / "spool"), str(tmp_path / "ckpt")
    make_generation(loc, "g7", 7)
    spool_a_killed_attempt(spool, loc)
    srv = servers(lambda stored: (200, body))
    plan = restore_plan(srv.url, "tok", RUN, location=loc, spool_dir=spool)
    assert (plan["source"], plan["generation_id"], plan["update"]) == ("storage", "g8", 8)
    assert plan["warnings"] == [{"code": "server_malformed", "detail": detail}]
    assert isinstance(plan["objects"], list) and isinstance(plan["cursor"], list)


# --- a newer generation the server has not decided yet (newer_undecided) -------------------------

H200 = {"generation_id": "g200", "update": 200, "status": "committed"}
NEWER = ("the server names g100 (update 100) while newer generations are not decided yet: "
         "g200 (update 200, committed); resuming now redoes the updates after 100 should one "
         "prove restorable")


def plan_with(gen, update, *newer):
    status, body = plan_200(gen, update)
    return status, {**body, "newer_undecided": list(newer)}


def answers(*script):
    """A plan function answering ``script``'s (status, body) in turn, the last one again."""
    script = list(script)
    return lambda stored: script.pop(0) if len(script) > 1 else script[0]


def test_a_200_listing_a_newer_undecided_generation_keeps_the_choice_and_warns(tmp_path,
                                                                               servers):
    srv = servers(lambda stored: plan_with("g100", 100, H200))
    plan = restore_plan(srv.url, "tok", RUN, spool_dir=False)
    assert (plan["source"], plan["generation_id"], plan["update"]) == ("server", "g100", 100)
    assert plan["newer_undecided"] == [H200]
    assert plan["warnings"] == [{"code": "newer_undecided", "detail": NEWER}]
    assert len(srv.gets) == 1  # no wait unless asked for


def test_a_200_listing_nothing_newer_has_no_warning(tmp_path, servers):
    srv = servers(lambda stored: plan_with("g200", 200))
    plan = restore_plan(srv.url, "tok", RUN, spool_dir=False, wait_undecided_s=10)
    assert (plan["generation_id"], plan["newer_undecided"], plan["warnings"]) == ("g200", [], [])
    assert len(srv.gets) == 1
    old_server = servers(lambda stored: plan_200("g100", 100))  # no such field: an older server
    plan = restore_plan(old_server.url, "tok", RUN, spool_dir=False)
    assert (plan["generation_id"], plan["newer_undecided"], plan["warnings"]) == ("g100", [], [])


def test_the_environment_sets_the_wait_a_call_does_not_give(tmp_path, servers, monkeypatch):
    from recoverydash.sdk.restore import WAIT_UNDECIDED_ENV

    # a drill's launches: $RECOVERYDASH_WAIT_UNDECIDED_S, for a trainer that gives no wait
    monkeypatch.setenv(WAIT_UNDECIDED_ENV, "10")
    srv = servers(answers(plan_with("g100", 100, H200), plan_with("g200", 200)))
    plan = restore_plan(srv.url, "tok", RUN, spool_dir=False)
    assert (plan["generation_id"], plan["warnings"], len(srv.gets)) == ("g200", [], 2)
    # a wait the call gives wins over it
    srv = servers(answers(plan_with("g100", 100, H200), plan_with("g200", 200)))
    plan = restore_plan(srv.url, "tok", RUN, spool_dir=False, wait_undecided_s=0)
    assert (plan["generation_id"], len(srv.gets)) == ("g100", 1)


def test_waiting_asks_again_until_the_newer_generation_is_decided(tmp_path, servers):
    srv = servers(answers(plan_with("g100", 100, H200), plan_with("g100", 100, H200),
                          plan_with("g200", 200)))
    t0 = time.monotonic()
    plan = restore_plan(srv.url, "tok", RUN, spool_dir=False, wait_undecided_s=10)
    took = time.monotonic() - t0
    assert (plan["source"], plan["generation_id"], plan["update"]) == ("server", "g200", 200)
    assert (plan["newer_undecided"], plan["warnings"]) == ([], [])
    assert len(srv.gets) == 3
    assert 1.5 <= took < 5.0, took  # pauses of 0.5 and 1 s before the second and third


def test_the_wait_ends_at_its_bound_with_the_servers_choice(tmp_path, servers):
    srv = servers(lambda stored: plan_with("g100", 100, H200))
    t0 = time.monotonic()
    plan = restore_plan(srv.url, "tok", RUN, spool_dir=False, timeout=1.0, wait_undecided_s=2.0)
    took = time.monotonic() - t0
    assert took < 1.0 + 2.0 + 0.5, took
    assert (plan["generation_id"], plan["newer_undecided"]) == ("g100", [H200])
    (warning,) = plan["warnings"]
    assert warning["code"] == "newer_undecided"
    assert " (still so after waiting " in warning["detail"]
    assert len(srv.gets) == 4  # at 0, 0.5, 1.5 and 1.95 s (the last pause cut to the bound)


def test_a_pending_newer_generation_is_not_waited_for(tmp_path, servers):
    pending = {"generation_id": "g200", "update": 200, "status": "pending"}
    srv = servers(lambda stored: plan_with("g100", 100, pending))
    plan = restore_plan(srv.url, "tok", RUN, spool_dir=False, wait_undecided_s=10)
    assert (plan["generation_id"], plan["newer_undecided"]) == ("g100", [pending])
    assert plan["warnings"] == [{"code": "newer_undecided",
                                 "detail": NEWER.replace("committed", "pending")}]
    assert len(srv.gets) == 1


@pytest.mark.parametrize("then", [(500, {}), (200, {"generation_id": "g200"}),
                                  (409, {"error": "no_restorable_generation", "rejected": []})])
def test_an_answer_again_that_is_not_a_plan_ends_the_wait_and_the_first_stands(
        tmp_path, servers, then):
    srv = servers(answers(plan_with("g100", 100, H200), then))
    plan = restore_plan(srv.url, "tok", RUN, spool_dir=False, wait_undecided_s=10)
    assert (plan["source"], plan["generation_id"], plan["newer_undecided"]) == (
        "server", "g100", [H200])
    (warning,) = plan["warnings"]
    head, tail = NEWER.split("; resuming")
    assert warning["code"] == "newer_undecided"
    assert warning["detail"].startswith(head + " (still so after waiting 0.")  # 0.5 s, a pause
    assert warning["detail"].endswith(" s); resuming" + tail)
    assert len(srv.gets) == 2


@pytest.mark.parametrize("field", [
    "x", 7, None, {"generation_id": "g200"},
    [1, "g200", {"generation_id": "g50", "update": 50, "status": "committed"},
     {"generation_id": "g300", "update": 300, "status": "restorable"},
     {"generation_id": "", "update": 300, "status": "committed"},
     {"generation_id": "g301", "update": True, "status": "pending"}],
])
def test_a_malformed_newer_undecided_is_dropped_never_refusing_the_plan(tmp_path, servers,
                                                                        field):
    srv = servers(lambda stored: (200, {**plan_200("g100", 100)[1], "newer_undecided": field}))
    plan = restore_plan(srv.url, "tok", RUN, spool_dir=False, wait_undecided_s=10)
    assert (plan["source"], plan["generation_id"], plan["newer_undecided"], plan["warnings"]) \
        == ("server", "g100", [], [])


@pytest.mark.parametrize("value", [-1, float("nan"), float("inf"), "abc"])
def test_a_wait_that_is_not_seconds_is_no_wait(tmp_path, servers, value):
    srv = servers(lambda stored: plan_with("g100", 100, H200))
    plan = restore_plan(srv.url, "tok", RUN, spool_dir=False, wait_undecided_s=value)
    assert (plan["generation_id"], [w["code"] for w in plan["warnings"]]) == (
        "g100", ["newer_undecided"])
    assert len(srv.gets) == 1


def test_storage_and_no_server_answers_list_nothing_newer(tmp_path):
    loc = str(tmp_path / "ckpt")
    make_generation(loc, "g7", 7)
    plan = restore_plan(None, None, RUN, location=loc, spool_dir=False)
    assert (plan["source"], plan["generation_id"], plan["newer_undecided"]) == ("storage", "g7",
                                                                                [])


@pytest.mark.parametrize("run_id, folder", [(".", "_"), ("..", "__"), ("a/../b", "a_.._b")])
def test_a_run_folder_is_never_the_spool_itself_or_its_parent(tmp_path, run_id, folder):
    assert run_folder(str(tmp_path), run_id) == str(tmp_path / folder)


def unknown_run(stored):
    """The server's answer for a run it has never heard of (docs/ingest-v1.md: 404 not_found)."""
    return 404, {"error": "not_found", "errors": [{"index": None, "path": "run_id", "message":
                                                   f"expected a run of this project, got unknown "
                                                   f"run_id {RUN!r}"}]}


def test_a_first_launch_is_a_fresh_start_without_a_warning(tmp_path, servers):
    srv = servers(unknown_run)
    plan = restore_plan(srv.url, "tok", RUN)
    assert (plan["source"], plan["generation_id"], plan["warnings"]) == ("server", None, [])
    empty = str(tmp_path / "ckpt")
    os.makedirs(empty)
    plan = restore_plan(srv.url, "tok", RUN, location=empty)
    assert (plan["source"], plan["generation_id"], plan["warnings"]) == ("storage", None, [])


def test_a_run_the_server_does_not_know_but_storage_does_is_decided_by_storage(tmp_path,
                                                                               servers):
    loc = str(tmp_path / "ckpt")
    make_generation(loc, "g7", 7)
    plan = restore_plan(servers(unknown_run).url, "tok", RUN, location=loc)
    assert (plan["source"], plan["generation_id"]) == ("storage", "g7")
    assert [w["code"] for w in plan["warnings"]] == ["server_unknown_run"]
    assert "storage holds 1 generation(s)" in plan["warnings"][0]["detail"]


@pytest.mark.parametrize("tail", ["/api/v1", "/api/v1/"])
def test_a_base_url_ending_in_the_api_path_asks_the_right_address(servers, tail):
    srv = servers(lambda stored: plan_200("g7", 7))
    plan = restore_plan(srv.url + tail, "tok", RUN, world_size=2)
    assert (plan["source"], plan["generation_id"]) == ("server", "g7")
    assert srv.gets == [f"/api/v1/runs/{RUN}/restore-plan?world_size=2"]


def test_a_url_that_is_not_the_api_is_said_in_a_line_not_an_html_page(tmp_path, servers):
    page = b"<!DOCTYPE html><html><body>" + b"Not Found. " * 500 + b"</body></html>"
    srv = servers(lambda stored: (404, page))
    plan = restore_plan(srv.url + "/wrong", "tok", RUN, location=str(tmp_path / "none"))
    [w] = [w for w in plan["warnings"] if w["code"] == "server_error"]
    assert w["detail"] == (f"restore-plan answered 404 from {srv.url}/wrong/api/v1/runs/{RUN}/"
                           "restore-plan, which is not the recoverydash API (its base URL?)")


def test_a_refused_token_is_named_in_the_plans_warning(servers):
    srv = servers(lambda stored: (401, {"error": "unauthorized", "errors": []}))
    plan = restore_plan(srv.url, "bad", RUN)
    assert {"code": "server_error", "detail": "restore-plan answered 401: the token is refused "
            "(no, an unknown or a revoked token)"} in plan["warnings"]
