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
from datetime import datetime, timezone as dt_timezone

from django.db.models import Count, Q
from django.db.models.fields.json import KeyTransform
from django.http import Http404
from django.utils import timezone

from recoverydash.alerts.models import Alert, Delivery, WebhookEndpoint
from recoverydash.alerts.rules import contract_of
from recoverydash.recovery.figures import (checkpoint_stale, logger_rewind_update,
                                           seconds_since_last_restorable)
from recoverydash.recovery.restarts import cursor_gaps
from recoverydash.recovery.windows import first_window_comparison
from recoverydash.runs.models import (Analysis, ApiToken, AuditWindow, Attempt, Event,
                                      Generation, LedgerRow, Project, Run)

HEALTH_ORDER = {"failing": 0, "at_risk": 1, "ok": 2, "ended": 3}
HEALTH_WORDS = {"failing": "Failing", "at_risk": "At risk", "ok": "OK", "ended": "Ended",
                "unknown": "Not analysed yet"}
VERDICT_WORDS = {
    "exact": "Exact: the data stream continued where the checkpoint left it",
    "replay": "Replay: committed positions were trained on again",
    "omission": "Omission: positions were skipped and never trained on",
    "replay_and_omission": "Replay and omission: positions were both repeated and skipped",
    "unverified": "Unverified: the resumed attempt has not committed an update yet, or the "
                  "lineage before the checkpoint is unknown",
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
        return datetime.fromtimestamp(value, tz=dt_timezone.utc)
    moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=dt_timezone.utc)


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

    @property
    def over_limit(self) -> bool:
        """The core's ``checkpoint_stale`` (the alert rule's comparison)."""
        return checkpoint_stale(self.seconds_since_restorable, self.limit_s)

    @property
    def logger_rewind_update(self) -> int | None:
        """The core's ``logger_rewind_update`` of the last restorable generation: where a
        restart from it rewinds its loggers (docs/definitions.md#logger-rewind-update)."""
        return logger_rewind_update(self.last_restorable)

    @property
    def age_share(self) -> float:
        """TSLRC as a share of the limit (1.0 = at the limit), for sorting and the bar."""
        if self.seconds_since_restorable is None or self.limit_s <= 0:
            return 0.0
        return self.seconds_since_restorable / self.limit_s


