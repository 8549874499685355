"""Plotly figures of the run page, built on the server from the stored analysis.

Each ``*_figure`` function returns a Plotly figure as a plain dict (``{"data": [...],
"layout": {...}}``, the JSON that ``Plotly.react`` takes) and says in its docstring which
definition of docs/definitions.md it draws. The figures draw what the recovery core computed and
recompute nothing:

- ``Analysis.result`` (the core's ``RunAnalysis.to_dict()``): ``restarts``, ``strata``,
  ``costs`` (under the core's names, ``recovery.costs.Costs``) and the chart series
  ``result["charts"]``: ``tslrc`` (``recovery.figures.tslrc_sawtooth``), ``committed_cursor``
  (``recovery.figures.committed_frontier``) and ``fetched`` (``recovery.figures.fetched_cursor``);
- the typed tables the analysis keeps current, for what is drawn as it was reported:
  ``Generation`` (the core's status, committed_at, manifest cursor) and ``Attempt`` (start, end,
  restore).

The time-since-last-restorable sawtooth ends at the analysis' time; the figure extends its last
tooth to the page's ``now`` with the core's ``seconds_since_last_restorable``, the same call the
headline makes, so chart and headline agree.

No series ever reaches the browser with more than ``MAX_POINTS`` points per trace: long series go
through ``downsample``, which keeps each bucket's minimum and maximum so that sawtooth peaks and
drops survive. Figures are cached per run and analysis version (``run_figures``).
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

from django.core.cache import cache
from django.db.models.fields.json import KT
from django.utils import timezone
from django.utils.safestring import mark_safe

from recoverydash.alerts.rules import contract_of
from recoverydash.dashboard.queries import as_datetime, freshness, restarts_units
from recoverydash.recovery.counting import unit_word
from recoverydash.recovery.figures import seconds_since_last_restorable
from recoverydash.recovery.result import (
    AnalysisResult,
    Charts,
    CostsEntry,
    RestartEntry,
    StratumEntry,
)
from recoverydash.runs.models import Analysis, Attempt, Generation

MAX_POINTS = 2000
CACHE_SECONDS = 600

STATUS_STYLE = {  # word, marker symbol, colour: status is told by the legend word and the symbol
    "restorable": ("restorable", "circle", "#1a7f37"),
    "committed": ("committed, verifying", "diamond-open", "#6e7781"),
    "pending": ("pending (no manifest)", "circle-open", "#9a6700"),
    "rejected": ("rejected", "x", "#cf222e"),
    "abandoned": ("abandoned", "square-open", "#8c959f"),
}
FONT = ('-apple-system, "Segoe UI", "Helvetica Neue", Arial, "Noto Sans", sans-serif')


# --- downsampling ---------------------------------------------------------------------------------

def downsample(xs: list, ys: list, max_points: int = MAX_POINTS) -> tuple[list, list]:
    """At most ``max_points`` points of the series ``(xs, ys)`` (x in increasing order).

    The series is cut into ``max_points // 2`` buckets of consecutive points; each bucket keeps
    its lowest and highest point, in x order, so peaks and drops (the sawtooth of time since last
    restorable, a cursor falling back after a restart) are kept exactly; the first and last points
    are always kept. A series that already fits is returned as is. Runs in C-speed passes
    (slices, ``min``/``max``/``index``): 1,000,000 points take a few tens of milliseconds.
    """
    n = len(ys)
    if n != len(xs):
        raise ValueError(f"xs and ys differ in length: {len(xs)} != {n}")
    if n <= max_points:
        return list(xs), list(ys)
    buckets = max(1, (max_points - 2) // 2)
    size = n / buckets
    out_x, out_y = [xs[0]], [ys[0]]
    last_index = 0
    for b in range(buckets):
        lo, hi = int(b * size), int((b + 1) * size) if b < buckets - 1 else n
        if hi <= lo:
            continue
        seg = ys[lo:hi]
        i_min = lo + seg.index(min(seg))
        i_max = lo + seg.index(max(seg))
        for i in sorted({i_min, i_max}):
            if i != last_index and i != n - 1:
                out_x.append(xs[i])
                out_y.append(ys[i])
                last_index = i
    out_x.append(xs[-1])
    out_y.append(ys[-1])
    return out_x, out_y


def downsample_gapped(xs: list, ys: list, max_points: int = MAX_POINTS) -> tuple[list, list]:
    """``downsample`` for a series broken by gaps (``None`` values: a restart between attempts):
    each run of values gets a share of ``max_points`` in proportion to its length, and the gaps
    are kept as single ``None`` points so the line breaks there."""
    segments: list = []
    current: list = []
    for x, y in zip(xs, ys):
        if y is None:
            if current:
                segments.append(current)
            current = []
        else:
            current.append((x, y))
    if current:
        segments.append(current)
    total = sum(len(seg) for seg in segments)
    out_x: list = []
    out_y: list = []
    for seg in segments:
        budget = max(4, int(max_points * len(seg) / total) - 1)
        sx, sy = downsample([p[0] for p in seg], [p[1] for p in seg], budget)
        if out_x:
            out_x.append(sx[0])
            out_y.append(None)
        out_x.extend(sx)
        out_y.extend(sy)
    return out_x, out_y


def thin(items: list, max_points: int = MAX_POINTS) -> list:
    """Every k-th item so that at most ``max_points`` remain (first and last kept); for point
    clouds (generations) where no extremum matters more than another."""
    n = len(items)
    if n <= max_points:
        return list(items)
    step = math.ceil(n / (max_points - 1))
    out = items[::step]
    if out[-1] is not items[-1]:
        out.append(items[-1])
    return out


# --- helpers --------------------------------------------------------------------------------------

def _iso(value) -> str | None:
    moment = as_datetime(value)
    return moment.isoformat() if moment else None


def _isos(values: list) -> list:
    """Times as RFC 3339 strings; POSIX seconds converted in one pass."""
    if values and isinstance(values[0], (int, float)):

        return [datetime.fromtimestamp(v, tz=UTC).isoformat() for v in values]
    return list(values)


def seconds_unit(max_seconds: float) -> tuple[float, str]:
    """(divisor, unit word) for an axis of durations whose largest value is ``max_seconds``."""
    if max_seconds >= 3 * 3600:
        return 3600.0, "hours"
    if max_seconds >= 3 * 60:
        return 60.0, "minutes"
    return 1.0, "seconds"


def base_layout(title: str, **extra) -> dict:
    layout = {
        "title": {"text": title, "x": 0, "xanchor": "left", "font": {"size": 15}},
        "font": {"family": FONT, "size": 12, "color": "#1f2328"},
        "margin": {"l": 56, "r": 16, "t": 40, "b": 40},
        "legend": {"orientation": "h", "y": -0.18, "x": 0},
        "paper_bgcolor": "#ffffff", "plot_bgcolor": "#ffffff",
        "xaxis": {"gridcolor": "#eaeef2", "zeroline": False},
        "yaxis": {"gridcolor": "#eaeef2", "zeroline": False},
        "height": 320,
    }
    layout.update(extra)
    return layout


def empty_figure(title: str, message: str) -> dict:
    """A figure with no data and a sentence saying why, so an empty chart is never a blank box."""
    layout = base_layout(title)
    layout["xaxis"] = {"visible": False}
    layout["yaxis"] = {"visible": False}
    layout["annotations"] = [{"text": message, "showarrow": False, "xref": "paper",
                              "yref": "paper", "x": 0.5, "y": 0.5, "font": {"color": "#57606a"}}]
    return {"data": [], "layout": layout, "empty": True}


# --- figure data from the tables ------------------------------------------------------------------

def run_window(run, attempts: list, now: datetime, stored=None) \
        -> tuple[datetime | None, datetime | None]:
    """Start (first event) and end of the run for time axes: now while the live attempt is
    open, else the last event (an earlier attempt that never reported its end was superseded by
    the newest one: it keeps no ended run's axis running to now). The live attempt is the
    core's (``runs.live.pick_live`` of the stored result ``stored``): a cancelled duplicate
    does not end the axis of a run still training (docs/definitions.md#concurrent-attempts)."""
    from recoverydash.runs.live import pick_live

    start = run.first_event_at or (attempts[0].started_at if attempts else None)
    live = pick_live([(a.pk, a.attempt, a.ended_at) for a in attempts], stored)
    open_attempt = live is None or live[2] is None
    end = now if open_attempt else (run.last_event_at or now)
    return start, end


def tslrc_series(result: AnalysisResult, now: datetime, first_event_at: datetime | None = None) \
        -> tuple[list, list]:
    """The core's sawtooth of seconds since the last restorable generation
    (``result["charts"]["tslrc"]``, ``recovery.figures.tslrc_sawtooth``) as (times, seconds),
    its last tooth extended from the analysis' time to ``now`` by the core's
    ``seconds_since_last_restorable`` (what the headline shows). An ended run's series stops at
    its end. ``([], [])`` when the stored analysis has no series."""
    block = result.get("charts", {}).get("tslrc")
    xs: list = list(block.get("time") or []) if block else []
    ys: list = list(block.get("seconds") or []) if block else []
    if not xs:
        return [], []
    current = seconds_since_last_restorable(result, now, first_event_at)
    last = as_datetime(xs[-1])
    if result.get("ended_at") is None and current is not None and last is not None \
            and last < now:
        xs.append(now.isoformat())
        ys.append(current)
    return xs, ys


# --- figures --------------------------------------------------------------------------------------

def generations_figure(generations: list[dict], attempts: list, window: tuple) -> dict:
    """Generations over time by status (docs/definitions.md#generation-status: restorable,
    committed, pending, rejected, abandoned): x the commit time (else the start of the save), y the
    update the generation holds. Attempts are shaded bands from start to end; failures
    (``attempt_ended`` reason ``failed``, or an attempt that stopped without ending) are marked with
    a cross and restores (an attempt resumed from a generation) with a triangle at the restored
    update.

    ``generations``: dicts with generation_id, update, status, time; ``attempts``: Attempt rows.
    """
    if not generations:
        return empty_figure("Generations over time, by status",
                            "No checkpoint reported yet: no generation to draw.")
    data = _status_traces(generations)
    shapes, annotations = [], []
    failures: list[tuple[str, int, str]] = []
    restores: list[tuple[str, int, str]] = []
    for i, a in enumerate(attempts):
        band = _attempt_band(i, a, window)
        if band:
            shapes.append(band[0])
            annotations.append(band[1])
        failure = _failure_point(a, a is attempts[-1])
        if failure:
            failures.append(failure)
        restore = _restore_point(a)
        if restore:
            restores.append(restore)
    if failures:
        data.append(_point_trace("failure", failures, "%{text}<br>last update %{y:,}",
                                 {"symbol": "x-thin", "size": 14, "color": "#cf222e",
                                  "line": {"width": 3, "color": "#cf222e"}}))
    if restores:
        data.append(_point_trace("restore", restores, "%{text}<br>at update %{y:,}",
                                 {"symbol": "triangle-up", "size": 12, "color": "#0969da"}))
    layout = base_layout("Generations over time, by status", shapes=shapes,
                         annotations=annotations)
    layout["yaxis"]["title"] = {"text": "update"}
    layout["yaxis"]["rangemode"] = "tozero"
    return time_figure({"data": data, "layout": layout}, window)


def _status_traces(generations: list[dict]) -> list[dict]:
    """One marker trace per status of ``STATUS_STYLE`` that has generations with a time (thinned
    to ``MAX_POINTS``; the legend counts them all)."""
    data = []
    for status, (word, symbol, colour) in STATUS_STYLE.items():
        points = [g for g in generations if g["status"] == status and g["time"] is not None]
        if not points:
            continue
        count = sum(1 for g in generations if g["status"] == status)
        points = thin(points, MAX_POINTS)
        data.append({
            "type": "scattergl" if len(points) > 1000 else "scatter", "mode": "markers",
            "name": f"{word} ({count:,})",
            "x": [g["time"] for g in points], "y": [g["update"] for g in points],
            "text": [g["generation_id"] for g in points],
            "hovertemplate": "%{text}<br>update %{y:,}<br>%{x}<extra>" + word + "</extra>",
            "marker": {"symbol": symbol, "color": colour, "size": 8,
                       "line": {"width": 1.5, "color": colour}},
        })
    return data


def _attempt_band(i: int, a, window: tuple) -> tuple[dict, dict] | None:
    """The shaded band of the ``i``-th attempt ``a`` (from its start to its end) and its label,
    or None when neither end is known. An open attempt's band ends at its last sign of life, so a
    silent run does not squash the chart into its first days (the TSLRC chart keeps running to
    now)."""
    start, end = window
    a_start = a.started_at or start
    last_seen = max([t for t in (a.last_event_at, a.heartbeat_at, a.last_update_at,
                                 a.restored_at, a.started_at) if t is not None], default=None)
    a_end = a.ended_at or last_seen or end
    if not (a_start and a_end):
        return None
    shape = {"type": "rect", "xref": "x", "yref": "paper",
             "x0": a_start.isoformat(), "x1": a_end.isoformat(), "y0": 0, "y1": 1,
             "fillcolor": "#0969da" if i % 2 == 0 else "#8250df", "opacity": 0.06,
             "line": {"width": 0}, "layer": "below"}
    label = {"x": a_start.isoformat(), "y": 1, "xref": "x", "yref": "paper",
             "text": f"attempt {a.attempt}", "showarrow": False,
             "xanchor": "left", "yanchor": "top", "font": {"size": 11, "color": "#57606a"}}
    return shape, label


def _failure_point(a, last: bool) -> tuple[str, int, str] | None:
    """(time, update, text) of attempt ``a``'s failure: ended ``failed``, or stopped without
    ending while a later attempt exists (``last`` False); None otherwise or without a time."""
    if not (a.end_reason == "failed" or (a.ended_at is None and not last)):
        return None
    t = a.ended_at or a.last_event_at
    if not t:
        return None
    update = a.end_update if a.end_update is not None else a.last_update
    text = f"attempt {a.attempt} failed" + (f": {a.end_message[:80]}" if a.end_message else "")
    return t.isoformat(), update, text


def _restore_point(a) -> tuple[str, int, str] | None:
    """(time, restored update, text) of attempt ``a``'s restore, or None when it resumed from
    nothing or its time is unknown."""
    if not a.resumed_from:
        return None
    t = a.restored_at or a.started_at
    if not t:
        return None
    resumed = a.resumed_from or {}
    name = resumed.get("generation_id") or "an untracked state"
    return t.isoformat(), resumed.get("update", 0), f"attempt {a.attempt} restored {name}"


def _point_trace(name: str, points: list[tuple[str, int, str]], hover: str,
                 marker: dict) -> dict:
    """A marker trace of (time, update, text) ``points``."""
    return {"type": "scatter", "mode": "markers", "name": name,
            "x": [p[0] for p in points], "y": [p[1] for p in points],
            "text": [p[2] for p in points], "hovertemplate": hover + "<extra></extra>",
            "marker": marker}


def time_figure(figure: dict, window: tuple | None) -> dict:
    """Mark ``figure`` as one of the run page's time charts: a date x axis over the run's window
    (``run_window``), so every time chart shows the same range and follows the page's time range
    and zoom (static/dashboard/charts.js). ``window``: (start, end) datetimes or None."""
    figure["time_axis"] = True
    layout = figure["layout"]
    layout["xaxis"] = dict(layout.get("xaxis") or {}, type="date")
    start, end = window or (None, None)
    if start and end and start < end:
        layout["xaxis"]["range"] = [start.isoformat(), end.isoformat()]
    return figure


def data_range(values: list) -> list:
    """``[0, top]`` for a y axis scaled to ``values`` (numbers, None skipped): 8 % above the
    largest value, ``[0, 1]`` when every value is 0 or there is none."""
    top = max([v for v in values if v is not None] or [0])
    return [0, top * 1.08 if top > 0 else 1]


def tslrc_figure(xs: list, seconds: list, limit_s: float, window: tuple | None = None) -> dict:
    """docs/definitions.md#seconds-since-last-restorable over the run (``tslrc_series``: the
    core's sawtooth, which grows with the clock and drops to zero at each restorable commit of the
    live lineage), with the contract's
    ``max_checkpoint_age_s`` as a dashed line (``checkpoint_stale`` fires above it). Downsampled
    with ``downsample`` (peaks kept). The y axis is scaled to the data, not to the limit: the
    limit line is visible only when it lies inside that range, else an annotation names it
    (``limit`` says where it is, for the page's time-range and zoom changes)."""
    if not xs:
        return empty_figure("Time since last restorable checkpoint", "No event received yet.")
    xs, seconds = downsample(xs, seconds)
    div, unit = seconds_unit(max(seconds))
    x_iso = [x.isoformat() if isinstance(x, datetime) else x for x in xs]
    data: list[dict[str, Any]] = [
        {"type": "scatter", "mode": "lines", "name": "time since last restorable",
         "x": x_iso, "y": [round(s / div, 3) for s in seconds],
         "line": {"color": "#0969da", "width": 2},
         "hovertemplate": "%{y:.2f} " + unit + "<extra></extra>"},
        {"type": "scatter", "mode": "lines", "name": f"limit (max_checkpoint_age_s = {limit_s:g})",
         "x": [x_iso[0], x_iso[-1]], "y": [limit_s / div, limit_s / div],
         "line": {"color": "#cf222e", "width": 2, "dash": "dash"}, "hoverinfo": "skip",
         "meta": "limit"},
    ]
    layout = base_layout("Time since last restorable checkpoint")
    layout["yaxis"]["title"] = {"text": unit}
    layout["yaxis"]["range"] = data_range(data[0]["y"])
    limit = limit_s / div
    above = limit > layout["yaxis"]["range"][1]
    data[1]["visible"] = not above
    layout["annotations"] = [limit_note(limit_s, div, unit)] if above else []
    figure = {"data": data, "layout": layout,
              "limit": {"y": limit, "note": limit_note(limit_s, div, unit)}}
    return time_figure(figure, window)


def limit_note(limit_s: float, div: float, unit: str) -> dict:
    """The annotation that names the contract limit when it lies above the visible range: two
    short lines inside the plot's top right corner (on a phone's narrow chart one long line, or
    one above the plot, was cut off)."""
    return {"text": f"limit {limit_s / div:,.4g} {unit}: above this range<br>"
                    f"(max_checkpoint_age_s = {limit_s:g})", "showarrow": False,
            "xref": "paper", "yref": "paper", "x": 1, "y": 1, "xanchor": "right",
            "yanchor": "top", "align": "right", "bgcolor": "rgba(255,255,255,0.85)",
            "font": {"size": 11, "color": "#cf222e"}}


def cursors_figure(committed: dict | None, fetched: dict, restorable: dict,
                   window: tuple | None = None) -> dict:
    """Cursors against time, per stratum (wire cursors, the position of the next sample):
    *committed* (docs/definitions.md#frontier of each attempt's own updates after each committed
    update: ``recovery.figures.committed_frontier``), *fetched* (the read cursor of heartbeats and
    ``attempt_ended``, read from the source, committed or not: ``recovery.figures.fetched_cursor``)
    and *restorable*
    (``data_progress.cursor`` of each restorable generation, held until the next one). The gap
    between fetched and committed is what a crash makes the next attempt recompute; between
    committed and restorable, what it loses. Each trace downsampled with ``downsample``."""
    data = []
    dash = {"committed": "solid", "fetched": "dot", "restorable": "solid"}
    colours = ["#0969da", "#8250df", "#bf3989", "#1b7c83", "#953800"]
    strata = sorted(set((committed or {}).get("cursor", {})) | set(fetched) | set(restorable))
    for i, stratum in enumerate(strata):
        colour = colours[i % len(colours)]
        label = f" · {stratum}" if len(strata) > 1 else ""
        if committed and stratum in committed.get("cursor", {}):
            xs, ys = downsample_gapped(committed["t"], committed["cursor"][stratum])
            if xs:
                data.append({"type": "scattergl" if len(xs) > 1000 else "scatter",
                             "mode": "lines", "name": "committed" + label, "x": _isos(xs),
                             "y": ys, "line": {"color": colour, "width": 2}})
        if stratum in fetched:
            xs, ys = downsample(*fetched[stratum])
            data.append({"type": "scatter", "mode": "lines+markers", "name": "fetched" + label,
                         "x": _isos(xs), "y": ys,
                         "line": {"color": colour, "width": 1.5, "dash": dash["fetched"]},
                         "marker": {"symbol": "circle-open", "size": 6}})
        if stratum in restorable:
            xs, ys = downsample(*restorable[stratum])
            data.append({"type": "scatter", "mode": "lines+markers",
                         "name": "restorable" + label, "x": _isos(xs), "y": ys,
                         "line": {"color": "#1a7f37", "width": 2, "shape": "hv"},
                         "marker": {"symbol": "circle", "size": 6}})
    if not data:
        return empty_figure("Cursors against time", "No committed update or heartbeat yet.")
    layout = base_layout("Committed, fetched and restorable cursors")
    layout["yaxis"]["title"] = {"text": "position"}
    return time_figure({"data": data, "layout": layout}, window)


def restart_positions_figure(restarts: list[RestartEntry]) -> dict:
    """Per restart (docs/definitions.md#replayed, #omitted, #recomputed):
    positions ``replayed`` (consumed again within the
    lineage), ``omitted`` (skipped, never consumed) and ``recomputed`` (redone after a rollback:
    the price of the restart, never a defect), as grouped bars labelled with their values; the
    title and axis say the restarts' unit (``tokens`` for token strata,
    docs/definitions.md#units)."""
    if not restarts:
        return empty_figure("Positions per restart", "No restart yet: the run has one attempt.")
    words = unit_word(restarts_units(restarts))
    x = [f"attempt {r['attempt']}" for r in restarts]
    series = [("replayed", "#cf222e", ""), ("omitted", "#9a6700", "/"),
              ("recomputed", "#6e7781", ".")]
    data = [{"type": "bar", "name": name, "x": x, "y": [r.get(name) or 0 for r in restarts],
             "marker": {"color": colour, "pattern": {"shape": pattern}},
             "text": [f"{r.get(name) or 0:,}" for r in restarts], "textposition": "outside",
             "cliponaxis": False}
            for name, colour, pattern in series]
    layout = base_layout(f"{words[0].upper()}{words[1:]} per restart", barmode="group")
    layout["yaxis"]["title"] = {"text": words}
    layout["yaxis"]["rangemode"] = "tozero"
    return {"data": data, "layout": layout}


def restart_seconds_figure(restarts: list[RestartEntry]) -> dict:
    """Per restart (docs/definitions.md#lost-seconds, #recovery-seconds): ``lost_seconds`` (from the
    commit of the restored update to the failure) and ``recovery_seconds`` (from the failure to the
    first committed update of the new attempt). A value not known yet is drawn as no bar and
    labelled."""
    if not restarts:
        return empty_figure("Lost and recovery time per restart", "No restart yet.")
    x = [f"attempt {r['attempt']}" for r in restarts]
    lost = [r.get("lost_seconds") for r in restarts]
    recovery = [r.get("recovery_seconds") for r in restarts]
    top = max([v or 0 for v in lost + recovery] or [0])
    div, unit = seconds_unit(top)
    data = []
    for name, values, colour in (("lost", lost, "#cf222e"),
                                 ("recovery", recovery, "#0969da")):
        data.append({"type": "bar", "name": f"{name} ({unit})", "x": x,
                     "y": [None if v is None else round(v / div, 2) for v in values],
                     "text": ["not known yet" if v is None else f"{v / div:,.1f}"
                              for v in values],
                     "textposition": "outside", "cliponaxis": False,
                     "marker": {"color": colour}})
    layout = base_layout("Lost and recovery time per restart", barmode="group")
    layout["yaxis"]["title"] = {"text": unit}
    layout["yaxis"]["rangemode"] = "tozero"
    return {"data": data, "layout": layout}


def strata_figure(strata: list[StratumEntry]) -> dict:
    """Per stratum (docs/definitions.md#duplicate-rate, #omission-rate):
    ``duplicate_rate`` = duplicates /
    consumed and ``omission_rate`` = omissions / (omissions + distinct consumed), in percent,
    labelled with the counts behind them."""
    if not strata:
        return empty_figure("Duplicate and omission rates per stratum",
                            "No committed update yet.")
    x = [s["stratum"] for s in strata]
    data = [
        {"type": "bar", "name": "duplicate rate (%)", "x": x,
         "y": [100.0 * (s.get("duplicate_rate") or 0) for s in strata],
         "text": [f"{100.0 * (s.get('duplicate_rate') or 0):.4g}% ({s.get('duplicates', 0):,})"
                  for s in strata],
         "textposition": "outside", "cliponaxis": False, "marker": {"color": "#cf222e"}},
        {"type": "bar", "name": "omission rate (%)", "x": x,
         "y": [100.0 * (s.get("omission_rate") or 0) for s in strata],
         "text": [f"{100.0 * (s.get('omission_rate') or 0):.4g}% ({s.get('omissions', 0):,})"
                  for s in strata],
         "textposition": "outside", "cliponaxis": False,
         "marker": {"color": "#9a6700", "pattern": {"shape": "/"}}},
    ]
    layout = base_layout("Duplicate and omission rates per stratum", barmode="group")
    layout["yaxis"]["title"] = {"text": "% of positions"}
    layout["yaxis"]["rangemode"] = "tozero"
    return {"data": data, "layout": layout}


def interval_figure(costs: CostsEntry | dict) -> dict:
    """docs/definitions.md#young-interval (sqrt(2 x measured save cost x MTBF), the interval
    that minimises expected loss) beside docs/definitions.md#observed-interval (the interval the
    run actually uses), both as the core computed them (``costs["young_interval_seconds"]``,
    ``costs["observed_interval_seconds"]``)."""
    young, observed = costs.get("young_interval_seconds"), costs.get("observed_interval_seconds")
    if young is None and observed is None:
        return empty_figure("Checkpoint interval",
                            "Needs at least one failure and one measured save.")
    values = [young, observed]
    div, unit = seconds_unit(max(v or 0 for v in values))
    labels = ["Young interval", "interval in use"]
    data = [{"type": "bar", "orientation": "h", "y": labels,
             "x": [None if v is None else round(v / div, 2) for v in values],
             "text": ["unknown" if v is None else f"{v / div:,.1f} {unit}" for v in values],
             "textposition": "outside", "cliponaxis": False,
             "marker": {"color": ["#1a7f37", "#0969da"]},
             "showlegend": False, "hoverinfo": "skip"}]
    layout = base_layout("Checkpoint interval: Young against in use", height=220)
    layout["xaxis"]["title"] = {"text": unit}
    # room right of the longest bar for its label, and the category labels never cut
    layout["xaxis"]["range"] = [0, max(v or 0 for v in values) / div * 1.45 or 1]
    layout["yaxis"]["automargin"] = True
    layout["margin"]["l"] = 16
    return {"data": data, "layout": layout}


# --- assembling the run page's figures ------------------------------------------------------------

def committed_from_core(charts_block: Charts | dict | None) -> dict | None:
    """The core's ``committed_cursor`` (per attempt, points with a cursor list) as columns
    ``{"t", "update", "cursor": {stratum: [...]}}`` in time order, with a gap (None) between
    attempts so that a restart shows as a break in the line, not a slope."""
    per_attempt = (charts_block or {}).get("committed_cursor") or []
    if not per_attempt:
        return None
    strata = sorted({c.get("stratum", "") for a in per_attempt for p in a.get("points", [])
                     for c in p.get("cursor") or []})
    t: list = []
    updates: list = []
    cursor: dict[str, list] = {s: [] for s in strata}
    for a in sorted(per_attempt, key=lambda a: (a.get("points") or [{}])[0].get("time") or ""):
        points = a.get("points") or []
        if not points:
            continue
        if t:
            t.append(points[0]["time"])
            updates.append(None)
            for s in strata:
                cursor[s].append(None)
        for p in points:
            t.append(p["time"])
            updates.append(p.get("update"))
            here = {c.get("stratum", ""): c.get("position") for c in p.get("cursor") or []}
            for s in strata:
                cursor[s].append(here.get(s))
    return {"t": t, "update": updates, "cursor": cursor}


def fetched_from_core(charts_block: Charts | dict | None) -> dict | None:
    """The core's heartbeat read cursors as ``{stratum: (times, positions)}``; None if absent."""
    per_attempt = (charts_block or {}).get("fetched")
    if per_attempt is None:
        return None
    points: dict = {}
    for a in per_attempt:
        for p in a.get("points") or []:
            for c in p.get("fetched") or []:
                points.setdefault(c.get("stratum", ""), []).append((p["time"], c.get("position")))
    return {s: ([x for x, _ in sorted(pts)], [y for _, y in sorted(pts)])
            for s, pts in points.items()}


def _restorable_series(gen_rows: list) -> dict:
    """``data_progress.cursor`` of restorable generations at their commit time, per stratum."""
    out: dict = {}
    for g in gen_rows:
        if g["status"] != "restorable" or not g["time"]:
            continue
        for c in g.get("cursor") or []:
            xs, ys = out.setdefault(c.get("stratum", ""), ([], []))
            xs.append(g["time"])
            ys.append(c.get("position"))
    return out


def build_run_figures(run, now: datetime | None = None) -> dict:
    """Every figure of the run page, by name, from the stored analysis and the run's tables.
    Uncached; see ``run_figures``."""
    now = now or timezone.now()
    # One read of the whole result: PostgreSQL detoasts the document once per key expression,
    # so several key lookups on a large result cost more than one full read (bench/dashboard.py).
    stored = Analysis.objects.filter(run=run).values_list("result", flat=True).first()
    result: AnalysisResult = stored if stored else {}
    attempts = list(Attempt.objects.filter(run=run).order_by("attempt"))
    window = run_window(run, attempts, now, result)
    gen_rows = []
    rows = list(Generation.objects.filter(run=run).order_by("update", "pk").values_list(
        "generation_id", "update", "status", "committed_at", "started_at",
        KT("manifest__data_progress__cursor")))
    # The cursors arrive as JSON text and are decoded in one C-speed pass, not one per row.
    cursors = json.loads("[" + ",".join(r[5] or "null" for r in rows) + "]")
    for (gid, update, status, committed_at, started_at, _), cursor in zip(rows, cursors):
        t = committed_at or started_at
        gen_rows.append({"generation_id": gid, "update": update or 0, "status": status,
                         "time": t.isoformat() if t else None, "commit": committed_at,
                         "cursor": cursor})
    xs, ys = tslrc_series(result, now, run.first_event_at)
    core_charts = result.get("charts")
    committed = committed_from_core(core_charts)
    fetched = fetched_from_core(core_charts) or {}
    restarts = result.get("restarts") or []
    return {
        "generations": generations_figure(gen_rows, attempts, window),
        "tslrc": tslrc_figure(xs, ys, float(contract_of(run)["max_checkpoint_age_s"]), window),
        "cursors": cursors_figure(committed, fetched,
                                  _restorable_series(gen_rows), window),
        "restart_positions": restart_positions_figure(restarts),
        "restart_seconds": restart_seconds_figure(restarts),
        "strata": strata_figure(result.get("strata") or []),
        "interval": interval_figure(result.get("costs") or {}),
    }


def run_figures(run, now: datetime | None = None) -> dict:
    """The run page's figures, cached per run and analysis version (computed_at, absorbed and
    current ingest seq) for up to a minute of wall clock: the sawtooth's last point grows with the
    clock, everything else changes only with a new analysis."""
    a = Analysis.objects.filter(run=run).values("computed_at", "ingest_seq").first()
    version = freshness(run, a)["version"]
    bucket = int((now or timezone.now()).timestamp() // 60)
    key = f"rd:figures:{run.pk}:{version}:{bucket}"
    cached = cache.get(key)
    if cached is None:
        figures = build_run_figures(run, now)
        cached = (figures, script_json({"version": version, "figures": figures}))
        cache.set(key, cached, CACHE_SECONDS)
    figures, text = cached
    return {"version": version, "figures": figures, "json": text}


def script_json(payload: dict) -> str:
    """``payload`` as compact JSON that is safe inside ``<script type="application/json">``
    (``<``, ``>`` and ``&`` escaped, as Django's ``json_script`` does), marked safe. Serialised
    once per analysis version and cached with the figures: the run page and ``charts.json``
    send the same string."""
    text = json.dumps(payload, separators=(",", ":"), allow_nan=False, default=str)
    # three C-speed replaces: str.translate with a mapping walks the text in Python-level
    # lookups (68 ms for the 750 KiB page of bench/dashboard.py, against about 1 ms)
    return mark_safe(text.replace("&", "\\u0026").replace("<", "\\u003C")
                     .replace(">", "\\u003E"))


def points_in(figure: dict) -> int:
    """Total points of a figure's traces (for tests and the bench: what reaches the browser)."""
    return sum(len(t.get("x") or t.get("y") or []) for t in figure.get("data", []))

