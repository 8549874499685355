"""Publishing checkpoint files a trainer wrote itself, and finding the one to resume.

Frameworks write their own checkpoints (HF Trainer's ``checkpoint-N/`` folders, Lightning's
``.ckpt`` files). ``publish_files`` turns such files into a generation: it sizes and sha256-hashes
each file, maps it to the components it holds, and publishes the manifest (the commit) beside
them, in the location layout of ``recoverydash.storage.objects``::

    <location>/<generation_id>/recoverydash-manifest.json   the commit marker (nothing else)
    <location>/...                                          the framework's files, untouched

so the framework keeps its own layout, retention and resume logic, and readers
(``select_restorable``, ``python -m recoverydash.sdk check``, the server's manifest discovery)
find the generation like any other.

One file, several components (extension of spec 4, ``docs/ingest-v1.md``): a file named under
several components (a Lightning ``.ckpt`` holds model, optimizer, scheduler and loop state) is
listed once, as one object whose ``component`` is the first of them and whose ``components``
lists them all; the recovery core counts each of them as carried (``component_missing``).

Everything here is standard library plus the SDK; torch is imported only under
``torch.distributed``. Nothing here raises into training.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from recoverydash.sdk.checkpoint import (
    DEFAULT_REQUIRED_COMPONENTS,
    _all_agree,
    _all_gather_json,
    _dist_info,
    restore_plan,
    select_restorable,
    shard_name,
)
from recoverydash.sdk.client import now_rfc3339
from recoverydash.storage import objects as storage

log = logging.getLogger("recoverydash.integrations")

_ID_SAFE = re.compile(r"[^A-Za-z0-9._=+-]")


def local_location(path: str | os.PathLike) -> str:
    """An absolute folder for ``path``: a relative folder is resolved against the working
    directory (``file://`` URIs are returned as their path). Raises ValueError for an ``s3://``
    or other URI: frameworks write their checkpoints to a local (or mounted) folder."""
    p = os.fspath(path)
    if "://" in p:
        parsed = storage.parse_uri(p)
        if parsed.scheme != "file":
            raise ValueError(f"expected a local folder, got {p!r}")
        return parsed.path
    return os.path.abspath(p)


def generation_name(update: int, attempt: int, name: str | None = None) -> str:
    """``u<update:09d>-a<attempt>`` (``make_generation_id``), with ``-<name>`` appended when given
    (characters other than letters, digits and ``._=+-`` become ``_``), e.g.
    ``u000000010-a0-epoch=0-step=10``. Unique in a run as long as one attempt writes each name at
    most once per update; sorts by update."""
    base = f"u{int(update):09d}-a{int(attempt)}"
    return f"{base}-{_ID_SAFE.sub('_', name)}" if name else base


def free_generation_id(location: str | os.PathLike, generation_id: str) -> str:
    """``generation_id``, or ``<generation_id>-2``, ``-3``... when a manifest folder of that name
    already exists under ``location`` (a relaunch that reused its attempt number saving the same
    update again): a published manifest is never replaced, and training never sees a conflict."""
    loc = local_location(location)
    candidate, n = generation_id, 1
    while os.path.exists(os.path.join(loc, candidate, storage.MANIFEST_NAME)):
        n += 1
        candidate = f"{generation_id}-{n}"
    return candidate


def _paths(value: Any) -> list[str]:
    if isinstance(value, (str, os.PathLike)):
        return [os.fspath(value)]
    if isinstance(value, Sequence):
        return [os.fspath(v) for v in value]
    raise TypeError(f"expected a path or a list of paths, got {type(value).__name__}")


def _expand(path: str) -> list[str]:
    """A file, or every file under a folder (sorted), as absolute paths."""
    path = os.path.abspath(path)
    if os.path.isdir(path):
        out = []
        for root, dirs, names in os.walk(path):
            dirs.sort()
            out += [os.path.join(root, n) for n in sorted(names)]
        return out
    return [path]


def describe_files(files: Mapping[str, Any], *, shard: str, update: int) -> list[dict]:
    """Manifest objects for ``files`` (``{component: path, folder or list of them}``): one object
    per distinct file (folders are walked), sized and sha256-hashed now; a file named under
    several components is one object with ``component`` (the first) and ``components`` (all).
    Raises OSError when a file cannot be read (a file that is not there cannot be published)."""
    owners: dict[str, list[str]] = {}
    for component, value in files.items():
        for p in _paths(value):
            for f in _expand(p):
                owners.setdefault(f, [])
                if component not in owners[f]:
                    owners[f].append(component)
    out = []
    for path, components in owners.items():
        digest, size = storage.sha256_file(path)
        obj = {"uri": storage.file_uri(path), "shard": shard, "component": components[0],
               "size": size, "sha256": digest, "update": int(update)}
        if len(components) > 1:
            obj["components"] = components
        out.append(obj)
    return out


def merge_cursors(cursors: Sequence) -> list[dict]:
    """The lineage's frontier from per-rank committed cursors: per stratum, the cursor with the
    highest ``(epoch, position)``."""
    best: dict[str, dict] = {}
    for cur in cursors:
        for c in cur or []:
            if not isinstance(c, dict) or "stratum" not in c:
                continue
            held = best.get(c["stratum"])
            if held is None or (c.get("epoch", 0), c.get("position", 0)) > \
                    (held.get("epoch", 0), held.get("position", 0)):
                best[c["stratum"]] = {"stratum": c["stratum"], "epoch": int(c.get("epoch", 0)),
                                      "position": int(c.get("position", 0))}
    return [best[s] for s in sorted(best)]


def publish_files(location: str | os.PathLike, generation_id: str, update: int,
                  files: Mapping[str, Any], *, client: Any = None, recorder: Any = None,
                  cursor: list | None = None, dataset_version: str | None = None,
                  config_digest: str | None = None, required_components: list | None = None,
                  world_size: int | None = None, extra: Mapping | None = None,
                  announced: bool = False, distributed: bool = True, group=None,
                  coordinator: int = 0) -> dict | None:
    """Publish files the trainer already wrote as generation ``generation_id`` at ``update``.

    location: the folder the manifest goes under (relative: from the working directory); the
    files may lie anywhere under it. files: this rank's files, ``{component: path}`` (a path, a
    folder, or a list of them; the same path under several components is one object carrying
    them all). update: optimizer updates completed that the files hold.
    client: the sender of the checkpoint events (default ``recorder.client``). recorder: its
    committed ``cursor()`` becomes ``data_progress.cursor`` (the maximum over ranks), unless
    ``cursor`` is given. dataset_version: default the recorder's. required_components: the
    contract's list written into the manifest (default spec 4's). world_size: data-parallel
    ranks of the job (default: the process group's, else 1). extra: more manifest fields (an
    extension, kept verbatim by readers). announced: ``checkpoint_started`` was already sent.

    Distributed (``torch.distributed`` initialised and ``distributed``): a collective; every rank
    passes its own files, every rank's shard (``rank<r>``) is required, all ranks agree that
    their files were described, the coordinator gathers the objects and publishes the manifest.
    Otherwise the calling rank alone publishes its files as shard ``rank<r>``.

    Returns the manifest, or None when nothing was published (a file missing or unreadable on
    some rank, a different manifest already published under this id, storage refusing the
    write). Never raises."""
    client = client if client is not None else getattr(recorder, "client", None)
    try:
        loc = local_location(location)
        dist_on, rank, world = _dist_info(group)
        collective = bool(distributed and dist_on and world > 1)
        if not collective:
            rank = next((r for r in (getattr(recorder, "rank", None), getattr(client, "rank", None))
                         if isinstance(r, int)), rank)
        shard = shard_name(rank)
        is_coord = rank == coordinator or not collective
        components = list(files)
        if collective:  # the coordinator's id is the generation's, on every rank
            generation_id = _all_gather_json(generation_id, group)[coordinator]
    except Exception as e:
        log.warning("recoverydash: generation %s not published: %r", generation_id, e)
        return None
    if is_coord and client is not None and not announced:
        client.checkpoint_started(generation_id, update,
                                  [shard_name(r) for r in range(world)] if collective else [shard],
                                  components)
    ok, objects = True, []
    try:
        objects = describe_files(files, shard=shard, update=update)
    except Exception as e:
        ok = False
        log.warning("recoverydash: rank %d: generation %s not published: %r", rank,
                    generation_id, e)
    own_cursor = cursor
    if own_cursor is None and recorder is not None:
        try:
            own_cursor = recorder.cursor()
        except Exception as e:  # noqa: BLE001 - the files are still published
            log.warning("recoverydash: no data cursor for %s: %r", generation_id, e)
    if ok and client is not None:
        client.shard_written(generation_id, shard, update, objects, rank=rank)
    try:
        if collective:
            if not _all_agree(ok, group):
                log.warning("recoverydash: generation %s failed on some rank: nothing published",
                            generation_id)
                return None
            reports = _all_gather_json({"rank": rank, "objects": objects,
                                        "components": components, "cursor": own_cursor}, group)
        else:
            if not ok:
                return None
            reports = [{"rank": rank, "objects": objects, "components": components,
                        "cursor": own_cursor}]
    except Exception as e:
        log.warning("recoverydash: generation %s not published (a rank is gone?): %r",
                    generation_id, e)
        return None
    if not is_coord:
        return _learn(None, collective, group, coordinator)
    manifest = None
    try:
        shards = [shard_name(r["rank"]) for r in reports]
        lacking = [s for s, r in zip(shards, reports) if not r["objects"]]
        if lacking:
            raise ValueError(f"shards without files: {lacking}")
        all_objects = [o for r in reports for o in r["objects"]]
        named = list(dict.fromkeys(c for r in reports for c in r["components"]))
        merged = merge_cursors([r.get("cursor") for r in reports]) if cursor is None \
            else list(cursor)
        manifest = {
            "schema_revision": 1, "generation_id": generation_id, "update": int(update),
            "world_size": int(world_size or world), "required_shards": shards,
            "components": named, "objects": all_objects, "data_progress": {"cursor": merged},
            "dataset_version": dataset_version or getattr(recorder, "dataset_version", None)
            or "unknown",
            "committed_at": now_rfc3339(),
            "required_components": list(required_components or DEFAULT_REQUIRED_COMPONENTS),
        }
        if config_digest:
            manifest["config_digest"] = config_digest
        if client is not None:
            manifest["run_id"] = client.run_id
            manifest["attempt"] = client.attempt
        manifest.update(dict(extra or {}))
        storage.write_manifest_atomically(loc, manifest)
    except storage.ManifestConflictError as e:
        log.warning("recoverydash: %s; the published one is kept (a generation id must be new "
                    "for every save)", e)
        manifest = None
    except Exception as e:
        log.warning("recoverydash: manifest of %s not written: %r", generation_id, e)
        manifest = None
    manifest = _learn(manifest, collective, group, coordinator)
    if manifest is not None and client is not None:
        client.checkpoint_committed(manifest)
    return manifest


def _learn(manifest, collective: bool, group, coordinator: int):
    """Every rank learns the coordinator's outcome (the manifest or None)."""
    if not collective:
        return manifest
    try:
        return _all_gather_json(manifest, group)[coordinator]
    except Exception as e:
        log.warning("recoverydash: could not learn whether the manifest was published: %r", e)
        return None


