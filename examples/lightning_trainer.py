"""PyTorch Lightning watched by recoverydash: crash it, launch it again, and the dashboard shows
which .ckpt was restorable and whether the restart continued the data stream.

    python examples/lightning_trainer.py --url http://localhost:8000 --token "$TOKEN" \\
        --run-id demo-pl --dirpath ./pl-ckpt --max-steps 40 --save-every 10 \\
        --crash-at-update 25                    # killed (SIGKILL) right after update 25
    python examples/lightning_trainer.py --url http://localhost:8000 --token "$TOKEN" \\
        --run-id demo-pl --dirpath ./pl-ckpt --max-steps 40 --save-every 10
                                                # resumes epoch=1-step=20.ckpt

The train loader is a plain ``DataLoader`` (shuffled by a seeded generator, so every launch draws
the same order). Lightning cannot resume such a loader mid-epoch: it restores its progress
counters (20 batches of the epoch done) but iterates the loader from its first batch and ends
the epoch after the batches it believes are left. The restart is therefore
``replay_and_omission``: the epoch's first 20 batches are fed again, its last 20 never. Pass a
torchdata ``StatefulDataLoader`` (``--stateful``) and Lightning saves and restores the loader's
state: the restart is ``exact``. With ``--devices 2`` it runs DDP on two CPU processes (gloo);
every rank reports its own positions.

The model gets each sample's index in the batch, so ``--sample-log`` records which samples it
received (independent of recoverydash), to compare with the dashboard's counts.

The recoverydash part is three lines, marked below.
"""

from __future__ import annotations

import argparse
import json
import os
import signal

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from recoverydash.integrations.lightning import RecoverydashCallback, resume_checkpoint  # (1)


class Regression(pl.LightningModule):
    """A small MLP on synthetic regression data; batches are ``(x, y, index)``."""

    def __init__(self, sample_log: str | None = None, crash_at: int | None = None,
                 watcher: RecoverydashCallback | None = None):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                       torch.nn.Linear(32, 1))
        self.crash_at, self.watcher = crash_at, watcher
        self.log_fd = os.open(sample_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) \
            if sample_log else None

    def training_step(self, batch, batch_idx):
        x, y, index = batch
        if self.log_fd is not None:  # what this microbatch brought to the model
            line = {"attempt": self.watcher.client.attempt, "rank": self.global_rank,
                    "epoch": self.current_epoch, "update": self.trainer.global_step + 1,
                    "indices": index.tolist()}
            os.write(self.log_fd, (json.dumps(line) + "\n").encode())
        return torch.nn.functional.mse_loss(self.net(x), y)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.crash_at is not None and self.trainer.global_step == self.crash_at:
            self.watcher.client.flush(10)  # the dying attempt's updates are all on the server
            os.kill(os.getpid(), signal.SIGKILL)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-3)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.9)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def loader(a: argparse.Namespace):
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(a.samples, 16, generator=g),
                         torch.randn(a.samples, 1, generator=g), torch.arange(a.samples))
    order = torch.Generator().manual_seed(1)
    if a.stateful:
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(data, batch_size=a.batch, shuffle=True, generator=order)
    return DataLoader(data, batch_size=a.batch, shuffle=True, generator=order)


def main(argv=None) -> None:
    a = parse(argv)
    pl.seed_everything(0, verbose=False)
    watcher = RecoverydashCallback(url=a.url, token=a.token, run_id=a.run_id,  # (2)
                                   dataset_version="regression-v1")
    trainer = pl.Trainer(
        max_steps=a.max_steps, accelerator="cpu", devices=a.devices,
        strategy="ddp" if a.devices > 1 else "auto", accumulate_grad_batches=a.accum,
        callbacks=[watcher, ModelCheckpoint(dirpath=a.dirpath, every_n_train_steps=a.save_every,
                                            save_top_k=-1)],
        logger=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, use_distributed_sampler=True)
    model = Regression(a.sample_log, a.crash_at_update, watcher)
    ckpt = resume_checkpoint(a.dirpath, url=a.url, token=a.token, run_id=a.run_id)  # (3)
    if trainer.is_global_zero:
        print(f"resuming {ckpt}" if ckpt else "fresh start", flush=True)
    trainer.fit(model, loader(a), ckpt_path=ckpt)
    if trainer.is_global_zero:
        print(f"attempt {watcher.client.attempt}: completed at update {trainer.global_step}",
              flush=True)


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default=os.environ.get("RECOVERYDASH_URL"), help="server base URL")
    p.add_argument("--token", default=os.environ.get("RECOVERYDASH_TOKEN"),
                   help="API token with scopes ingest and read")
    p.add_argument("--run-id", default="lightning-trainer")
    p.add_argument("--dirpath", required=True, help="ModelCheckpoint's folder")
    p.add_argument("--max-steps", type=int, default=40, help="optimizer updates to reach")
    p.add_argument("--save-every", type=int, default=10, help="updates between checkpoints")
    p.add_argument("--crash-at-update", type=int, default=None,
                   help="SIGKILL this process right after this update, for demonstrations")
    p.add_argument("--samples", type=int, default=160, help="dataset size")
    p.add_argument("--batch", type=int, default=4, help="microbatch size per rank")
    p.add_argument("--accum", type=int, default=1, help="microbatches per optimizer update")
    p.add_argument("--devices", type=int, default=1, help="CPU processes (DDP with gloo)")
    p.add_argument("--stateful", action="store_true",
                   help="a torchdata StatefulDataLoader, which Lightning resumes mid-epoch")
    p.add_argument("--sample-log", default=None,
                   help="append the sample indices of every microbatch the model got (JSON lines)")
    return p.parse_args(argv)


if __name__ == "__main__":
    main()