def fleet(user, *, project: int | None = None, health: str = "", q: str = "",
          now: datetime | None = None) -> list[FleetRow]:
    """Every run ``user`` may see, worst first: failing, at risk, ok, ended, then not analysed;
    within a health, the run furthest past its checkpoint-age limit first.

    Filters: ``project`` (pk), ``health`` (docs/definitions.md#health, or ``unknown`` for runs
    without an analysis yet), ``q`` (case-insensitive substring of run_id). Reads only the small
    keys of each stored analysis.
    """
    now = now or timezone.now()
    runs = Run.objects.select_related("project").filter(project__in=visible_projects(user))
    if project:
        runs = runs.filter(project_id=project)
    if q:
        runs = runs.filter(run_id__icontains=q.strip())
    runs = runs.annotate(open_alerts=Count("alerts", filter=~Q(alerts__state="resolved")))
    runs = list(runs)
    analyses = {
        row["run_id"]: row for row in Analysis.objects.filter(run__in=[r.pk for r in runs]).values(
            "run_id", "computed_at", "ingest_seq", "health",
            updates_at_risk=KeyTransform("updates_at_risk", "result"),
            restarts=KeyTransform("restarts", "result"),
            **{k: KeyTransform(k, "result") for k in CLOCK_KEYS})
    }
    rows = []
    for run in runs:
        a = analyses.get(run.pk)
        row = FleetRow(
            run=run,
            health=a["health"] if a else "unknown",
            seconds_since_restorable=seconds_since_last_restorable(
                {k: a[k] for k in CLOCK_KEYS}, now, run.first_event_at) if a else None,
            limit_s=_limit_of(run),
            last_restorable=a["last_restorable"] if a else None,
            updates_at_risk=a["updates_at_risk"] if a else None,
            open_alerts=run.open_alerts,
            last_restart=(a["restarts"] or [None])[-1] if a and a["restarts"] else None,
            computed_at=a["computed_at"] if a else None,
            pending=(run.ingest_seq > a["ingest_seq"]) if a else run.ingest_seq > 0,
        )
        if health and row.health != health:
            continue
        rows.append(row)
    rows.sort(key=lambda r: (HEALTH_ORDER.get(r.health, 4), -r.age_share, r.run.run_id))
    return rows


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
    last_restorable: dict | None
    updates_at_risk: int
    restarts: list
    strata: list
    costs: dict
    freshness: dict
    rejected: list = field(default_factory=list)   # newest rejected generations
    # restorable generations outside the live lineage (the live attempt resumed from a state
    # that cannot be tied to them): shown when the live lineage has none
    restorable_elsewhere: list = field(default_factory=list)
    recent_generations: list = field(default_factory=list)
    attempts: list = field(default_factory=list)
    alerts: list = field(default_factory=list)

    @property
    def last_restart(self) -> dict | None:
        return self.restarts[-1] if self.restarts else None

    @property
    def over_limit(self) -> bool:
        """The core's ``checkpoint_stale`` (the alert rule's comparison)."""
        return checkpoint_stale(self.seconds_since_restorable, self.limit_s)

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
    result = {k: (a or {}).get(f"r_{k}") for k in SMALL_KEYS}
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
    return summary


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
    return GenerationDetail(generation=gen, shards=shards, components=components, objects=objects,
                            reasons=list(gen.reasons or []),
                            problems=sum(1 for o in objects if o.check_status != "ok"))


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


def cursor_comparison(expected: list, resume: list) -> list[dict]:
    """Expected against actual resume cursor per stratum, as the core compares them
    (``recovery.restarts.cursor_gaps``: docs/definitions.md#expected-cursor is the lineage's
    frontier at U, #resume-cursor where the attempt starts, ``gap`` resume minus expected
    position within one epoch), with a sentence saying what the gap means."""
    rows = cursor_gaps(expected, resume)
    for row in rows:
        e, r, gap = row["expected"], row["resume"], row["gap"]
        if gap is not None:
            row["meaning"] = ("same position" if gap == 0 else
                              f"{gap:,} positions ahead: skipped" if gap > 0 else
                              f"{-gap:,} positions behind: read again")
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
    windows = AuditWindow.objects.filter(run=run, attempt=attempt, update__in=updates)
    cells: dict = {}
    for w in windows:
        cells[(w.rank, w.accum_slot, w.update)] = w.sample_ids
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
    if restarts is None:
        a = load_small_analysis(run)
        restarts = (a or {}).get("r_restarts") or []
    item = next((r for r in restarts if int(r.get("attempt", -1)) == attempt), None)
    if item is None:
        raise Http404("no such restart")
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
                                                   item.get("resume_cursor")),
                         before=before, after=after, predecessor=predecessor,
                         windows=windows, failed_attempt=failed)


def _epochs(run, attempt: int, updates: list) -> dict:
    """``{(update, rank): epoch}`` where the rank's ledger row of that update consumed one epoch
    only (else the epoch is unknown and absent)."""
    out = {}
    for upd, rank, spans in (LedgerRow.objects.filter(run=run, attempt=attempt,
                                                      update__in=updates)
                             .values_list("update", "rank", "spans")):
        epochs = {s.get("epoch") for s in spans or [] if isinstance(s, dict)}
        if len(epochs) == 1:
            out[(upd, rank)] = epochs.pop()
    return out


def _windows(run, attempt: int | None, q) -> list:
    if attempt is None:
        return []
    rows = list(AuditWindow.objects.filter(run=run, attempt=attempt).filter(q)
                .values_list("update", "rank", "accum_slot", "sample_ids"))
    epochs = _epochs(run, attempt, sorted({r[0] for r in rows}))
    return [{"update": upd, "rank": rank, "slot": slot, "ids": ids or [],
             "epoch": epochs.get((upd, rank))} for upd, rank, slot, ids in rows]


