"""PyTorch Lightning watched by recoverydash, in three lines::

    from recoverydash.integrations.lightning import RecoverydashCallback, resume_checkpoint
    trainer = Trainer(callbacks=[RecoverydashCallback(url=URL, token=TOKEN, run_id="my-run"),
                                 ModelCheckpoint(dirpath="ckpt", every_n_train_steps=50)])
    trainer.fit(model, loader, ckpt_path=resume_checkpoint("ckpt"))

What the callback does, on every rank:

- **Ledger, observed.** Each train dataloader, after Lightning prepared it (its
  ``DistributedSampler`` under DDP, through ``strategy.process_dataloader``), is made to carry
  positions in place (``recoverydash.integrations.hf.observe_loader``: ``ObservedDataset``,
  ``ObservedCollate``, a ``PositionSampler`` inside the batch sampler). The positions are taken
  off the batch in ``on_before_batch_transfer`` (your own hook still runs, on the clean batch),
  recorded when ``on_train_batch_start`` hands the batch to ``training_step``, and committed as
  update ``trainer.global_step`` in ``on_train_batch_end`` once an optimizer step happened (not
  while gradients accumulate). A batch the loader prefetched but the model never got is never
  reported.
- **Generations.** Every ``.ckpt`` written through the trainer (``ModelCheckpoint``, ``last.ckpt``,
  ``trainer.save_checkpoint``) is published after the file is completely written: the callback
  wraps the strategy's ``CheckpointIO`` (the innermost one, so under ``AsyncCheckpointIO`` the
  publication follows the write in its thread). One file holds several components; the manifest
  says so once: one object, ``component`` ``model`` and ``components`` listing what the saved
  dict holds (``model``: ``state_dict``; ``optimizer``: ``optimizer_states``; ``scheduler``:
  ``lr_schedulers``; ``data_progress``: ``loops`` and this callback's ledger state; ``rng``: the
  RNG states of every rank, which this callback adds to the checkpoint and restores when it is
  loaded). The manifest goes under ``<dirpath>/u<N>-a<attempt>-<file stem>/``; the ledger's
  committed cursor (the maximum over ranks) is its ``data_progress.cursor``. A checkpoint
  Lightning deletes (``save_top_k``) takes its manifest with it. A file saved again under a
  generation id already published (a re-save of the same step by a relaunch that reuses its
  attempt number) is published under the next free id: never a ``ManifestConflictError``. A
  file written again (``last.ckpt``, or any name with the version counter off) first retires
  the manifests of its earlier bytes: they would commit bytes that no longer exist.
- **Attempts** by the SDK's rule (``resolve_attempt``); rank 0 decides under DDP.
- **Resume.** ``resume_checkpoint(dirpath)`` returns the newest *restorable* ``.ckpt`` (verified
  size and sha256) for ``trainer.fit(ckpt_path=...)``, or None (a fresh start).

Not covered: iterable datasets (wrap them in ``ObservedIterableDataset``), ``training_step``
taking a ``dataloader_iter``, checkpoints written to remote (fsspec) paths, strategies that
write sharded checkpoint folders (FSDP, DeepSpeed): their saves are not published. Nothing here
raises into training.
"""

from __future__ import annotations

import logging
import os
import random
from typing import Any

import lightning.pytorch as pl
from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch.plugins.io.wrapper import _WrappingCheckpointIO

from recoverydash.integrations._checkpoints import (
    free_generation_id,
    generation_name,
    local_folder,
    manifest_naming,
    remove_manifest,
    resume_path,
    retire_manifests,
)
from recoverydash.integrations._prepared import observe_built_loader
from recoverydash.integrations._watch import Watch
from recoverydash.sdk import faults
from recoverydash.sdk.checkpoint import merge_cursors, publish_files
from recoverydash.sdk.observe import strip

log = logging.getLogger("recoverydash.integrations")

