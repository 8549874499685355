"""The pieces of the HF and Lightning integrations that need no training run: generation names,
manifests retired when a framework rewrites or deletes its files, choosing the checkpoint to
resume (also when the server's choice was damaged since), the component maps, and that nothing
raises into training. Runs without Django (``-p no:django``)."""

from __future__ import annotations

import http.server
import json
import os
import threading

import pytest

from recoverydash.checkpoints.objects import MANIFEST_NAME
from recoverydash.integrations._checkpoints import (
    free_generation_id,
    generation_name,
    manifest_naming,
    remove_manifest,
    resume_path,
    retire_manifests,
)
from recoverydash.sdk.checkpoint import publish_files

COMPONENTS = ["model", "optimizer", "scheduler", "rng", "data_progress"]


def write(path, data: bytes = b"x" * 100) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


def hf_checkpoint(loc, update: int, attempt: int = 0, data: bytes = b"w" * 64) -> str:
    """A checkpoint-N folder as Trainer writes it, published as u<N>-a<attempt>."""
    folder = os.path.join(loc, f"checkpoint-{update}")
    files = {"model": write(os.path.join(folder, "model.safetensors"), data),
             "optimizer": write(os.path.join(folder, "optimizer.pt"), data + b"o"),
             "scheduler": write(os.path.join(folder, "scheduler.pt")),
             "rng": write(os.path.join(folder, "rng_state.pth")),
             "data_progress": write(os.path.join(folder, "trainer_state.json"), b"{}")}
    gen = generation_name(update, attempt)
    assert publish_files(loc, gen, update, files, data_progress={"cursor": []})
    return gen


def hf_folder(manifest, loc):
    from recoverydash.integrations.hf import checkpoint_folder

    return checkpoint_folder(manifest, loc)


def test_it_names_generations_by_update_attempt_and_file():
    assert generation_name(10, 0) == "u000000010-a0"
    assert generation_name(10, 2, "epoch=0-step=10") == "u000000010-a2-epoch=0-step=10"
    assert generation_name(7, 1, "my ckpt/v2") == "u000000007-a1-my_ckpt_v2"


def test_it_never_reuses_a_published_generation_id(tmp_path):
    loc = str(tmp_path)
    assert free_generation_id(loc, "u000000005-a0") == "u000000005-a0"
    write(tmp_path / "u000000005-a0" / MANIFEST_NAME, b"{}")
    write(tmp_path / "u000000005-a0-2" / MANIFEST_NAME, b"{}")
    assert free_generation_id(loc, "u000000005-a0") == "u000000005-a0-3"


def test_a_rewritten_checkpoint_retires_only_the_manifests_of_its_earlier_bytes(tmp_path):
    loc = str(tmp_path)
    old = hf_checkpoint(loc, 10, attempt=0)
    keep = hf_checkpoint(loc, 5, attempt=0)
    assert retire_manifests(loc, tmp_path / "checkpoint-10") == ["u000000010-a0"]
    assert not (tmp_path / old).exists()
    assert (tmp_path / keep / MANIFEST_NAME).exists()
    assert (tmp_path / "checkpoint-10" / "model.safetensors").exists()  # the files are Trainer's
    assert retire_manifests(loc, tmp_path / "checkpoint-10") == []


def test_only_a_manifest_folder_that_holds_nothing_else_is_removed(tmp_path):
    gen = hf_checkpoint(str(tmp_path), 5)
    write(tmp_path / gen / "notes.txt")
    assert remove_manifest(str(tmp_path), gen) is False
    os.unlink(tmp_path / gen / "notes.txt")
    assert remove_manifest(str(tmp_path), gen) is True
    assert remove_manifest(str(tmp_path), gen) is False  # gone already: no error


def test_resume_skips_a_truncated_checkpoint_and_keeps_a_relative_folder_relative(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    hf_checkpoint("out", 5)
    hf_checkpoint("out", 10)
    assert resume_path("out", hf_folder) == os.path.join("out", "checkpoint-10")
    weights = tmp_path / "out" / "checkpoint-10" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:10])
    assert resume_path("out", hf_folder) == os.path.join("out", "checkpoint-5")
    assert manifest_naming("out", "out/checkpoint-5", update=5)["generation_id"] == \
        "u000000005-a0"
    assert resume_path(tmp_path / "nothing-here", hf_folder) is None


