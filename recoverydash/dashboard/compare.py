"""Runs compared side by side (W&B's run comparison): 2 to 4 runs' risk, goodput, replay and
omission on shared axes, one figure per measure with a trace or bar per run, and a table of the
same figures. Every number is the core's, read from each run's stored analysis (the run page's
sources): nothing is computed here but where a value goes on which axis.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import render
from django.utils import timezone

from recoverydash.alerts.rules import contract_of
from recoverydash.dashboard import charts, queries
from recoverydash.recovery.figures import seconds_since_last_restorable
from recoverydash.recovery.result import AnalysisResult
from recoverydash.runs.models import Analysis, Run

MIN_RUNS, MAX_RUNS = 2, 4
#: one colour per compared run, in the order chosen (told apart by name in every legend too)
COLOURS = ("#0969da", "#cf222e", "#1a7f37", "#8250df")


@dataclass
class Compared:
    """One run of the comparison and the figures of it the page shows."""

    run: Run
    colour: str
    health: str = "unknown"
    # docs/definitions.md#seconds-since-last-restorable
    seconds_since_restorable: float | None = None
    limit_s: float = 0.0
    updates_at_risk: int | None = None               # docs/definitions.md#updates-at-risk
    goodput: float | None = None                     # docs/definitions.md#goodput
    restarts: list = field(default_factory=list)     # the core's ``restarts`` items
    tslrc: tuple = ((), ())                          # charts.tslrc_series

    @property
    def key(self) -> str:
        return f"{self.run.project.name}/{self.run.run_id}"


def parse_keys(values: list[str]) -> list[tuple[str, str]]:
    """``project/run_id`` strings (the ``runs`` query parameter, repeated) as (project, run_id),
    duplicates and malformed ones dropped, in the order given."""
    out: list[tuple[str, str]] = []
    for value in values:
        project, sep, run_id = (value or "").strip().partition("/")
        if sep and project and run_id and (project, run_id) not in out:
            out.append((project, run_id))
    return out


def compared_runs(user, keys: list[tuple[str, str]], now: datetime | None = None) -> list:
    """The runs named by ``keys`` that ``user`` may see (others are left out, as unknown ones
    are), at most ``MAX_RUNS``, each with the core's figures of its stored analysis at ``now``."""
    now = now or timezone.now()
    out: list[Compared] = []
    for project, run_id in keys[:MAX_RUNS]:
        try:
            run = queries.run_named(user, project, run_id)
        except Http404:  # not visible, or no such run: left out alike
            continue
        item = Compared(run=run, colour=COLOURS[len(out)], limit_s=float(
            contract_of(run)["max_checkpoint_age_s"]))
        result = Analysis.objects.filter(run=run).values_list("result", "health").first()
        if result is not None:
            data: AnalysisResult = result[0] if result[0] else {}
            item.health = result[1] or "unknown"
            item.seconds_since_restorable = seconds_since_last_restorable(
                data, now, run.first_event_at)
            item.updates_at_risk = data.get("updates_at_risk")
            item.goodput = data.get("costs", {}).get("goodput")
            item.restarts = list(data.get("restarts") or [])
            item.tslrc = charts.tslrc_series(data, now, run.first_event_at)
        out.append(item)
    return out


def risk_figure(items: list[Compared]) -> dict:
    """docs/definitions.md#seconds-since-last-restorable of every run on one time axis and one
    duration axis (the core's sawtooth, ``charts.tslrc_series``, downsampled), each run's
    contract limit as a dotted line of its colour."""
    series = [(i, *charts.downsample(list(i.tslrc[0]), list(i.tslrc[1]))) for i in items
              if i.tslrc[0]]
    if not series:
        return charts.empty_figure("Time since last restorable checkpoint",
                                   "None of these runs has a stored analysis with times yet.")
    div, unit = charts.seconds_unit(max(max(ys) for _, _, ys in series))
    data = []
    series = [(item, charts._isos(xs), ys) for item, xs, ys in series]
    for item, xs, ys in series:
        data.append({"type": "scatter", "mode": "lines", "name": item.run.run_id,
                     "x": xs, "y": [round(s / div, 3) for s in ys],
                     "line": {"color": item.colour, "width": 2},
                     "hovertemplate": item.run.run_id + ": %{y:.2f} " + unit + "<extra></extra>"})
    top = max(max(d["y"]) for d in data)
    for item, xs, _ in series:
        if item.limit_s / div <= top * 1.5:  # a limit far above every run would flatten them
            data.append({"type": "scatter", "mode": "lines",
                         "name": f"{item.run.run_id} limit", "x": [xs[0], xs[-1]],
                         "y": [item.limit_s / div] * 2, "hoverinfo": "skip",
                         "line": {"color": item.colour, "width": 1, "dash": "dot"}})
    layout = charts.base_layout("Time since last restorable checkpoint")
    layout["yaxis"]["title"] = {"text": unit}
    layout["yaxis"]["rangemode"] = "tozero"
    layout["xaxis"]["type"] = "date"
    layout["hovermode"] = "x unified"
    return {"data": data, "layout": layout}


