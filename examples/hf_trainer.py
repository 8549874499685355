"""HF Transformers Trainer watched by recoverydash: crash it, launch it again, and the dashboard
shows which checkpoint-N was restorable and whether the restart continued the data stream.

    python examples/hf_trainer.py --url http://localhost:8000 --token "$TOKEN" \\
        --run-id demo-hf --output-dir ./hf-out --max-steps 40 --save-steps 10 \\
        --crash-at-update 25                    # killed (SIGKILL) right after update 25
    python examples/hf_trainer.py --url http://localhost:8000 --token "$TOKEN" \\
        --run-id demo-hf --output-dir ./hf-out --max-steps 40 --save-steps 10
                                                # resumes checkpoint-20: restart exact
Add ``--ignore-data-skip`` to the second launch to see a replay: Trainer then restarts the epoch
from its first batch while the model resumes at update 20, and the restart is ``replay`` of
exactly the samples it fed again. Under torchrun (``torchrun --nproc_per_node 2
examples/hf_trainer.py ...``) every rank reports its own positions (gloo on the CPU).

A tiny GPT-2 built from a config (random weights) on synthetic token sequences: nothing is
downloaded. The first token of sample i is i, so ``--sample-log`` can record which samples the
model received, read from the batch itself (independent of recoverydash), to compare with the
dashboard's counts.

The recoverydash part is three lines, marked below.
"""

from __future__ import annotations

import argparse
import json
import os
import signal

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from recoverydash.integrations.hf import resume_checkpoint, watch_trainer  # (1)

SEQ = 8


class Tokens(torch.utils.data.Dataset):
    """``n`` synthetic sequences of ``SEQ`` tokens; sample i starts with token i."""

    def __init__(self, n: int, vocab: int):
        self.n, self.vocab = n, vocab

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        ids = torch.tensor([i] + [(i * 7 + k * 13) % self.vocab for k in range(1, SEQ)])
        return {"input_ids": ids, "labels": ids.clone()}


class Faults(TrainerCallback):
    """``--crash-at-update``: SIGKILL this process right after that update (events flushed
    first, so the dashboard shows every committed update of the dying attempt)."""

    def __init__(self, crash_at: int | None, watcher):
        self.crash_at, self.watcher = crash_at, watcher

    def on_step_end(self, args, state, control, **kw):
        if self.crash_at is not None and state.global_step == self.crash_at:
            self.watcher.client.flush(10)
            os.kill(os.getpid(), signal.SIGKILL)


def sample_logger(path: str, trainer: Trainer, watcher):
    """A forward pre-hook appending one JSON line per training microbatch the model received:
    attempt, rank, epoch, the update it belongs to and the sample indices (first tokens)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def hook(module, args, kwargs):
        if not (torch.is_grad_enabled() and module.training) or "input_ids" not in kwargs:
            return
        st = trainer.state
        line = {"attempt": watcher.client.attempt, "rank": trainer.args.process_index,
                "epoch": int(st.epoch or 0), "update": st.global_step + 1,
                "indices": kwargs["input_ids"][:, 0].tolist()}
        os.write(fd, (json.dumps(line) + "\n").encode())

    return hook


def main(argv=None) -> None:
    a = parse(argv)
    config = GPT2Config(n_layer=1, n_head=2, n_embd=32, n_positions=SEQ,
                        vocab_size=max(128, a.samples), bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    args = TrainingArguments(
        output_dir=a.output_dir, max_steps=a.max_steps, save_steps=a.save_steps,
        per_device_train_batch_size=a.batch, gradient_accumulation_steps=a.accum,
        learning_rate=1e-3, seed=a.seed, use_cpu=True, report_to=[], disable_tqdm=True,
        logging_steps=10**6, ignore_data_skip=a.ignore_data_skip)
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(a.samples, config.vocab_size))
    watcher = watch_trainer(trainer, url=a.url, token=a.token, run_id=a.run_id,  # (2)
                            dataset_version="tokens-v1")
    trainer.add_callback(Faults(a.crash_at_update, watcher))
    if a.sample_log:
        model.register_forward_pre_hook(sample_logger(a.sample_log, trainer, watcher),
                                        with_kwargs=True)
    resume = resume_checkpoint(a.output_dir, url=a.url, token=a.token, run_id=a.run_id)  # (3)
    if args.process_index == 0:
        print(f"resuming {resume}" if resume else "fresh start", flush=True)
    trainer.train(resume_from_checkpoint=resume)
    if args.process_index == 0:
        print(f"attempt {watcher.client.attempt}: completed at update "
              f"{trainer.state.global_step}", flush=True)


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default=os.environ.get("RECOVERYDASH_URL"), help="server base URL")
    p.add_argument("--token", default=os.environ.get("RECOVERYDASH_TOKEN"),
                   help="API token with scopes ingest and read")
    p.add_argument("--run-id", default="hf-trainer")
    p.add_argument("--output-dir", required=True, help="Trainer's output_dir (checkpoint-N)")
    p.add_argument("--max-steps", type=int, default=40, help="optimizer updates to reach")
    p.add_argument("--save-steps", type=int, default=10, help="updates between checkpoints")
    p.add_argument("--crash-at-update", type=int, default=None,
                   help="SIGKILL this process right after this update, for demonstrations")
    p.add_argument("--ignore-data-skip", action="store_true",
                   help="Trainer's ignore_data_skip: a resumed epoch starts from its first batch")
    p.add_argument("--samples", type=int, default=96, help="dataset size")
    p.add_argument("--seed", type=int, default=0,
                   help="Trainer's seed (the order of the samples; the model starts the same)")
    p.add_argument("--batch", type=int, default=4, help="microbatch size per rank")
    p.add_argument("--accum", type=int, default=2, help="microbatches per optimizer update")
    p.add_argument("--sample-log", default=None,
                   help="append the sample indices of every microbatch the model got (JSON lines)")
    return p.parse_args(argv)


if __name__ == "__main__":
    main()
