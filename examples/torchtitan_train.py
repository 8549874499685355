"""torchtitan's checkpoint manager and text dataloader in a CPU/gloo training loop, watched by
recoverydash: crash it, launch it again, and it resumes from the newest *restorable* step (not
torchtitan's newest folder with a ``.metadata``), with the token stream checked.

    python examples/torchtitan_train.py --url http://localhost:8000 --token "$TOKEN" \\
        --run-id demo-titan --dump ./titan --steps 30 --save-every 10 --crash-at-step 25
    python examples/torchtitan_train.py ... (the same)                  # resumes step 20

torchtitan's ``Trainer`` needs an accelerator (it picks ``cuda`` when none is found and
``torch.cuda.set_device`` fails on a CPU-only torch), so this loop is ours, built from
torchtitan's components: ``CheckpointManager`` (DCP folders ``step-N/``, sync or async saves,
``keep_latest_k``) and ``HuggingFaceTextDataLoader`` (a ``ParallelAwareDataloader``: one
``StatefulDataLoader`` per data-parallel rank over ``HuggingFaceTextDataset``, which tokenizes
documents into a buffer and cuts ``seq_len`` sequences). The documents are written here, as
numbers: every token's value is its offset in the corpus, so the sample log (``--sample-log``)
says exactly which tokens the model received.

Faults for demonstrations and tests: ``--crash-at-step S --crash-after-micro K`` (killed
mid-accumulation); ``--exclude-dataloader`` (the model restored, the dataloader state not:
torchtitan's ``exclude_from_loading``); ``--workers 1 --snapshot-every N`` (the dataloader
state a save writes is the worker's last snapshot, behind the model when ``N`` is not a multiple
of the microbatches per save); ``--async-mode async`` (saves published when their upload
completes).
"""

from __future__ import annotations

import argparse
import json
import os

import torch
import torch.distributed as dist

import recoverydash.sdk as rd
from recoverydash.integrations.torchtitan import resume_torchtitan, watch_torchtitan

DATASET = "synthetic-text-v1"


def write_corpus(folder: str, docs: int = 400) -> None:
    """``docs`` documents of 20-79 numbers: the values are consecutive over the corpus."""
    path = os.path.join(folder, "train.jsonl")
    if os.path.exists(path):
        return
    os.makedirs(folder, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    tok, lines = 0, []
    for _ in range(docs):
        n = int(torch.randint(20, 80, (1,), generator=g))
        lines.append(json.dumps({"text": " ".join(str(v) for v in range(tok, tok + n))}))
        tok += n
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(path + ".tmp", path)


def build(args: argparse.Namespace, rank: int, world: int):
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.components.tokenizer import BaseTokenizer
    from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader

    class NumberTokenizer(BaseTokenizer):
        """Text of numbers -> those numbers (no BOS/EOS: each document's last number is only a
        label, as torchtitan shifts inputs and labels within a document)."""

        def encode(self, text: str, *a, **k) -> list[int]:
            return [int(t) for t in text.split()]

        def decode(self, ids, *a, **k) -> str:
            return " ".join(str(i) for i in ids)

        def get_vocab_size(self) -> int:
            return 1 << 20

    loader = HuggingFaceTextDataLoader(
        HuggingFaceTextDataLoader.Config(dataset="c4_test", dataset_path=args.corpus,
                                         num_workers=args.workers,
                                         persistent_workers=args.workers > 0),
        dp_world_size=world, dp_rank=rank, tokenizer=NumberTokenizer(), seq_len=args.seq,
        local_batch_size=args.micro, snapshot_every_n_steps=args.snapshot_every)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(4096, 16), torch.nn.Linear(16, 4096))
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda u: min(1.0, (u + 1) / 5))
    train_state = TrainState()
    manager = CheckpointManager(
        CheckpointManager.Config(enable=True, folder=args.checkpoint_folder,
                                 interval=args.save_every,
                                 keep_latest_k=args.keep, async_mode=args.async_mode,
                                 last_save_model_only=False,
                                 exclude_from_loading=["dataloader"]
                                 if args.exclude_dataloader else []),
        dataloader=loader, model_parts=[model], optimizers=OptimizerState(model, opt),
        lr_schedulers=Stateful(sched), states={"train_state": train_state}, sd_adapter=None,
        base_folder=args.dump)
    return loader, model, opt, sched, manager, train_state


class Stateful:
    """A torch object as DCP's Stateful (its ``state_dict`` / ``load_state_dict``)."""

    def __init__(self, obj):
        self.obj = obj

    def state_dict(self):
        return self.obj.state_dict()

    def load_state_dict(self, sd):
        self.obj.load_state_dict(sd)


class OptimizerState:
    """The optimizer as DCP's Stateful, keyed by parameter names (what torchtitan's
    ``OptimizersContainer`` does for its optimizers)."""

    def __init__(self, model, opt):
        self.model, self.opt = model, opt

    def state_dict(self):
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(self.model, self.opt)

    def load_state_dict(self, sd):
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

        set_optimizer_state_dict(self.model, self.opt, sd)


