"""Verifying a committed generation's objects in storage, and re-checking them later.

The checks themselves (HEAD, size, sha256; ``file://`` and ``s3://``) live in the pure module
``recoverydash.checkpoints.objects`` that the SDK shares. This module resolves each object through
the project's storage locations (``recoverydash.storage.locations``: an object under none of them
is ``object_outside_locations`` and never opened or requested), checks it with that location's
credentials, stores one result per object with the time of the check, and asks for the run to be
analysed again.

Nothing here lets one object stop the others: a transient storage error is stored as that
object's ``error`` state (checked again by the sweep), a permanent one as ``storage_unverified``.
A check that starts and never finishes (the worker killed, a time limit) is counted
(``check_attempts``); past ``RECOVERYDASH_VERIFY_MAX_ATTEMPTS`` the object is stored as
``storage_unverified`` without touching storage again. A verification that runs out of its time
budget stops between objects and enqueues its own continuation. The periodic tasks
(``recheck``, ``sweep_unverified``) only enqueue one verification per generation, so a poison
generation costs its own task and nothing else.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Max, Q
from django.utils import timezone

from recoverydash.checkpoints import paths
from recoverydash.checkpoints.objects import (
    ObjectCheck,
    PermanentStorageError,
    TransientStorageError,
    verify_object,
)
from recoverydash.runs.analysis import request_analysis
from recoverydash.runs.models import Analysis, CheckpointObject, Generation
from recoverydash.runs.queue import VERIFY_GENERATION, enqueue
from recoverydash.runs.seq import mark_changed
from recoverydash.storage.locations import Locations, Resolved

log = logging.getLogger(__name__)

UNCHECKED = ("pending", "error")


def generation_base(generation: Generation) -> tuple[str | None, bool]:
    """``(folder, is_server_side)`` that the generation's relative object URIs resolve against:
    where discovery found its manifest (server side), else the manifest's own ``base_uri``, else
    its ``location`` + ``/<generation_id>`` (both as the trainer names them, so path mapping
    applies); ``(None, False)`` when none is known."""
    if generation.found_at:
        return generation.found_at, True
    manifest = generation.manifest or {}
    base = manifest.get("base_uri")
    if isinstance(base, str) and base:
        return base, False
    location = manifest.get("location")
    if isinstance(location, str) and location:
        return paths.join(location, generation.generation_id), False
    return None, False


@dataclass
class VerifyOutcome:
    """What one pass over a generation's objects did: ``checked`` results stored,
    ``transient`` objects left in ``error``, ``out_of_time`` objects left for a continuation."""

    checked: int = 0
    transient: int = 0
    out_of_time: int = 0


def _save_result(obj: CheckpointObject, status: str, fields: list) -> None:
    """Save ``fields`` of ``obj`` with its new ``check_status`` ``status``, in one transaction
    with the change marker when the status changes (``runs.seq.mark_changed``: the generation's
    seq and the run's ingest seq move, so the next analysis reads the generation again and an
    unchanged ingest seq still means unchanged inputs)."""
    changed = obj.check_status != status
    obj.check_status = status
    with transaction.atomic():
        if changed:
            run_pk = Generation.objects.filter(pk=obj.generation_id).values_list(
                "run_id", flat=True).first()
            if run_pk is not None:
                mark_changed(run_pk, obj.generation_id)
        obj.save(update_fields=fields)


def _store(obj: CheckpointObject, result: ObjectCheck, resolved: str = "") -> None:
    """Store a finished check. Observed size and digest are kept only when the object verified:
    what a failing object holds is never stored, so no page or API can show it. A changed
    status marks the generation changed (:func:`_save_result`)."""
    ok = result.status == "ok"
    obj.check_detail = (result.detail or "")[:2000]
    obj.observed_size = result.observed_size if ok else None
    obj.observed_sha256 = (result.observed_sha256 or "") if ok else ""
    obj.resolved_uri = resolved[:2000]
    obj.checked_at = timezone.now()
    obj.check_attempts = 0
    _save_result(obj, result.status, ["check_status", "check_detail", "observed_size",
                                      "observed_sha256", "resolved_uri", "checked_at",
                                      "check_attempts"])


def _start(obj: CheckpointObject) -> bool:
    """Count a check as started before touching storage (a worker killed in the middle leaves
    the count). False, after storing ``storage_unverified``, when earlier checks of this object
    never finished often enough that it must not be tried again."""
    limit = settings.RECOVERYDASH_VERIFY_MAX_ATTEMPTS
    if obj.check_attempts >= limit:
        _store(obj, ObjectCheck("storage_unverified",
                                f"not verified: {obj.check_attempts} checks of this object "
                                "started and never finished (the worker was killed or hit its "
                                "time limit); not tried again until the object changes"),
               obj.resolved_uri)
        return False
    obj.check_attempts += 1
    obj.check_started_at = timezone.now()
    CheckpointObject.objects.filter(pk=obj.pk).update(check_attempts=F("check_attempts") + 1,
                                                       check_started_at=obj.check_started_at)
    return True


def check_one(obj: CheckpointObject, where: Resolved, locations: Locations, *,
              deadline: float | None = None, size_only: bool = False) -> ObjectCheck:
    """The check of one object that ``where`` says may be read (raises StorageError as
    ``verify_object``)."""
    client = locations.client(where.location) if where.uri.startswith("s3://") else None
    return verify_object(where.uri, obj.size if obj.size is not None else -1,
                         obj.sha256 or None, s3_client=client,
                         full_hash_max_bytes=settings.RECOVERYDASH_FULL_HASH_MAX_BYTES,
                         root=where.root, deadline=deadline, size_only=size_only)


def _mapped_note(obj: CheckpointObject, where: Resolved, result: ObjectCheck) -> ObjectCheck:
    if where.uri == obj.uri or not result.detail:
        return result
    return ObjectCheck(result.status, f"{result.detail} (at {where.uri})", result.observed_size,
                       result.observed_sha256)


def verify_objects(objects, locations: Locations, base: str | None = None,
                   base_is_server: bool = False, *, deadline: float | None = None
                   ) -> VerifyOutcome:
    """Check each ``CheckpointObject`` and store the result (see the module docstring).

    ``base`` / ``base_is_server``: the generation folder for relative URIs
    (``generation_base``). ``deadline`` (``time.monotonic()``): no object is started after it,
    and a digest being read when it passes is abandoned, the object left unchecked for the
    continuation (or ``storage_unverified`` when it was the first object of the pass to touch
    storage, so it had the whole budget: each pass settles at least one object). Never raises a
    StorageError."""
    out = VerifyOutcome()
    looked = 0  # objects whose storage was touched in this pass
    for obj in objects:
        if deadline is not None and time.monotonic() > deadline:
            out.out_of_time += 1
            continue
        where = locations.resolve(obj.uri, base, base_is_server)
        if where.refused:
            _store(obj, ObjectCheck("object_outside_locations", where.refused))
            out.checked += 1
            continue
        if where.unverifiable:
            _store(obj, ObjectCheck("storage_unverified",
                                    f"scheme {paths.scheme_of(obj.uri)!r} cannot be verified"))
            out.checked += 1
            continue
        if obj.size is None or obj.size < 0:
            _store(obj, ObjectCheck("storage_unverified", "the manifest gives no size"),
                   where.uri)
            out.checked += 1
            continue
        if not _start(obj):
            out.checked += 1
            continue
        looked += 1
        try:
            result = check_one(obj, where, locations, deadline=deadline)
        except PermanentStorageError as exc:
            # Denied access, no credentials, a link on the way: retrying cannot help, and
            # nothing was proven either way. Stored and shown, never retried in a loop.
            result = ObjectCheck("storage_unverified", f"cannot verify: {exc}")
        except TransientStorageError as exc:
            # This object only: stored as its state, checked again by the sweep.
            obj.check_detail = f"storage did not answer: {exc}"[:2000]
            obj.checked_at, obj.check_attempts = timezone.now(), 0
            _save_result(obj, "error", ["check_status", "check_detail", "checked_at",
                                        "check_attempts"])
            out.transient += 1
            continue
        if result.timed_out and looked > 1:
            # Out of time after other objects: leave it for the continuation, which gives it
            # a whole budget.
            CheckpointObject.objects.filter(pk=obj.pk).update(
                check_attempts=F("check_attempts") - 1)
            out.out_of_time += 1
            deadline = time.monotonic() - 1
            continue
        _store(obj, _mapped_note(obj, where, result), where.uri)
        out.checked += 1
    return out


def _budget_s() -> float:
    """Seconds one verification task may spend: most of the task's soft time limit."""
    return max(1.0, settings.RECOVERYDASH_TASK_SOFT_TIME_LIMIT_S * 0.8)


