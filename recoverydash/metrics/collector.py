"""The metrics read from the database at scrape time: per run, from the stored analyses (the
recovery core's output, never recomputed here), and the service's own state.

Per run (labels ``project``, ``run_id``), for at most ``RECOVERYDASH_METRICS_MAX_RUNS`` runs, most
recently heard from first, among those analysed that have not ended, or ended with their last
event received (server clock) within ``RECOVERYDASH_METRICS_ENDED_WINDOW_S``: so the number of
series is bounded whatever the number of runs stored. ``recoverydash_metrics_runs_eligible`` and
``recoverydash_metrics_runs_exported`` say how many runs qualified and how many were exported, so
a cut export is visible rather than silent. A figure the analysis does not know (no restart yet,
no goodput without wall time) has no sample: absent, never 0.

Every figure is the core's: ``seconds_since_last_restorable`` is
``recovery.figures.seconds_since_last_restorable`` of the stored result at scrape time (the figure
the run page and the API show); the others are stored by the analysis as the core computed them
(``figures.updates_at_risk``, ``restarts.Restart`` replayed / omitted / recomputed, the strata's
duplicate and omission rates, ``costs.goodput``), and the contract's limits are
``recovery.contract.effective_contract``. One query reads the needed keys of the stored results
(``result -> 'restarts'``, not the charts), a few aggregates the rest: a scrape costs the same
whether 100 or 100,000 runs are stored.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, F, Min, Q, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily

from recoverydash.alerts.models import SEVERITIES, Alert, Delivery, WebhookEndpoint
from recoverydash.recovery.contract import effective_contract
from recoverydash.recovery.figures import seconds_since_last_restorable
from recoverydash.recovery.result import ClockFields, RestartEntry, StratumEntry
from recoverydash.runs.models import CheckpointObject, Run

RUN = ("project", "run_id")
HEALTHS = ("ok", "at_risk", "failing", "ended")
VERDICTS = ("exact", "replay", "omission", "replay_and_omission", "unverified")
#: Strata exported per run (the most consumed first).
MAX_STRATA_PER_RUN = 20


@dataclass(frozen=True)
class Metric:
    """One exported family: ``kind`` gauge or counter, its labels and what it means (with the
    definition's anchor in docs/definitions.md where it has one)."""

    kind: str
    labels: tuple
    help: str


#: Every family the collector exports (the counters of :mod:`.counters` are beside it), by name.
METRICS: dict[str, Metric] = {
    "recoverydash_run_seconds_since_last_restorable": Metric(
        "gauge", RUN, "Seconds since the newest restorable generation of the live lineage was "
        "committed (since the first event without one), at scrape time; stops at the end of an "
        "ended run. docs/definitions.md#seconds-since-last-restorable"),
    "recoverydash_run_updates_at_risk": Metric(
        "gauge", RUN, "Updates of the live lineage committed after the last restorable "
        "generation. docs/definitions.md#updates-at-risk"),
    "recoverydash_run_health": Metric(
        "gauge", RUN + ("health",), "1 for the run's health (ok, at_risk, failing, ended), 0 for "
        "the others. docs/definitions.md#health"),
    "recoverydash_run_restarts": Metric(
        "gauge", RUN, "Restarts the analysis found (attempts that resumed an earlier one)."),
    "recoverydash_run_last_restart_attempt": Metric(
        "gauge", RUN, "The attempt number of the last restart."),
    "recoverydash_run_last_restart_replayed": Metric(
        "gauge", RUN, "Positions the last restart trained on again. docs/definitions.md#replayed"),
    "recoverydash_run_last_restart_omitted": Metric(
        "gauge", RUN, "Positions the last restart skipped. docs/definitions.md#omitted"),
    "recoverydash_run_last_restart_recomputed": Metric(
        "gauge", RUN, "Positions read or committed again after the last restart (its price, not "
        "a defect). docs/definitions.md#recomputed"),
    "recoverydash_run_last_restart_verdict": Metric(
        "gauge", RUN + ("verdict",), "1 for the last restart's verdict (exact, replay, omission, "
        "replay_and_omission, unverified), 0 for the others. docs/definitions.md#verdict"),
    "recoverydash_run_stratum_duplicate_rate": Metric(
        "gauge", RUN + ("stratum",), "Duplicates over consumed positions of one stratum. "
        "docs/definitions.md#duplicate-rate"),
    "recoverydash_run_stratum_omission_rate": Metric(
        "gauge", RUN + ("stratum",), "Omissions over positions due of one stratum. "
        "docs/definitions.md#omission-rate"),
    "recoverydash_run_goodput": Metric(
        "gauge", RUN, "Useful seconds over wall seconds (ratio, at most 1). "
        "docs/definitions.md#goodput"),
    "recoverydash_run_alerts_open": Metric(
        "gauge", RUN + ("severity",), "The run's alerts firing or acknowledged, by severity."),
    "recoverydash_run_contract_max_checkpoint_age_seconds": Metric(
        "gauge", RUN, "The run's contract: seconds since the last restorable generation above "
        "which checkpoint_stale fires."),
    "recoverydash_run_contract_max_replay_samples": Metric(
        "gauge", RUN, "The run's contract: replayed positions above which restart_replay fires."),
    "recoverydash_run_contract_max_omission_samples": Metric(
        "gauge", RUN, "The run's contract: omitted positions above which restart_omission "
        "fires."),
    "recoverydash_run_analysis_pending": Metric(
        "gauge", RUN, "1 while events of the run arrived that the stored analysis does not "
        "reflect yet (the figures above predate them)."),
    "recoverydash_metrics_runs_eligible": Metric(
        "gauge", (), "Runs that qualify for per-run metrics (analysed; not ended, or ended within "
        "RECOVERYDASH_METRICS_ENDED_WINDOW_S)."),
    "recoverydash_metrics_runs_exported": Metric(
        "gauge", (), "Runs exported (at most RECOVERYDASH_METRICS_MAX_RUNS, most recently heard "
        "from first)."),
    "recoverydash_analysis_lag_seconds": Metric(
        "gauge", ("project",), "Seconds since the oldest analysis request no worker has started "
        "yet; a run behind its events with no request waiting counts from its newest event."),
    "recoverydash_analysis_pending_runs": Metric(
        "gauge", ("project",), "Runs whose stored analysis is behind their events (failed ones "
        "excluded)."),
    "recoverydash_analysis_failed_runs": Metric(
        "gauge", ("project",), "Runs whose newest events the core refused (analysis_error), "
        "waiting for new events."),
    "recoverydash_verification_queue_depth": Metric(
        "gauge", ("project",), "Checkpoint objects of committed manifests not verified in "
        "storage yet (pending, or a transient error to retry)."),
    "recoverydash_webhook_deliveries_failed": Metric(
        "counter", ("project", "kind"), "Webhook deliveries that failed for good (a permanent "
        "refusal, or out of attempts)."),
    "recoverydash_webhook_deliveries_pending": Metric(
        "gauge", ("project", "kind"), "Webhook deliveries waiting for their first or next "
        "attempt."),
    "recoverydash_webhook_endpoints_disabled": Metric(
        "gauge", ("project",), "Webhook endpoints disabled (a receiver answered 410)."),
    "recoverydash_alert_flaps": Metric(
        "counter", ("project", "rule"), "Alert subjects that cleared within "
        "RECOVERYDASH_FLAP_WINDOW_S of being told, on a fact that was already there when they "
        "were (evidence on its way that settled), by rule. docs/definitions.md#flaps"),
}


def _family(name: str):
    spec = METRICS[name]
    cls = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
    return cls(name, spec.help, labels=list(spec.labels))


def exported_runs(projects, now=None) -> tuple[list[dict], int]:
    """``(rows, eligible)``: the runs of ``projects`` (a Project queryset) whose metrics are
    exported, newest first, at most ``RECOVERYDASH_METRICS_MAX_RUNS``, each a dict of the run's
    columns and the needed keys of its stored result; and how many runs qualified."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.RECOVERYDASH_METRICS_ENDED_WINDOW_S)
    runs = (Run.objects.filter(project__in=projects, analysis__isnull=False)
            .filter(~Q(analysis__health="ended") | Q(last_received_at__gte=cutoff)))
    eligible = runs.count()
    rows = list(runs.order_by("-last_received_at", "-pk").values(
        "pk", "run_id", "first_event_at", "ingest_seq", "contract",
        project_name=F("project__name"), analysed_seq=F("analysis__ingest_seq"),
        health=F("analysis__health"),
        last_restorable=F("analysis__result__last_restorable"),
        result_first_event_at=F("analysis__result__first_event_at"),
        ended_at=F("analysis__result__ended_at"),
        updates_at_risk=F("analysis__result__updates_at_risk"),
        restarts=F("analysis__result__restarts"), result_strata=F("analysis__result__strata"),
        goodput=F("analysis__result__costs__goodput"),
    )[:settings.RECOVERYDASH_METRICS_MAX_RUNS])
    return rows, eligible


class RecoverydashCollector:
    """A prometheus_client collector of the projects in ``projects`` (a Project queryset: one
    project for a token's scrape, every project for the operator's), read when collected."""

    def __init__(self, projects):
        self.projects = projects

    def describe(self):
        return [_family(name) for name in METRICS]

    def collect(self):
        now = timezone.now()
        names = sorted(self.projects.values_list("name", flat=True))
        yield from self.run_families(now)
        yield from self.service_families(names, now)

    # --- per run ---------------------------------------------------------------------------
    def run_families(self, now: datetime) -> Iterator[Any]:
        rows, eligible = exported_runs(self.projects, now)
        fam = {name: _family(name) for name in METRICS if name.startswith("recoverydash_run_")}
        open_alerts: dict[tuple[int, str], int] = {}
        for a in (Alert.objects.filter(run_id__in=[r["pk"] for r in rows])
                  .exclude(state="resolved").values("run_id", "severity")
                  .annotate(n=Count("id"))):
            open_alerts[(a["run_id"], a["severity"])] = a["n"]
        for row in rows:
            labels = [row["project_name"], row["run_id"]]
            clock: ClockFields = {"last_restorable": row["last_restorable"],
                                  "first_event_at": row["result_first_event_at"],
                                  "ended_at": row["ended_at"]}
            seconds = seconds_since_last_restorable(clock, now, row["first_event_at"])
            if seconds is not None:
                fam["recoverydash_run_seconds_since_last_restorable"].add_metric(labels, seconds)
            if isinstance(row["updates_at_risk"], int):
                fam["recoverydash_run_updates_at_risk"].add_metric(labels, row["updates_at_risk"])
            for health in HEALTHS:
                fam["recoverydash_run_health"].add_metric(labels + [health],
                                                          float(row["health"] == health))
            restarts: list[RestartEntry] = row["restarts"] or []
            fam["recoverydash_run_restarts"].add_metric(labels, len(restarts))
            if restarts:
                last = restarts[-1]
                fam["recoverydash_run_last_restart_attempt"].add_metric(labels, last["attempt"])
                for field, count in (("replayed", last["replayed"]), ("omitted", last["omitted"]),
                                     ("recomputed", last["recomputed"])):
                    fam[f"recoverydash_run_last_restart_{field}"].add_metric(labels, count)
                for verdict in VERDICTS:
                    fam["recoverydash_run_last_restart_verdict"].add_metric(
                        labels + [verdict], float(last.get("verdict") == verdict))
            stored: list[StratumEntry] = row["result_strata"] or []
            strata = sorted(stored, key=lambda s: (-s.get("consumed", 0), s["stratum"]))
            for stratum in strata[:MAX_STRATA_PER_RUN]:
                fam["recoverydash_run_stratum_duplicate_rate"].add_metric(
                    labels + [stratum["stratum"]], stratum["duplicate_rate"])
                fam["recoverydash_run_stratum_omission_rate"].add_metric(
                    labels + [stratum["stratum"]], stratum["omission_rate"])
            if isinstance(row["goodput"], (int, float)):
                fam["recoverydash_run_goodput"].add_metric(labels, row["goodput"])
            for severity in SEVERITIES:
                fam["recoverydash_run_alerts_open"].add_metric(
                    labels + [severity], open_alerts.get((row["pk"], severity), 0))
            contract = effective_contract(row["contract"] or None)
            fam["recoverydash_run_contract_max_checkpoint_age_seconds"].add_metric(
                labels, float(contract["max_checkpoint_age_s"]))
            fam["recoverydash_run_contract_max_replay_samples"].add_metric(
                labels, float(contract["max_replay_samples"]))
            fam["recoverydash_run_contract_max_omission_samples"].add_metric(
                labels, float(contract["max_omission_samples"]))
            fam["recoverydash_run_analysis_pending"].add_metric(
                labels, float(row["analysed_seq"] < row["ingest_seq"]))
        yield from fam.values()
        eligible_family = _family("recoverydash_metrics_runs_eligible")
        eligible_family.add_metric([], eligible)
        exported = _family("recoverydash_metrics_runs_exported")
        exported.add_metric([], len(rows))
        yield eligible_family
        yield exported

    # --- the service ------------------------------------------------------------------------
    def service_families(self, names: list[str], now):
        runs = Run.objects.filter(project__in=self.projects)
        failed = Q(analysis__error_seq__gte=F("ingest_seq"))
        behind = (runs.filter(ingest_seq__gt=0)
                  .filter(Q(analysis__isnull=True) | Q(analysis__ingest_seq__lt=F("ingest_seq")))
                  .exclude(failed).values("project__name")
                  .annotate(n=Count("id"), since=Min(Coalesce("analysis_queued_at",
                                                              "last_received_at"))))
        behind = {b["project__name"]: b for b in behind}
        failed_runs = dict(runs.filter(failed).values("project__name")
                           .annotate(n=Count("id")).values_list("project__name", "n"))
        lag, pending, failing = (_family("recoverydash_analysis_lag_seconds"),
                                 _family("recoverydash_analysis_pending_runs"),
                                 _family("recoverydash_analysis_failed_runs"))
        for name in names:
            b = behind.get(name)
            since = b["since"] if b else None
            lag.add_metric([name], max(0.0, (now - since).total_seconds()) if since else 0.0)
            pending.add_metric([name], b["n"] if b else 0)
            failing.add_metric([name], failed_runs.get(name, 0))
        yield from (lag, pending, failing)

        queue = dict(CheckpointObject.objects
                     .filter(generation__run__project__in=self.projects, in_manifest=True,
                             check_status__in=("pending", "error"))
                     .values("generation__run__project__name").annotate(n=Count("id"))
                     .values_list("generation__run__project__name", "n"))
        depth = _family("recoverydash_verification_queue_depth")
        for name in names:
            depth.add_metric([name], queue.get(name, 0))
        yield depth

        kinds = [k for k, _ in WebhookEndpoint.KINDS]
        counts: dict[tuple[str, str, str], int] = {}
        for d in (Delivery.objects.filter(endpoint__project__in=self.projects,
                                          status__in=("failed", "pending"))
                  .values("endpoint__project__name", "endpoint__kind", "status")
                  .annotate(n=Count("id"))):
            counts[(d["endpoint__project__name"], d["endpoint__kind"], d["status"])] = d["n"]
        failed_family = _family("recoverydash_webhook_deliveries_failed")
        pending_family = _family("recoverydash_webhook_deliveries_pending")
        for name in names:
            for kind in kinds:
                failed_family.add_metric([name, kind], counts.get((name, kind, "failed"), 0))
                pending_family.add_metric([name, kind], counts.get((name, kind, "pending"), 0))
        disabled = dict(WebhookEndpoint.objects.filter(project__in=self.projects, enabled=False)
                        .values("project__name").annotate(n=Count("id"))
                        .values_list("project__name", "n"))
        disabled_family = _family("recoverydash_webhook_endpoints_disabled")
        for name in names:
            disabled_family.add_metric([name], disabled.get(name, 0))
        yield from (failed_family, pending_family, disabled_family)
        yield self.flap_family(names)

    def flap_family(self, names: list[str]):
        """``recoverydash_alert_flaps_total`` per project and rule: ``Alert.flaps`` summed over
        every alert stored (one aggregate); every rule of ``alerts.rules.RULES`` is exported,
        0 when it never flapped."""
        from recoverydash.alerts.rules import RULES

        counts = {(p, r): n for p, r, n in
                  Alert.objects.filter(run__project__in=self.projects, flaps__gt=0)
                  .values("run__project__name", "rule").annotate(n=Sum("flaps"))
                  .values_list("run__project__name", "rule", "n")}
        family = _family("recoverydash_alert_flaps")
        for name in names:
            for rule in sorted(set(RULES) | {r for p, r in counts if p == name}):
                family.add_metric([name, rule], counts.get((name, rule), 0))
        return family
