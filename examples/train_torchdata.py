"""torchdata's StatefulDataLoader with worker processes, watched by recoverydash: crash it, launch
it again, and the loader continues exactly where the checkpoint's model state is (an exact
restart), or, with ``--no-restore-loader``, starts its epoch again (the dashboard shows the replay
with its exact count).

    python examples/train_torchdata.py --url http://localhost:8000 --token "$TOKEN" \\
        --run-id demo-td --location ./ckpt --updates 60 --save-every 20 --crash-at-update 50
    python examples/train_torchdata.py --url http://localhost:8000 --token "$TOKEN" \\
        --run-id demo-td --location ./ckpt --updates 60 --save-every 20   # resumes from 40

Works with torchrun too (each rank a DistributedSampler share). What makes the restart exact:
- every sample carries its position through the workers (``observed_loader``), and
  ``rec.observe(batch)`` records it where the model receives it: batches the workers prefetched
  but the model never trained are not in the ledger;
- ``save_generation(..., recorder=rec)`` stores ``rec.state_dict()``, which holds the loader's
  ``state_dict()`` taken at the optimizer boundary; ``rec.load_state_dict(progress)`` restores
  it in one call, and the sampler re-creates the same order and skips exactly what was trained.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.utils.data import DistributedSampler, TensorDataset

import recoverydash.sdk as rd
from recoverydash.integrations.torchdata import observed_loader

DATASET = "synthetic-v1"


def train(args: argparse.Namespace) -> None:
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, ...
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    g = torch.Generator().manual_seed(0)  # the same data on every rank and every launch
    data = TensorDataset(torch.randn(args.samples, 16, generator=g),
                         torch.randn(args.samples, 1, generator=g))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=20, gamma=0.9)

    # What to restore: rank 0 asks the server (storage when the server is down), all ranks load
    # the same generation.
    plan = [rd.restore_plan(args.url, args.token, args.run_id, location=args.location,
                            world_size=world, dataset_version=DATASET) if rank == 0 else None]
    if distributed:
        dist.broadcast_object_list(plan)
    plan = plan[0]
    client = rd.init(args.url, args.token, args.run_id, location=args.location, restored=plan)
    rec = rd.ObservedRecorder(client, dataset_version=DATASET)
    if distributed:
        loader = observed_loader(rec, data, sampler=DistributedSampler(data, seed=0),
                                 batch_size=args.micro, num_workers=args.workers)
    else:
        loader = observed_loader(rec, data, batch_size=args.micro, shuffle=True, seed=0,
                                 num_workers=args.workers)
    update, resumed = 0, None
    if plan["generation_id"]:
        msd, osd = get_state_dict(model, opt)
        small = rd.load_generation(args.location, plan["generation_id"],
                                   state={"model": msd, "optimizer": osd}, client=client)
        if small.generation_id:  # what was loaded (a damaged generation is skipped)
            set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)
            sched.load_state_dict(small["scheduler"])
            update, resumed = small.update, small.resumed_from
            if args.restore_loader:
                rec.load_state_dict(small["data_progress"])  # the loader's state: one call
    rec.start(resumed_from=resumed, global_batch_size=args.micro * args.accum * world,
              micro_batch_size=args.micro, grad_accum_steps=args.accum)
    if rank == 0:
        print(f"attempt {client.attempt}: " + (f"resumed {resumed['generation_id']} at update "
                                               f"{update}" if resumed else "fresh start"),
              flush=True)
    micro = 0
    while update < args.updates:
        for batch in loader:  # epoch after epoch (the sampler moves to the next epoch itself)
            x, y = rec.observe(batch)
            torch.nn.functional.mse_loss(model(x), y).div(args.accum).backward()
            micro += 1
            if micro % args.accum:
                continue
            opt.step()
            sched.step()
            opt.zero_grad()
            update += 1
            rec.commit(update)
            if update % args.save_every == 0:
                msd, osd = get_state_dict(model, opt)
                rd.save_generation(args.location, rd.make_generation_id(update, client.attempt),
                                   update, state={"model": msd, "optimizer": osd},
                                   rank_state={"scheduler": sched.state_dict()}, recorder=rec)
            if update == args.crash_at_update:
                client.flush(5)  # so the demo's events are in (a real crash may lose ~1 s)
                os._exit(3)
            if update >= args.updates:
                break
    rec.end("completed")
    client.flush(10)
    if rank == 0:
        print(f"attempt {client.attempt}: completed at update {update}", flush=True)
    if distributed:
        del model
        dist.destroy_process_group()


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default=os.environ.get("RECOVERYDASH_URL"), help="server base URL")
    p.add_argument("--token", default=os.environ.get("RECOVERYDASH_TOKEN"),
                   help="API token with scopes ingest and read")
    p.add_argument("--run-id", default="train-torchdata")
    p.add_argument("--location", required=True, help="checkpoint folder or s3://bucket/prefix")
    p.add_argument("--updates", type=int, default=60, help="optimizer updates to reach")
    p.add_argument("--save-every", type=int, default=20, help="updates between checkpoints")
    p.add_argument("--crash-at-update", type=int, default=None,
                   help="die (os._exit(3)) right after this update, for demonstrations")
    p.add_argument("--no-restore-loader", dest="restore_loader", action="store_false",
                   help="restore the model but not the loader: the restart replays")
    p.add_argument("--samples", type=int, default=1024, help="dataset size")
    p.add_argument("--micro", type=int, default=8, help="microbatch size per rank")
    p.add_argument("--accum", type=int, default=2, help="microbatches per optimizer update")
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    return p.parse_args(argv)


if __name__ == "__main__":
    train(parse())