def remove_manifest(location: str | os.PathLike, generation_id: str) -> bool:
    """Remove the manifest folder ``<location>/<generation_id>/`` after the framework deleted the
    generation's files itself (its retention: ``save_total_limit``, ``save_top_k``): a commit
    marker must not outlive what it commits. Only a folder holding nothing but the manifest is
    removed. Returns whether it was. Never raises."""
    try:
        folder = os.path.join(local_location(location), generation_id)
        names = os.listdir(folder)
        if set(names) - {storage.MANIFEST_NAME}:
            return False
        for n in names:
            os.unlink(os.path.join(folder, n))
        os.rmdir(folder)
        return True
    except FileNotFoundError:
        return False
    except Exception as e:
        log.warning("recoverydash: manifest of %s not removed: %r", generation_id, e)
        return False


# --- resuming -------------------------------------------------------------------------------------

_RESUMED: dict[str, dict] = {}
"""Manifests chosen by ``restorable_manifest`` in this process, by location: what the callbacks
report as ``resumed_from`` when training starts from them."""


def resumed_manifest(location: str | os.PathLike, update: int | None = None) -> dict | None:
    """The manifest ``restorable_manifest`` chose for ``location`` in this process (None when
    none was chosen, or its update is not ``update``)."""
    try:
        m = _RESUMED.get(local_location(location))
    except ValueError:
        return None
    if m is None or (update is not None and m.get("update") != update):
        return None
    return m


