"""Megatron-Core's GPT datasets (a blend of two sources), its batch-size ramp-up, and a pretraining
loop on CPU/gloo, watched by recoverydash in tokens: crash it, launch it again, and the ledger
says whether the restart continued the token stream.

    python examples/megatron_gpt.py --url http://localhost:8000 --token "$TOKEN" \\
        --run-id demo-megatron --location ./ckpt --updates 30 --save-every 10 --crash-at-update 25
    python examples/megatron_gpt.py ... (the same)          # resumes from update 20, exact

Works under torchrun (each data-parallel rank its micro-batch share of every global batch; the
next launch may use another number of ranks: Megatron's order is global, so the restart is still
exact). The data are synthetic and made here: every token's value is its offset in its source's
stream, so the sample log (``--sample-log``) shows exactly which tokens the model received.

Faults for demonstrations and tests: ``--crash-at-update U --crash-after-micro K`` dies inside
update U+1 after K microbatches (killed mid-accumulation); ``--no-restore-data`` restores the
model but restarts ``consumed_samples`` at 0 (the loader state not restored: a replay);
``--lag-data-state`` saves the ``consumed_samples`` of the update before (a checkpoint whose data
state is one step behind its model: the server rejects it, ``data_cursor_mismatch``).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

import recoverydash.sdk as rd
from recoverydash.integrations.megatron import ObservedMegatronDataset, attempt_fields
from recoverydash.sdk.observe import ObservedCollate

DATASET = "synthetic-gpt-v1"
SOURCES = (("web", 0, 260), ("code", 1_000_000, 140))  # name, first token value, documents


class Tokenizer:
    """What GPTDatasetConfig reads of a tokenizer."""
    eod, pad, vocab_size = 0, -1, 2_000_000
    unique_identifiers = {"class": "synthetic"}


def build_data(folder: str, seq: int, samples: int, seed: int):
    """Two indexed sources of consecutive-integer documents, blended 2:1 by Megatron's builder."""
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    os.makedirs(folder, exist_ok=True)
    prefixes = []
    for name, first, docs in SOURCES:
        prefix = os.path.join(folder, name)
        prefixes.append(prefix)
        if os.path.exists(prefix + ".idx") or dist.get_rank() != 0:
            continue
        rng = np.random.default_rng(len(name))
        builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.int32)
        tok = first
        for _ in range(docs):
            n = int(rng.integers(8, 48))
            builder.add_document(torch.arange(tok, tok + n, dtype=torch.int32), [n])
            tok += n
        builder.finalize(prefix + ".idx")
    dist.barrier()  # rank 0 wrote the sources
    config = GPTDatasetConfig(
        random_seed=seed, sequence_length=seq, blend=(prefixes, [2.0, 1.0]), split="100,0,0",
        tokenizer=Tokenizer(), reset_position_ids=False, reset_attention_mask=False,
        eod_mask_loss=False, create_attention_mask=False,
        path_to_cache=os.path.join(folder, "cache"), mid_level_dataset_surplus=0.005)
    train, _valid, _test = BlendedMegatronDatasetBuilder(
        GPTDataset, [samples, 0, 0], lambda: True, config).build()
    return train


class PretrainingBatches:
    """Megatron's pretraining order: global micro-batch steps of ``micro * dp`` samples taken in
    index order from ``consumed_samples``, rank ``r`` taking ``[r * micro, (r + 1) * micro)`` of
    each; an incomplete last step is dropped."""

    def __init__(self, total: int, consumed: int, micro: int, rank: int, world: int):
        self.total, self.consumed, self.micro = total, consumed, micro
        self.rank, self.world = rank, world

    def __iter__(self):
        step = self.micro * self.world
        start = self.consumed
        while start + step <= self.total:
            lo = start + self.rank * self.micro
            yield list(range(lo, lo + self.micro))
            start += step


def token_runs(values: torch.Tensor) -> list[list[int]]:
    """Token values as ``[first, last + 1]`` runs of consecutive values (the sample log)."""
    out: list[list[int]] = []
    for v in values.flatten().tolist():
        if out and out[-1][1] == v:
            out[-1][1] = v + 1
        else:
            out.append([v, v + 1])
    return out


