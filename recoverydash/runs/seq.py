"""The ingest seq: the order in which the analysis absorbs a run's rows, without a lock per run.

Ingest stamps every row a batch writes (``LedgerRow.first_seq`` / ``last_seq``,
``Heartbeat.seq``, ``Event.batch_seq``) with the batch's seq, and raises ``Run.ingest_seq`` to
it. The analysis reads the rows whose seq lies above the one its state reflects and at or below
:func:`committed_seq`. The contract both sides keep:

    every row stamped at or below ``committed_seq(run)`` is committed, and no row stamped at or
    below it is written afterwards.

Batches into one run commit in any order, so a seq cannot just be taken at the start of a
transaction (batch A takes 5, batch B takes 6 and commits first, the worker absorbs 6, then A's
rows appear at 5 and would be skipped forever). On PostgreSQL:

* a batch first takes a *shared* advisory lock of each run it writes (shared holders never wait
  for one another), then its seq from one database sequence (``nextval``: strictly increasing,
  no lock), so every batch that locks a run later gets a higher seq;
* :func:`committed_seq` takes the *exclusive* advisory lock of the run in a transaction of its
  own, which waits until the batches in flight on that run have committed or rolled back, reads
  ``Run.ingest_seq`` and lets go at once. Every batch that held the lock is then committed (its
  seq is at or below what was read, or it rolled back); every batch after it takes a higher seq.

The only wait is the analysis waiting for the batches in flight on its run (and new batches of
that run waiting behind it for that moment), once per analysis, not one batch behind another.
SQLite serialises writers for the whole database, so there the seq is the run's own count of
batches, raised under the writer's lock.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import connection, transaction
from django.db.models import F
from django.db.models.functions import Greatest

from .models import Generation, Run

#: The PostgreSQL sequence every batch takes its seq from (created by migration 0009).
SEQUENCE = "recoverydash_ingest_seq"
#: First key of the two-key advisory locks of runs (the second is the run's pk, modulo 2**31):
#: ``pg_advisory_*(RUN_LOCK_CLASS, pk)``. Two runs sharing a key only wait a little more.
RUN_LOCK_CLASS = 0x52444953  # "RDIS"
#: How long the analysis waits for the batches in flight on its run before the database errors
#: (a transient error: the task retries).
WAIT_TIMEOUT = "30s"


def _key(run_pk: int) -> int:
    return int(run_pk) % (2 ** 31)


def concurrent() -> bool:
    """True when batches into one run may run concurrently (PostgreSQL)."""
    return connection.vendor == "postgresql"


def take_seq(run_pks: Iterable[int], then: str | None = None) -> int:
    """PostgreSQL, inside the batch's transaction: lock the runs ``run_pks`` shared (until the
    transaction ends) and return the batch's seq (one for all its runs; a positive int, higher
    than the seq of every batch that locked any of these runs earlier). Must be called before
    the batch stamps any row. ``then``: a statement without parameters or result (ingest's
    ``SAVEPOINT``) run right after, in the same round trip when the connection binds
    parameters client-side (psycopg's ``ClientCursor``, Django's default), else on its own."""
    keys = sorted({_key(pk) for pk in run_pks})
    # One statement: the FROM clause's aggregate takes every lock (in key order) before the
    # outer target list calls nextval, which it evaluates once, on the aggregate's one row.
    sql = (f"SELECT nextval('{SEQUENCE}') FROM (SELECT count("
           "pg_advisory_xact_lock_shared(%s, k)) FROM unnest(%s::int[]) AS k) AS locked")
    with connection.cursor() as cursor:
        joined = then is not None and _client_side(cursor)
        cursor.execute(f"{sql}; {then}" if joined else sql, [RUN_LOCK_CLASS, keys])
        seq = int(cursor.fetchone()[0])  # the first statement's result
        if then is not None and not joined:
            cursor.execute(then)
        return seq


def _client_side(cursor) -> bool:
    """Whether ``cursor`` (Django's) merges parameters into the statement's text (psycopg's
    ``ClientCursor``), so that one ``execute`` may hold several statements."""
    from psycopg import ClientCursor

    return isinstance(cursor.cursor, ClientCursor)


def committed_seq(run_pk: int) -> int:
    """The highest seq up to which every row of run ``run_pk`` is committed and none will be
    written (the module's contract): the analysis absorbs rows with seq in ``(absorbed,
    committed_seq]``. PostgreSQL: waits for the batches in flight on the run (see the module
    docstring; raises ``OperationalError`` after :data:`WAIT_TIMEOUT`). Raises
    ``Run.DoesNotExist`` for an unknown pk."""
    if not concurrent():
        return Run.objects.filter(pk=run_pk).values_list("ingest_seq", flat=True).get()
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL lock_timeout = '{WAIT_TIMEOUT}'")
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [RUN_LOCK_CLASS, _key(run_pk)])
        # READ COMMITTED: this statement's snapshot is taken after the lock was granted, so it
        # sees every batch that held the lock.
        return Run.objects.filter(pk=run_pk).values_list("ingest_seq", flat=True).get()


def mark_changed(run_pk: int, generation_pk: int | None = None) -> int:
    """Inside the caller's transaction, before it writes: take a seq for a change of the run's
    analysis inputs that no ingest batch makes (a storage check's result, a contract edited
    outside the trainer), raise ``Run.ingest_seq`` to it and stamp generation
    ``generation_pk``'s ``seq`` with it (the generation whose objects or results change), so
    that the next analysis reads what changed and an unchanged ``ingest_seq`` means unchanged
    inputs. PostgreSQL: the run's shared advisory lock and a seq from the sequence, as a batch
    (:func:`take_seq`); SQLite: the run's count raised by one. Returns the seq."""
    if concurrent():
        seq = take_seq([run_pk])
        Run.objects.filter(pk=run_pk).update(ingest_seq=Greatest(F("ingest_seq"), seq))
    else:
        Run.objects.filter(pk=run_pk).update(ingest_seq=F("ingest_seq") + 1)
        seq = Run.objects.filter(pk=run_pk).values_list("ingest_seq", flat=True).get()
    if generation_pk is not None:
        Generation.objects.filter(pk=generation_pk).update(seq=seq)
    return seq
