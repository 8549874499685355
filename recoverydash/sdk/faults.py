"""Failure drills, trainer side: crash points injected into the SDK's save path and a local trace
of what the trainer consumed and what its parameters became, both switched on by environment
variables that ``python -m recoverydash.sdk drill`` sets (``recoverydash.sdk.drill``). Without
them every function here returns at once: nothing changes for a real run.

``RECOVERYDASH_DRILL_FAULT=<point>@<update>[/<rank>|/all]``: crash (SIGKILL of this process)
at the named step of the publication protocol of the first generation saved at update
``>= <update>`` (docs/ingest-v1.md#7-checkpoints-in-storage), on the given rank or on every
rank (default ``all``). Points:

- ``before_shards``: ``checkpoint_started`` was sent; no shard file is written;
- ``during_shard``: this rank's first file of the generation is truncated to half its bytes (a
  torn write), then the process dies;
- ``before_commit``: every shard is written and reported; the manifest (the commit marker) is
  not (only the coordinator's kill matters: it alone writes the manifest);
- ``after_commit``: the manifest is committed in storage and every rank has learnt it (the
  ranks' gather of the commit); ``checkpoint_committed`` never reaches the server (with
  ``/all`` every rank dies there; with ``/<rank>`` the coordinator does, the one that sends it);
- ``kill``: no save is touched; the process dies right after ``commit(update)`` of update
  ``<update>`` (the drill then corrupts a committed shard before the resume).

Before dying, the client's queued events are flushed (up to 5 s), so what the server lacks is
exactly the protocol step named (a real crash may also lose the last second of events). With
``/all``, at the points every rank reaches at the same step of the save's collectives
(``before_shards``, ``before_commit``, ``after_commit`` of ``save_generation``; ``before_commit``,
``after_commit`` of ``publish_files``) the ranks then wait for one another (a barrier of at most
``ALL_RANKS_WAIT_S`` seconds) before the SIGKILL: otherwise the first rank to die makes the
launcher (torchrun) SIGTERM the others, which may cut their flush short, and the server would
lack the survivors' last reports too (their ``update_committed``: the ledger is not settled and
no generation can be called restorable).

Where each point fires, by save path:

- ``save_generation`` (the SDK writes the shards): all four, at the steps above;
  ``during_shard`` truncates the first file the rank wrote.
- ``publish_files`` (the framework wrote its files itself: the HF Trainer and Lightning
  integrations, or your own ``torch.save``): the files exist before the SDK is called, so
  ``during_shard`` truncates the largest of the rank's files to half (a torn write the framework
  never noticed), before any is described; ``before_commit`` fires after ``shard_written``,
  before the manifest; ``after_commit`` after the manifest, before ``checkpoint_committed``.
  ``before_shards`` cannot fire there (the files are written already): the integrations fire it
  where they announce the save, before the framework writes (HF: ``on_step_end`` when Trainer
  decided to save, every rank; Lightning: the ``CheckpointIO`` wrapper before ``.ckpt`` is
  written, global rank 0, the only one that writes it). A script calling ``publish_files`` on
  its own has no ``before_shards`` unless it calls ``save_point("before_shards", ...)`` itself.
- ``kill`` fires in ``ObservedRecorder.commit`` on every save path.

``RECOVERYDASH_DRILL_TRACE=<folder>``: every process appends JSON lines to
``<folder>/trace-<pid>.jsonl`` (one ``write`` per line, so a SIGKILL loses at most the line being
written): ``update`` (attempt, rank, update, the ``[stratum, epoch, position]`` consumed in the
recorded order, ``ids``: the sample ids (dataset indices, or an iterable's ids) the rank received
for the update, in the order received, as the batches' tags carry them, compacted by
``recovery.drills.compact_ids``; ``digest``: sha256 of the parameters of every optimizer after
its last step, ``fingerprint``: per parameter tensor its sum and L2 norm, for comparisons
within a tolerance), ``plan`` (what ``restore_plan`` answered: source, generation id, the
generations a server refused with their status), ``restore`` (generation id, seconds of
``load_generation``; for the HF and Lightning integrations the seconds ``resume_checkpoint``
took to choose and verify the checkpoint, the framework's own load is not timed), ``resume``
(the loader restored at a cursor), ``first_batch`` (the first batch recorded by the attempt)
and ``fault`` (the crash point reached).
The digest is taken by a global optimizer step post-hook
(``torch.optim.optimizer.register_optimizer_step_post_hook``): the user's script is not changed. It
fires on every ``torch.optim.Optimizer`` subclass's step, also when a framework owns and wraps the
optimizer: accelerate's ``AcceleratedOptimizer`` (HF Trainer) and Lightning's ``LightningOptimizer``
call the wrapped torch optimizer's ``step``, whose hook runs (tests/drills/test_drill_hf.py,
test_drill_lightning.py: exact digests).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import threading
import time
from typing import Any

from recoverydash.recovery.drills import compact_ids
from recoverydash.sdk.tokens import TokenRanges

log = logging.getLogger("recoverydash.sdk")

FAULT_ENV = "RECOVERYDASH_DRILL_FAULT"
TRACE_ENV = "RECOVERYDASH_DRILL_TRACE"
_encode = getattr(os.environ, "encodekey", None)
_TRACE_KEY = _encode(TRACE_ENV) if _encode is not None else None
SAVE_POINTS = ("before_shards", "during_shard", "before_commit", "after_commit")
POINTS = SAVE_POINTS + ("kill",)
ALL_RANKS_WAIT_S = 15.0


class Fault:
    """A parsed ``RECOVERYDASH_DRILL_FAULT``: ``point``, ``update``, ``rank`` (None: every rank)."""

    __slots__ = ("point", "rank", "update")

    def __init__(self, point: str, update: int, rank: int | None):
        self.point, self.update, self.rank = point, update, rank

    @classmethod
    def parse(cls, text: str) -> Fault:
        """``point@update[/rank|/all]``; raises ValueError naming what was expected."""
        try:
            point, rest = text.strip().split("@", 1)
            update, _, rank = rest.partition("/")
            fault = cls(point, int(update), None if rank in ("", "all") else int(rank))
        except ValueError:
            raise ValueError(f"{FAULT_ENV} must be <point>@<update>[/<rank>|/all], got "
                             f"{text!r}") from None
        if point not in POINTS:
            raise ValueError(f"{FAULT_ENV}: unknown point {point!r} (one of {', '.join(POINTS)})")
        return fault

    def __str__(self) -> str:
        return f"{self.point}@{self.update}/{'all' if self.rank is None else self.rank}"


_state = threading.local()
_fault: Fault | None = None
_fault_spent = False
_generation: str | None = None  # the generation the save-path fault fires in
_trace_fd: int | None = None
_trace_pid: int | None = None
_digests: dict[int, tuple[str, list]] = {}   # id(optimizer) -> (sha256, fingerprint)
_order: list[int] = []
_hooked = False
_first_batch_seen = False


def _load() -> None:
    global _fault
    text = os.environ.get(FAULT_ENV)
    if text:
        try:
            _fault = Fault.parse(text)
        except ValueError as e:
            log.error("recoverydash: %s; no fault injected", e)


_load()


def active_fault() -> Fault | None:
    """The fault this process was started with (None without ``RECOVERYDASH_DRILL_FAULT``)."""
    return _fault


def tracing() -> bool:
    """Whether ``RECOVERYDASH_DRILL_TRACE`` is set (now: read at every call, so a variable set
    while the process runs counts). Asked at every ``record`` and ``commit``: ``os.environ.get``
    of a missing name raises and catches a KeyError inside (about 1 us), so the environment's
    own dict is asked when it has one (CPython's ``os.environ._data``, keyed by the encoded
    name)."""
    data = getattr(os.environ, "_data", None)
    if type(data) is dict and _TRACE_KEY is not None:
        return bool(data.get(_TRACE_KEY))
    return bool(os.environ.get(TRACE_ENV))


def trace(kind: str, **fields: Any) -> None:
    """Append one line ``{"kind", "t" (time.time()), **fields}`` to this process's trace file.
    Never raises."""
    global _trace_fd, _trace_pid
    folder = os.environ.get(TRACE_ENV)
    if not folder:
        return
    try:
        if _trace_fd is None or _trace_pid != os.getpid():
            os.makedirs(folder, exist_ok=True)
            _trace_fd = os.open(os.path.join(folder, f"trace-{os.getpid()}.jsonl"),
                                os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            _trace_pid = os.getpid()
        line = json.dumps({"kind": kind, "t": time.time(), **fields}, separators=(",", ":"))
        os.write(_trace_fd, line.encode() + b"\n")
    except Exception as e:  # pragma: no cover
        log.warning("recoverydash: drill trace not written: %r", e)


# --- parameter digests ------------------------------------------------------------------------

def _after_step(optimizer, args, kwargs) -> None:
    try:
        import torch

        h = hashlib.sha256()
        fingerprint = []
        with torch.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    t = p.detach().cpu().contiguous()
                    h.update(str(tuple(t.shape)).encode())
                    h.update(t.view(-1).view(torch.uint8).numpy().tobytes())
                    f = t.double()
                    fingerprint.append([float(f.sum()), float(f.norm())])
        key = id(optimizer)
        if key not in _digests:
            _order.append(key)
        _digests[key] = (h.hexdigest(), fingerprint)
    except Exception as e:  # pragma: no cover
        log.warning("recoverydash: drill digest not taken: %r", e)


def install_digest_hook() -> None:
    """Register the global optimizer step post-hook once per process (only when tracing)."""
    global _hooked
    if _hooked or not tracing():
        return
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(_after_step)
        _hooked = True
    except Exception as e:  # pragma: no cover
        log.warning("recoverydash: drill digest hook not installed: %r", e)


def parameter_digest() -> tuple[str | None, list]:
    """sha256 over every hooked optimizer's parameters after its last step (one optimizer: its
    digest; several: the sha256 of theirs in first-step order), and the concatenated
    fingerprints. ``(None, [])`` before any step."""
    if not _order:
        return None, []
    if len(_order) == 1:
        return _digests[_order[0]]
    h = hashlib.sha256("".join(_digests[k][0] for k in _order).encode())
    return h.hexdigest(), [f for k in _order for f in _digests[k][1]]


# --- hooks the SDK calls ------------------------------------------------------------------------

def on_commit(recorder: Any, update: int, pending: list) -> None:
    """From ``ObservedRecorder.commit``: trace the update's consumed positions and the parameter
    digest; the ``kill`` fault. Never raises (except the fault, which does not return)."""
    if tracing():
        try:
            consumed: list[list[Any]] = []
            received: list = []  # the sample ids (dataset indices), as the tags carry them
            epoch = getattr(recorder, "_epoch", 0)
            for tag in pending:
                for it, positions, ids in tag.groups:
                    received.extend(ids)
                    if it is None or it.ids:
                        consumed.extend([["ids", None, str(i)] for i in ids])
                        continue
                    e = epoch if it.epoch is None else it.epoch
                    if type(positions) is TokenRanges:  # a packed sequence: its first token
                        consumed.extend([it.stratum, e, int(lo)] for lo, _hi in positions)
                        continue
                    consumed.extend([it.stratum, e, int(p)] for p in positions)
            digest, fingerprint = parameter_digest()
            trace("update", attempt=recorder.client.attempt, rank=recorder.rank, update=update,
                  consumed=consumed, ids=compact_ids(received), digest=digest,
                  fingerprint=fingerprint)
        except Exception as e:  # pragma: no cover
            log.warning("recoverydash: drill trace of update %s not written: %r", update, e)
    if _fault is not None and _fault.point == "kill" and update == _fault.update \
            and _targets(getattr(recorder, "rank", 0)):
        _die(getattr(recorder, "client", None), recorder.rank, update, None)


def on_record(recorder: Any) -> None:
    """From ``ObservedRecorder.record``: the first batch the attempt recorded (trace only)."""
    global _first_batch_seen
    if _first_batch_seen or not tracing():
        return
    _first_batch_seen = True
    trace("first_batch", attempt=recorder.client.attempt, rank=recorder.rank)


def on_restore(generation_id: str, seconds: float, rank: int) -> None:
    """From ``load_generation``: which generation was loaded and how long it took."""
    trace("restore", generation_id=generation_id, seconds=seconds, rank=rank)


def on_plan(plan: dict, wait_undecided_s: float = 0.0) -> None:
    """From ``restore_plan``: what the restarting trainer was told to load (trace only):
    ``source``, ``generation_id``, for a refusal ``rejected`` (each generation's id and
    status), the ``warnings``' codes, the server's ``newer_undecided`` still listed when the
    answer was taken (each generation's id, update and status) and ``wait_undecided_s``, how
    long ``restore_plan`` was allowed to wait for them (seconds)."""
    if not tracing():
        return
    try:
        trace("plan", source=plan.get("source"), generation_id=plan.get("generation_id"),
              rejected=[{"generation_id": r.get("generation_id"), "status": r.get("status")}
                        for r in plan.get("rejected") or [] if isinstance(r, dict)],
              warnings=[w.get("code") for w in plan.get("warnings") or [] if isinstance(w, dict)],
              newer_undecided=[{k: g.get(k) for k in ("generation_id", "update", "status")}
                               for g in plan.get("newer_undecided") or []
                               if isinstance(g, dict)],
              wait_undecided_s=wait_undecided_s)
    except Exception as e:  # pragma: no cover
        log.warning("recoverydash: drill trace of the restore plan not written: %r", e)


def on_resume(recorder: Any, cursor: Any) -> None:
    """From ``ObservedRecorder.load_state_dict``: the loader was restored at ``cursor``."""
    if tracing():
        trace("resume", attempt=recorder.client.attempt, rank=recorder.rank, cursor=cursor)


def _targets(rank: int) -> bool:
    return _fault is not None and (_fault.rank is None or _fault.rank == rank)


def save_point(point: str, generation_id: str, update: int, rank: int, *, client: Any = None,
               files: list[str] | None = None, coordinator: bool = False,
               every_rank: bool = False, group: Any = None) -> None:
    """From the save path, at each step of the publication protocol. Dies (SIGKILL) when the
    process's fault names this point and this generation (the first one saved at an update
    ``>= fault.update``) and this rank. ``during_shard`` first truncates the first of ``files``
    (this rank's files of the generation) to half its bytes. ``before_commit`` and
    ``after_commit`` kill the coordinator (and, for ``all``, every rank) at the point.
    every_rank: every rank of ``group`` (None: the default process group) calls this point at
    the same step of a collective; a fault on every rank then waits, after its flush, for the
    other ranks' (``_wait_for_every_rank``) before dying. Returns when the fault does not
    apply."""
    global _generation, _fault_spent
    f = _fault
    if f is None or f.point not in SAVE_POINTS or _fault_spent or update < f.update:
        return
    if _generation is None:
        _generation = generation_id
    if generation_id != _generation or point != f.point:
        return
    if point in ("before_commit", "after_commit") and f.rank is not None and not coordinator:
        return
    if not (_targets(rank) or (coordinator and point in ("before_commit", "after_commit"))):
        return
    if point == "during_shard":
        if not files:
            return  # this rank wrote nothing yet: its next file is the one torn
        path = files[0]
        try:
            size = os.path.getsize(path)
            with open(path, "r+b") as fh:
                fh.truncate(size // 2)
        except OSError as e:  # pragma: no cover
            log.warning("recoverydash: drill could not truncate %s: %r", path, e)
    _fault_spent = True
    _die(client, rank, update, generation_id,
         together=every_rank and f.rank is None, group=group)


def _wait_for_every_rank(group: Any = None, timeout: float = ALL_RANKS_WAIT_S) -> bool:
    """A barrier of ``group`` (None: the default process group) waited for at most ``timeout``
    seconds: every rank has flushed and is about to die. False (never raises) when there is no
    process group, a rank is gone or the wait timed out."""
    try:
        import datetime

        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or \
                dist.get_world_size(group) < 2:
            return False
        work = dist.barrier(group=group, async_op=True)
        return bool(work.wait(timeout=datetime.timedelta(seconds=timeout)))
    except Exception:  # noqa: BLE001 - a peer already gone: die all the same
        return False


def _die(client: Any, rank: int, update: int, generation_id: str | None, *,
         together: bool = False, group: Any = None) -> None:
    trace("fault", point=_fault.point if _fault else None, rank=rank, update=update,
          generation_id=generation_id, pid=os.getpid())
    try:
        if client is not None:
            client.flush(5)
    except Exception:  # pragma: no cover
        pass
    if together:
        _wait_for_every_rank(group)
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # pragma: no cover  (SIGKILL is not deliverable later than this)
