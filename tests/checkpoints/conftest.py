"""Builders of real checkpoint folders, written by the real libraries where they are installed
(torch DCP, Hugging Face Trainer, Lightning) and by hand with ``torch.save`` in the layouts of
DeepSpeed, Megatron-LM and Orbax (none of them installable here: DeepSpeed needs a compiler
toolchain and CUDA headers, Megatron-LM and Orbax/JAX are not dependencies of this project)."""

from __future__ import annotations

import argparse
import io
import json
import os
import socket

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def truncate(path, keep: int | None = None) -> None:
    """Cut a file to ``keep`` bytes (default: half), as a writer killed mid-file leaves it."""
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2 if keep is None else keep)


# --- torch DCP, torchtitan's layout ------------------------------------------------------------

def titan_state(step: int, seed: int = 0):
    """A torchtitan-shaped state dict: model keys flattened to the top level, plus optimizer,
    lr_scheduler, dataloader and train_state."""
    import torch
    from torch.distributed.checkpoint.state_dict import get_state_dict

    torch.manual_seed(seed + step)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(3, 8)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.StepLR(opt, 5)
    msd, osd = get_state_dict(model, opt)
    sd = dict(msd)
    sd["optimizer"] = osd
    sd["lr_scheduler"] = sched.state_dict()
    sd["dataloader"] = {"dp_rank_0": io.BytesIO(json.dumps({"position": step * 8}).encode())}
    buf = io.BytesIO()
    torch.save({"step": torch.tensor(step)}, buf)
    sd["train_state"] = io.BytesIO(buf.getvalue())
    return sd


