"""What the HF Trainer and Lightning integrations share about the checkpoints a framework
writes itself: naming their generations, retiring the manifests of files the framework
rewrites or deletes, and choosing the one to resume.

Layout (``recoverydash.checkpoints.objects``): the framework's files stay where it writes them; the
manifest of each save (``recoverydash.sdk.publish_files``) goes in a folder of its own beside
them, ``<location>/u<update:09d>-a<attempt>[-<name>]/recoverydash-manifest.json``, that the
framework never touches. The checkpoint to resume is read back from the manifest's objects (the
folder or file they lie in), never from a name.
"""

from __future__ import annotations

import logging
import os
import re
import time

from recoverydash.checkpoints import objects as storage
from recoverydash.checkpoints.objects import resolve_location
from recoverydash.checkpoints.selection import select_restorable
from recoverydash.sdk import faults
from recoverydash.sdk.checkpoint import restore_plan
from recoverydash.sdk.collective import all_gather_json, dist_info

log = logging.getLogger("recoverydash.integrations")

_ID_SAFE = re.compile(r"[^A-Za-z0-9._=+-]")


def local_folder(location: str | os.PathLike) -> str:
    """The absolute folder of ``location`` (a relative folder is resolved against the working
    directory; ``file://`` URIs give their path). Raises ValueError for ``s3://`` and other
    URIs: frameworks write their checkpoints to a local (or mounted) folder."""
    loc = resolve_location(os.fspath(location))
    parsed = storage.parse_uri(loc)
    if parsed.scheme != "file":
        raise ValueError(f"expected a local folder, got {location!r}")
    return parsed.path


def generation_name(update: int, attempt: int, name: str | None = None) -> str:
    """``u<update:09d>-a<attempt>`` (``make_generation_id``), with ``-<name>`` appended when given
    (characters other than letters, digits and ``._=+-`` become ``_``), e.g.
    ``u000000010-a0-epoch=0-step=10``: unique in a run as long as one attempt saves a name at
    most once per update, and sorted by update."""
    base = f"u{int(update):09d}-a{int(attempt)}"
    return f"{base}-{_ID_SAFE.sub('_', name)}" if name else base


def free_generation_id(location: str | os.PathLike, generation_id: str) -> str:
    """``generation_id``, or ``<generation_id>-2``, ``-3``... when a manifest folder of that name
    already exists under ``location`` (a relaunch that reused its attempt number saving the same
    update again): a published manifest is never replaced, and training never sees a
    ``ManifestConflictError``."""
    loc = local_folder(location)
    candidate, n = generation_id, 1
    while os.path.exists(os.path.join(loc, candidate, storage.MANIFEST_NAME)):
        n += 1
        candidate = f"{generation_id}-{n}"
    return candidate


def agreed(value, collective: bool):
    """Rank 0's ``value`` on every rank (a collective when ``collective``)."""
    return all_gather_json(value)[0] if collective else value


def remove_manifest(location: str | os.PathLike, folder_name: str) -> bool:
    """Remove the manifest folder ``<location>/<folder_name>/`` after the framework deleted the
    generation's files (its retention: ``save_total_limit``, ``save_top_k``): a commit marker
    must not outlive what it commits. Only a folder holding nothing but the manifest is removed.
    Returns whether it was. Never raises."""
    try:
        folder = os.path.join(local_folder(location), folder_name)
        names = os.listdir(folder)
        if set(names) - {storage.MANIFEST_NAME}:
            return False
        for n in names:
            os.unlink(os.path.join(folder, n))
        os.rmdir(folder)
        return True
    except FileNotFoundError:
        return False
    except Exception as e:  # noqa: BLE001 - housekeeping never stops training
        log.warning("recoverydash: manifest folder %s not removed: %r", folder_name, e)
        return False


