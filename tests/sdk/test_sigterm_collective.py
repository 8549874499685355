"""A rank blocked in a collective still dies of SIGTERM with a default ``Client``.

torchrun ends the surviving ranks with SIGTERM when one fails; they are then most likely inside
a collective in C (``all_reduce`` waiting for the failed rank). Python runs signal handlers only
in the main thread between bytecodes, so a Python SIGTERM handler never runs there: with the
SDK's handler installed (commit 0cc3c56 installed it by default) the rank lived on until
torchrun's SIGKILL 30 s later, every restart 30 s slower and nothing spooled anyway. Now a
default client installs it only for a single-process job (``single_process_job``), and the rank
dies of SIGTERM as without the SDK.

Two gloo processes on the CPU: rank 0 makes a default client and enters ``all_reduce``; rank 1
joins the group and sleeps (never reaching the collective); rank 0 is sent SIGTERM. The bounds
below are guards against a hang, not measurements."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from .conftest import REPO, drained_by_next_attempt, free_port

pytest.importorskip("torch.distributed")

RANK = """
import os, sys, time
import torch
import torch.distributed as dist
from recoverydash.sdk.client import Client
rank = int(sys.argv[1])
url, spool, world_in_env = sys.argv[2], sys.argv[3], sys.argv[4] == "env"
handle = {"default": None, "handler": True}[sys.argv[5]]
if world_in_env:   # env:// rendezvous, as torchrun sets it (WORLD_SIZE in the environment)
    dist.init_process_group("gloo")
else:              # an explicit world size (mp.spawn style): the client cannot know it
    dist.init_process_group("gloo", rank=rank, world_size=2)
if rank == 0:
    c = Client(url, "tok-1", "run-g", attempt=0, rank=0, spool_dir=spool, flush_interval=60,
               handle_sigterm=handle)
    for u in range(1, 11):
        c.update_committed(u, [])
    print("ready", flush=True)
    dist.all_reduce(torch.ones(1))   # rank 1 never joins: blocked here, in C
    print("all_reduce returned", flush=True)
else:
    print("ready", flush=True)
    time.sleep(120)
"""


def next_attempt_delivers(ingest, spool) -> list[str]:
    """A client of attempt 1 of run-g drains its spool; returns the stored event ids."""
    return sorted(drained_by_next_attempt(ingest, spool, "run-g", 1),
                  key=lambda i: int(i.rsplit("u", 1)[1]))


def _ready(proc: subprocess.Popen, timeout: float) -> None:
    ready, _, _ = select.select([proc.stdout], [], [], timeout)  # a guard, not a measurement
    assert ready, "the rank never said ready"
    line = proc.stdout.readline().strip()
    assert line == "ready", (line, proc.stderr.read() if proc.poll() is not None else "")


def rank0_in_all_reduce_gets_sigterm(ingest, spool, world_in_env: str, handle: str) -> str:
    """Runs the two ranks, sends rank 0 SIGTERM inside all_reduce, asserts it dies of SIGTERM
    within 10 s (a guard); returns rank 0's stderr."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RECOVERYDASH_", "TORCHELASTIC_", "LOCAL_RANK", "WORLD_SIZE",
                                "RANK"))}
    env.update(PYTHONPATH=str(REPO), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               OMP_NUM_THREADS="1")
    procs = []
    try:
        for rank in (0, 1):
            renv = dict(env)
            if world_in_env == "env":
                renv.update(RANK=str(rank), WORLD_SIZE="2")
            procs.append(subprocess.Popen(
                [sys.executable, "-c", textwrap.dedent(RANK), str(rank), ingest.url, spool,
                 world_in_env, handle], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                env=renv))
        for proc in procs:
            _ready(proc, 120)
        time.sleep(0.5)   # rank 0 goes from its print into all_reduce (not a measurement)
        assert procs[0].poll() is None, procs[0].stderr.read()
        procs[0].send_signal(signal.SIGTERM)
        assert procs[0].wait(timeout=10) == -signal.SIGTERM, procs[0].stderr.read()
        assert "all_reduce returned" not in procs[0].stdout.read()
        return procs[0].stderr.read()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for stream in (proc.stdout, proc.stderr):
                stream.close()


@pytest.mark.parametrize("world_in_env", ["env", "explicit"])
def test_a_rank_blocked_in_all_reduce_with_a_default_client_dies_of_sigterm(
        ingest, spool, world_in_env):
    """Default client (no handler in a multi-process job): SIGTERM's default action; the ten
    queued events (60 s flush interval, 2 s write-ahead not reached) die with the process."""
    rank0_in_all_reduce_gets_sigterm(ingest, spool, world_in_env, "default")
    assert next_attempt_delivers(ingest, spool) == []


def test_with_the_handler_the_watchdog_spools_and_the_rank_still_dies_of_sigterm(ingest, spool):
    """``handle_sigterm=True``: the Python handler cannot run (main thread in all_reduce); the
    watchdog thread sees SIGTERM on the wakeup fd, spools the ten queued events, restores the
    default action and raises SIGTERM again. Before the watchdog the rank was still alive after
    10 s and spooled nothing."""
    rank0_in_all_reduce_gets_sigterm(ingest, spool, "env", "handler")
    assert next_attempt_delivers(ingest, spool) == [f"run-g:0:0:u{u}" for u in range(1, 11)]


FORKS = """
import os, signal, sys, time
from recoverydash.sdk.client import Client
c = Client(sys.argv[1], "tok-1", "run-f", attempt=0, rank=0, spool_dir=sys.argv[2],
           flush_interval=60, handle_sigterm=True)
for u in range(1, 6):
    c.update_committed(u, [])
r, w = os.pipe()
pid = os.fork()   # as a DataLoader worker is started (multiprocessing's fork)
if pid == 0:
    os.close(1)   # the test reads the parent's output to its end
    os.close(2)
    os.write(w, b"x")   # the at-fork hooks have run
    time.sleep(60)
    os._exit(0)
assert os.read(r, 1) == b"x"
os.kill(pid, signal.SIGTERM)
_, status = os.waitpid(pid, 0)
time.sleep(1.5)   # past the watchdog's 0.5 s: a child's SIGTERM on our pipe would have ended us
print("parent alive; child", os.waitstatus_to_exitcode(status), c.counters()["spooled"],
      flush=True)
"""


def test_a_forked_workers_sigterm_does_not_wake_the_parents_watchdog(ingest, spool):
    """The child inherits the wakeup fd (the parent's pipe); the at-fork hook unsets it, so the
    worker's SIGTERM (it runs the inherited Python handler, spools nothing of the parent's and
    dies of SIGTERM) leaves the parent alone: it lives on, nothing spooled."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECOVERYDASH_")}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(FORKS), ingest.url, spool],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"parent alive; child {-int(signal.SIGTERM)} 0"]
