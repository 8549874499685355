"""The change log across runs (Healthchecks' log, Grafana's annotations): every change of an
alert's state (opened, acknowledged, resolved, its subjects), every note and change of owner,
every pause and resume of a run's monitoring, every restart (an attempt after the first starting)
and every rejected generation, newest first, with who and when. Read-only: it lists rows the
other parts of recoverydash wrote (``AlertFlip``, ``AlertNote``, ``MonitoringChange``,
``Attempt``, ``Generation``), nothing is computed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth.decorators import login_required
from django.db.models import F
from django.db.models.functions import Coalesce
from django.shortcuts import render
from django.urls import reverse

from recoverydash.alerts.models import AlertFlip, AlertNote
from recoverydash.dashboard.queries import as_datetime, visible_projects
from recoverydash.runs.models import Attempt, Generation, MonitoringChange

#: What the log can be narrowed to (``?kind=``), in the order of the page's choices.
KINDS = {"alerts": "alert state changes", "acks": "acknowledgements",
         "notes": "notes and owners", "monitoring": "pauses and resumes",
         "restarts": "restarts", "rejections": "rejected generations"}
PAGE = 100


@dataclass
class Change:
    """One entry: ``at`` (server clock, or the trainer's for restarts), ``kind`` (a key of
    ``KINDS``, ``acks`` included in ``alerts``), ``run`` (Run, its project loaded), ``who`` (a user
    name, ``token <name>``, or the words for recoverydash itself / the trainer), ``what`` (a
    sentence) and ``link`` (the page the change is about)."""

    at: datetime
    kind: str
    run: object
    who: str
    what: str
    link: str
    state: str = ""   # an alert's new state, for its badge


def _newest(rows, run_field: str, time_field: str, run: str, before, limit: int):
    """``rows`` of runs whose id holds ``run`` (``run_field``: the lookup of the run id), older
    than ``before`` by ``time_field``, newest first, at most ``limit``."""
    if run:
        rows = rows.filter(**{f"{run_field}__icontains": run})
    if before:
        rows = rows.filter(**{f"{time_field}__lt": before})
    return rows.order_by(f"-{time_field}", "-pk")[:limit]


def _flips(projects, run: str, before, limit: int, acks_only: bool) -> list[Change]:
    rows = (AlertFlip.objects.select_related("alert__run__project")
            .filter(alert__run__project__in=projects))
    if acks_only:
        rows = rows.filter(new_state="acknowledged").exclude(old_state="acknowledged")
    out = []
    for f in _newest(rows, "alert__run__run_id", "created_at", run, before, limit):
        a = f.alert
        if f.change is not None:
            what, who, kind = f"{a.rule}: {f.reason}", "recoverydash", "alerts"
        elif f.new_state == "acknowledged":
            what, who, kind = f"{a.rule} acknowledged", a.acknowledged_by, "acks"
        elif f.new_state == "resolved":
            who = a.resolved_by or "recoverydash"
            what = f"{a.rule} resolved" + ("" if a.resolved_by else f": {f.reason}")
            kind = "alerts"
        else:
            what, who, kind = f"{a.rule} opened ({a.severity}): {f.reason}", "recoverydash", \
                "alerts"
        out.append(Change(f.created_at, kind, a.run, who, what,
                          reverse("alert_detail", args=[a.pk]), f.new_state))
    return out


def _notes(projects, run: str, before, limit: int) -> list[Change]:
    rows = (AlertNote.objects.select_related("alert__run__project")
            .filter(alert__run__project__in=projects))
    out = []
    for n in _newest(rows, "alert__run__run_id", "created_at", run, before, limit):
        a = n.alert
        if n.kind == "assigned":
            what = f"{a.rule} assigned to {n.text}" if n.text else f"{a.rule} left to nobody"
        else:
            what = f"note on {a.rule}: {n.text}"
        out.append(Change(n.created_at, "notes", a.run, n.author, what,
                          reverse("alert_detail", args=[a.pk]) + "#timeline"))
    return out


def _monitoring(projects, run: str, before, limit: int) -> list[Change]:
    rows = (MonitoringChange.objects.select_related("run__project")
            .filter(run__project__in=projects))
    out = []
    for m in _newest(rows, "run__run_id", "at", run, before, limit):
        what = ("monitoring paused" if m.paused else "monitoring resumed") + \
            (f": {m.note}" if m.note else "")
        out.append(Change(m.at, "monitoring", m.run, m.by or "the run's next event", what,
                          reverse("run", args=[m.run.project.name, m.run.run_id])))
    return out


def _restarts(projects, run: str, before, limit: int) -> list[Change]:
    rows = (Attempt.objects.select_related("run__project")
            .filter(run__project__in=projects, attempt__gt=0, started_at__isnull=False))
    out = []
    for a in _newest(rows, "run__run_id", "started_at", run, before, limit):
        source = a.resumed_from.get("generation_id") if isinstance(a.resumed_from,
                                                                   dict) else None
        what = f"attempt {a.attempt} started" + (
            f", resumed from {source}" if source else
            ", a fresh start (nothing restored)" if a.resumed_from is None else
            ", from a state it did not name")
        if a.world_size:
            what += f" on {a.world_size} rank{'s' if a.world_size != 1 else ''}"
        out.append(Change(a.started_at, "restarts", a.run, "the trainer", what,
                          reverse("restart", args=[a.run.project.name, a.run.run_id,
                                                   a.attempt])))
    return out


def _rejections(projects, run: str, before, limit: int) -> list[Change]:
    rows = (Generation.objects.select_related("run__project").defer("manifest")
            .filter(run__project__in=projects, status="rejected")
            .annotate(at=Coalesce(F("verified_at"), F("committed_at")))
            .filter(at__isnull=False))
    out = []
    for g in _newest(rows, "run__run_id", "at", run, before, limit):
        codes = ", ".join(sorted({r.get("code", "") for r in g.reasons or []})) or "no reason"
        out.append(Change(g.at, "rejections", g.run, "recoverydash",
                          f"generation {g.generation_id} (update {g.update:,}) rejected: {codes}",
                          reverse("generation", args=[g.run.project.name, g.run.run_id,
                                                      g.generation_id])))
    return out


def change_log(user, *, run: str = "", kind: str = "", before: datetime | None = None,
               limit: int = PAGE) -> list[Change]:
    """The newest ``limit`` changes of the runs ``user`` may see, before ``before`` (an aware
    datetime; None: now), newest first; ``run``: a part of the run id (case-insensitive);
    ``kind``: one of ``KINDS`` ("" every kind). One query per kind asked for, each cut at
    ``limit`` rows."""
    projects = visible_projects(user)
    run = run.strip()
    found: list[Change] = []
    if kind in ("", "alerts", "acks"):
        found += _flips(projects, run, before, limit, acks_only=kind == "acks")
    if kind in ("", "notes"):
        found += _notes(projects, run, before, limit)
    if kind in ("", "monitoring"):
        found += _monitoring(projects, run, before, limit)
    if kind in ("", "restarts"):
        found += _restarts(projects, run, before, limit)
    if kind in ("", "rejections"):
        found += _rejections(projects, run, before, limit)
    found.sort(key=lambda c: c.at, reverse=True)
    return found[:limit]


@login_required
def changes(request):
    """The change log page: ``?run=`` (part of a run id), ``?kind=`` (``KINDS``), ``?before=``
    (an RFC 3339 time: the next page)."""
    run = (request.GET.get("run") or "")[:128]
    kind = request.GET.get("kind") or ""
    kind = kind if kind in KINDS else ""
    try:
        before = as_datetime(request.GET.get("before") or None)
    except ValueError:
        before = None
    rows = change_log(request.user, run=run, kind=kind, before=before)
    return render(request, "dashboard/changes.html",
                  {"rows": rows, "run": run, "kind": kind, "kinds": KINDS,
                   "older": rows[-1].at.isoformat() if len(rows) == PAGE else None,
                   "query": {k: v for k, v in (("run", run), ("kind", kind)) if v}})