def _manifests(loc: str) -> list[tuple[str, dict]]:
    """``(folder name, manifest)`` of every readable manifest under ``loc``, newest first."""
    out = []
    try:
        uris = storage.list_manifests(loc)
    except storage.StorageError as e:
        log.warning("recoverydash: cannot list %s: %r", loc, e)
        return []
    for uri in uris:
        try:
            out.append((uri.rstrip("/").split("/")[-2], storage.read_manifest(uri)))
        except storage.StorageError as e:
            log.debug("recoverydash: unreadable manifest %s: %r", uri, e)
    return sorted(out, key=lambda fm: (fm[1].get("update") or 0, fm[1].get("committed_at") or ""),
                  reverse=True)


def _object_paths(manifest: dict) -> list[str]:
    out = []
    for o in manifest.get("objects") or []:
        try:
            p = storage.parse_uri(o.get("uri", ""))
        except storage.StorageError:
            continue
        if p.scheme == "file":
            out.append(p.path)
    return out


def retire_manifests(location: str | os.PathLike, path: str | os.PathLike) -> list[str]:
    """Before the framework writes ``path`` (a file or a folder) again, remove the manifests
    under ``location`` whose objects all lie in it: the bytes they commit are about to be
    replaced (Lightning's ``last.ckpt`` at every save, Trainer's ``checkpoint-N/`` when a relaunch
    reaches update N again). The server keeps what it was told (its next storage check rejects
    those generations); the new save is published under its own generation id. Returns the
    generation ids retired. Never raises."""
    removed = []
    try:
        loc = local_folder(location)
        target = os.path.abspath(os.fspath(path))
        for folder, m in _manifests(loc):
            paths = _object_paths(m)
            mine = paths and len(paths) == len(m.get("objects") or []) and all(
                p == target or p.startswith(target + os.sep) for p in paths)
            if mine and remove_manifest(loc, folder):
                log.info("recoverydash: %s is written again: generation %s retired", path,
                         m.get("generation_id"))
                removed.append(str(m.get("generation_id")))
    except Exception as e:  # noqa: BLE001 - housekeeping never stops a save
        log.warning("recoverydash: manifests of %s not retired: %r", path, e)
    return removed


def manifest_naming(location: str | os.PathLike, path: str | os.PathLike,
                    update: int | None = None) -> dict | None:
    """The newest manifest under ``location`` with an object at ``path`` or below it (and at
    ``update`` when given): the generation a framework resumes when it loads ``path``."""
    try:
        loc = local_folder(location)
    except ValueError:
        return None
    target = os.path.abspath(os.fspath(path))
    for _, m in _manifests(loc):
        if update is not None and m.get("update") != update:
            continue
        if any(p == target or p.startswith(target + os.sep) for p in _object_paths(m)):
            return m
    return None


# --- resuming -------------------------------------------------------------------------------------

_CHOSEN: dict[str, str] = {}
"""The checkpoint path (absolute) ``resume_path`` chose, by location, in this process: the
callbacks report its generation as ``resumed_from`` when training starts from it."""


def chosen_path(location: str | os.PathLike) -> str | None:
    """The checkpoint ``resume_path`` chose for ``location`` in this process, or None."""
    try:
        return _CHOSEN.get(local_folder(location))
    except ValueError:
        return None


