"""Loading a generation back (``load_generation``): every object checked against the manifest
before DCP sees it, the next restorable generation loaded when one fails, and what the
generation holds that the given state dicts had no place for said (``Restored.unplaced``).

torch is imported only inside the functions that need it.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from typing import Any

from recoverydash.checkpoints import objects as storage
from recoverydash.checkpoints import paths
from recoverydash.checkpoints.objects import (
    StorageError,
    resolve_location,
)
from recoverydash.checkpoints.selection import select_restorable
from recoverydash.sdk import faults
from recoverydash.sdk.client import Client, get_client
from recoverydash.sdk.collective import all_gather_json, dist_info
from recoverydash.sdk.guard import log
from recoverydash.sdk.publish import location_path, shard_name, staging_folder


def _on_s3(location: str) -> bool:
    return storage.parse_uri(location).scheme == "s3"


class Restored(dict):
    """What ``load_generation`` loaded: this rank's per-rank components as a dict
    (``{component: value}``, ``data_progress`` among them), and as attributes
    ``generation_id`` (the generation loaded, None when nothing could be), ``update`` (its update,
    0 for none), ``cursor`` (its manifest's data cursor), ``attempt`` (the attempt that wrote it,
    from its manifest), ``skipped`` (``[{"generation_id", "reason", "message"}]``: the
    candidates that failed before it, newest first) and ``unplaced`` (``{component: [key]}``:
    what the generation holds that the given state dicts had no place for, so it was not
    loaded; logged as a warning)."""

    def __init__(self, values=(), *, generation_id=None, update=0, cursor=(), attempt=None,
                 skipped=(), unplaced=None):
        super().__init__(values)
        self.unplaced: dict[str, list[str]] = dict(unplaced or {})
        self.generation_id = generation_id
        self.update = int(update or 0)
        self.cursor = list(cursor or [])
        self.attempt = attempt
        self.skipped = list(skipped)

    @property
    def resumed_from(self) -> dict | None:
        """The ``resumed_from`` object of ``attempt_started`` for what was loaded (None: a fresh
        start)."""
        if self.generation_id is None:
            return None
        return {"generation_id": self.generation_id, "update": self.update,
                "cursor": list(self.cursor)}


class RestoreError(RuntimeError):
    """No candidate could be loaded after a load had begun writing into ``state`` (the state may
    be partly overwritten, so a fresh start from it would be wrong)."""


def load_generation(location: str, generation_id: str, *, state: dict[str, Any],
                    client: Client | None = None, restore_rng: bool = True,
                    group=None, s3_client=None, staging_dir: str | None = None,
                    full_hash_max_bytes: int | None = None,
                    fallback: bool = True) -> Restored:
    """Load a generation written by ``save_generation`` (every rank calls it), or, when it
    fails, the next restorable one.

    location: a folder or an ``s3://bucket/prefix``. Before anything reaches DCP, every object of
    the generation's manifest is checked against it: on a folder, the file under the generation
    folder (size, and sha256 where the manifest has one, read in full; ``full_hash_max_bytes``
    opts out of reading objects over it, which are then loaded unverified; the objects are
    split between the ranks and the results agreed); from S3, each rank downloads into a local
    staging folder (a fresh temporary folder, under ``staging_dir`` when given, removed
    afterwards) every object of the DCP components in ``state`` and its own (or rank 0's)
    per-rank files, checking each download's size and sha256.

    A candidate whose check fails (``object_damaged``) or whose loading raises (``load_error``)
    is reported as ``restore_failed`` (docs/ingest-v1.md#restore_failed, by rank 0, flushed
    within 5 s) and, with ``fallback``, the next candidate is tried: the newest generation
    ``select_restorable`` finds restorable in storage at or below the failed one's update
    (rank 0 chooses, every rank follows).

    state: the DCP components to load in place, e.g. ``{"model": model_sd, "optimizer":
    optim_sd}`` (then apply them with ``set_state_dict`` / ``load_state_dict``). Returns a
    ``Restored``: this rank's per-rank components (``{component: value}`` for each
    ``rank<r>.pt``, falling back to ``rank0`` when the world size grew, and ``data_progress``)
    with the generation actually loaded as ``.generation_id`` / ``.update`` /
    ``.resumed_from`` (use those, not the plan's, for ``attempt_started``). Restores the RNG
    states when ``restore_rng``. Reports ``restore_completed`` with the seconds it took.

    When no candidate is left, a ``restore_failed`` with reason ``nothing_restorable`` (naming
    the last candidate tried) follows the candidates' own failures, then: with ``state``
    untouched (every failure was found before loading), an empty ``Restored`` with
    ``generation_id`` None (a fresh start); after a load had begun, RestoreError. A location
    that cannot be resolved is reported ``load_error`` and ``nothing_restorable`` for
    ``generation_id``, then RestoreError. Never raises otherwise."""
    t0 = time.monotonic()
    _, rank, world = dist_info(group)
    client = client if client is not None else get_client()
    skipped: list[dict] = []
    tried: set[str] = set()
    touched = False
    try:
        location = resolve_location(location)
    except StorageError as e:
        _report_failure(client, rank, generation_id, "load_error", f"location: {e}")
        _report_failure(client, rank, generation_id, "nothing_restorable",
                        f"no generation can be read: the location {location!r} cannot be "
                        "resolved")
        raise RestoreError(f"cannot resolve the location {location!r}: {e}") from e
    candidate: str | None = generation_id
    unplaced: dict[str, list[str]] = {}
    while candidate is not None:
        tried.add(candidate)
        unplaced.clear()
        manifest = _read_manifest_quietly(location, candidate, s3_client)
        out, reason, message = _try_candidate(location, candidate, manifest, state, rank, world,
                                              group, s3_client, staging_dir,
                                              full_hash_max_bytes, unplaced)
        touched = touched or reason == "load_error"  # DCP may have written into state
        if reason is None:
            break
        log.error("recoverydash: restoring %s failed (%s): %s", candidate, reason, message)
        skipped.append({"generation_id": candidate, "reason": reason, "message": message})
        _report_failure(client, rank, candidate, reason, message)
        candidate = _next_candidate(location, manifest, tried, world, s3_client, group) \
            if fallback else None
    else:
        last = skipped[-1]["generation_id"] if skipped else generation_id
        left = f"no restorable generation left after {[s['generation_id'] for s in skipped]}"
        if touched:
            _report_failure(client, rank, last, "nothing_restorable",
                            f"{left}; a load had begun writing into the state, so it is not "
                            "a fresh start (RestoreError)")
            raise RestoreError(f"no generation could be loaded: {skipped}")
        _report_failure(client, rank, last, "nothing_restorable", left)
        return Restored(skipped=skipped)
    out = out or {}
    if restore_rng and isinstance(out.get("rng"), dict):
        _restore_rng(out["rng"])
    if unplaced and rank == 0:
        _say_unplaced(candidate, unplaced)
    seconds = round(time.monotonic() - t0, 3)
    faults.on_restore(candidate, seconds, rank)
    if client is not None and rank == 0:
        client.restore_completed(candidate, seconds)
    manifest = manifest or {}
    attempt = manifest.get("attempt")
    return Restored(out, generation_id=candidate, update=manifest.get("update") or 0,
                    cursor=(manifest.get("data_progress") or {}).get("cursor") or [],
                    attempt=attempt if isinstance(attempt, int) and not isinstance(attempt, bool)
                    else None, skipped=skipped, unplaced=unplaced)


def _try_candidate(location: str, candidate: str, manifest: dict | None, state: dict, rank: int,
                   world: int, group, s3_client, staging_dir: str | None,
                   full_hash_max_bytes: int | None, unplaced: dict[str, list[str]]
                   ) -> tuple[dict | None, str | None, str]:
    """Check one candidate's objects (a folder location: where DCP reads them, split between
    the ranks), then load it; every rank learns every rank's problems. Returns ``(this rank's
    per-rank values, None, "")``, or ``(None, reason, message)`` with reason
    ``object_damaged`` or ``load_error`` (DCP may have written into ``state``)."""
    if not _on_s3(location):
        problems = _agreed_problems(
            _local_problems(location, candidate, manifest, rank, world, full_hash_max_bytes),
            group)
        if problems:
            return None, "object_damaged", "; ".join(problems[:5])
    try:
        out = _load_candidate(location, candidate, state, rank, group, s3_client, staging_dir,
                              unplaced)
        error = ""
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 - DCP's CheckpointException is one
        out, error = None, f"{type(e).__name__}: {e}"[:1000]
    errors = _agreed_problems([error] if error else [], group)
    if not errors:
        return out, None, ""
    return None, "object_damaged" if "StorageError" in errors[0] else "load_error", \
        "; ".join(errors[:3])


def _restore_rng(rng: dict) -> None:
    """Put back the RNG states a generation saved (``_rng_state``)."""
    import torch

    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def _load_candidate(location: str, generation_id: str, state: dict, rank: int, group, s3_client,
                    staging_dir: str | None, unplaced: dict[str, list[str]]) -> dict:
    if not _on_s3(location):
        return _load_dir(os.path.join(location_path(location), generation_id), state, rank, group,
                         unplaced)
    if s3_client is None:
        s3_client = storage.make_s3_client()
    staged = staging_folder(staging_dir, generation_id, rank, "load")
    try:
        _download_generation(location, generation_id, set(state), rank, staged, s3_client)
        return _load_dir(staged, state, rank, group, unplaced)
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def _read_manifest_quietly(location: str, generation_id: str, s3_client) -> dict | None:
    try:
        return storage.read_manifest(storage.manifest_uri(location, generation_id),
                                     s3_client=s3_client)
    except Exception:  # noqa: BLE001 - said by the check that follows
        return None


def _local_problems(location: str, generation_id: str, manifest: dict | None, rank: int,
                    world: int, full_hash_max_bytes: int | None) -> list[str]:
    """What is wrong with this rank's share (every ``world``-th object) of a folder generation's
    objects, checked where ``load_generation`` reads them: under ``<location>/<generation_id>``
    (an object URI relative to the generation folder, absolute under the manifest's
    ``base_uri`` or ``<location>/<generation_id>``, or absolute with a ``/<generation_id>/`` in
    it, as in a moved or copied folder, is looked up there: those are the files DCP reads;
    another absolute URI is checked as it stands). One line per failing object."""
    if manifest is None:
        return [f"no readable manifest for {generation_id} under {location}"] if rank == 0 else []
    folder = os.path.join(location_path(location), generation_id)
    bases = [b for b in (manifest.get("base_uri"), storage.join_uri(location, generation_id),
                         storage.join_uri(manifest["location"], generation_id)
                         if isinstance(manifest.get("location"), str) else None) if b]
    out = []
    for i, obj in enumerate(manifest.get("objects") or []):
        if i % world != rank:
            continue
        uri = str(obj.get("uri") or "")
        try:
            rel = uri if paths.is_relative(uri) else next(
                (r for b in bases if (r := paths.rest_under(paths.canonical(uri),
                                                            paths.canonical(b))) is not None),
                None)
            marker = f"/{generation_id}/"
            if rel is None and marker in uri:  # a moved or copied folder: the same layout here
                rel = uri[uri.index(marker) + len(marker):]
            where = storage.file_uri(os.path.join(folder, *rel.split("/"))) if rel else uri
            check = storage.verify_object(where, int(obj.get("size", -1)), obj.get("sha256"),
                                          full_hash_max_bytes=full_hash_max_bytes)
        except Exception as e:  # noqa: BLE001 - an object that cannot be checked is not loaded
            out.append(f"{uri}: {e}")
            continue
        if check.status not in ("ok", "storage_unverified"):
            out.append(f"{uri}: {check.status} ({check.detail})")
    return out


def _agreed_problems(mine: list[str], group) -> list[str]:
    """Every rank's problem lines (in rank order); without torch.distributed, ``mine``."""
    dist_on, _, world = dist_info(group)
    if not dist_on or world == 1:
        return list(mine)
    return [line for lines in all_gather_json(list(mine), group) for line in lines]