class _Plan(http.server.BaseHTTPRequestHandler):
    """GET .../restore-plan answers the generation in ``self.server.plan``."""

    def log_message(self, *a):
        pass

    def do_GET(self):
        body = json.dumps(self.server.plan).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def plan_server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Plan)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_the_servers_choice_is_verified_in_storage_before_it_is_resumed(tmp_path, plan_server):
    loc = str(tmp_path)
    hf_checkpoint(loc, 5)
    hf_checkpoint(loc, 10)
    hf_checkpoint(loc, 15)  # newer than the server's choice: never taken over it
    url = f"http://127.0.0.1:{plan_server.server_address[1]}"
    plan_server.plan = {"generation_id": "u000000010-a0", "update": 10, "cursor": [],
                        "objects": [], "warnings": []}
    assert resume_path(loc, hf_folder, url=url, token="t", run_id="r") == \
        os.path.join(loc, "checkpoint-10")
    (tmp_path / "checkpoint-10" / "optimizer.pt").write_bytes(b"o" * 65)  # same size, new bytes
    assert resume_path(loc, hf_folder, url=url, token="t", run_id="r") == \
        os.path.join(loc, "checkpoint-5")


NEWER_PLAN = {"generation_id": "u000000010-a0", "update": 10, "cursor": [], "objects": [],
              "warnings": [], "newer_undecided": [
                  {"generation_id": "u000000015-a0", "update": 15, "status": "committed"}]}
NEWER_LOGGED = ("recoverydash: restore plan: newer_undecided: the server names u000000010-a0 "
                "(update 10) while newer generations are not decided yet: u000000015-a0 "
                "(update 15, committed); resuming now redoes the updates after 10 should one "
                "prove restorable")


def test_the_hf_resume_keeps_the_servers_choice_and_logs_a_newer_undecided_one(
        tmp_path, plan_server, caplog):
    from recoverydash.integrations.hf import resume_checkpoint

    loc = str(tmp_path)
    hf_checkpoint(loc, 10)
    hf_checkpoint(loc, 15)  # committed, not verified by the server yet
    plan_server.plan = NEWER_PLAN
    url = f"http://127.0.0.1:{plan_server.server_address[1]}"
    with caplog.at_level("WARNING", logger="recoverydash"):
        assert resume_checkpoint(loc, url=url, token="t", run_id="r") == \
            os.path.join(loc, "checkpoint-10")
    assert [r.getMessage() for r in caplog.records
            if "newer_undecided" in r.getMessage()] == [NEWER_LOGGED]


def test_the_lightning_resume_keeps_the_servers_choice_and_logs_a_newer_undecided_one(
        tmp_path, plan_server, caplog):
    pytest.importorskip("lightning")
    from recoverydash.integrations.lightning import resume_checkpoint

    loc = str(tmp_path)
    for update in (10, 15):
        path = write(os.path.join(loc, f"step{update}.ckpt"), b"ckpt" * update)
        assert publish_files(loc, generation_name(update, 0), update, {"model": path},
                             data_progress={"cursor": []})
    plan_server.plan = NEWER_PLAN
    url = f"http://127.0.0.1:{plan_server.server_address[1]}"
    with caplog.at_level("WARNING", logger="recoverydash"):
        assert resume_checkpoint(loc, url=url, token="t", run_id="r") == \
            os.path.join(loc, "step10.ckpt")
    assert [r.getMessage() for r in caplog.records
            if "newer_undecided" in r.getMessage()] == [NEWER_LOGGED]


def test_hf_files_map_to_the_components_they_hold():
    pytest.importorskip("transformers")
    from recoverydash.integrations.hf import component_of

    assert {n: component_of(n) for n in [
        "model.safetensors", "model-00001-of-00002.safetensors", "pytorch_model.bin",
        "model.safetensors.index.json", "config.json", "optimizer.pt", "scheduler.pt",
        "rng_state.pth", "rng_state_3.pth", "trainer_state.json", "training_args.bin",
        "scaler.pt", "tokenizer.json", "pytorch_model_fsdp_0/__1_0.distcp",
        "pytorch_model_fsdp_0/.metadata", "optimizer_0/__1_0.distcp", "README.md"]} == {
        "model.safetensors": "model", "model-00001-of-00002.safetensors": "model",
        "pytorch_model.bin": "model", "model.safetensors.index.json": "config",
        "config.json": "config", "optimizer.pt": "optimizer", "scheduler.pt": "scheduler",
        "rng_state.pth": "rng", "rng_state_3.pth": "rng", "trainer_state.json": "data_progress",
        "training_args.bin": "training_args", "scaler.pt": "scaler",
        "tokenizer.json": "tokenizer", "pytorch_model_fsdp_0/__1_0.distcp": "model",
        "pytorch_model_fsdp_0/.metadata": "config", "optimizer_0/__1_0.distcp": "optimizer",
        "README.md": "other"}


