"""Checkpoints recoverydash never saw: format adapters that turn a framework's checkpoint folder
into generations with a status and reasons (spec 5), with no change to the trainer.

Formats (one module each, the same interface: ``NAME``, ``RULE``, ``detect(tree)`` and
``scan(tree) -> [Generation]``): ``dcp`` (torch.distributed.checkpoint, torchtitan ``step-N``),
``hf`` (Hugging Face Trainer ``checkpoint-N``), ``lightning`` (``.ckpt``), ``deepspeed``
(``latest`` + ``global_stepN``), ``megatron`` (``latest_checkpointed_iteration.txt`` +
``iter_XXXXXXX``), ``orbax`` (``<step>``, ``*.orbax-checkpoint-tmp-*``), and ``recoverydash``
(our own manifests, checked by ``recoverydash.checkpoints.selection.select_restorable``). Each
module doc states its completeness rule; ``recoverydash.checkpoints.formats.base`` the status rule
they share; docs/formats.md what a structural check cannot prove.

Pure: no Django, no torch (torch files are read with ``zipfile`` and a restricted unpickler that
never runs code from a file), boto3 only for ``s3://``. Entry point: :func:`check`.
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, TextIO

from recoverydash.checkpoints.formats import dcp, deepspeed, hf, lightning, megatron, orbax
from recoverydash.checkpoints.formats.base import Generation, Options, finish_all, rfc3339
from recoverydash.checkpoints.formats.store import Tree
from recoverydash.checkpoints.objects import MANIFEST_NAME, StorageError


class Adapter(Protocol):
    """What every format module offers (module doc)."""

    NAME: str
    RULE: str

    def detect(self, tree: Tree) -> int: ...

    def scan(self, tree: Tree) -> list[Generation]: ...


class Progress(Protocol):
    """A progress counter of bytes (tqdm's interface): ``update(n_bytes)``, ``close()``."""

    def update(self, n: int) -> object: ...

    def close(self) -> object: ...


ADAPTERS: dict[str, Adapter] = {m.NAME: m for m in (dcp, hf, lightning, deepspeed, megatron,
                                                    orbax)}
"""Format name -> adapter module (``recoverydash`` is handled by the SDK's selection)."""
FORMATS = ("recoverydash", *ADAPTERS)
RULES = {"recoverydash": ("committed by recoverydash-manifest.json (written atomically after "
                          "every rank reported); complete when every required shard and "
                          "component has its objects and each object matches its recorded "
                          "size and sha256"),
         **{name: m.RULE for name, m in ADAPTERS.items()}}


class UnknownFormat(ValueError):
    """``check(format="auto")`` found nothing it recognises under the location."""


@dataclass
class Check:
    """What :func:`check` found: the ``format`` used and its ``rule``, every generation newest
    first (``generations``), and ``restorable``, the newest restorable one (None when none)."""

    location: str
    format: str
    rule: str
    generations: list[Generation] = field(default_factory=list)
    hashed_bytes: int = 0

    @property
    def restorable(self) -> Generation | None:
        return next((g for g in self.generations if g.status == "restorable"), None)

    def to_dict(self) -> dict[str, Any]:
        best = self.restorable
        return {"location": self.location, "format": self.format, "rule": self.rule,
                "restorable": None if best is None else {
                    "generation_id": best.generation_id, "update": best.update,
                    "committed_at": rfc3339(best.committed_at), "folder": best.folder},
                "generations": [g.to_dict() for g in self.generations]}


def detect(tree: Tree) -> str | None:
    """The format whose layout the root matches best (``recoverydash`` when it holds our
    manifests), or None."""
    if any(f"{n}/{MANIFEST_NAME}" in tree.files for n in tree.children()):
        return "recoverydash"
    scores = {name: m.detect(tree) for name, m in ADAPTERS.items()}
    best = max(scores, key=lambda n: scores[n])
    return best if scores[best] > 0 else None


def check(location: str, *, format: str = "auto", options: Options | None = None,
          s3_client: Any = None, hash_files: bool = False,
          progress: Callable[[int], Progress] | None = None,
          full_hash_max_bytes: int | None = None, tree: Tree | None = None) -> Check:
    """Check the checkpoints under ``location`` (a folder or ``s3://bucket/prefix``).

    format: one of FORMATS or ``auto`` (detected from the layout; UnknownFormat when nothing
    matches). options: the restarting job's world size and required components. hash_files:
    read every file of every generation and record its sha256 (``progress(total_bytes)`` makes
    an object with ``update(n_bytes)`` and ``close()``, e.g. :func:`progress_bar`). Returns a
    Check. Raises StorageError when
    the location cannot be listed, ValueError for an unknown format name."""
    options = options or Options()
    if format != "auto" and format not in FORMATS:
        raise ValueError(f"format must be auto or one of {', '.join(FORMATS)}, got {format!r}")
    with _gc_paused():
        tree = tree or Tree(location, s3_client=s3_client)
        fmt = detect(tree) if format == "auto" else format
        if fmt is not None and fmt != "recoverydash":
            gens = finish_all(ADAPTERS[fmt].scan(tree), options)
    if fmt is None:
        raise UnknownFormat(f"no checkpoint layout recognised under {location} "
                            f"({len(tree.files)} files): pass --format")
    if fmt == "recoverydash":
        return _own(location, tree, options, s3_client, full_hash_max_bytes)
    out = Check(location, fmt, RULES[fmt], gens)
    if hash_files:
        total = sum(o.size for g in gens for o in g.objects)
        out.hashed_bytes = hash_generations(tree, gens, progress(total) if progress else None)
    return out


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while the folder is listed and its metadata decoded:
    a check allocates tens of thousands of small acyclic objects, and collections over the
    growing heap otherwise cost as much as the decoding (reference counting still frees
    everything; the listing's per-folder tables of numbers are never tracked)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def hash_generations(tree: Tree, generations: list[Generation],
                     progress: Progress | None = None) -> int:
    """Read every object of the generations and record its sha256; returns bytes read.
    A file storage cannot read now is marked ``storage_unverified`` on its generation."""
    total = 0
    for g in generations:
        for o in g.objects:
            try:
                o.sha256 = tree.sha256(o.path, progress.update if progress is not None else None)
                total += o.size
            except StorageError as e:
                g.reasons.append({"code": "storage_unverified", "detail": f"{o.path}: {e}"})
                if g.status == "restorable":
                    g.status = "committed"
    if progress is not None:
        progress.close()
    return total


def _own(location: str, tree: Tree, options: Options, s3_client: Any,
         max_bytes: int | None) -> Check:
    """Our manifests, through the SDK's offline selection (every generation verified)."""
    from recoverydash.checkpoints.selection import select_restorable

    sel = select_restorable(location, world_size=options.world_size,
                            dataset_version=options.dataset_version,
                            required_components=options.required_components,
                            s3_client=s3_client, verify_all=True,
                            full_hash_max_bytes=max_bytes)
    gens = []
    for g in sel.generations:
        m = g.manifest or {}
        gen = Generation("recoverydash", g.generation_id, g.generation_id, update=g.update,
                         commit_marker=g.manifest_uri, committed_at=_parse_time(g.committed_at),
                         required_shards=list(m.get("required_shards") or []),
                         required_components=list(m.get("required_components") or []),
                         world_size=m.get("world_size"), status=g.status, reasons=g.reasons)
        gen.progress = {"cursor": g.cursor, "attempt": m.get("attempt")}
        gens.append(gen)
    return Check(location, "recoverydash", RULES["recoverydash"], gens)


def _parse_time(text: object) -> float | None:
    from datetime import datetime

    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


class StderrProgress:
    """A small progress counter on stderr (bytes hashed of the total), used when tqdm is not
    installed; prints at most every ``every`` seconds."""

    def __init__(self, total: int, every: float = 0.5, stream: TextIO | None = None):
        self.total, self.done, self.every = total, 0, every
        self.stream = stream or sys.stderr
        self._last = 0.0

    def update(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self._last >= self.every:
            self._last = now
            pct = 100.0 * self.done / self.total if self.total else 100.0
            self.stream.write(f"\rhashing: {self.done / 2**20:,.1f} of "
                              f"{self.total / 2**20:,.1f} MiB ({pct:.0f}%)")
            self.stream.flush()

    def close(self) -> None:
        self.stream.write(f"\rhashing: {self.done / 2**20:,.1f} MiB done{' ' * 20}\n")
        self.stream.flush()


def progress_bar(total: int) -> Progress:
    """tqdm over ``total`` bytes on stderr when tqdm is installed, else a StderrProgress."""
    try:
        from tqdm import tqdm
    except ImportError:
        return StderrProgress(total)
    bar: Progress = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024,
                         desc="hashing", file=sys.stderr, leave=False)
    return bar


__all__ = ["ADAPTERS", "FORMATS", "RULES", "Check", "Generation", "Options", "StderrProgress",
           "Tree", "UnknownFormat", "check", "detect", "hash_generations", "progress_bar"]
