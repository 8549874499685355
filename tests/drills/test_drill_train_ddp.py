"""The failure drill over examples/train_ddp.py (2 gloo ranks under torchrun) against the real
server: the correct trainer passes every crash point (exact, the parameters' sha256 equal to the
control's after the resume); two broken variants (tests/drills/broken_ddp.py) fail with the
position where their data diverges and the first update whose state differs.

Geometry: 96 samples, 2 ranks, microbatch 4, accumulation 2: 16 positions per update (8 per
rank, rank r consuming positions r, r+2, ...), 6 updates per epoch; 8 updates, a checkpoint every
2; the faulted generation is the one of update 4, so the rules restore u2 (or u4 when its commit
marker was written)."""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("django")
pytest.importorskip("torch")
if "pytest_django.plugin" not in sys.modules:
    pytest.skip("needs the pytest-django plugin (run without -p no:django)",
                allow_module_level=True)

from sdk.conftest import REPO

from drills.expect import POINTS, assert_every_point_passed
from recoverydash.sdk.drill import DrillOptions, run_drill, table

pytestmark = pytest.mark.slow

G2, G4 = "u000000002-a0", "u000000004-a0"


def drill(live_server, token, env, tmp_path, script, *extra, points):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", "2", str(script), *extra, "--url", live_server.url,
               "--token", token, "--run-id", "{run_id}", "--location", "{location}",
               "--updates", "{updates}", "--save-every", "2", "--samples", "96", "--micro", "4",
               "--accum", "2"]
    opts = DrillOptions(command=command, updates=8, at=4, location=str(tmp_path / "ck"),
                        points=points, drill_id="d1", url=live_server.url, token=token,
                        env=env, cwd=str(tmp_path), timeout=300, echo=False)
    report = run_drill(opts)
    print(table(report))
    return report


@pytest.mark.django_db(transaction=True)
def test_it_passes_every_crash_point_of_the_correct_trainer(live_server, full_token, tmp_path,
                                                            trainer_env):
    report = drill(live_server, full_token, trainer_env, tmp_path,
                   REPO / "examples" / "train_ddp.py",
                   points=POINTS)
    by = assert_every_point_passed(report, G2, G4)
    for d in by.values():
        assert d["cost"]["restore_seconds"] is not None and d["cost"]["restore_seconds"] >= 0
    # sent as drill_result events; every run of the drill is marked as one
    from recoverydash.runs.models import DrillResult, Run

    assert report["sent"] is True
    rows = {r.point: r for r in DrillResult.objects.select_related("run")}
    assert sorted(rows) == sorted(by)
    for p, d in by.items():
        assert (rows[p].run.run_id, rows[p].passed, rows[p].restored_generation,
                rows[p].verdict, rows[p].attempt) == (d["run_id"], True, d["restored"], "exact", 1)
    assert set(Run.objects.filter(is_drill=True).values_list("run_id", flat=True)) == \
        {"d1-control", *(d["run_id"] for d in report["drills"])}


@pytest.mark.django_db(transaction=True)
def test_it_fails_a_loader_that_resumes_at_the_read_cursor(live_server, full_token, tmp_path,
                                                           trainer_env):
    report = drill(live_server, full_token, trainer_env, tmp_path,
                   REPO / "tests" / "drills" / "broken_ddp.py", "--broken", "read_cursor",
                   points=("before_commit",))
    (d,) = report["drills"]
    assert (d["expected"], d["restored"]) == (G2, G2)
    # update 3 of the control starts at position 32 on rank 0; the broken loader saved its read
    # cursor 48 (two microbatches of 4 per rank in flight) and starts there
    assert d["first_divergence"] == {"update": 3, "rank": 0, "index": 0,
                                     "control": ["main", 0, 32], "drill": ["main", 0, 48]}
    assert d["state"]["match"] is False and d["state"]["first_mismatch"] == 3
    assert (d["server"]["verdict"], d["server"]["omitted"]) == ("omission", 16), d["server"]
    assert not d["passed"] and not report["passed"]


@pytest.mark.django_db(transaction=True)
def test_it_fails_a_trainer_that_does_not_restore_the_optimizer(live_server, full_token,
                                                                tmp_path, trainer_env):
    report = drill(live_server, full_token, trainer_env, tmp_path,
                   REPO / "tests" / "drills" / "broken_ddp.py", "--broken", "optimizer",
                   points=("before_commit",))
    (d,) = report["drills"]
    assert (d["expected"], d["restored"]) == (G2, G2)
    assert d["first_divergence"] is None  # the data is right
    assert d["state"] == {"match": False, "first_mismatch": 3, "updates_compared": 0}
    assert d["server"]["verdict"] == "exact"  # the server sees data only: the drill sees more
    assert d["failures"] == ["the state after the resume differs from the control's"]
    assert not report["passed"]
