"""examples/train_ddp.py against the real server (pytest-django's live_server): launched twice
with torchrun and 2 gloo ranks, the first launch crashing after a checkpoint, the second resuming
it. Every generation must be restorable, the restart exact, the attempts 0 and 1.

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

SCRIPT = REPO / "examples" / "train_ddp.py"
RUN = "example-ddp"
# 96 samples, 2 ranks, microbatch 4, accumulation 2: 8 samples per rank and update, 6 updates
# per epoch. Checkpoints at 5 and 10; the crash at 13; the resume from 10 (mid epoch 1) to 16.
ARGS = ["--run-id", RUN, "--updates", "16", "--save-every", "5", "--samples", "96",
        "--micro", "4", "--accum", "2"]


def torchrun(args, env, cwd):
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node", "2", str(SCRIPT), *args],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=240,
                          check=False)


@pytest.mark.django_db(transaction=True)
def test_the_example_crashes_resumes_and_the_server_says_exact(live_server, full_token,
                                                               tmp_path, trainer_env):
    env = trainer_env
    common = ["--url", live_server.url, "--token", full_token, "--location", "ckpt", *ARGS]

    first = torchrun([*common, "--crash-at-update", "13"], env, tmp_path)
    assert first.returncode != 0, first.stdout + first.stderr[-3000:]
    assert "attempt 0: fresh start" in first.stdout, first.stderr[-3000:]
    assert "completed" not in first.stdout
    second = torchrun(common, env, tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "attempt 1: resumed u000000010-a0 at update 10 (server)" in second.stdout
    assert "attempt 1: completed at update 16" in second.stdout

    deadline = time.monotonic() + 60
    while True:
        report = get(live_server, full_token, f"/api/v1/runs/{RUN}/recovery")
        if not report["pending_analysis"] or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    gens = {g["generation_id"]: g for g in report["generations"]}
    assert sorted(gens) == ["u000000005-a0", "u000000010-a0", "u000000015-a1"]
    for g in gens.values():
        assert g["status"] == "restorable", g
    assert [gens[k]["attempt"] for k in sorted(gens)] == [0, 0, 1]
    (restart,) = report["restarts"]
    assert restart["attempt"] == 1 and restart["resumed_from"] == "u000000010-a0"
    assert (restart["verdict"], restart["replayed"], restart["omitted"]) == ("exact", 0, 0), \
        restart
    assert restart["resumed_update"] == 10 and restart["lost_updates"] == 3
    (main,) = report["strata"]
    assert (main["duplicates"], main["omissions"]) == (0, 0), main
    # 13 updates of attempt 0, 3 of them rolled back; 6 of attempt 1: 16 in the lineage
    assert main["consumed"] == 16 * 16
    (run,) = [r for r in get(live_server, full_token, "/api/v1/runs") if r["run_id"] == RUN]
    assert (run["attempts"], run["latest_attempt"]) == (2, 1)
