"""Verify at the moment of the question: before the restore plan (or the run page) names a
generation, the sizes of its objects are checked in storage again (a ``stat`` or ``HEAD`` each,
in parallel, within ``RECOVERYDASH_RESTORE_RECHECK_S`` seconds in total).

A generation whose object is now missing or of another size is flipped at once (the failing
object's result is stored, the analysis rejects the generation) and the plan falls back to the
next restorable one, saying so in ``warnings`` (code ``generation_rejected``); the run is then
analysed again in a worker, whose alert evaluation raises ``generation_rejected``, and a full
verification of the flipped generation is queued. What the time budget did not reach, or storage
that did not answer, is said too (``storage_recheck_incomplete``, ``storage_recheck_failed``);
nothing is smoothed away.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from django.conf import settings
from django.utils import timezone

from recoverydash import recovery
from recoverydash.checkpoints.objects import ObjectCheck, StorageError
from recoverydash.recovery.result import AnalysisResult
from recoverydash.runs.analysis import analyze_with_result, plan_restore, request_analysis
from recoverydash.runs.models import CheckpointObject, Generation, Run
from recoverydash.storage.locations import Locations, Resolved
from recoverydash.storage.verification import (
    _enqueue_verification,
    _store,
    check_one,
    generation_base,
)

FAILURES = ("object_missing", "size_mismatch")
PARALLEL = 8


@dataclass
class Confirmation:
    """What re-checking one generation's object sizes found. ``failed``: ``(uri, status,
    detail)`` of the first object that no longer matches (the generation was flipped);
    ``checked`` / ``total`` objects; ``unreachable``: objects storage did not answer for (with
    the first error); ``seconds`` spent."""

    generation_id: str
    total: int = 0
    checked: int = 0
    failed: tuple | None = None
    unreachable: int = 0
    error: str = ""
    seconds: float = 0.0

    @property
    def complete(self) -> bool:
        return self.failed is None and self.checked == self.total


@dataclass
class _Work:
    obj: CheckpointObject
    where: Resolved
    result: ObjectCheck | None = None
    error: str = ""
    done: bool = field(default=False)


def confirm_generation(generation: Generation, deadline: float) -> Confirmation:
    """Check the size of every manifest object of ``generation`` in storage before
    ``deadline`` (``time.monotonic()``), through the project's storage locations, in parallel.
    The first object found missing or of another size is stored (``_store``: its detail, never
    what was observed), which rejects the generation at the next analysis. Never raises a
    StorageError: what storage did not answer is counted in ``unreachable``."""
    started = time.monotonic()
    objects = list(CheckpointObject.objects.filter(generation=generation, in_manifest=True)
                   .order_by("pk"))
    out = Confirmation(generation.generation_id, total=len(objects))
    remaining = max(deadline - started, 0.05)
    locations = Locations(generation.run.project_id, timeouts=(min(1.0, remaining), remaining))
    base, server_side = generation_base(generation)
    work = []
    for obj in objects:
        where = locations.resolve(obj.uri, base, server_side)
        if where.refused or where.unverifiable or obj.size is None:
            out.total -= 1  # not readable: the stored verdict already says so
            continue
        work.append(_Work(obj, where))
        if where.location is not None and where.uri.startswith("s3://"):
            try:  # clients are made here, not in the threads (boto3 sessions are not shared)
                locations.client(where.location)
            except StorageError:
                pass  # raised again, and counted, when the object is checked

    def run(item: _Work) -> None:
        try:
            item.result = check_one(item.obj, item.where, locations, size_only=True)
        except StorageError as exc:
            item.error = str(exc)
        item.done = True

    pool = ThreadPoolExecutor(max_workers=PARALLEL, thread_name_prefix="recheck")
    try:
        futures = [pool.submit(run, item) for item in work]
        wait(futures, timeout=max(deadline - time.monotonic(), 0.0))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # a hung stat must not hold the answer
    for item in work:
        if not item.done:
            continue
        if item.error:
            out.unreachable += 1
            out.error = out.error or item.error
            continue
        out.checked += 1
        if item.result is not None and item.result.status in FAILURES and out.failed is None:
            _store(item.obj, item.result, item.where.uri)
            out.failed = (item.obj.uri, item.result.status, item.result.detail)
    out.seconds = time.monotonic() - started
    if out.failed is None and out.checked == out.total:
        Generation.objects.filter(pk=generation.pk).update(verified_at=timezone.now())
    return out


def _flipped_warning(c: Confirmation) -> dict:
    """The warning of a generation ``c`` that failed its re-check (``c.failed`` is set)."""
    uri, status, detail = c.failed or ("?", "?", "?")
    return {"code": "generation_rejected",
            "detail": f"{c.generation_id} failed the storage re-check just now ({status}: {uri}: "
                      f"{detail}); it is rejected and not planned"}


def _incomplete_warnings(c: Confirmation, budget: float, verified_at) -> list[dict]:
    out = []
    missing = c.total - c.checked - c.unreachable
    if c.unreachable:
        out.append({"code": "storage_recheck_failed",
                    "detail": f"storage did not answer for {c.unreachable} of {c.total} objects "
                              f"of {c.generation_id} ({c.error}); their sizes were last "
                              f"verified {_when(verified_at)}"})
    if missing > 0:
        out.append({"code": "storage_recheck_incomplete",
                    "detail": f"sizes of {c.checked} of {c.total} objects of {c.generation_id} "
                              f"re-checked within {budget:g} s; the others were last verified "
                              f"{_when(verified_at)}"})
    return out


def _when(moment) -> str:
    return moment.isoformat() if moment is not None else "never"


def restore_plan_confirmed(run: Run, world_size: int | None = None,
                           dataset_version: str | None = None, config_digest: str | None = None,
                           *, budget_s: float | None = None) -> recovery.RestorePlan:
    """docs/ingest-v1.md#restore-plan, true when it is asked: the run analysed up to its newest
    events and ``recovery.restore_plan`` of it (``runs.analysis.plan_restore``; a 200 lists
    ``newer_undecided``: ``recovery.figures.newer_undecided``), then the sizes of the generation
    it names are re-checked (``confirm_generation``) within ``budget_s`` (default
    ``RECOVERYDASH_RESTORE_RECHECK_S``) seconds; a generation that fails is flipped and the plan
    is made again, falling back to the next restorable generation (or 409 when none is left).
    The answer's ``warnings`` gain ``generation_rejected`` per generation flipped, and
    ``storage_recheck_incomplete`` / ``storage_recheck_failed`` when the named generation could
    not be re-checked whole.
    Raises AnalysisFailed (the core refused the run's inputs)."""
    budget = settings.RECOVERYDASH_RESTORE_RECHECK_S if budget_s is None else budget_s
    deadline = time.monotonic() + budget
    flipped: list[Confirmation] = []
    plan = plan_restore(run, world_size, dataset_version, config_digest)
    extra: list[dict] = []
    while plan.status_code == 200 and budget > 0:
        generation = (Generation.objects.select_related("run")
                      .filter(run=run, generation_id=plan.body["generation_id"]).first())
        if generation is None:
            break
        if time.monotonic() >= deadline:
            extra = _incomplete_warnings(Confirmation(generation.generation_id,
                                                      total=len(plan.body.get("objects", []))),
                                         budget, generation.verified_at)
            break
        confirmation = confirm_generation(generation, deadline)
        if confirmation.failed is None:
            extra = _incomplete_warnings(confirmation, budget, generation.verified_at)
            break
        flipped.append(confirmation)
        plan = plan_restore(run, world_size, dataset_version, config_digest)
    if flipped:
        _after_flip(run, flipped)
    if plan.status_code == 200:
        plan.body["warnings"] = (list(plan.body.get("warnings", []))
                                 + [_flipped_warning(c) for c in flipped] + extra)
    return plan


def _after_flip(run: Run, flipped: list[Confirmation]) -> None:
    """Alerts and the full picture follow in the workers: the run is analysed again (its alert
    evaluation raises ``generation_rejected``) and each flipped generation is verified whole."""
    for c in flipped:
        pk = (Generation.objects.filter(run=run, generation_id=c.generation_id)
              .values_list("pk", flat=True).first())
        if pk is not None:
            _enqueue_verification(pk, timezone.now().isoformat())
    request_analysis(run.pk, force=True)


@dataclass
class PageCheck:
    """What the run page says about its restorable generation's storage: re-checked just now
    (``confirmation``), or ``None`` when its last verification is recent enough."""

    generation_id: str | None
    confirmation: Confirmation | None = None
    flipped: bool = False


def confirm_last_restorable(run: Run, *, max_age_s: float | None = None,
                            budget_s: float | None = None) -> PageCheck:
    """For the run page's first card: when the run's last restorable generation was last
    verified more than ``max_age_s`` (default ``RECOVERYDASH_PAGE_RECHECK_S``) seconds ago,
    re-check its object sizes within ``budget_s``; a failure flips it and the stored analysis is
    brought up to date here, so the page that follows names the previous restorable generation.
    Returns what was done."""
    from recoverydash.runs.models import Analysis

    analysis = Analysis.objects.filter(run=run).only("result").first()
    result: AnalysisResult = analysis.result if analysis and analysis.result else {}
    last = result.get("last_restorable")
    gid = last.get("generation_id") if last else None
    if not gid:
        return PageCheck(None)
    generation = Generation.objects.select_related("run").filter(run=run, generation_id=gid).first()
    if generation is None:
        return PageCheck(gid)
    age = settings.RECOVERYDASH_PAGE_RECHECK_S if max_age_s is None else max_age_s
    if generation.verified_at is not None and \
            (timezone.now() - generation.verified_at).total_seconds() < age:
        return PageCheck(gid)
    budget = settings.RECOVERYDASH_RESTORE_RECHECK_S if budget_s is None else budget_s
    confirmation = confirm_generation(generation, time.monotonic() + budget)
    if confirmation.failed is None:
        return PageCheck(gid, confirmation)
    analyze_with_result(run)
    _after_flip(run, [confirmation])
    return PageCheck(gid, confirmation, flipped=True)
