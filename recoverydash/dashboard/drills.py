"""The Drills page: per project, the latest failure drill of every trainer (config digest) and
each crash point's result as the drill runner reported it (``drill_result``,
docs/ingest-v1.md#drill_result; the figures: docs/definitions.md#drill), with links to the
drill runs' own pages. The query and the views."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from recoverydash.dashboard import queries
from recoverydash.recovery.drills import CRASH_POINTS
from recoverydash.runs.models import DrillResult, Run


@dataclass
class Drill:
    """The latest drill of one trainer: its id, digest, results in crash-point order, the
    control run (None when the server never heard of it), when it was reported."""

    drill_id: str
    config_digest: str
    results: list
    control: Run | None
    reported_at: object
    passed: bool
    earlier: int = 0  # earlier drills of the same trainer


@dataclass
class ProjectDrills:
    project: object
    drills: list = field(default_factory=list)


def _order(point: str) -> int:
    return CRASH_POINTS.index(point) if point in CRASH_POINTS else len(CRASH_POINTS)


def project_drills(project) -> ProjectDrills:
    """The latest drill per config digest of ``project`` (by the newest report of its drill
    id), newest first."""
    rows = list(DrillResult.objects.filter(project=project).select_related("run__project")
                .order_by("-reported_at", "-pk"))
    latest: dict[str, str] = {}
    ids: dict[str, set] = {}
    for r in rows:
        latest.setdefault(r.config_digest, r.drill_id)
        ids.setdefault(r.config_digest, set()).add(r.drill_id)
    controls = {r.run_id: r for r in Run.objects.select_related("project").filter(
        project=project, run_id__in={x.control_run_id for x in rows if x.control_run_id})}
    out = ProjectDrills(project)
    for digest, drill_id in latest.items():
        mine = sorted((r for r in rows if r.drill_id == drill_id and r.config_digest == digest),
                      key=lambda r: _order(r.point))
        control = controls.get(next((r.control_run_id for r in mine if r.control_run_id), ""))
        out.drills.append(Drill(drill_id, digest, mine, control,
                                max(r.reported_at for r in mine), all(r.passed for r in mine),
                                len(ids[digest]) - 1))
    return out


@login_required
def drills(request, pk: int | None = None):
    """GET: the Drills page of one project (``pk``) or of every project the user sees."""
    projects = [queries.project_for(request.user, pk)] if pk is not None else \
        list(queries.visible_projects(request.user))
    return render(request, "dashboard/drills.html",
                  {"pages": [project_drills(p) for p in projects], "one": pk is not None})