def verify_generation(generation_pk: int, recheck_before: str | None = None, *,
                      recheck: bool = False) -> int:
    """Verify the manifest objects of one generation, then request analysis of its run.

    Without ``recheck_before`` the objects not checked yet (``pending``, ``error``, or left
    ``object_outside_locations`` when locations may have changed); with it (an ISO 8601 time)
    every object last checked before that time, so a re-check interrupted by its time budget
    resumes where it stopped; ``recheck`` is the same with ``recheck_before`` now. Idempotent:
    checking again stores the same results. Enqueues its own continuation when the budget ran
    out. Returns the number of objects checked."""
    if recheck and not recheck_before:
        recheck_before = timezone.now().isoformat()
    generation = Generation.objects.select_related("run__project").filter(pk=generation_pk).first()
    if generation is None or generation.manifest is None:
        return 0
    objects = CheckpointObject.objects.filter(generation=generation, in_manifest=True)
    if recheck_before:
        before = datetime.fromisoformat(recheck_before)
        objects = objects.filter(Q(checked_at__isnull=True) | Q(checked_at__lt=before))
    else:
        objects = objects.filter(check_status__in=UNCHECKED + ("object_outside_locations",))
    locations = Locations(generation.run.project_id)
    base, server_side = generation_base(generation)
    outcome = verify_objects(list(objects.order_by("pk")), locations, base, server_side,
                             deadline=time.monotonic() + _budget_s())
    Generation.objects.filter(pk=generation.pk).update(verified_at=timezone.now())
    if outcome.out_of_time:
        log.info("generation %s: %d objects left for a continuation (time budget)",
                 generation.pk, outcome.out_of_time)
        enqueue(VERIFY_GENERATION, generation.pk, recheck_before)
    request_analysis(generation.run_id, force=True)
    return outcome.checked