def restorable_manifest(location: str | os.PathLike, *, url: str | None = None,
                        token: str | None = None, run_id: str | None = None,
                        world_size: int | None = None,
                        dataset_version: str | None = None) -> dict | None:
    """The manifest of the newest restorable generation under ``location`` (a folder; relative:
    from the working directory), or None.

    With ``url`` (and ``token``, ``run_id``) the server's restore plan decides (it also knows the
    data ledger: ``data_cursor_mismatch``, ``stale_state``); when it does not answer, storage
    decides (``select_restorable``: manifests, shards, components, sizes and sha256 of every
    object). Under ``torch.distributed`` rank 0 decides and every rank gets its answer (a
    collective). Never raises: a location that cannot be read gives None (a fresh start)."""
    try:
        loc = local_location(location)
    except ValueError as e:
        log.warning("recoverydash: %s", e)
        return None
    dist_on, rank, world = _dist_info(None)
    manifest = None
    if rank == 0 or not dist_on:
        manifest = _choose(loc, url, token, run_id, world_size, dataset_version)
    if dist_on and world > 1:
        try:
            manifest = _all_gather_json(manifest)[0]
        except Exception as e:
            log.warning("recoverydash: ranks could not agree on the generation to resume: %r", e)
            manifest = None
    if manifest is not None:
        _RESUMED[loc] = manifest
    return manifest