def resume_path(location: str | os.PathLike, checkpoint_of, *, url: str | None = None,
                token: str | None = None, run_id: str | None = None,
                world_size: int | None = None, dataset_version: str | None = None) -> str | None:
    """The checkpoint (a file or folder, joined to ``location`` as given, so a relative location
    stays relative) of the newest restorable generation under ``location``, or None.

    checkpoint_of(manifest, folder) -> absolute path of the checkpoint the manifest commits, or
    None. With ``url`` (and ``token``, ``run_id``) the server's restore plan decides (it also
    knows the data ledger: ``data_cursor_mismatch``, ``stale_state``), and its choice is verified
    in storage now (it verified the files when they were committed; a file damaged since sends
    the choice to older generations); when the server does not answer, or has not decided yet
    (``restore_plan``'s ``source: "storage"``), storage decides (``select_restorable``, never
    choosing what the server rejected). Under ``torch.distributed`` rank 0 decides and every rank
    gets its answer (a collective). Never raises: what cannot be read gives None (a fresh start)."""
    try:
        loc = local_folder(location)
    except ValueError as e:
        log.warning("recoverydash: %s", e)
        return None
    dist_on, rank, world = dist_info(None)
    chosen = None
    manifest = None
    t0 = time.monotonic()
    if rank == 0 or not dist_on:
        manifest = _choose(loc, url, token, run_id, world_size, dataset_version)
        chosen = checkpoint_of(manifest, loc) if manifest is not None else None
        if manifest is not None and chosen is None:
            log.warning("recoverydash: generation %s names no checkpoint of this framework "
                        "under %s; not resumed", manifest.get("generation_id"), loc)
    try:
        chosen = agreed(chosen, dist_on and world > 1)
    except Exception as e:  # noqa: BLE001 - a fresh start rather than ranks that disagree
        log.warning("recoverydash: ranks could not agree on the checkpoint to resume: %r", e)
        return None
    if chosen is None:
        return None
    if manifest is not None:  # a drill's trace: what was chosen, the seconds choosing it took
        faults.on_restore(str(manifest.get("generation_id")), round(time.monotonic() - t0, 6),
                          rank)
    _CHOSEN[loc] = chosen
    return os.path.join(os.fspath(location), os.path.relpath(chosen, loc))


def _choose(loc: str, url, token, run_id, world_size, dataset_version) -> dict | None:
    try:
        if url:
            plan = restore_plan(url, token, run_id or "run", location=loc, world_size=world_size,
                                dataset_version=dataset_version)
            for w in plan.get("warnings") or []:
                log.warning("recoverydash: restore plan: %s: %s", w.get("code"), w.get("detail"))
            if plan.get("source") == "server":
                return _verified_plan(loc, plan, world_size, dataset_version)
            if plan.get("source") == "storage":  # storage decided, without what the server
                for g in plan.get("rejected") or []:  # decided against (server_undecided)
                    log.warning("recoverydash: generation %s is not restorable: %s",
                                g.get("generation_id"), "; ".join(
                                    f"{r.get('code')}: {r.get('detail')}"
                                    for r in g.get("reasons") or []))
                gen = plan.get("generation_id")
                return next((m for _, m in _manifests(loc) if m.get("generation_id") == gen),
                            None) if gen else None
        sel = select_restorable(loc, world_size=world_size, dataset_version=dataset_version)
        for g in sel.rejected:
            log.warning("recoverydash: generation %s is not restorable: %s", g.generation_id,
                        "; ".join(f"{r['code']}: {r['detail']}" for r in g.reasons))
        return sel.manifest
    except Exception as e:  # noqa: BLE001 - a fresh start rather than a crash at launch
        log.warning("recoverydash: cannot choose a generation under %s: %r", loc, e)
        return None


def _verified_plan(loc: str, plan: dict, world_size, dataset_version) -> dict | None:
    """The manifest of the server's choice when storage still holds its files as committed;
    else the newest generation storage finds restorable at or below its update."""
    gen = plan.get("generation_id")
    if not gen:
        return None
    manifest = next((m for _, m in _manifests(loc) if m.get("generation_id") == gen), None)
    damaged = _damaged(manifest) if manifest is not None else [f"no manifest under {loc}"]
    if not damaged:
        return manifest
    log.warning("recoverydash: the restore plan names %s, but storage fails it now (%s); "
                "choosing among older generations", gen, "; ".join(damaged[:3]))
    sel = select_restorable(loc, world_size=world_size, dataset_version=dataset_version,
                            verify_all=True)
    ok = [g for g in sel.generations if g.status == "restorable" and g.generation_id != gen
          and (g.update or 0) <= (plan.get("update") or 0)]
    return ok[0].manifest if ok else None


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
