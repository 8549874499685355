"""What a rank's SDK client keeps when the process is ended by a signal: torchrun sends SIGTERM to
the other ranks when one fails, Slurm sends SIGTERM before SIGKILL, the OOM killer sends SIGKILL.

Each test runs a trainer-like child process (its client pointed at the recording ``ingest``
server, a long flush interval so every event is still in memory), ends it with a signal, then a
client of the next attempt of the same run in this process drains the run's spool: the events of
the ended process arrive with their own event ids and attempt number."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time

from recoverydash.sdk.client import Client

from .conftest import REPO, drained_by_next_attempt

N = 1234


PRINT_READY = 'print("ready", flush=True)'


def child(spool: str, url: str, body: str, after: str = "", **client_kw) -> subprocess.Popen:
    """A process that runs ``body``, makes a client of run ``run-t`` attempt 3 rank 0 (flush
    interval 60 s: its first periodic send is at least 48 s away; no batch fills), queues ``N``
    update_committed events, runs ``after`` (default: print ``ready``; else it prints it) and
    waits to be signalled. ``handle_sigterm`` defaults to True here; pass None for the
    client's own default."""
    client_kw.setdefault("handle_sigterm", True)  # the handler under test (not the default of a
    # process whose world size is unknown: single_process_job)
    kw = ", ".join(f"{k}={v!r}" for k, v in client_kw.items())
    code = textwrap.dedent(f"""
        import os, signal, sys, time
        from recoverydash.sdk.client import Client
        {textwrap.indent(textwrap.dedent(body), ' ' * 8).strip()}
        c = Client({url!r}, "tok-1", "run-t", attempt=3, rank=0, spool_dir={spool!r},
                   flush_interval=60.0, max_flush_interval=60.0, batch_max_events=5000, {kw})
        for u in range(1, {N} + 1):
            c.update_committed(u, [{{"stratum": "main", "epoch": 0, "ranges": [[u, u + 1]]}}])
        {textwrap.indent(textwrap.dedent(after or PRINT_READY), ' ' * 8).strip()}
        while True:
            time.sleep(0.05)
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("RECOVERYDASH_HANDLE_SIGTERM", None)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def signal_when_ready(proc: subprocess.Popen, sig: int) -> tuple[int, str, str]:
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 60)  # a guard, not a measurement
        assert ready, "the child never said ready"
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
        return proc.returncode, out, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def next_attempt_delivers(ingest, spool) -> list[str]:
    """A client of attempt 4 of the run drains its spool; returns the stored event ids."""
    return sorted(drained_by_next_attempt(ingest, spool, "run-t", 4))


def expected_ids(n: int = N) -> list[str]:
    return sorted(f"run-t:3:0:u{u}" for u in range(1, n + 1))


def test_sigterm_spools_the_queue_and_the_process_still_dies_of_sigterm(ingest, spool):
    """Before: the default SIGTERM action ended the process without atexit, and the 1,234
    queued events were gone. Now they are in the spool, the exit status is still -SIGTERM, and
    the next attempt delivers exactly them (attempt 3, their own)."""
    rc, _, err = signal_when_ready(child(spool, ingest.url, ""), signal.SIGTERM)
    assert rc == -signal.SIGTERM, err
    assert ingest.requests == []  # nothing was sent by the ended process: all came from the spool
    assert next_attempt_delivers(ingest, spool) == expected_ids()
    assert {e["attempt"] for e in ingest.stored.values()} == {3}
    assert ingest.stored["run-t:3:0:u7"]["spans"] == [
        {"stratum": "main", "epoch": 0, "ranges": [[7, 8]]}]


def test_a_framework_handler_installed_before_the_client_is_called_after_spooling(ingest, spool):
    rc, out, err = signal_when_ready(child(spool, ingest.url, """
        def framework(signum, frame):
            print("framework handler:", signum, c.counters()["spool_events"], flush=True)
            os._exit(7)
        signal.signal(signal.SIGTERM, framework)
    """), signal.SIGTERM)
    assert rc == 7, err
    assert out.splitlines()[-1] == f"framework handler: {int(signal.SIGTERM)} {N}"
    assert next_attempt_delivers(ingest, spool) == expected_ids()


def test_a_framework_handler_chaining_to_ours_is_not_put_behind_ours_by_a_later_client(
        ingest, spool):
    """A framework installs its handler after the first client (it calls the one it replaced:
    ours); a second client made after it leaves it in place. Before: the second client put ours
    in front again, ours called the framework's, which called ours ... without end (a
    RecursionError raised into the training loop; the process did not die of SIGTERM)."""
    rc, out, err = signal_when_ready(child(spool, ingest.url, "", after="""
        previous = signal.getsignal(signal.SIGTERM)
        calls = []
        def framework(signum, frame):
            calls.append(signum)
            print("framework handler:", len(calls), flush=True)
            if len(calls) > 3:
                os._exit(9)
            previous(signum, frame)
        signal.signal(signal.SIGTERM, framework)
        other = Client(c.url, "tok-1", "run-o", attempt=0, rank=0, spool_dir=c.options.spool_dir)
        print("handler", signal.getsignal(signal.SIGTERM).__name__, file=sys.stderr, flush=True)
        print("ready", flush=True)
    """), signal.SIGTERM)
    assert rc == -signal.SIGTERM, (out, err)
    assert "handler framework" in err
    assert out.splitlines() == ["framework handler: 1"]
    assert next_attempt_delivers(ingest, spool) == expected_ids()


def test_an_ignored_sigterm_stays_ignored_and_the_queue_is_spooled_anyway(ingest, spool):
    rc, out, err = signal_when_ready(child(spool, ingest.url, """
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    """, after=f"""
        print("ready", flush=True)
        while c.counters()["spool_events"] < {N}:   # the process lives on after SIGTERM
            time.sleep(0.01)
        print("spooled", c.counters()["spool_events"], flush=True)
        os._exit(0)   # no atexit: only the spool has the events
    """), signal.SIGTERM)
    assert rc == 0, err
    assert out.splitlines()[-1] == f"spooled {N}"
    assert next_attempt_delivers(ingest, spool) == expected_ids()


def test_the_opt_out_leaves_sigterm_alone(ingest, spool):
    """``handle_sigterm=False``: the default action, and the queue dies with the process (what
    the opt-out costs)."""
    rc, _, err = signal_when_ready(child(spool, ingest.url, "", handle_sigterm=False),
                                   signal.SIGTERM)
    assert rc == -signal.SIGTERM, err
    assert next_attempt_delivers(ingest, spool) == []


def test_by_default_the_handler_is_installed_only_for_a_single_process_job(ingest, spool):
    """The default (``handle_sigterm=None``, no ``$RECOVERYDASH_HANDLE_SIGTERM``): a process of
    unknown world size keeps SIGTERM's default action (it dies at once, its queue with it:
    the write-ahead is what keeps a multi-rank job's events); ``world_size=1`` outside torchrun
    installs the handler; ``$RECOVERYDASH_HANDLE_SIGTERM=1`` installs it for any job."""
    rc, _, err = signal_when_ready(child(spool, ingest.url, "", handle_sigterm=None),
                                   signal.SIGTERM)
    assert rc == -signal.SIGTERM, err
    assert next_attempt_delivers(ingest, spool) == []
    rc, _, err = signal_when_ready(child(spool, ingest.url, "", handle_sigterm=None,
                                         world_size=1), signal.SIGTERM)
    assert rc == -signal.SIGTERM, err
    assert next_attempt_delivers(ingest, spool) == expected_ids()
    ingest.stored.clear()
    rc, _, err = signal_when_ready(child(spool, ingest.url, """
        os.environ["RECOVERYDASH_HANDLE_SIGTERM"] = "1"
    """, handle_sigterm=None, world_size=8), signal.SIGTERM)
    assert rc == -signal.SIGTERM, err
    assert next_attempt_delivers(ingest, spool) == expected_ids()


def test_a_process_of_unknown_world_size_installs_the_handler_at_its_single_process_start(
        ingest, spool):
    """World size unknown when the client is made, then ``attempt_started(world_size=1)``: a
    single-process job; the handler is installed then and spools the queue on SIGTERM."""
    rc, _, err = signal_when_ready(child(spool, ingest.url, "", handle_sigterm=None, after="""
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        c.attempt_started(world_size=1, dataset_version="ds-1")
        assert signal.getsignal(signal.SIGTERM).__name__ == "_on_sigterm"
        print("ready", flush=True)
    """), signal.SIGTERM)
    assert rc == -signal.SIGTERM, err
    delivered = next_attempt_delivers(ingest, spool)
    assert [i for i in delivered if ":u" in i] == expected_ids()
    assert [ingest.stored[i]["type"] for i in delivered if ":u" not in i] == ["attempt_started"]


def test_single_process_job(monkeypatch):
    from recoverydash.sdk.client import single_process_job

    for name in ("WORLD_SIZE", "TORCHELASTIC_RUN_ID", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert (single_process_job(None), single_process_job(1), single_process_job(2)) == \
        (False, True, False)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert single_process_job(None) is True
    monkeypatch.setenv("LOCAL_RANK", "0")   # under torchrun, even with one process
    assert single_process_job(None) is False
    monkeypatch.delenv("LOCAL_RANK")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "j1")
    assert single_process_job(1) is False


def test_no_handler_is_installed_outside_the_main_thread():
    import threading

    from recoverydash.sdk import sigterm

    before = signal.getsignal(signal.SIGTERM)
    results = []
    t = threading.Thread(target=lambda: results.append(sigterm.install_sigterm_handler()))
    t.start()
    t.join()
    assert results == [False] or before is sigterm._on_sigterm
    assert signal.getsignal(signal.SIGTERM) is before


# --- write-ahead: what a SIGKILL costs ------------------------------------------------------------

def journals(spool: str, run_id: str = "run-t") -> list[str]:
    folder = os.path.join(spool, run_id)
    return sorted(e for e in os.listdir(folder) if ".ahead-" in e and not e.startswith("."))


WAIT_FOR_JOURNAL = """
        def journal_holds(n):   # waits for the sender's write-ahead file of n events
            while not any(".ahead-" in e and f"-n{n}.batch" in e
                          for e in os.listdir(c._worker.spool.folder)):
                time.sleep(0.005)
