"""The failure drill over the examples of the large-job pipelines (Megatron-Core datasets, Mosaic
Streaming, torchtitan's checkpoint manager and text dataloader) against the real server: each
correct trainer passes (crashed before its generation of update 4 was committed, it restores
update 2's, its positions and parameters follow the control's, the server says exact); each
broken one (its data state not restored) fails at the position where its data diverges.

Geometry for all three: 8 updates, a generation every 2, the faulted one of update 4, one crash
point (``before_commit``) to keep the suite lean; tests/drills/test_drill_train_ddp.py drills
every point of the protocol."""

from __future__ import annotations

import sys

import pytest

pytest.importorskip("django")
pytest.importorskip("torch")
if "pytest_django.plugin" not in sys.modules:
    pytest.skip("needs the pytest-django plugin (run without -p no:django)",
                allow_module_level=True)

from sdk.conftest import REPO

from recoverydash.sdk.drill import DrillOptions, run_drill, table

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

G2 = "u000000002-a0"

TRAINERS = {
    "megatron": (["megatron_gpt.py", "--location", "{location}", "--updates", "{updates}",
                  "--save-every", "2", "--data", "{data}"], "--no-restore-data"),
    "streaming": (["streaming_train.py", "--location", "{location}", "--updates", "{updates}",
                   "--save-every", "2", "--data", "{data}"], "--no-restore-loader"),
    "torchtitan": (["torchtitan_train.py", "--dump", "{location}", "--checkpoint-folder", ".",
                    "--steps", "{updates}", "--save-every", "2", "--corpus", "{data}"],
                   "--exclude-dataloader"),
}


def drill(live_server, token, env, tmp_path, name, *extra):
    script, *argv = TRAINERS[name][0]
    command = [sys.executable, str(REPO / "examples" / script), *argv, *extra,
               "--url", live_server.url, "--token", token, "--run-id", "{run_id}"]
    command = [c.replace("{data}", str(tmp_path / "data")) for c in command]
    location = str(tmp_path / "ck")
    env = {**env, "HF_HOME": str(tmp_path / "hf")}
    opts = DrillOptions(command=command, updates=8, at=4, location=location,
                        points=("before_commit",), drill_id=name[:8], url=live_server.url,
                        token=token, env=env, cwd=str(tmp_path), timeout=400, echo=False)
    report = run_drill(opts)
    print(table(report))
    return report




@pytest.mark.parametrize("name", sorted(TRAINERS))
def test_the_drill_passes_the_correct_trainer(live_server, full_token, tmp_path, trainer_env,
                                              name):
    report = drill(live_server, full_token, trainer_env, tmp_path, name)
    (d,) = report["drills"]
    assert (d["expected"], d["restored"]) == (G2, G2), d
    assert d["crash"]["reached"] and d["first_divergence"] is None, d
    assert d["state"]["match"] is True, d["state"]
    assert (d["server"]["verdict"], d["server"]["replayed"], d["server"]["omitted"]) == \
        ("exact", 0, 0), d["server"]
    assert d["passed"] and report["passed"], d["failures"]


@pytest.mark.parametrize("name", sorted(TRAINERS))
def test_the_drill_fails_the_trainer_that_does_not_restore_its_data_state(
        live_server, full_token, tmp_path, trainer_env, name):
    report = drill(live_server, full_token, trainer_env, tmp_path, name, TRAINERS[name][1])
    (d,) = report["drills"]
    assert (d["expected"], d["restored"]) == (G2, G2), d
    # update 3 is the first after the restored update 2: its data start over at position 0
    assert d["first_divergence"] is not None and d["first_divergence"]["update"] == 3, d
    assert d["first_divergence"]["drill"][2] == 0, d["first_divergence"]
    assert d["server"]["verdict"] == "replay" and d["server"]["replayed"] > 0, d["server"]
    assert not d["passed"] and not report["passed"]
