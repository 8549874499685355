"""The analysis result's shape, defined once: :class:`AnalysisResult` is what
:meth:`.analysis.RunAnalysis.to_dict` returns, what ``Analysis.result`` stores and what the
dashboard, the read API (docs/ingest-v1.md#5-reading-the-analysis), the metrics and the alert
rules read.

These are TypedDicts: the value stays the JSON-ready dict it always was (stored as it is, read
back from jsonb as a plain dict), while every reader annotated with the type has its keys
checked by mypy (``mypy --follow-imports=silent`` on the core and the readers, CONTRIBUTING.md):
a key renamed here, or misspelled by a reader, fails the type check instead of a page.

Times are RFC 3339 strings with an offset (:func:`.inputs.format_time`) unless said otherwise;
durations are seconds. A result stored by an older version may lack a key added since: readers
of the stored dict use ``.get`` with a default for those (``generations_summary``,
``update_interval``, ``undecided``, ``first_event_at``, ``ended_at``).
"""
# no ``from __future__ import annotations``: NotRequired must be seen when the classes are made,
# so that ``__required_keys__`` is right at run time (typing reads string annotations as required)
from typing import NotRequired, TypedDict


class ReasonEntry(TypedDict):
    """A reason, note or finding: ``{"code", "detail"}`` (:class:`.generations.Reason`)."""

    code: str
    detail: str


class CursorEntry(TypedDict):
    """A wire cursor (docs/ingest-v1.md#3-positions-spans-and-cursors): the next position to be
    delivered in ``(stratum, epoch)``; a read cursor may carry its ``order``."""

    stratum: str
    epoch: int
    position: int
    order: NotRequired[str]


class LastRestorableEntry(TypedDict):
    """docs/definitions.md#last-restorable: the newest restorable generation of the live
    lineage."""

    generation_id: str
    update: int | None
    committed_at: str | None


class GenerationEntry(TypedDict):
    """One generation and its status (docs/definitions.md#generation-status); ``notes`` only
    when there are any (:func:`.generations.adopted_notes`)."""

    generation_id: str
    attempt: int
    update: int | None
    status: str
    reasons: list[ReasonEntry]
    notes: NotRequired[list[ReasonEntry]]


class GenerationsSummary(TypedDict):
    """Every generation counted by status; ``shown``: how many ``generations`` lists
    (:func:`.analysis.generations_summary`)."""

    total: int
    shown: int
    by_status: dict[str, int]


class RestartEntry(TypedDict):
    """One restart (docs/definitions.md#expected-cursor to #verdict, :class:`.restarts.Restart`):
    counts in ``units``, seconds as wall seconds."""

    attempt: int
    resumed_from: str | None
    resumed_update: int
    world_size_before: int | None
    world_size_after: int | None
    expected_cursor: list[CursorEntry]
    resume_cursor: list[CursorEntry]
    replayed: int
    omitted: int
    recomputed: int
    lost_updates: int
    lost_seconds: float | None
    recovery_seconds: float | None
    verdict: str
    units: str
    findings: list[ReasonEntry]


class StratumEntry(TypedDict):
    """One stratum's counts (docs/definitions.md#consumed to #omission-rate,
    :class:`.counting.StratumCount`)."""

    stratum: str
    consumed: int
    duplicates: int
    omissions: int
    duplicate_rate: float
    omission_rate: float
    units: str


class IncidentEntry(TypedDict):
    """What one restart cost (docs/definitions.md#cost-of-recovery)."""

    attempt: int
    lost_updates: int
    lost_seconds: float | None
    recovery_seconds: float | None


class CostsEntry(TypedDict):
    """The run's recovery costs (:class:`.costs.Costs`; docs/definitions.md#goodput, #mtbf,
    #save-cost, #young-interval, #observed-interval)."""

    incidents: list[IncidentEntry]
    wall_seconds: float
    useful_seconds: float
    goodput: float | None
    failures: int
    mtbf_seconds: float | None
    median_save_seconds: float | None
    young_interval_seconds: float | None
    observed_interval_seconds: float | None
    findings: list[ReasonEntry]


