"""What the dashboard pages read: access checks and the queries behind each page.

Views call one function of this module (or of ``actions`` for writes) and render what it returns.
Every figure shown on a page comes from the stored analysis (``Analysis.result``, the recovery
core's ``to_dict()``: the fields of docs/ingest-v1.md#recovery plus ``costs`` and chart series)
or from the typed tables that ingest fills; the function that computes each one is named in its
docstring, with the definition in docs/definitions.md it shows.

Large parts of ``Analysis.result`` (chart series of a million updates) are never loaded for
pages that do not draw them: page queries pick the small keys with JSON key lookups.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import cast

from django.db.models import Count, Q, Sum
from django.db.models.fields.json import KeyTransform
from django.http import Http404
from django.utils import timezone

from recoverydash.alerts.models import Alert, Delivery, WebhookEndpoint
from recoverydash.alerts.rules import contract_of, silence_of
from recoverydash.checkpoints.objects import verification_progress
from recoverydash.recovery.counting import SAMPLES, TOKENS, unit_word, units_of
from recoverydash.recovery.figures import (
    checkpoint_stale,
    logger_rewind_update,
    seconds_since_last_restorable,
)
from recoverydash.recovery.restarts import cursor_gaps
from recoverydash.recovery.result import (
    AnalysisResult,
    CostsEntry,
    GenerationEntry,
    LastRestorableEntry,
    RestartEntry,
    StratumEntry,
)
from recoverydash.recovery.windows import first_window_comparison
from recoverydash.runs.models import (
    Analysis,
    ApiToken,
    Attempt,
    AuditWindow,
    Event,
    Generation,
    LedgerRow,
    Project,
    Run,
)

HEALTH_ORDER = {"failing": 0, "at_risk": 1, "ok": 2, "ended": 3}
HEALTH_WORDS = {"failing": "Failing", "at_risk": "At risk", "ok": "OK", "ended": "Ended",
                "unknown": "Not analysed yet"}
VERDICT_WORDS = {
    "exact": "Exact: the data stream continued where the checkpoint left it",
    "replay": "Replay: committed positions were trained on again",
    "omission": "Omission: positions were skipped and never trained on",
    "replay_and_omission": "Replay and omission: positions were both repeated and skipped",
    "unverified": "Unverified: the resumed attempt has not committed an update yet, the "
                  "lineage before the checkpoint is unknown, or the order changed and what the "
                  "restart replayed or skipped cannot be decided from the samples recorded "
                  "(see its findings)",
}
# Summary keys read from Analysis.result without loading the chart series.
SMALL_KEYS = ("health", "last_restorable", "updates_at_risk", "restarts", "strata", "costs",
              "first_event_at", "ended_at")
# What ``recovery.figures.seconds_since_last_restorable`` reads of a stored result.
CLOCK_KEYS = ("last_restorable", "first_event_at", "ended_at")


# --- access ---------------------------------------------------------------------------------------

def visible_projects(user):
    """Projects ``user`` may see: every project for a superuser, else those they are a member of."""
    if user.is_superuser:
        return Project.objects.all()
    return Project.objects.filter(memberships__user=user)


def project_for(user, pk: int) -> Project:
    """The project ``pk`` if ``user`` may see it; Http404 otherwise (never 403: an outsider must
    not learn that the project exists)."""
    project = visible_projects(user).filter(pk=pk).first()
    if project is None:
        raise Http404("no such project")
    return project


def run_for(user, pk: int) -> Run:
    """The run ``pk`` if ``user`` is a member of its project (or a superuser); Http404 otherwise."""
    run = (Run.objects.select_related("project")
           .filter(pk=pk, project__in=visible_projects(user)).first())
    if run is None:
        raise Http404("no such run")
    return run


def run_named(user, project: str, run_id: str) -> Run:
    """The run ``run_id`` of the project named ``project`` if ``user`` is a member of it (or a
    superuser); Http404 otherwise, the same for another project's run as for an unknown one."""
    run = (Run.objects.select_related("project")
           .filter(project__name=project, run_id=run_id,
                   project__in=visible_projects(user)).first())
    if run is None:
        raise Http404("no such run")
    return run


def alert_for(user, pk: int) -> Alert:
    """The alert ``pk`` of a run ``user`` may see; Http404 otherwise."""
    alert = (Alert.objects.select_related("run__project")
             .filter(pk=pk, run__project__in=visible_projects(user)).first())
    if alert is None:
        raise Http404("no such alert")
    return alert


# --- small helpers on stored values ---------------------------------------------------------------

