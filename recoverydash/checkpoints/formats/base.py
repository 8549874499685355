"""The shared interface of the format adapters: a folder becomes generations, each with its
objects, shards, components, update, commit marker and reasons, and one rule turns that into a
status (spec 5 statuses and reason codes).

Status rule (the same for every format; the format decides what its commit marker, shards and
components are):

* no commit marker: ``pending`` when nothing newer exists (a save may still be under way, or its
  writer died), else ``abandoned``; reason ``never_committed``;
* committed, with any hard reason (``shard_missing``, ``component_missing``, ``object_missing``,
  ``size_mismatch``, ``digest_mismatch``, ``update_mismatch``, ``world_size_mismatch``,
  ``schema_unsupported``, ``refused_globals``: a pickle in it names a global no checkpoint
  loader should import, such as ``os.system``): ``rejected``;
* committed, with only ``storage_unverified`` (storage could not answer for a file):
  ``committed``;
* otherwise ``restorable``: every required shard and component is there and every file the
  structure declares exists with the bytes it declares.

No digest is recorded by these formats, so ``restorable`` here is structural: it cannot show that
bytes inside a file are the bytes that were written (``--hash`` records sha256 digests for later
comparison), nor that the saved state is the state of one update (docs/formats.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple

from recoverydash.checkpoints.formats.store import Tree

HARD = ("shard_missing", "component_missing", "object_missing", "size_mismatch",
        "digest_mismatch", "update_mismatch", "world_size_mismatch", "schema_unsupported",
        "refused_globals")
SOFT = ("storage_unverified",)


@dataclass
class Options:
    """What the restarting job asks of a check: ``world_size`` (its ranks, compared where the
    format records one), ``required_components`` (replaces the format's list when given),
    ``dataset_version`` (compared with our manifests'; the frameworks' formats record none)."""

    world_size: int | None = None
    required_components: list[str] | None = None
    dataset_version: str | None = None


@dataclass
class FoundObject:
    """One file of a generation: ``path`` relative to the checkpoint root, its URI, the shard and
    component it belongs to, ``size`` observed in storage (bytes), ``declared_size`` when the
    format's structure declares how long it must be, ``mtime`` (POSIX seconds), ``sha256`` once
    hashed."""

    path: str
    uri: str
    shard: str
    component: str
    size: int
    mtime: float
    declared_size: int | None = None
    sha256: str | None = None
    held: tuple[str, ...] = ()  # every component with state in the file, when it holds several

    def to_object(self, update: int | None) -> dict[str, Any]:
        """The spec 4 Object: ``size`` is the declared size where the structure declares one
        (so later verification compares storage with the commit), else the observed size."""
        out: dict[str, Any] = {"uri": self.uri, "shard": self.shard, "component": self.component,
               "size": self.declared_size if self.declared_size is not None else self.size}
        if len(self.held) > 1:  # the Object extension: one file, several components
            out["components"] = list(self.held)
        if self.sha256:
            out["sha256"] = self.sha256
        if update is not None:
            out["update"] = update
        return out


class Columns(NamedTuple):
    """Files of one folder as columns, for :meth:`Generation.add_columns`: ``names`` (relative
    to the folder, no ``/``), and per file its ``shards``, ``components``, ``ends`` (the bytes
    its structure declares, None: not declared; every declared one before any undeclared one)
    and ``held`` (every component with state in it). Build with :func:`columns`, once per
    layout: every generation of that layout shares it."""

    names: tuple[str, ...]
    shards: tuple[str, ...]
    components: tuple[str, ...]
    ends: tuple[int | None, ...]
    held: tuple[tuple[str, ...], ...]
    declared_n: int       # how many leading files declare their end
    checked: list[int | None]  # ends[:declared_n], as a list (compared with the listed sizes)
    shard_set: frozenset[str]
    component_order: tuple[str, ...]  # components in the order first seen


def columns(names: Iterable[str], shards: Iterable[str], components: Iterable[str],
            ends: Iterable[int | None], held: Iterable[tuple[str, ...]]) -> Columns:
    """:class:`Columns` from per-file sequences of the same length. Raises ValueError when a
    name holds ``/`` or a declared end follows an undeclared one."""
    name_t, end_t = tuple(names), tuple(ends)
    if any("/" in n for n in name_t):
        raise ValueError("Columns names are names in one folder, without '/'")
    n = next((i for i, e in enumerate(end_t) if e is None), len(end_t))
    if any(e is not None for e in end_t[n:]):
        raise ValueError("Columns: every declared end must come before the undeclared ones")
    comp_t = tuple(components)
    shard_t = tuple(shards)
    return Columns(name_t, shard_t, comp_t, end_t, tuple(held), n, list(end_t[:n]),
                   frozenset(shard_t), tuple(dict.fromkeys(comp_t)))


@dataclass
class Generation:
    """One checkpoint generation found in a framework's folder (see the module doc for status).

    ``generation_id`` is the folder or file name (``step-100``, ``checkpoint-500``,
    ``global_step40``, ``iter_0000100``, ``epoch=1-step=20.ckpt``, ``300``); ``update`` the
    optimizer updates it represents, as the format records it; ``commit_marker`` the file whose
    presence commits it (None: not committed); ``committed_at`` that marker's modification time
    (POSIX seconds); ``progress`` what the format records of training progress (epoch,
    global_step, samples...); ``notes`` what this check could not look at;
    ``refused_globals`` every global its pickles name outside ``readers.SAFE_GLOBALS`` and the
    format's own classes (each file's are also a ``refused_globals`` reason)."""

    format: str
    generation_id: str
    folder: str
    update: int | None = None
    commit_marker: str | None = None
    committed_at: float | None = None
    required_shards: list[str] = field(default_factory=list)
    required_components: list[str] = field(default_factory=list)
    _objects: list[FoundObject] = field(default_factory=list, repr=False)
    progress: dict[str, Any] = field(default_factory=dict)
    world_size: int | None = None
    notes: list[str] = field(default_factory=list)
    #: globals the generation's pickles name that no loader should import (``refused_globals``)
    refused_globals: set[str] = field(default_factory=set)
    uncommitted: str = "no commit marker"
    status: str = ""
    reasons: list[dict[str, str]] = field(default_factory=list)
    _problems: dict[str, list[str]] = field(default_factory=dict, repr=False)
    _carried: set[str] = field(default_factory=set, repr=False)
    _unread: set[str] = field(default_factory=set, repr=False)
    #: files added in bulk, not yet made FoundObjects: (rel, shard, component, size, mtime,
    #: declared_size, held); ``_base`` is their tree's base URI
    _compact: list[tuple[str, str, str, int, float, int | None, tuple[str, ...]]] = field(
        default_factory=list, repr=False)
    _base: str = field(default="", repr=False)
    #: folders of files added as columns (:meth:`add_columns`), not yet made FoundObjects:
    #: (base URI, folder prefix, Columns, sizes, mtimes, indexes of the files present or None)
    _chunks: list[tuple[str, str, Columns, list[Any], list[Any], list[int] | None]] = field(
        default_factory=list, repr=False)

    @property
    def objects(self) -> list[FoundObject]:
        """The generation's files as :class:`FoundObject` (those added by :meth:`add_declared`
        are made when first asked for: a check that needs only statuses never builds them)."""
        if self._chunks:
            self._expand_chunks()
        if self._compact:
            base = self._base
            self._objects.extend(FoundObject(rel, base + rel, shard, component, size, mtime,
                                             declared, None, held)
                                 for rel, shard, component, size, mtime, declared, held
                                 in self._compact)
            self._compact.clear()
        return self._objects

    def _expand_chunks(self) -> None:
        out = self._objects
        for base, prefix, cols, sizes, mtimes, present in self._chunks:
            names, shards, comps, ends, helds = (cols.names, cols.shards, cols.components,
                                                 cols.ends, cols.held)
            for i in (range(len(names)) if present is None else present):
                rel = prefix + names[i]
                out.append(FoundObject(rel, base + rel, shards[i], comps[i], sizes[i],
                                       mtimes[i], ends[i], None, helds[i]))
        self._chunks.clear()

    def _chunk_shards(self) -> set[str]:
        out: set[str] = set()
        for *_, cols, _sizes, _mtimes, present in self._chunks:
            out |= cols.shard_set if present is None else {cols.shards[i] for i in present}
        return out

    def _chunk_components(self) -> list[str]:
        out: list[str] = []
        for *_, cols, _sizes, _mtimes, present in self._chunks:
            out.extend(cols.component_order if present is None else
                       [cols.components[i] for i in present])
        return out

    @property
    def committed(self) -> bool:
        return self.commit_marker is not None

    @property
    def components(self) -> list[str]:
        """Components found, in the order first seen."""
        return list(dict.fromkeys([o.component for o in self._objects]
                                  + self._chunk_components()
                                  + [t[2] for t in self._compact] + sorted(self._carried)))

    # --- what adapters call ----------------------------------------------------------------

    def problem(self, code: str, detail: str) -> None:
        """Record one finding under a spec reason code (grouped per code when finished)."""
        self._problems.setdefault(code, []).append(detail)

    def carries(self, component: str) -> None:
        """Record that a component is present inside an object already listed (e.g. a DCP file
        or a Lightning ``.ckpt`` holding model and optimizer)."""
        self._carried.add(component)

    def unread(self, components: Iterable[str]) -> None:
        """Components that would be inside a file that could not be read (its own finding
        rejects the generation); they are not also reported as ``component_missing``."""
        self._unread.update(components)

    def add(self, tree: Tree, rel: str, shard: str, component: str,
            declared_size: int | None = None) -> FoundObject | None:
        """Add the file ``rel`` (relative to the root) as an object; a missing file is recorded
        as ``object_missing``, a size other than ``declared_size`` as ``size_mismatch``.
        Returns the object, or None when the file is missing."""
        entry = tree.files.get(rel)
        if entry is None:
            self.problem("object_missing", f"{rel}: no such file")
            return None
        obj = FoundObject(rel, tree.uri(rel), shard, component, entry.size, entry.mtime,
                          declared_size)
        self.objects.append(obj)
        if declared_size is not None and entry.size != declared_size:
            what = "truncated" if entry.size < declared_size else "longer than declared"
            self.problem("size_mismatch", f"{rel}: {entry.size} bytes, its structure declares "
                                          f"{declared_size} ({what})")
        return obj

    def add_declared(self, tree: Tree, files: Iterable[
            tuple[str, str, str, int | None, tuple[str, ...]]]) -> None:
        """:meth:`add` for many files at once, each ``(rel, shard, component, declared_size,
        held)`` (``held``: every component with state in the file; a DCP save's 64 ranks'
        files: one loop, not a call per file)."""
        self.objects  # noqa: B018  (what was added before keeps its order)
        listed, problem = tree.files, self.problem
        self._base = tree.base_uri
        append = self._compact.append
        for rel, shard, component, declared, held in files:
            entry = listed.get(rel)
            if entry is None:
                problem("object_missing", f"{rel}: no such file")
                continue
            size = entry[0]
            append((rel, shard, component, size, entry[1], declared, held))
            if declared is not None and size != declared:
                what = "truncated" if size < declared else "longer than declared"
                problem("size_mismatch", f"{rel}: {size} bytes, its structure declares "
                                         f"{declared} ({what})")

    def add_columns(self, tree: Tree, folder: str, cols: Columns) -> None:
        """:meth:`add_declared` for files of one folder given as :class:`Columns` (names
        relative to ``folder``, without ``/``): their sizes are looked up and compared with the
        declared ends as whole columns, per file only when some file is missing or differs.
        The same findings, objects and order as :meth:`add_declared`."""
        self.objects  # noqa: B018  (what was added before keeps its order)
        sizes_of, mtimes_of = tree.files.folder(folder)
        names = cols.names
        sizes = list(map(sizes_of.get, names))
        present: list[int] | None = None
        n = cols.declared_n
        if None in sizes or sizes[:n] != cols.checked:
            prefix = folder + "/" if folder else ""
            problem, present = self.problem, []
            for i, (name, size, declared) in enumerate(zip(names, sizes, cols.ends, strict=False)):
                if size is None:
                    problem("object_missing", f"{prefix}{name}: no such file")
                    continue
                present.append(i)
                if declared is not None and size != declared:
                    what = "truncated" if size < declared else "longer than declared"
                    problem("size_mismatch", f"{prefix}{name}: {size} bytes, its structure "
                                             f"declares {declared} ({what})")
        self._chunks.append((tree.base_uri, folder + "/" if folder else "", cols, sizes,
                             list(map(mtimes_of.get, names)), present))

    def commit(self, tree: Tree, marker: str | None, when: float | None = None) -> None:
        """Mark the generation committed by ``marker`` (a relative path), at ``when`` (default:
        the marker's modification time)."""
        self.commit_marker = marker
        if marker is not None:
            entry = tree.files.get(marker)
            self.committed_at = when if when is not None else (entry.mtime if entry else None)

    # --- the rule ----------------------------------------------------------------------------

    def finish(self, options: Options, superseded: bool) -> None:
        """Apply the status rule (module doc): required shards and components, the restarting
        job's world size, then the status. ``superseded``: a newer generation exists."""
        if not self.committed:
            self.reasons = [{"code": "never_committed", "detail": self.uncommitted + (
                "; superseded by a newer generation" if superseded else
                "; nothing newer: a save under way, or its writer died")}]
            self.status = "abandoned" if superseded else "pending"
            return
        present = {o.shard for o in self._objects} | {t[1] for t in self._compact} \
            | self._chunk_shards()
        missing = [s for s in self.required_shards if s not in present]
        if missing:
            self.problem("shard_missing", f"no file for required shard {_short(missing)}")
        required = options.required_components or self.required_components
        found = self.components
        lacking = [c for c in required if c not in found and c not in self._unread]
        if lacking:
            self.problem("component_missing", f"no {', '.join(lacking)} (found: "
                                              f"{', '.join(found) or 'nothing'})")
        if options.world_size is not None and self.world_size is not None \
                and options.world_size != self.world_size:
            self.problem("world_size_mismatch", f"saved by {self.world_size} ranks, this job "
                                                f"runs {options.world_size}")
        reasons = []
        for code in sorted(self._problems, key=lambda c: (HARD + SOFT).index(c)
                           if c in HARD + SOFT else 99):
            items = self._problems[code]
            detail = items[0] if len(items) == 1 else f"{len(items)} findings: {_short(items, 3)}"
            reasons.append({"code": code, "detail": detail})
        self.reasons = reasons
        codes = {r["code"] for r in reasons}
        if codes & set(HARD):
            self.status = "rejected"
        elif codes & set(SOFT):
            self.status = "committed"
        else:
            self.status = "restorable"

    # --- output ------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The generation as the CLI prints it with ``--json``."""
        return {"generation_id": self.generation_id, "format": self.format,
                "update": self.update, "status": self.status, "reasons": self.reasons,
                "committed_at": rfc3339(self.committed_at), "commit_marker": self.commit_marker,
                "folder": self.folder, "world_size": self.world_size,
                "required_shards": self.required_shards, "components": self.components,
                "required_components": self.required_components, "progress": self.progress,
                "notes": self.notes, "refused_globals": sorted(self.refused_globals),
                "objects": [{**o.to_object(self.update), "observed_size": o.size,
                             "path": o.path} for o in self.objects]}

    def manifest(self, run_id: str | None = None, rule: str = "") -> dict[str, Any]:
        """A spec 4 manifest describing this committed generation, for the server's discovery
        (``schema_revision`` 1 with the extension ``adopted``: the format, its rule, and the
        reasons found, which the recovery core applies instead of its own shard and component
        rules). ``data_progress.cursor`` is empty: these formats record no data cursor."""
        doc: dict[str, Any] = {
            "schema_revision": 1, "generation_id": self.generation_id,
            "update": self.update if self.update is not None else 0,
            "world_size": self.world_size or max(1, len(self.required_shards)),
            "required_shards": list(self.required_shards) or sorted({o.shard for o in
                                                                     self.objects}),
            "components": self.components,
            "objects": [o.to_object(self.update) for o in self.objects],
            "data_progress": {"cursor": []},
            "dataset_version": "unknown",
            "committed_at": rfc3339(self.committed_at) or rfc3339(0.0),
            "required_components": list(self.required_components),
            "adopted": {"format": self.format, "rule": rule, "folder": self.folder,
                        "commit_marker": self.commit_marker, "progress": self.progress,
                        "reasons": [r for r in self.reasons if r["code"] in HARD]},
        }
        if self.refused_globals:
            doc["adopted"]["refused_globals"] = sorted(self.refused_globals)
        if run_id:
            doc["run_id"] = run_id
        return doc


def rfc3339(ts: float | None) -> str | None:
    """POSIX seconds as an RFC 3339 UTC string (milliseconds), None stays None."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="milliseconds") \
        .replace("+00:00", "Z")


def _short(items: Iterable[object], n: int = 5) -> str:
    items = list(items)
    shown = "; ".join(str(i) for i in items[:n]) if n <= 3 else \
        ", ".join(str(i) for i in items[:n])
    return shown + (f" and {len(items) - n} more" if len(items) > n else "")


def number_in(name: str, pattern: str) -> int | None:
    """The integer captured by ``pattern`` (one group) in ``name``, or None."""
    m = re.fullmatch(pattern, name)
    return int(m.group(1)) if m else None


def finish_all(generations: list[Generation], options: Options) -> list[Generation]:
    """Apply the status rule to every generation and sort them newest first (by update, then
    commit time, then id). A generation is superseded when another one is at a higher update,
    or at the same update and committed later."""
    keys: dict[int, tuple[int, float, str]] = {}
    for g in generations:
        when = g.committed_at if g.committed_at is not None else \
            max((o.mtime for o in g.objects), default=0.0)
        keys[id(g)] = (g.update if g.update is not None else -1, when, g.generation_id)
    ordered = sorted(generations, key=lambda g: keys[id(g)], reverse=True)
    for i, g in enumerate(ordered):  # sorted: anything before g in the list is newer
        g.finish(options, superseded=i > 0 and keys[id(ordered[0])] > keys[id(g)])
    return ordered
