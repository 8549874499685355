"""Pausing a run's monitoring (Healthchecks' pause): a run stopped on purpose pages nobody.

While a run is paused (``Run.is_paused``: ``paused_at`` set and no event received since) its
alert rules are not evaluated (``alerts.rules.evaluate_runs`` and the beat's clock evaluation
leave it out), so no alert opens, changes or resolves and nothing is sent; the dashboard shows it
paused and the fleet's "needs attention" view leaves it out. The first event received after the
pause ends it: the next evaluation records the resume (``resume_on_events``) and evaluates the run
as usual. Every pause and resume is a ``MonitoringChange`` row (who, when, the words given): the
change log across runs lists them.

The dashboard's buttons and the admin API (``POST /api/v1/runs/{run_id}/pause``, ``/resume``)
call :func:`pause` and :func:`resume`.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from recoverydash.runs.models import MonitoringChange, Run, paused_now


def not_paused(prefix: str = "") -> Q:
    """``Q`` of the runs not paused now (``runs.models.paused_now`` in SQL): never paused, or an
    event received since the pause. ``prefix`` ``"run__"`` filters rows that belong to a run."""
    return (Q(**{f"{prefix}paused_at__isnull": True})
            | Q(**{f"{prefix}last_received_at__gt": F(f"{prefix}paused_at")}))


def pause(run: Run, by: str, note: str = "", now=None) -> bool:
    """Pause the monitoring of ``run`` as ``by`` (a user name, or ``token <name>``) with the
    words ``note``; False when it is paused already (nothing written). One transaction: the run
    row locked, ``paused_at``/``paused_by`` set, a ``MonitoringChange`` written."""
    now = now or timezone.now()
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if paused_now(locked.paused_at, locked.last_received_at):
            return False
        Run.objects.filter(pk=run.pk).update(paused_at=now, paused_by=by)
        MonitoringChange.objects.create(run=run, paused=True, by=by, note=note, at=now)
    run.paused_at, run.paused_by = now, by
    return True


def resume(run: Run, by: str, note: str = "", now=None) -> bool:
    """Resume the monitoring of ``run`` as ``by``; False when it is not paused (nothing
    written). The next evaluation of its rules (its next analysis, or the beat's within a
    minute) judges it as usual."""
    now = now or timezone.now()
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        if not paused_now(locked.paused_at, locked.last_received_at):
            return False
        Run.objects.filter(pk=run.pk).update(paused_at=None, paused_by="")
        MonitoringChange.objects.create(run=run, paused=False, by=by, note=note, at=now)
    run.paused_at, run.paused_by = None, ""
    return True


def resume_on_events(runs: list) -> list:
    """The runs of ``runs`` (Run objects with ``paused_at`` and ``last_received_at`` loaded) to
    evaluate: those never paused, and those paused whose next event arrived, whose pause ends
    here (``paused_at`` cleared, a ``MonitoringChange`` by "" at the event's arrival: "resumed
    by its next event"). Runs still paused are left out. Called inside the evaluation's
    transaction."""
    ended = [r for r in runs if r.paused_at is not None
             and not paused_now(r.paused_at, r.last_received_at)]
    if ended:
        # only the rows still paused as read: a concurrent resume by a person is not repeated
        done = set(Run.objects.filter(pk__in=[r.pk for r in ended], paused_at__isnull=False,
                                      last_received_at__gt=F("paused_at"))
                   .values_list("pk", flat=True))
        Run.objects.filter(pk__in=done).update(paused_at=None, paused_by="")
        MonitoringChange.objects.bulk_create([
            MonitoringChange(run=r, paused=False, by="", at=r.last_received_at,
                             note="an event was received: monitoring resumed")
            for r in ended if r.pk in done])
        for r in ended:
            r.paused_at, r.paused_by = None, ""
    return [r for r in runs if not paused_now(r.paused_at, r.last_received_at)]
