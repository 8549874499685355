"""The observed ledger against the real server (pytest-django's live_server): a trainer
(``observed_trainer.py``) is SIGKILLed mid-update at a known point and resumed; the server's
verdicts and counts must equal the truth the trainer logged beside the SDK (the dataset indices
the model received per committed update, and the indices the dataset was asked for in its worker
processes).

Needs Django and a database: run without ``-p no:django``, e.g.
``DATABASE_URL=postgres://postgres@127.0.0.1:5432/test .venv/bin/python -m pytest
tests/sdk/test_observed_live.py``."""

from __future__ import annotations

import glob
import json
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("django")
pytest.importorskip("torch")
pytest.importorskip("torchdata")
if "pytest_django.plugin" not in sys.modules:  # run with -p no:django: nothing to serve
    pytest.skip("needs the pytest-django plugin (run without -p no:django)",
                allow_module_level=True)

from .conftest import REPO
from .conftest import api_get as get

pytestmark = pytest.mark.slow

SCRIPT = REPO / "tests" / "sdk" / "observed_trainer.py"
# 96 samples, microbatch 4, accumulation 2: 8 samples per update and rank. Generations at updates
# 4 and (not reached) 8; the job dies after the first microbatch of update 7.
COMMON = ["--samples", "96", "--micro", "4", "--accum", "2", "--updates", "12",
          "--save-every", "4"]


@pytest.fixture
def job(live_server, full_token, tmp_path, trainer_env):
    env = trainer_env
    truth = tmp_path / "truth"
    truth.mkdir()

    def run(run_id, *args):
        cmd = [sys.executable, str(SCRIPT), "--url", live_server.url, "--token", full_token,
               "--run-id", run_id, "--location", "ckpt", "--truth", str(truth), *COMMON, *args]
        return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path,
                              timeout=300, check=False)

    def report(run_id):
        deadline = time.monotonic() + 90
        while True:
            body = get(live_server, full_token, f"/api/v1/runs/{run_id}/recovery")
            restarts = body.get("restarts") or []
            settled = not body["pending_analysis"] and restarts and \
                all(r["verdict"] != "unverified" for r in restarts)
            if settled or time.monotonic() > deadline:
                return body
            time.sleep(0.5)

    return run, report, truth


def crashed(proc):
    """The first launch died by SIGKILL (itself, or a spawned rank: the launcher exits 1)."""
    return proc.returncode in (-signal.SIGKILL, 1) and "completed" not in proc.stdout


def truth_of(folder, attempt):
    """(committed: {update: [indices]}, pending: [indices], fetched: {indices}) of one attempt,
    every rank together."""
    committed, pending, fetched = {}, [], set()
    for path in glob.glob(str(folder / f"train-a{attempt}-r*.jsonl")):
        with open(path) as f:
            for line in f:
                rec = json.loads(line)
                if rec["update"] is None:
                    pending.extend(rec["indices"])
                else:
                    committed.setdefault(rec["update"], []).extend(rec["indices"])
    for path in glob.glob(str(folder / f"fetch-a{attempt}-*.txt")):
        with open(path) as f:
            fetched.update(int(line) for line in f if line.strip())
    return committed, pending, fetched


def expected(folder, resumed_update):
    """The restart's figures computed from the truth alone (every index lies in epoch 0 of one
    order, so an index stands for its position): replayed |K & L_U|, recomputed
    |(K - L_U) & (R | F)|, consumed and duplicates of the lineage."""
    before, _pending, fetched = truth_of(folder, 0)
    after, _, _ = truth_of(folder, 1)
    lineage = [i for u, ids in before.items() if u <= resumed_update for i in ids]
    rolled = {i for u, ids in before.items() if u > resumed_update for i in ids}
    mine = [i for ids in after.values() for i in ids]
    k, lu = set(mine), set(lineage)
    every = lineage + mine
    return {"replayed": len(k & lu), "recomputed": len((k - lu) & (rolled | fetched)),
            "consumed": len(every), "duplicates": len(every) - len(set(every)),
            "fetched_only": len(fetched - lu - rolled), "k": sorted(k), "lineage": sorted(lu)}


