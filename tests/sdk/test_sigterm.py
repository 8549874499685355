"""What a rank's SDK client keeps when the process is ended by a signal: torchrun sends SIGTERM to
the other ranks when one fails, Slurm sends SIGTERM before SIGKILL, the OOM killer sends SIGKILL.

Each test runs a trainer-like child process (its client pointed at the recording ``ingest``
server, a long flush interval so every event is still in memory), ends it with a signal, then a
client of the next attempt of the same run in this process drains the run's spool: the events of
the ended process arrive with their own event ids and attempt number."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from recoverydash.sdk.client import Client

from .conftest import REPO

N = 1234


def child(spool: str, url: str, body: str, after: str = "", **client_kw) -> subprocess.Popen:
    """A process that runs ``body``, makes a client of run ``run-t`` attempt 3 rank 0 (flush
    interval 60 s: its first periodic send is at least 48 s away; no batch fills), queues ``N``
    update_committed events, prints ``ready``, runs ``after`` and waits to be signalled."""
    kw = ", ".join(f"{k}={v!r}" for k, v in client_kw.items())
    code = textwrap.dedent(f"""
        import os, signal, sys, time
        from recoverydash.sdk.client import Client
        {textwrap.indent(textwrap.dedent(body), ' ' * 8).strip()}
        c = Client({url!r}, "tok-1", "run-t", attempt=3, rank=0, spool_dir={spool!r},
                   flush_interval=60.0, max_flush_interval=60.0, batch_max_events=5000, {kw})
        for u in range(1, {N} + 1):
            c.update_committed(u, [{{"stratum": "main", "epoch": 0, "ranges": [[u, u + 1]]}}])
        print("ready", flush=True)
        {textwrap.indent(textwrap.dedent(after), ' ' * 8).strip()}
        while True:
            time.sleep(0.05)
    """)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("RECOVERYDASH_HANDLE_SIGTERM", None)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def signal_when_ready(proc: subprocess.Popen, sig: int) -> tuple[int, str, str]:
    try:
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
    later = Client(ingest.url, "tok-1", "run-t", attempt=4, rank=0, spool_dir=spool,
                   flush_interval=0.05, handle_sigterm=False)
    try:
        assert later.flush(30)
    finally:
        later.close(0.5)
    return sorted(ingest.stored)


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


def test_an_ignored_sigterm_stays_ignored_and_the_queue_is_spooled_anyway(ingest, spool):
    rc, out, err = signal_when_ready(child(spool, ingest.url, """
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    """, after=f"""
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


def test_no_handler_is_installed_outside_the_main_thread():
    import threading

    from recoverydash.sdk import client as client_mod

    before = signal.getsignal(signal.SIGTERM)
    results = []
    t = threading.Thread(target=lambda: results.append(client_mod.install_sigterm_handler()))
    t.start()
    t.join()
    assert results == [False] or before is client_mod._on_sigterm
    assert signal.getsignal(signal.SIGTERM) is before
