"""Manifest discovery: list each storage location and ingest committed manifests not seen yet.

If the coordinator dies after writing the manifest but before reporting success, the manifest is the
durable authority (docs/ingest-v1.md#7-checkpoints-in-storage). A manifest found in storage becomes
a ``checkpoint_committed`` event through the same ingest action as the API (so it is in the event
log, idempotent by its ``event_id``, and conflicts with a different committed manifest are detected
the same way).

Layout and file name: ``<location>/<generation_id>/recoverydash-manifest.json``
(``recoverydash.checkpoints.objects.MANIFEST_NAME``), written by the SDK's checkpoint publisher.
The manifest's extra fields ``run_id`` and ``attempt`` name the run and attempt; a location's
``run_id`` is used when the manifest has none.
"""

from __future__ import annotations

import hashlib
import json
import logging

from django.db import IntegrityError
from django.utils import timezone

from recoverydash.checkpoints.objects import (
    MANIFEST_NAME,
    PermanentStorageError,
    StorageError,
    list_manifests,
    read_manifest,
)
from recoverydash.ingest.actions import ingest_batch
from recoverydash.recovery.inputs import same_manifest
from recoverydash.runs.models import Attempt, CheckpointObject, Generation
from recoverydash.storage.locations import Locations, location_client
from recoverydash.storage.models import KIND_ADOPT, KIND_MANIFESTS, SeenManifest, StorageLocation

log = logging.getLogger(__name__)


def manifest_event(manifest: dict, run_id: str, uri: str) -> dict:
    """The ``checkpoint_committed`` event (docs/ingest-v1.md#checkpoint_committed) for a
    manifest found at ``uri``.

    The ``event_id`` is derived from the manifest's content, so listing it again is a duplicate,
    never a second event. Raises ValueError when the manifest lacks what an event needs."""
    generation_id = manifest.get("generation_id")
    committed_at = manifest.get("committed_at")
    if not isinstance(generation_id, str) or not isinstance(committed_at, str):
        raise ValueError("manifest has no generation_id or committed_at")
    attempt = manifest.get("attempt")
    digest = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:16]
    return {
        "event_id": f"discovered:{generation_id}:{digest}",
        "type": "checkpoint_committed",
        "run_id": run_id,
        "attempt": attempt if isinstance(attempt, int) and attempt >= 0 else 0,
        "time": committed_at,
        "manifest": manifest,
        "discovered_at": uri,
    }


def discover_location(location: StorageLocation) -> int:
    """Ingest the manifests of one location not seen before; returns how many were ingested.

    Listing errors are stored on the location (shown in the dashboard) and, when they may pass,
    raised for the task to retry. A manifest that cannot be ingested (invalid) is recorded as seen
    with the error logged, so it does not block the others."""

    try:
        client = location_client(location)  # this location's credentials, never the server's
        uris = list_manifests(location.url, s3_client=client)
    except StorageError as exc:
        StorageLocation.objects.filter(pk=location.pk).update(
            last_error=str(exc)[:2000], last_listed_at=timezone.now())
        if isinstance(exc, PermanentStorageError):
            return 0
        raise
    seen = set(SeenManifest.objects.filter(location=location).values_list("uri", flat=True))
    confine = Locations(location.project_id, [location])
    ingested = 0
    for uri in uris:
        if uri in seen:
            continue
        where = confine.resolve(uri, uri_is_server=True)
        if where.refused:  # a generation folder linked to elsewhere: not this location's
            log.warning("manifest %s not read: %s", uri, where.refused)
            continue
        try:
            manifest = read_manifest(uri, s3_client=client)
        except PermanentStorageError as exc:
            log.warning("manifest %s unreadable: %s", uri, exc)
            continue
        run_id = manifest.get("run_id") if isinstance(manifest.get("run_id"), str) else ""
        run_id = run_id or location.run_id
        if not run_id:
            log.warning("manifest %s names no run and location %s has no run_id", uri, location)
            continue
        known = (Generation.objects.filter(run__project=location.project, run__run_id=run_id,
                                           generation_id=manifest.get("generation_id"))
                 .values_list("manifest", flat=True).first())
        folder = uri.rsplit("/", 1)[0]  # relative object URIs resolve against it
        same = known is not None and same_manifest(known, manifest)  # committed_at is volatile
        if same:
            Generation.objects.filter(
                run__project=location.project, run__run_id=run_id,
                generation_id=manifest.get("generation_id"), found_at="").update(found_at=folder)
        if not same:
            # New, or different from what was reported (ingest then flags manifest_conflict).
            try:
                result = ingest_batch(location.project, [manifest_event(manifest, run_id, uri)])
            except Exception as exc:  # an invalid manifest must not block the others
                log.warning("manifest %s not ingested: %s", uri, exc)
            else:
                if result.accepted and known is None:
                    Generation.objects.filter(
                        run__project=location.project, run__run_id=run_id,
                        generation_id=manifest["generation_id"]).update(discovered=True,
                                                                         found_at=folder)
                    ingested += 1
        try:
            SeenManifest.objects.create(location=location, uri=uri, run_id=run_id,
                                        generation_id=str(manifest.get("generation_id", "")))
        except IntegrityError:
            pass  # another worker recorded it at the same moment
    StorageLocation.objects.filter(pk=location.pk).update(last_error="",
                                                          last_listed_at=timezone.now())
    return ingested