def dcp_save(folder, step: int) -> str:
    """``dcp.save`` of a torchtitan state into ``<folder>/step-<step>`` (one process)."""
    import warnings

    import torch.distributed.checkpoint as dcp

    path = os.path.join(str(folder), f"step-{step}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(titan_state(step), checkpoint_id=path)
    return path


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _dcp_rank(rank: int, world: int, port: int, folder: str, steps: list) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        for step in steps:
            torch.manual_seed(step)
            model = torch.nn.Linear(8, 8)
            opt = torch.optim.AdamW(model.parameters())
            model(torch.randn(2, 8)).sum().backward()
            opt.step()
            msd, osd = get_state_dict(model, opt)
            # Each rank holds its own slice (rank-local keys): every rank writes a .distcp.
            sd = {f"layers.{rank}.weight": msd["weight"], f"layers.{rank}.bias": msd["bias"],
                  f"optimizer.rank{rank}": osd}
            dcp.save(sd, checkpoint_id=os.path.join(folder, f"step-{step}"))
    finally:
        dist.destroy_process_group()


def dcp_save_two_ranks(folder, steps: list) -> None:
    """``dcp.save`` by two gloo ranks (spawned processes), one ``step-N`` per step."""
    import torch.multiprocessing as mp

    mp.spawn(_dcp_rank, args=(2, _free_port(), str(folder), list(steps)), nprocs=2, join=True)


# --- DeepSpeed's layout, by hand ---------------------------------------------------------------

def deepspeed_save(folder, step: int, *, dp: int = 4, mp: int = 1, stage: int = 2,
                   prefix: str = "bf16_", skip_optim=(), tag: bool = True) -> str:
    """What ``DeepSpeedEngine.save_checkpoint`` writes (ZeRO stage 1-2): model states per
    model-parallel rank, one optimizer partition per data-parallel rank, then ``latest``."""
    import torch

    tag_name = f"global_step{step}"
    path = os.path.join(str(folder), tag_name)
    os.makedirs(path, exist_ok=True)
    for m in range(mp):
        torch.save({"module": {"w": torch.randn(4, 4)}, "buffer_names": [], "optimizer": None,
                    "param_shapes": [{"w": torch.Size([4, 4])}],
                    "lr_scheduler": {"last_epoch": step}, "sparse_tensor_module_names": set(),
                    "skipped_steps": 0, "global_steps": step, "global_samples": step * 32,
                    "dp_world_size": dp, "mp_world_size": mp,
                    "ds_config": {"train_batch_size": 32, "zero_optimization": {"stage": stage},
                                  "bf16": {"enabled": prefix == "bf16_"}},
                    "ds_version": "0.16.4"},
                   os.path.join(path, f"mp_rank_{m:02d}_model_states.pt"))
        for d in range(dp):
            if d in skip_optim:
                continue
            torch.save({"optimizer_state_dict": {
                "zero_stage": stage, "partition_count": dp, "loss_scaler": None,
                "base_optimizer_state": {"state": {0: {"exp_avg": torch.randn(4)}}},
                "single_partition_of_fp32_groups": [torch.randn(4)]},
                "ds_config": {}, "ds_version": "0.16.4"},
                os.path.join(path, f"{prefix}zero_pp_rank_{d}_mp_rank_{m:02d}_optim_states.pt"))
    if tag:
        with open(os.path.join(str(folder), "latest"), "w") as f:
            f.write(tag_name)
    return path


# --- Megatron-LM's layout, by hand -------------------------------------------------------------

def megatron_save(folder, iteration: int, *, tp: int = 2, pp: int = 1, ranks=None,
                  tracker: bool = True, distributed_optimizer: bool = False) -> str:
    """What Megatron-LM's legacy ``save_checkpoint`` writes: ``iter_XXXXXXX/mp_rank_TT[_PPP]/
    model_optim_rng.pt`` per model-parallel rank (``ranks``: only those), then the tracker."""
    import torch

    args = argparse.Namespace(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                              world_size=tp * pp * 2, consumed_train_samples=iteration * 64,
                              use_distributed_optimizer=distributed_optimizer)
    path = os.path.join(str(folder), f"iter_{iteration:07d}")
    for t in range(tp):
        for p in range(pp):
            name = f"mp_rank_{t:02d}" + (f"_{p:03d}" if pp > 1 else "")
            if ranks is not None and name not in ranks:
                continue
            os.makedirs(os.path.join(path, name), exist_ok=True)
            torch.save({"args": args, "checkpoint_version": 3.0, "iteration": iteration,
                        "model": {"language_model": {"w": torch.randn(4, 4)}},
                        "optimizer": None if distributed_optimizer else
                        {"optimizer": {"state": {}}, "fp32_from_fp16_params": []},
                        "opt_param_scheduler": {"num_steps": iteration * 64},
                        "rng_state": [{"random_rng_state": (3, tuple(range(5)), None),
                                       "torch_rng_state": torch.get_rng_state()}],
                        "num_floating_point_operations_so_far": 0},
                       os.path.join(path, name, "model_optim_rng.pt"))
            if distributed_optimizer:
                torch.save({"param_state": torch.randn(8)},
                           os.path.join(path, name, "distrib_optim.pt"))
    if tracker:
        with open(os.path.join(str(folder), "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(iteration))
    return path


# --- Orbax's layout, by hand -------------------------------------------------------------------

def orbax_step(folder, step: int, *, items=("state", "metrics"), declared=None, tmp=False,
               processes: int = 1, commit_file: bool = False) -> str:
    """An Orbax ``CheckpointManager`` step: ``_CHECKPOINT_METADATA``, item folders with
    ``_METADATA`` and an OCDBT database per process (or a ``.orbax-checkpoint-tmp-*`` folder)."""
    name = f"{step}.orbax-checkpoint-tmp-1733000000" if tmp else str(step)
    path = os.path.join(str(folder), name)
    os.makedirs(path, exist_ok=True)
    handlers = {i: "orbax.checkpoint._src.handlers.pytree_checkpoint_handler."
                   "PyTreeCheckpointHandler" for i in (declared or items)}
    with open(os.path.join(path, "_CHECKPOINT_METADATA"), "w") as f:
        json.dump({"item_handlers": handlers, "metrics": {}, "performance_metrics": {},
                   "init_timestamp_nsecs": 1733000000000000000,
                   "commit_timestamp_nsecs": None if tmp else 1733000000000000000 + step,
                   "custom_metadata": {}}, f)
    for item in items:
        base = os.path.join(path, item)
        os.makedirs(base, exist_ok=True)
        with open(os.path.join(base, "_METADATA"), "w") as f:
            json.dump({"tree_metadata": {"('params',)": {"key_metadata": []}},
                       "use_zarr3": False}, f)
        with open(os.path.join(base, "manifest.ocdbt"), "wb") as f:
            f.write(b"\x00" * 64)
        for p in range(processes):
            d = os.path.join(base, f"ocdbt.process_{p}", "d")
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(base, f"ocdbt.process_{p}", "manifest.ocdbt"), "wb") as f:
                f.write(b"\x01" * 32)
            with open(os.path.join(d, "0a1b2c"), "wb") as f:
                f.write(os.urandom(128))
    if commit_file:
        with open(os.path.join(path, "commit_success.txt"), "w") as f:
            f.write("Checkpoint commit was successful")
    return path


@pytest.fixture
def ckpt(tmp_path):
    root = tmp_path / "ckpt"
    root.mkdir()
    return root


from tests.sdk.conftest import s3_server  # noqa: F401  (moto's S3 on loopback)
