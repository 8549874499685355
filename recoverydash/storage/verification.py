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
budget stops between objects and enqueues its own continuation.

Every object's sha256 is read in full, whatever its size, unless S3 stores a full-object checksum
the manifest also gives (``verify_object``). An object whose digest needs more than
``RECOVERYDASH_VERIFY_INLINE_MAX_BYTES`` read gets a Celery task of its own (``verify_one``),
so a generation's large objects are hashed in parallel over the worker pool, each with a time
limit that scales with its size, writing its progress (bytes hashed) to its row as it goes:
until the last byte is read the object is ``pending`` and its generation ``committed``
(``progress_by_generation``: "verifying: 37 of 64 objects, 210 GB of 512 GB"). The periodic tasks
(``recheck``, ``sweep_unverified``) only enqueue one verification per generation, so a poison
generation costs its own task and nothing else.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
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
    hash_time_allowed_s,
    verification_progress,
    verify_object,
)
from recoverydash.runs.analysis import request_analysis
from recoverydash.runs.models import Analysis, CheckpointObject, Generation
from recoverydash.runs.queue import VERIFY_GENERATION, VERIFY_OBJECT, enqueue
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
    ``transient`` objects left in ``error``, ``out_of_time`` objects left for a continuation,
    ``deferred`` the pks of objects whose digest is read in a task of their own
    (:func:`verify_one`)."""

    checked: int = 0
    transient: int = 0
    out_of_time: int = 0
    deferred: list = field(default_factory=list)


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
    obj.hashed_bytes, obj.hash_heartbeat_at = 0, None
    _save_result(obj, result.status, ["check_status", "check_detail", "observed_size",
                                      "observed_sha256", "resolved_uri", "checked_at",
                                      "check_attempts", "hashed_bytes", "hash_heartbeat_at"])


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


def _unstart(obj: CheckpointObject) -> None:
    """Take back the count of :func:`_start` for a check that ended without a result to store
    (left for a continuation or a task of its own)."""
    obj.check_attempts -= 1
    CheckpointObject.objects.filter(pk=obj.pk).update(check_attempts=F("check_attempts") - 1)


def check_one(obj: CheckpointObject, where: Resolved, locations: Locations, *,
              deadline: float | None = None, size_only: bool = False,
              checksums: dict | None = None, read_inline_max_bytes: int | None = None,
              progress=None) -> ObjectCheck:
    """The check of one object that ``where`` says may be read (``verify_object``: every
    sha256 read in full, or a full-object checksum S3 stores compared with ``checksums``, the
    manifest object's; raises StorageError as ``verify_object``)."""
    client = locations.client(where.location) if where.uri.startswith("s3://") else None
    return verify_object(where.uri, obj.size if obj.size is not None else -1,
                         obj.sha256 or None, s3_client=client, checksums=checksums,
                         root=where.root, deadline=deadline, size_only=size_only,
                         read_inline_max_bytes=read_inline_max_bytes, progress=progress)


def _mapped_note(obj: CheckpointObject, where: Resolved, result: ObjectCheck) -> ObjectCheck:
    if where.uri == obj.uri or not result.detail:
        return result
    return ObjectCheck(result.status, f"{result.detail} (at {where.uri})", result.observed_size,
                       result.observed_sha256)


def _look(obj: CheckpointObject, locations: Locations, base: str | None,
          base_is_server: bool) -> tuple[Resolved | None, ObjectCheck | None]:
    """Where to check ``obj`` (None when it may not be looked at), and the result to store
    without touching storage (outside the locations, a scheme that cannot be read, no size),
    else None."""
    where = locations.resolve(obj.uri, base, base_is_server)
    if where.refused:
        return None, ObjectCheck("object_outside_locations", where.refused)
    if where.unverifiable:
        return None, ObjectCheck("storage_unverified",
                                 f"scheme {paths.scheme_of(obj.uri)!r} cannot be verified")
    if obj.size is None or obj.size < 0:
        return where, ObjectCheck("storage_unverified", "the manifest gives no size")
    return where, None


def _checked_or_error(obj: CheckpointObject, where: Resolved, locations: Locations,
                      **kw) -> ObjectCheck | None:
    """:func:`check_one` with storage errors turned into results: a permanent one is
    ``storage_unverified``; a transient one is stored as the object's ``error`` state (checked
    again by the sweep) and gives None."""
    try:
        return check_one(obj, where, locations, **kw)
    except PermanentStorageError as exc:
        # Denied access, no credentials, a link on the way: retrying cannot help, and
        # nothing was proven either way. Stored and shown, never retried in a loop.
        return ObjectCheck("storage_unverified", f"cannot verify: {exc}")
    except TransientStorageError as exc:
        obj.check_detail = f"storage did not answer: {exc}"[:2000]
        obj.checked_at, obj.check_attempts = timezone.now(), 0
        obj.hashed_bytes, obj.hash_heartbeat_at = 0, None
        _save_result(obj, "error", ["check_status", "check_detail", "checked_at",
                                    "check_attempts", "hashed_bytes", "hash_heartbeat_at"])
        return None


def _read_in_full_before(obj: CheckpointObject) -> bool:
    """Whether a re-check of ``obj`` may stop at its size: its sha256 was read in full (or S3's
    full-object checksum matched) by an earlier check, and it is over the size read inline (a
    re-check re-reads the small objects only)."""
    return (obj.check_status == "ok" and bool(obj.observed_sha256)
            and (obj.size or 0) > settings.RECOVERYDASH_VERIFY_INLINE_MAX_BYTES)


def _kept_digest(obj: CheckpointObject, result: ObjectCheck) -> ObjectCheck:
    """A size-only re-check's ``ok``, keeping the digest read in full earlier."""
    when = obj.checked_at.isoformat(timespec="seconds") if obj.checked_at else "earlier"
    return ObjectCheck("ok", f"size {obj.size} matches; sha256 read in full at {when} (a "
                             "re-check of a large object reads no more than its size)",
                       result.observed_size, obj.observed_sha256, checked="sha256")


def verify_objects(objects, locations: Locations, base: str | None = None,
                   base_is_server: bool = False, *, deadline: float | None = None,
                   checksums: dict | None = None, recheck: bool = False) -> VerifyOutcome:
    """Check each ``CheckpointObject`` and store the result (see the module docstring).

    ``base`` / ``base_is_server``: the generation folder for relative URIs
    (``generation_base``). ``checksums``: ``{uri: the manifest object's checksums}``. An object
    whose digest needs more than ``RECOVERYDASH_VERIFY_INLINE_MAX_BYTES`` read is left
    ``pending`` and listed in ``deferred`` (its task is the caller's to send); with
    ``recheck`` such an object whose digest was read in full before is checked by size only.
    ``deadline`` (``time.monotonic()``): no object is started after it, and a digest being read
    when it passes is abandoned, the object left unchecked for the continuation (or
    ``storage_unverified`` when it was the first object of the pass to touch storage, so it had
    the whole budget: each pass settles at least one object). Never raises a StorageError."""
    out = VerifyOutcome()
    looked = 0  # objects whose storage was touched in this pass
    inline = settings.RECOVERYDASH_VERIFY_INLINE_MAX_BYTES
    for obj in objects:
        if deadline is not None and time.monotonic() > deadline:
            out.out_of_time += 1
            continue
        where, early = _look(obj, locations, base, base_is_server)
        if early is not None or not _start(obj):
            if early is not None:
                _store(obj, early, where.uri if where is not None else "")
            out.checked += 1
            continue
        looked += 1
        size_only = recheck and _read_in_full_before(obj)
        result = _checked_or_error(obj, where, locations, deadline=deadline, size_only=size_only,
                                   checksums=(checksums or {}).get(obj.uri),
                                   read_inline_max_bytes=inline)
        if result is None:
            out.transient += 1
            continue
        if result.deferred or (result.timed_out and looked > 1):
            # Read in a task of its own, or out of time after other objects: left for the
            # continuation, which gives it a whole budget.
            _unstart(obj)
            if result.deferred:
                out.deferred.append(obj.pk)
            else:
                out.out_of_time += 1
                deadline = time.monotonic() - 1
            continue
        if size_only and result.ok:
            result = _kept_digest(obj, result)
        _store(obj, _mapped_note(obj, where, result), where.uri)
        out.checked += 1
    return out


def _budget_s() -> float:
    """Seconds one verification task may spend: most of the task's soft time limit."""
    return max(1.0, settings.RECOVERYDASH_TASK_SOFT_TIME_LIMIT_S * 0.8)


def object_time_limits(size: int) -> tuple[float, float]:
    """``(soft, hard)`` Celery time limits in seconds of the task that reads one object of
    ``size`` bytes: soft ``hash_time_allowed_s`` with ``RECOVERYDASH_VERIFY_BASE_S`` and
    ``RECOVERYDASH_VERIFY_MIN_BYTES_PER_S`` (the read stops by itself at 90 % of it), hard
    10 % (at least 30 s) later."""
    soft = hash_time_allowed_s(max(int(size or 0), 0),
                               base_s=settings.RECOVERYDASH_VERIFY_BASE_S,
                               min_bytes_per_s=settings.RECOVERYDASH_VERIFY_MIN_BYTES_PER_S)
    return soft, soft + max(30.0, 0.1 * soft)


def _send_object_tasks(pks: list, before: str, countdown: float = 0.0) -> int:
    """One ``VERIFY_OBJECT`` task per object pk, each with the time limits of its size, due in
    ``countdown`` seconds; returns how many were sent."""
    sent = 0
    for pk, size in CheckpointObject.objects.filter(pk__in=pks).values_list("pk", "size"):
        soft, hard = object_time_limits(size or 0)
        if enqueue(VERIFY_OBJECT, pk, before, countdown=countdown, soft_time_limit=soft,
                   time_limit=hard):
            sent += 1
    return sent


def _manifest_checksums(generation: Generation) -> dict:
    """``{uri: checksums}`` of the manifest objects that carry ``checksums``."""
    return {o["uri"]: o["checksums"] for o in (generation.manifest or {}).get("objects") or []
            if isinstance(o, dict) and isinstance(o.get("uri"), str)
            and isinstance(o.get("checksums"), dict)}


def verify_generation(generation_pk: int, recheck_before: str | None = None, *,
                      recheck: bool = False) -> int:
    """Verify the manifest objects of one generation, then request analysis of its run.

    Without ``recheck_before`` the objects not checked yet (``pending``, ``error``, or left
    ``object_outside_locations`` when locations may have changed); with it (an ISO 8601 time)
    every object last checked before that time, so a re-check interrupted by its time budget
    resumes where it stopped; ``recheck`` is the same with ``recheck_before`` now. Objects
    whose digest needs more than ``RECOVERYDASH_VERIFY_INLINE_MAX_BYTES`` read get a task of
    their own each (:func:`verify_one`, time limits :func:`object_time_limits`), spread over
    the workers; until the last is read the generation stays ``committed``. Idempotent:
    checking again stores the same results. Enqueues its own continuation when the budget ran
    out. Returns the number of objects checked here."""
    if recheck and not recheck_before:
        recheck_before = timezone.now().isoformat()
    started = timezone.now().isoformat()
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
                             deadline=time.monotonic() + _budget_s(),
                             checksums=_manifest_checksums(generation),
                             recheck=bool(recheck_before))
    Generation.objects.filter(pk=generation.pk).update(verified_at=timezone.now())
    if outcome.deferred:
        _send_object_tasks(outcome.deferred, recheck_before or started)
    if outcome.out_of_time:
        log.info("generation %s: %d objects left for a continuation (time budget)",
                 generation.pk, outcome.out_of_time)
        enqueue(VERIFY_GENERATION, generation.pk, recheck_before)
    request_analysis(generation.run_id, force=True)
    return outcome.checked