def discover_all() -> int:
    """Discover manifests in every enabled location with ``discover`` set, and adopt the other
    tools' checkpoints of those of kind ``adopt`` (``recoverydash.ingest.adoption``: our own
    manifests first, then the generations the format's adapter builds); returns the number
    ingested. One location's failure (stored on it and logged) never stops the others."""
    from recoverydash.ingest.adoption import adopt_location

    total = 0
    for loc in StorageLocation.objects.filter(enabled=True, discover=True,
                                              kind__in=[KIND_MANIFESTS, KIND_ADOPT]):
        try:
            total += discover_location(loc)
            if loc.kind == KIND_ADOPT:
                total += adopt_location(loc)
        except Exception:  # each location on its own; the next listing tries again
            log.exception("storage location %s (project %s): discovery failed", loc.url,
                          loc.project_id)
    return total


PENDING_LOOKUPS = 20  # pending generations looked up per restore plan, newest first


def _manifest_candidates(uri: str | None, generation_id: str) -> list[str]:
    """Where a generation's manifest can be, from one of its objects' URIs: the folder named
    after the generation in the URI (``save_generation``: ``<folder>/<generation_id>/...``), else
    ``<ancestor>/<generation_id>/`` for the object's three nearest folders (``publish_files`` of
    a framework's files: HF's ``<output_dir>/checkpoint-N/...`` and Lightning's
    ``<dirpath>/x.ckpt`` keep their manifest in ``<output_dir or dirpath>/<generation_id>/``)."""
    if not uri:
        return []
    cut = uri.find(f"/{generation_id}/")
    if cut >= 0:
        return [f"{uri[:cut + 1 + len(generation_id)]}/{MANIFEST_NAME}"]
    out, folder = [], uri
    for _ in range(3):
        folder = folder.rsplit("/", 1)[0]
        if folder.endswith(":/") or folder.endswith(":") or "/" not in folder.split("://", 1)[-1]:
            break
        out.append(f"{folder}/{generation_id}/{MANIFEST_NAME}")
    return out


def committed_in_storage(run) -> int:
    """The run's generations that were started and reported shards but whose commit the server
    never received: is their manifest in storage now? Each is looked up beside its objects
    (``<folder>/<generation_id>/recoverydash-manifest.json``, the folders taken from a reported
    object's URI: ``_manifest_candidates``; under the project's storage locations only), the newest
    ``PENDING_LOOKUPS`` of them; one found is ingested as discovery does (a
    ``checkpoint_committed`` derived from its content). Returns how many were found. A
    manifest that cannot be read, or names another generation, is left alone."""
    confine = Locations(run.project_id)
    found = 0
    pending = (Generation.objects.filter(run=run, manifest__isnull=True)
               .order_by("-update", "-pk")[:PENDING_LOOKUPS])
    for gen in pending:
        uri = (CheckpointObject.objects.filter(generation=gen).order_by("pk")
               .values_list("uri", flat=True).first())
        manifest = where = manifest_uri = None
        for manifest_uri in _manifest_candidates(uri, gen.generation_id):
            where = confine.resolve(manifest_uri)
            if where.refused or where.unverifiable or where.location is None:
                continue
            try:
                manifest = read_manifest(where.uri, s3_client=location_client(where.location))
                break
            except StorageError:
                continue
        if manifest is None:
            continue
        if manifest.get("generation_id") != gen.generation_id:
            continue
        try:
            result = ingest_batch(run.project, [manifest_event(manifest, run.run_id,
                                                               manifest_uri)])
        except Exception as exc:  # noqa: BLE001 - an invalid manifest is no commit marker
            log.warning("manifest %s not ingested: %s", manifest_uri, exc)
            continue
        if result.accepted:
            Generation.objects.filter(pk=gen.pk).update(
                discovered=True, found_at=where.uri.rsplit("/", 1)[0])
            found += 1
    return found


#: Seconds before the manifest of a resumed generation that was not found is looked for again
#: (docs/definitions.md#resume-from-a-generation-the-server-had-not-seen).
RESUMED_LOOKUP_RETRY_S = 600.0


def _resumed_unknown(run) -> list[str]:
    """Generation ids that attempts of ``run`` declared in ``resumed_from`` and whose manifest
    the server does not hold, in attempt order, each once; ids that cannot name a folder are
    left out."""
    known = set(Generation.objects.filter(run=run, manifest__isnull=False)
                .values_list("generation_id", flat=True))
    out: list[str] = []
    for resumed in (Attempt.objects.filter(run=run, resumed_from__isnull=False)
                    .order_by("attempt").values_list("resumed_from", flat=True)):
        gid = resumed.get("generation_id") if isinstance(resumed, dict) else None
        if isinstance(gid, str) and gid and "/" not in gid and gid not in (".", "..") \
                and gid not in known and gid not in out:
            out.append(gid)
    return out


