"""resume_torchtitan and the contract watch_torchtitan declares, without a training run or a
server (runs with ``-p no:django``): the manager's own ``load(step=N)`` gets the newest
*restorable* step (not the newest folder), nothing is loaded when nothing is restorable, and
``attempt_started`` carries torchtitan's contract unless ``rec.start`` names one."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("torch")

from recoverydash.integrations._checkpoints import generation_name
from recoverydash.integrations.torchtitan import REQUIRED, resume_torchtitan, watch_torchtitan
from recoverydash.sdk.checkpoint import publish_files
from recoverydash.sdk.observe import ObservedRecorder
from tests.sdk.test_ledger import CaptureClient

DATASET = "text-v1"


class Manager:
    """The parts of torchtitan's CheckpointManager the integration uses; ``load`` records."""

    def __init__(self, folder, enable=True, loads=True):
        self.folder, self.enable, self.loads = str(folder), enable, loads
        self.loaded: list[int] = []

    def load(self, step: int = -1) -> bool:
        self.loaded.append(step)
        return self.loads

    def save(self, curr_step: int, last_step: bool = False) -> bool:
        return False


def recorder() -> ObservedRecorder:
    return ObservedRecorder(CaptureClient(rank=0), rank=0, world_size=1, dataset_version=DATASET,
                            heartbeat_interval=0, start_timeout=0)


def step_folder(loc, step: int) -> str:
    """A ``step-N/`` DCP folder (two files), published as torchtitan's watch publishes it."""
    folder = os.path.join(loc, f"step-{step}")
    os.makedirs(folder)
    files = []
    for name, data in ((".metadata", b"m" * 40), ("__0_0.distcp", b"w" * 200)):
        files.append(os.path.join(folder, name))
        with open(files[-1], "wb") as f:
            f.write(data)
    gen = generation_name(step, 0)
    assert publish_files(str(loc), gen, step, {c: files for c in REQUIRED + ["train_state"]},
                         data_progress={"cursor": []}, dataset_version=DATASET, world_size=1,
                         required_components=REQUIRED, shard="dcp").published
    return folder


def test_the_newest_restorable_step_is_loaded_and_named(tmp_path):
    step_folder(tmp_path, 5)
    newest = step_folder(tmp_path, 10)
    with open(os.path.join(newest, "__0_0.distcp"), "r+b") as f:  # torn after .metadata
        f.truncate(50)
    manager = Manager(tmp_path)
    assert resume_torchtitan(manager, recorder()) == {"generation_id": "u000000005-a0",
                                                      "update": 5}
    assert manager.loaded == [5]  # torchtitan's load(step=-1) would take step-10


def test_nothing_restorable_loads_nothing(tmp_path):
    os.makedirs(tmp_path / "step-10")  # a folder, never published
    manager = Manager(tmp_path)
    assert resume_torchtitan(manager, recorder()) is None
    assert manager.loaded == []


def test_a_disabled_manager_or_a_load_that_fails_is_a_fresh_start(tmp_path):
    step_folder(tmp_path, 5)
    assert resume_torchtitan(Manager(tmp_path, enable=False), recorder()) is None
    refused = Manager(tmp_path, loads=False)
    assert resume_torchtitan(refused, recorder()) is None
    assert refused.loaded == [5]


class Loader:
    dataset = None  # not a packing text dataset: no positions, logged


@pytest.mark.parametrize("given, sent", [
    ({}, {"required_components": REQUIRED}),
    ({"contract": {"required_components": ["model"]}}, {"required_components": ["model"]}),
])
def test_attempt_started_declares_torchtitans_contract_unless_start_names_one(tmp_path, given,
                                                                              sent):
    rec = recorder()
    watch_torchtitan(Manager(tmp_path), Loader(), rec)
    rec.start(resumed_from=None, **given)
    rec.end("completed")
    (started,) = rec.client.of("attempt_started")
    assert started["contract"] == sent
    assert "rng" not in REQUIRED
