"""The failure drill over examples/hf_trainer.py (HF Transformers Trainer, a tiny GPT-2 built from
a config, synthetic tokens, 1 process) against the real server: the correct trainer passes every
crash point (exact, the parameters' sha256 equal to the control's after the resume, taken by the
global optimizer step hook on the optimizer accelerate wraps); the same trainer with Trainer's
``ignore_data_skip`` fails with the position where its data diverges (a resumed epoch starts
from its first batch).

Geometry: 48 samples, microbatch 4, accumulation 2: 8 positions per update, 6 updates per epoch;
8 updates, ``checkpoint-N`` every 2; the faulted generation is the one of update 4, so the rules
restore u2 (or u4 when its manifest was committed). Crash points: ``before_shards`` fires where
the integration announces the save (Trainer writes ``checkpoint-4`` next), the other three in
``publish_files`` after Trainer wrote the folder (``during_shard`` truncates its largest file)."""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("django")
pytest.importorskip("torch")
pytest.importorskip("transformers")
if "pytest_django.plugin" not in sys.modules:
    pytest.skip("needs the pytest-django plugin (run without -p no:django)",
                allow_module_level=True)

from sdk.conftest import REPO

from drills.expect import POINTS, assert_every_point_passed
from recoverydash.sdk.drill import DrillOptions, run_drill, table

pytestmark = pytest.mark.slow

G2, G4 = "u000000002-a0", "u000000004-a0"


def drill(live_server, token, env, tmp_path, *extra, points):
    command = [sys.executable, str(REPO / "examples" / "hf_trainer.py"), *extra,
               "--url", live_server.url, "--token", token, "--run-id", "{run_id}",
               "--output-dir", "{location}", "--max-steps", "{updates}", "--save-steps", "2",
               "--samples", "48", "--batch", "4", "--accum", "2"]
    env = {**env, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    opts = DrillOptions(command=command, updates=8, at=4, location=str(tmp_path / "ck"),
                        points=points, drill_id="hf", url=live_server.url, token=token,
                        env=env, cwd=str(tmp_path), timeout=300, echo=False)
    report = run_drill(opts)
    print(table(report))
    return report


@pytest.mark.django_db(transaction=True)
def test_it_passes_every_crash_point_of_the_hf_trainer(live_server, full_token, tmp_path,
                                                       trainer_env):
    report = drill(live_server, full_token, trainer_env, tmp_path, points=POINTS)
    by = assert_every_point_passed(report, G2, G4)
    assert by["during_shard"]["crash"]["generation_id"] == G4


@pytest.mark.django_db(transaction=True)
def test_it_fails_the_hf_trainer_that_ignores_its_data_skip(live_server, full_token, tmp_path,
                                                          trainer_env):
    report = drill(live_server, full_token, trainer_env, tmp_path, "--ignore-data-skip",
                   points=("before_commit",))
    (d,) = report["drills"]
    assert (d["expected"], d["restored"]) == (G2, G2)
    # update 3 of the control starts at position 16 (two updates of 8 done); Trainer with
    # ignore_data_skip starts the epoch again at position 0
    assert d["first_divergence"] == {"update": 3, "rank": 0, "index": 0,
                                     "control": ["main", 0, 16], "drill": ["main", 0, 0]}
    assert d["state"]["match"] is False and d["state"]["first_mismatch"] == 3
    assert d["server"]["verdict"] == "replay", d["server"]
    assert not d["passed"] and not report["passed"]
