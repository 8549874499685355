"""The one writer of ingest: :func:`ingest_batch` stores a validated batch and projects it into
the typed tables, in one transaction (docs/ingest-v1.md#answers: "a batch is atomic").

Order of work inside the transaction, per batch:

1. read (create on first sight) every run the batch names, in the token's own project only;
   take the batch's seq (:func:`recoverydash.runs.seq.take_seq`: a shared advisory lock per
   run, then one ``nextval``; SQLite: the run's count of batches plus one). A batch holding a
   generation event also locks its runs' rows now;
2. drop repeats of an ``event_id`` within the batch (same content: duplicate; else 409);
3. write the events, stamped with the seq. PostgreSQL: ``COPY`` them all inside a savepoint,
   optimistically; if the unique ``(run, event_id)`` index says some are stored already (or a
   concurrent batch is storing them: the index waits for its commit), roll the savepoint back,
   read the stored content hashes in one query (same hash: duplicate, counted and not stored;
   another: 409 naming the index) and COPY the rest. Elsewhere: that query first, then
   ``bulk_create``;
4. check that each stratum keeps one span kind (ranges or ids) within the batch and against the
   run's record;
5. project them into ledger rows (PostgreSQL: ``COPY``, with the same optimistic savepoint;
   stored keys are united under their row lock), heartbeats, audit windows, generations, shard
   reports, checkpoint objects, all stamped with the seq;
6. last, under each run's row lock (a few statements before commit): the span kinds again
   against the run's record, the attempts, the run's counters, contract and ``ingest_seq``.
   A batch of updates, heartbeats and audit windows only (:data:`_HOT_TYPES`: the SDK's
   requests) does this in raw statements on PostgreSQL (:func:`_finish_hot`): one ``UPDATE
   ... RETURNING`` per run (the lock, the counters, the strata), the batch's attempts read
   ``FOR UPDATE`` and written back in one statement each way, the reporters in one;
7. after commit, hand the touched runs and newly committed generations to
   :func:`after_ingest`, which enqueues their verification and analysis and never fails the
   request; a run whose analysis is queued and not started (its mark, read under the row lock
   in step 6, younger than :data:`QUEUED_MARK_FRESH_S`) is left out: that analysis reads this
   batch (one UPDATE per request fewer).

Concurrent batches into one run therefore overlap in everything but step 6; the analysis reads
rows by seq up to :func:`recoverydash.runs.seq.committed_seq`, which never passes a batch in
flight.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from recoverydash.recovery.inputs import manifest_identity
from recoverydash.runs import seq as seq_of
from recoverydash.runs.analysis import request_analysis
from recoverydash.runs.folding import fold, foldable, join, unfold
from recoverydash.runs.models import (
    GLOBAL_RANK,
    ApiToken,
    Attempt,
    AuditWindow,
    CheckpointObject,
    DrillResult,
    Event,
    Generation,
    Heartbeat,
    LedgerRow,
    Project,
    RankSeen,
    Run,
    ShardReport,
    reporter_key,
)
from recoverydash.runs.queue import VERIFY_GENERATION, enqueue

from .errors import MAX_ERRORS, AttemptConflict, BadRequest, Conflict, ErrorItem
from .schemas import ValidEvent, canonical_json, json_text, manifest_committed_at, validate_events

log = logging.getLogger(__name__)


@dataclass
class IngestResult:
    """What a batch did: ``accepted`` new events, ``duplicates`` (already stored or repeated in
    the batch with the same content), the pks of runs that gained events and of generations whose
    manifest arrived or conflicted (both handed to the workers after commit)."""

    accepted: int = 0
    duplicates: int = 0
    run_pks: list[int] = field(default_factory=list)
    generation_pks: list[int] = field(default_factory=list)

    def as_response(self) -> dict[str, int]:
        """The 202 body (docs/ingest-v1.md#answers)."""
        return {"accepted": self.accepted, "duplicates": self.duplicates}


def ingest_batch(token: ApiToken | Project, events: Sequence[ValidEvent | dict], *,
                 adopted: bool = False) -> IngestResult:
    """Store ``events`` for the token's project atomically and idempotently (docs/ingest-v1.md,
    sections 1-4).

    ``token``: the authenticated :class:`ApiToken` (its project receives the events; a project
    may be passed directly by internal callers). ``events``: the output of
    :func:`~recoverydash.ingest.schemas.validate_events`, or raw wire dicts that are validated
    here. Raises :class:`~recoverydash.ingest.errors.BadRequest` (invalid events, a stratum
    changing its span kind) or :class:`~recoverydash.ingest.errors.Conflict` (409: an
    ``event_id`` with different content); nothing is stored then.

    Batches into one run run concurrently (PostgreSQL): rows are stamped with the batch's seq
    (:mod:`recoverydash.runs.seq`), and only the last step (span kinds, attempts, the run's
    counters) holds the run's row lock, for a few statements. A batch holding a generation event
    (checkpoint_started, shard_written, checkpoint_committed) holds the run's row lock
    throughout, as those share rows across ranks. A deadlock between batches (PostgreSQL
    detects it and aborts one) is retried up to :data:`RETRIES` times.

    ``adopted``: the events come from the server's adoption of another tool's folder
    (:mod:`recoverydash.ingest.adoption`), the only source whose manifests may carry the
    ``adopted`` field; from anywhere else (a trainer's token, a manifest a trainer wrote to
    storage) such a manifest is a 400: its self-declared reasons would replace the shard and
    component rules (docs/ingest-v1.md#adopted).
    """
    project = token.project if isinstance(token, ApiToken) else token
    if events and isinstance(events[0], dict):
        events = validate_events(list(events))
    if not adopted:
        _refuse_adopted(events)
    if not events:
        return IngestResult()
    for attempt in range(RETRIES):
        try:
            return _ingest_once(project, events)
        except Exception as exc:  # noqa: BLE001 - only deadlocks are retried
            if attempt + 1 >= RETRIES or not _is_deadlock(exc):
                raise
            log.warning("ingest: deadlock between batches, retrying (%s)", exc)
    raise AssertionError("unreachable")


def _refuse_adopted(events: Sequence[ValidEvent]) -> None:
    """BadRequest naming every event whose manifest carries ``adopted``."""
    items = [ErrorItem(ev.index, f"events[{ev.index}].manifest.adopted",
                       "expected no adopted field: only the server's own adoption of another "
                       "tool's checkpoint folder sets it (docs/ingest-v1.md#adopted); a trainer's "
                       "manifest is judged by the shard and component rules")
             for ev in events if ev.manifest is not None and ev.manifest.adopted is not None]
    if items:
        raise BadRequest("invalid events", items[:MAX_ERRORS])


#: How many times a batch aborted by a deadlock is tried.
RETRIES = 4
#: Event types that write rows other batches of the run share (generations, shard reports,
#: objects, drill results): a batch holding one locks its runs for its whole transaction.
_SHARED_ROW_TYPES = frozenset({"checkpoint_started", "shard_written", "checkpoint_committed",
                               "drill_result"})
_GENERATION_TYPES = frozenset({"checkpoint_started", "shard_written", "checkpoint_committed"})


def _is_deadlock(exc: BaseException | None) -> bool:
    """True when ``exc`` (or what caused it) is PostgreSQL's deadlock_detected (40P01)."""
    seen = 0
    while exc is not None and seen < 5:
        if getattr(exc, "sqlstate", None) == "40P01":
            return True
        exc, seen = exc.__cause__, seen + 1
    return False


def _ingest_once(project: Project, events: Sequence[ValidEvent]) -> IngestResult:
    """One try of :func:`ingest_batch` (one transaction)."""
    result = IngestResult()
    concurrent = seq_of.concurrent()
    with transaction.atomic():
        runs = _get_runs(project, {ev.model.run_id for ev in events})
        locking = not concurrent or any(ev.model.type in _SHARED_ROW_TYPES for ev in events)
        saved = False
        if concurrent:
            # The shared advisory locks first, then the seq (recoverydash.runs.seq), and only
            # then any row lock, so a waiting analysis never sits inside a lock cycle. With no
            # row lock to take before the events, their savepoint comes in the seq's round trip.
            seq = seq_of.take_seq((r.pk for r in runs.values()),
                                  then=None if locking else _EVENTS_SAVEPOINT)
            seqs = {r.pk: seq for r in runs.values()}
            saved = not locking
        if locking:
            runs = _lock_runs(runs)
        if not concurrent:  # SQLite: one writer at a time; the run's own count of batches
            seqs = {r.pk: r.ingest_seq + 1 for r in runs.values()}
        unique = _unique_in_batch(runs, events, result)
        now = timezone.now()
        fresh = _insert_new_events(runs, seqs, unique, now, result, saved)
        kinds = _span_kinds(runs, fresh)
        projection = _Projection(runs, seqs, now)
        for ev in fresh:
            projection.add(ev)
        projection.flush()
        touched = {ev.model.run_id for ev in fresh}
        queued = _finish_runs(runs, seqs, fresh, touched, kinds, now, projection)
        result.accepted = len(fresh)
        result.run_pks = sorted(runs[r].pk for r in touched)
        result.generation_pks = sorted(projection.committed_generation_pks)
        # A run whose analysis is queued (seen under its row lock) needs no request: that
        # analysis clears the mark only after this commit, then reads this batch.
        run_pks = [pk for pk in result.run_pks if pk not in queued]
        generation_pks = list(result.generation_pks)
        if run_pks or generation_pks:
            transaction.on_commit(lambda: _after_commit(run_pks, generation_pks))
    return result


def _after_commit(run_pks: list[int], generation_pks: list[int]) -> None:
    """Enqueue the workers' follow-up; a failure is logged, never raised (events are stored)."""
    try:
        after_ingest(run_pks, generation_pks)
    except Exception:  # noqa: BLE001 - the batch is committed; the periodic sweep catches up
        log.exception("after_ingest failed for runs %s", run_pks)


def after_ingest(run_pks: list[int], committed_generation_pks: list[int]) -> None:
    """Enqueue verification of ``committed_generation_pks`` (whose manifests just arrived) and a
    debounced analysis of each run in ``run_pks`` (database pks).

    Called from ``transaction.on_commit`` so a task never sees uncommitted rows. A broker that is
    down must not fail an ingest whose events are already stored: ``enqueue`` logs and answers
    False, and the periodic sweep (``workers.tasks.sweep_runs``) and storage re-check pick that
    work up later."""
    for pk in committed_generation_pks:
        enqueue(VERIFY_GENERATION, pk)
    for pk in run_pks:
        request_analysis(pk)


def _get_runs(project: Project, run_ids: set[str]) -> dict[str, Run]:
    """The batch's runs of ``project`` (created if new), not locked."""
    wanted = sorted(run_ids)
    runs = _read_runs(project, wanted)
    missing = [r for r in wanted if r not in runs]
    if missing:
        # ignore_conflicts: a concurrent batch may create the same run; its insert waits for
        # that batch's commit, and the read below then sees the run.
        Run.objects.bulk_create([Run(project=project, run_id=r) for r in missing],
                                ignore_conflicts=True)
        runs.update(_read_runs(project, missing))
    return runs


#: The Run columns ingest reads before the end (:func:`_read_runs`); the rest stay deferred.
_RUN_FIELDS = ("id", "project_id", "run_id", "ingest_seq", "strata", "drill_id", "is_drill")


def _read_runs(project: Project, run_ids: list[str]) -> dict[str, Run]:
    """``{run_id: Run}`` of the stored runs among ``run_ids`` of ``project``, not locked. On
    PostgreSQL one raw statement of :data:`_RUN_FIELDS` (the ORM's query building was a
    measurable part of a small request), the instances made by ``Run.from_db`` so that any
    other field is deferred (read from the database if something asks), never a default."""
    if connection.vendor != "postgresql":
        return {r.run_id: r for r in Run.objects.filter(project=project, run_id__in=run_ids)}
    columns = ", ".join(f'"{name}"' for name in _RUN_FIELDS).replace('"strata"',
                                                                     '"strata"::text')
    with connection.cursor() as cursor:
        cursor.execute(f'SELECT {columns} FROM "{Run._meta.db_table}" WHERE project_id = %s '
                       'AND run_id = ANY(%s::text[])', [project.pk, list(run_ids)])
        rows = cursor.fetchall()
    out = {}
    for row in rows:
        values = dict(zip(_RUN_FIELDS, row))
        values["strata"] = json.loads(values["strata"])
        run = _from_db(Run, values)
        out[run.run_id] = run
    return out


def _from_db(model, values: dict[str, Any]):
    """An instance of ``model`` as the ORM makes it from a row (``Model.from_db``) holding only
    ``values`` (``{attname: value}``, values as the ORM would give them): every other field is
    deferred, so reading one queries the database instead of answering a default."""
    names = [f.attname for f in model._meta.concrete_fields if f.attname in values]
    return model.from_db(connection.alias, names, [values[name] for name in names])


def _lock_runs(runs: dict[str, Run]) -> dict[str, Run]:
    """The same runs read again and locked FOR UPDATE (until commit), in pk order."""
    return {r.run_id: r for r in Run.objects.select_for_update()
            .filter(pk__in=[r.pk for r in runs.values()]).order_by("pk")}


def _unique_in_batch(runs: dict[str, Run], events: Sequence[ValidEvent],
                     result: IngestResult) -> list[ValidEvent]:
    """The batch without repeats of an ``event_id`` (counted as duplicates in ``result``);
    raises Conflict (409) for a repeat with other content."""
    seen: dict[tuple[int, str], ValidEvent] = {}
    unique: list[ValidEvent] = []
    pk_of = {run_id: run.pk for run_id, run in runs.items()}
    for ev in events:
        key = (pk_of[ev.model.run_id], ev.model.event_id)
        first = seen.get(key)
        if first is None:
            seen[key] = ev
            unique.append(ev)
        elif first.content_hash != ev.content_hash:
            raise Conflict(ev.index, f"event_id {ev.model.event_id!r} of run "
                           f"{ev.model.run_id!r} appears at index {first.index} and at index "
                           f"{ev.index} with different content; expected one content per "
                           "event_id")
        else:
            result.duplicates += 1
    return unique


def _drop_stored(runs: dict[str, Run], events: Sequence[ValidEvent],
                 result: IngestResult) -> list[ValidEvent]:
    """Events not yet stored (one query). Counts duplicates into ``result``; raises Conflict
    (409) for an ``event_id`` already stored with another content hash."""
    stored: dict[tuple[int, str], str] = {}
    ids = {ev.model.event_id for ev in events}
    for run_pk, event_id, content_hash in (
            Event.objects.filter(run__in=[r.pk for r in runs.values()], event_id__in=ids)
            .values_list("run_id", "event_id", "content_hash")):
        stored[(run_pk, event_id)] = content_hash
    fresh: list[ValidEvent] = []
    for ev in events:
        known = stored.get((runs[ev.model.run_id].pk, ev.model.event_id))
        if known is None:
            fresh.append(ev)
        elif known != ev.content_hash:
            raise Conflict(ev.index, f"event_id {ev.model.event_id!r} is already stored for "
                           f"run {ev.model.run_id!r} with different content (index "
                           f"{ev.index}); expected the same content or a new event_id")
        else:
            result.duplicates += 1
    return fresh


#: The savepoint before the events' COPY (:func:`_insert_new_events`) and the ledger rows'
#: (:meth:`_Projection._flush_ledger`): raw statements, never released (each holds until
#: commit; a release was a round trip per request), rolled back to when the COPY meets a
#: stored key.
_EVENTS_SAVEPOINT = "SAVEPOINT rd_ingest_events"
_LEDGER_SAVEPOINT = "SAVEPOINT rd_ingest_ledger"


def _rollback_to(savepoint: str) -> None:
    """``ROLLBACK TO`` the savepoint of the ``SAVEPOINT`` statement ``savepoint`` (the
    transaction usable again, the savepoint kept)."""
    with connection.cursor() as cursor:
        cursor.execute(savepoint.replace("SAVEPOINT", "ROLLBACK TO SAVEPOINT", 1))


def _insert_new_events(runs: dict[str, Run], seqs: dict[int, int], events: Sequence[ValidEvent],
                       now, result: IngestResult, saved: bool = False) -> list[ValidEvent]:
    """Append the events not yet stored and return them (duplicates counted into ``result``;
    Conflict for a stored ``event_id`` of other content).

    PostgreSQL: COPY them all after a savepoint (:data:`_EVENTS_SAVEPOINT`; ``saved``: taken
    already, in the seq's round trip), optimistically; if the unique ``(run, event_id)`` index
    says some are stored already (by an earlier batch, or by a concurrent one that has just
    committed: the index makes this batch wait for it), roll back to the savepoint, drop the
    stored ones (one query) and COPY the rest, until one COPY goes through. Elsewhere: that
    query first, then ``bulk_create``."""
    if connection.vendor != "postgresql":
        fresh = _drop_stored(runs, events, result)
        _write_events(runs, seqs, fresh, now)
        return fresh
    from psycopg.errors import UniqueViolation

    if not saved:
        with connection.cursor() as cursor:
            cursor.execute(_EVENTS_SAVEPOINT)
    pending = list(events)
    while pending:
        try:
            _write_events(runs, seqs, pending, now)
            return pending
        except UniqueViolation:
            _rollback_to(_EVENTS_SAVEPOINT)
            pending = _drop_stored(runs, pending, result)
    return pending


def _span_kinds(runs: dict[str, Run], events: Iterable[ValidEvent]) -> dict[str, dict[str, str]]:
    """Per run id, the span kind (ranges or ids) of each stratum the batch's spans use. Raises
    BadRequest (as :func:`_check_span_kinds`) when the batch itself mixes kinds in a stratum or
    contradicts the run's record as read at the start; the record is checked again under the
    run's lock at the end (:func:`_finish_runs`)."""
    kinds: dict[str, dict[str, str]] = {}
    mixed = False
    for ev in events:
        m = ev.model
        if m.type == "update_committed":
            groups = (m.spans,)
        elif m.type == "update_aggregate":
            groups = [part.spans for part in m.ranks]
        else:
            continue
        mine = kinds.get(m.run_id)
        if mine is None:
            mine = kinds[m.run_id] = {}
        for spans in groups:  # the spans of _spans_of, without their wire paths
            for span in spans:
                kind = span.kind
                if mine.setdefault(span.stratum, kind) != kind:
                    mixed = True
    if mixed or any(runs[r].strata.get(s, k) != k for r, ks in kinds.items()
                    for s, k in ks.items()):
        _check_span_kinds({r: Run(strata=dict(run.strata)) for r, run in runs.items()}, events)
    return kinds


def _check_span_kinds(runs: dict[str, Run], events: Iterable[ValidEvent]) -> None:
    """docs/ingest-v1.md#3-positions-spans-and-cursors: a stratum uses one kind (ranges or ids)
    throughout a run. Records first use in ``Run.strata``; raises BadRequest naming each span that
    breaks the rule."""
    items: list[ErrorItem] = []
    for ev in events:
        if ev.model.type not in _LEDGER_TYPES:
            continue
        strata = runs[ev.model.run_id].strata
        for where, span in _spans_of(ev):
            kind = span.kind
            known = strata.setdefault(span.stratum, kind)
            if known != kind:
                items.append(ErrorItem(ev.index, f"events[{ev.index}].{where}.{kind}",
                                       f"expected {known} for stratum {span.stratum!r}, which "
                                       f"uses {known} in run {ev.model.run_id!r}, got {kind}"))
                if len(items) >= MAX_ERRORS:
                    break
    if items:
        raise BadRequest("spans of one stratum mix ranges and ids", items)


#: Event types that bring ledger rows: a rank's own report, or several ranks' in one event.
_LEDGER_TYPES = frozenset({"update_committed", "update_aggregate"})


def _spans_of(ev: ValidEvent) -> Iterable[tuple[str, Any]]:
    """``(wire path, span)`` of every span of a ledger event (``spans[j]`` or
    ``ranks[k].spans[j]``)."""
    m = ev.model
    if m.type == "update_aggregate":
        for k, part in enumerate(m.ranks):
            for j, span in enumerate(part.spans):
                yield f"ranks[{k}].spans[{j}]", span
    else:
        for j, span in enumerate(m.spans):
            yield f"spans[{j}]", span


#: Fields of a ledger event's body that its Event row does not store: its own columns
#: (event_id, type, attempt, rank, time; run_id is the run) and what its ledger rows hold.
_HELD_ELSEWHERE = frozenset({"event_id", "type", "run_id", "attempt", "rank", "time", "spans",
                             "samples", "tokens"})
#: Fields of an update_aggregate part its ledger rows hold (its rank too, once nothing else of
#: the part is left).
_PART_HELD = frozenset({"rank", "spans", "samples", "tokens"})


def stored_body(kind: str, body: dict) -> dict:
    """The body an Event row stores for an accepted event of type ``kind`` with wire body
    ``body`` (docs/ingest-v1.md#stored-events). Every type but the ledger types: ``body`` itself,
    as received. ``update_committed`` and ``update_aggregate``: only what the ledger rows do not
    hold, ``update`` (which readers select on), ``ids_digest`` and every other field, known or
    not (an aggregate's ``ranks`` then list the parts that keep a field besides ``rank``, and
    are left out when none does); ``spans``, ``samples`` and ``tokens`` are the ledger rows',
    the rest the row's columns. The event's ``content_hash`` is of the whole body, so a re-sent
    event is told from a conflicting one as before."""
    if kind not in _LEDGER_TYPES:
        return body
    out = {k: v for k, v in body.items() if k not in _HELD_ELSEWHERE}
    if kind == "update_aggregate":
        parts = [part for part in body.get("ranks") or []
                 if isinstance(part, dict) and set(part) - _PART_HELD]
        kept = [{k: v for k, v in part.items() if k not in _PART_HELD - {"rank"}}
                for part in parts]
        out.pop("ranks", None)
        if kept:
            out["ranks"] = kept
    return out


#: The fields of an update_committed body whose stored body is ``{"update": ...}`` alone.
_PLAIN_COMMITTED = _HELD_ELSEWHERE | {"update"}


def _stored_text(ev: ValidEvent) -> str:
    """The JSON text of :func:`stored_body` for the jsonb column (the canonical text as received
    for every type but the ledger types). An update_committed of the wire's fields only (the
    SDK's) is ``{"update":N}``, spelled here as ``json_text`` spells it."""
    kind = ev.model.type
    if kind not in _LEDGER_TYPES:
        return ev.canonical
    body = ev.body
    if kind == "update_committed" and body.keys() <= _PLAIN_COMMITTED:
        update = body.get("update")
        if type(update) is int:
            return f'{{"update":{update}}}'
    return json_text(stored_body(kind, body))  # a jsonb value: any spelling


#: The event columns, in the order :func:`_write_events` gives them.
_EVENT_COLUMNS = ("run_id", "event_id", "type", "attempt", "rank", "time", "received_at",
                  "batch_seq", "content_hash", "body")


def _write_events(runs: dict[str, Run], seqs: dict[int, int], events: Sequence[ValidEvent],
                 now) -> None:
    """COPY (PostgreSQL) or INSERT the events, stamped with their run's seq, each with its
    :func:`stored_body`. PostgreSQL: the COPY text spelled line by line here (the columns'
    types are known: :func:`_copy_text`'s rules without its dispatch per value)."""
    if not events:
        return
    if connection.vendor == "postgresql":
        pk_of = {run_id: run.pk for run_id, run in runs.items()}
        times: dict[Any, str] = {}
        received = _time_text(now)
        lines = []
        for ev in events:
            m = ev.model
            pk = pk_of[m.run_id]
            when = times.get(m.time)
            if when is None:
                when = times[m.time] = _time_text(m.time)
            # the type is one of the wire's type names (validated): nothing to escape
            lines.append(f"{pk}\t{_escape(m.event_id)}\t{m.type}\t{m.attempt}\t"
                         f"{_NULL if m.rank is None else m.rank}\t{when}\t{received}\t"
                         f"{seqs[pk]}\t{ev.content_hash}\t{_escape(_stored_text(ev))}")
        lines.append("")
        _copy_lines(Event._meta.db_table, _EVENT_COLUMNS, "\n".join(lines))
        return
    Event.objects.bulk_create(
        [Event(run_id=runs[ev.model.run_id].pk, event_id=ev.model.event_id, type=ev.model.type,
               attempt=ev.model.attempt, rank=ev.model.rank, time=ev.model.time,
               received_at=now, batch_seq=seqs[runs[ev.model.run_id].pk],
               content_hash=ev.content_hash, body=stored_body(ev.model.type, ev.body))
         for ev in events], batch_size=500)


def _copy(table: str, columns: Sequence[str], rows: Iterable[tuple]) -> None:
    """psycopg 3 ``COPY ... FROM STDIN`` of ``rows`` (jsonb columns take JSON text), the text
    format spelled by :func:`_copy_text` (about half psycopg's ``write_row`` CPU per row)."""
    _copy_lines(table, columns, _copy_text(rows))


def _copy_lines(table: str, columns: Sequence[str], text: str) -> None:
    """``COPY table (columns) FROM STDIN`` of ``text`` (COPY's text format, every line ended by
    a newline), sent in one ``write``."""
    sql = f'COPY "{table}" ({", ".join(columns)}) FROM STDIN'
    with connection.cursor() as cursor:
        with cursor.cursor.copy(sql) as copy:
            copy.write(text)


#: COPY text's null.
_NULL = "\\N"


def _escape(text: str) -> str:
    """``text`` as a COPY text field: backslash, tab, newline and carriage return escaped (JSON
    text included: its own escapes' backslashes are doubled)."""
    if "\\" in text or "\t" in text or "\n" in text or "\r" in text:
        return (text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
                .replace("\r", "\\r"))
    return text


def _time_text(value: datetime) -> str:
    """A datetime as COPY text: ISO 8601, with its offset when aware (as psycopg sends it)."""
    return value.isoformat()


def _copy_text(rows: Iterable[tuple]) -> str:
    """``rows`` in PostgreSQL's COPY text format: a line per row, fields by tab; ``None`` is
    ``\\N``; an int, a float or a bool as its literal; a str (JSON text too) by
    :func:`_escape`; a datetime by :func:`_time_text`. Raises TypeError for any other value."""
    times: dict[Any, str] = {}
    lines = []
    for row in rows:
        fields = []
        for value in row:
            kind = type(value)
            if kind is int:
                fields.append(str(value))
            elif kind is str:
                fields.append(_escape(value))
            elif value is None:
                fields.append(_NULL)
            elif kind is datetime or isinstance(value, datetime):
                text = times.get(value)
                if text is None:
                    text = times[value] = _time_text(value)
                fields.append(text)
            elif kind is bool:
                fields.append("t" if value else "f")
            elif kind is float:
                fields.append(repr(value))
            else:
                raise TypeError(f"no COPY text for {kind.__name__} {value!r}")
        lines.append("\t".join(fields))
    lines.append("")
    return "\n".join(lines)


_HEARTBEAT_COLUMNS = ("run_id", "attempt", "rank", "time", "update", "fetched", "seq")
_LEDGER_COLUMNS = ("run_id", "attempt", "update", "rank", "ranks", "rank_shift", "time", "spans",
                   "samples", "tokens", "first_seq", "last_seq")


class _Projection:
    """Projects new events into the typed tables, batching writes: :meth:`flush` writes the rows
    of the batch's own (ledger rows, heartbeats, audit windows, generations), and
    :meth:`apply_attempts`, called under the run's lock at the end, the attempts' changes."""

    def __init__(self, runs: dict[str, Run], seqs: dict[int, int], now=None):
        self.runs = runs
        self.seqs = seqs
        self.now = now
        #: (run pk, attempt) whose first attempt_started is in this batch (another rank's later
        #: copy of it does not count: it must not undo a contract edited meanwhile)
        self.first_started: set[tuple[int, int]] = set()
        self.drill_marks: dict[int, str] = {}
        self.drill_results: list[ValidEvent] = []
        self.by_pk = {r.pk: r for r in runs.values()}
        self.pk_of = {run_id: r.pk for run_id, r in runs.items()}
        # Events per (run pk, attempt), applied to the attempt rows under the run lock.
        self.attempt_events: dict[tuple[int, int], list[ValidEvent]] = {}
        #: the batch's ledger parts: ``{(run pk, attempt, update): {rank: entry}}``
        self.ledger: dict[tuple[int, int, int], dict[int, dict[str, Any]]] = {}
        self.heartbeats: list[Heartbeat] = []
        self.audit: list[AuditWindow] = []
        self.generation_events: list[ValidEvent] = []
        self.committed_generation_pks: set[int] = set()

    def add(self, ev: ValidEvent) -> None:
        m, body = ev.model, ev.body
        pk = self.pk_of[m.run_id]
        events = self.attempt_events.get((pk, m.attempt))
        if events is None:
            events = self.attempt_events[(pk, m.attempt)] = []
        events.append(ev)
        kind = m.type
        if kind == "update_committed":
            self._ledger_part(pk, m, GLOBAL_RANK if m.rank is None else m.rank, body["spans"],
                              m.samples, m.tokens)
            return
        if kind == "update_aggregate":
            # each rank's part exactly as that rank's own update_committed
            for part, raw in zip(m.ranks, body["ranks"]):
                self._ledger_part(pk, m, part.rank, raw["spans"], part.samples, part.tokens)
            return
        run = self.runs[m.run_id]
        if kind == "heartbeat":
            self.heartbeats.append(Heartbeat(run=run, attempt=m.attempt, rank=m.rank, time=m.time,
                                             update=m.update, fetched=body.get("fetched") or [],
                                             seq=self.seqs[run.pk]))
        elif kind == "audit_window":
            self.audit.append(AuditWindow(run=run, attempt=m.attempt, update=m.update,
                                          rank=m.rank, accum_slot=m.accum_slot,
                                          sample_ids=body["sample_ids"], time=m.time))
        elif kind == "attempt_started":
            if m.drill is not None:
                self.drill_marks[run.pk] = m.drill.drill_id
        elif kind == "drill_result":
            self.drill_marks[run.pk] = m.drill_id
            self.drill_results.append(ev)
        elif kind in _GENERATION_TYPES:
            self.generation_events.append(ev)

    def _ledger_part(self, run_pk: int, m: Any, rank: int, spans: list[dict],
                     samples: int | None, tokens: int | None) -> None:
        """One rank's report for ``m.update`` (of run ``run_pk``): a new ledger key, or united
        into the batch's."""
        group = (run_pk, m.attempt, m.update)
        parts = self.ledger.get(group)
        if parts is None:
            parts = self.ledger[group] = {}
        entry = parts.get(rank)
        if entry is None:
            parts[rank] = {"time": m.time, "spans": list(spans), "samples": samples,
                           "tokens": tokens}
            return
        _unite_entry(entry, {"spans": spans, "samples": samples, "tokens": tokens,
                             "time": m.time})

    def apply_attempts(self, attempts: dict[tuple[int, int], Attempt], hot: bool = False) -> None:
        """Apply the batch's events to ``attempts`` (every attempt row of the batch's runs, read
        under the run lock; missing ones are created here) in batch order, write the rows
        that changed, and note the reporters the batch heard from (``RankSeen.note``: one
        statement, a row per reporter of the batch). Raises AttemptConflict for an attempt_started
        contradicting the stored start. ``hot``: the batch holds only :data:`_HOT_TYPES`, and
        the attempts that existed are written by one statement of :data:`_HOT_ATTEMPT_FIELDS`
        (:func:`_save_hot_attempts`), not by the ORM's save of every column."""
        new, seen_by_key = self._apply_events(attempts)
        if new:
            Attempt.objects.bulk_create(new)
        created = {id(att) for att in new}
        changed = [attempts[key] for key in self.attempt_events
                   if id(attempts[key]) not in created]
        if hot:
            _save_hot_attempts(changed)
        else:
            for att in changed:
                att.save()
        # the batch's reporters only: a row each (RankSeen.note), never the attempt's world
        RankSeen.note({attempts[key].pk: [reporter_key(r) for r in ranks]
                       for key, ranks in seen_by_key.items() if ranks}, self.now)

    def _apply_events(self, attempts: dict[tuple[int, int], Attempt]) -> \
            tuple[list[Attempt], dict[tuple[int, int], set[int | None]]]:
        """Apply the batch's events to ``attempts`` in batch order (missing attempts are made
        here, not saved); returns (the attempts made, the reporters heard from per attempt)."""
        new: list[Attempt] = []
        seen_by_key: dict[tuple[int, int], set[int | None]] = {}
        for key, evs in self.attempt_events.items():
            att = attempts.get(key)
            if att is None:  # created lazily: events may come before attempt_started
                att = attempts[key] = Attempt(run=self.by_pk[key[0]], attempt=key[1])
                new.append(att)
            att.seq = self.seqs[key[0]]  # read again by the next analysis (Attempt.seq)
            seen = seen_by_key.setdefault(key, set())
            for ev in evs:
                if self.now is not None:
                    # an aggregate's ranks were heard from through their reporter
                    seen.add(ev.model.rank)
                    if ev.model.type == "update_aggregate":
                        seen.update(p.rank for p in ev.model.ranks)
                if ev.model.type == "attempt_started" and att.started_at is None:
                    self.first_started.add(key)
                _apply_to_attempt(att, ev)
        return new, seen_by_key

    # --- writing ------------------------------------------------------------------------------
    def flush(self) -> None:
        self._flush_ledger()
        if self.heartbeats:
            if connection.vendor == "postgresql":
                _copy(Heartbeat._meta.db_table, _HEARTBEAT_COLUMNS,
                      ((h.run_id, h.attempt, h.rank, h.time, h.update, json_text(h.fetched),
                        h.seq) for h in self.heartbeats))
            else:
                Heartbeat.objects.bulk_create(self.heartbeats, batch_size=500)
        if self.audit:
            AuditWindow.objects.bulk_create(self.audit, batch_size=500)
        for ev in self.generation_events:
            self._project_generation(ev)
        for pk, drill_id in self.drill_marks.items():
            run = self.by_pk[pk]
            if run.drill_id != drill_id or not run.is_drill:
                run.drill_id, run.is_drill = drill_id, True
                Run.objects.filter(pk=pk).update(drill_id=drill_id, is_drill=True)
        for ev in self.drill_results:
            self._project_drill_result(ev)

    def _project_drill_result(self, ev: ValidEvent) -> None:
        """``drill_result`` -> DrillResult (the latest report of a run, drill and crash point
        wins: a later event time, or the same time re-sent)."""
        m, body = ev.model, ev.body
        run = self.runs[m.run_id]
        fields = {
            "project_id": run.project_id, "config_digest": m.config_digest,
            "attempt": m.attempt, "passed": m.passed,
            "expected_generation": m.expected_generation or "",
            "restored_generation": m.restored_generation or "", "verdict": m.verdict or "",
            "replayed": m.replayed, "omitted": m.omitted, "recomputed": m.recomputed,
            "first_divergence": body.get("first_divergence"), "state": body.get("state") or {},
            "cost": body.get("cost") or {}, "failures": list(m.failures),
            "control_run_id": m.control_run_id or "", "reported_at": m.time}
        row = DrillResult.objects.filter(run=run, drill_id=m.drill_id, point=m.point).first()
        if row is None:
            DrillResult.objects.create(run=run, drill_id=m.drill_id, point=m.point, **fields)
        elif m.time >= row.reported_at:
            for k, v in fields.items():
                setattr(row, k, v)
            row.received_at = timezone.now()
            row.save()

    def _folded(self) -> dict[tuple, dict[str, Any]]:
        """The batch's ledger entries as rows to store: ``{(run pk, attempt, update, rank,
        ranks): entry}``, an entry with its ``shift`` and ``ok`` (whether its first rank may fold
        at all, ``runs.folding.fold``'s answer: the spans are walked once). The parts of one
        ``(run, attempt, update)`` (an aggregate's, or the per-rank events of this batch) are
        folded where they have the DistributedSampler shape (``runs.folding.fold``: exact, each
        rank's report is given back as sent); every other part is a row of one rank."""
        rows: dict[tuple, dict[str, Any]] = {}
        for group, parts in self.ledger.items():
            if len(parts) == 1:
                ((rank, entry),) = parts.items()
                rows[group + (rank, 1)] = dict(entry, shift=0, ok=rank != GLOBAL_RANK
                                               and foldable(entry["spans"]))
                continue
            ok: dict[int, bool] = {}
            for rank, ranks, shift, entry in fold(parts, ok):
                rows[group + (rank, ranks)] = dict(entry, shift=shift, ok=ok[rank])
        return rows

    def _flush_ledger(self) -> None:
        """Write the batch's ledger rows (:meth:`_folded`), stamped with the run's seq: new keys
        by COPY (PostgreSQL) or INSERT, keys stored already united into the stored row (read FOR
        UPDATE: a concurrent batch uniting the same key waits, and sees this one's spans)."""
        if not self.ledger:
            return
        pending = self._join_stored(self._folded())
        if connection.vendor != "postgresql":
            while pending:  # entries come back marked retry when a key may be stored
                rest = self._unite_existing(pending)
                new = {k: e for k, e in rest.items() if not e["retry"]}
                pending = {k: e for k, e in rest.items() if e["retry"]}
                if new:
                    LedgerRow.objects.bulk_create(
                        [LedgerRow(run_id=k[0], attempt=k[1], update=k[2], rank=k[3], ranks=k[4],
                                   rank_shift=e["shift"], time=e["time"], spans=e["spans"],
                                   samples=e["samples"], tokens=e["tokens"],
                                   first_seq=self.seqs[k[0]], last_seq=self.seqs[k[0]])
                         for k, e in new.items()], batch_size=500)
            return
        from psycopg.errors import UniqueViolation

        # Fast path: a batch's ledger keys are usually new (one report per rank per update).
        # A key another batch stored (or is storing: the unique index waits for its commit)
        # turns the COPY into a UniqueViolation; then those keys are united and the rest copied.
        if pending:
            with connection.cursor() as cursor:
                cursor.execute(_LEDGER_SAVEPOINT)
        while pending:
            try:
                _copy_lines(LedgerRow._meta.db_table, _LEDGER_COLUMNS,
                            _ledger_text(pending, self.seqs))
                return
            except UniqueViolation:
                _rollback_to(_LEDGER_SAVEPOINT)
                pending = self._unite_existing(pending)

    def _join_stored(self, pending: dict[tuple, dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
        """Fold across batches: join the batch's rows (:meth:`_folded`) with the stored rows of
        their ``(run, attempt, update)`` that may neighbour them (:func:`_stored_rows`, read FOR
        UPDATE; on PostgreSQL the rows just left and right of each) where ``runs.folding.join``
        chains them (consecutive ranks, each rank's report the previous one's moved by one shift,
        same samples and tokens). A chain holding stored rows becomes the first of them (by pk): its
        rank, ranks, shift, spans (the chain's first rank's), ``time`` the earliest of the chain's,
        ``first_seq`` the lowest, ``last_seq`` this batch's seq (so the analysis reads it again);
        the chain's other stored rows are deleted and its batch entries not written (rows locked by
        a concurrent batch are skipped: they stay as they are). A chain of batch entries only is one
        entry. Returns the entries left to write.

        Exact: every rank's report is given back by ``LedgerRow.parts`` as it was sent (the
        spans of rank ``rank + k`` are the first rank's moved by ``k * shift``, checked before
        joining). Only ``time`` is not kept per rank: a row keeps the earliest of its ranks',
        and what reads a ledger row's time keeps only the earliest per update (the core's
        ``AttemptLedger.note_time``; compaction's cutoff, on absorbed rows only). A key that
        a joined row would take and another row holds leaves that chain alone; a concurrent
        batch's new row taking it (a unique violation) leaves this batch unjoined."""
        groups = _foldable_groups(pending)
        if not groups:
            return pending
        stored: dict[tuple, list[Any]] = {}
        for row in _stored_rows(groups):
            group = (row.run_id, row.attempt, row.update)
            if group in groups:
                stored.setdefault(group, []).append(row)
        out = dict(pending)
        # The keys of ``out`` per group as they are before that group's turn below (a turn
        # changes only its own group's keys): one pass, not one over ``out`` per group.
        held: dict[tuple, set[tuple]] = {}
        for k in out:
            if k[:3] in groups:
                held.setdefault(k[:3], set()).add(k[3:])
        changed: list[Any] = []
        doomed: list[int] = []
        for group, keys in groups.items():
            rows = stored.get(group, [])
            if len(keys) + len(rows) < 2:
                continue
            if not rows and _one_time(pending, keys):
                # Nothing stored to join, and the batch's rows of the group are fold's maximal
                # runs of equal time: join compares what fold compared (consecutive ranks, the
                # same samples and tokens as the row's first rank, spans the previous rank's
                # moved by the row's shift; a row of several ranks only at that shift) and
                # not the time, so it would chain none of them (most groups of a batch).
                continue
            self._join_group(group, keys, rows, pending, held[group], out, changed, doomed)
        if not changed:
            return out
        try:
            with transaction.atomic():
                if doomed:
                    LedgerRow.objects.filter(pk__in=doomed).delete()
                _update_joined(changed)
        except IntegrityError:
            return pending
        return out

    def _join_group(self, group: tuple, keys: list[tuple], rows: list[Any],
                    pending: dict[tuple, dict[str, Any]], held: set[tuple],
                    out: dict[tuple, dict[str, Any]], changed: list[Any],
                    doomed: list[int]) -> None:
        """:meth:`_join_stored` for one ``(run, attempt, update)`` ``group``: its batch entries
        ``keys`` (of ``pending``) and stored ``rows`` chained by ``runs.folding.join``; each
        chain of two or more whose key no other row holds (``held``: the group's keys in
        ``out``, and the stored rows') becomes one entry of ``out`` (batch entries only) or
        its first stored row (appended to ``changed``, the others' pks to ``doomed``)."""
        segs = [{"rank": k[3], "ranks": k[4], "shift": pending[k]["shift"],
                 "spans": pending[k]["spans"], "samples": pending[k]["samples"],
                 "tokens": pending[k]["tokens"], "time": pending[k]["time"], "key": k,
                 "ok": True}
                for k in keys]
        segs += [{"rank": r.rank, "ranks": r.ranks, "shift": r.rank_shift, "spans": r.spans,
                  "samples": r.samples, "tokens": r.tokens, "time": r.time, "row": r}
                 for r in rows]
        taken = {(r.rank, r.ranks) for r in rows} | held
        for members, shift in join(segs):
            if len(members) < 2:
                continue
            parts = [segs[i] for i in members]
            new_key = (parts[0]["rank"], sum(p["ranks"] for p in parts))
            if new_key in taken:
                continue
            taken -= {(p["rank"], p["ranks"]) for p in parts}
            taken.add(new_key)
            for p in parts:
                out.pop(p.get("key"), None)
            when = min(p["time"] for p in parts)
            mine = [p["row"] for p in parts if "row" in p]
            if not mine:
                out[group + new_key] = {"time": when, "spans": list(parts[0]["spans"]),
                                        "samples": parts[0]["samples"],
                                        "tokens": parts[0]["tokens"], "shift": shift}
                continue
            keep = min(mine, key=lambda r: r.pk)
            doomed += [r.pk for r in mine if r is not keep]
            keep.rank, keep.ranks, keep.rank_shift = new_key[0], new_key[1], shift
            keep.spans, keep.time = list(parts[0]["spans"]), when
            keep.first_seq = min(r.first_seq for r in mine)
            keep.last_seq = self.seqs[group[0]]
            changed.append(keep)

    def _unite_existing(self, keys: dict[tuple, dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
        """Unite the entries of ``keys`` (rows as :meth:`_folded` gives them) whose key is
        stored into the stored row; return the rest to write. A folded entry whose stored row
        has another ``rank_shift`` cannot be united into it: it comes back as one entry per rank
        (marked ``retry``: such a key may be stored too)."""
        query = LedgerRow.objects.filter(
            run__in={k[0] for k in keys}, attempt__in={k[1] for k in keys},
            update__in={k[2] for k in keys}, rank__in={k[3] for k in keys},
            ranks__in={k[4] for k in keys})
        if connection.vendor == "postgresql":
            query = query.select_for_update().order_by("pk")
        existing = {(row.run_id, row.attempt, row.update, row.rank, row.ranks): row
                    for row in query}
        changed: list[LedgerRow] = []
        rest: dict[tuple, dict[str, Any]] = {}
        for key, entry in keys.items():
            row = existing.get(key)
            if row is None:
                _put(rest, key, dict(entry, retry=False))
                continue
            if row.ranks > 1 and row.rank_shift != entry["shift"]:
                for rank, spans in unfold(key[3], key[4], entry["shift"], entry["spans"]):
                    _put(rest, key[:3] + (rank, 1), dict(entry, spans=list(spans), shift=0,
                                                         retry=True))
                continue
            row.unite(entry["spans"], entry["samples"], entry["tokens"], self.seqs[key[0]],
                      entry["time"])
            changed.append(row)
        if changed:
            LedgerRow.objects.bulk_update(changed, ["spans", "samples", "tokens", "time",
                                                    "last_seq"], batch_size=500)
        return rest

    def _generation(self, run: Run, generation_id: str) -> Generation:
        gen, _ = Generation.objects.get_or_create(run=run, generation_id=generation_id)
        return gen

    def _project_generation(self, ev: ValidEvent) -> None:
        m, body = ev.model, ev.body
        run = self.runs[m.run_id]
        seq = self.seqs[run.pk]  # Generation.seq: every save below marks the generation changed
        if m.type == "checkpoint_started":
            gen = self._generation(run, m.generation_id)
            gen.seq = seq
            gen.attempt = m.attempt if gen.attempt is None else gen.attempt
            if gen.manifest is None:  # the manifest, once in, is the authority
                gen.update = m.update
                gen.required_shards = list(m.required_shards)
                gen.components = list(m.components)
            gen.started_at = gen.started_at or m.time
            gen.save()
        elif m.type == "shard_written":
            gen = self._generation(run, m.generation_id)
            gen.seq = seq
            if gen.attempt is None:
                gen.attempt = m.attempt
            gen.save(update_fields=["attempt", "seq"])
            ShardReport.objects.update_or_create(
                generation=gen, shard=m.shard,
                defaults={"update": m.update, "object_list": body["objects"],
                          "reported_at": m.time})
            _upsert_objects(gen, body["objects"], default_shard=m.shard, in_manifest=False,
                            index=ev.index, path=f"events[{ev.index}].objects")
        elif m.type == "checkpoint_committed":
            manifest = body["manifest"]
            gen = self._generation(run, manifest["generation_id"])
            digest = hashlib.sha256(canonical_json(manifest_identity(manifest))
                                    .encode("utf-8")).hexdigest()  # without committed_at
            committed_at = ev.manifest.committed_at if ev.manifest else \
                manifest_committed_at(manifest)
            first = gen.manifest is None
            found = body.get("discovered_at")  # set by discovery: the manifest's own URI
            if first and isinstance(found, str) and "/" in found and not gen.found_at:
                gen.found_at = found.rsplit("/", 1)[0][:2000]  # relative URIs resolve here
            if gen.record_manifest(manifest, digest, committed_at, m.time, m.attempt):
                gen.seq = seq
                gen.save()
                self.committed_generation_pks.add(gen.pk)
                if first and ev.manifest is not None:
                    _upsert_objects(gen, manifest["objects"], default_shard="",
                                    in_manifest=True, index=ev.index,
                                    path=f"events[{ev.index}].manifest.objects")


#: What an attempt_started declares about its launch; a second one for the attempt must agree.
_START_FIELDS = ("world_size", "dataset_version", "global_batch_size", "micro_batch_size",
                 "grad_accum_steps", "config_digest", "resumed_from")


def _stored_rows(groups: dict[tuple, list[tuple]]) -> Iterable[Any]:
    """The stored rows a batch's rows may join (:meth:`_Projection._join_stored`), with the
    fields it reads. ``groups`` is ``{(run pk, attempt, update): [batch key, ...]}``, a key
    ``(run pk, attempt, update, rank, ranks)``; never the global rank's rows.

    PostgreSQL: only the candidate neighbours of each batch key holding ranks ``r .. r + n - 1``:
    the two stored rows of its ``(run, attempt, update)`` with the greatest starts ``<= r + n``
    (the right neighbour starting at ``r + n``, and the left neighbour ending at ``r - 1`` or a
    row already holding ``r``), one statement of index scans on ``uniq_ledger`` (a ``VALUES``
    list of keys, ``LATERAL ... ORDER BY rank DESC LIMIT 2``), each row once. A row not read is
    not joined and stays a row of its own (joining is never required: exact either way), so an
    update holding thousands of rows costs a request a few rows per key, not all of them.
    ``FOR UPDATE SKIP LOCKED``: a row another batch holds is left out, so ranks' batches of one
    update never wait for each other here, nor sit in a lock cycle. One raw query (the ORM's
    model instances cost more than the rest). Elsewhere (SQLite): every stored row of those
    runs, attempts and updates (the caller filters)."""
    if connection.vendor != "postgresql":
        runs = sorted({g[0] for g in groups})
        attempts = sorted({g[1] for g in groups})
        updates = sorted({g[2] for g in groups})
        return list(LedgerRow.objects.filter(run__in=runs, attempt__in=attempts,
                                             update__in=updates).exclude(rank=GLOBAL_RANK)
                    .only("pk", "run_id", "attempt", "update", "rank", "ranks", "rank_shift",
                          "spans", "samples", "tokens", "time", "first_seq"))
    probes = sorted({key[:3] + (key[3] + key[4],) for keys in groups.values() for key in keys})
    found: dict[int, tuple] = {}
    table = LedgerRow._meta.db_table
    # The probes travel as four arrays: one statement text whatever their number (psycopg
    # parses a statement's text per call unless it has seen it: a VALUES list of 4 parameters
    # per probe was a new text, and most of the statement's client CPU, every request).
    sql = ('SELECT l.id, l.run_id, l.attempt, l."update", l.rank, l.ranks, l.rank_shift, '
           'l.spans::text, l.samples, l.tokens, l.time, l.first_seq '
           'FROM unnest(%s::bigint[], %s::integer[], %s::bigint[], %s::integer[]) '
           'AS w(run_id, attempt, upd, top) '
           'CROSS JOIN LATERAL (SELECT id, run_id, attempt, "update", rank, ranks, '
           f'rank_shift, spans, samples, tokens, time, first_seq FROM "{table}" t '
           'WHERE t.run_id = w.run_id AND t.attempt = w.attempt AND t."update" = w.upd '
           'AND t.rank <= w.top AND t.rank <> %s ORDER BY t.rank DESC, t.ranks DESC '
           'LIMIT 2 FOR UPDATE SKIP LOCKED) AS l')
    with connection.cursor() as cursor:
        cursor.execute(sql, [_ints([p[0] for p in probes]), _ints([p[1] for p in probes]),
                             _ints([p[2] for p in probes]), _ints([p[3] for p in probes]),
                             GLOBAL_RANK])
        for row in cursor.fetchall():
            found.setdefault(row[0], row)
    rows = [found[pk] for pk in sorted(found)]
    spans = json.loads("[" + ",".join(row[7] for row in rows) + "]")
    return [_StoredRow(row, mine) for row, mine in zip(rows, spans)]


class _StoredRow:
    """A stored ledger row as :func:`_stored_rows` reads it on PostgreSQL (the attributes of a
    LedgerRow that :meth:`_Projection._join_stored` and :func:`_update_joined` use)."""

    __slots__ = ("pk", "run_id", "attempt", "update", "rank", "ranks", "rank_shift", "spans",
                 "samples", "tokens", "time", "first_seq", "last_seq")

    def __init__(self, row: tuple, spans: list):
        (self.pk, self.run_id, self.attempt, self.update, self.rank, self.ranks,
         self.rank_shift, _, self.samples, self.tokens, self.time, self.first_seq) = row
        self.spans = spans
        self.last_seq = None


_JOINED_FIELDS = ("rank", "ranks", "rank_shift", "spans", "time", "first_seq", "last_seq")


def _update_joined(rows: list) -> None:
    """Write the joined rows' :data:`_JOINED_FIELDS`: on PostgreSQL one ``UPDATE ... FROM
    (VALUES ...)`` per 500 rows (the ORM's ``bulk_update`` builds a CASE per field and row,
    most of a batch's CPU), elsewhere ``bulk_update``."""
    if connection.vendor != "postgresql":
        LedgerRow.objects.bulk_update(rows, list(_JOINED_FIELDS), batch_size=500)
        return
    table = LedgerRow._meta.db_table
    # Arrays, not a VALUES list: one statement text whatever the number of rows (see
    # _stored_rows).
    sql = (f'UPDATE "{table}" AS t SET rank = v.rank, ranks = v.ranks, '
           'rank_shift = v.rank_shift, spans = v.spans::jsonb, time = v.time, '
           'first_seq = v.first_seq, last_seq = v.last_seq FROM unnest(%s::bigint[], '
           '%s::integer[], %s::integer[], %s::bigint[], %s::text[], %s::timestamptz[], '
           '%s::bigint[], %s::bigint[]) AS v(id, rank, ranks, rank_shift, spans, time, '
           'first_seq, last_seq) WHERE t.id = v.id')
    with connection.cursor() as cursor:
        cursor.execute(sql, [_ints([r.pk for r in rows]), _ints([r.rank for r in rows]),
                             _ints([r.ranks for r in rows]), _ints([r.rank_shift for r in rows]),
                             [json_text(r.spans) for r in rows], [r.time for r in rows],
                             _ints([r.first_seq for r in rows]),
                             _ints([r.last_seq for r in rows])])


def _ledger_text(pending: dict[tuple, dict[str, Any]], seqs: dict[int, int]) -> str:
    """The COPY text of the ledger rows ``pending`` (``{(run pk, attempt, update, rank, ranks):
    entry}``, see :meth:`_Projection._folded`) in :data:`_LEDGER_COLUMNS`, stamped with their
    run's seq (first and last): :func:`_copy_text`'s rules, spelled per column."""
    times: dict[Any, str] = {}
    lines = []
    for key, entry in pending.items():
        when = times.get(entry["time"])
        if when is None:
            when = times[entry["time"]] = _time_text(entry["time"])
        samples, tokens, seq = entry["samples"], entry["tokens"], seqs[key[0]]
        lines.append(f"{key[0]}\t{key[1]}\t{key[2]}\t{key[3]}\t{key[4]}\t{entry['shift']}\t"
                     f"{when}\t{_escape(json_text(entry['spans']))}\t"
                     f"{_NULL if samples is None else samples}\t"
                     f"{_NULL if tokens is None else tokens}\t{seq}\t{seq}")
    lines.append("")
    return "\n".join(lines)


def _foldable_groups(pending: dict[tuple, dict[str, Any]]) -> dict[tuple, list[tuple]]:
    """The keys of ``pending`` (batch entries) that may fold, per ``(run, attempt, update)``:
    not the global rank, with foldable spans (``runs.folding.foldable``, kept as the entry's
    ``ok``)."""
    groups: dict[tuple, list[tuple]] = {}
    for key, entry in pending.items():
        ok = entry.get("ok")
        if ok is None:
            ok = entry["ok"] = key[3] != GLOBAL_RANK and foldable(entry["spans"])
        if ok:
            groups.setdefault(key[:3], []).append(key)
    return groups


def _one_time(pending: dict[tuple, dict[str, Any]], keys: list[tuple]) -> bool:
    """Whether the entries of ``keys`` in ``pending`` all have one ``time``."""
    when = pending[keys[0]]["time"]
    for key in keys:
        if pending[key]["time"] != when:
            return False
    return True


def _ints(values: Iterable[int]) -> str:
    """An array literal of ints (``{1,2,3}``) for a ``%s::bigint[]`` parameter: one string to
    quote instead of psycopg's dumping of a list element by element."""
    return "{" + ",".join(map(str, values)) + "}"


def _texts(values: Iterable[str | None]) -> str:
    """An array literal of texts (``{"a","b\\"c",NULL}``) for a ``%s::text[]`` (or
    ``::timestamptz[]``) parameter, as :func:`_ints`: each element quoted, its backslashes and
    double quotes escaped, ``None`` a NULL."""
    out = []
    for value in values:
        if value is None:
            out.append("NULL")
        else:
            out.append('"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return "{" + ",".join(out) + "}"


def _time_or_none(value: datetime | None) -> str | None:
    """A datetime's text for :func:`_texts` (:func:`_time_text`), ``None`` kept."""
    return None if value is None else _time_text(value)


def _put(rows: dict[tuple, dict[str, Any]], key: tuple, entry: dict[str, Any]) -> None:
    """Add a row to write to ``rows``, united with the entry of the same key if there is one
    (then marked ``retry`` if either was)."""
    mine = rows.get(key)
    if mine is None:
        rows[key] = entry
        return
    _unite_entry(mine, entry)
    mine["retry"] = mine.get("retry") or entry.get("retry")


def _unite_entry(entry: dict[str, Any], other: dict[str, Any]) -> None:
    """Unite a further report of one rank for one update into ``entry`` (as
    ``LedgerRow.unite``): spans not present are appended, counts keep the larger value, the
    time the earlier."""
    when = other.get("time")
    if when is not None and when < entry["time"]:
        entry["time"] = when
    for span in other["spans"]:
        if span not in entry["spans"]:
            entry["spans"].append(span)
    for name in ("samples", "tokens"):
        value = other[name]
        if value is not None:
            entry[name] = max(value, entry[name] or 0)


def _resumed_identity(resumed_from: Any) -> tuple | None:
    """What was restored (generation and update), without the per-rank loader cursor."""
    if not isinstance(resumed_from, dict):
        return None
    return (resumed_from.get("generation_id"), resumed_from.get("update"))


def _declared_start(m: Any, body: dict) -> tuple:
    return (m.world_size, m.dataset_version, m.global_batch_size, m.micro_batch_size,
            m.grad_accum_steps, m.config_digest or "", _resumed_identity(body.get("resumed_from")))


def _declared_of(att: Attempt) -> tuple:
    return (att.world_size, att.dataset_version, att.global_batch_size, att.micro_batch_size,
            att.grad_accum_steps, att.config_digest or "", _resumed_identity(att.resumed_from))


def _reuse_message(m: Any, before: tuple, now: tuple) -> str:
    diff = ", ".join(f"{name} {a!r} -> {b!r}" for name, a, b in zip(_START_FIELDS, before, now)
                     if a != b)
    return (f"attempt {m.attempt} of run {m.run_id!r} already started with other values "
            f"({diff}); expected a new attempt number for a relaunch (another rank of the same "
            "launch reports the same values)")


def _upsert_objects(gen: Generation, objects: list[dict], default_shard: str,
                    in_manifest: bool, index: int | None = None, path: str = "objects") -> None:
    """Record a generation's objects by uri. Manifest objects are the authority: they mark
    ``in_manifest`` and overwrite what a shard report said (resetting the storage check when
    size or digest change); shard-report objects never overwrite a manifest's.

    One URI belongs to one shard (docs/ingest-v1.md#objects-and-shards): an object whose URI the
    generation already records under another shard (another rank's report, or the manifest)
    raises BadRequest naming both shards, at ``path[j].uri`` of event ``index``; the whole
    batch is then refused."""
    existing = {o.uri: o for o in CheckpointObject.objects.filter(
        generation=gen, uri__in=[o["uri"] for o in objects])}
    new: dict[str, CheckpointObject] = {}
    for obj in objects:
        values = {"shard": obj.get("shard") or default_shard, "component": obj["component"],
                  "size": obj["size"], "sha256": (obj.get("sha256") or "").lower(),
                  "update": obj.get("update")}
        row = existing.get(obj["uri"]) or new.get(obj["uri"])
        if row is not None and row.shard and values["shard"] and row.shard != values["shard"]:
            where = "the manifest" if row.in_manifest else "a shard report"
            raise BadRequest("object URI of two shards", [ErrorItem(
                index, f"{path}[{objects.index(obj)}].uri",
                f"expected each object URI in one shard, got {obj['uri']!r} in shard "
                f"{values['shard']!r} while {where} of generation {gen.generation_id!r} lists "
                f"it in shard {row.shard!r}: two shards writing one object overwrite each "
                "other")])
        if row is None:
            new[obj["uri"]] = CheckpointObject(generation=gen, uri=obj["uri"],
                                               in_manifest=in_manifest, **values)
            continue
        if row.in_manifest and not in_manifest:
            continue
        checked = (row.size, row.sha256)
        for name, value in values.items():
            setattr(row, name, value)
        row.in_manifest = row.in_manifest or in_manifest
        if (row.size, row.sha256) != checked:
            row.check_status, row.check_detail, row.checked_at = "pending", "", None
        if row.pk is not None:
            row.save()
    if new:
        CheckpointObject.objects.bulk_create(list(new.values()))


def _apply_to_attempt(att: Attempt, ev: ValidEvent) -> None:
    """What one event changes on its attempt's row (times, the last update, heartbeat, read
    cursors, SDK losses, start, end, restore). Raises AttemptConflict for an attempt_started
    whose launch values contradict the stored start."""
    m, body = ev.model, ev.body
    if att.last_event_at is None or m.time > att.last_event_at:
        att.last_event_at = m.time
    kind = m.type
    if kind in _LEDGER_TYPES:
        # the highest update, at the earliest time a rank reported it (as a united report
        # keeps the earliest time): the same whatever order the ranks' reports arrive in
        if m.update > att.last_update:
            att.last_update, att.last_update_at = m.update, m.time
        elif m.update == att.last_update and (att.last_update_at is None
                                              or m.time < att.last_update_at):
            att.last_update_at = m.time
    elif kind == "heartbeat":
        if att.heartbeat_at is None or m.time > att.heartbeat_at:
            att.heartbeat_at = m.time
        att.advance_fetched(body.get("fetched") or [])
        if m.sdk_dropped or m.sdk_quarantined:
            att.note_sdk_losses(m.rank, m.sdk_dropped, m.sdk_quarantined, m.sdk_lost_updates)
    elif kind == "attempt_started":
        declared = _declared_start(m, body)
        if att.started_at is not None and _declared_of(att) != declared:
            raise AttemptConflict(ev.index, _reuse_message(m, _declared_of(att), declared))
        # every rank sends one: the attempt started with the earliest of them
        att.started_at = m.time if att.started_at is None else min(att.started_at, m.time)
        att.world_size = m.world_size
        att.dataset_version = m.dataset_version
        att.global_batch_size = m.global_batch_size
        att.micro_batch_size = m.micro_batch_size
        att.grad_accum_steps = m.grad_accum_steps
        att.config_digest = m.config_digest or ""
        att.sampler = body.get("sampler") or {}
        att.resumed_from = body.get("resumed_from")
        att.contract = body.get("contract")
    elif kind == "attempt_ended":
        att.ended_at = m.time
        att.end_reason = m.reason
        att.end_update = m.update
        att.end_message = m.message or ""
        att.advance_fetched(body.get("fetched") or [])
    elif kind == "restore_completed":
        att.restore_generation_id = m.generation_id
        att.restore_seconds = float(m.seconds)
        att.restored_at = m.time
    elif kind == "restore_failed":
        att.note_restore_failure(m.generation_id, m.reason, m.message or "", m.time, m.rank)


#: A run's analysis queue mark younger than this (seconds) when read under the run's row lock
#: means an analysis is queued that has not cleared it yet: it will, after this batch commits
#: (its UPDATE waits for the row lock), and then read this batch, so the batch requests none.
#: Below request_analysis's own 60 s staleness, so an older mark still goes through it.
QUEUED_MARK_FRESH_S = 50.0


#: Event types whose only effect on their attempt's row is :data:`_HOT_ATTEMPT_FIELDS` (see
#: :func:`_apply_to_attempt`) and on their run's row the counters, times, seq and strata: a
#: batch of these alone ends through :func:`_finish_hot` (the SDK's requests, nearly all).
_HOT_TYPES = frozenset({"update_committed", "update_aggregate", "heartbeat", "audit_window"})
#: The attempt columns :func:`_apply_to_attempt` changes for :data:`_HOT_TYPES` (and ``seq``).
_HOT_ATTEMPT_FIELDS = ("last_event_at", "last_update", "last_update_at", "heartbeat_at",
                       "fetched", "sdk_losses")


def _finish_runs(runs: dict[str, Run], seqs: dict[int, int], events: Sequence[ValidEvent],
                 touched: set[str], kinds: dict[str, dict[str, str]], now,
                 projection: _Projection) -> set[int]:
    """The batch's last step, under the row lock of each run that gained events (held until
    commit, a few statements): check the span kinds against the run's record and record new
    strata; apply the events to the attempts; the counters and times, the seq (raised to the
    batch's, never lowered: batches commit in any order) and the latest contract. Returns the
    pks of the runs whose analysis is queued and not started (:data:`QUEUED_MARK_FRESH_S`)."""
    if not touched:
        return set()
    if seq_of.concurrent() and all(ev.model.type in _HOT_TYPES for ev in events):
        return _finish_hot(runs, seqs, events, touched, kinds, now, projection)
    locked = _lock_runs({r: runs[r] for r in touched})
    queued = {run.pk for run in locked.values() if run.analysis_queued_at is not None
              and (now - run.analysis_queued_at).total_seconds() < QUEUED_MARK_FRESH_S}
    if any(locked[r].strata.get(s, k) != k for r, ks in kinds.items() for s, k in ks.items()):
        _check_span_kinds({r: Run(strata=dict(run.strata)) for r, run in locked.items()},
                          events)
    query = Attempt.objects.select_for_update().filter(
        run__in=[r.pk for r in locked.values()]).order_by("pk")
    attempts = {(a.run_id, a.attempt): a for a in query}
    projection.apply_attempts(attempts)
    for run_id in touched:
        run = locked[run_id]
        for stratum, kind in kinds.get(run_id, {}).items():
            run.strata.setdefault(stratum, kind)
        mine = [ev.model.time for ev in events if ev.model.run_id == run_id]
        run.event_count += len(mine)
        first, last = min(mine), max(mine)
        run.first_event_at = first if run.first_event_at is None else min(run.first_event_at, first)
        run.last_event_at = last if run.last_event_at is None else max(run.last_event_at, last)
        run.last_received_at = now
        run.ingest_seq = max(run.ingest_seq, seqs[run.pk])
        # A contract declared by an attempt_started of this batch replaces the run's contract
        # when that attempt is the highest that declared one; otherwise the run's contract
        # (perhaps edited in the dashboard) stays (docs/ingest-v1.md#attempt_started).
        fields = ["event_count", "first_event_at", "last_event_at", "last_received_at",
                  "ingest_seq", "strata"]
        announced = {number for (pk, number) in projection.first_started if pk == run.pk}
        declared = [a for (pk, _), a in attempts.items()
                    if pk == run.pk and a.contract is not None]
        if announced and declared:
            newest = max(declared, key=lambda a: a.attempt)
            if newest.attempt in announced:
                run.contract = newest.contract
                fields.append("contract")
        run.save(update_fields=fields)
    return queued


def _finish_hot(runs: dict[str, Run], seqs: dict[int, int], events: Sequence[ValidEvent],
                touched: set[str], kinds: dict[str, dict[str, str]], now,
                projection: _Projection) -> set[int]:
    """:func:`_finish_runs` for a batch of :data:`_HOT_TYPES` only (PostgreSQL), the same
    changes in raw statements: per touched run, in pk order, one ``UPDATE ... RETURNING`` that
    takes the run's row lock (held until commit, as before) and raises the counters, times and
    seq (``event_count + n``, ``LEAST``/``GREATEST`` of the times, ``GREATEST`` of the seqs:
    batches commit in any order) and records the batch's new strata (a stored stratum's kind
    wins: ``batch || stored``), answering the analysis queue mark and the strata; a stratum
    whose stored kind differs from the batch's is then the 400 of :func:`_check_span_kinds`
    (the transaction rolls back). Then the batch's attempts (only those), read ``FOR UPDATE``
    with the columns these events change, the events applied by :func:`_apply_to_attempt` as
    on the ORM path, written back in one statement; attempts not stored yet are created by
    the ORM (the first batch of an attempt). Returns the pks of runs whose analysis is queued
    and not started, as :func:`_finish_runs`."""
    times: dict[str, list] = {}
    for ev in events:
        times.setdefault(ev.model.run_id, []).append(ev.model.time)
    table = Run._meta.db_table
    stored: dict[str, dict] = {}
    queued: set[int] = set()
    with connection.cursor() as cursor:
        for run_id in sorted(touched, key=lambda r: runs[r].pk):
            run, mine = runs[run_id], times[run_id]
            cursor.execute(
                f'UPDATE "{table}" SET event_count = event_count + %s, '
                'first_event_at = LEAST(first_event_at, %s), '
                'last_event_at = GREATEST(last_event_at, %s), last_received_at = %s, '
                'ingest_seq = GREATEST(ingest_seq, %s), strata = %s::jsonb || strata '
                'WHERE id = %s RETURNING analysis_queued_at, strata::text',
                [len(mine), min(mine), max(mine), now, seqs[run.pk],
                 json.dumps(kinds.get(run_id, {})), run.pk])
            mark, strata = cursor.fetchone()
            stored[run_id] = json.loads(strata)
            if mark is not None and (now - mark).total_seconds() < QUEUED_MARK_FRESH_S:
                queued.add(run.pk)
    if any(stored[r].get(s, k) != k for r, ks in kinds.items() for s, k in ks.items()):
        _check_span_kinds({r: Run(strata=dict(st)) for r, st in stored.items()}, events)
    # A statement of its own, after the run's lock is held: under READ COMMITTED it reads a
    # snapshot taken now, so it sees an attempt that a concurrent batch created and committed
    # while this one waited for the lock. Joined to the UPDATE above in one statement it read
    # the snapshot of before the wait, missed that attempt and created it again (a 500 on
    # uniq_attempt: tests/ingest/test_concurrent_new_attempt.py).
    keys = sorted(projection.attempt_events)
    columns = ", ".join(f"t.{name}" for name in _HOT_ATTEMPT_FIELDS[:4])
    attempts: dict[tuple[int, int], Attempt] = {}
    with connection.cursor() as cursor:
        cursor.execute(
            f'SELECT t.id, t.run_id, t.attempt, {columns}, t.fetched::text, t.sdk_losses::text '
            f'FROM "{Attempt._meta.db_table}" t JOIN unnest(%s::bigint[], %s::integer[]) '
            'AS k(run_id, attempt) ON t.run_id = k.run_id AND t.attempt = k.attempt '
            'ORDER BY t.id FOR UPDATE OF t', [_ints([k[0] for k in keys]),
                                              _ints([k[1] for k in keys])])
        for (pk, run_pk, number, last_event_at, last_update, last_update_at, heartbeat_at,
             fetched, losses) in cursor.fetchall():
            # Attempt.from_db: the columns not read stay deferred (never a default value)
            attempts[(run_pk, number)] = _from_db(Attempt, {
                "id": pk, "run_id": run_pk, "attempt": number, "last_event_at": last_event_at,
                "last_update": last_update, "last_update_at": last_update_at,
                "heartbeat_at": heartbeat_at, "fetched": json.loads(fetched),
                "sdk_losses": json.loads(losses)})
    projection.apply_attempts(attempts, hot=True)
    return queued


def _save_hot_attempts(attempts: Sequence[Attempt]) -> None:
    """Write :data:`_HOT_ATTEMPT_FIELDS` and ``seq`` of ``attempts`` (stored rows) in one
    ``UPDATE ... FROM unnest(...)`` (PostgreSQL)."""
    if not attempts:
        return
    sql = (f'UPDATE "{Attempt._meta.db_table}" AS t SET last_event_at = v.last_event_at, '
           'last_update = v.last_update, last_update_at = v.last_update_at, '
           'heartbeat_at = v.heartbeat_at, fetched = v.fetched::jsonb, '
           'sdk_losses = v.sdk_losses::jsonb, seq = v.seq FROM unnest(%s::bigint[], '
           '%s::timestamptz[], %s::bigint[], %s::timestamptz[], %s::timestamptz[], %s::text[], '
           '%s::text[], %s::bigint[]) AS v(id, last_event_at, last_update, last_update_at, '
           'heartbeat_at, fetched, sdk_losses, seq) WHERE t.id = v.id')
    with connection.cursor() as cursor:
        cursor.execute(sql, [_ints([a.pk for a in attempts]),
                             _texts([_time_or_none(a.last_event_at) for a in attempts]),
                             _ints([a.last_update for a in attempts]),
                             _texts([_time_or_none(a.last_update_at) for a in attempts]),
                             _texts([_time_or_none(a.heartbeat_at) for a in attempts]),
                             _texts([json.dumps(a.fetched) for a in attempts]),
                             _texts([json.dumps(a.sdk_losses) for a in attempts]),
                             _ints([a.seq for a in attempts])])