"""


def test_sigkill_loses_at_most_the_events_of_the_write_ahead_bound(ingest, spool):
    """Before: with a 60 s flush interval a SIGKILL lost every event of the last minute (here
    1,234 + 100). Now the events queued for ``write_ahead_s`` are in the spool's write-ahead
    file: the 1,234 queued before it was written arrive, and of the 100 queued after it at most
    those 100 are missing; exactly the events the file held at the kill arrive."""
    M = 100
    rc, _, err = signal_when_ready(child(spool, ingest.url, "", write_ahead_s=0.3, after=(
        WAIT_FOR_JOURNAL + f"""
        journal_holds({N})
        for u in range({N} + 1, {N + M} + 1):
            c.update_committed(u, [])
        print("ready", flush=True)
    """)), signal.SIGKILL)
    assert rc == -signal.SIGKILL, err
    assert ingest.requests == []
    [journal] = journals(spool)   # what the killed process had written ahead
    kept = int(journal.split("-n")[1].split(".")[0])
    assert N <= kept <= N + M
    assert next_attempt_delivers(ingest, spool) == expected_ids(kept)
    assert journals(spool) == []  # released as a batch and sent


def test_sigterm_after_a_write_ahead_delivers_everything_oldest_first(ingest, spool):
    """The write-ahead file (events 1..1,234) and the SIGTERM handler's batch (1,235..1,334) are
    both in the spool: the next attempt sends them in time order, each event once."""
    rc, _, err = signal_when_ready(child(spool, ingest.url, "", write_ahead_s=0.3, after=(
        WAIT_FOR_JOURNAL + f"""
        journal_holds({N})
        c._worker.write_ahead_s = 0   # the next events stay in memory: only SIGTERM writes them
        for u in range({N} + 1, {N + 100} + 1):
            c.update_committed(u, [])
        print("ready", flush=True)
    """)), signal.SIGTERM)
    assert rc == -signal.SIGTERM, err
    assert next_attempt_delivers(ingest, spool) == expected_ids(N + 100)
    sent = [e["update"] for r in ingest.requests for e in r["events"]]
    assert sent == list(range(1, N + 101))


def test_a_live_client_sends_written_ahead_events_once_and_removes_the_file(ingest, spool):
    c = Client(ingest.url, "tok-1", "run-t", attempt=3, rank=0, spool_dir=spool,
               flush_interval=60.0, write_ahead_s=0.05, handle_sigterm=False)
    try:
        for u in range(1, 6):
            c.update_committed(u, [])
        end = time.monotonic() + 20
        while not journals(spool) and time.monotonic() < end:
            time.sleep(0.01)
        [journal] = journals(spool)
        assert journal.endswith(f".batch.ahead-{os.getpid()}") and "-n5.batch" in journal
        counters = c.counters()
        assert counters["written_ahead"] == 5 and counters["pending"] == 5
        assert counters["spool_events"] == 0 and ingest.requests == []
        assert c.flush(10)
        assert sorted(ingest.stored) == expected_ids(5)
        assert set(ingest.deliveries.values()) == {1}
        assert journals(spool) == [] and c.counters()["pending"] == 0
    finally:
        c.close(0.5)


def test_a_write_ahead_file_left_by_an_earlier_holder_of_this_pid_is_sent(ingest, spool):
    """In a container the restarted trainer often gets the pid of the killed one: a write-ahead
    file named with this pid that this process did not write is released and sent too."""
    import gzip
    import json

    folder = os.path.join(spool, "run-t")
    os.makedirs(folder)
    events = [{"type": "update_committed", "run_id": "run-t", "attempt": 3, "rank": 0,
               "update": u, "spans": [], "time": "2026-12-01T00:00:00.000+00:00",
               "event_id": f"run-t:3:0:u{u}"} for u in (1, 2, 3)]
    pid = os.getpid()
    name = f"{time.time_ns():020d}-{pid}-00000000-n3.batch.ahead-{pid}"
    with open(os.path.join(folder, name), "wb") as f:
        f.write(gzip.compress(json.dumps({"events": events}).encode()))
    assert next_attempt_delivers(ingest, spool) == expected_ids(3)
    assert journals(spool) == []