def _next_candidate(location: str, failed: dict | None, tried: set, world: int, s3_client,
                    group) -> str | None:
    """The newest generation storage finds restorable at or below ``failed``'s update and not
    tried yet (rank 0 decides; every rank gets its answer), or None."""
    dist_on, rank, _ = dist_info(group)
    chosen = None
    if rank == 0:
        ceiling = (failed or {}).get("update")
        try:
            sel = select_restorable(location, world_size=world if dist_on else None,
                                    s3_client=s3_client, verify_all=True)
            ok = [g for g in sel.generations if g.status == "restorable"
                  and g.generation_id not in tried
                  and (not isinstance(ceiling, int) or (g.update or 0) <= ceiling)]
            chosen = ok[0].generation_id if ok else None
        except Exception as e:  # noqa: BLE001 - nothing to fall back to
            log.error("recoverydash: cannot list the generations of %s: %r", location, e)
    if dist_on:
        chosen = all_gather_json(chosen, group)[0]
    return chosen


def _report_failure(client: Client | None, rank: int, generation_id: str, reason: str,
                    message: str) -> None:
    """``restore_failed`` from rank 0, flushed (the job may die next)."""
    if client is None or rank != 0:
        return
    try:
        client.restore_failed(generation_id, reason, message)
        client.flush(5)
    except Exception:  # noqa: BLE001 - never raise from reporting
        log.debug("recoverydash: restore_failed not sent", exc_info=True)


