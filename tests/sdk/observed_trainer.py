"""A small trainer for the live tests of the observed ledger: a torchdata StatefulDataLoader (with
worker processes) or a plain DataLoader under DistributedSampler on gloo ranks, checkpoints with
save_generation, a crash by SIGKILL at a known point, and a resume that restores the loader's
state or (``--no-restore-loader``) does not.

The truth is kept beside the SDK, never through it (``--truth DIR``):
- ``DIR/train-a<attempt>-r<rank>.jsonl``: per committed update, the dataset indices the model
  received (read from the batch's index tensor in the loop), and a last line ``"update": null``
  for a microbatch trained but never committed;
- ``DIR/fetch-a<attempt>-<pid>.txt``: every index the dataset was asked for, written by the
  dataset itself inside the loader's worker processes.

    python tests/sdk/observed_trainer.py --url U --token T --run-id R --location ckpt \\
        --loader torchdata --workers 2 --updates 12 --save-every 4 --crash-at 7:1 --truth truth
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import recoverydash.sdk as rd  # noqa: E402
from recoverydash.sdk.observe import ObservedRecorder  # noqa: E402

DATASET = "observed-ds-1"


class Indexed(torch.utils.data.Dataset):
    """``(x, index)`` samples; every fetch is appended to this process's fetch log."""

    def __init__(self, n: int, truth: str | None, attempt: int):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=g)
        self.truth, self.attempt = truth, attempt
        self._log = None

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if self.truth:
            if self._log is None or self._log[0] != os.getpid():
                path = os.path.join(self.truth, f"fetch-a{self.attempt}-{os.getpid()}.txt")
                self._log = (os.getpid(), open(path, "a", buffering=1))  # noqa: SIM115
            self._log[1].write(f"{i}\n")
        return self.x[i], torch.tensor(i)


def train(args, rank: int, world: int) -> None:
    distributed = world > 1
    if distributed:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.9)
    plan = rd.restore_plan(args.url, args.token, args.run_id, location=args.location,
                           world_size=world, dataset_version=DATASET)
    client = rd.init(args.url, args.token, args.run_id, location=args.location, restored=plan,
                     flush_interval=0.2)
    attempt = client.attempt
    rec = ObservedRecorder(client, dataset_version=DATASET, heartbeat_interval=0.5)
    ds = Indexed(args.samples, args.truth, attempt)
    if args.loader == "torchdata":
        from recoverydash.integrations.torchdata import observed_loader

        loader = observed_loader(rec, ds, batch_size=args.micro, shuffle=True, seed=args.seed,
                                 num_workers=args.workers,
                                 prefetch_factor=2 if args.workers else None)
        sampler = None
    else:
        from recoverydash.integrations.pytorch import observed_loader

        sampler = torch.utils.data.DistributedSampler(ds, num_replicas=world, rank=rank,
                                                      shuffle=True, seed=args.seed)
        loader = observed_loader(rec, ds, sampler=sampler, batch_size=args.micro,
                                 num_workers=args.workers)
    update, resumed = 0, None
    if plan["generation_id"]:
        msd, osd = get_state_dict(model, opt)
        small = rd.load_generation(args.location, plan["generation_id"],
                                   state={"model": msd, "optimizer": osd}, client=client)
        set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)
        sched.load_state_dict(small["scheduler"])
        update, resumed = plan["update"], rd.resumed_from(plan)
        if args.restore_loader:
            rec.load_state_dict(small["data_progress"])     # the loader resumes: one call
    rec.start(resumed_from=resumed, global_batch_size=args.micro * args.accum * world,
              micro_batch_size=args.micro, grad_accum_steps=args.accum)
    truth = None
    if args.truth:
        truth = open(os.path.join(args.truth, f"train-a{attempt}-r{rank}.jsonl"), "a",  # noqa: SIM115
                     buffering=1)
    crash_update, crash_micro = (int(v) for v in args.crash_at.split(":")) \
        if args.crash_at else (None, None)
    micro, pending = 0, []
    epoch = sampler.epoch if sampler is not None else 0
    while update < args.updates:
        if sampler is not None:
            sampler.set_epoch(epoch)
        for batch in loader:
            x, idx = rec.observe(batch)                      # where the batch reaches the model
            pending.extend(idx.tolist())
            micro += 1
            torch.nn.functional.mse_loss(model(x), x[:, :1]).backward()
            if update + 1 == crash_update and len(pending) == crash_micro * args.micro:
                # the whole job dies here (every rank), mid-update
                if truth:
                    truth.write(json.dumps({"update": None, "indices": pending}) + "\n")
                time.sleep(2.0)          # the workers finish the batches they prefetched
                rec.heartbeat()
                client.flush(10)
                os.kill(os.getpid(), signal.SIGKILL)
            if micro % args.accum:
                continue
            opt.step()
            sched.step()
            opt.zero_grad()
            update += 1
            rec.commit(update)
            if truth:
                truth.write(json.dumps({"update": update, "indices": pending}) + "\n")
            pending = []
            if update % args.save_every == 0:
                msd, osd = get_state_dict(model, opt)
                rd.save_generation(args.location, rd.make_generation_id(update, attempt), update,
                                   state={"model": msd, "optimizer": osd},
                                   rank_state={"scheduler": sched.state_dict()}, recorder=rec)
            if update >= args.updates:
                break
        epoch += 1
    rec.end("completed")
    client.flush(10)
    if rank == 0:
        print(f"attempt {attempt}: completed at update {update}", flush=True)
    if distributed:
        del model
        dist.destroy_process_group()


def _spawned(rank: int, args, world: int) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    train(args, rank, world)


def main(argv=None) -> None:
    p = argparse.ArgumentParser()
    for name in ("--url", "--token", "--run-id", "--location"):
        p.add_argument(name, required=True)
    p.add_argument("--loader", choices=("torchdata", "plain"), default="torchdata")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--samples", type=int, default=96)
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--updates", type=int, default=12)
    p.add_argument("--save-every", type=int, default=4)
    p.add_argument("--crash-at", default=None, help="UPDATE:MICROBATCHES, e.g. 7:1")
    p.add_argument("--no-restore-loader", dest="restore_loader", action="store_false")
    p.add_argument("--truth", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.nproc > 1:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.multiprocessing.spawn(_spawned, args=(args, args.nproc), nprocs=args.nproc)
    else:
        train(args, 0, 1)


if __name__ == "__main__":
    main()