def test_each_rank_describes_the_files_it_wrote(tmp_path):
    pytest.importorskip("transformers")
    from recoverydash.integrations.hf import checkpoint_files

    for name in ["model.safetensors", "optimizer.pt", "rng_state_0.pth", "rng_state_1.pth",
                 "trainer_state.json"]:
        write(tmp_path / name)
    rank0 = checkpoint_files(str(tmp_path), 0, 2)
    rank1 = checkpoint_files(str(tmp_path), 1, 2)
    names = {c: sorted(os.path.basename(p) for p in ps) for c, ps in rank0.items()}
    assert names == {"model": ["model.safetensors"], "optimizer": ["optimizer.pt"],
                     "rng": ["rng_state_0.pth"], "data_progress": ["trainer_state.json"]}
    assert {c: [os.path.basename(p) for p in ps] for c, ps in rank1.items()} == \
        {"rng": ["rng_state_1.pth"]}


def test_a_lightning_checkpoint_says_what_it_holds_from_the_saved_dict():
    pytest.importorskip("lightning")
    from recoverydash.integrations.lightning import checkpoint_components

    key = "RecoverydashCallback"
    full = {"state_dict": {}, "optimizer_states": [{}], "lr_schedulers": [{}], "loops": {},
            "callbacks": {key: {"ranks": [{"rng": {"torch": 1}}]}}}
    assert checkpoint_components(full, key) == COMPONENTS[:3] + ["data_progress", "rng"]
    weights_only = {"state_dict": {}, "loops": {}, "callbacks": {}}
    assert checkpoint_components(weights_only, key) == ["model", "data_progress"]


def test_a_lightning_resave_under_a_taken_id_is_published_under_the_next_one(tmp_path):
    """A relaunch that reuses its attempt number saves update 5 again: the id is taken by the
    earlier launch's manifest (of another file), so this save gets -2; nothing raises."""
    pytest.importorskip("lightning")
    from recoverydash.integrations.lightning import RecoverydashCallback, _PublishingCheckpointIO
    from recoverydash.sdk.client import Client

    class Inner:
        def save_checkpoint(self, checkpoint, path, storage_options=None):
            write(path, b"ckpt" * 10)

        def remove_checkpoint(self, path):
            os.unlink(path)

    cb = RecoverydashCallback(client=Client(None, None, "r", attempt=0))
    io = _PublishingCheckpointIO(Inner(), cb)
    ckpt = {"global_step": 5, "state_dict": {}, "optimizer_states": [{}], "loops": {},
            "callbacks": {cb.state_key: {"ranks": [{"rng": {"torch": 0}}], "cursor": [
                {"stratum": "main", "epoch": 0, "position": 20}]}}}
    taken = tmp_path / "u000000005-a0-step5"
    write(taken / MANIFEST_NAME, json.dumps({"generation_id": "u000000005-a0-step5",
                                             "update": 5, "objects": []}).encode())
    io.save_checkpoint(ckpt, str(tmp_path / "step5.ckpt"))
    manifest = json.loads((tmp_path / "u000000005-a0-step5-2" / MANIFEST_NAME).read_text())
    (obj,) = manifest["objects"]
    assert obj["components"] == ["model", "optimizer", "data_progress", "rng"]
    assert manifest["data_progress"]["cursor"] == [{"stratum": "main", "epoch": 0,
                                                    "position": 20}]
    # the same file written again (last.ckpt): its earlier manifest is retired first
    ckpt["global_step"] = 6
    io.save_checkpoint(ckpt, str(tmp_path / "step5.ckpt"))
    assert not (tmp_path / "u000000005-a0-step5-2").exists()
    assert (tmp_path / "u000000006-a0-step5" / MANIFEST_NAME).exists()
    # Lightning's retention deletes the file: its manifest goes with it
    io.remove_checkpoint(str(tmp_path / "step5.ckpt"))
    assert not (tmp_path / "u000000006-a0-step5").exists()
    assert (taken / MANIFEST_NAME).exists()  # not ours to remove