def check(report, truth, verdict, resumed="u000000004-a0"):
    want = expected(truth, 4)
    (restart,) = report["restarts"]
    assert restart["resumed_from"] == resumed and restart["resumed_update"] == 4, restart
    got = {k: restart[k] for k in ("verdict", "replayed", "omitted", "recomputed")}
    assert got == {"verdict": verdict, "replayed": want["replayed"], "omitted": 0,
                   "recomputed": want["recomputed"]}, (got, want)
    (main,) = report["strata"]
    assert (main["consumed"], main["duplicates"], main["omissions"]) == \
        (want["consumed"], want["duplicates"], 0), (main, want)
    return restart, want


@pytest.mark.django_db(transaction=True)
def test_statefuldataloader_with_two_workers_restored_resumes_exact(job):
    run, report, truth = job
    first = run("obs-td-restored", "--loader", "torchdata", "--workers", "2", "--crash-at", "7:1")
    assert crashed(first), first.stdout + first.stderr[-3000:]
    second = run("obs-td-restored", "--loader", "torchdata", "--workers", "2")
    assert second.returncode == 0, second.stderr[-3000:]
    restart, want = check(report("obs-td-restored"), truth, "exact")
    # the truth: no index twice, none skipped, and what the workers had only prefetched came back
    assert want["replayed"] == 0 and want["k"] == sorted(set(range(96)) - set(want["lineage"]))
    # read by attempt 0 but never committed: the microbatch in flight (4) and what the workers
    # had prefetched; with updates 5 and 6 (rolled back, 16) all of it is recomputed
    assert want["fetched_only"] > 4
    assert restart["recomputed"] == 2 * 8 + want["fetched_only"]
    assert restart["resume_cursor"] == [{"stratum": "main", "epoch": 0, "position": 32}]


@pytest.mark.django_db(transaction=True)
def test_statefuldataloader_whose_state_is_not_restored_is_a_replay_of_the_replayed_count(job):
    run, report, truth = job
    first = run("obs-td-fresh", "--loader", "torchdata", "--workers", "2", "--crash-at", "7:1")
    assert crashed(first), first.stdout + first.stderr[-3000:]
    second = run("obs-td-fresh", "--loader", "torchdata", "--workers", "2",
                 "--no-restore-loader")
    assert second.returncode == 0, second.stderr[-3000:]
    restart, want = check(report("obs-td-fresh"), truth, "replay")
    assert restart["replayed"] == 32       # updates 1-4 of the epoch trained again
    assert restart["resume_cursor"] == [{"stratum": "main", "epoch": 0, "position": 0}]
    assert "replay" in [f["code"] for f in restart["findings"]]


@pytest.mark.django_db(transaction=True)
def test_a_plain_loop_with_distributedsampler_on_two_gloo_ranks_resumes_exact(job):
    run, report, truth = job
    args = ["--loader", "plain", "--workers", "0", "--nproc", "2", "--micro", "2"]
    first = run("obs-plain-ddp", *args, "--crash-at", "7:1")
    assert crashed(first), first.stdout + first.stderr[-3000:]
    second = run("obs-plain-ddp", *args)
    assert second.returncode == 0, second.stderr[-3000:]
    body = report("obs-plain-ddp")
    restart, want = check(body, truth, "exact")
    assert want["k"] == sorted(set(range(96)) - set(want["lineage"]))[:len(want["k"])]
    assert restart["world_size_before"] == restart["world_size_after"] == 2
    gens = {g["generation_id"]: g["status"] for g in body["generations"]}
    assert gens["u000000004-a0"] == "restorable" and gens["u000000008-a1"] == "restorable"