def _enqueue_verification(pk: int, recheck_before: str | None = None) -> bool:
    """Enqueue one generation's verification; False when it could not be sent or (tasks run
    eagerly) it failed, which is logged: the periodic callers go on with the others."""
    try:
        return enqueue(VERIFY_GENERATION, pk, recheck_before)
    except Exception:  # eager mode: the task's own error; its generation stays as it was
        log.exception("generation %s: verification failed", pk)
        return False


def sweep_unverified(limit: int = 500, now: datetime | None = None) -> int:
    """Periodic: re-queue verification of committed generations whose objects are still
    unchecked (``pending`` / ``error``) and on which no check has started for
    ``RECOVERYDASH_VERIFY_STALE_S`` (a worker died mid-verification, the broker lost the
    task, storage did not answer). A generation seen unchecked for the first time, with no
    check ever started, has its clock started instead (its first task may still be queued).
    Returns how many generations were re-queued."""
    now = now or timezone.now()
    stale = now - timedelta(seconds=settings.RECOVERYDASH_VERIFY_STALE_S)
    rows = (CheckpointObject.objects.filter(in_manifest=True, check_status__in=UNCHECKED,
                                            generation__manifest__isnull=False)
            .values("generation_id")
            .annotate(started=Max("check_started_at"), checked=Max("checked_at"))
            .order_by("generation_id"))
    count = 0
    for row in rows:
        latest = max([t for t in (row["started"], row["checked"]) if t is not None],
                     default=None)
        if latest is not None and latest > stale:
            continue  # a check ran or was queued recently: it may still be running
        # Marked as started now: a generation never looked at starts its clock here (its
        # first task may still be in the queue); one that was stale waits another period
        # after this re-queue.
        CheckpointObject.objects.filter(generation_id=row["generation_id"], in_manifest=True,
                                        check_status__in=UNCHECKED).update(check_started_at=now)
        if latest is None:
            continue
        if _enqueue_verification(row["generation_id"]):
            count += 1
        if count >= limit:
            break
    return count


def recheck(limit: int = 500, now: datetime | None = None) -> int:
    """Periodic: re-verify each run's last restorable generation (retention or a person may
    have deleted or truncated it since): every ``RECOVERYDASH_RECHECK_S`` for runs that have
    not ended, every ``RECOVERYDASH_RECHECK_ENDED_S`` for ended runs. One task per generation;
    returns how many were enqueued. Objects never checked are the sweep's
    (``sweep_unverified``)."""
    now = now or timezone.now()
    lasts = list(Analysis.objects.exclude(result__last_restorable=None)
                 .values_list("run_id", "health", "result__last_restorable__generation_id"))
    count = 0
    for i in range(0, len(lasts), 500):
        chunk = lasts[i:i + 500]
        wanted = {(run, gid): health for run, health, gid in chunk if isinstance(gid, str)}
        rows = Generation.objects.filter(run_id__in={run for run, _ in wanted},
                                         generation_id__in={gid for _, gid in wanted},
                                         status="restorable")
        for pk, run, gid, verified in rows.values_list("pk", "run_id", "generation_id",
                                                       "verified_at"):
            health = wanted.get((run, gid))
            if health is None:
                continue
            every = settings.RECOVERYDASH_RECHECK_ENDED_S if health == "ended" \
                else settings.RECOVERYDASH_RECHECK_S
            if verified is not None and verified > now - timedelta(seconds=every * 0.95):
                continue
            Generation.objects.filter(pk=pk).update(verified_at=now)
            if _enqueue_verification(pk, now.isoformat()):
                count += 1
            if count >= limit:
                return count
    return count


def reverify_outside(project_id: int) -> int:
    """Enqueue a full re-check of the project's generations holding objects found outside its
    storage locations or not verifiable (after a location was declared or changed: its
    credentials may now open what they could not); returns how many."""
    pks = (CheckpointObject.objects
           .filter(generation__run__project_id=project_id, in_manifest=True,
                   check_status__in=("object_outside_locations", "storage_unverified"))
           .values_list("generation_id", flat=True).distinct())
    now = timezone.now().isoformat()
    return sum(1 for pk in sorted(set(pks)) if _enqueue_verification(pk, now))
