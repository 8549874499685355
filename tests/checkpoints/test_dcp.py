"""torch DCP saves in torchtitan's ``step-N`` layout, written by ``dcp.save`` (one process, and
two gloo ranks), then corrupted the ways a crash leaves them (a rank killed before any shard,
mid-shard, before the commit marker)."""

from __future__ import annotations

import os
import shutil

import pytest

from recoverydash.checkpoints.formats import Options, check
from recoverydash.checkpoints.formats.dcp import component_of

from .conftest import dcp_save, dcp_save_two_ranks, truncate

pytest.importorskip("torch")


def by_id(result):
    return {g.generation_id: g for g in result.generations}


def codes(gen):
    return [r["code"] for r in gen.reasons]


def test_it_finds_torchtitan_steps_restorable_with_their_components(ckpt):
    dcp_save(ckpt, 10)
    dcp_save(ckpt, 20)
    result = check(str(ckpt))
    assert result.format == "dcp"
    assert [g.generation_id for g in result.generations] == ["step-20", "step-10"]
    g = result.generations[0]
    assert (g.status, g.update, g.reasons) == ("restorable", 20, [])
    assert set(g.components) == {"model", "optimizer", "scheduler", "data_progress",
                                 "train_state"}
    assert g.required_shards == ["rank0"]
    assert g.commit_marker == "step-20/.metadata"
    assert result.restorable is g


def test_a_truncated_shard_after_commit_is_a_size_mismatch_and_the_older_step_is_named(ckpt):
    dcp_save(ckpt, 10)
    path = dcp_save(ckpt, 20)
    full = os.path.getsize(os.path.join(path, "__0_0.distcp"))
    truncate(os.path.join(path, "__0_0.distcp"), 100)
    result = check(str(ckpt))
    g = by_id(result)["step-20"]
    assert g.status == "rejected" and codes(g) == ["size_mismatch"]
    assert g.reasons[0]["detail"] == (f"step-20/__0_0.distcp: 100 bytes, its structure declares "
                                      f"{full} (truncated)")
    assert result.restorable.generation_id == "step-10"


def test_all_shards_but_no_metadata_never_committed(ckpt):
    """torchtitan's own loader would skip it too; HF-style 'newest folder' loaders would not."""
    dcp_save(ckpt, 10)
    path = dcp_save(ckpt, 20)
    os.remove(os.path.join(path, ".metadata"))
    result = check(str(ckpt))
    g = by_id(result)["step-20"]
    assert (g.status, codes(g)) == ("pending", ["never_committed"])
    assert "no .metadata in step-20: 1 .distcp file(s) from rank(s) [0]" in g.reasons[0]["detail"]
    assert result.restorable.generation_id == "step-10"
    dcp_save(ckpt, 30)  # a newer save committed: step-20 is abandoned now
    assert by_id(check(str(ckpt)))["step-20"].status == "abandoned"


def test_a_model_only_save_lacks_the_optimizer(ckpt):
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"w": torch.ones(3)}, checkpoint_id=str(ckpt / "step-5"))
    g = check(str(ckpt)).generations[0]
    assert (g.status, codes(g)) == ("rejected", ["component_missing"])
    assert g.reasons[0]["detail"] == "no optimizer (found: model)"
    assert check(str(ckpt), options=Options(required_components=["model"])) \
        .generations[0].status == "restorable"


@pytest.fixture(scope="module")
def two_rank_saves(tmp_path_factory):
    root = tmp_path_factory.mktemp("dcp2")
    dcp_save_two_ranks(root, [10, 20])
    return root


def test_two_gloo_ranks_write_one_restorable_save_with_both_shards(two_rank_saves, tmp_path):
    root = tmp_path / "c"
    shutil.copytree(two_rank_saves, root)
    g = by_id(check(str(root)))["step-20"]
    assert g.status == "restorable"
    assert g.required_shards == ["rank0", "rank1"]
    assert sorted(o.path for o in g.objects) == ["step-20/.metadata", "step-20/__0_0.distcp",
                                                 "step-20/__1_0.distcp"]


def test_a_rank_whose_file_is_gone_leaves_its_shard_missing(two_rank_saves, tmp_path):
    root = tmp_path / "c"
    shutil.copytree(two_rank_saves, root)
    os.remove(root / "step-20" / "__1_0.distcp")
    result = check(str(root))
    g = by_id(result)["step-20"]
    assert g.status == "rejected"
    assert codes(g) == ["shard_missing", "object_missing"]
    assert g.reasons[0]["detail"] == "no file for required shard rank1"
    assert result.restorable.generation_id == "step-10"


def test_a_rank_killed_before_any_shard_leaves_no_metadata(two_rank_saves, tmp_path):
    """Rank 1 died before writing: DCP's coordinator never gathered its result, so the folder
    holds rank 0's file and no .metadata."""
    root = tmp_path / "c"
    shutil.copytree(two_rank_saves, root)
    os.makedirs(root / "step-30")
    shutil.copy(root / "step-20" / "__0_0.distcp", root / "step-30" / "__0_0.distcp")
    result = check(str(root))
    g = by_id(result)["step-30"]
    assert (g.status, codes(g)) == ("pending", ["never_committed"])
    assert "1 .distcp file(s) from rank(s) [0]" in g.reasons[0]["detail"]
    assert result.restorable.generation_id == "step-20"


def test_a_single_dcp_folder_is_one_generation(ckpt):
    path = dcp_save(ckpt, 7)
    result = check(path)
    assert [(g.generation_id, g.status, g.update) for g in result.generations] == \
        [("step-7", "restorable", 7)]


@pytest.mark.parametrize("fqn,component", [
    ("layers.0.attention.wq.weight", "model"), ("tok_embeddings.weight", "model"),
    ("optimizer.state.layers.0.weight.exp_avg", "optimizer"),
    ("lr_scheduler.lr_scheduler_0", "scheduler"), ("dataloader.dp_rank_3", "data_progress"),
    ("train_state", "train_state"), ("rng_state.cpu", "rng")])
def test_state_dict_keys_name_their_component(fqn, component):
    assert component_of(fqn) == component
