"""torchtitan's ``CheckpointManager`` and ``ParallelAwareDataloader`` watched by recoverydash.
Its lines (four in the complete loop ``examples/torchtitan_train.py``, marked ``# recoverydash``:
docs/integrations/torchtitan.md)::

    watch_torchtitan(checkpointer, dataloader, rec)        # after both are built, before loading
    resumed = resume_torchtitan(checkpointer, rec)          # instead of checkpointer.load(step=-1)
    ... input_dict = rec.observe(input_dict) before the model; rec.commit(step) after the update ...

with ``rec.start(resumed_from=resumed, ...)`` as in any recorded loop.

**Generations.** Every ``step-N/`` folder the manager writes is published as a generation once
its ``.metadata`` is there: DCP's coordinator writes it last, after every rank's data files, so
it is the commit marker of the whole folder. A synchronous save is published when ``save``
returns; an asynchronous one (``async_mode="async"`` or ``"async_with_pinned_mem"``) when its
upload future completes, never at staging (a save whose future fails is never published). Rank 0
describes every file of the folder (sizes, sha256) as one shard; the components are read from
``.metadata`` (``model``, ``optimizer``, ``scheduler``: ``lr_scheduler``, ``data_progress``:
``dataloader`` and ``train_state``). torchtitan saves no RNG state (its seed comes from the
configuration), so ``rng`` is not required of these generations. The manifest's data cursor is
read from the ``dataloader`` state the save wrote (gathered over the ranks when ``save`` runs, on
every rank at the same step), not from the ledger: a checkpoint whose data state lags its model
names a cursor behind the ledger's and the server rejects it (``data_cursor_mismatch``). When
``keep_latest_k`` purges a folder, its manifest goes too.

**Resume.** torchtitan's ``_find_load_step`` takes the highest ``step-N`` with a ``.metadata``
(torchtitan #1729: a folder can have one and still not load). :func:`resume_step` takes the
newest *restorable* generation instead (every file as committed; with ``url`` the server's plan,
which also checks the data ledger), or -1: start fresh.

**Positions.** ``watch_torchtitan`` wraps the dataset inside the dataloader (before its first
iterator) when it is a torchtitan packing text dataset (``HuggingFaceTextDataset``: documents
tokenized into a buffer, cut into ``seq_len`` sequences). Each data-parallel rank reads its own
contiguous shard of the documents (``split_dataset_by_node``), so each shard is a stratum,
``<dataset>/dp<r>of<W>``, in **tokens**: a yielded sequence is the ``seq_len`` tokens that left
the front of the buffer, positions ``[e, e + seq_len)`` of the shard's stream of input tokens in
that epoch, ``e`` being the tokens emitted before it. The anchor is the dataset's restored state:
the wrapper's state (inside the dataloader's, hence inside the checkpoint) holds the tokens
emitted and the buffer saved; a restore that brings back the shard position but not the buffer
resumes ``len(buffer)`` tokens further (an omission of the rest of a partly consumed document), a
loader state not restored starts the shard over (a replay). A relaunch on another world size
re-shards the documents: the new strata start from zero; torchtitan itself refuses to load a
``dataloader`` state of another world size (use ``exclude_from_loading=["dataloader"]`` to
resume anyway), and without token identities across shards such a restart is not compared.

**Loading.** :func:`resume_torchtitan` calls the manager's own ``load(step=N)`` for the step
:func:`resume_step` names and returns the ``resumed_from`` of that generation; when nothing is
restorable it loads nothing and returns None (a fresh start). torchtitan's ``load`` itself is
not changed: ``load(step=-1)`` still takes its newest folder.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import re
import threading
from typing import Any

from recoverydash.integrations._checkpoints import (
    free_generation_id,
    generation_name,
    local_folder,
    manifest_naming,
    remove_manifest,
    resume_path,
)
from recoverydash.sdk import faults
from recoverydash.sdk.checkpoint import merge_cursors, publish_files
from recoverydash.sdk.collective import all_gather_json, dist_info
from recoverydash.sdk.observe import BATCH_KEY, BatchTag, Iteration, attach_tag
from recoverydash.sdk.tokens import TOKENS, TokenRanges

log = logging.getLogger("recoverydash.integrations")

STATE_KEY = "recoverydash"
"""Key of the wrapper's own state inside the dataset state the dataloader saves."""

