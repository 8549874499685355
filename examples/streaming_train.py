"""Mosaic Streaming (a 3:1 mixture of two local MDS streams written here) in a CPU/gloo loop,
watched by recoverydash: crash it, launch it again on another number of ranks, and the ledger
says whether the restart continued Streaming's global sample order.

    torchrun --nproc_per_node 4 examples/streaming_train.py --url http://localhost:8000 \\
        --token "$TOKEN" --run-id demo-streaming --location ./ckpt --updates 40 --crash-at-update 25
    torchrun --nproc_per_node 3 examples/streaming_train.py ... (the same)    # resumes from 20

Streaming resumes by sample count (``StreamingDataLoader.state_dict()``: epoch and
``sample_in_epoch``) and repartitions the rest of the epoch over the ranks it finds: the
restart is exact on 4, 3 or 6 ranks. Each sample's value is its stream's sample index (plus
100,000 for the second stream), so the sample log (``--sample-log``) shows exactly what the
model received.

Faults for demonstrations and tests: ``--crash-at-update U --crash-after-micro K`` (killed
mid-accumulation); ``--no-restore-loader`` (the model restored, the loader state not: the epoch
starts over, a replay); ``--lag-data-state`` (the checkpoint holds the loader state of the update
before: rejected, ``data_cursor_mismatch``).
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist

import recoverydash.sdk as rd
from recoverydash.integrations.streaming import observe_streaming, streaming_base, streaming_cursor
from recoverydash.sdk.observe import ObservedCollate

DATASET = "synthetic-mds-v1"
STREAMS = (("web", 450, 0), ("code", 150, 100_000))  # name, samples, first value


def write_streams(folder: str) -> None:
    """Two MDS streams of int64 samples (rank 0 writes, the others wait)."""
    sb = streaming_base()
    if dist.get_rank() == 0:
        for name, n, first in STREAMS:
            if os.path.exists(os.path.join(folder, name, "index.json")):
                continue
            with sb.MDSWriter(out=os.path.join(folder, name), columns={"x": "int64"},
                              size_limit=4096) as out:
                for i in range(n):
                    out.write({"x": first + i})
    dist.barrier()


def train(args: argparse.Namespace) -> None:
    if "WORLD_SIZE" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    sb = streaming_base()
    write_streams(args.data)
    streams = [sb.Stream(local=os.path.join(args.data, "web"), proportion=0.75),
               sb.Stream(local=os.path.join(args.data, "code"), proportion=0.25)]
    dataset = observe_streaming(sb.StreamingDataset(               # recoverydash
        streams=streams, epoch_size=600, shuffle=True, shuffle_seed=args.seed,
        num_canonical_nodes=12, batch_size=args.micro))
    loader = sb.StreamingDataLoader(dataset, batch_size=args.micro,
                                    collate_fn=ObservedCollate())  # recoverydash
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.9)

    # What to restore: rank 0 asks the server (storage when the server is down), all ranks load
    # the same generation.
    plan = [rd.restore_plan(args.url, args.token, args.run_id, location=args.location,
                            world_size=world, dataset_version=DATASET) if rank == 0 else None]
    dist.broadcast_object_list(plan)
    plan = plan[0]
    client = rd.init(args.url, args.token, args.run_id, location=args.location, restored=plan)
    rec = rd.ObservedRecorder(client, dataset_version=DATASET)
    update, resumed = 0, None
    if plan["generation_id"]:
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        msd, osd = get_state_dict(model, opt)
        small = rd.load_generation(args.location, plan["generation_id"],
                                   state={"model": msd, "optimizer": osd}, client=client)
        if small.generation_id:
            set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)
            sched.load_state_dict(small["scheduler"])
            update, resumed = small.update, small.resumed_from
            if args.restore_loader:
                loader.load_state_dict(small["streaming"])  # Streaming's own resumption
    rec.start(resumed_from=resumed, global_batch_size=args.micro * args.accum * world,
              micro_batch_size=args.micro, grad_accum_steps=args.accum)
    if rank == 0:
        print(f"attempt {client.attempt} on {world} ranks: " + (
            f"resumed {resumed['generation_id']} at update {update}" if resumed
            else "fresh start"), flush=True)
    log = open(args.sample_log, "a") if args.sample_log else None
    previous = loader.state_dict() if args.lag_data_state else None
    micro = 0
    while update < args.updates:
        for batch in loader:
            batch = rec.observe(batch)                              # recoverydash
            x = batch["x"].float().unsqueeze(1)
            torch.nn.functional.mse_loss(model(x / 1000), x / 1000).div(args.accum).backward()
            micro += 1
            if log is not None:
                log.write(json.dumps({"attempt": client.attempt, "rank": rank,
                                      "update": update + 1,
                                      "epoch": int(dataset.next_epoch) - 1,
                                      "x": batch["x"].tolist()}) + "\n")
                log.flush()
            if args.crash_at_update == update and args.crash_after_micro \
                    and args.crash_after_micro == micro % args.accum:
                client.flush(5)
                os._exit(3)  # killed mid-accumulation
            if micro % args.accum:
                continue
            opt.step()
            sched.step()
            opt.zero_grad()
            update += 1
            rec.commit(update)                                      # recoverydash
            state = loader.state_dict()
            if update % args.save_every == 0:
                from torch.distributed.checkpoint.state_dict import get_state_dict

                saved = previous if args.lag_data_state else state
                msd, osd = get_state_dict(model, opt)
                rd.save_generation(
                    args.location, rd.make_generation_id(update, client.attempt), update,
                    state={"model": msd, "optimizer": osd},
                    rank_state={"scheduler": sched.state_dict(), "streaming": saved},
                    recorder=DataState(rec, streaming_cursor(dataset, saved)))  # recoverydash
            previous = state
            if update == args.crash_at_update and args.crash_after_micro == 0:
                client.flush(5)
                os._exit(3)
            if update >= args.updates:
                break
    rec.end("completed")
    client.flush(10)
    if rank == 0:
        print(f"attempt {client.attempt}: completed at update {update}", flush=True)
    dist.destroy_process_group()


class DataState:
    """The data progress a checkpoint holds: the cursor of the Streaming state saved in it
    (``streaming_cursor``), beside the recorder's own state."""

    def __init__(self, rec: rd.ObservedRecorder, cursor: list[dict]):
        self.client, self.dataset_version = rec.client, rec.dataset_version
        self._rec, self._cursor = rec, cursor

    def cursor(self) -> list[dict]:
        return self._cursor

    def state_dict(self) -> dict:
        return {**self._rec.state_dict(), "cursor": self._cursor}


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default=os.environ.get("RECOVERYDASH_URL"), help="server base URL")
    p.add_argument("--token", default=os.environ.get("RECOVERYDASH_TOKEN"),
                   help="API token with scopes ingest and read")
    p.add_argument("--run-id", default="streaming-train")
    p.add_argument("--location", required=True, help="checkpoint folder or s3://bucket/prefix")
    p.add_argument("--data", default="./mds", help="folder of the two local streams")
    p.add_argument("--updates", type=int, default=40, help="optimizer updates to reach")
    p.add_argument("--save-every", type=int, default=10, help="updates between checkpoints")
    p.add_argument("--micro", type=int, default=2, help="micro-batch size per rank")
    p.add_argument("--accum", type=int, default=2, help="microbatches per optimizer update")
    p.add_argument("--seed", type=int, default=17, help="Streaming's shuffle_seed")
    p.add_argument("--port", type=int, default=29517, help="rendezvous port without torchrun")
    p.add_argument("--crash-at-update", type=int, default=None,
                   help="die (os._exit(3)) after this update (with --crash-after-micro K: "
                        "inside the next update, after K microbatches)")
    p.add_argument("--crash-after-micro", type=int, default=0)
    p.add_argument("--no-restore-loader", dest="restore_loader", action="store_false",
                   help="restore the model but not Streaming's state: the epoch starts over")
    p.add_argument("--lag-data-state", action="store_true",
                   help="save the loader state of the update before (a stale data state)")
    p.add_argument("--sample-log", default=None,
                   help="append one JSON line per microbatch: the sample values the model got")
    return p.parse_args(argv)


if __name__ == "__main__":
    train(parse())