def train(args: argparse.Namespace) -> None:
    from megatron.core import num_microbatches_calculator as nmc

    if not dist.is_initialized():
        if "WORLD_SIZE" in os.environ:
            dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, ...
        else:  # Megatron's dataset builder asks the process group who builds the index cache
            store = dist.FileStore(tempfile.mktemp(prefix="megatron-store-"), 1)
            dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    rank, world = dist.get_rank(), dist.get_world_size()
    data = build_data(args.data, args.seq, args.samples, args.seed)
    train_ds = ObservedMegatronDataset(data, units="tokens")          # recoverydash
    nmc.init_num_microbatches_calculator(rank, args.rampup, args.global_batch, args.micro, world,
                                         False)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(4096, 16), torch.nn.Linear(16, 4096))
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda u: min(1.0, (u + 1) / 5))  # warmup

    # What to restore: rank 0 asks the server (storage when the server is down), all ranks load
    # the same generation.
    plan = [rd.restore_plan(args.url, args.token, args.run_id, location=args.location,
                            world_size=world, dataset_version=DATASET) if rank == 0 else None]
    dist.broadcast_object_list(plan)
    plan = plan[0]
    client = rd.init(args.url, args.token, args.run_id, location=args.location, restored=plan)
    rec = rd.ObservedRecorder(client, dataset_version=DATASET)
    update, consumed, resumed = 0, 0, None
    if plan["generation_id"]:
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        msd, osd = get_state_dict(model, opt)
        small = rd.load_generation(args.location, plan["generation_id"],
                                   state={"model": msd, "optimizer": osd}, client=client)
        if small.generation_id:
            set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)
            sched.load_state_dict(small["scheduler"])
            update, resumed = small.update, small.resumed_from
            consumed = int(small["train_state"]["consumed_samples"]) if args.restore_data else 0
    nmc.update_num_microbatches(consumed, consistency_check=False)
    rec.start(resumed_from=resumed, **attempt_fields(                  # recoverydash
        train_ds, global_batch_size=args.global_batch, micro_batch_size=args.micro,
        rampup_batch_size=args.rampup))
    if rank == 0:
        print(f"attempt {client.attempt}: " + (f"resumed {resumed['generation_id']} at update "
                                               f"{update}, consumed_samples {consumed}"
                                               if resumed else "fresh start"), flush=True)
    log = open(args.sample_log, "a") if args.sample_log else None
    loader = DataLoader(train_ds, batch_sampler=PretrainingBatches(len(train_ds), consumed,
                                                                   args.micro, rank, world),
                        collate_fn=ObservedCollate())                  # recoverydash
    batches = iter(loader)
    previous_consumed = consumed
    while update < args.updates:
        micro_steps = nmc.get_num_microbatches()
        for k in range(micro_steps):
            try:
                batch = rec.observe(next(batches))                     # recoverydash
            except StopIteration:
                print("the dataset ran out", flush=True)
                update = args.updates
                break
            tokens, labels = batch["tokens"], batch["labels"]
            logits = model(tokens % 4096)
            torch.nn.functional.cross_entropy(logits.flatten(0, 1), (labels % 4096).flatten()) \
                .div(micro_steps).backward()
            if log is not None:
                log.write(json.dumps({"attempt": client.attempt, "rank": rank,
                                      "update": update + 1, "tokens": token_runs(tokens)}) + "\n")
                log.flush()
            if args.crash_at_update == update and args.crash_after_micro == k + 1:
                client.flush(5)
                os._exit(3)  # killed mid-accumulation: update + 1 never commits
        else:
            opt.step()
            sched.step()
            opt.zero_grad()
            update += 1
            rec.commit(update)                                         # recoverydash
            # as Megatron-LM counts consumed_train_samples: what the update's microbatches took
            previous_consumed, consumed = consumed, consumed + micro_steps * args.micro * world
            nmc.update_num_microbatches(consumed, consistency_check=False)
            if update % args.save_every == 0:
                from torch.distributed.checkpoint.state_dict import get_state_dict

                saved = previous_consumed if args.lag_data_state else consumed
                msd, osd = get_state_dict(model, opt)
                progress = DataState(rec, train_ds, saved)            # recoverydash
                rd.save_generation(args.location, rd.make_generation_id(update, client.attempt),
                                   update, state={"model": msd, "optimizer": osd},
                                   rank_state={"scheduler": sched.state_dict(),
                                               "train_state": {"consumed_samples": saved}},
                                   recorder=progress)
            if update == args.crash_at_update and args.crash_after_micro == 0:
                client.flush(5)
                os._exit(3)
            continue
        break
    rec.end("completed")
    client.flush(10)
    if rank == 0:
        print(f"attempt {client.attempt}: completed at update {update}", flush=True)
    dist.destroy_process_group()


class DataState:
    """The data progress a checkpoint holds: Megatron's ``consumed_samples`` as the ledger's
    cursor (``ObservedMegatronDataset.cursor``), with the recorder's own state beside it."""

    def __init__(self, rec: rd.ObservedRecorder, dataset: ObservedMegatronDataset, consumed: int):
        self.client, self.dataset_version = rec.client, rec.dataset_version
        self._rec, self._dataset, self._consumed = rec, dataset, consumed

    def cursor(self) -> list[dict]:
        return self._dataset.cursor(self._consumed)

    def state_dict(self) -> dict:
        return {**self._rec.state_dict(), "cursor": self.cursor(),
                "consumed_samples": self._consumed}


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default=os.environ.get("RECOVERYDASH_URL"), help="server base URL")
    p.add_argument("--token", default=os.environ.get("RECOVERYDASH_TOKEN"),
                   help="API token with scopes ingest and read")
    p.add_argument("--run-id", default="megatron-gpt")
    p.add_argument("--location", required=True, help="checkpoint folder or s3://bucket/prefix")
    p.add_argument("--data", default="./megatron-data", help="folder of the synthetic sources")
    p.add_argument("--updates", type=int, default=30, help="optimizer updates to reach")
    p.add_argument("--save-every", type=int, default=10, help="updates between checkpoints")
    p.add_argument("--seq", type=int, default=32, help="sequence length (tokens per sample)")
    p.add_argument("--samples", type=int, default=320, help="samples the index is built for")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--micro", type=int, default=2, help="micro-batch size per rank")
    p.add_argument("--global-batch", type=int, default=8, help="global batch after the ramp")
    p.add_argument("--rampup", type=int, nargs=3, default=None, metavar=("START", "INCR", "N"),
                   help="Megatron's rampup_batch_size: start, increment, ramp samples")
    p.add_argument("--crash-at-update", type=int, default=None,
                   help="die (os._exit(3)) after this update (with --crash-after-micro K: "
                        "inside the next update, after K microbatches)")
    p.add_argument("--crash-after-micro", type=int, default=0)
    p.add_argument("--no-restore-data", dest="restore_data", action="store_false",
                   help="restore the model but start consumed_samples at 0: the restart replays")
    p.add_argument("--lag-data-state", action="store_true",
                   help="save the consumed_samples of the update before (a stale data state)")
    p.add_argument("--sample-log", default=None,
                   help="append one JSON line per microbatch: the token values the model got")
    return p.parse_args(argv)


if __name__ == "__main__":
    train(parse())