def _resumed_candidates(location: StorageLocation, run_id: str, generation_id: str) -> list:
    """Where a location may hold the manifest of ``generation_id``: the SDK's layout directly
    under it, then under the run's folder in it."""
    base = location.url.rstrip("/")
    folders = [base] + ([f"{base}/{run_id}"] if run_id and "/" not in run_id else [])
    return [f"{folder}/{generation_id}/{MANIFEST_NAME}" for folder in folders]


def _read_resumed(confine: Locations, location: StorageLocation, uri: str, run_id: str,
                  generation_id: str) -> dict | None:
    """The manifest at ``uri`` when it is readable under ``location`` and names
    ``generation_id`` (and ``run_id``, when it names a run); else None."""
    where = confine.resolve(uri, uri_is_server=True)
    if where.refused or where.unverifiable or where.location is None:
        return None
    try:
        manifest = read_manifest(where.uri, s3_client=location_client(location))
    except StorageError:
        return None
    named = manifest.get("run_id")
    if manifest.get("generation_id") != generation_id or (isinstance(named, str) and named
                                                          and named != run_id):
        return None
    return manifest


def resumed_in_storage(run) -> int:
    """docs/definitions.md#resume-from-a-generation-the-server-had-not-seen: look for the
    manifest of each generation an attempt of ``run`` resumed and the server does not hold, in
    the run's storage locations (enabled ``manifests`` locations of its project whose ``run_id``
    is the run's or empty, listed by discovery or not): ``<location>/<generation_id>/`` and
    ``<location>/<run_id>/<generation_id>/`` (:func:`_resumed_candidates`), read with the
    location's own credentials. One found (naming the generation, and the run when it names
    one) is ingested as discovery does (:func:`manifest_event`), so the generation is listed;
    each generation is looked up at most once per ``RESUMED_LOOKUP_RETRY_S`` (a miss is not
    read again on every analysis). At most ``PENDING_LOOKUPS`` generations per call. Returns
    how many were found. Storage errors count as not found."""
    from django.core.cache import cache
    from django.db.models import Q

    wanted = _resumed_unknown(run)
    if not wanted:
        return 0
    locations = list(StorageLocation.objects.filter(
        project_id=run.project_id, enabled=True, kind=KIND_MANIFESTS)
        .filter(Q(run_id="") | Q(run_id=run.run_id)).order_by("pk"))
    confine = Locations(run.project_id, locations)
    found = 0
    for gid in wanted[:PENDING_LOOKUPS]:
        if not cache.add(f"recoverydash:resumed-lookup:{run.pk}:{gid}", 1,
                         RESUMED_LOOKUP_RETRY_S):
            continue
        hit = next(((uri, m) for loc in locations for uri in _resumed_candidates(loc, run.run_id,
                                                                                 gid)
                    for m in [_read_resumed(confine, loc, uri, run.run_id, gid)]
                    if m is not None), None)
        if hit is None:
            continue
        uri, manifest = hit
        try:
            result = ingest_batch(run.project, [manifest_event(manifest, run.run_id, uri)])
        except Exception as exc:  # noqa: BLE001 - an invalid manifest is no generation
            log.warning("manifest %s not ingested: %s", uri, exc)
            continue
        if result.accepted:
            Generation.objects.filter(run=run, generation_id=gid).update(
                discovered=True, found_at=uri.rsplit("/", 1)[0])
            found += 1
    return found


def look_up_resumed(run_pk: int) -> int:
    """:func:`resumed_in_storage` of run ``run_pk`` before the worker analyses it; 0 when the
    run is gone or the lookup fails (logged: the analysis from what is known beats none)."""
    from recoverydash.runs.models import Run

    run = Run.objects.filter(pk=run_pk).select_related("project").first()
    if run is None:
        return 0
    try:
        return resumed_in_storage(run)
    except Exception:  # noqa: BLE001 - never stops the analysis
        log.warning("run %s: looking up resumed generations in storage failed", run.run_id,
                    exc_info=True)
        return 0


def restore_plan_discovered(run, world_size: int | None = None,
                            dataset_version: str | None = None,
                            config_digest: str | None = None):
    """docs/ingest-v1.md#restore-plan, with the commits the server missed looked up first
    (``committed_in_storage``), then ``storage.confirm.restore_plan_confirmed`` answers. A
    coordinator that died after writing its manifest but before ``checkpoint_committed``
    reached the server (a drill's ``after_commit``) left a committed generation that the
    periodic listing may not have found yet, or never finds (a run's folder below a declared
    location); the manifest in storage is the authority (section 7), so the plan names it.
    Raises AnalysisFailed like ``plan_restore``."""
    from recoverydash.storage.confirm import restore_plan_confirmed

    try:
        committed_in_storage(run)
    except Exception:  # noqa: BLE001 - the plan from what is known beats no plan
        log.warning("run %s: looking up uncommitted generations in storage failed", run.run_id,
                    exc_info=True)
    return restore_plan_confirmed(run, world_size=world_size, dataset_version=dataset_version,
                                  config_digest=config_digest)
