"""Run-level figures and chart series, each defined here once and named after the number.

Pages, alert rules, the read API, list endpoints and metrics import these functions; nothing
outside the core recomputes them. Each docstring cites its definition in ``docs/definitions.md``.
Times are POSIX seconds (UTC) unless a docstring says otherwise.

Figures: :func:`last_restorable`, :func:`seconds_since_last_restorable`,
:func:`checkpoint_stale`, :func:`updates_at_risk`, :func:`health`, :func:`run_ended_at`,
:func:`logger_rewind_update`, :func:`median_update_interval`, :func:`reporter_ages`,
:func:`youngest_silent`, :func:`silence_limit`, :func:`silent_reporters`, :func:`attempt_silent`,
:func:`newer_undecided`, :func:`undecided_generations`, :func:`awaited`.
Chart series: :func:`tslrc_sawtooth`, :func:`committed_frontier`, :func:`fetched_cursor`.
Per-restart figures are in :mod:`.restarts`, per-stratum counts in :mod:`.counting`, costs in
:mod:`.costs`, generation statuses in :mod:`.generations`.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .heartbeats import CHART_POINTS
from .inputs import AttemptRecord, format_time, parse_time
from .lineage import cursor_of
from .result import TslrcSeries, UpdateInterval

#: CHART_POINTS (from :mod:`.heartbeats`): points per attempt in the committed frontier series,
#: and between it and twice it in the fetched cursor series.
#: Attempt end reasons after which the run is over (health ``ended``).
ENDED_REASONS = ("completed", "cancelled")


def last_restorable(verdicts: list, lineage) -> Any:
    """docs/definitions.md#restorable: the newest ``restorable`` generation whose state lies on
    ``lineage`` (the live lineage), newest by its place on the lineage (attempt and order of
    commit, then update: :meth:`.lineage.Lineage.place`, docs/definitions.md#renumbered-updates),
    then ``committed_at``; None when there is none. ``verdicts``: GenerationVerdict list;
    returns one of them."""
    on_lineage = restorable_on(verdicts, lineage)
    return max(on_lineage, key=lambda v: (lineage.place(v.attempt, v.update),
                                          v.committed_at or 0.0), default=None)


def restorable_on(verdicts: list, lineage) -> list:
    """The ``restorable`` generations (GenerationVerdict) whose state lies on ``lineage``
    (:meth:`.lineage.Lineage.contains_state`), in the order given."""
    return [v for v in verdicts if v.status == "restorable" and v.update is not None
            and lineage.contains_state(v.attempt, v.update)]


#: Statuses of a generation whose restorability is not decided yet
#: (docs/definitions.md#generation-status): ``pending`` (no manifest has reached it) and
#: ``committed`` (manifest in, not proven yet: objects not verified, storage that could not check
#: them, a ledger behind its update). A restore plan's 409 listing one of them does not say that
#: nothing is restorable (the SDK's ``restore_plan`` lets storage decide then).
UNDECIDED = ("committed", "pending")
#: At most this many generations in a restore plan's ``newer_undecided`` (the newest).
NEWER_UNDECIDED_SHOWN = 20


def newer_undecided(verdicts: list, lineage, named) -> list[dict]:
    """docs/definitions.md#newer-undecided: the generations a restore plan naming ``named``
    passes over without knowing yet whether they could be loaded: status ``committed`` or
    ``pending`` (:data:`UNDECIDED`), a state on ``lineage`` (the live lineage,
    :meth:`.lineage.Lineage.contains_state`: a generation a restart rolled back is not listed)
    later on it than ``named``'s (:meth:`.lineage.Lineage.place`; by update when ``named`` is
    not on it). Newest first (by update, then generation id), at most
    :data:`NEWER_UNDECIDED_SHOWN`: ``[{"generation_id": str, "update": int, "status": str}]``.

    ``verdicts``: GenerationVerdict list; ``named``: the GenerationVerdict the plan names (None,
    or one without an update: an empty list)."""
    if named is None or named.update is None:
        return []
    floor = lineage.place(named.attempt, named.update) if named.attempt is not None else None
    out = [v for v in verdicts if v.status in UNDECIDED and v.update is not None
           and v.attempt is not None and lineage.contains_state(v.attempt, v.update)
           and _later(lineage.place(v.attempt, v.update), floor, v.update, named.update)]
    out.sort(key=lambda v: (v.update, v.generation_id), reverse=True)
    return [{"generation_id": v.generation_id, "update": v.update, "status": v.status}
            for v in out[:NEWER_UNDECIDED_SHOWN]]


#: At most this many generations in a result's ``undecided`` (the newest).
UNDECIDED_SHOWN = 200


def undecided_generations(verdicts: list, lineage, last) -> list[dict]:
    """docs/definitions.md#undecided-generations: the generations of status ``committed`` (a
    manifest in, not proven yet: objects not verified, storage that could not check them, or the
    ledger not settled at their update), each ``{"generation_id", "update", "committed_at"
    (POSIX seconds or None), "live", "reasons" (the codes it has, e.g. storage_unverified)}``;
    ``live``: its state lies on ``lineage`` (the live lineage) later than ``last``'s
    (:meth:`.lineage.Lineage.place`; anywhere when ``last`` is None), so it could still become
    the last restorable. Newest first (update, then id), at most :data:`UNDECIDED_SHOWN`.
    ``verdicts``: GenerationVerdict list; ``last``: the last restorable GenerationVerdict or
    None."""
    has_floor = last is not None and last.update is not None
    floor = lineage.place(last.attempt, last.update) if has_floor else None
    out = [v for v in verdicts if v.status == "committed"]
    out.sort(key=lambda v: (v.update if v.update is not None else -1, v.generation_id),
             reverse=True)
    return [{"generation_id": v.generation_id, "update": v.update,
             "committed_at": v.committed_at,
             "live": v.update is not None and v.attempt is not None
             and (not has_floor or _later(lineage.place(v.attempt, v.update), floor, v.update,
                                          last.update))
             and lineage.contains_state(v.attempt, v.update),
             "reasons": [r.code for r in v.reasons]} for v in out[:UNDECIDED_SHOWN]]


#: the reason code of :func:`unseen_resume_entry`
RESUMED_FROM_NOT_SEEN = "resumed_from_not_seen"


def unseen_resume_entry(resume, started_at: float | None, known: set) -> dict | None:
    """docs/definitions.md#undecided-generations: the generation the live attempt says it
    resumed from (``resume``: its :class:`.lineage.Resume`) when the server has not seen it
    (``resume.generation_id`` not in ``known``, the generation ids of the run), as an undecided
    entry of the live lineage: its manifest may still arrive or be discovered in storage, and
    the lineage before the resume is unknown until then, so rules that would read the live
    lineage as holding no restorable generation wait for it (from ``started_at``, the attempt's
    start, POSIX seconds) like for any undecided generation. ``update``: the declared update.
    None when the attempt resumed from nothing or from a generation the server has."""
    gid = getattr(resume, "generation_id", None)
    if resume is None or resume.kind != "untracked" or gid is None or gid in known:
        return None
    return {"generation_id": gid, "update": resume.declared_update,
            "committed_at": started_at, "live": True, "reasons": [RESUMED_FROM_NOT_SEEN]}


def _later(place, floor, update: int, floor_update: int) -> bool:
    """Whether a state at ``place`` on the live lineage (:meth:`.lineage.Lineage.place`, None:
    off it) comes after ``floor`` (the place of the generation compared with); by update
    number when either is off the lineage."""
    if place is not None and floor is not None:
        return place > floor
    return update > floor_update


def awaited(undecided: Sequence[Mapping[str, Any]], now,
            bound_s: float) -> tuple[list, list]:
    """docs/definitions.md#settled-evidence: ``(waiting, overdue)``, the entries of
    ``undecided`` (:func:`undecided_generations`, times POSIX seconds or RFC 3339 strings, as a
    stored result has them) committed less than ``bound_s`` seconds before ``now``, and the
    others (also those whose commit time is unknown). A rule that would read an undecided
    generation as absent or bad waits for it while it is waiting, never once it is overdue."""
    end = parse_time(now)
    waiting: list[Mapping] = []
    overdue: list[Mapping] = []
    for g in undecided:
        at = parse_time(g.get("committed_at"))
        (waiting if at is not None and end - at < bound_s else overdue).append(g)
    return waiting, overdue


def logger_rewind_update(restored) -> int | None:
    """docs/definitions.md#logger-rewind-update: the update a restarting trainer rewinds its
    loggers to (W&B ``resume_from`` / ``fork_from`` ``f"{run_id}?_step={update}"``, TensorBoard
    ``purge_step=update + 1``): the update of the generation it restores. Values a logger keyed
    by completed updates wrote at steps up to it belong to the restored state; those above it
    belong to updates the restart rolls back, and are logged again as the run redoes them.

    ``restored``: the generation to restore, a GenerationVerdict, a selection (anything with
    ``update``) or a stored ``last_restorable`` dict; None (nothing to restore, a fresh start)
    gives None."""
    if restored is None:
        return None
    update = restored.get("update") if isinstance(restored, Mapping) \
        else getattr(restored, "update", None)
    return update if isinstance(update, int) and not isinstance(update, bool) else None


def run_ended_at(newest: AttemptRecord) -> float | None:
    """When the run ended: the newest attempt's end (``attempt_ended`` time, else its last event)
    when it ended ``completed`` or ``cancelled``; None while the run may still lose work (open,
    or ended ``failed``/``preempted`` and not replaced yet)."""
    if newest.end_reason in ENDED_REASONS:
        return newest.failure_time()
    return None


def _times_of(analysis) -> tuple:
    """(last restorable commit, first event, end) of a RunAnalysis or of its stored dict."""
    if isinstance(analysis, Mapping):
        last = (analysis.get("last_restorable") or {}).get("committed_at")
        return parse_time(last), parse_time(analysis.get("first_event_at")), \
            parse_time(analysis.get("ended_at"))
    last = analysis.last_restorable
    return (last.committed_at if last is not None else None), analysis.first_event_at, \
        analysis.ended_at


def seconds_since_last_restorable(analysis, now, first_event_at=None) -> float | None:
    """docs/definitions.md#seconds-since-last-restorable, in seconds, never below 0.

    ``now`` minus ``committed_at`` of the newest restorable generation of the live lineage
    (:func:`last_restorable`); with none yet, ``now`` minus the run's first event. For a run that
    ended (:func:`run_ended_at`: completed or cancelled) the clock stops at its end: the figure is
    what was at risk when it ended, and it no longer grows. A negative difference (a commit time
    ahead of ``now``, clocks of two machines) is 0.

    ``analysis``: a :class:`~.analysis.RunAnalysis` or its ``to_dict()`` as stored (keys
    ``last_restorable.committed_at``, ``first_event_at``, ``ended_at``); ``first_event_at`` is
    used only when the stored dict has none (stored before the core wrote it). Times: POSIX
    seconds, RFC 3339 strings or aware datetimes. None when neither a restorable commit nor a
    first event is known."""
    last, first, ended = _times_of(analysis)
    since = last if last is not None else (first if first is not None
                                           else parse_time(first_event_at))
    if since is None:
        return None
    end = parse_time(now)
    if ended is not None:
        end = min(end, ended)
    return max(0.0, end - since)


def checkpoint_stale(seconds: float | None, max_checkpoint_age_s: float,
                     ended: bool = False) -> bool:
    """docs/definitions.md#seconds-since-last-restorable: the seconds since the last restorable
    generation (:func:`seconds_since_last_restorable`) exceed the contract's
    ``max_checkpoint_age_s`` (seconds; a limit of 0 makes every second stale). False when the
    seconds are unknown, and for a run that ended (``ended``: health ``ended``, see
    :func:`run_ended_at`): nothing more can be lost, so it never ages into staleness."""
    return not ended and seconds is not None and seconds > float(max_checkpoint_age_s)


#: ``run_silent``: the attempt is silent after this many median update intervals ...
RUN_SILENT_INTERVALS = 3
#: ... and never before this many seconds (the floor; RECOVERYDASH_RUN_SILENT_S overrides it).
RUN_SILENT_FLOOR_S = 900.0
#: ``rank_silent``: one reporter is silent after this many median update intervals ...
RANK_SILENT_INTERVALS = 5
#: ... and never before this many seconds (RECOVERYDASH_RANK_SILENT_FLOOR_S overrides it).
RANK_SILENT_FLOOR_S = 120.0


def median_update_interval(update_times) -> float | None:
    """docs/definitions.md#median-update-interval, in seconds: the median, over consecutive
    committed updates of one attempt in update order, of the time between them divided by how
    many updates they are apart (a gap of 3 updates in 30 s is 10 s per update); a negative
    difference (clocks of two machines) counts as 0.

    ``update_times``: ``{update: time}`` or ``[(update, time)]`` (POSIX seconds; the time an
    update was committed). None with fewer than two updates."""
    pairs = sorted(update_times.items() if isinstance(update_times, Mapping) else update_times)
    steps = []
    for (u0, t0), (u1, t1) in zip(pairs, pairs[1:]):
        if u1 > u0:
            steps.append(max(0.0, (t1 - t0) / (u1 - u0)))
    if not steps:
        return None
    steps.sort()
    mid = len(steps) // 2
    return steps[mid] if len(steps) % 2 else (steps[mid - 1] + steps[mid]) / 2


#: Committed updates the median update interval is taken over: the newest ones of the attempt.
MEDIAN_WINDOW_UPDATES = 100


def newest_update_times(ledger, attempt: int | None,
                        count: int = MEDIAN_WINDOW_UPDATES) -> list:
    """``[(update, time)]`` of the newest ``count`` committed updates attempt ``attempt``
    reported, in update order, each at its earliest report time (POSIX seconds, the trainer's
    clock) as the ledger state keeps it (``Ledger.update_time``): what
    :func:`median_update_interval` takes, read from the state alone, so compacted raw rows are
    never needed. Empty for an unknown attempt or one without updates."""
    state = ledger.attempts.get(attempt) if attempt is not None else None
    if state is None or not state.updates:
        return []
    updates = state.updates
    n = len(updates)
    out = []
    for i in range(max(0, n - count), n):
        when = state.update_time(updates[i])
        if when is not None:
            out.append((updates[i], when))
    return out


def update_interval(ledger, attempt: int | None) -> UpdateInterval:
    """docs/definitions.md#median-update-interval of attempt ``attempt`` (the newest), as the
    stored analysis keeps it for the silence rules: ``{"attempt": attempt, "median_s": seconds or
    None}`` (:func:`median_update_interval` of :func:`newest_update_times`)."""
    return {"attempt": attempt,
            "median_s": median_update_interval(newest_update_times(ledger, attempt))}


def reporter_ages(seen_at: Mapping, now) -> dict:
    """docs/definitions.md#last-event-age: per reporter of an attempt (``"<rank>"``, or ``"c"``
    for events without a rank), seconds from the last event the server received from it to
    ``now``, never below 0. ``seen_at``: ``{reporter: time}`` (POSIX seconds, RFC 3339 or aware
    datetimes, the server's receive clock); ``now`` likewise. Keys keep their order."""
    end = parse_time(now)
    return {k: max(0.0, end - parse_time(t)) for k, t in seen_at.items() if t is not None}


def silence_limit(median_interval: float | None, intervals: float, floor_s: float) -> float:
    """docs/definitions.md#silence: seconds of silence after which an attempt (``run_silent``)
    or one of its reporters (``rank_silent``) counts as silent: ``intervals`` times the
    :func:`median_update_interval`, never below ``floor_s`` (the floor alone when the median is
    unknown)."""
    if median_interval is None:
        return float(floor_s)
    return max(float(floor_s), intervals * float(median_interval))


def attempt_silent(ages: Mapping, median_interval: float | None,
                   floor_s: float = RUN_SILENT_FLOOR_S) -> float | None:
    """docs/definitions.md#silence: the seconds the whole attempt has been silent (the youngest
    of its reporters' :func:`reporter_ages`) when above ``silence_limit(median_interval,
    RUN_SILENT_INTERVALS, floor_s)``, else None (also None with no reporter)."""
    if not ages:
        return None
    return youngest_silent(min(ages.values()), median_interval, floor_s)


def youngest_silent(youngest: float, median_interval: float | None,
                    floor_s: float = RUN_SILENT_FLOOR_S) -> float | None:
    """:func:`attempt_silent` from the age of the attempt's youngest reporter alone (seconds; what
    a bulk read of the newest time per attempt gives): ``youngest`` when above the limit, else
    None."""
    limit = silence_limit(median_interval, RUN_SILENT_INTERVALS, floor_s)
    return youngest if youngest > limit else None


def silent_reporters(ages: Mapping, median_interval: float | None,
                     floor_s: float = RANK_SILENT_FLOOR_S, reporters: int | None = None) -> dict:
    """docs/definitions.md#silence: the reporters of an attempt that stopped while others keep
    reporting: ``{reporter: age}`` for each whose age is above ``silence_limit(median_interval,
    RANK_SILENT_INTERVALS, floor_s)`` while some reporter's is not. Empty when every reporter is
    silent (that is :func:`attempt_silent`) or none is. ``reporters``: how many reporters the
    attempt has when ``ages`` holds only some of them (every one above the limit, read in bulk
    by ``alerts.rules.silences_of``); default ``len(ages)``."""
    limit = silence_limit(median_interval, RANK_SILENT_INTERVALS, floor_s)
    silent = {k: a for k, a in ages.items() if a > limit}
    if not silent or len(silent) == (len(ages) if reporters is None else reporters):
        return {}
    return silent


def updates_at_risk(ledger, lineage, last) -> int:
    """docs/definitions.md#updates-at-risk: updates of ``lineage`` (the live lineage) committed
    after the last restorable generation ``last`` (a GenerationVerdict, None: every update of the
    lineage is at risk): every update of the segments newer than ``last``'s, and those of its
    own segment above its update (by attempt and order of commit:
    docs/definitions.md#renumbered-updates). Counted from the ledger's update bitmaps, never by
    walking updates."""
    place = lineage.place(last.attempt, last.update) if last is not None else None
    if place is None:  # none, or (by update number) one off the lineage
        floor = last.update if last is not None else None
        return sum(ledger.updates_in(seg.attempt, seg.after if floor is None
                                     else max(seg.after, floor), seg.upto)
                   for seg in lineage.segments)
    newer = lineage.segments[:len(lineage.segments) - 1 - place[0]]
    seg = lineage.segments[len(lineage.segments) - 1 - place[0]]
    return sum(ledger.updates_in(s.attempt, s.after, s.upto) for s in newer) \
        + ledger.updates_in(seg.attempt, max(seg.after, last.update), seg.upto)


def health(newest: AttemptRecord, contract: Mapping, last, seconds: float, age: float,
           restarts: list, verdicts: list) -> str:
    """docs/definitions.md#health, evaluated in this order:

    * ``ended``: the newest attempt ended ``completed`` or ``cancelled``;
    * ``failing``: no restorable generation on the live lineage (``last`` None) and more than
      ``max_checkpoint_age_s`` since the run's first event (``age``, seconds); or the last restart
      replayed more than ``max_replay_samples`` or omitted more than ``max_omission_samples``;
    * ``at_risk``: ``seconds`` (:func:`seconds_since_last_restorable`) above
      ``max_checkpoint_age_s``; or a generation newer than ``last`` was rejected; or the newest
      attempt ended ``failed``/``preempted`` and no attempt has replaced it yet;
    * ``ok`` otherwise.

    ``contract``: the effective contract (:func:`.contract.effective_contract`); ``restarts``:
    Restart list; ``verdicts``: GenerationVerdict list. The same as :func:`health_at` of
    :func:`health_basis`."""
    return health_at(health_basis(newest, contract, last, restarts, verdicts), seconds, age)


def health_basis(newest: AttemptRecord, contract: Mapping, last, restarts: list,
                 verdicts: list) -> dict:
    """What :func:`health` reads of a run apart from the clock, as a JSON-ready dict:
    ``ended`` (bool), ``restorable`` (``last`` is not None), ``max_age`` (the contract's
    ``max_checkpoint_age_s``, seconds), ``replay_failing`` (the last restart broke the replay
    or omission limit) and ``at_risk`` (a generation newer than ``last`` was rejected, or the
    newest attempt ended ``failed``/``preempted``). Arguments as :func:`health`'s."""
    replay_failing = False
    if restarts:
        final = restarts[-1]
        replay_failing = final.replayed > int(contract["max_replay_samples"]) \
            or final.omitted > int(contract["max_omission_samples"])
    newer_rejected = any(v.status == "rejected" and (last is None or (v.update or 0) > last.update)
                         for v in verdicts)
    return {"ended": newest.end_reason in ENDED_REASONS, "restorable": last is not None,
            "max_age": float(contract["max_checkpoint_age_s"]), "replay_failing": replay_failing,
            "at_risk": newer_rejected or newest.end_reason in ("failed", "preempted")}


def health_at(basis: Mapping, seconds: float | None, age: float) -> str:
    """docs/definitions.md#health (the order of :func:`health`) from ``basis``
    (:func:`health_basis`), ``seconds`` (:func:`seconds_since_last_restorable`) and ``age``
    (seconds since the run's first event)."""
    if basis["ended"]:
        return "ended"
    if not basis["restorable"] and age > basis["max_age"]:
        return "failing"
    if basis["replay_failing"]:
        return "failing"
    if checkpoint_stale(seconds, basis["max_age"]) or basis["at_risk"]:
        return "at_risk"
    return "ok"


#: At most this many teeth (resets) in the :func:`tslrc_sawtooth` series
#: (docs/definitions.md#seconds-since-last-restorable): a longer run keeps, in each of this many
#: equal slices of the series' time range, the tooth with the highest peak.
TSLRC_TEETH = 500


def tslrc_sawtooth(restorable: list, first_event_at: float, end: float) -> TslrcSeries:
    """docs/definitions.md#seconds-since-last-restorable as a series over the run: at each time
    t, t minus ``committed_at`` of the newest (by ``(update, committed_at)``) generation among
    ``restorable`` committed by t; before any, t minus ``first_event_at``.

    ``restorable``: ``(update, committed_at)`` of the restorable generations of the live lineage
    only (:func:`restorable_on`), so that the series drops to 0 exactly where the headline figure
    restarts and its last point equals :func:`seconds_since_last_restorable` at ``end`` (``now``,
    or the run's end). A generation committed later than a newer one (a slow save of a lower
    update) does not reset it. Returns ``{"time": [RFC 3339], "seconds": [float]}``: the origin
    at 0, then at each reset its peak and 0 at the same time, and the value at ``end``.

    Bounded: with more than :data:`TSLRC_TEETH` resets, the time range from the origin to the
    last point is cut into :data:`TSLRC_TEETH` equal slices and each slice keeps only its tooth
    with the highest peak (the earliest of equal ones): every kept peak and reset is exact, the
    highest peak of every slice is kept, and the last point is the headline's; between two kept
    teeth the drawn line joins them (the lower teeth in between are not drawn)."""
    commits = sorted((t, u) for u, t in restorable if t is not None and u is not None)
    origin = first_event_at
    teeth = []  # (reset time, peak)
    since, best = origin, None
    for t, update in commits:
        if best is not None and (update, t) <= best:
            continue
        best = (update, t)
        if t <= origin:
            since = t
            continue
        teeth.append((t, max(0.0, t - since)))
        since = t
    top = teeth[-1][0] if teeth else origin  # the last reset, kept or not
    last = max(end, top)
    if len(teeth) > TSLRC_TEETH:
        width = (last - origin) / TSLRC_TEETH
        kept: dict = {}
        for t, peak in teeth:
            slot = min(int((t - origin) / width), TSLRC_TEETH - 1) if width > 0 else 0
            if slot not in kept or peak > kept[slot][1]:
                kept[slot] = (t, peak)
        teeth = [kept[slot] for slot in sorted(kept)]
    times, seconds = [origin], [0.0]
    for t, peak in teeth:
        times += [t, t]
        seconds += [peak, 0.0]
    if end > top:
        times.append(end)
        seconds.append(max(0.0, end - since))
    return {"time": [format_time(t) for t in times], "seconds": seconds}


def committed_frontier(ledger, attempts, resumes) -> list:
    """docs/definitions.md#frontier against time, per attempt: after each committed update of an
    attempt, the frontier (max consumed position + 1) of the attempt's own updates above the
    update it resumed at, per stratum as cursors (the highest epoch, there the highest frontier;
    no cursor for sample-id strata). An attempt that resumed behind its checkpoint shows the drop
    (a replay); the lineage's frontier would hide it.

    Returns ``[{"attempt", "points": [{"time": RFC 3339, "update", "cursor": [Cursor]}]}]``, at
    most :data:`CHART_POINTS` points per attempt, evenly spaced in updates, the attempt's first
    and last update included. ``attempts``: attempt numbers; ``resumes``: ``{attempt: Resume}``
    (:func:`.lineage.resolve_resumes`)."""
    out = []
    for number in attempts:
        state = ledger.attempts.get(number)
        if state is None or not state.updates:
            continue
        low, high = state.updates.min(), state.updates.max()
        stride = max(1, (high - low) // (CHART_POINTS - 1))
        points: list[dict] = []
        for update in list(range(low, high + 1, stride))[:CHART_POINTS - 1] + [high]:
            if update not in state.updates or (points and points[-1]["update"] == update):
                continue
            frontier = ledger.frontier_in(number, resumes[number].after, update)
            points.append({"time": format_time(state.update_time(update)), "update": update,
                           "cursor": cursor_of(frontier, ledger.id_strata)})
        out.append({"attempt": number, "points": points})
    return out


def fetched_cursor(beats, attempts: dict) -> list:
    """docs/definitions.md#recomputed (read cursors, everything below them was read from the
    source, committed or not), per attempt in time order: the heartbeats' ``fetched`` cursors
    kept by the heartbeat fold (``beats``, a :class:`.heartbeats.HeartbeatFold`: every
    ``stride``-th heartbeat in the order absorbed, between :data:`CHART_POINTS` and twice that
    many), then the ``attempt_ended`` ``fetched`` at the end. ``attempts``: ``{number:
    AttemptRecord}``. Returns ``[{"attempt", "points": [{"time": RFC 3339, "rank", "update",
    "fetched": [Cursor]}]}]`` (rank None at the end)."""
    out = []
    for number in sorted(set(beats.attempts) | {n for n, a in attempts.items()
                                                 if a.end_fetched and a.ended_at is not None}):
        points = [{"time": format_time(t), "rank": rank, "update": update, "fetched": fetched}
                  for t, rank, update, fetched in beats.chart_points(number)]
        record = attempts.get(number)
        if record is not None and record.end_fetched and record.ended_at is not None:
            points.append({"time": format_time(record.ended_at), "rank": None,
                           "update": record.end_update, "fetched": list(record.end_fetched)})
        out.append({"attempt": number, "points": points})
    return out
