"""The read API (docs/ingest-v1.md#5-reading-the-analysis): a run's recovery analysis and its
restore plan.

``GET /api/v1/runs/{run_id}/recovery`` answers from the stored analysis (written by the workers),
with the clock-dependent figure (seconds since the last restorable generation) computed at request
time and ``pending_analysis`` telling whether events arrived since. ``GET .../restore-plan`` brings
the analysis up to date synchronously first: a restarting trainer must see every generation
committed so far. Both need scope ``read``; another project's run is a 404. Mounted under
``/api/v1/runs`` by :mod:`recoverydash.ingest.api`, beside the token checks it uses
(:mod:`recoverydash.ingest.auth`).
"""

from __future__ import annotations

from typing import Literal

from django.http import HttpRequest
from django.utils import timezone
from ninja import Query, Router, Schema, Status
from pydantic import Field

from recoverydash.alerts.models import Alert
from recoverydash.recovery.figures import seconds_since_last_restorable
from recoverydash.recovery.result import AnalysisResult
from recoverydash.runs.analysis import AnalysisFailed
from recoverydash.runs.models import Analysis, Run

from .auth import read_auth, run_for
from .errors import AnalysisUnavailable

router = Router(tags=["analysis"])


class CursorOut(Schema):
    stratum: str
    epoch: int
    position: int


class CodeOut(Schema):
    code: str
    detail: str


class LastRestorableOut(Schema):
    generation_id: str
    update: int
    committed_at: str | None


class VerifyingOut(Schema):
    objects_checked: int
    objects_total: int
    bytes_checked: int
    bytes_total: int
    done: bool
    text: str = Field(description='e.g. "verifying: 37 of 64 objects, 210 GB of 512 GB"')


class GenerationOut(Schema):
    generation_id: str
    attempt: int
    update: int | None
    status: Literal["pending", "committed", "restorable", "rejected", "abandoned"]
    reasons: list[CodeOut]
    verifying: VerifyingOut | None = Field(
        None, description="extension: a committed generation whose objects are still being "
                          "verified in storage, how far that has come "
                          "(docs/definitions.md#verification-progress); null otherwise")


class RestartOut(Schema):
    attempt: int
    resumed_from: str | None
    resumed_update: int
    world_size_before: int | None
    world_size_after: int | None
    expected_cursor: list[CursorOut]
    resume_cursor: list[CursorOut]
    replayed: int
    omitted: int
    recomputed: int
    lost_updates: int
    lost_seconds: float | None
    recovery_seconds: float | None
    verdict: Literal["exact", "replay", "omission", "replay_and_omission", "unverified"]
    findings: list[CodeOut]
    units: Literal["samples", "tokens", "mixed"] = Field(
        "samples", description="what replayed, omitted and recomputed count "
                               "(docs/definitions.md#units); samples for an older analysis")


class StratumOut(Schema):
    stratum: str
    consumed: int
    duplicates: int
    omissions: int
    duplicate_rate: float
    omission_rate: float
    units: Literal["samples", "tokens"] = Field(
        "samples", description="what the counts count (docs/definitions.md#units)")


class AlertOut(Schema):
    id: str
    rule: str
    severity: Literal["info", "warning", "critical"]
    state: Literal["firing", "acknowledged", "resolved"]
    opened_at: str
    resolved_at: str | None
    summary: str


class RecoveryOut(Schema):
    run_id: str
    pending_analysis: bool = Field(description="true while ingested events are not yet "
                                               "reflected below")
    analysis_computed_at: str | None = Field(None, description="when the analysis ran")
    health: Literal["ok", "at_risk", "failing", "ended", "unknown"] = Field(
        description="docs/definitions.md#health; unknown while no analysis of the run exists")
    last_restorable: LastRestorableOut | None
    seconds_since_last_restorable: float | None = Field(
        description="now minus committed_at of the newest restorable generation of the live "
                    "lineage; with none yet, since the run's first event")
    updates_at_risk: int
    generations: list[GenerationOut]
    restarts: list[RestartOut]
    strata: list[StratumOut]
    alerts: list[AlertOut]
    costs: dict = Field(default_factory=dict, description="per-incident lost and recovery "
                        "seconds, goodput, MTBF, median save cost, Young interval")
    analysis_error: str | None = Field(None, description="why the newest events could not "
                                          "be analysed (the figures above predate them); null "
                                          "when the last analysis succeeded")


class ObjectOut(Schema):
    uri: str
    shard: str | None = None
    component: str | None = None
    size: int
    sha256: str | None = None
    update: int | None = None


