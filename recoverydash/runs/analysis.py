"""The bridge between stored rows and the recovery core: load a run's typed tables into the
core's input records, run the analysis, store the result.

This is the only module that knows both the Django models and ``recoverydash.recovery``. What
follows an analysis (alert rules, webhooks) lives above it, in
``recoverydash.alerts.evaluation``; the Celery tasks in ``workers.tasks`` are thin wrappers around
these functions and those, and tests call them directly.

Debouncing: ``request_analysis`` enqueues at most one analysis per run per debounce window, by a
conditional UPDATE of ``Run.analysis_queued_at`` (works on PostgreSQL and SQLite alike); the task
clears the mark before it reads, so events arriving during an analysis enqueue the next one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
import zlib
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q
from django.dispatch import Signal
from django.utils import timezone

from recoverydash import recovery
from recoverydash.recovery.ledger import CONTINUED_FORMAT, STATE_FORMAT
from recoverydash.recovery.result import AnalysisResult
from recoverydash.runs.beats import absorb_reduced as absorb_reduced_beats
from recoverydash.runs.folding import unfold
from recoverydash.runs.models import (
    GLOBAL_RANK,
    Analysis,
    Attempt,
    CheckpointObject,
    Generation,
    Heartbeat,
    InputChunk,
    InputDigest,
    LedgerRow,
    Run,
    ShardReport,
    StateBlock,
)
from recoverydash.runs.queue import ANALYZE_RUN, enqueue
from recoverydash.runs.seq import committed_seq

log = logging.getLogger(__name__)

#: Sent inside the transaction that stores an analysis (``run``, ``analysis``, ``now`` keyword
#: arguments), before it commits; the alerts app evaluates its rules there. An exception of a
#: receiver rolls the analysis back (the sweep analyses the run again).
analysis_stored = Signal()

CHECKED = ("ok", "object_missing", "size_mismatch", "digest_mismatch", "storage_unverified",
           "object_outside_locations")


def _ts(moment) -> float | None:
    return moment.timestamp() if moment is not None else None


def _attempt_entry(a: Attempt) -> dict:
    """One Attempt row as the core reads it: ``{"attempt": AttemptRecord fields, "restore":
    RestoreRecord fields or None}`` (JSON values)."""
    record = recovery.AttemptRecord(
        attempt=a.attempt, started_at=_ts(a.started_at), world_size=a.world_size,
        dataset_version=a.dataset_version or None, global_batch_size=a.global_batch_size,
        micro_batch_size=a.micro_batch_size, grad_accum_steps=a.grad_accum_steps,
        config_digest=a.config_digest or None, sampler=a.sampler or {},
        resumed_from=a.resumed_from, contract=a.contract, ended_at=_ts(a.ended_at),
        end_reason=a.end_reason or None, end_update=a.end_update,
        end_fetched=list(a.fetched or []),  # the furthest read cursors, end included
        last_event_at=_ts(a.last_event_at))
    restore = None
    if a.restored_at is not None:
        restore = asdict(recovery.RestoreRecord(
            attempt=a.attempt, generation_id=a.restore_generation_id or None,
            seconds=float(a.restore_seconds or 0.0), time=_ts(a.restored_at)))
    return {"attempt": asdict(record), "restore": restore}


def _attempt_records(entries) -> tuple[list, list]:
    """``(AttemptRecord list, RestoreRecord list)`` of attempt entries (:func:`_attempt_entry`)
    in the order given."""
    attempts, restores = [], []
    for entry in entries:
        attempts.append(recovery.AttemptRecord(**entry["attempt"]))
        if entry["restore"] is not None:
            restores.append(recovery.RestoreRecord(**entry["restore"]))
    return attempts, restores


def load_attempts(run: Run) -> tuple[list, list]:
    """``(AttemptRecord list, RestoreRecord list)`` of a run, from its Attempt rows."""
    return _attempt_records(_attempt_entry(a) for a in
                            Attempt.objects.filter(run=run).order_by("attempt"))


def _generation_entries(run: Run, since: int = -1, statuses: dict | None = None) -> dict:
    """``{Generation pk: GenerationRecord fields (JSON values)}`` of the run's generations whose
    ``seq`` is above ``since`` (-1: every generation), with their shard reports and storage
    results: three queries, each bounded by those generations (through the ``(run, seq)``
    index when ``since`` >= 0). ``statuses``, when given, receives ``{pk: [status, reasons]}``
    as the rows hold them."""
    rows = Generation.objects.filter(run=run)
    if since >= 0:
        rows = rows.filter(seq__gt=since)
    gens = list(rows.order_by("pk"))
    if not gens:
        return {}
    pks = [g.pk for g in gens]
    shards: dict[int, dict] = {}
    for s in ShardReport.objects.filter(generation_id__in=pks):
        shards.setdefault(s.generation_id, {})[s.shard] = {
            "update": s.update, "objects": s.object_list, "time": _ts(s.reported_at)}
    checks: dict[int, dict] = {}
    for o in (CheckpointObject.objects.filter(generation_id__in=pks, in_manifest=True,
                                              check_status__in=CHECKED)
              .values_list("generation_id", "uri", "check_status")):
        checks.setdefault(o[0], {})[o[1]] = o[2]
    out = {}
    for g in gens:
        if statuses is not None:
            statuses[g.pk] = [g.status, g.reasons]
        manifests = [g.manifest] if g.manifest is not None else []
        other = getattr(g, "conflicting_manifest", None)
        if g.manifest_conflict and other:
            manifests.append(other)
        out[g.pk] = {
            "generation_id": g.generation_id, "attempt": g.attempt if g.attempt is not None else 0,
            "update": g.update, "started_at": _ts(g.started_at),
            "required_shards": g.required_shards, "components": g.components,
            "shards": dict(sorted(shards.get(g.pk, {}).items())), "manifests": manifests,
            "committed_at": _ts(g.commit_reported_at or g.committed_at),
            "object_checks": dict(sorted(checks.get(g.pk, {}).items()))}
    return out


def _generation_record(entry: dict) -> recovery.GenerationRecord:
    fields = dict(entry)
    fields["shards"] = {name: recovery.ShardRecord(**shard)
                        for name, shard in entry["shards"].items()}
    return recovery.GenerationRecord(**fields)


def load_generations(run: Run) -> list:
    """GenerationRecord per Generation row (in pk order), with its shard reports and storage
    results."""
    return [_generation_record(e) for e in _generation_entries(run).values()]


def load_input(run: Run) -> recovery.RunInput:
    """The core's ``RunInput`` for a run, read from its typed tables, without the ledger and the
    heartbeats: both reach the core through the incremental ``Ledger`` state
    (``analyze_with_result``, ``absorb_new``)."""
    attempts, restores = load_attempts(run)
    return recovery.RunInput(
        run_id=run.run_id, attempts=attempts, ledger=[], heartbeats=[],
        generations=load_generations(run), restores=restores, contract=run.contract or None,
        first_event_at=_ts(run.first_event_at))


#: The format of ``Analysis.inputs`` (:class:`StoredInputs`); another one is rebuilt, except
#: format 3, which loads and is continued. 2: with the generations' local judgements
#: (``judged``); 3: the generation entries in chunks, each encoded only when one of its
#: entries changed, in the one blob; 4: the blob holds the head only (a light entry per
#: generation, the comparison of state digests continued), the chunks are ``InputChunk`` rows
#: read and written only when needed (docs/retention.md#stored-inputs).
INPUTS_FORMAT = 4
#: Generation pks per chunk of the stored generation entries (``pk // GENERATION_CHUNK``).
GENERATION_CHUNK = 32
_INPUTS_MAGIC = b"RDI4"
_FORMAT3_MAGIC = b"RDI3"
#: The keys of a manifest a light entry's ``head`` leaves out
#: (``recovery.GenerationRecord.manifest_head``)
_HEAVY_KEYS = ("objects", "required_shards", "components")


class InputsLost(Exception):
    """A chunk of the stored generation entries that the head names is missing or unreadable
    (:meth:`StoredInputs.entry`): the analysis reads every row again."""


def _light(entry: dict) -> dict:
    """The light entry of a generation entry (:func:`_generation_entries`): what the core reads
    of a generation whose verdict parts are kept (``recovery.GenerationRecord``'s
    ``generation_id``, ``attempt``, ``update``, ``started_at``, ``committed_at``, and the
    answers of ``manifest_head``, ``conflicting`` and ``has_shards``)."""
    record = _generation_record(entry)
    manifest = record.manifest()
    head = None if manifest is None else {k: v for k, v in manifest.items()
                                          if k not in _HEAVY_KEYS}
    return {"generation_id": entry["generation_id"], "attempt": entry["attempt"],
            "update": entry["update"], "started_at": entry["started_at"],
            "committed_at": entry["committed_at"], "head": head,
            "conflicting": record.conflicting(), "has_shards": record.has_shards()}


class StoredGeneration(recovery.GenerationRecord):
    """A generation as :class:`StoredInputs` holds it before its chunk is read: the light
    entry's fields at hand, the others (``manifests``, ``shards``, ``object_checks``,
    ``required_shards``, ``components``, and ``manifest()``) loaded from its chunk on first
    touch (``load``: a callable returning its entry). Equal to the full record in everything
    the core reads; fast when it reads only the light part."""

    def __init__(self, light: dict, load) -> None:  # noqa: D107 - see the class
        self.generation_id = light["generation_id"]
        self.attempt = light["attempt"]
        self.update = light["update"]
        self.started_at = light["started_at"]
        self.committed_at = light["committed_at"]
        self._light, self._load, self._record = light, load, None

    def _full(self) -> recovery.GenerationRecord:
        if self._record is None:
            self._record = _generation_record(self._load())
        return self._record

    required_shards = property(lambda self: self._full().required_shards)
    components = property(lambda self: self._full().components)
    shards = property(lambda self: self._full().shards)
    manifests = property(lambda self: self._full().manifests)
    object_checks = property(lambda self: self._full().object_checks)

    def manifest(self) -> dict | None:
        """The full manifest (its chunk read when not yet)."""
        return self._full().manifest()

    def manifest_head(self) -> dict | None:
        """The manifest without its object lists, from the light entry."""
        return self._light["head"]

    def conflicting(self) -> int:
        """From the light entry."""
        return self._light["conflicting"]

    def has_shards(self) -> bool:
        """From the light entry."""
        return self._light["has_shards"]


def _digest_key(component, sha256) -> int:
    """``InputDigest.key`` of a state object: the signed 64-bit head of blake2b(component NUL
    sha256)."""
    return int.from_bytes(hashlib.blake2b(f"{component}\0{sha256}".encode(), digest_size=8)
                          .digest(), "big", signed=True)


def _row_sig(row) -> str | None:
    """A digest of a ``recovery.repeat_row`` (None: the generation is not compared)."""
    if row is None:
        return None
    return hashlib.blake2b(json.dumps(row, separators=(",", ":")).encode(),
                           digest_size=16).hexdigest()


def _encode(doc) -> bytes:
    """``doc`` as compact JSON, zlib-compressed (read back by :func:`_decode`)."""
    return zlib.compress(json.dumps(doc, separators=(",", ":")).encode(), 6)


def _decode(data) -> Any:
    """What :func:`_encode` wrote (bytes or a memoryview). Raises zlib.error or ValueError
    when ``data`` is not that."""
    return json.loads(zlib.decompress(bytes(data)))


def _int_keys(doc: dict) -> dict:
    """``doc`` with its keys as ints (JSON object keys are strings)."""
    return {int(k): v for k, v in doc.items()}


class StoredInputs:
    """What the core reads of a run's Attempt and Generation rows, kept between analyses so that
    each reads only the rows whose ``seq`` (the seq of their last write: ``Attempt.seq``,
    ``Generation.seq``, which a shard report, an object or a storage result of the generation
    moves too) lies above the seq the stored copy reflects.

    ``attempts``: ``{attempt number: attempt entry}`` (:func:`_attempt_entry`); ``light``:
    ``{Generation pk: light entry}`` (:func:`_light`) of every generation; ``entries``: the
    full entries (``GenerationRecord`` fields, :func:`_generation_entries`) of the generations
    read or loaded so far (the others stay in their ``InputChunk`` row until the core touches
    them, :class:`StoredGeneration`); ``statuses``: ``{Generation pk: [status, reasons]}`` as
    the rows hold them (:func:`_store_generation_statuses`); ``judged``: ``{Generation pk:
    recovery.local_judgement of its entry}`` under the contract's required components
    ``judged_for`` (dropped when the row is read again, all when the components change);
    ``repeats``: the state digest comparison so far (``basis``: ``recovery.continue_repeats``'s,
    ``sigs``: ``{pk: signature of its repeat row or None}`` of the generations compared,
    ``found``: ``{pk: [stale sentences, optimizer_stateless reason or None]}``, non-empty ones),
    continued by :meth:`repeats_for`.

    ``Analysis.inputs`` holds the head (:meth:`to_bytes`), ``InputChunk`` rows the entries by
    chunk and ``InputDigest`` rows the first occurrence of each state digest (:meth:`store`).
    A format 3 blob (head and chunks in one) loads with every entry and is continued; its
    first write moves the chunks into rows."""

    def __init__(self, analysis_pk: int | None = None) -> None:
        self.analysis_pk = analysis_pk
        self.attempts: dict = {}
        self.light: dict = {}
        self.entries: dict = {}
        self.statuses: dict = {}
        self.judged: dict = {}
        self.judged_for: list | None = None
        #: ``{pk: data cursor comparison}`` (``recovery.evaluate_generations``' ``checks``)
        #: as of the ledger state at ingest seq ``checked_seq``
        self.checked: dict = {}
        self.checked_seq = -1
        self.repeats: dict = {"basis": None, "sigs": {}, "found": {}}
        #: chunks that have an InputChunk row (as of the head read), chunks to write, and
        #: whether every row is to be replaced (a rebuild, a format 3 copy)
        self.chunks: set = set()
        self.dirty: set = set()
        self.replace = True
        #: pks whose row was read by this analysis (:meth:`read_changes`)
        self.changed: set = set()
        #: InputDigest rows to add (``{key: (update, pk)}``), or all of them (``replace``)
        self.digests: dict = {}
        self.digests_replace = True
        self._loaded: set = set()

    @property
    def generations(self) -> dict:
        """``{Generation pk: light entry}`` of every generation."""
        return self.light

    @classmethod
    def from_bytes(cls, blob, analysis_pk: int | None = None) -> StoredInputs | None:
        """The stored copy of Analysis ``analysis_pk``, or None when ``blob`` is empty,
        unreadable or of a format other than 3 and :data:`INPUTS_FORMAT` (then every row is
        read again)."""
        if not blob:
            return None
        blob = bytes(blob)
        out = cls(analysis_pk)
        try:
            if blob.startswith(_FORMAT3_MAGIC):
                return cls._from_format3(blob, analysis_pk)
            if not blob.startswith(_INPUTS_MAGIC):
                return None
            doc = _decode(blob[4:])
            if not isinstance(doc, dict) or doc.get("format") != INPUTS_FORMAT:
                return None
            out.attempts = _int_keys(doc["attempts"])
            out.light = _int_keys(doc["light"])
            out.statuses = _int_keys(doc["statuses"])
            out.judged = _int_keys(doc["judged"])
            out.judged_for = doc["judged_for"]
            out.checked = _int_keys(doc["checked"])
            out.checked_seq = doc["checked_seq"]
            rep = doc["repeats"]
            out.repeats = {"basis": rep["basis"],
                           "sigs": _int_keys(rep["sigs"]),
                           "found": _int_keys(rep["found"])}
            out.chunks = set(doc["chunks"])
        except (zlib.error, ValueError, KeyError, TypeError, AttributeError):
            return None
        out.replace = out.digests_replace = False
        return out

    @classmethod
    def _from_format3(cls, blob: bytes, analysis_pk) -> StoredInputs | None:
        """A format 3 copy: every entry decoded, the light entries made from them; its first
        write stores every chunk row and compares every generation's state digests."""
        size = int.from_bytes(blob[4:8], "big")
        doc = _decode(blob[8:8 + size])
        if not isinstance(doc, dict) or doc.get("format") != 3:
            return None
        entries: dict = {}
        at = 8 + size
        for _chunk, length in doc["chunks"]:
            entries.update((int(k), v) for k, v in
                           _decode(blob[at:at + length]).items())
            at += length
        out = cls(analysis_pk)
        out.attempts = _int_keys(doc["attempts"])
        out.entries = entries
        out.light = {pk: _light(entry) for pk, entry in entries.items()}
        out.statuses = _int_keys(doc["statuses"])
        out.judged = _int_keys(doc["judged"])
        out.judged_for = doc["judged_for"]
        out.dirty = {pk // GENERATION_CHUNK for pk in entries}
        return out

    def to_bytes(self) -> bytes:
        """The head as bytes, read back by :meth:`from_bytes`: ``RDI4`` then zlib-compressed
        JSON (attempts, light entries, statuses, judgements, the digest comparison, and the
        chunks that have a row)."""
        chunks = sorted({pk // GENERATION_CHUNK for pk in self.light})
        rep = self.repeats
        return _INPUTS_MAGIC + _encode({
            "format": INPUTS_FORMAT, "attempts": self.attempts, "light": self.light,
            "statuses": self.statuses, "judged": self.judged, "judged_for": self.judged_for,
            "checked": self.checked, "checked_seq": self.checked_seq,
            "repeats": {"basis": rep["basis"], "sigs": rep["sigs"], "found": rep["found"]},
            "chunks": chunks})

    def _load_chunks(self, chunks) -> None:
        """Read the InputChunk rows of ``chunks`` (not read yet) into ``entries`` (an entry read
        from its row by this analysis wins). Raises InputsLost when a chunk that holds a
        generation has no readable row."""
        wanted = sorted(set(chunks) - self._loaded)
        if not wanted:
            return
        found = set()
        for chunk, data in InputChunk.objects.filter(
                analysis_id=self.analysis_pk, chunk__in=wanted).values_list("chunk", "data"):
            try:
                doc = _decode(data)
            except (zlib.error, ValueError) as exc:
                raise InputsLost(f"chunk {chunk} unreadable: {exc}") from exc
            for k, entry in doc.items():
                self.entries.setdefault(int(k), entry)
            found.add(chunk)
        self._loaded.update(wanted)
        missing = [pk for pk in self.light if pk // GENERATION_CHUNK in self._loaded
                   and pk not in self.entries]
        if missing:
            raise InputsLost(f"no stored entry of generation {missing[0]} "
                             f"(chunks read: {sorted(found)})")

    def entry(self, pk: int) -> dict:
        """The full entry of generation ``pk``, its chunk read when needed (InputsLost)."""
        if pk not in self.entries:
            self._load_chunks([pk // GENERATION_CHUNK])
        return self.entries[pk]

    def _record(self, pk: int) -> recovery.GenerationRecord:
        if pk in self.entries:
            return _generation_record(self.entries[pk])
        return StoredGeneration(self.light[pk], lambda: self.entry(pk))

    def read_changes(self, run: Run, since: int) -> int:
        """Replace the entries of the run's attempts and generations whose row ``seq`` is above
        ``since`` (-1: all, the copy rebuilt), and read the chunks those generations are in (to
        write them again). Returns how many rows were read."""
        rows = Attempt.objects.filter(run=run)
        if since >= 0:
            rows = rows.filter(seq__gt=since)
        else:
            fresh = StoredInputs(self.analysis_pk)
            self.__dict__.update(fresh.__dict__)
        changed = [(a.attempt, _attempt_entry(a)) for a in rows]
        self.attempts.update(changed)
        gens = _generation_entries(run, since, self.statuses)
        for pk, entry in gens.items():
            self.entries[pk] = entry
            self.light[pk] = _light(entry)
            self.judged.pop(pk, None)
            self.checked.pop(pk, None)
            self.dirty.add(pk // GENERATION_CHUNK)
            self.changed.add(pk)
        if since < 0:
            self._loaded = {pk // GENERATION_CHUNK for pk in self.light}
        self._load_chunks(c for c in self.dirty if c in self.chunks)
        return len(changed) + len(gens)

    def judgements(self, required_components) -> tuple[dict, dict]:
        """``(judged, pks)`` for ``recovery.analyze``: ``{generation_id: local judgement}`` of
        the generations whose entry was judged under ``required_components`` (the effective
        contract's; the kept judgements are dropped when it differs from ``judged_for``), and
        ``{generation_id: pk}`` of the entry the core judges for each id (the last by pk, as
        ``RunView`` keeps the last record of an id). :meth:`keep` stores the fresh ones."""
        wanted = list(required_components)
        if self.judged_for != wanted:
            self.judged, self.judged_for = {}, wanted
        pks = {self.light[pk]["generation_id"]: pk for pk in sorted(self.light)}
        judged = {gid: self.judged[pk] for gid, pk in pks.items() if pk in self.judged}
        return judged, pks

    def keep(self, fresh: dict, pks: dict, checks: dict | None = None) -> int:
        """Store ``fresh`` (``{generation_id: local judgement}`` the core judged afresh) and
        ``checks`` (the data cursor comparisons it made afresh) under the pks of
        :meth:`judgements`. Returns how many were stored."""
        for gid, judgement in fresh.items():
            self.judged[pks[gid]] = judgement
        for gid, check in (checks or {}).items():
            self.checked[pks[gid]] = check
        return len(fresh) + len(checks or {})

    def cursor_checks(self, pks: dict, since: int) -> dict | None:
        """The kept data cursor comparisons by generation id (:meth:`judgements`' ``pks``) when
        they reflect the ledger state at ingest seq ``since`` (the state this analysis
        continues), else None (every comparison is made again)."""
        if self.checked_seq != since or since < 0:
            self.checked = {}
            return None
        return {gid: self.checked[pk] for gid, pk in pks.items() if pk in self.checked}

    def repeats_for(self, pks: dict) -> dict:
        """``recovery.generations.state_repeats`` of the generations ``pks`` names
        (``{generation_id: pk}``, :meth:`judgements`), as ``{generation_id: (stale sentences,
        optimizer_stateless Reason or None)}``, continued from the stored comparison: when the
        only generations not compared before are new ones above every compared update
        (``recovery.continue_repeats``), only their objects are read and their digests looked
        up in ``InputDigest`` (a hit confirmed against the object of the generation it names);
        when a compared generation's row changed or left, or a new one is not above them all,
        every generation is compared again (every chunk read) and the digest rows replaced.
        A generation read again whose row is the same changes nothing."""
        from recoverydash.recovery.generations import continue_repeats, repeat_row

        rep = self.repeats
        view = set(pks.values())
        sigs, basis = rep["sigs"], rep["basis"]
        continued = self._continued_repeats(view, sigs, basis)
        if continued is None:  # every generation compared again
            self._load_chunks({pk // GENERATION_CHUNK for pk in view})
            rows = {pk: repeat_row(self._record(pk)) for pk in sorted(view)}
            compared = {pk: row for pk, row in rows.items() if row is not None}
            seen: dict = {}
            basis, sigs, found_by = None, {}, {}
            self.digests, self.digests_replace = {}, True
        else:
            rows, compared, seen = continued
            found_by = dict(rep["found"])
        out, first, basis = continue_repeats(list(compared.values()), basis, seen)
        for pk, row in rows.items():
            sigs[pk] = _row_sig(row)
            if row is not None:
                stale, stateless = out[row[1]]
                if stale or stateless is not None:
                    found_by[pk] = [stale, None if stateless is None else stateless.to_dict()]
        for (component, sha256), (update, gid) in first.items():
            self.digests.setdefault(_digest_key(component, sha256), (update, pks[gid]))
        self.repeats = {"basis": basis, "sigs": sigs, "found": found_by}
        ids = {pk: gid for gid, pk in pks.items()}
        return {ids[pk]: (stale, None if r is None else recovery.Reason(**r))
                for pk, (stale, r) in found_by.items() if pk in ids}

    def _continued_repeats(self, view: set, sigs: dict,
                           basis: dict | None) -> tuple[dict, dict, dict] | None:
        """:meth:`repeats_for` continued from the stored comparison (``sigs``, ``basis``) over
        the generations ``view`` (pks): ``(rows, compared, seen)``, the repeat rows read (the
        generations not compared before), those with a row, and the first occurrences of
        their digests (:meth:`_seen`). None when every generation is to be compared again: no
        comparison stored, a compared generation left or its row changed, a new one not after
        every compared one in the order of commit (``recovery.generations.repeat_order``), or
        a digest hit that cannot be confirmed."""
        from recoverydash.recovery.generations import repeat_order, repeat_row

        if basis is None or any(pk not in view for pk in sigs):
            return None
        rows: dict = {}
        for pk in sorted(view):
            if pk in sigs and pk not in self.changed:
                continue
            row = repeat_row(self._record(pk))
            if pk in sigs:
                if sigs[pk] != _row_sig(row):
                    return None
                continue
            rows[pk] = row
        compared = {pk: row for pk, row in rows.items() if row is not None}
        top = basis["top"]
        if compared and top is not None and (
                not isinstance(top, list)  # stored before the order of commit
                or min(repeat_order(row) for row in compared.values()) <= tuple(top)):
            return None
        seen = self._seen(compared, sigs) if compared else {}
        return None if seen is None else (rows, compared, seen)

    def _seen(self, compared: dict, sigs: dict) -> dict | None:
        """``{(component, sha256): (update, generation_id)}`` of the first occurrences, among
        the compared generations, of the digests of ``compared``'s rows (``{pk: repeat row}``),
        from ``InputDigest``; None when a hit cannot be confirmed (a key shared by two digests,
        a generation since left: compare every one)."""
        from recoverydash.recovery.generations import repeat_row

        wanted: dict = {}
        for row in compared.values():
            for component, sha256, _uri in row[2]:
                wanted.setdefault(_digest_key(component, sha256), (component, sha256))
        keys = sorted(wanted)
        hits = []
        for lo in range(0, len(keys), 2000):
            hits += InputDigest.objects.filter(
                analysis_id=self.analysis_pk, key__in=keys[lo:lo + 2000]).values_list(
                "key", "update", "generation")
        seen: dict = {}
        rows_of: dict = {}
        for key, update, pk in hits:
            if sigs.get(pk) is None:
                return None
            if pk not in rows_of:
                rows_of[pk] = repeat_row(self._record(pk))
            row = rows_of[pk]
            component, sha256 = wanted[key]
            if row is None or row[0] != update or not any(
                    c == component and s == sha256 for c, s, _ in row[2]):
                return None
            seen[(component, sha256)] = (update, row[1])
        return seen

    def run_input(self, run: Run) -> recovery.RunInput:
        """The core's ``RunInput`` (as :func:`load_input` reads it: attempts by number,
        generations by pk; a generation whose entry was not read is a
        :class:`StoredGeneration`)."""
        attempts, restores = _attempt_records(self.attempts[k] for k in sorted(self.attempts))
        return recovery.RunInput(
            run_id=run.run_id, attempts=attempts, ledger=[], heartbeats=[],
            generations=[self._record(k) for k in sorted(self.light)],
            restores=restores, contract=run.contract or None,
            first_event_at=_ts(run.first_event_at))

    def store(self, analysis_pk: int) -> None:
        """Write the chunk rows that changed (every one when :attr:`replace`) and the digest
        rows (added, or replaced with :attr:`digests_replace`), inside the caller's
        transaction; the head is the caller's to write (:meth:`to_bytes`)."""
        by_chunk: dict = {}
        for pk in self.light:
            by_chunk.setdefault(pk // GENERATION_CHUNK, []).append(pk)
        dirty = set(by_chunk) if self.replace else self.dirty & set(by_chunk)
        if dirty:
            self._load_chunks(c for c in dirty if c in self.chunks)
        rows = [InputChunk(analysis_id=analysis_pk, chunk=chunk, data=_encode(
                    {pk: self.entries[pk] for pk in sorted(by_chunk[chunk])}))
                for chunk in sorted(dirty)]
        if self.replace:
            InputChunk.objects.filter(analysis_id=analysis_pk).delete()
            InputChunk.objects.bulk_create(rows, batch_size=200)
        elif rows:
            InputChunk.objects.bulk_create(rows, batch_size=200, update_conflicts=True,
                                           unique_fields=["analysis", "chunk"],
                                           update_fields=["data"])
        if self.digests_replace:
            InputDigest.objects.filter(analysis_id=analysis_pk).delete()
        if self.digests:
            _add_digests(analysis_pk, self.digests)
        self.chunks = set(by_chunk)
        self.dirty, self.replace, self.digests, self.digests_replace = set(), False, {}, False

    @property
    def touched(self) -> bool:
        """Whether rows are to be written (:meth:`store`)."""
        return bool(self.dirty or self.replace or self.digests or self.digests_replace)


def _add_digests(analysis_pk: int, digests: dict) -> None:
    """Insert ``digests`` (``{key: (update, Generation pk)}``) as InputDigest rows of Analysis
    ``analysis_pk``, a key already there kept: on PostgreSQL in statements of 50,000 rows
    from arrays (``unnest``; the ORM's objects cost 30 us a row), elsewhere by the ORM."""
    items = sorted(digests.items())
    if connection.vendor != "postgresql":
        InputDigest.objects.bulk_create(
            [InputDigest(analysis_id=analysis_pk, key=key, update=update, generation=pk)
             for key, (update, pk) in items], batch_size=2000, ignore_conflicts=True)
        return
    table = InputDigest._meta.db_table
    with connection.cursor() as cursor:
        for lo in range(0, len(items), 50_000):
            part = items[lo:lo + 50_000]
            cursor.execute(
                f'INSERT INTO "{table}" (analysis_id, key, "update", generation) '
                "SELECT %s, * FROM unnest(%s::bigint[], %s::bigint[], %s::bigint[]) "
                "ON CONFLICT DO NOTHING",
                [analysis_pk, [k for k, _ in part], [u for _, (u, _p) in part],
                 [p for _, (_u, p) in part]])


def drop_inputs(analysis_pk: int) -> None:
    """Delete the chunk and digest rows of Analysis ``analysis_pk`` (its ``inputs`` emptied by
    the caller): the next analysis reads every row again."""
    InputChunk.objects.filter(analysis_id=analysis_pk).delete()
    InputDigest.objects.filter(analysis_id=analysis_pk).delete()


CHUNK = 5000

def _loads_all(texts: list) -> list:
    """The JSON values of ``texts`` (JSON text, None for SQL null) in one json.loads call."""
    return json.loads("[" + ",".join(text or "null" for text in texts) + "]")


def _fetch(sql: str, params: list):
    """Chunks (lists of tuples) of a raw query's rows whose last column is JSON text, at most
    :data:`CHUNK` rows each, the chunk's JSON decoded in one call (a null stays None)."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        while True:
            chunk = cursor.fetchmany(CHUNK)
            if not chunk:
                return
            values = _loads_all([row[-1] for row in chunk])
            yield [(*row[:-1], value) for row, value in zip(chunk, values)]


#: jsonb's text of the common report shape, one span of one range of integers below 10**18
#: with an optional ``order`` and no other key, the stratum and order without escapes
#: (``[{"epoch": 0, "order": "e187...", "ranges": [[0, 512, 64]], "stratum": "main"}]``, the
#: SDK's DistributedSampler report; jsonb writes keys shortest first): epoch, order (None when
#: absent), start, stop, step (None for a two-item range), stratum. Matched in Python:
#: PostgreSQL's regexp_match took 180 us a row.
PLAIN_SPANS = re.compile(r'\[\{"epoch": ([0-9]{1,18}), (?:"order": "([^"\\]*)", )?'
                         r'"ranges": \[\[([0-9]{1,18}), ([0-9]{1,18})(?:, ([0-9]{1,18}))?\]\], '
                         r'"stratum": "([^"\\]*)"\}\]\Z')


def _plain_rows(chunk: list) -> list:
    """``(attempt, update, rank, ranks, rank_shift, time, spans text)`` rows as
    :meth:`recovery.Ledger.absorb_folded` takes them, folded as stored (``runs.folding``: the
    core unfolds them): the common shape (:data:`PLAIN_SPANS`) as columns, stratum set and
    spans None, every other row's JSON decoded (one json.loads per chunk), stratum None; the
    global rank as None."""
    match, glob = PLAIN_SPANS.match, GLOBAL_RANK
    out: list = []
    others: list = []
    where: list = []
    for attempt, update, rank, ranks, shift, when, text in chunk:
        found = match(text) if text is not None else None
        rank = None if rank == glob else rank
        if found is None:
            where.append(len(out))
            others.append(text or "null")
            out.append((attempt, update, rank, ranks, shift, when, None, None, None, None, None,
                        None, None))
            continue
        epoch, order, start, stop, step, stratum = found.groups()
        out.append((attempt, update, rank, ranks, shift, when, None, stratum, int(epoch), order,
                    int(start), int(stop), None if step is None else int(step)))
    if others:
        for i, spans in zip(where, json.loads("[" + ",".join(others) + "]"), strict=True):
            out[i] = out[i][:6] + (spans,) + out[i][7:]
    return out


def _new_rows(run: Run, since: int, upto: int):
    """Chunks of the run's ledger rows whose ``last_seq`` is in ``(since, upto]``, in
    ``(attempt, update, rank)`` order. On PostgreSQL one raw query (time as epoch seconds,
    spans as jsonb's text: the ORM's per-row datetime and JSON converters cost 4x the rest),
    rows as :meth:`recovery.Ledger.absorb_folded` takes them (:func:`_plain_rows`: folded as
    stored, a row of the common shape as columns, no JSON decoded, no dict built); elsewhere
    the ORM, rows as :meth:`recovery.Ledger.absorb_plain` takes them, ``(attempt, update, rank
    (None for the coordinator's -1), time as POSIX seconds, spans, stratum, epoch, start, stop,
    step)``, spans always given, a folded row giving one row per rank it holds
    (``runs.folding``), so a chunk may hold more than :data:`CHUNK` rows."""
    glob = GLOBAL_RANK
    if connection.vendor == "postgresql":
        sql = ('SELECT attempt, "update", rank, ranks, rank_shift, '
               'extract(epoch from time)::float8, spans::text '
               f'FROM "{LedgerRow._meta.db_table}" WHERE run_id = %s AND last_seq > %s '
               'AND last_seq <= %s ORDER BY attempt, "update", rank')
        with connection.cursor() as cursor:
            cursor.execute(sql, [run.pk, since, upto])
            while True:
                chunk = cursor.fetchmany(CHUNK)
                if not chunk:
                    return
                yield _plain_rows(chunk)
    rows = (LedgerRow.objects.filter(run=run, last_seq__gt=since, last_seq__lte=upto)
            .order_by("attempt", "update", "rank")
            .values_list("attempt", "update", "rank", "ranks", "rank_shift", "time", "spans")
            .iterator(CHUNK))
    chunk = []
    for attempt, update, rank, ranks, shift, when, spans in rows:
        for mine, part in unfold(rank, ranks, shift, spans):
            chunk.append((attempt, update, None if mine == glob else mine, when.timestamp(),
                          part, None, None, None, None, None))
        if len(chunk) >= CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _new_beats(run: Run, since: int, upto: int):
    """Chunks of ``(attempt, rank, time as POSIX seconds, update, fetched)`` of the run's
    heartbeats whose ``seq`` is in ``(since, upto]``, in ``(seq, id)`` order (raw on
    PostgreSQL, as above)."""
    if connection.vendor == "postgresql":
        yield from _fetch(
            'SELECT attempt, rank, extract(epoch from time)::float8, "update", fetched::text '
            f'FROM "{Heartbeat._meta.db_table}" WHERE run_id = %s AND seq > %s AND seq <= %s '
            'ORDER BY seq, id', [run.pk, since, upto])
        return
    rows = (Heartbeat.objects.filter(run=run, seq__gt=since, seq__lte=upto)
            .order_by("seq", "pk").values_list("attempt", "rank", "time", "update", "fetched")
            .iterator(CHUNK))
    yield [(attempt, rank, when.timestamp(), update, fetched)
           for attempt, rank, when, update, fetched in rows]


def absorb_new(run: Run, ledger: recovery.Ledger, since: int, upto: int,
               lowest: dict | None = None) -> tuple[int, int]:
    """Fold into ``ledger`` the run's ledger rows whose ``last_seq`` and heartbeats whose ``seq``
    lie in ``(since, upto]`` (``since`` -1: every row), read by seq through their ``(run, seq)``
    indexes in chunks of :data:`CHUNK`, never the whole table. Ledger rows in ``(attempt,
    update, rank)`` order (the core's fast path), heartbeats in ``(seq, id)`` order (the order
    the heartbeat fold is defined over, so batches fold like one): on PostgreSQL reduced by the
    database first (``runs.beats``: a row per rank, cursor and chart point, the same fold).
    Returns ``(rank reports,
    heartbeats)`` absorbed (a folded ledger row counts each rank it holds). ``lowest``, when
    given, receives ``{attempt: the lowest update of a ledger row absorbed}``. Raises what the
    core raises on a malformed value."""
    n_rows = n_beats = 0
    record = recovery.LedgerRecord
    for chunk in _new_rows(run, since, upto):
        if lowest is not None:  # a chunk is in (attempt, update) order: an attempt's first row
            prev = None
            for row in chunk:
                if row[0] != prev:
                    prev = row[0]
                    if row[1] < lowest.get(prev, row[1] + 1):
                        lowest[prev] = row[1]
        if connection.vendor == "postgresql":
            n_rows += ledger.absorb_folded(chunk)
        else:  # every row has its spans: the batch fast path of absorb
            n_rows += ledger.absorb([record(a, u, r, t, s) for a, u, r, t, s, *_ in chunk])
    reduced = absorb_reduced_beats(run.pk, since, upto, ledger.beats)
    if reduced is not None:
        return n_rows, reduced
    beat = recovery.HeartbeatRecord
    for chunk in _new_beats(run, since, upto):
        n_beats += ledger.beats.absorb([beat(a, r, t, u, f or []) for a, r, t, u, f in chunk])
    return n_rows, n_beats


def _store_generation_statuses(verdicts: list, inputs: StoredInputs) -> int:
    """Copy each generation's status and reasons (docs/definitions.md#generation-status) onto its
    row where they differ from what the row holds (``inputs.statuses``, kept up to date here):
    one UPDATE per changed generation, no read. Returns how many rows were written."""
    written = 0
    pks = {entry["generation_id"]: pk for pk, entry in inputs.generations.items()}
    for verdict in verdicts:  # every generation (the result lists the newest only)
        g = verdict.to_dict()
        pk = pks.get(g["generation_id"])
        if pk is None:
            continue
        held = inputs.statuses.get(pk)
        if held is None or held[0] != g["status"] or held[1] != g["reasons"]:
            Generation.objects.filter(pk=pk).update(status=g["status"], reasons=g["reasons"])
            inputs.statuses[pk] = [g["status"], g["reasons"]]
            written += 1
    return written


def _clock_driven_only(analysis: Analysis, stored: AnalysisResult | None, since: int, state,
                       result: AnalysisResult) -> dict | None:
    """The clock-driven part of ``result`` (``recovery.split_clock_driven``) when that is all
    that differs from the stored result: nothing was absorbed into a continued state
    (``state`` None), the locked row ``analysis`` is error-free and still reflects ``since``,
    and every other key of ``stored`` (its result as read before the analysis) is equal
    (compared as JSON). None otherwise: the whole result is to be written."""
    if state is not None or since < 0 or analysis.ingest_seq != since or analysis.error \
            or not isinstance(stored, dict) or not stored:
        return None
    rest, timed = recovery.split_clock_driven(result)
    before, _ = recovery.split_clock_driven(stored)
    if json.dumps(rest, sort_keys=True) != json.dumps(before, sort_keys=True):
        return None
    return timed


def _merge_result(analysis: Analysis, timed: dict) -> None:
    """Write ``timed`` (the clock-driven keys, and chart series under ``charts``) into the
    stored ``Analysis.result`` in place: a jsonb merge on PostgreSQL (the rest of the document
    is not sent again), elsewhere the row's result rewritten. Inside the caller's transaction,
    on the locked row."""
    charts = timed.get("charts") or {}
    top = {k: v for k, v in timed.items() if k != "charts"}
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                f'UPDATE "{Analysis._meta.db_table}" SET result = jsonb_set(result || %s::jsonb, '
                "'{charts}', coalesce(result->'charts', '{}'::jsonb) || %s::jsonb) WHERE id = %s",
                [json.dumps(top), json.dumps(charts), analysis.pk])
        return
    Analysis.objects.filter(pk=analysis.pk).update(result=_merged(analysis.result, timed))


def _merged(result: dict, timed: dict) -> dict:
    """``result`` with ``timed`` merged in as :func:`_merge_result` writes it: the top-level
    keys replaced, the chart series under ``charts`` replaced one by one (a new dict; ``result``
    is left as it is)."""
    merged = dict(result)
    merged.update({k: v for k, v in timed.items() if k != "charts"})
    merged["charts"] = {**(result.get("charts") or {}), **(timed.get("charts") or {})}
    return merged


def load_state(analysis_pk: int, head) -> recovery.Ledger:
    """The stored ledger state of Analysis ``analysis_pk`` whose ``state`` is ``head``: a
    format 6 head with the run's time blocks (``StateBlock``, one query), or a state of an
    older format whole (``recovery.Ledger.from_parts``). Raises ValueError when it cannot be
    read (a block missing included). The head and the blocks are read by two statements: a
    caller racing a writer reads them in one (:func:`_stored_parts`)."""
    blocks = StateBlock.objects.filter(analysis_id=analysis_pk).values_list("attempt", "block",
                                                                          "data")
    return recovery.Ledger.from_parts(bytes(head), blocks)


def _stored_parts(analysis_pk: int) -> tuple:
    """``(state, inputs, blocks)`` of Analysis ``analysis_pk`` as one statement reads them (one
    snapshot: a head never meets blocks another analysis wrote after it): ``state`` and
    ``inputs`` bytes or None, ``blocks`` ``[(attempt, block, data)]``."""
    table, blocks_table = Analysis._meta.db_table, StateBlock._meta.db_table
    sql = (f'SELECT 0, 0, 0, state FROM "{table}" WHERE id = %s UNION ALL '
           f'SELECT 1, 0, 0, inputs FROM "{table}" WHERE id = %s UNION ALL '
           f'SELECT 2, attempt, block, data FROM "{blocks_table}" WHERE analysis_id = %s')
    found: dict = {}
    blocks = []
    with connection.cursor() as cursor:
        cursor.execute(sql, [analysis_pk, analysis_pk, analysis_pk])
        for part, attempt, block, data in cursor.fetchall():
            if part == 2:
                blocks.append((attempt, block, data))
            else:
                found[part] = data
    state, inputs = found.get(0), found.get(1)
    return state, inputs, blocks


def _store_parts(analysis: Analysis, parts: tuple, replace: bool) -> None:
    """Set ``analysis.state`` to the head of ``parts`` (``Ledger.to_parts``) and write its
    blocks: upserted over the stored ones, or with ``replace`` instead of every stored one
    (a rebuilt or converted state: then ``parts`` holds every block). Inside the caller's
    transaction."""
    head, blocks = parts
    rows = [StateBlock(analysis_id=analysis.pk, attempt=attempt, block=block, data=data)
            for (attempt, block), data in sorted(blocks.items())]
    if replace:
        StateBlock.objects.filter(analysis_id=analysis.pk).delete()
        StateBlock.objects.bulk_create(rows, batch_size=200)
    elif rows:
        StateBlock.objects.bulk_create(rows, batch_size=200, update_conflicts=True,
                                       unique_fields=["analysis", "attempt", "block"],
                                       update_fields=["data"])
    analysis.state = head
    analysis.state_format = STATE_FORMAT


def store_state(run: Run, ledger: recovery.Ledger, seq: int) -> None:
    """Store ``ledger`` as the run's incremental state reflecting every row up to ingest seq
    ``seq`` (a benchmark's or a migration's write: the next analysis continues it, absorbing
    rows above ``seq``), replacing the stored one. Creates the Analysis row if needed."""
    analysis, _ = Analysis.objects.get_or_create(run=run)
    with transaction.atomic():
        _store_parts(analysis, ledger.to_parts(every=True), replace=True)
        analysis.ingest_seq = seq
        analysis.save(update_fields=["state", "state_format", "ingest_seq"])


def analyze(run: Run, now: float | None = None) -> Analysis:
    """Bring the run's stored analysis up to date and return it (see ``analyze_with_result``).

    With nothing new since the stored analysis (the run's ingest seq unchanged, no error) and
    its clock basis holding at ``now`` (``recovery.clock_driven_at``: no update settles by age
    meanwhile), only the clock-driven figures are recomputed from ``Analysis.clock_basis`` and
    merged into the stored result (:func:`_clock_only`): neither the ledger state nor the
    stored inputs are read, no generation is judged again, and what is stored equals a full
    analysis at ``now``."""
    return _analyze(run, now, outcome=False)[0]


class AnalysisFailed(Exception):
    """The core refused a run's inputs (a malformed or out-of-bounds value that validation let
    through). Stored on the Analysis row; retrying cannot help until new events arrive."""


# Errors of the core on bad input; database errors are not among them (they are transient and
# the Celery task retries them).
_INPUT_ERRORS = (ValueError, OverflowError, TypeError, KeyError, IndexError, ArithmeticError,
                 MemoryError, RecursionError)


def analyze_with_result(run: Run,
                        now: float | None = None) -> tuple[Analysis, recovery.RunAnalysis]:
    """Bring the run's stored analysis up to date; returns the row and the core's RunAnalysis
    (always a full analysis: :func:`analyze` may take the clock-only path instead).

    Incremental: the ledger state kept in ``Analysis.state`` absorbs only ledger rows whose
    ``last_seq`` and heartbeats whose ``seq`` are above the seq the state reflects
    (:func:`absorb_new`; a row that gained a piece is absorbed again; the core unites reports of
    one rank for one update). A state of a format older than ``ledger.CONTINUED_FORMAT`` is
    rebuilt from every row; one of that format or newer is continued (and written in
    ``ledger.STATE_FORMAT``). Attempts, restores and generations (with their shard reports and
    storage results) come from the copy kept in ``Analysis.inputs`` (:class:`StoredInputs`), of
    which only the rows whose ``seq`` is above the stored one are read again; with the run's ingest
    seq unchanged since the stored analysis (nothing ingested, no storage result or contract
    changed: ``runs.seq.mark_changed``) no row of the run's tables is read at all. The work runs
    outside any transaction (readers and ingest are never blocked by it); the result is written in a
    short transaction that locks the row and keeps whichever of two concurrent analyses reflects
    more events.

    Raises AnalysisFailed (after storing the error) when the core refuses the inputs.
    """
    return _analyze(run, now, outcome=True)


def _clock_only(run: Run, analysis: Analysis, target_seq: int, now: float,
                started: float) -> Analysis | None:
    """The clock-only path of :func:`analyze`: when nothing was written since the stored
    analysis (``target_seq`` is its ingest seq, it holds no error, its state is of the code's
    format) and its ``clock_basis`` holds at ``now`` (``recovery.clock_driven_at``), merge the
    clock-driven figures at ``now`` into the stored result (:func:`_merge_result`), set
    ``health``, ``computed_at`` and ``duration_s``, send ``analysis_stored``, and return the
    row. None when the path does not apply (the caller analyses in full); ``analysis`` is read
    without ``state`` and ``inputs``, and neither is read here."""
    basis, stored = analysis.clock_basis, analysis.result
    if analysis.ingest_seq != target_seq or analysis.error or target_seq <= 0 \
            or analysis.state_format < CONTINUED_FORMAT or not isinstance(stored, dict) \
            or not stored:
        return None
    timed = recovery.clock_driven_at(basis, now, settings.RECOVERYDASH_SETTLE_S)
    if timed is None:
        return None
    with transaction.atomic():
        locked = Analysis.objects.select_for_update().defer(
            "state", "result", "inputs", "clock_basis").get(pk=analysis.pk)
        if locked.ingest_seq > target_seq or (locked.ingest_seq == target_seq
                                              and locked.computed_at != analysis.computed_at):
            return locked  # a concurrent analysis stored as many events or more since: keep it
        if locked.ingest_seq != target_seq or locked.error:
            return None
        locked.run = run
        locked.result = stored
        _merge_result(locked, timed)
        locked.result = _merged(stored, timed)
        locked.health = timed["health"]
        locked.computed_at = timezone.now()
        locked.duration_s = time.monotonic() - started
        locked.save(update_fields=["health", "computed_at", "duration_s"])
        analysis_stored.send(sender=Analysis, run=run, analysis=locked,
                             now=datetime.fromtimestamp(now, tz=UTC))
    return locked


def _analyze(run: Run, now: float | None,
             outcome: bool) -> tuple[Analysis, recovery.RunAnalysis | None]:
    """:func:`analyze_with_result`, or with ``outcome`` False :func:`analyze` (the clock-only
    path allowed; the RunAnalysis is None when it was taken). In named steps: the stored
    ledger state continued (:func:`_continued_ledger`), the rows written since absorbed, the
    core run on the inputs (:func:`_core_pass`), the outcome stored (:func:`_store_pass`)."""
    started = time.monotonic()
    now = time.time() if now is None else now
    analysis, _ = Analysis.objects.defer("state", "inputs").get_or_create(run=run)
    # Read the seq first: every row stamped at or below it is committed and none will be
    # written (recoverydash.runs.seq: waits for the batches in flight on the run).
    target_seq = committed_seq(run.pk)
    if not outcome:
        done = _clock_only(run, analysis, target_seq, now, started)
        if done is not None:
            return done, None
    stored_state, stored_inputs, blocks = _stored_parts(analysis.pk)
    read_seq = analysis.ingest_seq
    ledger = _continued_ledger(run, analysis, stored_state, blocks, target_seq)
    since = analysis.ingest_seq if ledger is not None else -1
    # The attempts and generations as the last analysis read them (StoredInputs), continued
    # with the rows written since (their seq above the one the copy reflects), or all rows.
    inputs = StoredInputs.from_bytes(stored_inputs, analysis.pk) if since >= 0 else None
    inputs_since = since if inputs is not None else -1
    inputs = inputs if inputs is not None else StoredInputs(analysis.pk)
    unchanged = inputs_since >= 0 and target_seq == since and not analysis.error
    try:
        if ledger is None:
            ledger = recovery.Ledger()
        # nothing written since the stored analysis (no batch, no storage result, no contract
        # edit: each moves the run's ingest seq, runs.seq.mark_changed): no row of the run is
        # read, the core runs on the stored state and inputs
        absorbed = (0, 0)
        lowest: dict = {}  # {attempt: the lowest update absorbed}
        if not unchanged:
            absorbed = absorb_new(run, ledger, since, target_seq, lowest)
        run.refresh_from_db()
        found, inputs, inputs_since, read, judged_now = _core_pass(
            run, analysis.pk, ledger, inputs, inputs_since, unchanged, since, now, lowest)
        inputs.checked_seq = target_seq
        result = found.to_dict()
        # nothing absorbed into a continued state: the stored parts are that state already;
        # else the head and the time blocks that changed (all of them when the stored blocks
        # are no base: a rebuilt state, or one loaded from a format before 6)
        continued = since >= 0 and ledger.state_format == STATE_FORMAT
        state = None if since >= 0 and absorbed == (0, 0) else \
            ledger.to_parts(every=not continued)
    except _INPUT_ERRORS as exc:
        message = f"{type(exc).__name__}: {exc}"[:2000]
        log.warning("run %s: analysis refused the inputs at seq %s: %s", run.pk, target_seq,
                    message)
        Analysis.objects.filter(pk=analysis.pk).update(error=message, error_at=timezone.now(),
                                                       error_seq=target_seq)
        raise AnalysisFailed(message) from exc
    return _store_pass(run, _Pass(
        analysis_pk=analysis.pk, stored_result=analysis.result, target_seq=target_seq,
        read_seq=read_seq, since=since, now=now, started=started, ledger=ledger,
        continued=continued, state=state, inputs=inputs, inputs_since=inputs_since, read=read,
        judged_now=judged_now, found=found, result=result))


def _continued_ledger(run: Run, analysis: Analysis, stored_state, blocks,
                      target_seq: int) -> recovery.Ledger | None:
    """The run's stored ledger state (``stored_state`` and its time ``blocks``) loaded to be
    continued; None when there is none or it is unreadable or of a format older than
    ``CONTINUED_FORMAT`` (the caller rebuilds it from the rows). Raises AnalysisFailed (and
    stores the error) when it cannot be continued and raw rows it had absorbed were compacted:
    a rebuild from what is left would be an analysis of part of the run presented as the
    whole (docs/retention.md)."""
    ledger = None
    if stored_state:
        # The stored state is that of the last analysis that succeeded (a refused one stores
        # none), so it is continued after a refusal too.
        try:
            ledger = recovery.Ledger.from_parts(bytes(stored_state), blocks)
        except ValueError:
            log.warning("run %s: stored ledger state unreadable; rebuilding", run.pk)
        if ledger is not None and ledger.state_format < CONTINUED_FORMAT:
            log.info("run %s: ledger state of format %s, older than %s; rebuilding", run.pk,
                     ledger.state_format, CONTINUED_FORMAT)
            ledger = None
    if ledger is None and analysis.compacted_at is not None:
        message = (f"the stored ledger state cannot be continued (unreadable or of a format "
                   f"older than {CONTINUED_FORMAT}) and raw rows it had absorbed were compacted "
                   f"on {analysis.compacted_at.isoformat()}: not rebuilt from the rest "
                   f"(docs/retention.md)")
        Analysis.objects.filter(pk=analysis.pk).update(error=message, error_at=timezone.now(),
                                                       error_seq=target_seq)
        raise AnalysisFailed(message)
    return ledger


def _core_pass(run: Run, analysis_pk: int, ledger, inputs: StoredInputs, inputs_since: int,
               unchanged: bool, since: int, now: float, lowest: dict) -> tuple:
    """The core run on the run's inputs (``inputs`` continued with the rows written after
    ``inputs_since`` unless ``unchanged``) and ``ledger``, with the judgements, repeats and
    cursor checks kept from earlier analyses. When a chunk row the stored inputs name is gone
    (InputsLost), once more on every Attempt and Generation row. Returns ``(RunAnalysis,
    inputs, inputs_since, rows read, judgements kept)``, the last three as
    :meth:`StoredInputs.read_changes` and :meth:`StoredInputs.keep` give them."""
    read = 0
    for rebuilt in (False, True):
        try:
            if not unchanged:
                read = inputs.read_changes(run, inputs_since)
            run_input = inputs.run_input(run)
            judged, pks = inputs.judgements(
                run_input.effective_contract()["required_components"])
            repeats = inputs.repeats_for(pks)
            checks = inputs.cursor_checks(pks, since)
            fresh: dict = {}
            checked: dict = {}
            found = recovery.analyze(run_input, now, ledger=ledger,
                                     settle_seconds=settings.RECOVERYDASH_SETTLE_S,
                                     judged=judged, fill=fresh, repeats=repeats,
                                     checks=checks, checks_fill=checked,
                                     absorbed=lowest if checks is not None else None)
            break
        except InputsLost as exc:
            if rebuilt:
                raise
            # a chunk row the head names is gone: every Attempt and Generation row again
            log.warning("run %s: stored inputs incomplete (%s); reading every row", run.pk,
                        exc)
            inputs, inputs_since, unchanged = StoredInputs(analysis_pk), -1, False
    return found, inputs, inputs_since, read, inputs.keep(fresh, pks, checked)


@dataclass
class _Pass:
    """What one analysis pass computed, for :func:`_store_pass`: the Analysis row's pk and its
    result as read before the pass, the seqs (the committed one analysed, the row's when read,
    the one the continued state reflects, -1 for a rebuilt one), the clock (``now``, POSIX
    seconds, and ``started``, ``time.monotonic()``), the ledger and its parts to store
    (``state`` None: unchanged), the inputs and what they read and kept, and the outcome."""

    analysis_pk: int
    stored_result: AnalysisResult | None
    target_seq: int
    read_seq: int
    since: int
    now: float
    started: float
    ledger: Any
    continued: bool
    state: Any
    inputs: StoredInputs
    inputs_since: int
    read: int
    judged_now: Any
    found: Any
    result: AnalysisResult


def _store_pass(run: Run, p: _Pass) -> tuple[Analysis, recovery.RunAnalysis]:
    """Store the outcome of pass ``p`` on the locked Analysis row, unless a concurrent
    analysis stored more events since (then that row is returned): the result (only its
    clock-driven keys merged when nothing else changed), the ledger state, the inputs, the
    generations' statuses, and send ``analysis_stored`` in the transaction."""
    with transaction.atomic():
        # the row again, locked, without the state and result read above (what is compared
        # below is the result as read above: a concurrent analysis that stored one since then
        # moved ingest_seq, or analysed the same inputs)
        analysis = Analysis.objects.select_for_update().defer("state", "result", "inputs").get(
            pk=p.analysis_pk)
        if analysis.ingest_seq > p.target_seq:
            return analysis, p.found  # a concurrent analysis saw more events: keep it
        fields = ["health", "ingest_seq", "computed_at", "duration_s", "error", "error_at",
                  "error_seq", "clock_basis"]
        analysis.clock_basis = recovery.clock_basis(p.found)
        # nothing absorbed and the stored result equal but for its clock-driven figures
        # (recovery.split_clock_driven): only those are written, merged into the stored jsonb
        # (a few hundred bytes instead of the result with its generations and chart series),
        # and the generations' statuses, equal too, are not written again
        timed = _clock_driven_only(analysis, p.stored_result, p.since, p.state, p.result)
        if timed is None:
            fields.append("result")
        if p.state is not None or analysis.ingest_seq != p.since:
            # the state changed, or another analysis stored a state since this one read it
            # (its state then reflects at most target_seq: this one's is as good, stored
            # whole then)
            moved = analysis.ingest_seq != p.since
            _store_parts(analysis, p.ledger.to_parts(every=True) if moved or p.state is None
                         else p.state, replace=moved or not p.continued)
            fields += ["state", "state_format"]
        fields += _store_inputs(analysis, p)
        if timed is not None:
            _merge_result(analysis, timed)
        analysis.result = p.result
        analysis.health = p.result["health"]
        analysis.ingest_seq = p.target_seq
        analysis.computed_at = timezone.now()
        analysis.duration_s = time.monotonic() - p.started
        analysis.error, analysis.error_at, analysis.error_seq = "", None, -1
        analysis.save(update_fields=fields)
        # Receivers (the alert rules, ``alerts.evaluation.evaluate_stored``) run in this
        # transaction, under the Analysis row's lock: readers see the new ingest_seq (and
        # ``pending_analysis`` false) only together with the alerts of this analysis.
        analysis_stored.send(sender=Analysis, run=run, analysis=analysis,
                             now=datetime.fromtimestamp(p.now, tz=UTC))
    return analysis, p.found


def _store_inputs(analysis: Analysis, p: _Pass) -> list[str]:
    """Inside :func:`_store_pass`: the generations' statuses written where their rows differ,
    and the inputs stored (or dropped, when another analysis stored its own since this one
    read them); the Analysis fields to save."""
    # compared with what the rows hold (no read): a row another writer left behind the
    # result is put right even when the result itself is unchanged
    written = _store_generation_statuses(p.found.generations, p.inputs)
    inputs = p.inputs
    if analysis.ingest_seq != p.read_seq and not (inputs.replace and inputs.digests_replace):
        # another analysis stored inputs since this one read them: its chunk and digest
        # rows are not this copy's base; the next analysis reads every row again
        analysis.inputs = None
        drop_inputs(analysis.pk)
        return ["inputs"]
    if p.read or written or p.judged_now or p.inputs_since < 0 or inputs.touched:
        inputs.store(analysis.pk)
        analysis.inputs = inputs.to_bytes()
        return ["inputs"]
    return []


def analyze_queued(run_pk: int) -> Analysis | None:
    """The queued analysis of run ``run_pk``: clear its queue mark (events arriving from now on
    enqueue the next analysis), then analyse. None when the run no longer exists or the core
    refused its inputs (stored on the row and shown; not retried until new events arrive)."""
    Run.objects.filter(pk=run_pk).update(analysis_queued_at=None)
    run = Run.objects.filter(pk=run_pk).first()
    if run is None:
        return None
    try:
        return analyze(run)
    except AnalysisFailed:
        return None


def request_analysis(run_pk: int, force: bool = False) -> bool:
    """Enqueue one debounced analysis of a run; returns True when a task was sent.

    A conditional UPDATE marks the run queued unless it already was within the last minute, so
    a burst of batches enqueues one task (delayed by ``RECOVERYDASH_ANALYSIS_DEBOUNCE_S``).
    ``force`` enqueues even when one is queued (after storage verification). If the broker is
    down the mark is cleared again, and ``sweep`` retries later.
    """
    now = timezone.now()
    stale = now - timedelta(seconds=60)
    if force:
        Run.objects.filter(pk=run_pk).update(analysis_queued_at=now)
    else:
        marked = (Run.objects.filter(pk=run_pk)
                  .filter(Q(analysis_queued_at__isnull=True) | Q(analysis_queued_at__lt=stale))
                  .update(analysis_queued_at=now))
        if not marked:
            return False
    sent = enqueue(ANALYZE_RUN, run_pk,
                   countdown=0.0 if force else settings.RECOVERYDASH_ANALYSIS_DEBOUNCE_S)
    if not sent:
        Run.objects.filter(pk=run_pk).update(analysis_queued_at=None)
    return sent


def sweep(limit: int = 500) -> int:
    """Enqueue analysis for runs whose analysis is behind their events (events ingested while
    the broker was down, or an analysis that failed); returns how many were enqueued."""
    behind = (Run.objects.filter(Q(analysis__isnull=True) |
                                 Q(analysis__ingest_seq__lt=F("ingest_seq")))
              .filter(ingest_seq__gt=0)
              .exclude(analysis__error_seq__gte=F("ingest_seq"))  # failed: wait for new events
              .values_list("pk", flat=True)[:limit])
    return sum(1 for pk in behind if request_analysis(pk))


def plan_restore(run: Run, world_size: int | None = None, dataset_version: str | None = None,
                 config_digest: str | None = None) -> recovery.RestorePlan:
    """docs/ingest-v1.md#restore-plan: analyse the run up to its newest events, then choose.

    A restarting trainer asks this once; it must see every generation committed so far, so the
    analysis is brought up to date synchronously rather than read from the stored result.

    Raises AnalysisFailed when the core refuses the run's inputs."""
    _, outcome = analyze_with_result(run)
    return recovery.restore_plan(outcome, world_size=world_size, dataset_version=dataset_version,
                                 config_digest=config_digest)