class TslrcSeries(TypedDict):
    """:func:`.figures.tslrc_sawtooth`: seconds since the last restorable generation over the
    run."""

    time: list[str]
    seconds: list[float]


class CursorPoint(TypedDict):
    """A point of :func:`.figures.committed_frontier`: the frontier after a committed update."""

    time: str
    update: int
    cursor: list[CursorEntry]


class CommittedSeries(TypedDict):
    """One attempt's :func:`.figures.committed_frontier` series."""

    attempt: int
    points: list[CursorPoint]


class FetchedPoint(TypedDict):
    """A point of :func:`.figures.fetched_cursor`: a read cursor (rank None at the end)."""

    time: str
    rank: int | None
    update: int | None
    fetched: list[CursorEntry]


class FetchedSeries(TypedDict):
    """One attempt's :func:`.figures.fetched_cursor` series."""

    attempt: int
    points: list[FetchedPoint]


class Charts(TypedDict):
    """The core's chart series."""

    committed_cursor: list[CommittedSeries]
    fetched: list[FetchedSeries]
    tslrc: TslrcSeries


class UpdateInterval(TypedDict):
    """:func:`.figures.update_interval`: the newest attempt's median update interval, seconds."""

    attempt: int | None
    median_s: float | None


class UndecidedEntry(TypedDict):
    """:func:`.figures.undecided_generations`: a committed generation not decided yet;
    ``reasons``: the codes it has."""

    generation_id: str
    update: int | None
    committed_at: str | None
    live: bool
    reasons: list[str]


class AnalysisResult(TypedDict, total=False):
    """A run's analysis as :meth:`.analysis.RunAnalysis.to_dict` returns it and
    ``Analysis.result`` stores it: spec 5's fields (docs/ingest-v1.md#5-reading-the-analysis)
    and the extensions. The core writes every key; the type makes none required because a
    stored result may be ``{}`` (no analysis yet) or predate a key, so readers use ``.get``."""

    run_id: str
    health: str
    last_restorable: LastRestorableEntry | None
    seconds_since_last_restorable: float | None
    updates_at_risk: int
    generations: list[GenerationEntry]
    generations_summary: GenerationsSummary
    restarts: list[RestartEntry]
    strata: list[StratumEntry]
    costs: CostsEntry
    charts: Charts
    restorable_elsewhere: list[str]
    first_event_at: str | None
    ended_at: str | None
    update_interval: UpdateInterval | None
    undecided: list[UndecidedEntry]
    #: docs/definitions.md#concurrent-attempts: the live attempt (the one still committing) and
    #: the newest attempt the analysis saw; None without attempts
    live_attempt: NotRequired[int | None]
    newest_attempt: NotRequired[int | None]


class ClockLastRestorable(TypedDict):
    """The part of ``last_restorable`` a :class:`ClockFields` keeps."""

    committed_at: float | str | None


class ClockUndecided(TypedDict):
    """An :class:`UndecidedEntry` of the stored clock: its ``committed_at`` as POSIX seconds."""

    generation_id: str
    update: int | None
    committed_at: float | None
    live: bool
    reasons: list[str]


class ClockFields(TypedDict, total=False):
    """What :func:`.figures.seconds_since_last_restorable` reads of an analysis when it is not a
    whole :class:`AnalysisResult`: a few keys of one, read alone from the stored result, or the
    stored clock (``runs.models.clock_of``: times as POSIX seconds, ``undecided`` only the
    live lineage's). Times: POSIX seconds or RFC 3339 strings."""

    last_restorable: ClockLastRestorable | LastRestorableEntry | None
    first_event_at: float | str | None
    ended_at: float | str | None
    update_interval: UpdateInterval
    undecided: list[ClockUndecided]
    live_attempt: int | None
    newest_attempt: int | None