def _choose(loc: str, url, token, run_id, world_size, dataset_version) -> dict | None:
    try:
        sel = None
        if url:
            plan = restore_plan(url, token, run_id or "run", location=loc, world_size=world_size,
                                dataset_version=dataset_version)
            for w in plan.get("warnings") or []:
                log.warning("recoverydash: restore plan: %s: %s", w.get("code"), w.get("detail"))
            if plan.get("source") == "server":
                if not plan.get("generation_id"):
                    return None
                manifest = _manifest_of(loc, plan["generation_id"])
                damaged = _damaged(manifest) if manifest is not None else ["no manifest"]
                if not damaged:
                    return manifest
                # the server verified it when it was committed; storage says otherwise now
                log.warning("recoverydash: the restore plan names %s, but storage fails it now "
                            "(%s); choosing among older generations", plan["generation_id"],
                            "; ".join(damaged[:3]))
                sel = select_restorable(loc, world_size=world_size,
                                        dataset_version=dataset_version, verify_all=True)
                ok = [g for g in sel.generations if g.status == "restorable"
                      and (g.update or 0) <= (plan.get("update") or 0)
                      and g.generation_id != plan["generation_id"]]
                return ok[0].manifest if ok else None
        sel = select_restorable(loc, world_size=world_size, dataset_version=dataset_version)
        for g in sel.rejected:
            log.warning("recoverydash: generation %s is not restorable: %s", g.generation_id,
                        "; ".join(f"{r['code']}: {r['detail']}" for r in g.reasons))
        return sel.manifest
    except Exception as e:
        log.warning("recoverydash: cannot choose a generation under %s: %r", loc, e)
        return None


def _damaged(manifest: dict) -> list[str]:
    """What storage says is wrong with a manifest's objects now (size, sha256), one line each."""
    out = []
    for obj in manifest.get("objects") or []:
        try:
            check = storage.verify_object(obj.get("uri"), int(obj.get("size", -1)),
                                          obj.get("sha256"))
        except storage.StorageError as e:
            out.append(f"{obj.get('uri')}: {e}")
            continue
        if check.status not in ("ok", "storage_unverified"):
            out.append(f"{obj.get('uri')}: {check.status} ({check.detail})")
    return out


def _manifest_of(loc: str, generation_id: str) -> dict | None:
    """The manifest of ``generation_id`` under ``loc`` (its folder, else any manifest naming
    it), or None."""
    try:
        return storage.read_manifest(storage.manifest_uri(loc, generation_id))
    except Exception:
        pass
    for uri in storage.list_manifests(loc):
        try:
            m = storage.read_manifest(uri)
        except Exception:
            continue
        if m.get("generation_id") == generation_id:
            return m
    log.warning("recoverydash: the restore plan names %s, which has no manifest under %s",
                generation_id, loc)
    return None


def manifests_at(location: str | os.PathLike, update: int) -> list[dict]:
    """Every readable manifest under ``location`` at ``update``, newest ``committed_at`` first."""
    out = []
    try:
        for uri in storage.list_manifests(local_location(location)):
            try:
                m = storage.read_manifest(uri)
            except Exception:
                continue
            if m.get("update") == update:
                out.append(m)
    except Exception as e:
        log.warning("recoverydash: cannot list %s: %r", location, e)
    return sorted(out, key=lambda m: m.get("committed_at") or "", reverse=True)
