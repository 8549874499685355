"""The whole analysis of a run: :func:`analyze` and :func:`restore_plan`
(docs/ingest-v1.md#5-reading-the-analysis).

Every figure is computed by a function named after it (:mod:`.figures`, :mod:`.costs`,
:mod:`.restarts`, :mod:`.counting`, :mod:`.generations`), each reading the run through one
:class:`~.view.RunView`; this module only wires them together and renders the result.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from .concurrency import mark_concurrent
from .costs import Costs, cost_basis, costs_at
from .epochs import count_strata
from .figures import (
    committed_frontier,
    fetched_cursor,
    health_at,
    health_basis,
    last_restorable,
    logger_rewind_update,
    newer_undecided,
    restorable_on,
    run_ended_at,
    seconds_since_last_restorable,
    tslrc_sawtooth,
    undecided_generations,
    unseen_resume_entry,
    update_interval,
    updates_at_risk,
)
from .generations import GenerationVerdict, Reason, evaluate_generations
from .inputs import RunInput, format_time
from .ledger import Ledger
from .lineage import Lineage
from .restarts import Restart, analyse_restart, first_restart
from .result import AnalysisResult, Charts, GenerationsSummary, UndecidedEntry, UpdateInterval
from .view import DEFAULT_SETTLE_SECONDS, RunView


@dataclass
class RunAnalysis:
    """Everything the dashboard and the read API show for one run. Times are POSIX seconds;
    :meth:`to_dict` renders spec 5's fields (times as RFC 3339 with offset) plus ``costs``,
    ``charts``, ``restorable_elsewhere``, ``first_event_at`` and ``ended_at`` (the clock of
    :func:`.figures.seconds_since_last_restorable`, so that a reader of the stored dict computes
    the same figure at a later ``now``).

    ``charts``: ``committed_cursor`` (:func:`.figures.committed_frontier`), ``fetched``
    (:func:`.figures.fetched_cursor`) and ``tslrc`` (:func:`.figures.tslrc_sawtooth`)."""

    run_id: str
    now: float
    health: str
    last_restorable: GenerationVerdict | None
    seconds_since_last_restorable: float | None
    updates_at_risk: int
    generations: list = field(default_factory=list)
    restarts: list = field(default_factory=list)
    strata: list = field(default_factory=list)
    costs: Costs = field(default_factory=Costs)
    charts: Charts = field(default_factory=lambda: Charts(committed_cursor=[], fetched=[],
                                                          tslrc={"time": [], "seconds": []}))
    live_attempt: int | None = None
    #: the newest attempt number the analysis saw (None: no attempt); with ``live_attempt``
    #: what readers of stored state take the live attempt from
    #: (:func:`.concurrency.stored_live_attempt`)
    newest_attempt: int | None = None
    #: restorable generations outside the live lineage (ids, by update), and per id the reason
    #: ``not_in_live_lineage`` the restore plan's 409 gives for it
    restorable_elsewhere: list = field(default_factory=list)
    elsewhere_reasons: dict = field(default_factory=dict)
    #: the generations the restore plan passes over undecided (:func:`.figures.newer_undecided`
    #: of ``last_restorable`` on the live lineage), ``[{"generation_id", "update", "status"}]``
    newer_undecided: list = field(default_factory=list)
    #: the generations committed and not decided yet (:func:`.figures.undecided_generations`)
    undecided: list = field(default_factory=list)
    #: the run's first event; when it ended (:func:`.figures.run_ended_at`), None while open
    first_event_at: float | None = None
    ended_at: float | None = None
    #: the newest attempt's median update interval (:func:`.figures.update_interval`):
    #: ``{"attempt", "median_s"}``, what the silence rules compare reporters' ages with
    update_interval: UpdateInterval | None = None
    #: what the clock-driven figures are recomputed from at a later time without the inputs
    #: (:func:`clock_basis`), None when they cannot be
    clock_basis: dict | None = None

    def to_dict(self) -> AnalysisResult:
        """Spec 5's fields and ours (see the class docstring), shaped as
        :class:`.result.AnalysisResult`. ``generations`` is bounded (:func:`shown_generations`);
        ``generations_summary`` counts them all."""
        last = self.last_restorable
        shown = shown_generations(self.generations, last)
        return {
            "run_id": self.run_id,
            "health": self.health,
            "last_restorable": None if last is None else {
                "generation_id": last.generation_id, "update": last.update,
                "committed_at": format_time(last.committed_at)},
            "seconds_since_last_restorable": self.seconds_since_last_restorable,
            "updates_at_risk": self.updates_at_risk,
            "generations": [g.to_dict() for g in shown],
            "generations_summary": generations_summary(self.generations, len(shown)),
            "restarts": [r.to_dict() for r in self.restarts],
            "strata": [s.to_dict() for s in self.strata],
            "costs": self.costs.to_dict(),
            "charts": self.charts,
            "restorable_elsewhere": list(self.restorable_elsewhere),
            "first_event_at": format_time(self.first_event_at),
            "ended_at": format_time(self.ended_at),
            "update_interval": self.update_interval,
            "live_attempt": self.live_attempt,
            "newest_attempt": self.newest_attempt,
            "undecided": [UndecidedEntry(
                generation_id=g["generation_id"], update=g["update"],
                committed_at=format_time(g["committed_at"]), live=g["live"],
                reasons=g["reasons"]) for g in self.undecided],
        }


#: At most this many generations are listed in full in :meth:`RunAnalysis.to_dict`
#: (docs/definitions.md#generation-status, "Listed generations").
GENERATIONS_SHOWN = 200


def shown_generations(verdicts: list, last: GenerationVerdict | None = None) -> list:
    """The generations a result lists in full: the newest :data:`GENERATIONS_SHOWN` of
    ``verdicts`` (in their order, by update then start), and ``last`` (the last restorable)
    when it is older; in the order of ``verdicts``. Every one when there are no more."""
    if len(verdicts) <= GENERATIONS_SHOWN:
        return list(verdicts)
    cut = len(verdicts) - GENERATIONS_SHOWN
    return [v for i, v in enumerate(verdicts)
            if i >= cut or (last is not None and v.generation_id == last.generation_id)]


def generations_summary(verdicts: list, shown: int) -> GenerationsSummary:
    """``{"total": int, "shown": int, "by_status": {status: int}}``: every generation counted
    by status; ``shown`` how many the result lists in full (:func:`shown_generations`)."""
    by_status: dict = {}
    for v in verdicts:
        by_status[v.status] = by_status.get(v.status, 0) + 1
    return {"total": len(verdicts), "shown": shown, "by_status": dict(sorted(by_status.items()))}


#: Keys of :meth:`RunAnalysis.to_dict` that may change with the analysis time alone while the
#: run's inputs stay the same (the clock-driven figures: health through the checkpoint age,
#: :func:`.figures.seconds_since_last_restorable`, the costs' wall time and what divides by it,
#: and the ``tslrc`` chart's last point), and the chart series among them. Everything else is a
#: function of the inputs and of the settle rule only.
CLOCK_DRIVEN_KEYS = ("health", "seconds_since_last_restorable", "costs")
CLOCK_DRIVEN_CHARTS = ("tslrc",)


def split_clock_driven(result: Mapping[str, Any]) -> tuple[dict, dict]:
    """``(rest, clock_driven)`` of a :meth:`RunAnalysis.to_dict` (or a stored copy of one):
    ``clock_driven`` holds :data:`CLOCK_DRIVEN_KEYS` and, under ``charts``,
    :data:`CLOCK_DRIVEN_CHARTS`; ``rest`` every other key (``charts`` without those series).
    ``rest | clock_driven`` with the two ``charts`` merged is ``result`` again. Neither dict
    is a deep copy."""
    rest = {k: v for k, v in result.items() if k not in CLOCK_DRIVEN_KEYS}
    charts = dict(result.get("charts") or {})
    timed = {k: result[k] for k in CLOCK_DRIVEN_KEYS if k in result}
    timed["charts"] = {k: charts.pop(k) for k in CLOCK_DRIVEN_CHARTS if k in charts}
    rest["charts"] = charts
    return rest, timed


def analyze(run: RunInput | RunView, now: float, ledger: Ledger | None = None,
            settle_seconds: float = DEFAULT_SETTLE_SECONDS, judged: dict | None = None,
            fill: dict | None = None, repeats: dict | None = None, checks: dict | None = None,
            checks_fill: dict | None = None, absorbed: dict | None = None) -> RunAnalysis:
    """Analyse a run at time ``now`` (POSIX seconds; the core never reads the clock).

    ``run``: a RunInput, or a :class:`~.view.RunView` already built over a ledger. ``ledger``:
    the run's compact ledger state (e.g. loaded with ``Ledger.from_bytes`` and fed with
    ``Ledger.absorb``); when given, ``run.ledger`` is ignored, else it is built from
    ``run.ledger``. Every figure reads the run through one RunView (lineages, counts, frontiers,
    epoch lengths, global batches), built once here. ``settle_seconds``: how old (at ``now``) an
    update's first report must be for it to count although a rank's part of it never arrived
    (docs/definitions.md#updates-counted-once-complete). ``judged`` and ``fill``: the
    generations' local judgements kept by the caller and the fresh ones
    (:func:`.generations.evaluate_generations`; the result is the same with or without them);
    ``repeats``: :func:`.generations.state_repeats` of the run's generations worked out by the
    caller (:func:`.generations.continue_repeats`), the same result; ``checks``,
    ``checks_fill`` and ``absorbed``: the data cursor comparisons kept by the caller, the fresh
    ones, and the lowest update per attempt the ledger absorbed since they were made
    (:func:`.generations.evaluate_generations`), the same result.
    Returns a RunAnalysis; raises ValueError on a malformed span range."""
    if isinstance(run, RunView):
        view = run
    else:
        view = RunView(run, ledger if ledger is not None else Ledger.from_records(run.ledger),
                       now, settle_seconds)
    run, attempts = view.run, view.attempts
    contract = run.effective_contract()
    first_event = run.first_event_at
    if first_event is None:
        known = [a.started_at for a in attempts.values() if a.started_at is not None]
        first_event = min(known) if known else now
    live = view.live  # the newest attempt; None when there are none
    if live is None:
        empty = RunAnalysis(run.run_id, now, "ok", None, None, 0, first_event_at=first_event)
        basis: dict[str, Any] = {
            "format": CLOCK_BASIS_FORMAT, "now": now, "settle_seconds": settle_seconds,
            "earliest_unsettled": None, "first_event_at": first_event,
            "last_committed_at": None, "ended_at": None, "health": None, "costs": None,
            "restorable": []}
        empty.clock_basis = basis if run.first_event_at is not None else None
        empty.seconds_since_last_restorable = seconds_since_last_restorable(empty, now)
        empty.charts = {"committed_cursor": [], "fetched": [],
                        "tslrc": tslrc_sawtooth([], first_event, now)}
        return empty
    verdicts = evaluate_generations(view, contract["required_components"], judged, fill,
                                    repeats, checks, checks_fill, absorbed)
    status = {v.generation_id: v.status for v in verdicts}
    numbers = list(attempts)
    restarts: list[Restart] = [analyse_restart(view, number, before, status.get)
                               for before, number in zip(numbers, numbers[1:])]
    first = first_restart(view, numbers[0])  # it resumed what the server never saw
    if first is not None:
        restarts.insert(0, first)
    mark_concurrent(view, restarts)
    live_lineage = view.lineage(live)
    strata = count_strata(view, view.settled(live_lineage))
    on_lineage = restorable_on(verdicts, live_lineage)
    last = last_restorable(verdicts, live_lineage)
    live_ids = {v.generation_id for v in on_lineage}
    elsewhere = [v for v in verdicts
                 if v.status == "restorable" and v.generation_id not in live_ids]
    why = _why_not_live(attempts, view.resumes, live, live_lineage)
    reasons = {v.generation_id: Reason("not_in_live_lineage", (
        f"{why}; {v.generation_id} (attempt {v.attempt}) is restorable in attempt {v.attempt}'s "
        f"lineage")) for v in elsewhere}
    analysis = RunAnalysis(run.run_id, now, "", last, None,
                           updates_at_risk(view.ledger, live_lineage, last), verdicts, restarts,
                           strata, live_attempt=live, newest_attempt=max(attempts),
                           restorable_elsewhere=[v.generation_id for v in elsewhere],
                           elsewhere_reasons=reasons, first_event_at=first_event,
                           ended_at=run_ended_at(attempts[live]))
    analysis.update_interval = update_interval(view.ledger, live)
    analysis.newer_undecided = newer_undecided(verdicts, live_lineage, last)
    analysis.undecided = undecided_generations(verdicts, live_lineage, last)
    unseen = unseen_resume_entry(view.resumes.get(live), attempts[live].started_at,
                                 set(view.generations))
    if unseen is not None:
        analysis.undecided.insert(0, unseen)
    try:
        basis_costs = cost_basis(view.ledger, attempts, live_lineage, restarts, verdicts,
                                 on_lineage, first_event)
    except Exception as exc:  # noqa: BLE001 - the cost figures must never take the verdicts down
        basis_costs = {"unavailable": f"{type(exc).__name__}: {exc}"}
    basis = {
        "format": CLOCK_BASIS_FORMAT, "now": now, "settle_seconds": settle_seconds,
        "earliest_unsettled": view.earliest_unsettled(), "first_event_at": first_event,
        "last_committed_at": None if last is None else last.committed_at,
        "ended_at": analysis.ended_at,
        "health": health_basis(attempts[live], contract, last, restarts, verdicts),
        "costs": basis_costs,
        "restorable": [[v.update, v.committed_at] for v in on_lineage]}
    timed = _clock_driven(basis, now)
    analysis.seconds_since_last_restorable = timed["seconds_since_last_restorable"]
    analysis.costs = timed["costs"]
    analysis.health = timed["health"]
    analysis.charts = {
        "committed_cursor": committed_frontier(view.ledger, attempts, view.resumes),
        "fetched": fetched_cursor(view.beats, attempts),
        "tslrc": timed["tslrc"],
    }
    # a first event taken from ``now`` (none known) moves with the clock: no basis then
    analysis.clock_basis = basis if first_event is not None and (
        run.first_event_at is not None
        or any(a.started_at is not None for a in attempts.values())) else None
    return analysis


#: Format of :func:`clock_basis`'s dict; a basis of another one is not used.
CLOCK_BASIS_FORMAT = 1


def clock_basis(analysis: RunAnalysis) -> dict | None:
    """What :func:`clock_driven_at` recomputes the clock-driven figures from, as a JSON-ready
    dict of finite numbers (None when the analysis has none, or a value is not finite):
    ``now`` and ``settle_seconds`` of the analysis, ``earliest_unsettled``
    (:meth:`.view.RunView.earliest_unsettled`), ``first_event_at``, ``last_committed_at`` and
    ``ended_at`` (POSIX seconds or None), ``health`` (:func:`.figures.health_basis`, None for a
    run without attempts), ``costs`` (:func:`.costs.cost_basis`, or ``{"unavailable":
    detail}``, None without attempts) and ``restorable`` (``[update, committed_at]`` of the
    live lineage's restorable generations, :func:`.figures.tslrc_sawtooth`'s input). Its size
    grows with the restorable generations and restarts, never with updates or heartbeats."""
    basis = analysis.clock_basis
    if basis is None or not _finite(basis):
        return None
    return basis


def _finite(value) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(_finite(v) for v in value)
    return True


def clock_driven_at(basis, now: float, settle_seconds: float) -> dict | None:
    """The clock-driven part of the analysis at ``now`` (POSIX seconds), as
    :func:`split_clock_driven` gives it of :meth:`RunAnalysis.to_dict` (``health``,
    ``seconds_since_last_restorable``, ``costs``, ``charts: {"tslrc"}``), computed from
    ``basis`` (:func:`clock_basis` of an analysis of the same inputs) without the inputs: equal
    to that of a full :func:`analyze` of the same inputs at ``now``, whose other keys then equal
    those of the analysis the basis came from.

    None when that does not hold or cannot be told: ``basis`` missing or of another
    :data:`CLOCK_BASIS_FORMAT`, ``now`` before the basis' own time, ``settle_seconds`` not the
    basis' own, or an update unsettled at the basis' time settling by age at ``now``
    (docs/definitions.md#updates-counted-once-complete: counts, frontiers and verdicts may
    change then, so the caller analyses in full)."""
    if not isinstance(basis, dict) or basis.get("format") != CLOCK_BASIS_FORMAT:
        return None
    if not now >= basis["now"] or settle_seconds != basis["settle_seconds"]:
        return None
    earliest = basis["earliest_unsettled"]
    if earliest is not None and not now - settle_seconds < earliest:
        return None
    timed = _clock_driven(basis, now)
    return {"health": timed["health"],
            "seconds_since_last_restorable": timed["seconds_since_last_restorable"],
            "costs": timed["costs"].to_dict(), "charts": {"tslrc": timed["tslrc"]}}


def _clock_driven(basis: dict, now: float) -> dict:
    """``{"seconds_since_last_restorable", "health", "costs" (Costs), "tslrc"}`` at ``now`` from
    a clock basis (the one computation :func:`analyze` and :func:`clock_driven_at` share)."""
    first_event, ended = basis["first_event_at"], basis["ended_at"]
    last = basis["last_committed_at"]
    clock = SimpleNamespace(
        last_restorable=None if last is None else SimpleNamespace(committed_at=last),
        first_event_at=first_event, ended_at=ended)
    since = seconds_since_last_restorable(clock, now)
    if basis["health"] is None:  # a run without attempts
        return {"seconds_since_last_restorable": since, "health": "ok", "costs": Costs(),
                "tslrc": tslrc_sawtooth([], first_event, now)}
    found = basis["costs"]
    if "unavailable" in found:
        spent = Costs(findings=[{"code": "costs_unavailable", "detail": found["unavailable"]}])
    else:
        try:
            spent = costs_at(found, now)
        except Exception as exc:  # noqa: BLE001 - the cost figures never take the verdicts down
            spent = Costs(findings=[{"code": "costs_unavailable",
                                     "detail": f"{type(exc).__name__}: {exc}"}])
    return {"seconds_since_last_restorable": since,
            "health": health_at(basis["health"], since, now - first_event), "costs": spent,
            "tslrc": tslrc_sawtooth([tuple(p) for p in basis["restorable"]], first_event,
                                    now if ended is None else min(now, ended))}


def _why_not_live(attempts: dict, resumes: dict, live: int, lineage: Lineage) -> str:
    """Why a generation off the live lineage cannot be restored into it (restore plan 409)."""
    root = lineage.root
    resume = resumes[root]
    if lineage.unknown_root:
        if resume.generation_id is not None:
            return f"attempt {root} resumed from unknown generation {resume.generation_id}"
        if attempts[root].resumed_from is not None:
            return f"attempt {root} resumed from an untracked state (no generation named)"
        return f"attempt {root} resumed from unknown (no attempt_started)"
    if root == live:
        return f"the live attempt {live} started fresh"
    return f"the live lineage of attempt {live} starts with attempt {root} (fresh)"


@dataclass
class RestorePlan:
    """Spec 5 restore-plan answer: ``status_code`` 200 with the generation to load, or 409 with
    ``{"error": "no_restorable_generation", "rejected": [...]}``."""

    status_code: int
    body: dict

    def to_dict(self) -> dict:
        return self.body


def restore_plan(source, world_size: int | None = None, dataset_version: str | None = None,
                 config_digest: str | None = None, now: float | None = None) -> RestorePlan:
    """Which generation a restarting trainer should load (spec 5, restore-plan).

    ``source`` is a RunAnalysis, or a RunInput (analysed at ``now``, default: its latest event
    time). The answer is the newest restorable generation of the live lineage, with its
    manifest's objects and data cursor, and warnings ``world_size_changed``,
    ``dataset_version_changed`` (restart finding codes) and ``config_digest_changed`` when the
    given values differ from the manifest's, and ``newer_undecided`` (extension,
    :func:`.figures.newer_undecided`). Without one: 409 listing every generation that is
    not restorable in the live lineage with its status and reasons; a generation restorable in
    another lineage (``restorable_elsewhere``) is listed with status ``restorable`` and the reason
    ``not_in_live_lineage``."""
    if isinstance(source, RunInput):
        times = [r.time for r in source.ledger] + [a.last_event_at for a in source.attempts
                                                   if a.last_event_at is not None]
        source = analyze(source, now if now is not None else max(times, default=0.0))
    last = source.last_restorable
    if last is None:
        elsewhere = source.elsewhere_reasons
        return RestorePlan(409, {"error": "no_restorable_generation", "rejected": [
            {"generation_id": g.generation_id, "status": g.status,
             "reasons": [r.to_dict() for r in g.reasons] + (
                 [elsewhere[g.generation_id].to_dict()] if g.generation_id in elsewhere else [])}
            for g in source.generations
            if g.status != "restorable" or g.generation_id in elsewhere]})
    manifest = last.manifest or {}  # the one generation whose objects are read
    warnings = []
    for code, wanted, have in (("world_size_changed", world_size, manifest.get("world_size")),
                               ("dataset_version_changed", dataset_version,
                                manifest.get("dataset_version")),
                               ("config_digest_changed", config_digest,
                                manifest.get("config_digest"))):
        if wanted is not None and have is not None and wanted != have:
            warnings.append({"code": code, "detail": f"generation has {have!r}, "
                                                     f"restart asks for {wanted!r}"})
    return RestorePlan(200, {
        "generation_id": last.generation_id, "update": last.update,
        "logger_rewind_update": logger_rewind_update(last),
        "committed_at": format_time(last.committed_at),
        "objects": list(manifest.get("objects") or []),
        "cursor": list((manifest.get("data_progress") or {}).get("cursor") or []),
        "warnings": warnings,
        "newer_undecided": list(source.newer_undecided)})