def checkpoint_components(checkpoint: dict, state_key: str | None = None) -> list[str]:
    """The components a Lightning checkpoint dict holds, from what is in it: ``model``
    (``state_dict``), ``optimizer`` (non-empty ``optimizer_states``), ``scheduler`` (non-empty
    ``lr_schedulers``), ``data_progress`` (``loops``), ``rng`` (this callback's RNG states under
    ``callbacks[state_key]``)."""
    out = []
    if checkpoint.get("state_dict") is not None:
        out.append("model")
    if checkpoint.get("optimizer_states"):
        out.append("optimizer")
    if checkpoint.get("lr_schedulers"):
        out.append("scheduler")
    if checkpoint.get("loops") is not None:
        out.append("data_progress")
    ours = (checkpoint.get("callbacks") or {}).get(state_key) if state_key else None
    if isinstance(ours, dict) and any(r.get("rng") for r in ours.get("ranks") or []):
        out.append("rng")
    return out


def _rng_state() -> dict:
    import torch

    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    import torch

    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "python" in state:
        v = state["python"]
        random.setstate((v[0], tuple(v[1]), v[2]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class _PublishingCheckpointIO(CheckpointIO):
    """Forwards to the CheckpointIO it wraps; after a save returns, the callback publishes the
    file; after a removal, the callback removes the file's manifest."""

    def __init__(self, inner: CheckpointIO, callback: RecoverydashCallback):
        self.inner = inner
        self.callback = callback

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        pending = self.callback._announce(checkpoint, path)
        self.inner.save_checkpoint(checkpoint, path, storage_options=storage_options)
        self.callback._publish(pending)

    def load_checkpoint(self, path, map_location=None, **kw):
        return self.inner.load_checkpoint(path, map_location=map_location, **kw)

    def remove_checkpoint(self, path):
        self.inner.remove_checkpoint(path)
        self.callback._forget(path)

    def teardown(self):
        self.inner.teardown()

    def __getattr__(self, name):
        if name in ("inner", "callback"):
            raise AttributeError(name)
        return getattr(self.inner, name)


class RecoverydashCallback(Watch, pl.Callback):
    """A Lightning ``Callback`` that reports the ledger, checkpoints and attempts of a run (module
    doc). Pass it in ``Trainer(callbacks=[...])``.

    url, token, run_id: the server, a token, the run; keywords ``dataset_version``, ``client``,
    ``required_components`` and ``Client`` arguments (``recoverydash.integrations._watch.Watch``).

    ``client`` and ``recorder`` exist from ``on_fit_start`` (None before)."""

    def __init__(self, url: str | None = None, token: str | None = None,
                 run_id: str | None = None, **kw: Any):
        Watch.__init__(self, url, token, run_id, **kw)
        self.modes: list[str] = []
        self._trainer = None
        self._tag = None
        self._published: dict[str, list[tuple[str, str]]] = {}  # file -> [(location, gen id)]

    # -- wiring --

    def setup(self, trainer, pl_module, stage):
        if stage != "fit":
            return
        try:
            self._trainer = trainer
            strategy = trainer.strategy
            holder, io = None, strategy.checkpoint_io
            while isinstance(io, _WrappingCheckpointIO) and io.checkpoint_io is not None:
                holder, io = io, io.checkpoint_io  # AsyncCheckpointIO: publish after its write
            if not isinstance(io, _PublishingCheckpointIO):
                if holder is None:
                    strategy.checkpoint_io = _PublishingCheckpointIO(io, self)
                else:
                    holder._checkpoint_io = _PublishingCheckpointIO(io, self)
            process = strategy.process_dataloader

            def process_dataloader(dataloader, _process=process):
                dataloader = _process(dataloader)
                if trainer.training and self.recorder is not None:
                    self.modes.append(observe_built_loader(dataloader, self.recorder))
                return dataloader

            strategy.process_dataloader = process_dataloader
            before = pl_module.on_before_batch_transfer

            def on_before_batch_transfer(batch, dataloader_idx, _before=before):
                try:
                    batch, tag = strip(batch)
                    if trainer.training:
                        self._tag = tag
                except Exception as e:  # noqa: BLE001 - never raises into training
                    self._log_once("strip", e)
                return _before(batch, dataloader_idx)

            pl_module.on_before_batch_transfer = on_before_batch_transfer
        except Exception as e:  # noqa: BLE001 - never raises into training
            self._log_once("setup", e)

    def teardown(self, trainer, pl_module, stage):
        if stage == "fit":
            pl_module.__dict__.pop("on_before_batch_transfer", None)
            trainer.strategy.__dict__.pop("process_dataloader", None)

    def on_fit_start(self, trainer, pl_module):
        try:
            location = None
            cb = trainer.checkpoint_callback
            if cb is not None and getattr(cb, "dirpath", None) and "://" not in str(cb.dirpath):
                location = local_folder(cb.dirpath)
            restored = self._resumed(trainer)
            self._start_sending(trainer.global_rank, trainer.world_size, location, restored)
        except Exception as e:  # noqa: BLE001 - never raises into training
            self._log_once("on_fit_start", e)

    def _resumed(self, trainer) -> dict | None:
        """The manifest of the checkpoint ``fit(ckpt_path=...)`` resumes (None: none)."""
        path = trainer.ckpt_path
        if not path or "://" in str(path):
            return None
        path = os.path.abspath(path)
        return manifest_naming(os.path.dirname(path), path)

    def on_train_start(self, trainer, pl_module):
        rec = self.recorder
        if rec is None:
            return
        try:
            resumed_from = None
            if trainer.ckpt_path:
                m = self._resumed(trainer)
                resumed_from = {"generation_id": (m or {}).get("generation_id"),
                                "update": int(trainer.global_step), "cursor": []}
                if m is None:
                    log.warning("recoverydash: resumed from %s, which has no manifest (reported "
                                "as resumed from an unknown generation)", trainer.ckpt_path)
            micro = _batch_size(trainer)
            accum = int(trainer.accumulate_grad_batches)
            fields = {"grad_accum_steps": accum}
            if micro:
                fields.update(micro_batch_size=micro,
                              global_batch_size=micro * accum * int(trainer.world_size))
            # configure_optimizers' LR schedulers, saved in the .ckpt's lr_schedulers
            scheduler = bool(getattr(trainer, "lr_scheduler_configs", None))
            rec.start(resumed_from=resumed_from, **fields, **self.contract_for(scheduler))
        except Exception as e:  # noqa: BLE001 - never raises into training
            self._log_once("on_train_start", e)

    # -- the ledger --

    def on_train_epoch_start(self, trainer, pl_module):
        if self.recorder is not None:
            self.recorder.set_epoch(int(trainer.current_epoch))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.recorder is not None:
            tag, self._tag = self._tag, None
            self.recorder.record(tag)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        rec = self.recorder
        if rec is not None and trainer.global_step > rec.update:
            rec.commit(int(trainer.global_step))

    def on_train_end(self, trainer, pl_module):
        if self.recorder is not None:
            self.recorder.end("completed")
            self.client.flush(10)

    def on_exception(self, trainer, pl_module, exception):
        if self.recorder is not None:
            self.recorder.end("failed", message=repr(exception))
            self.client.flush(5)

    # -- what goes into the checkpoint --

    def state_dict(self) -> dict:
        """Every rank's RNG states and committed ledger state (gathered: called on every rank
        while Lightning dumps a checkpoint), and their merged cursor."""
        try:
            own = {"rng": _rng_state(),
                   "ledger": self.recorder.state_dict() if self.recorder is not None else None}
            ranks: list[Any] = [own]
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
                ranks = [None] * dist.get_world_size()
                dist.all_gather_object(ranks, own)
            cursor = merge_cursors([(r.get("ledger") or {}).get("cursor") for r in ranks])
            return {"ranks": ranks, "cursor": cursor}
        except Exception as e:  # noqa: BLE001 - never raises into training
            self._log_once("state_dict", e)
            return {}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore this rank's RNG states (rank 0's when the world grew)."""
        try:
            ranks = state_dict.get("ranks") or []
            rank = self._trainer.global_rank if self._trainer is not None else 0
            mine = ranks[rank] if rank < len(ranks) else (ranks[0] if ranks else None)
            if mine and mine.get("rng"):
                _set_rng_state(mine["rng"])
        except Exception as e:  # noqa: BLE001 - never raises into training
            self._log_once("load_state_dict", e)

    # -- generations (called by the CheckpointIO wrapper, on global rank 0) --

    def _announce(self, checkpoint: dict, path) -> dict | None:
        try:
            if self.client is None or "://" in str(path):
                return None
            path = os.path.abspath(os.fspath(path))
            loc = os.path.dirname(path)
            update = int(checkpoint.get("global_step") or 0)
            stem = os.path.splitext(os.path.basename(path))[0]
            gen = free_generation_id(loc, generation_name(update, self.client.attempt, stem))
            components = checkpoint_components(checkpoint, self.state_key)
            retire_manifests(loc, path)  # last.ckpt, a version counter turned off: rewritten
            self.client.checkpoint_started(gen, update, ["rank0"], components)
            # a drill's before_shards: announced, the .ckpt not written yet
            faults.save_point("before_shards", gen, update, 0, client=self.client,
                              coordinator=True)
            cursor = ((checkpoint.get("callbacks") or {}).get(self.state_key) or {}).get("cursor")
            return {"path": path, "location": loc, "generation_id": gen, "update": update,
                    "components": components, "cursor": cursor}
        except Exception as e:  # noqa: BLE001 - never raises into training
            self._log_once("announce", e)
            return None

    def _publish(self, pending: dict | None) -> None:
        if pending is None:
            return
        try:
            path = pending["path"]
            cursor = pending["cursor"]
            result = publish_files(
                pending["location"], pending["generation_id"], pending["update"],
                {c: path for c in pending["components"]}, client=self.client,
                recorder=self.recorder,
                data_progress={"cursor": cursor} if cursor is not None else None,
                dataset_version=self.dataset_version,
                world_size=self._trainer.world_size if self._trainer is not None else None,
                required_components=self.required_components, shard="rank0", announced=True)
            if result.published:
                self._published.setdefault(path, []).append(
                    (pending["location"], pending["generation_id"]))
        except Exception as e:  # noqa: BLE001 - never raises into training
            self._log_once("publish", e)

    def _forget(self, path) -> None:
        try:
            for loc, gen in self._published.pop(os.path.abspath(os.fspath(path)), []):
                remove_manifest(loc, gen)
        except Exception as e:  # noqa: BLE001 - never raises into training
            self._log_once("forget", e)


def _batch_size(trainer) -> int | None:
    try:
        loader = trainer.train_dataloader
        bs = getattr(loader, "batch_size", None)
        return int(bs) if isinstance(bs, int) else None
    except Exception:  # noqa: BLE001 - never raises into training
        return None


def resume_checkpoint(dirpath: str | os.PathLike, *, url: str | None = None,
                      token: str | None = None, run_id: str | None = None,
                      world_size: int | None = None,
                      dataset_version: str | None = None) -> str | None:
    """The newest restorable ``.ckpt`` under ``dirpath`` (joined to ``dirpath`` as given, so a
    relative folder stays relative), for ``trainer.fit(ckpt_path=...)``; None when nothing is
    restorable (a fresh start). Restorable: its manifest is complete and the file has the size and
    sha256 it says (``select_restorable``); with ``url`` the server's restore plan decides, which
    also checks the data ledger, and its choice is verified in storage again. Every rank gets the
    same answer (rank 0 decides under torch.distributed). Never raises."""
    env = os.environ.get("WORLD_SIZE", "")
    return resume_path(dirpath, checkpoint_file, url=url, token=token, run_id=run_id,
                       world_size=world_size or (int(env) if env.isdigit() else None),
                       dataset_version=dataset_version)


def checkpoint_file(manifest: dict, location: str) -> str | None:
    """The ``.ckpt`` file of ``manifest`` (the object carrying the model), None when it has
    none under ``location``."""
    for o in manifest.get("objects") or []:
        uri = o.get("uri", "")
        held = o.get("components") or [o.get("component")]
        if uri.startswith("file://") and "model" in held:
            path = uri[len("file://"):]
            if os.path.dirname(path) == location:
                return path
    return None


__all__ = ["RecoverydashCallback", "checkpoint_components", "checkpoint_file",
           "resume_checkpoint"]
