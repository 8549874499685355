"""HF Transformers ``Trainer`` watched by recoverydash, in three lines::

    from recoverydash.integrations.hf import resume_checkpoint, watch_trainer
    watch_trainer(trainer, url=URL, token=TOKEN, run_id="my-run")
    trainer.train(resume_from_checkpoint=resume_checkpoint(args.output_dir))

(or ``Trainer(..., callbacks=[RecoverydashCallback(url=..., token=..., run_id=...)])``: the same
callback; ``watch_trainer`` adds it to a Trainer that exists already.)

What it does, on every rank:

- **Ledger, observed.** When training begins, the train dataloader Trainer built (after
  ``accelerator.prepare``) is made to carry positions (``recoverydash.sdk.observe``): its dataset
  becomes an ``ObservedDataset``, its collate function an ``ObservedCollate`` around Trainer's own
  (which still removes the columns the model does not take), and the sampler inside its batch
  sampler a ``PositionSampler`` (position k of an epoch: the k-th index of the permutation;
  ranks of a multi-process run take disjoint batches of it). A forward pre-hook on the model
  strips the positions before ``forward`` and records them: only samples that reached the model
  are consumed. Trainer's skip-on-resume (``skip_first_batches``) drops the batches it skips
  before they are fetched, and ``get_batch_samples`` prefetches a whole accumulation group: what
  was skipped or prefetched but never trained is never reported. ``on_step_end`` (after
  ``optimizer.step()``, the scheduler and ``global_step += 1``) commits update ``global_step``.
- **Generations.** Every ``checkpoint-N/`` Trainer writes is published once ``on_save`` says it
  is complete (``publish_files``): every file with its size and sha256, mapped to components
  (``model``: ``model.safetensors`` / ``pytorch_model.bin`` / weight shards;
  ``optimizer``: ``optimizer.pt``; ``scheduler``: ``scheduler.pt``; ``rng``: ``rng_state*.pth``,
  one per rank; ``data_progress``: ``trainer_state.json``; also ``config`` (``config.json``,
  index and layout files: the same in every save, so not compared for ``stale_state``),
  ``scaler``, ``training_args``, ``tokenizer``, ``other``). Each rank describes the files it wrote
  (its ``rng_state_<r>.pth``; rank 0 the rest), rank 0 publishes the manifest under
  ``<output_dir>/u<N>-a<attempt>/`` (the folder Trainer never touches), with the ledger's committed
  cursor (the maximum over ranks) as ``data_progress.cursor``. When Trainer's ``save_total_limit``
  deletes a checkpoint folder, its manifest folder goes too; when a relaunch reaches update N again
  and Trainer rewrites ``checkpoint-N/`` in place, the earlier manifest of that folder is retired
  first. ``checkpoint_started`` is sent when Trainer decides to save (a drill's ``before_shards``
  crash point fires there: ``recoverydash.sdk.faults``).
- **Attempts.** Numbered by the SDK's rule (``resolve_attempt``: manifests of ``output_dir``, the
  restored one, this host's state file, the server); rank 0 decides under torch.distributed.
- **Resume.** ``resume_checkpoint(output_dir)`` returns the newest *restorable* checkpoint folder
  (verified: every file there, of the size and sha256 the manifest says), or None for a fresh
  start. Trainer's own ``resume_from_checkpoint=True`` takes the newest folder, verified or not.

The attempt's ``resumed_from`` names the generation ``resume_checkpoint`` chose in this process
(else the newest manifest at the resumed update, else none: ``resumed_from_unknown``). Not
covered: hyperparameter search (its trial folders), iterable datasets (wrap them in
``ObservedIterableDataset`` yourself), accelerate's ``dispatch_batches``. Nothing here raises into
training: a failure is logged once and training goes on.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any

from transformers import TrainerCallback

from recoverydash.integrations._checkpoints import (
    agreed,
    chosen_path,
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
from recoverydash.sdk.checkpoint import publish_files

log = logging.getLogger("recoverydash.integrations")

_CHECKPOINT_RE = re.compile(r"^checkpoint-\d+$")
# (pattern on the path relative to the checkpoint folder, component); first match wins.
# ``config``: files describing configuration or layout, the same in every save (so never a
# model or optimizer object: those are compared across generations for ``stale_state``).
_COMPONENTS = [
    ((r"(^|/)(config\.json|generation_config\.json|adapter_config\.json|[^/]*\.index\.json|"
      r"\.metadata)$"), "config"),
    (r"(^|/)rng_state(_\d+)?\.pth$", "rng"),
    (r"(^|/)(optimizer\.(pt|bin)|optimizer_.*|rank\d+-of-\d+-optimizer\.pt|.*optim_states\.pt)$",
     "optimizer"),
    (r"(^|/)scheduler\.pt$", "scheduler"),
    (r"(^|/)scaler\.pt$", "scaler"),
    (r"(^|/)trainer_state\.json$", "data_progress"),
    (r"(^|/)training_args\.bin$", "training_args"),
    ((r"(^|/)((pytorch_)?model.*\.(safetensors|bin)|adapter_model.*|pytorch_model_fsdp.*|"
      r".*model_states\.pt|.*\.distcp)$"), "model"),
    ((r"(^|/)(tokenizer.*|special_tokens_map\.json|vocab\..*|merges\.txt|.*\.model|"
      r"chat_template\..*|preprocessor_config\.json|processor_config\.json)$"), "tokenizer"),
]
# files that belong to one rank (it writes and describes them), by the rank they name
_RANK_OWNED = [re.compile(p) for p in (r"(^|/)rng_state_(\d+)\.pth$", r"(^|/)zero_pp_rank_(\d+)_",
                                       r"(^|/)__(\d+)_\d+\.distcp$", r"(^|/)rank(\d+)-of-\d+-")]


def component_of(relpath: str) -> str:
    """The component of a file in a ``checkpoint-N/`` folder, by its path relative to the
    folder: ``model``, ``optimizer``, ``scheduler``, ``rng``, ``data_progress``, ``scaler``,
    ``training_args``, ``tokenizer``, ``config`` (configuration and layout files, the same in
    every save), else ``other``."""
    for pattern, component in _COMPONENTS:
        if re.search(pattern, relpath):
            return component
    return "other"


def _owner(relpath: str) -> int | None:
    """The rank a file belongs to when its name says (``rng_state_3.pth``: 3), else None."""
    for pattern in _RANK_OWNED:
        m = pattern.search(relpath)
        if m:
            return int(m.group(2))
    return None


def checkpoint_files(folder: str, rank: int, world_size: int) -> dict[str, list[str]]:
    """``{component: [paths]}`` of the files of ``folder`` that rank ``rank`` wrote: the files
    naming it (``rng_state_<rank>.pth``, ...), and for rank 0 every file naming no rank (with a
    single process, every file)."""
    out: dict[str, list[str]] = {}
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, folder).replace(os.sep, "/")
            owner = _owner(rel)
            mine = owner == rank if owner is not None and world_size > 1 else rank == 0
            if mine:
                out.setdefault(component_of(rel), []).append(path)
    return out


class RecoverydashCallback(Watch, TrainerCallback):
    """A ``TrainerCallback`` that reports HF Trainer's ledger, checkpoints and attempts (module
    doc). Pass it in ``Trainer(callbacks=[...])`` or use ``watch_trainer``.

    url, token, run_id: the server, a token, the run; keywords ``dataset_version``, ``client``,
    ``required_components`` and ``Client`` arguments (``recoverydash.integrations._watch.Watch``).

    ``client`` and ``recorder`` are there once training began (None before)."""

    def __init__(self, url: str | None = None, token: str | None = None,
                 run_id: str | None = None, **kw: Any):
        Watch.__init__(self, url, token, run_id, **kw)
        self.mode = "none"
        self.location: str | None = None
        self._published: dict[str, str] = {}  # checkpoint folder name -> generation id
        self._saving: tuple[int, str] | None = None  # (update, generation id) being saved
        self._hook = None

    # -- training begins --

    def on_train_begin(self, args, state, control, model=None, train_dataloader=None, **kw):
        try:
            self.location = local_folder(args.output_dir)
            resumed = None
            if state.global_step > 0:  # the checkpoint resume_checkpoint chose, else Trainer's
                folder = chosen_path(self.location) or os.path.join(
                    self.location, f"checkpoint-{state.global_step}")
                resumed = manifest_naming(self.location, folder, update=int(state.global_step))
            self._start_sending(args.process_index, args.world_size, self.location, resumed)
            if train_dataloader is not None:
                self.mode = observe_built_loader(train_dataloader, self.recorder)
            if model is not None:
                self._hook = self.recorder.attach(model)
            resumed_from = None
            if state.global_step > 0:
                resumed_from = {"generation_id": (resumed or {}).get("generation_id"),
                                "update": int(state.global_step), "cursor": []}
                if resumed is None:
                    log.warning("recoverydash: Trainer resumed at update %d from a checkpoint "
                                "with no manifest under %s (reported as resumed from an "
                                "unknown generation)", state.global_step, self.location)
            micro = int(args.per_device_train_batch_size)
            accum = int(args.gradient_accumulation_steps)
            # Trainer makes its LR scheduler before this event and saves it as scheduler.pt
            scheduler = kw["lr_scheduler"] is not None if "lr_scheduler" in kw else None
            self.recorder.start(resumed_from=resumed_from, micro_batch_size=micro,
                                grad_accum_steps=accum,
                                global_batch_size=micro * accum * int(args.world_size),
                                **self.contract_for(scheduler))
        except Exception as e:  # noqa: BLE001 - never raises into training
            self._log_once("on_train_begin", e)

    # -- the ledger --

    def on_epoch_begin(self, args, state, control, **kw):
        if self.recorder is not None:
            self.recorder.set_epoch(int(state.epoch or 0))

    def on_step_end(self, args, state, control, **kw):
        rec = self.recorder
        if rec is None:
            return
        rec.commit(int(state.global_step))
        if control.should_save and args.process_index == 0 and self.client is not None:
            try:
                gen = self._generation_id(int(state.global_step))
                # a relaunch that reaches this update again rewrites checkpoint-N in place
                retire_manifests(self.location, os.path.join(self.location,
                                                              f"checkpoint-{state.global_step}"))
                self.client.checkpoint_started(
                    gen, int(state.global_step),
                    [f"rank{r}" for r in range(int(args.world_size))],
                    ["model", "optimizer", "scheduler", "rng", "data_progress"])
            except Exception as e:  # noqa: BLE001 - never raises into training
                self._log_once("checkpoint_started", e)
        if control.should_save and self.client is not None and faults.active_fault() is not None:
            # a drill's before_shards: Trainer decided to save and writes checkpoint-N next
            faults.save_point("before_shards", self._generation_id(int(state.global_step)),
                              int(state.global_step), int(args.process_index),
                              client=self.client, coordinator=args.process_index == 0)

    def _generation_id(self, update: int) -> str:
        """The id of the save at ``update`` (the same from ``on_step_end`` to ``on_save``)."""
        if self._saving is None or self._saving[0] != update:
            base = generation_name(update, self.client.attempt if self.client else 0)
            # (a save before on_train_begin knows no location: the name as it is)
            self._saving = (update, base if self.location is None
                            else free_generation_id(self.location, base))
        return self._saving[1]

    # -- generations --

    def on_save(self, args, state, control, **kw):
        if self.recorder is None or self.location is None:
            return
        try:
            update = int(state.global_step)
            name = f"checkpoint-{update}"
            folder = os.path.join(self.location, name)
            rank, world = int(args.process_index), int(args.world_size)
            files = checkpoint_files(folder, rank, world) if os.path.isdir(folder) else {}
            gen = agreed(self._generation_id(update), world > 1)  # rank 0's id, on every rank
            result = publish_files(
                self.location, gen, update, files, client=self.client, recorder=self.recorder,
                dataset_version=self.dataset_version, world_size=world,
                required_components=self.required_components, collective=world > 1,
                announced=True)
            if result.published:
                self._published[name] = gen
            if rank == 0:
                self._forget_rotated()
        except Exception as e:  # noqa: BLE001 - never raises into training
            self._log_once("on_save", e)

    def _forget_rotated(self) -> None:
        """Remove the manifests of checkpoint folders this process published that Trainer's
        rotation (``save_total_limit``) deleted since."""
        if self.location is None:
            return
        for name, gen in list(self._published.items()):
            if not os.path.isdir(os.path.join(self.location, name)):
                remove_manifest(self.location, gen)
                del self._published[name]

    # -- the end --

    def on_train_end(self, args, state, control, **kw):
        if self.recorder is None:
            return
        self.recorder.end("completed")
        if self._hook is not None:
            self._hook.remove()
        self.client.flush(10)


def watch_trainer(trainer: Any, url: str | None = None, token: str | None = None,
                  run_id: str | None = None, **kw: Any) -> RecoverydashCallback:
    """Add a ``RecoverydashCallback(url, token, run_id, **kw)`` to ``trainer`` and return it."""
    cb = RecoverydashCallback(url, token, run_id, **kw)
    trainer.add_callback(cb)
    return cb


def resume_checkpoint(output_dir: str | os.PathLike, *, url: str | None = None,
                      token: str | None = None, run_id: str | None = None,
                      world_size: int | None = None,
                      dataset_version: str | None = None) -> str | None:
    """The newest restorable ``checkpoint-N`` folder under ``output_dir`` (joined to
    ``output_dir`` as given, so a relative folder stays relative), for
    ``trainer.train(resume_from_checkpoint=...)``; None when nothing is restorable (a fresh
    start). Restorable: its manifest is complete and every file is there with the size and
    sha256 it says (``select_restorable``); with ``url`` the server's restore plan decides, which
    also checks the data ledger, and its choice is verified in storage again. Every rank gets the
    same answer (rank 0 decides under torch.distributed). A rejected newer checkpoint is logged
    with its reasons. Never raises."""
    return resume_path(output_dir, checkpoint_folder, url=url, token=token, run_id=run_id,
                       world_size=world_size or _env_world_size(),
                       dataset_version=dataset_version)


def checkpoint_folder(manifest: dict, location: str) -> str | None:
    """The ``checkpoint-N`` folder under ``location`` holding every file of ``manifest`` (None
    when its files lie elsewhere)."""
    paths = []
    for o in manifest.get("objects") or []:
        uri = o.get("uri", "")
        if not uri.startswith("file://"):
            return None
        paths.append(uri[len("file://"):])
    if not paths:
        return None
    rel = os.path.relpath(os.path.commonpath(paths), location).split(os.sep)
    if not _CHECKPOINT_RE.match(rel[0]):
        return None
    return os.path.join(location, rel[0])


def _env_world_size() -> int | None:
    v = os.environ.get("WORLD_SIZE", "")
    return int(v) if v.isdigit() else None


__all__ = ["RecoverydashCallback", "checkpoint_files", "checkpoint_folder", "component_of",
           "resume_checkpoint", "watch_trainer"]
