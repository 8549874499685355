"""Verifying a committed generation's objects in storage, and re-checking them later.

The checks themselves (HEAD, size, sha256; ``file://`` and ``s3://``) live in the pure module
``recoverydash.storage.objects`` that the SDK shares; this module picks the credentials of the
project's storage location that covers each URI, stores one result per object with the time of
the check, and asks for the run to be analysed again. Transient storage errors propagate (the
Celery task retries them); a result is stored only when it is definite.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from recoverydash.runs.models import Analysis, CheckpointObject, Generation
from recoverydash.storage.models import StorageLocation
from recoverydash.storage.objects import (ObjectCheck, PermanentStorageError, make_s3_client,
                                          verify_object)

log = logging.getLogger(__name__)


def _client_for(uri: str, locations: list[StorageLocation], cache: dict):
    """An S3 client with the credentials of the location covering ``uri`` (None: not S3)."""
    if not uri.startswith("s3://"):
        return None
    location = next((loc for loc in locations if loc.covers(uri)), None)
    key = location.pk if location else None
    if key not in cache:
        if location is None:
            cache[key] = make_s3_client()
        else:
            cache[key] = make_s3_client(
                endpoint_url=location.endpoint_url or None, region=location.region or None,
                access_key_id=location.access_key_id or None,
                secret_access_key=location.secret_access_key or None)
    return cache[key]


def verify_objects(objects, locations: list[StorageLocation]) -> int:
    """Check each ``CheckpointObject`` in storage and store the result; returns how many were
    checked. Raises ``TransientStorageError`` (after storing nothing for that object) when the
    store cannot answer now."""
    clients: dict = {}
    checked = 0
    for obj in objects:
        try:
            result = verify_object(obj.uri, obj.size, obj.sha256 or None,
                                   s3_client=_client_for(obj.uri, locations, clients),
                                   full_hash_max_bytes=settings.RECOVERYDASH_FULL_HASH_MAX_BYTES)
        except PermanentStorageError as exc:
            # A malformed URI, denied access, missing credentials: retrying cannot help, and
            # nothing was proven either way. Stored and shown, never retried in a loop.
            result = ObjectCheck("storage_unverified", f"cannot verify: {exc}")
        obj.check_status = result.status
        obj.check_detail = result.detail or ""
        obj.observed_size = result.observed_size
        obj.observed_sha256 = result.observed_sha256 or ""
        obj.checked_at = timezone.now()
        obj.save(update_fields=["check_status", "check_detail", "observed_size",
                                "observed_sha256", "checked_at"])
        checked += 1
    return checked


def verify_generation(generation_pk: int, *, recheck: bool = False) -> int:
    """Verify the manifest objects of one generation (those not checked yet, or all with
    ``recheck``), then request analysis of its run. Idempotent: checking again stores the same
    results. Returns the number of objects checked."""
    generation = Generation.objects.select_related("run__project").filter(pk=generation_pk).first()
    if generation is None or generation.manifest is None:
        return 0
    objects = CheckpointObject.objects.filter(generation=generation, in_manifest=True)
    if not recheck:
        objects = objects.filter(check_status__in=("pending", "error"))
    locations = list(StorageLocation.objects.filter(project=generation.run.project_id))
    checked = verify_objects(list(objects.order_by("pk")), locations)
    Generation.objects.filter(pk=generation.pk).update(verified_at=timezone.now())
    from recoverydash.runs.analysis import request_analysis

    request_analysis(generation.run_id, force=True)
    return checked


def recheck(limit: int = 200) -> None:
    """Periodic: re-verify each run's last restorable generation (retention may have deleted
    it) and verify committed generations with objects still unchecked."""
    targets: set[int] = set()
    for analysis in Analysis.objects.exclude(health="ended").only("run_id", "result")[:limit]:
        last = (analysis.result or {}).get("last_restorable")
        if last:
            pk = (Generation.objects.filter(run_id=analysis.run_id,
                                            generation_id=last["generation_id"])
                  .values_list("pk", flat=True).first())
            if pk:
                verify_generation(pk, recheck=True)
    pending = (CheckpointObject.objects.filter(in_manifest=True)
               .filter(Q(check_status="pending") | Q(check_status="error"))
               .values_list("generation_id", flat=True).distinct()[:limit])
    targets.update(pending)
    for pk in sorted(targets):
        verify_generation(pk)