REQUIRED = ["model", "optimizer", "scheduler", "data_progress"]
"""What a torchtitan generation must hold (it saves no RNG state)."""

_STEP_RE = re.compile(r"^step-(\d+)$")


# --- positions ------------------------------------------------------------------------------------

class ObservedPackedText:
    """A torchtitan packing text dataset (``HuggingFaceTextDataset`` and its kind: ``seq_len``,
    ``_inputs_buffer``, ``_epoch``, ``state_dict`` / ``load_state_dict``) whose sequences carry
    their token positions (module doc). rank, world_size: the data-parallel coordinates.
    Yields ``({..., BATCH_KEY: tag}, labels)``; the tag of one sequence is collated by
    :class:`PackedCollate`."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        return object.__new__(_packed_class() if cls is ObservedPackedText else cls)

    def __init__(self, dataset: Any, *, rank: int, world_size: int,
                 dataset_version: str | None = None):
        self.dataset = dataset
        self.rank, self.world_size = int(rank), int(world_size)
        self.dataset_version = dataset_version
        self.emitted = 0          # tokens of this epoch's shard stream before the next sequence
        self.epoch = int(getattr(dataset, "_epoch", 0))
        self._anchor: int | None = None  # where a restored state resumes the stream

    @property
    def stratum(self) -> str:
        name = str(getattr(self.dataset, "dataset_name", "text"))
        return f"{name}/dp{self.rank}of{self.world_size}"

    def _iteration(self, epoch: int) -> Iteration:
        doc = f"{self.stratum}|{epoch}|{self.dataset_version}|{getattr(self.dataset, 'seq_len', 0)}"
        order = hashlib.sha256(doc.encode()).hexdigest()[:32]
        return Iteration(self.stratum, epoch, order, 0, 1,
                         info={"algorithm": f"{type(self.dataset).__module__}."
                                            f"{type(self.dataset).__qualname__}",
                               "units": TOKENS, "shuffle": epoch > 0})

    def __iter__(self):
        ds = self.dataset
        if self._anchor is not None:
            self.emitted, self._anchor = self._anchor, None
        its: dict = {}
        for input_dict, labels in ds:
            epoch = int(getattr(ds, "_epoch", 0))
            if epoch != self.epoch:  # the dataset re-looped: a new epoch's stream
                self.epoch, self.emitted = epoch, 0
            n = int(labels.numel())
            it = its.get(epoch)
            if it is None:
                it = its[epoch] = self._iteration(epoch)
            tag = BatchTag([(it, TokenRanges([(self.emitted, self.emitted + n)]), [self.emitted])])
            self.emitted += n
            yield {**input_dict, BATCH_KEY: tag}, labels

    def state_dict(self) -> dict:
        sd = dict(self.dataset.state_dict())
        sd[STATE_KEY] = {"emitted": self.emitted, "epoch": self.epoch,
                         "buffer": len(getattr(self.dataset, "_inputs_buffer", []) or []),
                         "stratum": self.stratum}
        return sd

    def load_state_dict(self, state: dict) -> None:
        mine = dict(state or {}).pop(STATE_KEY, None)
        inner = {k: v for k, v in (state or {}).items() if k != STATE_KEY}
        self.dataset.load_state_dict(inner)
        if not mine:
            log.warning("recoverydash: the dataloader state has no recoverydash part (saved "
                        "without watch_torchtitan): its positions restart at 0")
            self._anchor, self.epoch = 0, int(getattr(self.dataset, "_epoch", 0))
            return
        restored = len(getattr(self.dataset, "_inputs_buffer", []) or [])
        self.epoch = int(mine.get("epoch", 0))
        # the tokens that entered the buffer are emitted + the saved buffer; what the restored
        # buffer still holds is emitted next
        self._anchor = int(mine["emitted"]) + int(mine.get("buffer", 0)) - restored

    def __getattr__(self, name: str) -> Any:
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)


def _packed_class():
    cls = globals().get("_ObservedPackedTorch")
    if cls is None:
        from torch.utils.data import IterableDataset

        cls = type("_ObservedPackedTorch", (ObservedPackedText, IterableDataset),
                   {"__module__": __name__, "__doc__": ObservedPackedText.__doc__})
        globals()["_ObservedPackedTorch"] = cls
    return cls


def __getattr__(name: str) -> Any:
    if name == "_ObservedPackedTorch":  # unpickled in a worker process
        return _packed_class()
    raise AttributeError(name)


class PackedCollate:
    """Collate function of an :class:`ObservedPackedText` loader: the sequences collated as
    torchtitan's default collate does, their tags joined into one under ``input_dict[BATCH_KEY]``
    (``rec.observe(input_dict)`` strips it, or a forward pre-hook: ``rec.attach(model)``)."""

    def __init__(self, collate_fn: Any = None):
        if collate_fn is None:
            from torch.utils.data import default_collate

            collate_fn = default_collate
        self.collate_fn = collate_fn

    def __call__(self, items: list) -> Any:
        tags = [d.pop(BATCH_KEY) for d, _ in items if isinstance(d, dict) and BATCH_KEY in d]
        batch = self.collate_fn(items)
        if not tags:
            return batch
        groups: dict = {}
        for tag in tags:
            for it, ranges, ids in tag.groups:
                entry = groups.setdefault(id(it), (it, TokenRanges(), []))
                entry[1].extend(ranges)
                entry[2].extend(ids)
        input_dict, labels = batch
        return attach_tag(input_dict, BatchTag(list(groups.values()))), labels


def observe_dataloader(dataloader: Any, *, dataset_version: str | None = None) -> bool:
    """Make a torchtitan ``ParallelAwareDataloader`` over a packing text dataset carry token
    positions, in place, before its first iterator (module doc). Returns whether it could (a
    dataset of another kind is left alone and logged). Never raises."""
    try:
        ds = dataloader.dataset
        if isinstance(ds, ObservedPackedText):
            return True
        if not all(hasattr(ds, a) for a in ("seq_len", "_inputs_buffer", "state_dict")):
            log.warning("recoverydash: %s is not a torchtitan packing text dataset: token "
                        "positions are not recorded", type(ds).__name__)
            return False
        wrapped = ObservedPackedText(ds, rank=int(getattr(dataloader, "dp_rank", 0)),
                                     world_size=int(getattr(dataloader, "dp_world_size", 1)),
                                     dataset_version=dataset_version)
        object.__setattr__(dataloader, "dataset", wrapped)  # read when the iterator is made
        dataloader.collate_fn = PackedCollate(None if _default(dataloader.collate_fn)
                                              else dataloader.collate_fn)
        return True
    except Exception as e:  # noqa: BLE001 - never raises into training
        log.warning("recoverydash: the torchtitan dataloader could not be observed: %r", e)
        return False


def _default(collate_fn: Any) -> bool:
    from torch.utils.data import default_collate

    return collate_fn is None or collate_fn is default_collate or \
        getattr(collate_fn, "__name__", "") == "default_collate"


def data_cursor(dataloader: Any) -> list[dict]:
    """The cursor the dataloader's state resumes at: its ``state_dict()`` (torchtitan's: the
    rank's pickled ``StatefulDataLoader`` state) searched for the wrapper's part. ``[]`` when
    there is none."""
    try:
        state = dataloader.state_dict()
        found = _find(state)
        if not found:
            return []
        return [{"stratum": found["stratum"], "epoch": int(found.get("epoch", 0)),
                 "position": int(found["emitted"])}]
    except Exception as e:  # noqa: BLE001 - a cursor is evidence, never a crash
        log.warning("recoverydash: the dataloader state could not be read: %r", e)
        return []


def _find(obj: Any, depth: int = 0) -> dict | None:
    if depth > 12:
        return None
    if isinstance(obj, bytes | bytearray):
        try:
            obj = pickle.loads(obj)
        except Exception:  # noqa: BLE001 - not a pickle
            return None
    if isinstance(obj, dict):
        mine = obj.get(STATE_KEY)
        if isinstance(mine, dict) and "emitted" in mine:
            return mine
        for v in obj.values():
            found = _find(v, depth + 1)
            if found:
                return found
    elif isinstance(obj, list | tuple):
        for v in obj:
            found = _find(v, depth + 1)
            if found:
                return found
    return None


# --- generations ----------------------------------------------------------------------------------

def _components(folder: str) -> list[str]:
    """The components a DCP ``.metadata`` names (by its state dict keys), in the contract's
    words."""
    import torch.distributed.checkpoint as dcp

    keys = dcp.FileSystemReader(folder).read_metadata().state_dict_metadata.keys()
    found = set()
    for k in keys:
        head = str(k).split(".", 1)[0]
        found.add({"optimizer": "optimizer", "lr_scheduler": "scheduler",
                   "dataloader": "data_progress", "train_state": "train_state"}.get(head,
                                                                                     "model"))
    return sorted(found)


class TorchtitanWatch:
    """What :func:`watch_torchtitan` returns: publishes the manager's saves (module doc).

    ``published``: ``{folder name: generation id}`` of the saves published by this process."""

    def __init__(self, checkpointer: Any, dataloader: Any, recorder: Any, *,
                 required_components: list[str] | None = None):
        self.checkpointer = checkpointer
        self.dataloader = dataloader
        self.recorder = recorder
        self.client = recorder.client
        self.required = list(required_components or REQUIRED)
        self.location = local_folder(checkpointer.folder)
        self.published: dict[str, str] = {}
        self.pending: list = []
        self._lock = threading.Lock()
        self._save = checkpointer.save
        checkpointer.save = self.save

    def save(self, curr_step: int, last_step: bool = False) -> bool:
        """The manager's ``save``, then the generation published (at once, or when the async
        upload completes). A failure drill's ``before_shards`` fires before the manager writes
        (``recoverydash.sdk.faults``)."""
        if faults.active_fault() is not None:
            try:
                if self.checkpointer._should_save(curr_step, last_step):
                    _on, rank, _world = dist_info(None)
                    gen = free_generation_id(self.location,
                                             generation_name(curr_step, self.client.attempt))
                    faults.save_point("before_shards", gen, curr_step, rank, client=self.client,
                                      coordinator=rank == 0)
            except Exception as e:  # noqa: BLE001 - a drill hook never stops a save
                log.warning("recoverydash: drill point before_shards skipped: %r", e)
        saved = self._save(curr_step, last_step)
        if not saved:
            return saved
        try:
            cursor = merge_cursors(all_gather_json(data_cursor(self.dataloader)))
        except Exception as e:  # noqa: BLE001 - publication never stops training
            log.warning("recoverydash: the data cursors of step %s could not be gathered: %r",
                        curr_step, e)
            cursor = []
        _dist_on, rank, world = dist_info(None)
        if rank != 0:
            return saved
        folder = self.checkpointer._create_checkpoint_id(curr_step)
        future = getattr(self.checkpointer, "save_future", None)
        if future is not None and not last_step:
            future.add_done_callback(lambda f: self._publish_done(f, curr_step, folder, cursor,
                                                                  world))
        else:
            self._publish(curr_step, folder, cursor, world)
        return saved

    def _publish_done(self, future: Any, step: int, folder: str, cursor: list,
                      world: int) -> None:
        if future.exception() is not None:
            log.warning("recoverydash: the async save of step %s failed (%r): not published",
                        step, future.exception())
            return
        self._publish(step, folder, cursor, world)

    def _publish(self, step: int, folder: str, cursor: list, world: int) -> None:
        with self._lock:
            try:
                path = local_folder(folder)
                if not os.path.isfile(os.path.join(path, ".metadata")):
                    log.warning("recoverydash: %s has no .metadata: not published", folder)
                    return
                files = sorted(os.path.join(root, n) for root, _d, names in os.walk(path)
                               for n in names)
                gen = free_generation_id(self.location,
                                         generation_name(step, self.client.attempt))
                result = publish_files(
                    self.location, gen, step, {c: files for c in _components(path)},
                    client=self.client, data_progress={"cursor": cursor},
                    dataset_version=self.recorder.dataset_version, world_size=world,
                    required_components=self.required, shard="dcp")
                if result.published:
                    self.published[os.path.basename(path)] = gen
                self._forget_purged()
            except Exception as e:  # noqa: BLE001 - publication never stops training
                log.warning("recoverydash: step %s not published: %r", step, e)

    def _forget_purged(self) -> None:
        """Remove the manifests of step folders the manager's ``keep_latest_k`` deleted."""
        for name, gen in list(self.published.items()):
            if not os.path.isdir(os.path.join(self.location, name)):
                remove_manifest(self.location, gen)
                del self.published[name]


