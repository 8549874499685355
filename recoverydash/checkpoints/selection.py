"""Offline restore selection: the newest restorable generation of a location, decided from storage
alone (no server, no ledger), for the SDK's restart and ``check``'s own-manifest format.

It reads every manifest of the location, applies the recovery core's generation rules
(``recoverydash.recovery.generations``: ``schema_unsupported``, ``shard_missing``,
``component_missing``, ``update_mismatch``), compares ``world_size`` and ``dataset_version``
with the restarting job's, verifies objects with ``recoverydash.checkpoints.objects.verify_object``
and returns the newest restorable generation. What it cannot know offline (no ledger):
``data_cursor_mismatch``, ``stale_state``, ``manifest_conflict`` between reports; the server's
restore plan covers those (``recoverydash.sdk.checkpoint.restore_plan``).

Pure: the standard library, the core and ``recoverydash.checkpoints.objects``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from recoverydash.checkpoints import objects as storage
from recoverydash.checkpoints.objects import (
    StorageError,
    TransientStorageError,
    resolve_location,
)
from recoverydash.recovery.contract import DEFAULT_REQUIRED_COMPONENTS as _CORE_COMPONENTS

DEFAULT_REQUIRED_COMPONENTS = list(_CORE_COMPONENTS)
"""The default of ``contract.required_components`` (docs/ingest-v1.md#attempt_started): the
core's (``recoverydash.recovery.contract``, a standard-library-only module)."""

@dataclass
class GenerationCheck:
    """One generation found in storage: ``status`` is ``restorable``, ``rejected`` (reasons say why,
    docs/definitions.md#generation-status) or ``committed`` (not verified: storage could not answer,
    or it was not checked because a newer generation is restorable)."""

    generation_id: str
    update: int | None
    status: str
    reasons: list[dict[str, str]] = field(default_factory=list)
    manifest_uri: str = ""
    manifest: dict[str, Any] | None = None

    @property
    def committed_at(self) -> str | None:
        """The manifest's ``committed_at`` (RFC 3339), None without one."""
        value = (self.manifest or {}).get("committed_at")
        return value if isinstance(value, str) else None

    @property
    def cursor(self) -> list[dict[str, Any]]:
        """The manifest's data progress cursor (one entry per stratum), empty without one."""
        return list(((self.manifest or {}).get("data_progress") or {}).get("cursor") or [])

    def to_dict(self) -> dict[str, Any]:
        return {"generation_id": self.generation_id, "update": self.update,
                "status": self.status, "reasons": self.reasons,
                "committed_at": self.committed_at, "manifest_uri": self.manifest_uri}


@dataclass
class Selection:
    """What ``select_restorable`` found: ``restorable`` (the newest restorable generation, or None)
    and every generation, newest first."""

    restorable: GenerationCheck | None
    generations: list[GenerationCheck]

    @property
    def rejected(self) -> list[GenerationCheck]:
        return [g for g in self.generations if g.status == "rejected"]

    @property
    def generation_id(self) -> str | None:
        return self.restorable.generation_id if self.restorable else None

    @property
    def update(self) -> int | None:
        return self.restorable.update if self.restorable else None

    @property
    def manifest(self) -> dict[str, Any] | None:
        return self.restorable.manifest if self.restorable else None

    @property
    def cursor(self) -> list[dict[str, Any]]:
        return self.restorable.cursor if self.restorable else []

    def to_dict(self) -> dict[str, Any]:
        return {"restorable": self.restorable.to_dict() if self.restorable else None,
                "cursor": self.cursor, "generations": [g.to_dict() for g in self.generations]}


def _reason(code: str, detail: str) -> dict[str, str]:
    return {"code": code, "detail": detail}


def _static_reasons(manifest: dict[str, Any], attempt: int, world_size: int | None,
                    dataset_version: str | None,
                    required_components: list[str] | None) -> list[dict[str, str]]:
    """Rules that need no storage: the recovery core's, plus the restarting job's world size and
    dataset version."""
    from recoverydash.recovery.generations import (
        component_missing,
        schema_unsupported,
        shard_missing,
        update_mismatch,
    )
    from recoverydash.recovery.inputs import GenerationRecord

    gen = GenerationRecord(generation_id=str(manifest.get("generation_id")), attempt=attempt,
                           manifests=[manifest])
    out: list[dict[str, str]] = []
    r = schema_unsupported(manifest)
    if r is not None:
        return [{"code": r.code, "detail": r.detail}]
    required = required_components or manifest.get("required_components") \
        or DEFAULT_REQUIRED_COMPONENTS
    for r in (shard_missing(gen, manifest), component_missing(manifest, required),
              update_mismatch(gen, manifest)):
        if r is not None:
            out.append({"code": r.code, "detail": r.detail})
    if world_size is not None and manifest.get("world_size") != world_size:
        out.append(_reason("world_size_mismatch", f"manifest world_size "
                           f"{manifest.get('world_size')}, this job runs {world_size} ranks "
                           "(per-rank state needs an explicit mapping)"))
    if dataset_version is not None and manifest.get("dataset_version") != dataset_version:
        out.append(_reason("dataset_version_mismatch",
                           f"manifest dataset_version {manifest.get('dataset_version')!r}, this "
                           f"job reads {dataset_version!r}"))
    return out


def _storage_reasons(manifest: dict[str, Any], s3_client: Any,
                     full_hash_max_bytes: int | None) -> tuple[list[dict[str, str]], bool]:
    """(reasons from verifying every object, whether storage could not answer for some)."""
    failures: dict[str, list[str]] = {}
    unverified = []
    for obj in manifest.get("objects") or []:
        uri = obj.get("uri")
        try:
            check = storage.verify_object(uri, int(obj.get("size", -1)), obj.get("sha256"),
                                          s3_client=s3_client, checksums=obj.get("checksums"),
                                          full_hash_max_bytes=full_hash_max_bytes)
        except TransientStorageError as e:
            unverified.append(f"{uri}: {e}")
            continue
        except StorageError as e:
            failures.setdefault("object_missing", []).append(f"{uri}: {e}")
            continue
        if check.status == "storage_unverified":
            unverified.append(f"{uri}: {check.detail}")
        elif check.status != "ok":
            failures.setdefault(check.status, []).append(f"{uri}: {check.detail}")
    reasons = [_reason(code, f"{len(items)} object(s): " + "; ".join(items[:5]))
               for code, items in failures.items()]
    if unverified:
        reasons.append(_reason("storage_unverified", f"{len(unverified)} object(s) not verified: "
                               + "; ".join(unverified[:5])))
    return reasons, bool(unverified)


def select_restorable(location: str, *, world_size: int | None = None,
                      dataset_version: str | None = None,
                      required_components: list[str] | None = None, s3_client: Any = None,
                      verify_all: bool = False,
                      full_hash_max_bytes: int | None = None,
                      decided: dict[str, list[dict[str, str]]] | None = None) -> Selection:
    """The newest restorable generation of ``location`` (a folder or ``s3://bucket/prefix``),
    decided from storage alone.

    Generations are taken newest first (by ``update``, then ``committed_at``); each is checked
    by the rules (module doc) and its objects verified (size; sha256 where the manifest has one,
    read in full whatever the size, or a full-object checksum S3 stores; ``full_hash_max_bytes``
    is an opt-out: an object over it that no stored checksum decides leaves its generation
    ``committed``, ``storage_unverified``). Checking stops at the first restorable one unless
    ``verify_all``; older ones are then listed as ``committed``. world_size / dataset_version:
    the restarting job's, compared when given. required_components: default the manifest's
    ``required_components``, else the contract's default. decided: generations already found not
    restorable elsewhere, ``{generation_id: [reason]}`` (``restore_plan`` passes the server's
    decided rejections of a 409): each is listed ``rejected`` with those reasons and never
    chosen, without reading its objects.

    Returns a Selection. Raises StorageError (Transient/Permanent) only when the location cannot
    be listed."""
    location = resolve_location(location)
    found = _found_generations(location, s3_client)
    chosen = None
    decided = decided or {}
    for g in found:
        if g.status:
            continue
        if g.generation_id in decided:
            g.status, g.reasons = "rejected", list(decided[g.generation_id])
            continue
        if chosen is not None and not verify_all:
            g.status = "committed"
            g.reasons.append(_reason("not_checked", f"a newer generation "
                                     f"({chosen.generation_id}) is restorable"))
            continue
        status = _judge(g, world_size, dataset_version, required_components, s3_client,
                        verify_all, full_hash_max_bytes)
        if status == "restorable" and chosen is None:
            chosen = g
    return Selection(chosen, found)


def _found_generations(location: str, s3_client: Any) -> list[GenerationCheck]:
    """Every manifest of ``location``, newest first (by ``update``, then ``committed_at``, then
    id), unjudged (status ``""``); one that storage could not read is ``committed``
    (``storage_unverified``, transient) or ``rejected`` (``schema_unsupported``) already."""
    found: list[GenerationCheck] = []
    for uri in storage.list_manifests(location, s3_client=s3_client):
        gen_id = uri.rstrip("/").split("/")[-2]
        try:
            manifest = storage.read_manifest(uri, s3_client=s3_client)
        except TransientStorageError as e:
            found.append(GenerationCheck(gen_id, None, "committed",
                                         [_reason("storage_unverified", str(e))], uri))
            continue
        except StorageError as e:
            found.append(GenerationCheck(gen_id, None, "rejected",
                                         [_reason("schema_unsupported", f"unreadable: {e}")], uri))
            continue
        update = manifest.get("update") if isinstance(manifest.get("update"), int) else None
        found.append(GenerationCheck(str(manifest.get("generation_id") or gen_id), update, "",
                                     [], uri, manifest))
    found.sort(key=lambda g: (g.update if g.update is not None else -1,
                              (g.manifest or {}).get("committed_at") or "", g.generation_id),
               reverse=True)
    return found


def _judge(g: GenerationCheck, world_size: int | None, dataset_version: str | None,
           required_components: list[str] | None, s3_client: Any, verify_all: bool,
           full_hash_max_bytes: int | None) -> str:
    """Set ``g``'s status and reasons: the rules that need no storage, then (unless those
    rejected it and ``verify_all`` is off) every object verified in storage. Returns the
    status."""
    manifest = g.manifest or {}
    attempt = manifest.get("attempt")
    try:
        g.reasons = _static_reasons(manifest, attempt if isinstance(attempt, int) else 0,
                                    world_size, dataset_version, required_components)
    except Exception as e:  # a malformed manifest must not stop the others
        g.reasons = [_reason("schema_unsupported", f"malformed manifest: {e!r}")]
    if g.reasons and not verify_all:
        g.status = "rejected"
        return g.status
    storage_reasons, unverified = _storage_reasons(manifest, s3_client, full_hash_max_bytes)
    g.reasons += storage_reasons
    hard = [r for r in g.reasons if r["code"] != "storage_unverified"]
    g.status = "rejected" if hard else ("committed" if unverified else "restorable")
    return g.status