def as_datetime(value) -> datetime | None:
    """A time of the stored analysis (RFC 3339 string or POSIX seconds) as an aware datetime."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value
    if isinstance(value, (int, float)):
        return datetime.fromtimestamp(value, tz=UTC)
    moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _limit_of(run) -> float:
    return float(contract_of(run)["max_checkpoint_age_s"])


def freshness(run, analysis) -> dict:
    """How fresh the stored analysis is: ``computed_at`` and ``pending_analysis``
    (docs/ingest-v1.md#recovery: true while the run's ingest seq is ahead of the seq the analysis
    absorbed)."""
    if analysis is None:
        return {"computed_at": None, "pending": run.ingest_seq > 0, "version": "none"}
    computed_at = analysis["computed_at"] if isinstance(analysis, dict) else analysis.computed_at
    seq = analysis["ingest_seq"] if isinstance(analysis, dict) else analysis.ingest_seq
    return {"computed_at": computed_at, "pending": run.ingest_seq > seq,
            "version": f"{computed_at.timestamp():.6f}:{seq}:{run.ingest_seq}"}


# --- fleet ----------------------------------------------------------------------------------------

@dataclass
class FleetRow:
    """One run on the fleet page."""

    run: Run
    health: str
    seconds_since_restorable: float | None  # docs/definitions.md#seconds-since-last-restorable
    limit_s: float                          # contract max_checkpoint_age_s
    last_restorable: dict | None            # docs/definitions.md#last-restorable
    updates_at_risk: int | None             # docs/definitions.md#updates-at-risk
    open_alerts: int
    last_restart: dict | None               # the last of ``restarts``
    computed_at: datetime | None
    pending: bool
    critical_alerts: int = 0
    warning_alerts: int = 0
    last_event_at: datetime | None = None   # the last event received (server clock)
    attempt: int | None = None              # the live attempt number (runs.live)
    attempt_state: str = "running"          # running / silent / ended (``_attempt_state``)
    ratio: float = 0.0                      # docs/definitions.md#at-risk-ratio
    drill: bool = False

    @property
    def over_limit(self) -> bool:
        """The core's ``checkpoint_stale`` (the alert rule's comparison; never for an ended
        run)."""
        return checkpoint_stale(self.seconds_since_restorable, self.limit_s,
                                ended=self.health == "ended")

    @property
    def logger_rewind_update(self) -> int | None:
        """The core's ``logger_rewind_update`` of the last restorable generation: where a
        restart from it rewinds its loggers (docs/definitions.md#logger-rewind-update)."""
        return logger_rewind_update(self.last_restorable)

    @property
    def age_share(self) -> float:
        """The core's at-risk ratio (docs/definitions.md#at-risk-ratio), for the bar."""
        from recoverydash.recovery.attention import at_risk_ratio

        return at_risk_ratio(self.seconds_since_restorable, self.limit_s,
                             ended=self.health == "ended")


FLEET_PAGE_SIZE = 50
#: ``?sort=`` of the fleet: column -> what it orders by (``-`` prefix: the other way round).
FLEET_SORTS = ("attention", "run", "health", "age", "alerts", "last_event", "attempt")
FLEET_VIEWS = ("attention", "all")


def drill_field() -> str | None:
    """The name of the Run field that marks an exercise run (``is_drill``), or None while the
    model has none: drills are kept out of the attention order and the "needs attention" view
    (docs/definitions.md#attention-order) as soon as the field exists."""
    names = {f.name for f in Run._meta.get_fields()}
    return next((n for n in ("is_drill", "drill") if n in names), None)


@dataclass
class FleetPage:
    """One page of the fleet: its rows, the sort and view used, and where it is in the list."""

    rows: list
    total: int          # runs matching the filters and view
    all_runs: int       # runs matching the filters in any view
    page: int
    pages: int
    sort: str
    view: str

    @property
    def hidden(self) -> int:
        """Runs matching the filters (a search included) that this view does not list: those
        the "needs attention" view leaves out because they need none; 0 in the "all" view."""
        return self.all_runs - self.total if self.view == "attention" else 0

    @property
    def first_index(self) -> int:
        return (self.page - 1) * FLEET_PAGE_SIZE + 1 if self.total else 0

    @property
    def last_index(self) -> int:
        return min(self.page * FLEET_PAGE_SIZE, self.total)


def _attempt_state(ended_at, last_received_at, now) -> str:
    """``ended`` when the live attempt sent attempt_ended, ``silent`` when nothing was received
    for ``RECOVERYDASH_RUN_SILENT_S`` (the ``run_silent`` rule's limit), else ``running``."""
    from django.conf import settings

    if ended_at is not None:
        return "ended"
    if last_received_at is None or \
            (now - last_received_at).total_seconds() > settings.RECOVERYDASH_RUN_SILENT_S:
        return "silent"
    return "running"


def _attempt_states(items: list, now) -> dict:
    """Set item[10] of each fleet item (``[pk, ..., last_received_at at 9, state at 10, ...]``)
    to its live attempt's state (``_attempt_state``; ``silent`` for a run with no attempt);
    returns pk -> live attempt number (``runs.live.live_attempts``: the newest attempt, unless it
    ended while an older one keeps committing, docs/definitions.md#concurrent-attempts: a
    cancelled duplicate never makes a running run ``ended``). Two queries for all of them."""
    from recoverydash.runs.live import live_attempts

    found = {pk: (n, ended) for pk, (_, n, ended) in live_attempts([i[0] for i in items]).items()}
    for item in items:
        n, ended = found.get(item[0], (None, None))
        item[10] = _attempt_state(ended, item[9], now) if n is not None else "silent"
    return {pk: n for pk, (n, _) in found.items()}


def fleet(user, *, project: int | None = None, health: str = "", q: str = "",
          view: str = "attention", sort: str = "attention", page: int = 1,
          now: datetime | None = None) -> FleetPage:
    """One page (``FLEET_PAGE_SIZE`` rows) of the runs ``user`` may see.

    Order ``sort`` (``FLEET_SORTS``, ``-`` prefix reverses): ``attention`` is the core's
    ``recovery.attention.attention_key`` (docs/definitions.md#attention-order: open critical
    alerts, open warnings, the at-risk ratio, health; then run id). ``view`` ``attention`` keeps
    the runs ``needs_attention`` holds, ``all`` every run. Filters: ``project`` (pk), ``health``
    (docs/definitions.md#health, or ``unknown`` for runs without an analysis yet), ``q``
    (case-insensitive substring of run_id).

    The database orders, filters and cuts the page (``dashboard.fleet_order``: the attention
    order in SQL over stored columns and ``now``), so the Python work is the page's: a fixed
    number of queries whatever the number of runs (two counts, the page's pks, then its rows in
    full with their analyses' small keys and newest attempts). The figures shown are the core's,
    computed for the page's rows from the stored clock. Unknown ``sort`` or ``view`` fall back
    to the defaults; ``page`` is clamped to the pages there are.
    """
    from django.conf import settings

    from recoverydash.dashboard.fleet_order import (
        NEEDS_ATTENTION,
        annotate_attempt_state,
        annotate_attention,
        fleet_ordering,
        never_heard,
    )
    from recoverydash.recovery.attention import at_risk_ratio
    from recoverydash.recovery.contract import DEFAULT_CONTRACT

    now = now or timezone.now()
    desc = sort.startswith("-")
    key_name = sort.lstrip("-")
    if key_name not in FLEET_SORTS:
        key_name, desc = "attention", False
    view = view if view in FLEET_VIEWS else "attention"
    runs = Run.objects.filter(project__in=visible_projects(user))
    if project:
        runs = runs.filter(project_id=project)
    if q:
        runs = runs.filter(run_id__icontains=q.strip())
    if health == "unknown":
        runs = runs.filter(Q(analysis__isnull=True) | Q(analysis__health__in=["", "unknown"]))
    elif health:
        runs = runs.filter(analysis__health=health)
    drill = drill_field()
    all_runs = runs.count()
    listed = annotate_attention(runs, now, drill)
    if view == "attention":
        listed = listed.filter(NEEDS_ATTENTION)
        total = listed.count()
    else:
        total = all_runs
    if key_name == "attempt":
        listed = annotate_attempt_state(listed, now, settings.RECOVERYDASH_RUN_SILENT_S)
    elif key_name == "last_event":
        listed = never_heard(listed)
    pages = max(1, -(-total // FLEET_PAGE_SIZE))
    page = min(max(int(page or 1), 1), pages)
    start = (page - 1) * FLEET_PAGE_SIZE
    default_limit = float(DEFAULT_CONTRACT["max_checkpoint_age_s"])
    chosen = []
    for pk, run_id, word, limit, clock, crit, warn, n_open, is_drill in (
            listed.order_by(*fleet_ordering(key_name, desc))
            .values_list("pk", "run_id", "analysis__health", "max_checkpoint_age_s",
                         "analysis__clock", "f_critical", "f_warning", "f_open", "f_drill")
            [start:start + FLEET_PAGE_SIZE]):
        word = word or "unknown"
        limit_s = float(limit) if limit is not None else default_limit
        # the core's figures on the stored clock (runs.models.clock_of: POSIX seconds)
        seconds = seconds_since_last_restorable(clock, now.timestamp()) if clock else None
        ratio = at_risk_ratio(seconds, limit_s, ended=word == "ended")
        chosen.append([pk, run_id, word, seconds, limit_s, ratio, crit, warn, n_open, None,
                       None, bool(is_drill)])
    full = {r.pk: r for r in Run.objects.select_related("project")
            .filter(pk__in=[i[0] for i in chosen])}
    analyses = {
        row["run_id"]: row for row in Analysis.objects.filter(run__in=list(full)).values(
            "run_id", "computed_at", "ingest_seq",
            updates_at_risk=KeyTransform("updates_at_risk", "result"),
            last_restorable=KeyTransform("last_restorable", "result"),
            restarts=KeyTransform("restarts", "result"))
    }
    for item in chosen:
        item[9] = full[item[0]].last_received_at
    latest = _attempt_states(chosen, now)
    rows = []
    for (pk, _run_id, word, seconds, limit_s, ratio, crit, warn, n_open, last_received_at,
         state, is_drill) in chosen:
        run, a = full[pk], analyses.get(pk)
        restarts = (a or {}).get("restarts") or []
        rows.append(FleetRow(
            run=run, health=word, seconds_since_restorable=seconds, limit_s=limit_s,
            last_restorable=a["last_restorable"] if a else None,
            updates_at_risk=a["updates_at_risk"] if a else None,
            open_alerts=n_open, critical_alerts=crit, warning_alerts=warn,
            last_restart=restarts[-1] if restarts else None,
            computed_at=a["computed_at"] if a else None,
            pending=(run.ingest_seq > a["ingest_seq"]) if a else run.ingest_seq > 0,
            last_event_at=last_received_at, attempt=latest.get(pk), attempt_state=state,
            ratio=ratio, drill=is_drill))
    return FleetPage(rows=rows, total=total, all_runs=all_runs, page=page, pages=pages,
                     sort=("-" if desc else "") + key_name, view=view)


# --- run page -------------------------------------------------------------------------------------

@dataclass
class RunSummary:
    """The three answers of the run page and what surrounds them."""

    run: Run
    analysis: dict | None       # computed_at, ingest_seq, health and the SMALL_KEYS of result
    health: str
    contract: dict
    seconds_since_restorable: float | None
    limit_s: float
    last_restorable: LastRestorableEntry | None
    updates_at_risk: int
    restarts: list[RestartEntry]
    strata: list[StratumEntry]
    costs: CostsEntry | dict    # {} when the stored result has none
    freshness: dict
    rejected: list = field(default_factory=list)   # newest rejected generations
    # restorable generations outside the live lineage (the live attempt resumed from a state
    # that cannot be tied to them): shown when the live lineage has none
    restorable_elsewhere: list = field(default_factory=list)
    recent_generations: list = field(default_factory=list)
    adopted: list = field(default_factory=list)     # adopt locations feeding this run
    attempts: list = field(default_factory=list)
    alerts: list = field(default_factory=list)
    silence: dict | None = None   # alerts.rules.silence_of the live attempt at the page's now

    @property
    def ended_at(self):
        """When the run ended (the core's ``run_ended_at``, stored as ``ended_at``), None while
        it has not."""
        return (self.analysis or {}).get("r_ended_at") if self.health == "ended" else None

    @property
    def reporters(self) -> list:
        """Per reporter of the live attempt while it runs: ``{"name": "rank 3" | "no rank",
        "age": seconds since its last event (the core's reporter_ages), "silent": bool (the
        core's silent_reporters / attempt_silent, the rank_silent and run_silent rules' own
        test)}``, ranks in order. Empty once the attempt ended."""
        from django.conf import settings

        from recoverydash.recovery.figures import attempt_silent, silent_reporters

        sil = self.silence
        if not sil or sil.get("ended") or self.health == "ended":
            return []
        ages, median = sil["ages"], sil.get("median")
        silent = set(silent_reporters(ages, median, settings.RECOVERYDASH_RANK_SILENT_FLOOR_S))
        if attempt_silent(ages, median, settings.RECOVERYDASH_RUN_SILENT_S) is not None:
            silent = set(ages)
        keys = sorted(ages, key=lambda k: (not k.isdigit(), int(k) if k.isdigit() else 0))
        return [{"name": f"rank {k}" if k.isdigit() else "no rank", "age": ages[k],
                 "silent": k in silent} for k in keys]

    @property
    def last_restart(self) -> RestartEntry | None:
        return self.restarts[-1] if self.restarts else None

    @property
    def restart_units(self) -> str:
        """The unit of the restarts' counts together (docs/definitions.md#units, the core's
        ``units_of``): the run page's restart chart says it."""
        return restarts_units(self.restarts)

    @property
    def failed_restore(self):
        """The newest attempt whose restore failed with nothing restored after it
        (docs/ingest-v1.md#restore_failed) when it is newer than the last restart analysed (an
        attempt that died loading shows here, not the older restart's verdict), else None."""
        last = self.last_restart
        after = last["attempt"] if last else -1
        failed = [a for a in self.attempts if a.restore_failed and a.attempt > after]
        return failed[-1] if failed else None

    @property
    def over_limit(self) -> bool:
        """The core's ``checkpoint_stale`` (the alert rule's comparison; never for an ended
        run)."""
        return checkpoint_stale(self.seconds_since_restorable, self.limit_s,
                                ended=self.health == "ended")

    @property
    def logger_rewind_update(self) -> int | None:
        """The core's ``logger_rewind_update`` of the last restorable generation: where a
        restart from it rewinds its loggers (docs/definitions.md#logger-rewind-update)."""
        return logger_rewind_update(self.last_restorable)


def load_small_analysis(run) -> dict | None:
    """The stored analysis of ``run`` without its chart series: computed_at, ingest_seq, health
    and the keys in ``SMALL_KEYS`` (missing keys are None)."""
    return (Analysis.objects.filter(run=run)
            .values("pk", "computed_at", "ingest_seq", "health",
                    **{f"r_{k}": KeyTransform(k, "result") for k in SMALL_KEYS})
            .first())


def run_summary(run, now: datetime | None = None) -> RunSummary:
    """Everything the run page states in words: can we resume and from what
    (docs/definitions.md#last-restorable), how much is at risk (the core's
    ``seconds_since_last_restorable`` of the stored result at ``now``, and its
    ``updates_at_risk``), what the last restart did to the data (``restarts[-1]``), plus attempts,
    recent generations and the run's alerts."""
    now = now or timezone.now()
    a = load_small_analysis(run)
    # the SMALL_KEYS of the stored result, each None when absent
    result = cast(AnalysisResult, {k: (a or {}).get(f"r_{k}") for k in SMALL_KEYS})
    summary = RunSummary(
        run=run, analysis=a,
        health=(a or {}).get("health") or "unknown",
        contract=contract_of(run),
        seconds_since_restorable=seconds_since_last_restorable(result, now, run.first_event_at)
        if a else None,
        limit_s=_limit_of(run),
        last_restorable=result["last_restorable"],
        updates_at_risk=result["updates_at_risk"] or 0,
        restarts=result["restarts"] or [],
        strata=result["strata"] or [],
        costs=result["costs"] or {},
        freshness=freshness(run, a),
    )
    gens = Generation.objects.filter(run=run).defer("manifest")
    summary.rejected = list(gens.filter(status="rejected").order_by("-update", "-pk")[:5])
    if not summary.last_restorable:
        summary.restorable_elsewhere = list(gens.filter(status="restorable")
                                            .order_by("-update", "-pk")[:5])
    summary.recent_generations = list(gens.order_by("-update", "-pk")[:12])
    summary.attempts = list(Attempt.objects.filter(run=run).order_by("attempt"))
    summary.alerts = list(run.alerts.exclude(state="resolved").order_by("-opened_at")[:20])
    summary.silence = silence_of(run, now)
    summary.adopted = adopted_from(run)
    return summary


def adopted_from(run) -> list:
    """The project's adopt locations whose generations go to this run
    (``recoverydash.ingest.adoption.adopted_run_id``): another tool's folders, listed by
    discovery, docs/formats.md#adopted-folders-on-the-server."""
    from recoverydash.ingest.adoption import adopted_run_id
    from recoverydash.storage.models import KIND_ADOPT, StorageLocation

    return [loc for loc in StorageLocation.objects.filter(project_id=run.project_id,
                                                          kind=KIND_ADOPT).order_by("url")
            if adopted_run_id(loc) == run.run_id]


def run_live_version(run) -> str:
    """A string that changes whenever the run page's figures may have changed."""
    a = Analysis.objects.filter(run=run).values("computed_at", "ingest_seq").first()
    return freshness(run, a)["version"]


# --- generation page ------------------------------------------------------------------------------

@dataclass
class GenerationDetail:
    """A generation, its manifest, each required shard and component, each object and its check."""

    generation: Generation
    shards: list          # [{"shard", "reported", "update", "components": {name: status}}]
    components: list      # required component names
    objects: list         # CheckpointObject rows
    reasons: list         # [{"code", "detail"}]
    problems: int = 0     # objects whose check is not ok
    #: notes of the stored analysis that change no status (``optimizer_stateless``,
    #: ``data_position_unknown``, ...)
    notes: list = field(default_factory=list)
    #: components the run's contract requires (``required_components``) that no object of the
    #: generation carries, when it is rejected with ``component_missing``
    #: (``recovery.generations.components_without_object``)
    contract_missing: list = field(default_factory=list)
    required_components: list = field(default_factory=list)   # the run's contract's list
    #: how far the verification of its objects in storage has come
    #: (``checkpoints.objects.VerificationProgress``; docs/definitions.md#verification-progress)
    progress: object = None

    @property
    def manifest_json(self) -> str:
        import json

        return json.dumps(self.generation.manifest, indent=2, sort_keys=True)


def _components_by_uri(manifest: dict, reports) -> dict:
    """``{uri: [component, ...]}`` for objects that name several components (the Object
    extension ``components``, docs/ingest-v1.md#shard_written), from the manifest and the shard
    reports; objects naming one component are absent."""
    out: dict = {}
    lists = [manifest.get("objects") or []] + [r.object_list or [] for r in reports]
    for items in lists:
        for item in items:
            if isinstance(item, dict) and isinstance(item.get("components"), list) \
                    and item.get("uri") and item["uri"] not in out:
                names = [str(c) for c in item["components"] if c]
                if len(names) > 1:
                    out[item["uri"]] = names
    return out


def _progress_of(objects: list):
    """The ``VerificationProgress`` of a generation's manifest objects (CheckpointObject rows)."""
    return verification_progress((o.size, o.check_status, o.hashed_bytes) for o in objects
                                 if o.in_manifest)


def generation_detail(run, generation_id: str) -> GenerationDetail:
    """The generation page: required shards (from the manifest, else ``checkpoint_started``),
    required components (manifest components, else the run contract's ``required_components``),
    and per shard x component the verification result of its object (``CheckpointObject``):
    ``ok``, a reason code (docs/definitions.md#generation-status), ``pending`` or ``absent`` (no
    object listed). An object that names several components (``components``) counts in each of
    their cells and carries them as ``components``. Http404 for an unknown generation."""
    gen = Generation.objects.filter(run=run, generation_id=generation_id).first()
    if gen is None:
        raise Http404("no such generation")
    manifest = gen.manifest or {}
    required = list(manifest.get("required_shards") or gen.required_shards or [])
    components = list(manifest.get("components") or gen.components
                      or contract_of(run)["required_components"])
    objects = list(gen.checkpoint_objects.order_by("shard", "component", "uri"))
    reports = {s.shard: s for s in gen.shards.all()}
    carried = _components_by_uri(manifest, reports.values())
    by_cell: dict = {}
    for o in objects:
        # an object naming several components (a Lightning .ckpt) fills each of their cells
        o.components = carried.get(o.uri) or [o.component]
        for comp in o.components:
            by_cell.setdefault((o.shard, comp), []).append(o.check_status)
    shards = []
    for name in required + sorted(set(reports) - set(required)):
        cells = {}
        for comp in components:
            statuses = by_cell.get((name, comp))
            if not statuses:
                cells[comp] = "absent"
            elif all(s == "ok" for s in statuses):
                cells[comp] = "ok"
            else:
                cells[comp] = next(s for s in statuses if s != "ok")
        report = reports.get(name)
        shards.append({"shard": name, "required": name in required,
                       "reported": report is not None,
                       "update": report.update if report else None, "components": cells})
    analysis = getattr(run, "analysis", None)
    result: AnalysisResult = analysis.result if analysis is not None and analysis.result else {}
    stored: GenerationEntry | dict = next(
        (g for g in result.get("generations") or [] if g["generation_id"] == generation_id), {})
    reasons = list(gen.reasons or [])
    required_by_contract = contract_of(run)["required_components"]
    contract_missing = []
    if any(r.get("code") == "component_missing" for r in reasons):
        from recoverydash.recovery.generations import components_without_object

        contract_missing = components_without_object(manifest, required_by_contract)
    return GenerationDetail(generation=gen, shards=shards, components=components, objects=objects,
                            reasons=reasons,
                            problems=sum(1 for o in objects if o.check_status != "ok"),
                            notes=list(stored.get("notes") or []),
                            contract_missing=contract_missing,
                            required_components=required_by_contract,
                            progress=_progress_of(objects))


# --- restart page ---------------------------------------------------------------------------------

@dataclass
class RestartDetail:
    """One restart (docs/definitions.md#a-restart) with its cursors joined per stratum and the audit
    windows around it."""

    restart: dict
    cursors: list          # [{"stratum", "expected", "resume", "gap", "meaning"}]
    before: dict           # {"attempt", "updates": [...], "rows": [{"rank","slot","cells":[...]}]}
    after: dict
    predecessor: int | None
    windows: dict = field(default_factory=dict)   # recovery.windows.first_window_comparison
    failed_attempt: int | None = None               # k-1, whose windows past U are expected


def restarts_units(restarts: list) -> str:
    """The unit of the counts of several restarts (docs/definitions.md#units): ``units_of``
    their ``units`` (samples for a restart stored before units existed)."""
    return units_of([r.get("units") or SAMPLES for r in restarts or []])


def cursor_comparison(expected: list, resume: list, units: dict | None = None,
                      default_units: str = SAMPLES) -> list[dict]:
    """Expected against actual resume cursor per stratum, as the core compares them
    (``recovery.restarts.cursor_gaps``: docs/definitions.md#expected-cursor is the lineage's
    frontier at U, #resume-cursor where the attempt starts, ``gap`` resume minus expected
    position within one epoch), with a sentence saying what the gap means in the stratum's unit
    (``units``: ``{stratum: "samples" | "tokens"}``, else ``default_units``;
    docs/definitions.md#units): each row's ``units`` too."""
    rows = cursor_gaps(expected, resume)
    for row in rows:
        e, r, gap = row["expected"], row["resume"], row["gap"]
        row["units"] = (units or {}).get(row["stratum"]) or default_units
        words = unit_word(row["units"])
        if gap is not None:
            row["meaning"] = ("same position" if gap == 0 else
                              f"{gap:,} {words} ahead: skipped" if gap > 0 else
                              f"{-gap:,} {words} behind: read again")
        elif e and r:
            row["meaning"] = f"epoch {e.get('epoch')} expected, epoch {r.get('epoch')} resumed"
        else:
            row["meaning"] = "no expected cursor" if r else "no resume cursor reported"
    return rows


def _audit_table(run, attempt: int | None, updates_q, order: str, limit_updates: int) -> dict:
    """Audit windows of one attempt as a table: rows (rank, accum_slot), columns updates."""
    if attempt is None:
        return {"attempt": None, "updates": [], "rows": []}
    updates = list(AuditWindow.objects.filter(run=run, attempt=attempt).filter(updates_q)
                   .order_by(order).values_list("update", flat=True).distinct()[:limit_updates])
    updates = sorted(set(updates))
    cells: dict = {}
    for rank, slot, update, ids in (AuditWindow.objects.filter(run=run, attempt=attempt,
                                                               update__in=updates)
                                    .values_list("rank", "accum_slot", "update", "sample_ids")):
        cells[(rank, slot, update)] = ids
    keys = sorted({(rank, slot) for rank, slot, _ in cells})
    rows = [{"rank": rank, "slot": slot,
             "cells": [cells.get((rank, slot, u)) for u in updates]} for rank, slot in keys]
    return {"attempt": attempt, "updates": updates, "rows": rows}


def restart_detail(run, attempt: int, summary_restarts: list | None = None) -> RestartDetail:
    """The restart page of attempt ``attempt``: its ``restarts`` item, the cursor
    comparison (``cursor_comparison``), and audit windows (docs/ingest-v1.md#audit_window) of the
    predecessor just before the restored update U (its last two updates at or below U) and of the
    resumed attempt just after (its first two updates above U). Http404 when the run has no
    restart for that attempt."""
    restarts = summary_restarts
    strata: list = []
    if restarts is None:
        a = load_small_analysis(run)
        restarts = (a or {}).get("r_restarts") or []
        strata = (a or {}).get("r_strata") or []
    item = next((r for r in restarts if int(r.get("attempt", -1)) == attempt), None)
    if item is None:
        raise Http404("no such restart")
    units = {s.get("stratum"): s.get("units") for s in strata if isinstance(s, dict)}
    # a restart's own unit names its strata's when it is one unit (not "mixed")
    default_units = item.get("units") if item.get("units") in (SAMPLES, TOKENS) else SAMPLES
    u = int(item.get("resumed_update") or 0)
    predecessor = None
    if item.get("resumed_from"):
        predecessor = (Generation.objects.filter(run=run, generation_id=item["resumed_from"])
                       .values_list("attempt", flat=True).first())
    if predecessor is None:
        predecessor = (Attempt.objects.filter(run=run, attempt__lt=attempt).order_by("-attempt")
                       .values_list("attempt", flat=True).first())
    before = _audit_table(run, predecessor, Q(update__lte=u), "-update", 2)
    after = _audit_table(run, attempt, Q(update__gt=u), "update", 2)
    failed = (Attempt.objects.filter(run=run, attempt__lt=attempt).order_by("-attempt")
              .values_list("attempt", flat=True).first())
    windows = first_windows(run, item, predecessor, failed, attempt, before["updates"],
                            after["updates"])
    return RestartDetail(restart=item,
                         cursors=cursor_comparison(item.get("expected_cursor"),
                                                   item.get("resume_cursor"), units,
                                                   default_units),
                         before=before, after=after, predecessor=predecessor,
                         windows=windows, failed_attempt=failed)


def _epochs(run, attempt: int, updates: list) -> dict:
    """``{(update, rank): epoch}`` where the rank's reports of that update (from its ledger
    rows, folded ones included: ``LedgerRow.parts``) consumed one epoch only (else the epoch is
    unknown and absent)."""
    found: dict = {}
    for update, rank, ranks, spans in (
            LedgerRow.objects.filter(run=run, attempt=attempt, update__in=updates)
            .values_list("update", "rank", "ranks", "spans")):
        # a folded row's ranks report the first one's spans moved (runs.folding): the same
        # epochs, so they are read once per row, not once per rank
        epochs = {s.get("epoch") for s in spans or [] if isinstance(s, dict)}
        for mine in range(rank, rank + max(1, ranks)):
            found.setdefault((update, mine), set()).update(epochs)
    return {key: next(iter(epochs)) for key, epochs in found.items() if len(epochs) == 1}


def _windows(run, attempt: int | None, q) -> list:
    if attempt is None:
        return []
    rows = list(AuditWindow.objects.filter(run=run, attempt=attempt).filter(q)
                .values_list("update", "rank", "accum_slot", "sample_ids"))
    epochs = _epochs(run, attempt, sorted({r[0] for r in rows}))
    return [{"update": upd, "rank": rank, "slot": slot, "ids": ids or [],
             "epoch": epochs.get((upd, rank))} for upd, rank, slot, ids in rows]


def _digests(run, attempt: int | None, updates: list) -> dict:
    """``{(update, rank): ids_digest}`` of the attempt's ``update_committed`` events (their
    stored body keeps ``update`` and ``ids_digest``, the rank is the row's column:
    ``ingest.actions.stored_body``)."""
    if attempt is None or not updates:
        return {}
    out = {}
    for rank, body in (Event.objects.filter(run=run, type="update_committed", attempt=attempt,
                                            body__update__in=updates)
                       .values_list("rank", "body")):
        digest = body.get("ids_digest")
        if digest:
            out[(int(body["update"]), -1 if rank is None else int(rank))] = digest
    return out


#: How many of the lineage's last updates with audit windows at or below the restored update
#: the first-window comparison reads to mark replayed ids (``first_windows``).
REPLAY_WINDOW_UPDATES = 64


def first_windows(run, item: dict, lineage_attempt: int | None, failed: int | None,
                  attempt: int, before_updates: list, after_updates: list) -> dict:
    """The expected first window after the resume beside the observed one
    (``recovery.windows.first_window_comparison``,
    docs/definitions.md#first-window-after-a-restart):
    the lineage's windows at or below U (attempt ``lineage_attempt``, the one that wrote the
    restored generation: every window it sent for its last ``REPLAY_WINDOW_UPDATES`` updates
    with windows at or below U, so an id trained long before the checkpoint and delivered again
    is marked replayed, not only one of the two updates the before-table shows), the failed
    predecessor's (``failed``) for the first two updates past U, and the resumed attempt's for
    the updates the after-table shows; ``ids_digest`` of both for the same updates."""
    u = int(item.get("resumed_update") or 0)
    lineage_updates = (
        list(AuditWindow.objects.filter(run=run, attempt=lineage_attempt, update__lte=u)
             .order_by("-update").values_list("update", flat=True)
             .distinct()[:REPLAY_WINDOW_UPDATES]) if lineage_attempt is not None else [])
    before = _windows(run, lineage_attempt,
                      Q(update__in=sorted(set(lineage_updates) | set(before_updates))))
    expected = _windows(run, failed, Q(update__gt=u, update__lte=u + 2))
    observed = _windows(run, attempt, Q(update__in=after_updates))
    updates = sorted(set(after_updates) | set(range(u + 1, u + 3)))
    same = (item.get("world_size_before") is None or item.get("world_size_after") is None
            or item.get("world_size_before") == item.get("world_size_after"))
    return first_window_comparison(u, before, expected, observed, same_world_size=same,
                                   digests_before=_digests(run, failed, updates),
                                   digests_after=_digests(run, attempt, updates))


# --- alerts, tokens, webhooks ---------------------------------------------------------------------

#: The alert page's tabs: ``open`` is everything not resolved (firing and acknowledged together,
#: so an acknowledged alert can be silenced or resolved where it was acknowledged).
ALERT_LISTS = {"open": ["firing", "acknowledged"], "firing": ["firing"],
               "acknowledged": ["acknowledged"], "resolved": ["resolved"]}


def attach_runbooks(alerts: list) -> list:
    """Set ``runbook_url`` on each alert: its project's runbook for its rule
    (``RuleRunbook``) or None; one query for the whole list."""
    from recoverydash.alerts.models import RuleRunbook

    projects = {a.run.project_id for a in alerts}
    books = {(p, r): u for p, r, u in RuleRunbook.objects.filter(project_id__in=projects)
             .values_list("project_id", "rule", "url")} if projects else {}
    for a in alerts:
        a.runbook_url = books.get((a.run.project_id, a.rule))
    return alerts


def alert_list(user, which: str = "open", project: int | None = None, limit: int = 200, *,
               run: str = "", rule: str = "", severity: str = "", owner: str | None = None):
    """Alerts of the runs ``user`` may see, in the list ``which`` of ``ALERT_LISTS``: open ones
    critical first then newest, resolved ones newest resolved first; with the count of each list
    (under the same filters), each alert's ``runbook_url`` and ``rule_flaps`` (the flaps of its
    rule on its run, every episode: ``Alert.flaps`` summed, docs/definitions.md#flaps). Filters:
    ``run`` (a substring of the run id, case-insensitive), ``rule`` and ``severity`` (exact),
    ``owner`` (the ``assigned_to`` user name; "" for alerts nobody owns; None: any)."""
    base = Alert.objects.select_related("run__project").filter(
        run__project__in=visible_projects(user))
    if project:
        base = base.filter(run__project_id=project)
    if run:
        base = base.filter(run__run_id__icontains=run.strip())
    if rule:
        base = base.filter(rule=rule)
    if severity:
        base = base.filter(severity=severity)
    if owner is not None:
        base = base.filter(assigned_to=owner)
    by_state = dict(base.values_list("state").annotate(n=Count("pk")).values_list("state", "n"))
    counts = {name: sum(by_state.get(s, 0) for s in states)
              for name, states in ALERT_LISTS.items()}
    states = ALERT_LISTS.get(which, ALERT_LISTS["open"])
    rows = base.filter(state__in=states)
    if which == "resolved":
        rows = rows.order_by("-resolved_at", "-pk")
    else:
        from django.db.models import Case, IntegerField, Value, When

        rows = rows.annotate(sev=Case(When(severity="critical", then=Value(0)),
                                      When(severity="warning", then=Value(1)),
                                      default=Value(2), output_field=IntegerField())
                             ).order_by("sev", "-opened_at", "-pk")
    rows = attach_runbooks(list(rows[:limit]))
    flaps = dict(((run_id, rule), n) for run_id, rule, n in
                 Alert.objects.filter(run_id__in={a.run_id for a in rows}, flaps__gt=0)
                 .values("run_id", "rule").annotate(n=Sum("flaps"))
                 .values_list("run_id", "rule", "n"))
    for a in rows:
        a.rule_flaps = flaps.get((a.run_id, a.rule), 0)
    return rows, counts


@dataclass
class AlertDetail:
    """An alert, its flips oldest first (each with its deliveries), its notes and changes of
    owner, both merged in time order (``timeline``: ``("flip", AlertFlip)`` or ``("note",
    AlertNote)``), the people it can be assigned to, and its runbook."""

    alert: Alert
    flips: list
    notes: list = field(default_factory=list)
    timeline: list = field(default_factory=list)
    members: list = field(default_factory=list)   # user names of the run's project


def project_members(project_id: int) -> list[str]:
    """The user names of a project's members, sorted: whom its alerts can be assigned to."""
    from recoverydash.runs.models import Membership

    return sorted(Membership.objects.filter(project_id=project_id)
                  .values_list("user__username", flat=True))


def alert_detail(alert: Alert) -> AlertDetail:
    """The alert page: the timeline of its flips (``AlertFlip``: old and new state, when, why,
    and what each delivery of it did) and its notes and changes of owner (``AlertNote``), oldest
    first."""
    flips = list(alert.flips.order_by("created_at", "pk")
                 .prefetch_related("deliveries__endpoint"))
    notes = list(alert.notes.order_by("created_at", "pk"))
    timeline = sorted([("flip", f) for f in flips] + [("note", n) for n in notes],
                      key=lambda item: item[1].created_at)
    attach_runbooks([alert])
    return AlertDetail(alert=alert, flips=flips, notes=notes, timeline=timeline,
                       members=project_members(alert.run.project_id))


def alerts_for(user, pks: list[int]) -> list[Alert]:
    """The alerts among ``pks`` of runs ``user`` may see (others are silently left out)."""
    return list(Alert.objects.select_related("run__project")
                .filter(pk__in=pks, run__project__in=visible_projects(user)).order_by("pk"))


@dataclass
class ProjectSettings:
    project: Project
    tokens: list
    webhooks: list
    deliveries: list
    runs: int
    runbooks: dict = field(default_factory=dict)


def project_settings(project) -> ProjectSettings:
    """The project page: live and revoked tokens, webhook endpoints, the last 20 deliveries,
    and the runbook of each alert rule (``runbooks``: rule -> URL)."""
    from recoverydash.alerts.models import RuleRunbook

    return ProjectSettings(
        project=project,
        tokens=list(ApiToken.objects.filter(project=project).order_by("revoked_at", "-created_at")),
        webhooks=list(WebhookEndpoint.objects.filter(project=project).order_by("name", "pk")),
        deliveries=list(Delivery.objects.select_related("endpoint", "flip__alert__run")
                        .filter(endpoint__project=project).order_by("-created_at")[:20]),
        runs=Run.objects.filter(project=project).count(),
        runbooks=dict(RuleRunbook.objects.filter(project=project).order_by("rule")
                      .values_list("rule", "url")),
    )


def webhook_for(project, pk: int) -> WebhookEndpoint:
    """An endpoint of ``project``; Http404 otherwise."""
    endpoint = WebhookEndpoint.objects.filter(project=project, pk=pk).first()
    if endpoint is None:
        raise Http404("no such endpoint")
    return endpoint