def watch_torchtitan(checkpointer: Any, dataloader: Any, recorder: Any, *,
                     required_components: list[str] | None = None) -> TorchtitanWatch:
    """Watch a torchtitan ``CheckpointManager`` and its ``ParallelAwareDataloader`` (module doc):
    the loader's sequences carry token positions (:func:`observe_dataloader`), every save is
    published as a generation, sync or async, and ``required_components`` (default
    :data:`REQUIRED`: torchtitan saves no RNG state) becomes the contract the recorder's
    ``attempt_started`` declares unless ``rec.start`` names one (``start_defaults``).
    recorder: the rank's ``ObservedRecorder`` (its client sends). Call it on every rank, after
    both are built and before the manager loads (the dataloader state a load restores is read
    by the wrapper) and the first iteration."""
    observe_dataloader(dataloader, dataset_version=recorder.dataset_version)
    defaults = getattr(recorder, "start_defaults", None)
    if isinstance(defaults, dict):
        defaults.setdefault("contract",
                            {"required_components": list(required_components or REQUIRED)})
    return TorchtitanWatch(checkpointer, dataloader, recorder,
                           required_components=required_components)


def resume_step(folder: str | os.PathLike, *, url: str | None = None, token: str | None = None,
                run_id: str | None = None, world_size: int | None = None,
                dataset_version: str | None = None) -> int:
    """The step of the newest restorable ``step-N`` generation under the manager's ``folder``
    (``checkpointer.folder``), for ``checkpointer.load(step=...)``; -1 when none is restorable
    (start fresh: do not call ``load``). torchtitan's own ``load(step=-1)`` takes the highest
    folder with a ``.metadata`` instead. Every rank gets the same answer. Never raises."""
    chosen = resume_path(folder, step_folder, url=url, token=token, run_id=run_id,
                         world_size=world_size, dataset_version=dataset_version)
    if chosen is None:
        return -1
    m = _STEP_RE.match(os.path.basename(os.path.normpath(chosen)))
    return int(m.group(1)) if m else -1


