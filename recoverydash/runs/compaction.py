"""Retention of raw rows once the analysis has absorbed them (docs/retention.md).

A run's stored analysis state (``Analysis.state``: the ledger, the heartbeat fold) holds
everything the analysis reads of its ``update_committed`` and ``heartbeat`` events, so the raw
rows behind it (``Event`` rows of those two types, ``LedgerRow``, ``Heartbeat``) can go once they
are absorbed and older than ``RECOVERYDASH_RAW_RETENTION_DAYS``. :func:`compact` deletes them in
bounded batches (the periodic ``compact_raw_rows`` task); attempts, generations, shard reports,
objects, audit windows, alerts and every other event type are kept, and so are the ledger rows and
``update_committed`` events of the updates an audit window covers (the restart page reads them).

A row is deleted only when the run's stored state reflects it (its seq at or below
``Analysis.ingest_seq``, a state of the current format) and its event time (the trainer's clock,
the same for an event and the rows projected from it) is older than the retention;
the run's ``Analysis.compacted_at`` is set, after which the analysis never rebuilds the state from
the rows that are left (``runs.analysis.analyze_with_result`` refuses and says why).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import BigIntegerField, Exists, OuterRef
from django.db.models.fields.json import KT
from django.db.models.functions import Cast
from django.utils import timezone

from recoverydash.recovery.ledger import CONTINUED_FORMAT
from recoverydash.runs.models import Analysis, AuditWindow, Event, Heartbeat, LedgerRow

RAW_TYPES = ("update_committed", "update_aggregate", "heartbeat")


def _absorbed(seq_field: str):
    """The run's stored state, of a format the analysis continues (``ledger.CONTINUED_FORMAT``
    or newer), reflects the row's seq."""
    return Exists(Analysis.objects.filter(run=OuterRef("run"),
                                          state_format__gte=CONTINUED_FORMAT,
                                          ingest_seq__gte=OuterRef(seq_field)))


def _audited(update):
    """An audit window covers the row's (run, attempt, update)."""
    return Exists(AuditWindow.objects.filter(run=OuterRef("run"), attempt=OuterRef("attempt"),
                                             update=update))


def candidates(cutoff: datetime) -> dict:
    """``{model: queryset}`` of the raw rows that may be deleted at ``cutoff`` (older than it,
    absorbed, not covered by an audit window)."""
    return {
        Heartbeat: Heartbeat.objects.filter(time__lt=cutoff).filter(_absorbed("seq")),
        LedgerRow: (LedgerRow.objects.filter(time__lt=cutoff).filter(_absorbed("last_seq"))
                    .exclude(_audited(OuterRef("update")))),
        Event: (Event.objects.filter(type__in=RAW_TYPES, time__lt=cutoff)
                .filter(_absorbed("batch_seq"))
                .annotate(update=Cast(KT("body__update"), BigIntegerField()))
                .exclude(_audited(OuterRef("update")))),
    }


def compact(now: datetime | None = None, batch: int = 5000, max_batches: int = 40) -> int:
    """Delete absorbed raw rows older than ``RECOVERYDASH_RAW_RETENTION_DAYS`` (see the module
    docstring), at most ``batch`` rows per statement and ``max_batches`` statements per call (the
    rest is left for the next call); returns the number of rows deleted. Does nothing when
    ``RECOVERYDASH_COMPACTION`` is off. Each batch is one transaction that also marks the runs
    it touched ``compacted_at``."""
    if not settings.RECOVERYDASH_COMPACTION:
        return 0
    now = now or timezone.now()
    cutoff = now - timedelta(days=settings.RECOVERYDASH_RAW_RETENTION_DAYS)
    deleted, statements = 0, 0
    for model, rows in candidates(cutoff).items():
        while statements < max_batches:
            picked = list(rows.order_by().values_list("pk", "run_id")[:batch])
            if not picked:
                break
            statements += 1
            with transaction.atomic():
                Analysis.objects.filter(run_id__in={run for _, run in picked},
                                        compacted_at__isnull=True).update(compacted_at=now)
                doomed = model.objects.filter(pk__in=[pk for pk, _ in picked])
                deleted += doomed._raw_delete(doomed.db)
            if len(picked) < batch:
                break
    return deleted
