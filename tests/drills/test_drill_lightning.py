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

import json
import sys

import pytest

pytest.importorskip("django")
pytest.importorskip("torch")
pytest.importorskip("lightning")
if "pytest_django.plugin" not in sys.modules:
    pytest.skip("needs the pytest-django plugin (run without -p no:django)",
                allow_module_level=True)

from sdk.conftest import REPO

from recoverydash.sdk.drill import DrillOptions, run_drill, table

pytestmark = pytest.mark.slow

G2, G4 = "u000000002-a0-epoch=0-step=2", "u000000004-a0-epoch=0-step=4"
POINTS = ("before_shards", "during_shard", "before_commit", "after_commit",
          "corrupt_after_commit")


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
    assert report["control"]["updates"] == 8, report["control"]
    by = {d["point"]: d for d in report["drills"]}
    assert {p: (d["expected"], d["restored"]) for p, d in by.items()} == {
        "before_shards": (G2, G2), "during_shard": (G2, G2), "before_commit": (G2, G2),
        "after_commit": (G4, G4), "corrupt_after_commit": (G2, G2)}
    assert by["corrupt_after_commit"]["corrupted"]["generation_id"] == G4
    for d in report["drills"]:
        assert d["crash"]["reached"] and d["crash"]["returncode"] != 0, d
        assert d["first_divergence"] is None, d
        restored_update = 4 if d["point"] == "after_commit" else 2
        assert d["restored_update"] == restored_update
        assert d["state"] == {"match": True, "first_mismatch": None,
                              "updates_compared": 8 - restored_update}, d
        assert (d["server"]["verdict"], d["server"]["replayed"], d["server"]["omitted"]) == \
            ("exact", 0, 0), d["server"]
        assert d["server"]["resumed_from"] == d["restored"]
        assert d["passed"], d["failures"]
    assert by["during_shard"]["crash"]["generation_id"] == G4
    assert [by[p]["cost"]["lost_updates"] for p in ("before_shards", "after_commit",
                                                   "corrupt_after_commit")] == [2, 0, 3]
    assert report["passed"] is True and report["sent"] is True
    json.dumps(report)


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