def resume_torchtitan(checkpointer: Any, recorder: Any) -> dict | None:
    """Load the newest restorable step into a torchtitan ``CheckpointManager`` and name it.

    The step is :func:`resume_step`'s for ``checkpointer.folder``, asked of the server the
    recorder's client sends to (its url, token and run id; the recorder's world size and dataset
    version), else of storage. When there is one, the manager's own ``load(step=N)`` runs
    (restoring the model, optimizer, scheduler, ``train_state`` and the dataloader, as
    torchtitan does) and the result is ``{"generation_id": <the generation of step-N/>,
    "update": N}``, the ``resumed_from`` of ``rec.start``. None when nothing is restorable (or
    the manager is disabled, or its ``load`` returns False): nothing is loaded, a fresh start.
    Call it on every rank after :func:`watch_torchtitan` (every rank gets the same step). The
    manager's own errors while loading (a folder that does not load) propagate, as with
    ``load``; choosing never raises."""
    if not getattr(checkpointer, "enable", True):
        return None
    client = recorder.client
    folder = checkpointer.folder
    step = resume_step(folder, url=getattr(client, "url", None) or None,
                       token=getattr(client, "token", None) or None,
                       run_id=getattr(client, "run_id", None),
                       world_size=getattr(recorder, "world_size", None),
                       dataset_version=getattr(recorder, "dataset_version", None))
    if step < 0 or not checkpointer.load(step=step):
        return None
    m = manifest_naming(folder, os.path.join(folder, f"step-{step}"), step)
    return {"generation_id": (m or {}).get("generation_id"), "update": step}


def step_folder(manifest: dict, location: str) -> str | None:
    """The ``step-N`` folder under ``location`` holding every object of ``manifest``."""
    paths = []
    for o in manifest.get("objects") or []:
        uri = str(o.get("uri", ""))
        if not uri.startswith("file://"):
            return None
        paths.append(uri[len("file://"):])
    if not paths:
        return None
    rel = os.path.relpath(os.path.commonpath(paths), location).split(os.sep)
    return os.path.join(location, rel[0]) if _STEP_RE.match(rel[0]) else None


__all__ = ["ObservedPackedText", "PackedCollate", "TorchtitanWatch", "data_cursor",
           "observe_dataloader", "resume_step", "resume_torchtitan", "step_folder",
           "watch_torchtitan"]