#: Seconds after which an object task's last sign of life (``hash_heartbeat_at``) no longer
#: holds the object: a task that finds it older takes the object over (its first holder died).
HEARTBEAT_STALE_S = 30.0
#: Seconds between two progress writes of a task reading an object.
PROGRESS_EVERY_S = 1.0


class _Heartbeat:
    """The ``progress`` of one object's read: bytes hashed so far and a sign of life, written
    to its row at most every ``PROGRESS_EVERY_S``."""

    def __init__(self, pk: int):
        self.pk, self.done, self.last = pk, 0, time.monotonic()

    def __call__(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            at = timezone.now()
            CheckpointObject.objects.filter(pk=self.pk).update(
                hashed_bytes=self.done, hash_heartbeat_at=at, check_started_at=at)


def _claim(obj: CheckpointObject) -> bool:
    """Hold ``obj`` for this task (a conditional UPDATE): False when another task holds it (its
    heartbeat is younger than ``HEARTBEAT_STALE_S``: the broker handed the task out twice, or
    its first holder is still reading)."""
    now = timezone.now()
    return CheckpointObject.objects.filter(pk=obj.pk).filter(
        Q(hash_heartbeat_at__isnull=True)
        | Q(hash_heartbeat_at__lt=now - timedelta(seconds=HEARTBEAT_STALE_S))
    ).update(hash_heartbeat_at=now, hashed_bytes=0, check_started_at=now) == 1


def verify_one(object_pk: int, before: str) -> str:
    """Read and hash one object in full (the task of its own a generation's verification sent
    for a large object), store the result and request analysis of its run. Nothing is done
    when the object was checked at or after ``before`` (an ISO 8601 time: the task came twice)
    or is no longer in a manifest; when another task holds it (:func:`_claim`) the task is sent
    again for ``HEARTBEAT_STALE_S`` later and ``"held"`` returned. The read stops at
    90 % of :func:`object_time_limits`' soft limit (``storage_unverified``, saying so); bytes
    hashed are written to the row as it goes (the generation's progress). The run is analysed
    again when the object failed or was its generation's last unchecked one. Returns the status
    status the object has then, ``""`` when nothing was done."""
    obj = (CheckpointObject.objects.select_related("generation__run")
           .filter(pk=object_pk, in_manifest=True).first())
    if obj is None or obj.generation.manifest is None:
        return ""
    if obj.checked_at is not None and obj.checked_at >= datetime.fromisoformat(before):
        return ""
    if not _claim(obj):
        # Held by another task: this one comes back once that one's heartbeat may have
        # stopped (a sweep can re-queue an object whose reader died moments ago), and then
        # does nothing if the holder finished. Tasks run eagerly (tests) are not sent again.
        if not settings.CELERY_TASK_ALWAYS_EAGER:
            _send_object_tasks([obj.pk], before, countdown=HEARTBEAT_STALE_S + 1)
        return "held"
    generation = obj.generation
    try:
        base, server_side = generation_base(generation)
        locations = Locations(generation.run.project_id)
        where, early = _look(obj, locations, base, server_side)
        result = early
        if early is None and _start(obj):
            soft, _hard = object_time_limits(obj.size or 0)
            result = _checked_or_error(obj, where, locations,
                                       deadline=time.monotonic() + 0.9 * soft,
                                       progress=_Heartbeat(obj.pk))
        if result is not None:
            _store(obj, _mapped_note(obj, where, result) if where else result,
                   where.uri if where else "")
    finally:
        CheckpointObject.objects.filter(pk=obj.pk).update(hash_heartbeat_at=None)
    Generation.objects.filter(pk=generation.pk).update(verified_at=timezone.now())
    # Analysed when the answer may change: a failure, or the generation's last object checked.
    if obj.check_status != "ok" or not CheckpointObject.objects.filter(
            generation=generation, in_manifest=True, check_status__in=UNCHECKED).exists():
        request_analysis(generation.run_id, force=True)
    return obj.check_status


def progress_by_generation(run_pk: int, generation_ids) -> dict:
    """``{generation_id: VerificationProgress}`` of the given generations of a run (their
    manifest objects; docs/definitions.md#verification-progress): one query."""
    rows = (CheckpointObject.objects
            .filter(generation__run_id=run_pk, generation__generation_id__in=list(generation_ids),
                    in_manifest=True)
            .values_list("generation__generation_id", "size", "check_status", "hashed_bytes"))
    grouped: dict = {}
    for gid, size, status, hashed in rows:
        grouped.setdefault(gid, []).append((size, status, hashed))
    return {gid: verification_progress(items) for gid, items in grouped.items()}


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