def _download_generation(location: str, generation_id: str, dcp_components: set, rank: int,
                         dest: str, s3_client) -> None:
    """Download what this rank needs of an S3 generation into ``dest/<component>/<name>``:
    every object of the DCP components asked for, and the per-rank files of its shard and of
    rank 0. Each download is checked against the manifest's size and sha256 (a mismatch raises
    StorageError: a restore must not load damaged bytes)."""
    manifest = storage.read_manifest(storage.manifest_uri(location, generation_id),
                                     s3_client=s3_client)
    prefix = storage.join_uri(location, generation_id).rstrip("/") + "/"
    wanted_small = {f"{shard_name(rank)}.pt", f"{shard_name(rank)}.json", "rank0.pt",
                    "rank0.json"}
    for obj in manifest.get("objects") or []:
        uri, component = obj.get("uri", ""), obj.get("component")
        if not uri.startswith(prefix):
            raise StorageError(f"object {uri} lies outside the generation {prefix}")
        rel = uri[len(prefix):]
        name = rel.rsplit("/", 1)[-1]
        if component not in dcp_components and name not in wanted_small:
            continue
        path = os.path.join(dest, *rel.split("/"))
        size, digest = storage.download_file(uri, path, s3_client=s3_client)
        if size != obj.get("size") or (obj.get("sha256") and digest != obj["sha256"]):
            raise StorageError(f"downloaded {uri}: {size} bytes sha256 {digest}, manifest says "
                               f"{obj.get('size')} bytes sha256 {obj.get('sha256')}")


