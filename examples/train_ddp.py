"""A complete DDP training script watched by recoverydash: crash it, launch it again, and the
dashboard shows an exact restart (no replayed, no omitted samples) from a restorable checkpoint.

    python manage.py add_location --project myteam --uri "file://$PWD/ckpt"   # once, server side
    torchrun --standalone --nproc_per_node 2 examples/train_ddp.py \\
        --url http://localhost:8000 --token "$TOKEN" --run-id demo-ddp --location ./ckpt \\
        --updates 200 --save-every 50 --crash-at-update 130      # dies at update 130
    torchrun --standalone --nproc_per_node 2 examples/train_ddp.py \\
        --url http://localhost:8000 --token "$TOKEN" --run-id demo-ddp --location ./ckpt \\
        --updates 200 --save-every 50                            # resumes from update 100

Without torchrun: ``python examples/train_ddp.py --nproc 2 ...`` (torch.multiprocessing spawn).
CPU only (gloo). What makes the restart exact and the checkpoints restorable:
- every component of the default contract is saved: model and optimizer (DCP), the scheduler
  (a per-rank component), RNG states and the data cursor (``save_generation`` adds both);
- AdamW moves its state on every update, so no saved optimizer file repeats an older one
  (plain SGD without momentum has no optimizer state that changes: ``stale_state``,
  docs/definitions.md#restorable);
- the data ledger is observed: every sample carries its position through the loader
  (``observed_loader``) and ``rec.observe(batch)`` records it where the model receives it, so
  the dashboard sees what the loader really delivered;
- the loader resumes at the restored cursor: ``rec.load_state_dict(progress)`` makes the sampler's
  next iteration of the saved epoch start there;
- the attempt number is new for every launch (``rd.init`` decides it, the same on all ranks).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler, TensorDataset

import recoverydash.sdk as rd
from recoverydash.integrations.pytorch import observed_loader

DATASET = "synthetic-v1"


def train(args: argparse.Namespace) -> None:
    dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    location = args.location if "://" in args.location else os.path.abspath(args.location)

    g = torch.Generator().manual_seed(0)  # the same data on every rank and every launch
    data = TensorDataset(torch.randn(args.samples, 16, generator=g),
                         torch.randn(args.samples, 1, generator=g))
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 1)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=20, gamma=0.9)

    # What to restore: rank 0 asks the server (storage when the server is down), all ranks load it.
    plan = [rd.restore_plan(args.url, args.token, args.run_id, location=location,
                            world_size=world, dataset_version=DATASET) if rank == 0 else None]
    dist.broadcast_object_list(plan)
    plan = plan[0]
    if args.restore:  # a person's choice over the plan's; load_generation still checks it
        plan = {**plan, "generation_id": args.restore, "source": "given"}
    # The sender; its attempt number is new for every launch (rank 0 decides, all ranks agree).
    client = rd.init(args.url, args.token, args.run_id, location=location, restored=plan)
    rec = rd.ObservedRecorder(client, dataset_version=DATASET)
    loader = observed_loader(rec, data, sampler=sampler, batch_size=args.micro)
    update, resumed = 0, None
    if plan["generation_id"]:
        msd, osd = get_state_dict(model, opt)
        small = rd.load_generation(location, plan["generation_id"],
                                   state={"model": msd, "optimizer": osd}, client=client)
        # small.generation_id is what was loaded: a generation whose files fail the manifest is
        # reported (restore_failed) and the next restorable one loaded instead.
        if small.generation_id:
            set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)
            sched.load_state_dict(small["scheduler"])
            update, resumed = small.update, small.resumed_from
            rec.load_state_dict(small["data_progress"])  # the loader resumes at the saved cursor
    rec.start(resumed_from=resumed, global_batch_size=args.micro * args.accum * world,
              micro_batch_size=args.micro, grad_accum_steps=args.accum)
    if rank == 0:
        print(f"attempt {client.attempt}: "
              + (f"resumed {resumed['generation_id']} at update {update} ({plan['source']})"
                 if resumed else "fresh start"), flush=True)

    epoch, micro = sampler.epoch, 0
    try:
        while update < args.updates:
            sampler.set_epoch(epoch)
            for batch in loader:
                x, y = rec.observe(batch)  # the positions of the samples the model receives
                micro += 1
                boundary = micro % args.accum == 0
                with contextlib.nullcontext() if boundary else model.no_sync():
                    loss = torch.nn.functional.mse_loss(model(x), y) / args.accum
                    loss.backward()
                if not boundary:
                    continue
                opt.step()
                sched.step()
                opt.zero_grad()
                update += 1
                rec.commit(update)  # the ledger record, at the optimizer boundary
                if update % args.save_every == 0:
                    msd, osd = get_state_dict(model, opt)
                    rd.save_generation(location, rd.make_generation_id(update, client.attempt),
                                       update, state={"model": msd, "optimizer": osd},
                                       rank_state={"scheduler": sched.state_dict()},
                                       recorder=rec)
                if update == args.crash_at_update:
                    client.flush(5)  # so the demo's events are in (a real crash may lose ~1 s)
                    os._exit(3)
                if update >= args.updates:
                    break
            epoch += 1
    except BaseException as e:
        rec.end("failed", message=repr(e))
        client.flush(5)
        raise
    rec.end("completed")
    client.flush(10)
    if rank == 0:
        print(f"attempt {client.attempt}: completed at update {update}", flush=True)
    # Drop DDP before the process group: a gloo group destroyed by DDP's reducer at interpreter
    # exit can deadlock (torch 2.13: its destructor joins a thread that waits for the GIL).
    del model, opt, sched
    dist.destroy_process_group()


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default=os.environ.get("RECOVERYDASH_URL"), help="server base URL")
    p.add_argument("--token", default=os.environ.get("RECOVERYDASH_TOKEN"),
                   help="API token with scopes ingest and read")
    p.add_argument("--run-id", default="train-ddp")
    p.add_argument("--location", required=True, help="checkpoint folder or s3://bucket/prefix")
    p.add_argument("--updates", type=int, default=200, help="optimizer updates to reach")
    p.add_argument("--save-every", type=int, default=50, help="updates between checkpoints")
    p.add_argument("--crash-at-update", type=int, default=None,
                   help="die (os._exit(3)) right after this update, for demonstrations")
    p.add_argument("--restore", default=None,
                   help="load this generation instead of the restore plan's (its files are "
                        "still checked: a damaged one is reported and an older one loaded)")
    p.add_argument("--samples", type=int, default=4096, help="dataset size")
    p.add_argument("--micro", type=int, default=8, help="microbatch size per rank")
    p.add_argument("--accum", type=int, default=4, help="microbatches per optimizer update")
    p.add_argument("--nproc", type=int, default=None,
                   help="without torchrun: spawn this many local ranks")
    return p.parse_args(argv)


def _spawned(local_rank: int, args: argparse.Namespace) -> None:
    os.environ.update(RANK=str(local_rank), LOCAL_RANK=str(local_rank),
                      WORLD_SIZE=str(args.nproc))
    train(args)


if __name__ == "__main__":
    args = parse()
    if args.nproc and "RANK" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.multiprocessing.spawn(_spawned, args=(args,), nprocs=args.nproc)
    else:
        train(args)
