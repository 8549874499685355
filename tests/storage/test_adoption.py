"""Adopted folders through the real worker path: a storage location of kind ``adopt`` holding
another tool's checkpoints (torch DCP in torchtitan's layout, Hugging Face Trainer, a DeepSpeed
layout written by hand) becomes a run with generations, statuses and reasons when beat's
``discover_manifests`` task runs, with verification and analysis run eagerly behind it; a
trainer sending events under that run id later joins the same run."""

from __future__ import annotations

import os
import shutil
from datetime import UTC, datetime

import pytest

from recoverydash.runs.models import Generation, Run
from recoverydash.storage.models import KIND_ADOPT
from tests.checkpoints.conftest import dcp_save, deepspeed_save, truncate

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def worker(settings):
    """Run beat's discovery task the way a worker does (eagerly: the verification and analysis
    it enqueues run here too)."""
    settings.CELERY_TASK_ALWAYS_EAGER = True

    def run():
        from workers.tasks import discover_manifests

        discover_manifests.apply().get()

    return run


def statuses(run_id: str) -> dict:
    return {g.generation_id: (g.status, [r["code"] for r in g.reasons])
            for g in Generation.objects.filter(run__run_id=run_id)}


def mtime(path) -> float:
    return os.stat(path).st_mtime


def test_it_adopts_a_torchtitan_folder_as_a_run_that_sends_no_events(
        project, tmp_path, declare_location, worker):
    root = tmp_path / "llama-debug"
    root.mkdir()
    dcp_save(root, 10)
    dcp_save(root, 20)
    dcp_save(root, 30)
    truncate(root / "step-20" / "__0_0.distcp", 100)       # cut short after its commit
    os.remove(root / "step-30" / ".metadata")               # killed before the commit
    declare_location(project, root, kind=KIND_ADOPT, format="dcp")
    worker()
    run = Run.objects.get(project=project, run_id="adopted-llama-debug")
    assert statuses(run.run_id) == {
        "step-10": ("restorable", []),
        "step-20": ("rejected", ["size_mismatch", "size_mismatch"]),
        "step-30": ("pending", [])}
    g20 = Generation.objects.get(run=run, generation_id="step-20")
    declared = g20.manifest["objects"][0]["size"]
    assert g20.reasons[0]["detail"] == (f"step-20/__0_0.distcp: 100 bytes, its structure "
                                        f"declares {declared} (truncated)")
    assert g20.reasons[1]["detail"] == f"file://{root.resolve()}/step-20/__0_0.distcp"
    assert g20.manifest["adopted"]["format"] == "dcp"
    assert g20.discovered and g20.found_at == f"file://{root.resolve()}/step-20"
    g10 = Generation.objects.get(run=run, generation_id="step-10")
    # the commit marker's modification time, to the millisecond of the manifest's committed_at
    marker_ms = int(mtime(root / "step-10" / ".metadata") * 1000) / 1000
    assert abs(g10.committed_at.timestamp() - marker_ms) < 0.0015
    assert g10.manifest["committed_at"] == datetime.fromtimestamp(
        mtime(root / "step-10" / ".metadata"), tz=UTC).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")
    result = run.analysis.result
    assert result["last_restorable"]["generation_id"] == "step-10"
    by_id = {g["generation_id"]: g for g in result["generations"]}
    assert [n["code"] for n in by_id["step-10"]["notes"]] == ["data_position_unknown",
                                                              "dataset_version_unknown"]
    assert by_id["step-30"]["status"] == "pending"
    # the next listing adds nothing: the generations are known
    before = Generation.objects.filter(run=run).count()
    worker()
    assert Generation.objects.filter(run=run).count() == before


def test_it_adopts_a_deepspeed_layout_missing_one_optimizer_partition(
        project, tmp_path, declare_location, worker):
    root = tmp_path / "ds"
    root.mkdir()
    deepspeed_save(root, 10)
    deepspeed_save(root, 20, skip_optim={3})
    declare_location(project, root, kind=KIND_ADOPT, format="auto", run_id="ds-run")
    worker()
    assert statuses("ds-run") == {
        "global_step10": ("restorable", []),
        "global_step20": ("rejected", ["shard_missing", "object_missing"])}
    g = Generation.objects.get(run__run_id="ds-run", generation_id="global_step20")
    assert [r["detail"] for r in g.reasons] == [
        "no file for required shard rank3",
        "global_step20/bf16_zero_pp_rank_3_mp_rank_00_optim_states.pt: no such file"]
    assert Run.objects.get(run_id="ds-run").analysis.result["last_restorable"][
        "generation_id"] == "global_step10"