def test_a_loader_built_by_a_framework_carries_positions_in_place():
    """What the HF callback does to accelerate's prepared loader, and Lightning's to its own."""
    pytest.importorskip("accelerate")
    import torch
    from accelerate import Accelerator
    from torch.utils.data import DataLoader, TensorDataset

    from recoverydash.integrations._prepared import observe_built_loader
    from recoverydash.sdk.client import Client
    from recoverydash.sdk.observe import ObservedRecorder, strip

    data = TensorDataset(torch.arange(12).float())
    for loader, _batch in [(Accelerator(cpu=True).prepare(DataLoader(data, batch_size=4,
                                                                     shuffle=True)), 4),
                           (DataLoader(data, batch_size=None), None)]:
        rec = ObservedRecorder(Client(None, None, "r", attempt=0), rank=0, world_size=1)
        assert observe_built_loader(loader, rec) == "positions"
        seen = []
        for b in loader:
            clean, tag = strip(b)
            rec.record(tag)
            seen.append(clean[0].reshape(-1).tolist())
        rec.commit(1)
        assert sorted(v for part in seen for v in part) == [float(i) for i in range(12)]
        assert rec.cursor() == [{"stratum": "main", "epoch": 0, "position": 12}]
        assert rec.counters()["unobserved_batches"] == 0


def test_a_checkpoint_trainer_rotated_away_takes_its_manifest(tmp_path):
    """save_total_limit: Trainer deletes checkpoint-5 after writing checkpoint-10."""
    pytest.importorskip("transformers")
    import shutil

    from recoverydash.integrations.hf import RecoverydashCallback

    old, new = hf_checkpoint(str(tmp_path), 5), hf_checkpoint(str(tmp_path), 10)
    cb = RecoverydashCallback()
    cb.location = str(tmp_path)
    cb._published = {"checkpoint-5": old, "checkpoint-10": new}
    shutil.rmtree(tmp_path / "checkpoint-5")
    cb._forget_rotated()
    assert not (tmp_path / old).exists()
    assert (tmp_path / new / MANIFEST_NAME).exists()
    assert cb._published == {"checkpoint-10": new}


def test_the_declared_contract_follows_what_the_framework_knows_of_the_scheduler():
    from recoverydash.integrations._watch import Watch

    assert Watch().contract_for(True) == {}  # the default holds: nothing declared
    assert Watch().contract_for(None) == {}  # not known: the default
    w = Watch()
    assert w.contract_for(False) == {"contract": {"required_components": [
        "model", "optimizer", "rng", "data_progress"]}}
    assert w.required_components == ["model", "optimizer", "rng", "data_progress"]
    given = Watch(required_components=["model", "optimizer"])
    assert given.contract_for(True) == {"contract": {"required_components": ["model",
                                                                             "optimizer"]}}


def test_a_lightning_module_without_a_scheduler_declares_so_and_its_manifests_agree(tmp_path,
                                                                                    caplog):
    """A fit without an LR scheduler: the callback's attempt_started carries the contract
    without ``scheduler``, the manifests carry the same list, and no save warns of a missing
    component (before, every generation was rejected ``component_missing: scheduler``)."""
    pl = pytest.importorskip("lightning.pytorch")
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from recoverydash.integrations.lightning import RecoverydashCallback
    from recoverydash.sdk.client import Client
    from recoverydash.sdk.guard import ONCE

    class NoScheduler(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    ONCE.reset()
    client = Client(None, None, "pl-no-sched", attempt=0, rank=0)
    cb = RecoverydashCallback(client=client, dataset_version="d")
    data = TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
    trainer = pl.Trainer(max_steps=4, accelerator="cpu", logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[cb, pl.callbacks.ModelCheckpoint(
                             dirpath=str(tmp_path), every_n_train_steps=2, save_top_k=-1)])
    trainer.fit(NoScheduler(), DataLoader(data, batch_size=4))
    without = ["model", "optimizer", "rng", "data_progress"]
    assert client.contract == {"required_components": without}
    manifests = [json.loads((tmp_path / d / MANIFEST_NAME).read_text())
                 for d in sorted(os.listdir(tmp_path)) if (tmp_path / d / MANIFEST_NAME).exists()]
    assert [m["update"] for m in manifests] == [2, 4]
    assert all(m["required_components"] == without for m in manifests)
    assert not [r for r in caplog.records if "which the run's contract requires"
                in r.getMessage()]