class TrainState:
    """The step, as torchtitan's trainer saves it (``train_state``)."""

    def __init__(self):
        self.step = 0

    def state_dict(self):
        return {"step": self.step}

    def load_state_dict(self, sd):
        self.step = int(sd["step"])


def train(args: argparse.Namespace) -> None:
    if "WORLD_SIZE" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(args.port))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        write_corpus(args.corpus)
    dist.barrier()
    loader, model, opt, sched, manager, state = build(args, rank, world)
    client = rd.init(args.url, args.token, args.run_id, location=manager.folder)
    rec = rd.ObservedRecorder(client, dataset_version=DATASET)
    watch_torchtitan(manager, loader, rec)                                          # recoverydash
    resumed = resume_torchtitan(manager, rec)  # recoverydash: the newest restorable step, loaded
    if resumed is None and args.torchtitan_load:  # torchtitan's own choice: its newest .metadata
        if manager.load(step=-1):
            resumed = {"generation_id": None, "update": state.step}
    rec.start(resumed_from=resumed, global_batch_size=args.micro * args.accum * world * args.seq,
              micro_batch_size=args.micro, grad_accum_steps=args.accum)
    if rank == 0:
        print(f"attempt {client.attempt}: " + (f"resumed step {state.step}" if resumed
                                               else "fresh start"), flush=True)
    log = open(args.sample_log, "a") if args.sample_log else None
    batches = iter(loader)
    while state.step < args.steps:
        for k in range(args.accum):
            input_dict, labels = next(batches)
            input_dict = rec.observe(input_dict)                                    # recoverydash
            logits = model(input_dict["input"] % 4096)
            torch.nn.functional.cross_entropy(logits.flatten(0, 1), (labels % 4096).flatten()) \
                .div(args.accum).backward()
            if log is not None:
                log.write(json.dumps({"attempt": client.attempt, "rank": rank,
                                      "update": state.step + 1,
                                      "tokens": input_dict["input"].flatten().tolist()}) + "\n")
                log.flush()
            if args.crash_at_step == state.step and args.crash_after_micro == k + 1:
                client.flush(5)
                os._exit(3)
        opt.step()
        sched.step()
        opt.zero_grad()
        state.step += 1
        rec.commit(state.step)                                                      # recoverydash
        manager.save(state.step, last_step=state.step == args.steps)
        if state.step == args.crash_at_step and not args.crash_after_micro:
            manager.maybe_wait_for_saving()
            client.flush(5)
            os._exit(3)
    manager.maybe_wait_for_saving()
    rec.end("completed")
    client.flush(10)
    if rank == 0:
        print(f"attempt {client.attempt}: completed at step {state.step}", flush=True)
    manager.close()
    dist.destroy_process_group()


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default=os.environ.get("RECOVERYDASH_URL"), help="server base URL")
    p.add_argument("--token", default=os.environ.get("RECOVERYDASH_TOKEN"),
                   help="API token with scopes ingest and read")
    p.add_argument("--run-id", default="torchtitan-train")
    p.add_argument("--dump", default="./titan", help="torchtitan's dump folder")
    p.add_argument("--checkpoint-folder", default="checkpoint",
                   help="checkpoint.folder, relative to the dump folder")
    p.add_argument("--corpus", default="./corpus", help="folder of the synthetic documents")
    p.add_argument("--steps", type=int, default=30, help="optimizer updates to reach")
    p.add_argument("--save-every", type=int, default=10, help="checkpoint.interval")
    p.add_argument("--keep", type=int, default=0, help="checkpoint.keep_latest_k")
    p.add_argument("--async-mode", default="disabled",
                   choices=["disabled", "async", "async_with_pinned_mem"])
    p.add_argument("--seq", type=int, default=64, help="seq_len (tokens per sequence)")
    p.add_argument("--micro", type=int, default=2, help="local batch size")
    p.add_argument("--accum", type=int, default=2, help="microbatches per optimizer update")
    p.add_argument("--workers", type=int, default=0, help="dataloader worker processes")
    p.add_argument("--snapshot-every", type=int, default=1,
                   help="StatefulDataLoader snapshot_every_n_steps (with --workers)")
    p.add_argument("--port", type=int, default=29527, help="rendezvous port without torchrun")
    p.add_argument("--crash-at-step", type=int, default=None,
                   help="die (os._exit(3)) after this step (with --crash-after-micro K: inside "
                        "the next step, after K microbatches)")
    p.add_argument("--crash-after-micro", type=int, default=0)
    p.add_argument("--exclude-dataloader", action="store_true",
                   help="checkpoint.exclude_from_loading=['dataloader']: the stream starts over")
    p.add_argument("--torchtitan-load", action="store_true",
                   help="when nothing is restorable, let torchtitan load its newest folder anyway")
    p.add_argument("--sample-log", default=None,
                   help="append one JSON line per microbatch: the token values the model got")
    return p.parse_args(argv)


if __name__ == "__main__":
    train(parse())