def goodput_figure(items: list[Compared]) -> dict:
    """docs/definitions.md#goodput of every run (the core's ``costs.goodput``), in percent on one
    axis from 0 to 100; a run whose goodput is unknown is named so on its bar."""
    if not items:
        return charts.empty_figure("Goodput", "No run chosen.")
    data = [{"type": "bar", "x": [i.run.run_id for i in items],
             "y": [None if i.goodput is None else round(100 * i.goodput, 2) for i in items],
             "text": ["unknown" if i.goodput is None else f"{100 * i.goodput:.1f}%"
                      for i in items],
             "textposition": "outside", "cliponaxis": False, "showlegend": False,
             "marker": {"color": [i.colour for i in items]}, "hoverinfo": "skip"}]
    layout = charts.base_layout("Goodput", height=280)
    layout["yaxis"].update(title={"text": "% of wall time"}, range=[0, 110])
    return {"data": data, "layout": layout}


def restarts_figure(items: list[Compared]) -> dict:
    """docs/definitions.md#replayed and #omitted positions of every restart of every run on one
    axis: a group per restart (``run_id · attempt k``), replayed and omitted side by side, the
    run told by the bar's outline colour and its name."""
    x, replayed, omitted, colours = [], [], [], []
    for item in items:
        for r in item.restarts:
            x.append(f"{item.run.run_id} · attempt {r.get('attempt')}")
            replayed.append(r.get("replayed") or 0)
            omitted.append(r.get("omitted") or 0)
            colours.append(item.colour)
    if not x:
        return charts.empty_figure("Replayed and omitted positions per restart",
                                   "None of these runs has restarted.")
    data = [{"type": "bar", "name": name, "x": x, "y": ys,
             "text": [f"{v:,}" for v in ys], "textposition": "outside", "cliponaxis": False,
             "marker": {"color": fill, "pattern": {"shape": shape},
                        "line": {"color": colours, "width": 2}}}
            for name, ys, fill, shape in (("replayed", replayed, "#cf222e", ""),
                                          ("omitted", omitted, "#9a6700", "/"))]
    layout = charts.base_layout("Replayed and omitted positions per restart", barmode="group")
    layout["yaxis"].update(title={"text": "positions"}, rangemode="tozero")
    layout["xaxis"]["automargin"] = True
    return {"data": data, "layout": layout}


@login_required
def compare(request):
    """``/compare/?runs=project/run_id&runs=...``: 2 to 4 runs side by side; with fewer, the
    page says how to choose them."""
    keys = parse_keys(request.GET.getlist("runs"))
    items = compared_runs(request.user, keys)
    figures = {}
    if len(items) >= MIN_RUNS:
        figures = {"risk": risk_figure(items), "goodput": goodput_figure(items),
                   "restarts": restarts_figure(items)}
    choices = list(Run.objects.filter(project__in=queries.visible_projects(request.user))
                   .select_related("project").order_by("-last_received_at", "run_id")[:500])
    return render(request, "dashboard/compare.html", {
        "items": items, "figures": figures, "keys": [i.key for i in items],
        "json": charts.script_json({"figures": figures}) if figures else "",
        "choices": choices, "asked": len(keys), "max_runs": MAX_RUNS, "min_runs": MIN_RUNS,
        "too_many": len(keys) > MAX_RUNS, "now": timezone.now()})
