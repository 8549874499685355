"""The attempt rule (recoverydash.sdk.attempt): a new number for every launch of a run, the same
on every rank of one launch; explicit numbers win; a 409 on attempt_started is an error that
names the likely cause."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest

from recoverydash.sdk import Client, write_manifest_atomically
from recoverydash.sdk.attempt import (
    attempt_of_restored,
    highest_in_location,
    resolve_attempt,
    state_path,
)

from .conftest import REPO, free_port

LAUNCH_VARS = ("RECOVERYDASH_ATTEMPT", "TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT",
               "WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for v in LAUNCH_VARS:
        monkeypatch.delenv(v, raising=False)


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    return {**env, "PYTHONPATH": str(REPO), **{k: str(v) for k, v in extra.items()}}


LAUNCH = """
import json, sys
from recoverydash.sdk import Client, CountingRecorder
url, spool, run = sys.argv[1:4]
c = Client(url, "tok", run, rank=0, spool_dir=spool, flush_interval=0.05)
rec = CountingRecorder(c, rank=0, world_size=1, dataset_length=16, heartbeat_interval=0)
rec.start()
rec.consumed(4)
rec.commit(1)
ok = c.flush(10)
print(json.dumps({"attempt": c.attempt, "flushed": ok}))
"""


def launch(ingest, spool, run, **env) -> dict:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(LAUNCH), ingest.url, spool, run],
                         capture_output=True, text=True, env=_env(**env), timeout=60, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_two_plain_launches_of_a_run_get_attempts_0_and_1(ingest, spool):
    # torchrun sets TORCHELASTIC_RESTART_COUNT=0 on every fresh launch: it must not pin attempt 0
    first = launch(ingest, spool, "relaunch", TORCHELASTIC_RESTART_COUNT=0)
    second = launch(ingest, spool, "relaunch", TORCHELASTIC_RESTART_COUNT=0)
    assert (first["attempt"], second["attempt"]) == (0, 1)
    assert first["flushed"] and second["flushed"]
    assert {"relaunch:0:0:start", "relaunch:1:0:start"} <= set(ingest.stored)
    with open(state_path("relaunch", spool)) as f:
        assert json.load(f)["highest"] == 1


def test_the_server_latest_attempt_counts_when_the_host_has_no_state(ingest, spool):
    ingest.runs = [{"run_id": "other", "latest_attempt": 9},
                   {"run_id": "moved", "latest_attempt": 4}]
    c = Client(ingest.url, "tok", "moved", rank=0, spool_dir=spool)
    assert c.attempt == 5
    assert ingest.gets and ingest.gets[0].startswith("/api/v1/runs")
    ingest.runs_status = 403  # a token without the read scope: the source is skipped
    assert Client(ingest.url, "tok", "moved", rank=0, spool_dir=spool).attempt == 6  # state file


def test_a_run_the_server_has_never_seen_starts_at_0(ingest, spool):
    ingest.runs = [{"run_id": "other", "latest_attempt": 9}]
    assert Client(ingest.url, "tok", "new-run", rank=0, spool_dir=spool).attempt == 0


def test_checkpoint_location_manifests_count(tmp_path, spool):
    loc = str(tmp_path / "ckpt")
    for gen, attempt in (("u000000008-a4", 4), ("custom-name", 6), ("u000000004-a1", 1)):
        write_manifest_atomically(loc, {"schema_revision": 1, "generation_id": gen, "update": 1,
                                        "attempt": attempt})
    assert highest_in_location(loc) == 6
    assert resolve_attempt("r", location=loc, spool_dir=spool) == 7
    assert highest_in_location(str(tmp_path / "missing")) is None


def test_the_restored_generation_counts():
    assert attempt_of_restored({"generation_id": "g", "attempt": 2}) == 2
    assert attempt_of_restored({"generation_id": "u000000040-a5", "attempt": None}) == 5
    assert attempt_of_restored({"manifest": {"attempt": 7}}) == 7
    assert attempt_of_restored(None) is None
    assert resolve_attempt("r", restored={"attempt": 2}, spool_dir=False) == 3


def test_explicit_numbers_win(monkeypatch, spool, tmp_path):
    loc = str(tmp_path / "ckpt")
    write_manifest_atomically(loc, {"schema_revision": 1, "generation_id": "u000000001-a3",
                                    "update": 1, "attempt": 3})
    assert resolve_attempt("r", attempt=1, location=loc, spool_dir=spool) == 1
    monkeypatch.setenv("RECOVERYDASH_ATTEMPT", "2")
    assert resolve_attempt("r", location=loc, spool_dir=spool) == 2
    assert Client(None, None, "r", location=loc).attempt == 2
    monkeypatch.delenv("RECOVERYDASH_ATTEMPT")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "9")  # a restart count is a floor only
    assert resolve_attempt("r", location=loc, spool_dir=False) == 9
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    assert resolve_attempt("r", location=loc, spool_dir=False) == 4


RANKS_WITHOUT_DIST = """
import sys
from recoverydash.sdk.attempt import resolve_attempt
print(resolve_attempt(sys.argv[1], spool_dir=sys.argv[2]))
"""


def test_ranks_of_one_launch_without_torch_distributed_share_the_number(spool):
    def one_launch(port):
        env = _env(WORLD_SIZE=4, MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(RANKS_WITHOUT_DIST),
                                   "shared", spool], env={**env, "RANK": str(r)},
                                  stdout=subprocess.PIPE, text=True) for r in range(4)]
        return [int(p.communicate(timeout=60)[0]) for p in procs]

    assert one_launch(free_port()) == [0, 0, 0, 0]
    assert one_launch(free_port()) == [1, 1, 1, 1]


RANKS_WITH_DIST = """
import json, sys
from datetime import timedelta
import torch.distributed as dist
from recoverydash.sdk import Client
dist.init_process_group("gloo", timeout=timedelta(seconds=30))
rank = dist.get_rank()
# each rank has its own spool: only rank 0's state (highest 4) may decide
c = Client(sys.argv[1], "tok", "dist-run", spool_dir=sys.argv[2] + f"/rank{rank}")
print(json.dumps({"rank": rank, "attempt": c.attempt}))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_with_torch_distributed_rank_0_decides_and_broadcasts(ingest, tmp_path):
    pytest.importorskip("torch")
    root = str(tmp_path / "spools")
    os.makedirs(os.path.dirname(state_path("dist-run", root + "/rank0")), exist_ok=True)
    with open(state_path("dist-run", root + "/rank0"), "w") as f:
        json.dump({"highest": 4}, f)
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(RANKS_WITH_DIST),
                               ingest.url, root],
                              env=_env(RANK=r, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1",
                                       MASTER_PORT=port, OMP_NUM_THREADS=1),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    outs = [p.communicate(timeout=90) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    got = sorted(json.loads(o[0].strip().splitlines()[-1])["attempt"] for o in outs)
    assert got == [5, 5]
    assert len(ingest.gets) == 1  # only rank 0 asked the server
    assert not os.path.exists(state_path("dist-run", root + "/rank1"))


def test_a_409_on_attempt_started_is_an_error_naming_the_reused_attempt(ingest, spool, caplog):
    c = Client(ingest.url, "tok", "run-409", attempt=0, rank=0, spool_dir=spool, sync=True)
    ingest.script = [(409, {})]
    with caplog.at_level(logging.ERROR, logger="recoverydash.sdk"):
        c.attempt_started(world_size=1, dataset_version="ds")
    msgs = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("attempt_started" in m and "earlier launch" in m and "run-409" in m
               for m in msgs), msgs
    assert c.counters()["failed"] == 1
    caplog.clear()
    ingest.script = [(409, {})]
    with caplog.at_level(logging.ERROR, logger="recoverydash.sdk"):
        c.heartbeat(1)  # another event's conflict says nothing about attempts
    assert not any("earlier launch" in r.getMessage() for r in caplog.records)
