"""DeepSpeed, Megatron-LM and Orbax layouts written by hand (torch.save for the torch files):
none of these libraries is installable here (module doc of conftest)."""

from __future__ import annotations

import os

import pytest

from recoverydash.checkpoints.formats import Options, check

from .conftest import deepspeed_save, megatron_save, orbax_step, truncate

pytest.importorskip("torch")


def by_id(result):
    return {g.generation_id: g for g in result.generations}


def codes(gen):
    return [r["code"] for r in gen.reasons]


# --- DeepSpeed ---------------------------------------------------------------------------------

def test_deepspeed_tag_at_a_complete_folder_is_restorable_with_every_partition(ckpt):
    deepspeed_save(ckpt, 10)
    result = check(str(ckpt))
    assert result.format == "deepspeed"
    g = result.generations[0]
    assert (g.generation_id, g.status, g.update, g.world_size) == \
        ("global_step10", "restorable", 10, 4)
    assert g.required_shards == ["rank0", "rank1", "rank2", "rank3"]
    assert g.progress == {"global_steps": 10, "global_samples": 320, "zero_stage": 2}
    assert g.commit_marker == "latest"


def test_deepspeed_tag_pointing_at_a_folder_missing_one_optimizer_partition(ckpt):
    deepspeed_save(ckpt, 10)
    deepspeed_save(ckpt, 20, skip_optim={3})
    result = check(str(ckpt))
    g = by_id(result)["global_step20"]
    assert g.status == "rejected"
    assert codes(g) == ["shard_missing", "object_missing"]
    assert g.reasons[0]["detail"] == "no file for required shard rank3"
    assert g.reasons[1]["detail"] == ("global_step20/bf16_zero_pp_rank_3_mp_rank_00_optim_states"
                                      ".pt: no such file")
    assert by_id(result)["global_step10"].status == "restorable"
    assert result.restorable.generation_id == "global_step10"


def test_deepspeed_folder_newer_than_the_tag_never_committed(ckpt):
    """All shards written, killed before rank 0 wrote `latest`."""
    deepspeed_save(ckpt, 10)
    deepspeed_save(ckpt, 20, tag=False)
    result = check(str(ckpt))
    g = by_id(result)["global_step20"]
    assert (g.status, codes(g)) == ("pending", ["never_committed"])
    assert g.reasons[0]["detail"].startswith("`latest` names global_step10; this folder is newer")
    assert result.restorable.generation_id == "global_step10"


def test_deepspeed_truncated_partition_is_a_size_mismatch(ckpt):
    path = deepspeed_save(ckpt, 10)
    truncate(os.path.join(path, "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"))
    g = check(str(ckpt)).generations[0]
    assert (g.status, codes(g)) == ("rejected", ["size_mismatch"])
    assert "zip without a central directory" in g.reasons[0]["detail"]


def test_deepspeed_world_size_of_the_restarting_job_is_compared(ckpt):
    deepspeed_save(ckpt, 10, dp=2, mp=2)
    g = check(str(ckpt)).generations[0]
    assert g.status == "restorable" and g.world_size == 4
    assert g.required_shards == ["rank0-mp0", "rank1-mp0", "rank0-mp1", "rank1-mp1"]
    g = check(str(ckpt), options=Options(world_size=8)).generations[0]
    assert (g.status, codes(g)) == ("rejected", ["world_size_mismatch"])


def test_deepspeed_tag_naming_a_missing_folder(ckpt):
    deepspeed_save(ckpt, 10)
    (ckpt / "latest").write_text("global_step20")
    result = check(str(ckpt))
    g = by_id(result)["global_step20"]
    assert (g.status, codes(g)) == ("rejected", ["component_missing", "object_missing"])
    assert by_id(result)["global_step10"].status == "restorable"


# --- Megatron-LM -------------------------------------------------------------------------------

def test_megatron_tracker_iteration_with_every_tensor_rank_is_restorable(ckpt):
    megatron_save(ckpt, 10)
    result = check(str(ckpt))
    assert result.format == "megatron"
    g = result.generations[0]
    assert (g.generation_id, g.status, g.update) == ("iter_0000010", "restorable", 10)
    assert g.required_shards == ["mp_rank_00", "mp_rank_01"]
    assert g.world_size == 4
    assert g.progress["consumed_train_samples"] == 640


def test_megatron_truncated_rank_file_and_rank_killed_before_any_shard(ckpt):
    megatron_save(ckpt, 10)
    path = megatron_save(ckpt, 20)
    truncate(os.path.join(path, "mp_rank_01", "model_optim_rng.pt"))
    megatron_save(ckpt, 30, ranks={"mp_rank_00"}, tracker=False)  # rank 1 died first
    result = check(str(ckpt))
    gens = by_id(result)
    assert (gens["iter_0000030"].status, codes(gens["iter_0000030"])) == \
        ("pending", ["never_committed"])
    assert (gens["iter_0000020"].status, codes(gens["iter_0000020"])) == \
        ("rejected", ["size_mismatch"])
    assert result.restorable.generation_id == "iter_0000010"


def test_megatron_distributed_optimizer_file_missing(ckpt):
    path = megatron_save(ckpt, 10, pp=2, distributed_optimizer=True)
    os.remove(os.path.join(path, "mp_rank_01_001", "distrib_optim.pt"))
    g = check(str(ckpt)).generations[0]
    assert g.required_shards == ["mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000",
                                 "mp_rank_01_001"]
    assert (g.status, codes(g)) == ("rejected", ["object_missing"])
    assert g.reasons[0]["detail"] == "iter_0000010/mp_rank_01_001/distrib_optim.pt: no such file"


# --- Orbax -------------------------------------------------------------------------------------

def test_orbax_tmp_folder_never_committed_and_the_finalised_step_is_named(ckpt):
    orbax_step(ckpt, 100)
    orbax_step(ckpt, 200, tmp=True)
    result = check(str(ckpt))
    assert result.format == "orbax"
    gens = by_id(result)
    tmp = gens["200.orbax-checkpoint-tmp-1733000000"]
    assert (tmp.status, codes(tmp), tmp.update) == ("pending", ["never_committed"], 200)
    assert gens["100"].status == "restorable"
    assert gens["100"].committed_at == pytest.approx(1733000000.0000001)
    assert result.restorable.generation_id == "100"


def test_orbax_item_named_by_the_step_metadata_but_absent(ckpt):
    orbax_step(ckpt, 100)
    orbax_step(ckpt, 150, items=("state",), declared=("state", "metrics"))
    g = by_id(check(str(ckpt)))["150"]
    assert (g.status, codes(g)) == ("rejected", ["component_missing"])


def test_orbax_process_that_left_no_manifest(ckpt):
    path = orbax_step(ckpt, 100, processes=2)
    os.remove(os.path.join(path, "state", "ocdbt.process_1", "manifest.ocdbt"))
    g = check(str(ckpt)).generations[0]
    assert g.required_shards == ["process0", "process1"]
    assert g.status == "rejected" and "object_missing" in codes(g)
