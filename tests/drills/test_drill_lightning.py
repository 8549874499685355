"""The failure drill over examples/lightning_trainer.py (PyTorch Lightning, a small MLP on
synthetic regression data, 1 process) against the real server: with a torchdata
``StatefulDataLoader`` (``--stateful``: Lightning saves and restores the loader mid-epoch) every
crash point passes (exact, the parameters' sha256 equal to the control's after the resume, taken
by the global optimizer step hook on the optimizer Lightning wraps); with the example's plain
``DataLoader`` the drill fails with the position where the data diverges (Lightning iterates a
resumed epoch from its first batch).

Geometry: 64 samples, microbatch 4: 4 positions per update, 16 updates per epoch; 8 updates,
``epoch=0-step=N.ckpt`` every 2; the faulted generation is the one of update 4, so the rules
restore u2 (or u4 when its manifest was committed). Crash points: ``before_shards`` fires where
the integration announces the save (before the ``.ckpt`` is written), the other three in
``publish_files`` after Lightning wrote the file (``during_shard`` truncates the ``.ckpt``)."""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("django")
pytest.importorskip("torch")
pytest.importorskip("lightning")
if "pytest_django.plugin" not in sys.modules:
    pytest.skip("needs the pytest-django plugin (run without -p no:django)",
                allow_module_level=True)

from sdk.conftest import REPO

from drills.expect import POINTS, assert_every_point_passed
from recoverydash.sdk.drill import DrillOptions, run_drill, table

pytestmark = pytest.mark.slow

G2, G4 = "u000000002-a0-epoch=0-step=2", "u000000004-a0-epoch=0-step=4"


def drill(live_server, token, env, tmp_path, *extra, points):
    command = [sys.executable, str(REPO / "examples" / "lightning_trainer.py"), *extra,
               "--url", live_server.url, "--token", token, "--run-id", "{run_id}",
               "--dirpath", "{location}", "--max-steps", "{updates}", "--save-every", "2",
               "--samples", "64", "--batch", "4"]
    opts = DrillOptions(command=command, updates=8, at=4, location=str(tmp_path / "ck"),
                        points=points, drill_id="pl", url=live_server.url, token=token,
                        env=env, cwd=str(tmp_path), timeout=300, echo=False)
    report = run_drill(opts)
    print(table(report))
    return report


@pytest.mark.django_db(transaction=True)
def test_it_passes_every_crash_point_of_the_stateful_lightning_trainer(
        live_server, full_token, tmp_path, trainer_env):
    report = drill(live_server, full_token, trainer_env, tmp_path, "--stateful", points=POINTS)
    by = assert_every_point_passed(report, G2, G4)
    assert by["during_shard"]["crash"]["generation_id"] == G4


@pytest.mark.django_db(transaction=True)
def test_it_fails_the_lightning_trainer_whose_plain_loader_resumes_mid_epoch(
        live_server, full_token, tmp_path, trainer_env):
    report = drill(live_server, full_token, trainer_env, tmp_path, points=("before_commit",))
    (d,) = report["drills"]
    assert (d["expected"], d["restored"]) == (G2, G2)
    # update 3 of the control starts at position 8 (two updates of 4 done); Lightning iterates
    # the plain loader of the resumed epoch from position 0
    assert d["first_divergence"] == {"update": 3, "rank": 0, "index": 0,
                                     "control": ["main", 0, 8], "drill": ["main", 0, 0]}
    assert d["state"]["match"] is False and d["state"]["first_mismatch"] == 3
    assert not d["passed"] and not report["passed"]