def _unplaced_keys(folder: str, component: str, sd: Any) -> list[str]:
    """The keys of the DCP save in ``folder`` that ``{component: sd}`` has no place for (DCP
    loads in place only what the given state dict names: a fresh optimizer's ``state_dict()``
    names no ``state``), sorted; [] when the save's metadata cannot be read."""
    try:
        from torch.distributed.checkpoint import FileSystemReader
        from torch.distributed.checkpoint._nested_dict import flatten_state_dict

        saved = FileSystemReader(folder).read_metadata().state_dict_metadata
        given, _ = flatten_state_dict({component: sd})
    except Exception as e:  # noqa: BLE001 - the load itself went through
        log.debug("recoverydash: keys of %s not compared: %r", folder, e)
        return []
    return sorted(set(saved) - set(given))


def _say_unplaced(generation_id: str, unplaced: dict[str, list[str]]) -> None:
    for component, keys in unplaced.items():
        hint = ""
        if any(".state." in k for k in keys):
            hint = (" An optimizer's state_dict() holds no state before its first step: load "
                    "into get_state_dict(model, optimizer) (torch.distributed.checkpoint."
                    "state_dict), which creates it, then set_state_dict.")
        log.warning("recoverydash: generation %s holds %d entr%s of %s that the given state had "
                    "no place for, so they were not loaded: %s.%s", generation_id, len(keys),
                    "y" if len(keys) == 1 else "ies", component,
                    ", ".join(keys[:8]) + (f" and {len(keys) - 8} more" if len(keys) > 8
                                           else ""), hint)


def _load_dir(gen_dir: str, state: dict[str, Any], rank: int, group,
              unplaced: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """Load a generation from a local folder: per-rank files first (:func:`_read_rank_file`:
    one over the pickle budget fails the candidate before anything is written into ``state``),
    then DCP components in place; per-rank values returned; what a saved component holds that
    its given state dict has no place for goes to ``unplaced``."""
    import torch.distributed.checkpoint as dcp

    out: dict[str, Any] = {}
    for component in sorted(os.listdir(gen_dir)):
        folder = os.path.join(gen_dir, component)
        if component in state or not os.path.isdir(folder):
            continue
        for name in (f"{shard_name(rank)}.pt", f"{shard_name(rank)}.json", "rank0.pt",
                     "rank0.json"):
            path = os.path.join(folder, name)
            if os.path.exists(path):
                if name.endswith(".json"):
                    with open(path) as f:
                        out[component] = json.load(f)
                else:
                    out[component] = _read_rank_file(path)
                break
    for component, sd in state.items():
        folder = os.path.join(gen_dir, component)
        dcp.load({component: sd}, checkpoint_id=folder, process_group=group)
        if unplaced is not None:
            left = _unplaced_keys(folder, component, sd)
            if left:
                unplaced[component] = left
    return out


def _read_rank_file(path: str) -> Any:
    """``torch.load`` of a per-rank ``.pt`` once the checkpoint reader
    (``recoverydash.checkpoints.formats.readers.read_torch_zip``, the one ``check`` and the
    server use) read its pickle within the budget (``pickle_scan.PICKLE_BUDGET``: opcodes,
    stack, memo, bytes) and found what it names: with ``weights_only=False`` only when every
    global is one ``torch.load``'s default accepts (``readers.SAFE_GLOBALS``), else
    ``weights_only=True``, so torch refuses them unless the trainer allowed them
    (``torch.serialization.add_safe_globals``). Raises ``UnreadableFile`` (over the budget,
    broken) or torch's error."""
    import torch

    from recoverydash.checkpoints.formats.readers import read_torch_zip

    with open(path, "rb") as f:
        found = read_torch_zip(f, os.fstat(f.fileno()).st_size)
    trusted = not found.refused and not found.legacy
    return torch.load(path, weights_only=not trusted)


__all__ = ["RestoreError", "Restored", "load_generation"]