class NewerUndecidedOut(Schema):
    generation_id: str
    update: int
    status: Literal["committed", "pending"]


class RestorePlanOut(Schema):
    generation_id: str
    update: int
    logger_rewind_update: int = Field(
        description="the update to rewind loggers to: the restored generation's update "
                    "(W&B resume_from / fork_from f\"{run_id}?_step={update}\", TensorBoard "
                    "purge_step=update + 1); docs/definitions.md#logger-rewind-update")
    committed_at: str | None
    objects: list[ObjectOut]
    cursor: list[CursorOut]
    warnings: list[CodeOut]
    newer_undecided: list[NewerUndecidedOut] = Field(
        default_factory=list,
        description="extension: generations newer (by update) than the one named whose "
                    "restorability is not decided yet (status committed or pending), newest "
                    "first; docs/definitions.md#newer-undecided")


class RejectedOut(Schema):
    generation_id: str
    status: str
    reasons: list[CodeOut]


class NoRestorableOut(Schema):
    error: Literal["no_restorable_generation"]
    rejected: list[RejectedOut]


class RestorePlanQuery(Schema):
    world_size: int | None = Field(None, ge=1, description="ranks of the restarting attempt")
    dataset_version: str | None = Field(None, max_length=500)
    config_digest: str | None = Field(None, max_length=500)


def with_verification_progress(run: Run, generations: list) -> list:
    """``generations`` (the stored analysis's) with ``verifying`` added to each ``committed``
    one whose objects are not all checked yet (``storage.verification.progress_by_generation``,
    one query over the committed generations' objects)."""
    from recoverydash.storage.verification import progress_by_generation

    committed = [g.get("generation_id") for g in generations if g.get("status") == "committed"]
    if not committed:
        return generations
    progress = progress_by_generation(run.pk, committed)
    out = []
    for g in generations:
        p = progress.get(g.get("generation_id")) if g.get("status") == "committed" else None
        out.append({**g, "verifying": p.to_dict()} if p is not None and not p.done else g)
    return out


def recovery_view(run: Run) -> dict:
    """The ``recovery`` body (docs/ingest-v1.md#recovery) of a run from its stored analysis and
    alert rows."""
    now = timezone.now()
    analysis = Analysis.objects.filter(run=run).first()
    result: AnalysisResult = analysis.result if analysis else {}
    alerts = [a.to_dict() for a in Alert.objects.filter(run=run).order_by("-opened_at")[:200]]
    return {
        "run_id": run.run_id,
        "pending_analysis": analysis is None or analysis.ingest_seq < run.ingest_seq,
        "analysis_computed_at": analysis.computed_at.isoformat() if analysis else None,
        "health": result.get("health") or "unknown",
        "last_restorable": result.get("last_restorable"),
        "seconds_since_last_restorable": seconds_since_last_restorable(
            result, now, run.first_event_at),
        "updates_at_risk": result.get("updates_at_risk", 0),
        "generations": with_verification_progress(run, result.get("generations", [])),
        "generations_summary": result.get("generations_summary"),
        "restarts": result.get("restarts", []),
        "strata": result.get("strata", []),
        "alerts": alerts,
        "costs": result.get("costs", {}),
        "analysis_error": (analysis.error or None) if analysis else None,
    }


@router.get("/{run_id}/recovery", auth=read_auth, response={200: RecoveryOut},
            summary="A run's recovery analysis")
def get_recovery(request: HttpRequest, run_id: str):
    """Which checkpoint can be resumed, what is at risk, and what each restart did to the data."""
    return Status(200, recovery_view(run_for(request.auth, run_id)))


@router.get("/{run_id}/restore-plan", auth=read_auth,
            response={200: RestorePlanOut, 409: NoRestorableOut},
            summary="Which generation a restarting trainer should load")
def get_restore_plan(request: HttpRequest, run_id: str, query: Query[RestorePlanQuery]):
    """200 with the newest restorable generation of the live lineage, its objects and data
    cursor, warnings when the restart differs (``world_size_changed``, ...) and the newer
    generations not decided yet (``newer_undecided``); 409
    ``no_restorable_generation`` listing the generations that are not restorable."""
    from recoverydash.ingest.discovery import restore_plan_discovered

    try:
        plan = restore_plan_discovered(run_for(request.auth, run_id), world_size=query.world_size,
                                       dataset_version=query.dataset_version,
                                       config_digest=query.config_digest)
    except AnalysisFailed as exc:
        raise AnalysisUnavailable(f"the run's events cannot be analysed: {exc}") from None
    return Status(plan.status_code, plan.body)


__all__ = ["router", "recovery_view"]
