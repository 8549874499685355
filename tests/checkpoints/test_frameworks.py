"""Checkpoints written by the real Hugging Face Trainer (transformers, a tiny GPT-2 built from a
config with random weights; nothing from the hub) and by Lightning's ModelCheckpoint, then
corrupted: a save killed before its commit file, a truncated file, a weights-only save."""

from __future__ import annotations

import os
import shutil

import pytest

from recoverydash.checkpoints.formats import check

from .conftest import truncate

torch = pytest.importorskip("torch")


def by_id(result):
    return {g.generation_id: g for g in result.generations}


def codes(gen):
    return [r["code"] for r in gen.reasons]


# --- Hugging Face Trainer ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def hf_run(tmp_path_factory):
    """``Trainer.train()`` for 6 updates, saving every 2: checkpoint-2, -4, -6."""
    transformers = pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("hf") / "out"
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64,
                                     n_positions=16)
    model = transformers.GPT2LMHeadModel(config)

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": ids}

    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=6, save_steps=2, save_strategy="steps",
        per_device_train_batch_size=4, report_to=[], use_cpu=True, logging_steps=100,
        disable_tqdm=True, dataloader_num_workers=0, save_total_limit=None)
    transformers.Trainer(model=model, args=args, train_dataset=Tokens()).train()
    return out


def test_hf_trainer_checkpoints_are_restorable_with_their_global_step(hf_run, tmp_path):
    result = check(str(hf_run))
    assert result.format == "hf"
    assert [(g.generation_id, g.status, g.update) for g in result.generations] == \
        [("checkpoint-6", "restorable", 6), ("checkpoint-4", "restorable", 4),
         ("checkpoint-2", "restorable", 2)]
    g = result.generations[0]
    assert set(g.components) >= {"model", "optimizer", "scheduler", "rng", "trainer_state"}
    assert g.commit_marker == "checkpoint-6/trainer_state.json"
    assert g.progress["global_step"] == 6 and g.progress["max_steps"] == 6
    model = next(o for o in g.objects if o.path.endswith("model.safetensors"))
    assert model.declared_size == model.size == os.path.getsize(
        hf_run / "checkpoint-6" / "model.safetensors")


def test_hf_save_killed_before_trainer_state_and_a_truncated_model(hf_run, tmp_path):
    root = tmp_path / "out"
    shutil.copytree(hf_run, root)
    os.remove(root / "checkpoint-6" / "trainer_state.json")  # killed before the last write
    truncate(root / "checkpoint-4" / "model.safetensors")   # killed mid-file / cut copy
    result = check(str(root))
    gens = by_id(result)
    assert (gens["checkpoint-6"].status, codes(gens["checkpoint-6"])) == \
        ("pending", ["never_committed"])
    assert "no trainer_state.json" in gens["checkpoint-6"].reasons[0]["detail"]
    assert (gens["checkpoint-4"].status, codes(gens["checkpoint-4"])) == \
        ("rejected", ["size_mismatch"])
    assert "truncated" in gens["checkpoint-4"].reasons[0]["detail"]
    assert result.restorable.generation_id == "checkpoint-2"


def test_hf_checkpoint_without_optimizer_or_with_a_cut_optimizer(hf_run, tmp_path):
    root = tmp_path / "out"
    shutil.copytree(hf_run, root)
    os.remove(root / "checkpoint-6" / "optimizer.pt")
    truncate(root / "checkpoint-4" / "optimizer.pt")
    gens = by_id(check(str(root)))
    assert (gens["checkpoint-6"].status, codes(gens["checkpoint-6"])) == \
        ("rejected", ["component_missing"])
    assert gens["checkpoint-6"].reasons[0]["detail"].startswith("no optimizer")
    assert (gens["checkpoint-4"].status, codes(gens["checkpoint-4"])) == \
        ("rejected", ["size_mismatch"])
    assert "checkpoint-4/optimizer.pt: zip without a central directory" in \
        gens["checkpoint-4"].reasons[0]["detail"]


def test_hf_rng_files_of_a_multi_process_run_name_its_shards(hf_run, tmp_path):
    root = tmp_path / "out"
    shutil.copytree(hf_run, root)
    ck = root / "checkpoint-6"
    os.rename(ck / "rng_state.pth", ck / "rng_state_0.pth")
    for i in (1, 3):  # process 2 never saved its RNG state
        shutil.copy(ck / "rng_state_0.pth", ck / f"rng_state_{i}.pth")
    g = by_id(check(str(root)))["checkpoint-6"]
    assert g.required_shards == ["rank0", "rank1", "rank2", "rank3"]
    assert (g.status, codes(g)) == ("rejected", ["shard_missing", "object_missing"])


# --- Lightning ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def lightning_run(tmp_path_factory):
    """``Trainer.fit`` for 6 updates with ModelCheckpoint every 2 (all kept), plus a
    weights-only checkpoint."""
    L = pytest.importorskip("lightning")
    root = tmp_path_factory.mktemp("pl")

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, i):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            return [opt], [torch.optim.lr_scheduler.StepLR(opt, 2)]

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(48, 4), torch.randn(48, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    every = L.pytorch.callbacks.ModelCheckpoint(dirpath=root / "checkpoints",
                                                every_n_train_steps=2, save_top_k=-1)
    weights = L.pytorch.callbacks.ModelCheckpoint(dirpath=root / "weights",
                                                  every_n_train_steps=6, save_weights_only=True)
    trainer = L.Trainer(max_steps=6, accelerator="cpu", logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[every, weights])
    trainer.fit(Tiny(), loader)
    return root


def test_lightning_checkpoints_are_read_without_torch_load(lightning_run):
    result = check(str(lightning_run / "checkpoints"))
    assert result.format == "lightning"
    assert [(g.generation_id, g.status, g.update) for g in result.generations] == \
        [("epoch=0-step=6.ckpt", "restorable", 6), ("epoch=0-step=4.ckpt", "restorable", 4),
         ("epoch=0-step=2.ckpt", "restorable", 2)]
    g = result.generations[0]
    assert set(g.components) == {"model", "optimizer", "scheduler", "loops", "progress"}
    assert g.progress["global_step"] == 6 and g.progress["epoch"] == 0


def test_lightning_truncated_newest_and_a_weights_only_save(lightning_run, tmp_path):
    root = tmp_path / "pl"
    shutil.copytree(lightning_run, root)
    truncate(root / "checkpoints" / "epoch=0-step=6.ckpt")
    result = check(str(root))  # finds both folders (.ckpt up to 3 levels down)
    gens = by_id(result)
    cut = gens["checkpoints/epoch=0-step=6.ckpt"]
    assert (cut.status, codes(cut)) == ("rejected", ["size_mismatch"])
    weights = gens["weights/epoch=0-step=6.ckpt"]
    assert (weights.status, codes(weights)) == ("rejected", ["component_missing"])
    assert weights.reasons[0]["detail"].startswith("no optimizer, scheduler")
    assert result.restorable.generation_id == "checkpoints/epoch=0-step=4.ckpt"