@pytest.fixture(scope="module")
def hf_out(tmp_path_factory):
    """``Trainer.train()`` of a tiny GPT-2 for 4 updates, saving every 2."""
    transformers = pytest.importorskip("transformers")
    import torch

    out = tmp_path_factory.mktemp("hf") / "out"
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=16))

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return 32

        def __getitem__(self, i):
            ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": ids}

    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=4, save_steps=2, save_strategy="steps",
        per_device_train_batch_size=4, report_to=[], use_cpu=True, logging_steps=100,
        disable_tqdm=True, dataloader_num_workers=0)
    transformers.Trainer(model=model, args=args, train_dataset=Tokens()).train()
    return out


def test_it_adopts_hf_trainer_checkpoints_and_a_truncated_model_is_rejected(
        project, tmp_path, declare_location, worker, hf_out):
    root = tmp_path / "hf-run"
    shutil.copytree(hf_out, root)
    truncate(root / "checkpoint-4" / "model.safetensors", 1000)
    declare_location(project, root, kind=KIND_ADOPT, format="hf")
    worker()
    got = statuses("adopted-hf-run")
    assert got["checkpoint-2"] == ("restorable", [])
    assert got["checkpoint-4"][0] == "rejected" and got["checkpoint-4"][1][0] == "size_mismatch"
    g = Generation.objects.get(run__run_id="adopted-hf-run", generation_id="checkpoint-4")
    assert g.reasons[0]["detail"].startswith("checkpoint-4/model.safetensors: ")
    assert g.update == 4 and g.manifest["adopted"]["progress"]["global_step"] == 4


def test_a_trainer_sending_events_later_joins_the_adopted_run(
        project, tmp_path, declare_location, worker, ingest):
    root = tmp_path / "titan"
    root.mkdir()
    dcp_save(root, 10)
    declare_location(project, root, kind=KIND_ADOPT, format="dcp", run_id="titan-7b")
    worker()
    assert statuses("titan-7b") == {"step-10": ("restorable", [])}
    events = [
        {"event_id": "t:start", "type": "attempt_started", "run_id": "titan-7b", "attempt": 1,
         "time": "2026-11-01T00:00:00Z", "world_size": 1, "dataset_version": "ds-v1",
         "global_batch_size": 4, "resumed_from": {"generation_id": "step-10", "update": 10}},
        {"event_id": "t:u11", "type": "update_committed", "run_id": "titan-7b", "attempt": 1,
         "time": "2026-11-01T00:00:10Z", "update": 11, "rank": 0,
         "spans": [{"stratum": "main", "epoch": 0, "ranges": [[40, 44]]}]}]
    ingest(project, events)
    assert Run.objects.filter(project=project, run_id="titan-7b").count() == 1
    run = Run.objects.get(project=project, run_id="titan-7b")
    # attempt 0 holds what was adopted (its checkpoint events); the trainer's attempt 1 joins
    assert sorted(run.attempts.values_list("attempt", flat=True)) == [0, 1]
    assert statuses("titan-7b") == {"step-10": ("restorable", [])}
    assert run.analysis.result["restarts"][0]["resumed_from"] == "step-10"


def test_a_linked_file_leading_out_of_the_locations_is_never_read(
        project, tmp_path, declare_location, worker, opened):
    root = tmp_path / "linked"
    root.mkdir()
    dcp_save(root, 10)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    metadata = root / "step-10" / ".metadata"
    shutil.move(metadata, outside / ".metadata")
    os.symlink(outside / ".metadata", metadata)
    seen = opened(str(outside / ".metadata"))
    declare_location(project, root, kind=KIND_ADOPT, format="dcp")
    worker()
    assert seen == []
    assert statuses("adopted-linked") == {"step-10": ("pending", [])}
    from recoverydash.storage.models import StorageLocation

    loc = StorageLocation.objects.get(project=project, kind=KIND_ADOPT)
    assert loc.last_error == "1 linked file(s) lead outside the storage locations: never read"