def _digests(run, attempt: int | None, updates: list) -> dict:
    """``{(update, rank): ids_digest}`` of the attempt's ``update_committed`` events."""
    if attempt is None or not updates:
        return {}
    out = {}
    for body in (Event.objects.filter(run=run, type="update_committed", attempt=attempt,
                                      body__update__in=updates)
                 .values_list("body", flat=True)):
        digest = body.get("ids_digest")
        if digest:
            rank = body.get("rank")
            out[(int(body["update"]), -1 if rank is None else int(rank))] = digest
    return out


def first_windows(run, item: dict, lineage_attempt: int | None, failed: int | None,
                  attempt: int, before_updates: list, after_updates: list) -> dict:
    """The expected first window after the resume beside the observed one
    (``recovery.windows.first_window_comparison``, docs/definitions.md#first-window-after-a-restart):
    the lineage's windows at or below U (attempt ``lineage_attempt``, the one that wrote the
    restored generation) for the updates the before-table shows, the failed predecessor's
    (``failed``) for the first two updates past U, and the resumed attempt's for the updates the
    after-table shows; ``ids_digest`` of both for the same updates."""
    u = int(item.get("resumed_update") or 0)
    before = _windows(run, lineage_attempt, Q(update__in=before_updates))
    expected = _windows(run, failed, Q(update__gt=u, update__lte=u + 2))
    observed = _windows(run, attempt, Q(update__in=after_updates))
    updates = sorted(set(after_updates) | set(range(u + 1, u + 3)))
    same = (item.get("world_size_before") is None or item.get("world_size_after") is None
            or item.get("world_size_before") == item.get("world_size_after"))
    return first_window_comparison(u, before, expected, observed, same_world_size=same,
                                   digests_before=_digests(run, failed, updates),
                                   digests_after=_digests(run, attempt, updates))


# --- alerts, tokens, webhooks ---------------------------------------------------------------------

ALERT_LISTS = {"open": ["firing"], "acknowledged": ["acknowledged"], "resolved": ["resolved"]}


def alert_list(user, which: str = "open", project: int | None = None, limit: int = 200):
    """Alerts of the runs ``user`` may see: ``open`` (firing), ``acknowledged`` or ``resolved``,
    newest first, with counts of each list."""
    base = Alert.objects.select_related("run__project").filter(
        run__project__in=visible_projects(user))
    if project:
        base = base.filter(run__project_id=project)
    counts = {name: base.filter(state__in=states).count() for name, states in ALERT_LISTS.items()}
    states = ALERT_LISTS.get(which, ALERT_LISTS["open"])
    order = "-resolved_at" if which == "resolved" else "-opened_at"
    return list(base.filter(state__in=states).order_by(order)[:limit]), counts


@dataclass
class ProjectSettings:
    project: Project
    tokens: list
    webhooks: list
    deliveries: list
    runs: int


def project_settings(project) -> ProjectSettings:
    """The project page: live and revoked tokens, webhook endpoints, the last 20 deliveries."""
    return ProjectSettings(
        project=project,
        tokens=list(ApiToken.objects.filter(project=project).order_by("revoked_at", "-created_at")),
        webhooks=list(WebhookEndpoint.objects.filter(project=project).order_by("name", "pk")),
        deliveries=list(Delivery.objects.select_related("endpoint", "flip__alert__run")
                        .filter(endpoint__project=project).order_by("-created_at")[:20]),
        runs=Run.objects.filter(project=project).count(),
    )


def webhook_for(project, pk: int) -> WebhookEndpoint:
    """An endpoint of ``project``; Http404 otherwise."""
    endpoint = WebhookEndpoint.objects.filter(project=project, pk=pk).first()
    if endpoint is None:
        raise Http404("no such endpoint")
    return endpoint
