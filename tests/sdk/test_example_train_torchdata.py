"""examples/train_torchdata.py against the real server (pytest-django's live_server): a
StatefulDataLoader with 2 worker processes, launched twice, the first launch crashing in epoch 1
after a checkpoint, the second restoring the loader's state from it (and, in another run, not
restoring it). Restored: every generation restorable, the restart exact; not restored: a replay
of exactly what the checkpoint's part of the epoch had consumed.

Needs Django and a database: run without ``-p no:django``, e.g.
``DATABASE_URL=postgres://postgres@127.0.0.1:5432/test .venv/bin/python -m pytest
tests/sdk/test_example_train_ddp.py``."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

pytest.importorskip("django")
pytest.importorskip("torch")
if "pytest_django.plugin" not in sys.modules:  # run with -p no:django: nothing to serve
    pytest.skip("needs the pytest-django plugin (run without -p no:django)",
                allow_module_level=True)

from .conftest import REPO
from .conftest import api_get as get

pytestmark = pytest.mark.slow

SCRIPT = REPO / "examples" / "train_torchdata.py"
RUN = "example-torchdata"
# 96 samples, microbatch 4, accumulation 2: 8 samples per update, 12 updates per epoch.
# Checkpoints at 5, 10 and 15; the crash at 17 (epoch 1); the resume from 15 (mid epoch 1) to 20.
ARGS = ["--updates", "20", "--save-every", "5", "--samples", "96", "--micro", "4",
        "--accum", "2", "--workers", "2"]


def launch(args, env, cwd):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=240, check=False)


def settled(live_server, token, run):
    deadline = time.monotonic() + 60
    while True:
        report = get(live_server, token, f"/api/v1/runs/{run}/recovery")
        done = not report["pending_analysis"] and report["restarts"] and \
            report["restarts"][0]["verdict"] != "unverified"
        if done or time.monotonic() > deadline:
            return report
        time.sleep(0.5)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("restore", [True, False])
def test_the_torchdata_example_crashes_resumes_and_the_server_says_what_the_loader_did(
        live_server, full_token, tmp_path, trainer_env, restore):
    env = trainer_env
    run = f"{RUN}-{'restored' if restore else 'fresh'}"
    common = ["--url", live_server.url, "--token", full_token, "--location", "ckpt",
              "--run-id", run, *ARGS]
    first = launch([*common, "--crash-at-update", "17"], env, tmp_path)
    assert first.returncode == 3, first.stdout + first.stderr[-3000:]
    assert "attempt 0: fresh start" in first.stdout
    second = launch(common + ([] if restore else ["--no-restore-loader"]), env, tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "attempt 1: resumed u000000015-a0 at update 15" in second.stdout
    assert "attempt 1: completed at update 20" in second.stdout

    report = settled(live_server, full_token, run)
    (restart,) = report["restarts"]
    assert restart["resumed_from"] == "u000000015-a0" and restart["lost_updates"] == 2
    (main,) = report["strata"]
    if restore:
        assert (restart["verdict"], restart["replayed"], restart["omitted"]) == ("exact", 0, 0)
        assert restart["resume_cursor"] == [{"stratum": "main", "epoch": 1, "position": 24}]
        gens = {g["generation_id"]: g["status"] for g in report["generations"]}
        assert gens == {"u000000005-a0": "restorable", "u000000010-a0": "restorable",
                        "u000000015-a0": "restorable", "u000000020-a1": "restorable"}
        assert (main["consumed"], main["duplicates"], main["omissions"]) == (20 * 8, 0, 0)
    else:
        # a fresh loader starts epoch 0 again, in the same order: the 40 positions of its 5
        # updates were all consumed by updates 1-12 of the lineage
        assert (restart["verdict"], restart["replayed"], restart["omitted"]) == \
            ("replay", 5 * 8, 0), restart
        assert restart["resume_cursor"] == [{"stratum": "main", "epoch": 0, "position": 0}]
        assert (main["consumed"], main["duplicates"]) == (20 * 8, 5 * 8)
