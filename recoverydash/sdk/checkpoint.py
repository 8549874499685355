"""Checkpoint generations: publish them around ``torch.distributed.checkpoint`` (DCP), choose the
one to restore without the server, and load it.

Layout of one generation (``recoverydash.checkpoints.objects`` documents the location layout)::

    <location>/<generation_id>/model/__<rank>_0.distcp, .metadata      DCP save of state["model"]
    <location>/<generation_id>/optimizer/__<rank>_0.distcp, .metadata  DCP save of state["optimizer"]
    <location>/<generation_id>/scheduler/rank<r>.pt                    torch.save of rank_state[...]
    <location>/<generation_id>/rng/rank<r>.pt                          CPU/CUDA/python RNG states
    <location>/<generation_id>/data_progress/rank<r>.json              CountingRecorder.state_dict()
    <location>/<generation_id>/recoverydash-manifest.json              the commit marker

On an S3 location (``s3://bucket/prefix``) the layout is the same under the prefix: DCP writes
into a per-rank local staging folder (removed afterwards), and each rank uploads the files it
wrote to ``<prefix>/<generation_id>/<component>/<name>`` with a full-object ``ChecksumSHA256``
(``storage.upload_file``; one PUT per file up to 5 GiB). Manifest object URIs are then
``s3://`` URIs, and ``load_generation`` downloads them to a staging folder before loading.

Component assignment: every component has its own folder, so every object belongs to exactly one
component and ``component_missing`` means what it says. A DCP component (a key of ``state``) is one
``dcp.save`` of ``{key: state[key]}``: its ``__<r>_<n>.distcp`` files belong to shard ``rank<r>``
(the rank that wrote them), its ``.metadata`` to the coordinator's shard. DCP de-duplicates
replicated tensors, so with DDP some ranks may write no ``.distcp`` for a component: that is not a
missing component. Per-rank components (keys of ``rank_state``, plus ``rng`` and ``data_progress``)
are one small file per rank, so every required shard carries them. The manifest's ``components``
lists them all; its ``required_components`` (extra field) is the contract's list (default
``model, optimizer, scheduler, rng, data_progress`` unless you pass another).

Publication protocol (``save_generation``; docs/ingest-v1.md#7-checkpoints-in-storage): the
coordinator reports ``checkpoint_started``; every rank saves, sizes and sha256-hashes the files it
wrote and reports ``shard_written``; all ranks agree on success (an all-reduce of a success flag, so
a rank that failed or died makes every rank publish nothing); the coordinator gathers every rank's
objects, checks that every required shard and component reported and that all parts are at the same
update, writes the manifest atomically (the commit: temporary file and link on a filesystem, one
``IfNoneMatch="*"`` PUT on S3), then reports ``checkpoint_committed``. On S3 a rank whose upload
fails votes no in that all-reduce, so nothing is published; objects already uploaded for the failed
generation stay under its folder without a manifest, which readers never treat as a generation (the
next attempt uses another generation id). Collectives are plain tensor collectives (no ``*_object``
helpers, which need numpy).

Restore selection without the server (``select_restorable``, with ``GenerationCheck`` and
``Selection``) lives in the pure layer, ``recoverydash.checkpoints.selection``, which the server's
``check`` shares; ``restore_plan`` here asks the server first and falls back to it.

torch is imported only inside the functions that need it.
"""

from __future__ import annotations

import io
import json
import logging
import os
import random
import shutil
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from recoverydash.checkpoints import objects as storage
from recoverydash.checkpoints import paths
from recoverydash.checkpoints.objects import (
    DEFAULT_FULL_HASH_MAX_BYTES,
    StorageError,
    resolve_location,
)
from recoverydash.checkpoints.selection import DEFAULT_REQUIRED_COMPONENTS, select_restorable
from recoverydash.sdk import faults, fetch
from recoverydash.sdk.client import Client, get_client, now_rfc3339
from recoverydash.sdk.guard import ONCE
from recoverydash.sdk.transport import api_url

log = logging.getLogger("recoverydash.sdk")

def shard_name(rank: int) -> str:
    """The shard a rank writes: ``rank<r>``."""
    return f"rank{rank}"


def required_components_of(required_components: list[str] | None,
                           client: Client | None) -> list[str]:
    """The components every generation must hold: ``required_components`` when given, else the
    ``required_components`` of the contract the client declared (``attempt_started(...,
    contract=...)``, e.g. ``rec.start(contract=...)``), else the default
    (``DEFAULT_REQUIRED_COMPONENTS``)."""
    if required_components:
        return list(required_components)
    declared = getattr(client, "contract", None)
    named = declared.get("required_components") if isinstance(declared, dict) else None
    if isinstance(named, list) and all(isinstance(c, str) for c in named):
        return list(named)
    return list(DEFAULT_REQUIRED_COMPONENTS)


def say_missing_components(generation_id: str, required: list[str], held) -> list[str]:
    """Warn, once per process and set of components, that a generation holds none of some
    components the contract requires (the server rejects it ``component_missing``, and a restart
    cannot resume from it), naming the contract setting that says a trainer has no scheduler.
    Returns the missing components."""
    missing = [c for c in required if c not in set(held)]
    if missing:
        hint = "LR scheduler" if "scheduler" in missing else "such state"
        ONCE(("component_missing", tuple(missing)), logging.WARNING,
             "recoverydash: generation %s holds no %s, which the run's contract requires "
             "(required_components: %s): the server rejects it (component_missing) and a "
             "restart cannot resume from it. If the trainer has no %s, say so in the contract: "
             "leave %s out of required_components in attempt_started (rec.start(contract="
             "{\"required_components\": %s}) or client.attempt_started(..., contract=...); the "
             "manifests follow it) or on the run's contract page. Said once.", generation_id,
             ", ".join(missing), ", ".join(required), hint, ", ".join(missing),
             json.dumps([c for c in required if c not in missing]))
    return missing


def make_generation_id(update: int, attempt: int) -> str:
    """A generation id unique in the run and sorting by update: ``u<update:09d>-a<attempt>``.

    The attempt is part of it because a resumed attempt reaches the same update again and must
    never write into the folder of the older attempt's (possibly half-written) generation."""
    return f"u{int(update):09d}-a{int(attempt)}"


# --- collectives without numpy -------------------------------------------------------------------

def _all_gather_json(obj: Any, group=None) -> list:
    """Every rank's JSON-able ``obj``, in rank order, through two tensor all_gathers."""
    import torch
    import torch.distributed as dist

    data = json.dumps(obj, separators=(",", ":")).encode()
    world = dist.get_world_size(group)
    size = torch.tensor([len(data)], dtype=torch.int64)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(sizes, size, group=group)
    longest = max(int(s.item()) for s in sizes)
    buf = torch.zeros(max(longest, 1), dtype=torch.uint8)
    if data:
        buf[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    outs = [torch.zeros_like(buf) for _ in range(world)]
    dist.all_gather(outs, buf, group=group)
    return [json.loads(bytes(o[:int(s.item())].tolist())) for o, s in zip(outs, sizes)]


def _all_agree(flag: bool, group=None) -> bool:
    """True when every rank passes True (an all_reduce MIN of 0/1)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([1 if flag else 0], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    return bool(t.item())


def _dist_info(group) -> tuple[bool, int, int]:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover
        return False, 0, 1
    if dist.is_available() and dist.is_initialized():
        return True, dist.get_rank(), dist.get_world_size(group)
    return False, 0, 1


# --- saving ----------------------------------------------------------------------------------------

def merge_cursors(cursors: list) -> list[dict]:
    """The lineage's frontier from every rank's committed cursor: per stratum the highest
    ``(epoch, position)`` over ranks (each rank knows only the positions it consumed; the
    frontier is the position after the highest one any rank committed). Sorted by stratum."""
    best: dict = {}
    for cs in cursors:
        for c in cs or []:
            if not isinstance(c, dict) or "stratum" not in c:
                continue
            key = (int(c.get("epoch", 0)), int(c.get("position", 0)))
            if c["stratum"] not in best or key > best[c["stratum"]]:
                best[c["stratum"]] = key
    return [{"stratum": st, "epoch": e, "position": p} for st, (e, p) in sorted(best.items())]


def _local_path(location: str) -> str:
    p = storage.parse_uri(location)
    if p.scheme != "file":
        raise StorageError(f"not a filesystem location: {location!r}")
    return p.path


def _is_s3(location: str) -> bool:
    return storage.parse_uri(location).scheme == "s3"


def _staging(staging_dir: str | None, generation_id: str, rank: int, what: str) -> str:
    """A fresh local folder for one rank's copy of a generation on S3 (removed by the caller)."""
    if staging_dir:
        os.makedirs(staging_dir, exist_ok=True)
    return tempfile.mkdtemp(prefix=f"recoverydash-{what}-{generation_id}-rank{rank}-",
                            dir=staging_dir)


def _rng_state() -> bytes:
    import torch

    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def _own_dcp_files(folder: str, rank: int, coordinator: bool) -> list[str]:
    """Files DCP wrote for this rank in one component folder: ``__<rank>_*.distcp`` (and the
    ``.metadata`` when this rank is the coordinator)."""
    out = []
    for name in sorted(os.listdir(folder)):
        mine = name.startswith(f"__{rank}_") and name.endswith(".distcp")
        if mine or (coordinator and name == ".metadata"):
            out.append(name)
    return out


def _progress_file(shard: str, progress: dict) -> tuple[str, bytes]:
    """This rank's data progress file: ``rank<r>.json``, or ``rank<r>.pt`` (torch.save) when the
    state is not JSON (a loader state holding tensors)."""
    try:
        return f"{shard}.json", json.dumps(progress, sort_keys=True).encode()
    except (TypeError, ValueError):
        import torch

        buf = io.BytesIO()
        torch.save(progress, buf)
        return f"{shard}.pt", buf.getvalue()


def _describe(path: str, shard: str, component: str, update: int, *, upload_to: str | None = None,
              s3_client=None) -> dict:
    """The manifest entry of a file DCP wrote: sized and sha256-hashed here; with ``upload_to``
    (an ``s3://`` URI) the file is first uploaded there with that ChecksumSHA256."""
    digest, size = storage.sha256_file(path)
    uri = storage.file_uri(path)
    if upload_to is not None:
        storage.upload_file(upload_to, path, s3_client=s3_client, sha256=digest)
        uri = upload_to
    return {"uri": uri, "shard": shard, "component": component,
            "size": size, "sha256": digest, "update": update}


def save_generation(location: str, generation_id: str, update: int, *,
                    state: dict[str, Any], rank_state: dict[str, Any] | None = None,
                    recorder: Any = None, client: Client | None = None,
                    dataset_version: str | None = None, config_digest: str | None = None,
                    required_components: list[str] | None = None, capture_rng: bool = True,
                    group=None, coordinator: int = 0, s3_client=None,
                    staging_dir: str | None = None) -> dict | None:
    """Save and publish one generation; every rank calls it (a collective).

    location: a folder (``/ckpt`` or ``file:///ckpt``) or an S3 prefix (``s3://bucket/prefix``).
    On S3 each rank lets DCP write into a local staging folder (a fresh temporary folder, under
    ``staging_dir`` when given, removed afterwards), hashes each of its files, uploads it with
    that ``ChecksumSHA256`` (``storage.upload_file``) and reports the ``s3://`` URIs; the manifest
    is then one conditional PUT. s3_client: a boto3 client (default ``make_s3_client()`` from the
    environment). generation_id: unique in the run, no ``/``.
    update: optimizer updates completed that this state represents (the same on every rank).
    state: DCP components, e.g. ``{"model": model_sd, "optimizer": optim_sd}`` (each saved with
    ``dcp.save`` into its own folder; use ``torch.distributed.checkpoint.state_dict.get_state_dict``
    for sharded models). rank_state: small per-rank components, e.g. ``{"scheduler":
    scheduler.state_dict()}`` (``torch.save`` per rank). recorder: the ``CountingRecorder``, whose
    committed cursor becomes ``data_progress``. capture_rng: also save the ``rng`` component.
    client: the sender for checkpoint events (default: ``recorder.client``).

    A relative folder is resolved against the working directory (``resolve_location``). The
    manifest's ``data_progress.cursor`` is the maximum over ranks of their recorders' committed
    cursors (``merge_cursors``); this rank's ``data_progress`` file is its recorder's
    ``state_dict()`` (JSON, or a ``torch.save`` ``rank<r>.pt`` when the state holds tensors, as a
    StatefulDataLoader's does).

    Returns the published manifest on every rank, or None when nothing was published (a failure
    on any rank, a rank that died, a mismatch of update across ranks, an existing different
    manifest). Never raises: training goes on and the previous generation stays the fallback."""
    client = client or getattr(recorder, "client", None)
    try:
        location = resolve_location(location)
        distributed, rank, world = _dist_info(group)
    except Exception as e:  # pragma: no cover
        log.warning("recoverydash: checkpoint %s not published: %r", generation_id, e)
        return None
    is_coord = rank == coordinator
    shard = shard_name(rank)
    rank_state = dict(rank_state or {})
    small = list(rank_state) + (["rng"] if capture_rng else []) + ["data_progress"]
    components = list(dict.fromkeys(list(state) + small))
    required = required_components_of(required_components, client)
    if is_coord:
        say_missing_components(generation_id, required, components)
    shards = [shard_name(r) for r in range(world)]
    gen_uri = storage.join_uri(location, generation_id)
    if is_coord and client is not None:
        client.checkpoint_started(generation_id, update, shards, components)
    faults.save_point("before_shards", generation_id, update, rank, client=client,
                      coordinator=is_coord, every_rank=True, group=group)

    # Never write into a published generation: its files are someone's restore point.
    try:
        on_s3 = _is_s3(location)
        if on_s3 and s3_client is None:
            s3_client = storage.make_s3_client()
        taken = is_coord and storage.object_exists(storage.manifest_uri(location, generation_id),
                                                   s3_client=s3_client)
        if not (_all_agree(not taken, group) if distributed else not taken):
            log.warning("recoverydash: generation %s is already published; not saving over it "
                        "(use make_generation_id(update, attempt))", generation_id)
            return None
    except Exception as e:
        log.warning("recoverydash: generation %s not saved: %r", generation_id, e)
        return None

    ok, objects, progress, staged = True, [], None, None
    try:
        import torch
        import torch.distributed.checkpoint as dcp

        if on_s3:
            staged = _staging(staging_dir, generation_id, rank, "save")
            gen_dir = staged
        else:
            gen_dir = os.path.join(_local_path(location), generation_id)
        for component, sd in state.items():
            folder = os.path.join(gen_dir, component)
            dcp.save({component: sd}, checkpoint_id=folder, process_group=group)
            mine = _own_dcp_files(folder, rank, is_coord)
            for name in mine:
                target = storage.join_uri(gen_uri, component, name) if on_s3 else None
                objects.append(_describe(os.path.join(folder, name), shard, component, update,
                                         upload_to=target, s3_client=s3_client))
            if not on_s3:
                faults.save_point("during_shard", generation_id, update, rank, client=client,
                                  files=[os.path.join(folder, n) for n in mine
                                         if n != ".metadata"], coordinator=is_coord)
        files: dict[str, tuple[str, bytes]] = {}
        for component, value in rank_state.items():
            buf = io.BytesIO()
            torch.save(value, buf)
            files[component] = (f"{shard}.pt", buf.getvalue())
        if capture_rng:
            files["rng"] = (f"{shard}.pt", _rng_state())
        progress = recorder.state_dict() if recorder is not None else {"cursor": []}
        progress = {**progress, "update": update}
        files["data_progress"] = _progress_file(shard, progress)
        for component, (name, data) in files.items():
            uri = storage.join_uri(gen_uri, component, name)
            size, digest = storage.put_object(uri, data, s3_client=s3_client)
            objects.append({"uri": uri, "shard": shard, "component": component, "size": size,
                            "sha256": digest, "update": update})
            if not on_s3:
                faults.save_point("during_shard", generation_id, update, rank, client=client,
                                  files=[_local_path(uri)], coordinator=is_coord)
    except Exception as e:
        ok = False
        log.warning("recoverydash: rank %d could not save generation %s: %r", rank, generation_id, e)
    finally:
        if staged is not None:
            shutil.rmtree(staged, ignore_errors=True)

    if ok and client is not None:
        client.shard_written(generation_id, shard, update, objects, rank=rank)
    try:
        if distributed:
            if not _all_agree(ok, group):
                log.warning("recoverydash: generation %s failed on some rank: nothing published",
                            generation_id)
                return None
            reports = _all_gather_json({"rank": rank, "update": update, "objects": objects,
                                        "cursor": (progress or {}).get("cursor")}, group)
        else:
            if not ok:
                return None
            reports = [{"rank": rank, "update": update, "objects": objects,
                        "cursor": (progress or {}).get("cursor")}]
    except Exception as e:
        log.warning("recoverydash: generation %s not published (a rank is gone?): %r",
                    generation_id, e)
        return None

    manifest = None
    problem = _check_reports(reports, shards, components, update)
    if problem:
        log.warning("recoverydash: generation %s not published: %s", generation_id, problem)
        return None
    all_objects = [o for rep in reports for o in rep["objects"]]
    manifest = {
        "schema_revision": 1, "generation_id": generation_id, "update": update,
        "world_size": world, "required_shards": shards, "components": components,
        "objects": all_objects,
        "data_progress": {"cursor": merge_cursors([rep.get("cursor") for rep in reports]),
                          **({"samples_committed": progress["samples_committed"]}
                             if progress and "samples_committed" in progress else {})},
        "dataset_version": dataset_version or getattr(recorder, "dataset_version", None)
        or "unknown",
        "committed_at": now_rfc3339(),
        "required_components": required,
    }
    if config_digest:
        manifest["config_digest"] = config_digest
    if client is not None:
        manifest["run_id"] = client.run_id
        manifest["attempt"] = client.attempt
    published = False
    faults.save_point("before_commit", generation_id, update, rank, client=client,
                      coordinator=is_coord, every_rank=True, group=group)
    if is_coord:
        try:
            storage.write_manifest_atomically(location, manifest, s3_client=s3_client)
            published = True
        except Exception as e:
            log.warning("recoverydash: manifest of %s not written: %r", generation_id, e)
    if distributed:
        try:
            manifest = _all_gather_json(manifest if published else None, group)[coordinator]
        except Exception as e:
            log.warning("recoverydash: could not learn whether %s was published: %r",
                        generation_id, e)
            return None
    elif not published:
        return None
    if manifest is not None:
        # every rank knows the commit here: a drill's after_commit kills them all at one step
        faults.save_point("after_commit", generation_id, update, rank, client=client,
                          coordinator=is_coord, every_rank=True, group=group)
    if manifest is not None and is_coord and client is not None:
        client.checkpoint_committed(manifest)
    return manifest


@dataclass
class PublishResult:
    """What ``publish_files`` did: ``published`` (the manifest is committed), ``manifest`` (the
    document, also when an identical one was already there: ``already`` True), ``reason`` (why
    nothing was published), ``warnings`` (published, but the server will say more: a required
    component without files). ``bool(result)`` is ``published``."""

    published: bool
    manifest: dict | None = None
    reason: str | None = None
    already: bool = False
    warnings: list = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.published


def _expand(paths) -> list[str]:
    """Files named by a path or a list of paths; a folder stands for every file below it (sorted,
    hidden files included). Raises FileNotFoundError for a path that does not exist."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out: list[str] = []
    for p in paths:
        p = os.path.abspath(os.fspath(p))
        if os.path.isdir(p):
            for root, dirs, names in os.walk(p):
                dirs.sort()
                out.extend(os.path.join(root, n) for n in sorted(names))
        elif os.path.isfile(p):
            out.append(p)
        else:
            raise FileNotFoundError(p)
    return list(dict.fromkeys(out))


def publish_files(location: str, generation_id: str, update: int, files: dict[str, Any], *,
                  client: Client | None = None, recorder: Any = None,
                  data_progress: dict | None = None, dataset_version: str | None = None,
                  world_size: int | None = None, config_digest: str | None = None,
                  required_components: list[str] | None = None, collective: bool = False,
                  group=None, coordinator: int = 0, s3_client=None,
                  shard: str | None = None, announced: bool = False) -> PublishResult:
    """Publish a generation made of files a trainer wrote itself (HF Trainer's ``checkpoint-N/``,
    Lightning's ``.ckpt``, your own ``torch.save``): every file is sized and sha256-hashed, and the
    manifest is committed atomically at ``<location>/<generation_id>/recoverydash-manifest.json``
    (temporary file and link on a filesystem, one conditional PUT on S3), as ``save_generation``
    does.

    files: ``{component: path or [paths]}``; a folder stands for every file below it. One file
    may hold several components (a Lightning ``.ckpt``): name it under each, e.g.
    ``{"model": ckpt, "optimizer": ckpt}``; the manifest then lists the object once with
    ``components`` naming them all. On a folder location the files stay where they are (object
    URIs are their absolute ``file://`` URIs); on an S3 location each file is uploaded to
    ``<location>/<generation_id>/<component>/<name>`` with its ``ChecksumSHA256`` first.
    location: a folder (relative ones are resolved against the working directory), ``file://``
    or ``s3://bucket/prefix``. update: optimizer updates the files' state represents.
    data_progress: the manifest's data progress (default: ``{"cursor": recorder.cursor()}``;
    with neither, an empty cursor). client: the sender (default ``recorder.client``): it reports
    ``checkpoint_started``, ``shard_written`` and ``checkpoint_committed`` (``announced``: the
    caller sent ``checkpoint_started`` when the save began, so the save cost covers the writing
    of the files too). world_size: the manifest's (default: the torch.distributed world size,
    else the recorder's, else 1). collective: every rank calls it with the files it wrote (shard ``rank<r>``); the coordinator
    publishes only when every rank succeeded, with the cursor merged over ranks. Otherwise the
    caller's files are one shard (``shard``, default ``rank<r>`` of the caller) and the only
    required one. A required component (``required_components``, default the spec's) without
    files is published as it is (the server rejects it with ``component_missing``) and named in
    ``warnings``.

    A manifest already committed for ``generation_id`` with the same objects (a re-save of the
    same update on resume) is not an error: ``already`` is True. A different one is never
    overwritten: ``reason`` says so. Never raises: failures are logged and returned.

    Failure drills (``recoverydash.sdk.faults``, ``RECOVERYDASH_DRILL_FAULT``): the framework
    wrote its files before this is called, so three crash points are here: ``during_shard``
    (the largest of this rank's files truncated to half, before any is described),
    ``before_commit`` (files described and ``shard_written`` sent, no manifest) and
    ``after_commit`` (manifest committed, ``checkpoint_committed`` not sent). ``before_shards``
    belongs to the integration, where the framework announces the save before writing."""
    client = client or getattr(recorder, "client", None)
    try:
        location = resolve_location(location)
        distributed, rank, world = _dist_info(group)
        if not collective:
            distributed = False
        if world_size is None:
            world_size = world if _dist_info(group)[0] else getattr(recorder, "world_size", 1)
        on_s3 = _is_s3(location)
        if on_s3 and s3_client is None:
            s3_client = storage.make_s3_client()
        my_shard = shard or shard_name(rank)
        gen_uri = storage.join_uri(location, generation_id)
        components = list(files)
        if client is not None and not announced and (not distributed or rank == coordinator):
            shards = [shard_name(r) for r in range(world)] if distributed else [my_shard]
            client.checkpoint_started(generation_id, update, shards, components)
    except Exception as e:
        log.warning("recoverydash: generation %s not published: %r", generation_id, e)
        return PublishResult(False, reason=f"bad arguments: {e!r}")

    objects: list[dict] = []
    problem = None
    if faults.active_fault() is not None:
        # a drill's torn write: the largest of this rank's files (the framework's own, written
        # already) is the one truncated (docs: README 'Failure drills', which point applies where)
        try:
            mine = sorted({p for paths in files.values() for p in _expand(paths)},
                          key=lambda p: (-os.path.getsize(p), p))
        except Exception:  # noqa: BLE001 - a drill hook never stops a publication
            mine = []
        faults.save_point("during_shard", generation_id, update, rank, client=client,
                          files=mine, coordinator=not distributed or rank == coordinator)
    try:
        by_path: dict[str, dict] = {}
        for component, paths in files.items():
            for path in _expand(paths):
                entry = by_path.get(path)
                if entry is not None:
                    entry.setdefault("components", [entry["component"]]).append(component)
                    continue
                digest, size = storage.sha256_file(path)
                uri = storage.file_uri(path)
                if on_s3:
                    uri = storage.join_uri(gen_uri, component, os.path.basename(path))
                    storage.upload_file(uri, path, s3_client=s3_client, sha256=digest)
                entry = {"uri": uri, "shard": my_shard, "component": component, "size": size,
                         "sha256": digest, "update": int(update)}
                by_path[path] = entry
                objects.append(entry)
        if not objects:
            problem = "no files"
    except Exception as e:
        problem = f"rank {rank} could not describe its files: {e!r}"
    cursor = list((data_progress or {}).get("cursor") or []) if data_progress is not None else (
        recorder.cursor() if recorder is not None and hasattr(recorder, "cursor") else [])
    if problem is None and client is not None:
        client.shard_written(generation_id, my_shard, update, objects, rank=rank)
    try:
        if distributed:
            if not _all_agree(problem is None, group):
                problem = problem or "another rank failed: nothing published"
                log.warning("recoverydash: generation %s not published: %s", generation_id,
                            problem)
                return PublishResult(False, reason=problem)
            reports = _all_gather_json({"objects": objects, "cursor": cursor}, group)
        else:
            if problem is not None:
                log.warning("recoverydash: generation %s not published: %s", generation_id,
                            problem)
                return PublishResult(False, reason=problem)
            reports = [{"objects": objects, "cursor": cursor}]
    except Exception as e:
        log.warning("recoverydash: generation %s not published (a rank is gone?): %r",
                    generation_id, e)
        return PublishResult(False, reason=f"ranks could not agree: {e!r}")

    all_objects = [o for rep in reports for o in rep["objects"]]
    shards = list(dict.fromkeys(o["shard"] for o in all_objects))
    required = required_components_of(required_components, client)
    carried = {c for o in all_objects for c in o.get("components", [o["component"]])}
    if not distributed or rank == coordinator:
        say_missing_components(generation_id, required, carried)
    progress = dict(data_progress or {})
    progress["cursor"] = merge_cursors([rep.get("cursor") for rep in reports])
    manifest = {
        "schema_revision": 1, "generation_id": generation_id, "update": int(update),
        "world_size": int(world_size or 1), "required_shards": shards,
        "components": list(dict.fromkeys(components + sorted(carried - set(components)))),
        "objects": all_objects, "data_progress": progress,
        "dataset_version": dataset_version or getattr(recorder, "dataset_version", None)
        or "unknown",
        "committed_at": now_rfc3339(), "required_components": required,
    }
    if config_digest:
        manifest["config_digest"] = config_digest
    if client is not None:
        manifest["run_id"] = client.run_id
        manifest["attempt"] = client.attempt
    warnings = [f"required component {c!r} has no file" for c in required if c not in carried]
    result = PublishResult(False, manifest, warnings=warnings)
    is_coord = not distributed or rank == coordinator
    faults.save_point("before_commit", generation_id, update, rank, client=client,
                      coordinator=is_coord, every_rank=distributed, group=group)
    if is_coord:
        result = _commit_manifest(location, manifest, s3_client, warnings)
    if distributed:
        try:
            flags = _all_gather_json([result.published, result.already, result.reason], group)
            result.published, result.already, result.reason = flags[coordinator]
        except Exception as e:
            log.warning("recoverydash: could not learn whether %s was published: %r",
                        generation_id, e)
            return PublishResult(False, manifest, reason=f"unknown: {e!r}")
    if result.published and not result.already:
        # every rank knows the commit here: a drill's after_commit kills them all at one step
        faults.save_point("after_commit", generation_id, update, rank, client=client,
                          coordinator=is_coord, every_rank=distributed, group=group)
    if result.published and not result.already and client is not None and \
            result.manifest is not None and (not distributed or rank == coordinator):
        client.checkpoint_committed(result.manifest)
    return result


def _commit_manifest(location: str, manifest: dict, s3_client, warnings: list) -> PublishResult:
    """Write the manifest atomically; an identical committed one (same objects) is success."""
    gid = manifest["generation_id"]
    uri = storage.manifest_uri(location, gid)
    try:
        if storage.object_exists(uri, s3_client=s3_client):
            old = storage.read_manifest(uri, s3_client=s3_client)
            same = [(o.get("uri"), o.get("size"), o.get("sha256")) for o in old.get("objects")
                    or []] == [(o["uri"], o["size"], o["sha256"]) for o in manifest["objects"]]
            if same and old.get("update") == manifest["update"]:
                return PublishResult(True, old, already=True, warnings=warnings)
            reason = (f"a different manifest is already committed for {gid}: not overwritten "
                      "(use make_generation_id(update, attempt))")
            log.warning("recoverydash: %s", reason)
            return PublishResult(False, old, reason=reason, warnings=warnings)
        storage.write_manifest_atomically(location, manifest, s3_client=s3_client)
    except Exception as e:
        log.warning("recoverydash: manifest of %s not written: %r", gid, e)
        return PublishResult(False, manifest, reason=f"manifest not written: {e!r}",
                             warnings=warnings)
    return PublishResult(True, manifest, warnings=warnings)


def _check_reports(reports: list[dict], shards: list[str], components: list[str],
                   update: int) -> str | None:
    """Why the gathered reports cannot be published, or None."""
    present = {o["shard"] for rep in reports for o in rep["objects"]}
    missing = [s for s in shards if s not in present]
    if missing:
        return f"shards without objects: {missing}"
    carried = {o["component"] for rep in reports for o in rep["objects"]}
    lacking = [c for c in components if c not in carried]
    if lacking:
        return f"components without objects: {lacking}"
    updates = {rep["update"] for rep in reports}
    if updates != {update}:
        return f"ranks are at different updates: {sorted(updates)}"
    return None


# --- asking the server, falling back to storage ---------------------------------------------------

def restore_plan(url: str | None, token: str | None, run_id: str, *,
                 location: str | None = None, world_size: int | None = None,
                 dataset_version: str | None = None, config_digest: str | None = None,
                 timeout: float = 5.0, s3_client=None, spool_dir: str | bool | None = None,
                 wait_undecided_s: float = 0.0) -> dict:
    """Which generation to load: the server's answer (``GET /api/v1/runs/{run_id}/restore-plan``,
    docs/ingest-v1.md#restore-plan) when it answers within ``timeout`` seconds and knows enough,
    else ``select_restorable(location)`` (a storage check).

    First the run's spool (``<spool_dir>/<run_id>/``; None: ``default_spool_dir()``, False: none)
    is sent (``client.send_spool``, within half of ``timeout``): the events a killed attempt
    could not send, its last ``checkpoint_committed`` above all, reach the server before the
    question, which then gets what is left of ``timeout``. Storage decides instead of the server
    (``source: "storage"``), with a warning saying why, when:

    - the server answers 409 but lists a generation it has not decided (status ``committed`` or
      ``pending``: not verified yet, a worker behind, storage unverified): warning
      ``server_undecided``. The generations it did decide against (``rejected``, ``abandoned``,
      restorable only outside the live lineage) are never chosen from storage (``decided``);
    - the spool still holds a ``checkpoint_committed`` newer than the server's answer (another
      generation at the same update or above the one named, or, with a 409, one the server did
      not decide against), or files it could not read in time: warning ``spool_commit_unsent``.

    A 409 listing only decided generations is a fresh start from the server. When the spool
    could not be sent whole but holds no newer commit, the server's answer stands with the
    warning ``spool_unsent`` (how many events it has not heard of). When the server is down or
    errs: ``server_unreachable`` / ``server_error``, storage decides.

    A server's answer that lists newer generations not decided yet (its ``newer_undecided``,
    docs/definitions.md#newer-undecided: committed but not verified, or pending) keeps the
    server's choice and carries the warning ``newer_undecided`` naming them: resuming now redoes
    the updates after the named one should one of them prove restorable. With
    ``wait_undecided_s`` > 0 (default 0: no wait), while the answer lists a ``committed`` one
    (a ``pending`` one waits for a manifest that a dead attempt may never write), the question
    is asked again (after 0.5 s, doubling to 5 s) for at most that many seconds in all; the last
    answer taken stands (one that fails, or is not a plan, ends the wait and is not taken).

    Returns ``{"source": "server" | "storage" | "none", "generation_id": str | None,
    "update": int | None, "logger_rewind_update": int | None, "committed_at",
    "objects": [Object], "cursor": [Cursor], "warnings": [{"code", "detail"}],
    "rejected": [...], "attempt": int | None, "newer_undecided": [{"generation_id", "update",
    "status"}]}`` (the last only from the server, else empty); ``generation_id`` None means
    nothing is restorable (fresh start); ``logger_rewind_update`` is the update to rewind
    loggers to (docs/definitions.md#logger-rewind-update: W&B
    ``resume_from=f"{wandb_id}?_step={u}"``, TensorBoard ``purge_step=u + 1``), None on a fresh
    start; ``attempt`` is the attempt that wrote the generation (from its manifest), for
    ``init(..., restored=plan)``. Never raises: a restart must never wait for the dashboard:
    the server's part ends within ``timeout`` + ``wait_undecided_s`` seconds (the storage check
    itself is not bounded by them). Under a drill the answer is traced (``faults.on_plan``), so
    the drill report says what the resumed launch was told."""
    plan = _restore_plan(url, token, run_id, location=location, world_size=world_size,
                         dataset_version=dataset_version, config_digest=config_digest,
                         timeout=timeout, s3_client=s3_client, spool_dir=spool_dir,
                         wait_undecided_s=wait_undecided_s)
    plan.setdefault("newer_undecided", [])
    faults.on_plan(plan)
    return plan


@dataclass
class _Unsent:
    """What the spool still held after ``send_spool``: ``events`` not sent, the newest
    ``commit`` among them (``spool.newest_spooled_commit``) and ``unread`` files."""

    events: int
    commit: dict | None
    unread: int
    stopped: str

    def newer_than(self, generation_id: str | None, update: int | None,
                   decided: dict) -> str | None:
        """Why the spool may hold a commit newer than the server's answer (None: it does not).
        ``generation_id`` / ``update``: the generation the server named (None: a 409 whose
        decided rejections are ``decided``)."""
        if self.unread:
            return (f"{self.unread} spooled batch(es) could not be read within the timeout; "
                    "they may hold a newer commit")
        c = self.commit
        if c is None or c.get("generation_id") in decided:
            return None
        if generation_id is None:
            return (f"the spool holds the commit of {c.get('generation_id')} (update "
                    f"{c.get('update')}), which the server has not heard of")
        cu = c.get("update")
        if c.get("generation_id") != generation_id and cu is not None and update is not None \
                and cu >= update:
            return (f"the spool holds the commit of {c.get('generation_id')} (update {cu}), "
                    f"newer than the server's {generation_id} (update {update})")
        return None


def _send_spool_first(url, token, run_id, spool_dir, budget: float,
                      read_until: float) -> _Unsent | None:
    """Send the run's spool (``client.send_spool`` within ``budget`` seconds); when some of it
    is left, read the newest commit it holds (until ``read_until``, a ``time.monotonic()``).
    None when nothing is left unsent."""
    from recoverydash.sdk.resend import send_spool
    from recoverydash.sdk.spool import newest_spooled_commit

    sent = send_spool(url, token, run_id, spool_dir=spool_dir, timeout=budget)
    if not sent.left or not sent.folder:
        return None
    commit, unread = newest_spooled_commit(sent.folder, deadline=read_until)
    return _Unsent(sent.left, commit, unread, sent.stopped)


def _unsent_warning(unsent: _Unsent | None) -> list[dict]:
    if unsent is None:
        return []
    return [{"code": "spool_unsent",
             "detail": f"{unsent.events} spooled event(s) of this run are not on the server "
                       f"({unsent.stopped or 'not sent'}); none is a commit newer than its "
                       "answer"}]


def _malformed_plan(body) -> str | None:
    """What is wrong with a 2xx restore-plan answer (docs/ingest-v1.md#restore-plan: an object
    naming a generation by a non-empty string ``generation_id`` at an integer ``update`` >= 0,
    with ``objects``, ``cursor`` and ``warnings`` lists, each warning an object), or None when
    it has that shape. A malformed answer is not taken as the plan: storage decides."""
    if not isinstance(body, dict):
        return f"the answer is {type(body).__name__}, not an object"
    gid, update = body.get("generation_id"), body.get("update")
    if not isinstance(gid, str) or not gid:
        return f"generation_id is {gid!r}, not a generation's id"
    if not isinstance(update, int) or isinstance(update, bool) or update < 0:
        return f"update is {update!r}, not an update number"
    for key in ("objects", "cursor", "warnings"):
        if body.get(key) is not None and not isinstance(body[key], list):
            return f"{key} is {type(body[key]).__name__}, not a list"
    if any(not isinstance(w, dict) for w in body.get("warnings") or []):
        return "warnings holds an item that is not an object"
    return None


def _newer_undecided(body: dict) -> list[dict]:
    """The extension ``newer_undecided`` of a 200 plan (docs/ingest-v1.md#restore-plan): its
    entries naming a generation (non-empty string id) at an integer update above the plan's,
    with status ``committed`` or ``pending`` (the core's ``UNDECIDED``), in the order given, at
    most the core's ``NEWER_UNDECIDED_SHOWN`` (what a server sends). Missing (an older server)
    or malformed: ``[]``; an entry that is not one is dropped. Never a reason to refuse the
    plan."""
    from recoverydash.recovery.figures import NEWER_UNDECIDED_SHOWN, UNDECIDED

    items, named = body.get("newer_undecided"), body.get("update")
    if not isinstance(items, list):
        return []
    out = []
    for g in items:
        if not isinstance(g, dict):
            continue
        gid, update, status = g.get("generation_id"), g.get("update"), g.get("status")
        if isinstance(gid, str) and gid and isinstance(update, int) \
                and not isinstance(update, bool) and isinstance(named, int) and update > named \
                and status in UNDECIDED:
            out.append({"generation_id": gid, "update": update, "status": status})
    return out[:NEWER_UNDECIDED_SHOWN]


def _newer_warning(plan: dict, waited: float | None) -> dict:
    newer = plan["newer_undecided"]
    shown = ", ".join(f"{g['generation_id']} (update {g['update']}, {g['status']})"
                      for g in newer[:5]) + (f" and {len(newer) - 5} more" if len(newer) > 5
                                             else "")
    return {"code": "newer_undecided", "detail": (
        f"the server names {plan['generation_id']} (update {plan['update']}) while newer "
        f"generations are not decided yet: {shown}"
        + (f" (still so after waiting {waited:.1f} s)" if waited is not None else "")
        + f"; resuming now redoes the updates after {plan['update']} should one prove "
          "restorable")}


def _seconds(value) -> float:
    """``wait_undecided_s`` as seconds: a finite number > 0, else 0 (no wait; logged when it
    was something else than 0 or None)."""
    try:
        seconds = float(value or 0.0)
    except (TypeError, ValueError):
        seconds = float("nan")
    if seconds == seconds and 0.0 <= seconds < float("inf"):
        return seconds
    log.warning("recoverydash: wait_undecided_s=%r is not a number of seconds; not waiting",
                value)
    return 0.0


def _server_plan(body: dict, unsent, location, s3_client) -> dict:
    """The plan from a server's 200 ``body`` (checked by ``_malformed_plan``)."""
    from recoverydash.recovery.figures import logger_rewind_update

    return {"source": "server", "generation_id": body.get("generation_id"),
            "update": body.get("update"),
            "logger_rewind_update": body.get("logger_rewind_update",
                                             logger_rewind_update(body)),
            "committed_at": body.get("committed_at"),
            "objects": body.get("objects") or [],
            "cursor": body.get("cursor") or [],
            "warnings": (body.get("warnings") or []) + _unsent_warning(unsent),
            "rejected": [],
            "attempt": _manifest_attempt(location, body.get("generation_id"), s3_client),
            "newer_undecided": _newer_undecided(body)}


def _wait_for_undecided(plan: dict, req, unsent, location, s3_client, wait_s: float) -> dict:
    """Ask again (``req``) while ``plan`` lists a ``committed`` generation in
    ``newer_undecided``, for at most ``wait_s`` seconds in all; returns the last answer taken,
    with the warning ``newer_undecided`` when it still lists one. Never raises."""
    t0 = time.monotonic()
    deadline, pause, waited = t0 + wait_s, 0.5, None
    while wait_s > 0 and any(g["status"] == "committed" for g in plan["newer_undecided"]):
        left = deadline - time.monotonic()
        if left <= 0.05:
            break
        time.sleep(min(pause, left - 0.05))
        pause = min(pause * 2, 5.0)
        waited = time.monotonic() - t0
        try:
            status, body = fetch.get_json(req, max(0.05, deadline - time.monotonic()))
        except Exception as e:  # noqa: BLE001 - the answer already taken stands
            log.warning("recoverydash: asking the restore plan again failed: %r", e)
            break
        if not 200 <= status < 300 or _malformed_plan(body) or (
                unsent and unsent.newer_than(body.get("generation_id"), body.get("update"), {})):
            break
        plan = _server_plan(body, unsent, location, s3_client)
        waited = time.monotonic() - t0
    if plan["newer_undecided"]:
        plan["warnings"] = plan["warnings"] + [_newer_warning(plan, waited)]
    return plan


@dataclass
class _Asked:
    """What asking the server left for storage to decide with: ``warnings`` (why storage
    decides), ``decided`` (the generations the server decided against, ``{generation_id:
    [reason]}``) and ``unknown_run`` (the server has no such run: a first launch)."""

    warnings: list = field(default_factory=list)
    decided: dict = field(default_factory=dict)
    unknown_run: bool = False


def _fresh_start(source: str, warnings: list, rejected: list | None = None) -> dict:
    return {"source": source, "generation_id": None, "update": None,
            "logger_rewind_update": None, "committed_at": None, "objects": [], "cursor": [],
            "warnings": warnings, "rejected": rejected or [], "attempt": None}


def _restore_plan(url, token, run_id, *, location, world_size, dataset_version, config_digest,
                  timeout, s3_client, spool_dir, wait_undecided_s=0.0) -> dict:
    t0 = time.monotonic()
    asked = _Asked()
    if location:
        try:
            location = resolve_location(location)
        except StorageError:
            pass  # select_restorable says so below
    if url:
        query = {k: v for k, v in (("world_size", world_size), ("dataset_version", dataset_version),
                                   ("config_digest", config_digest)) if v is not None}
        plan = _ask_server(url, token, run_id, query, location, s3_client, spool_dir, timeout,
                           t0, wait_undecided_s, asked)
        if plan is not None:
            return plan
    if not location:
        if asked.unknown_run:  # the server has never heard of the run: a first launch
            return _fresh_start("server", [])
        return _fresh_start("none", asked.warnings + [
            {"code": "no_location", "detail": "no storage location to fall back to"}])
    return _storage_plan(location, world_size, dataset_version, s3_client, asked)


def _ask_server(url, token, run_id, query: dict, location, s3_client, spool_dir, timeout: float,
                t0: float, wait_undecided_s, asked: _Asked) -> dict | None:
    """The server's plan (its spool sent first), or None when storage decides (``asked`` then
    says why)."""
    unsent = None
    try:
        unsent = _send_spool_first(url, token, run_id, spool_dir, timeout / 2, t0 + 0.6 * timeout)
    except Exception as e:  # noqa: BLE001 - the question goes on without it
        log.warning("recoverydash: the spool was not sent before the restore plan: %r", e)
    endpoint = api_url(url, f"runs/{urllib.parse.quote(run_id, safe='')}/restore-plan") + (
        f"?{urllib.parse.urlencode(query)}" if query else "")
    req = urllib.request.Request(endpoint, headers={"Authorization": f"Bearer {token or ''}",
                                                    "Accept": "application/json"})
    try:
        # the whole answer within what is left of timeout
        status, body = fetch.get_json(req, max(0.05, t0 + timeout - time.monotonic()))
    except Exception as e:  # noqa: BLE001 - unreachable, too slow, too large, not JSON
        asked.warnings.append({"code": "server_unreachable", "detail": repr(e)[:300]})
        return None
    if status == 409:
        return _no_restorable(body, unsent, asked)
    if status == 404 and isinstance(body, dict) and body.get("error") == "not_found":
        asked.unknown_run = True  # docs/ingest-v1.md: no such run in the token's project
        return None
    if not 200 <= status < 300:
        asked.warnings.append({"code": "server_error", "detail": _refusal(status, body,
                                                                           endpoint)})
        return None
    malformed = _malformed_plan(body)
    body = body if isinstance(body, dict) else {}
    newer = None if malformed or not unsent else \
        unsent.newer_than(body.get("generation_id"), body.get("update"), {})
    if malformed:
        asked.warnings.append({"code": "server_malformed", "detail": malformed})
    elif newer:
        asked.warnings.append({"code": "spool_commit_unsent", "detail": newer})
    else:
        return _wait_for_undecided(_server_plan(body, unsent, location, s3_client), req, unsent,
                                   location, s3_client, _seconds(wait_undecided_s))
    return None


def _refusal(status: int, body, endpoint: str) -> str:
    """``server_error``'s detail: the status, and what it most likely means."""
    detail = f"restore-plan answered {status}"
    if status in (401, 403):
        return detail + (": the token is refused (no, an unknown or a revoked token)"
                         if status == 401 else ": the token lacks the read scope")
    if not isinstance(body, dict):  # a web server's page, not the API's JSON
        return detail + f" from {endpoint}, which is not the recoverydash API (its base URL?)"
    listed = body.get("errors")
    errors: list[Any] = listed if isinstance(listed, list) else []
    said = "; ".join(str(e.get("message"))[:200] for e in errors[:3] if isinstance(e, dict))
    return detail + (f": {said}" if said else "")


def _no_restorable(body, unsent, asked: _Asked) -> dict | None:
    """A 409 (``no_restorable_generation``): the server's fresh start, or None when storage
    decides (a generation the server has not decided, or a newer commit still spooled)."""
    from recoverydash.recovery.figures import UNDECIDED

    body = body if isinstance(body, dict) else {}
    listed = body.get("rejected") or []
    undecided = [g for g in listed if isinstance(g, dict) and g.get("status") in UNDECIDED]
    asked.decided = {g["generation_id"]: [r for r in g.get("reasons") or []
                                          if isinstance(r, dict)]
                     for g in listed if isinstance(g, dict)
                     and isinstance(g.get("generation_id"), str)
                     and g.get("status") not in UNDECIDED}
    newer = unsent.newer_than(None, None, asked.decided) if unsent else None
    if undecided:
        asked.warnings.append({"code": "server_undecided", "detail": (
            "the server found no restorable generation but has not decided "
            + ", ".join(f"{g.get('generation_id')} ({g.get('status')})" for g in undecided[:10])
            + (f" and {len(undecided) - 10} more" if len(undecided) > 10 else "")
            + "; storage decides")})
        return None
    if newer:
        asked.warnings.append({"code": "spool_commit_unsent", "detail": newer})
        return None
    return _fresh_start("server", _unsent_warning(unsent), listed)


def _storage_plan(location: str, world_size, dataset_version, s3_client, asked: _Asked) -> dict:
    """Storage decides (``select_restorable``), never choosing what the server decided against.
    For a run the server does not know, a storage holding no generation is a plain fresh start;
    one holding some is said (``server_unknown_run``)."""
    from recoverydash.recovery.figures import logger_rewind_update

    try:
        sel = select_restorable(location, world_size=world_size,
                                dataset_version=dataset_version, s3_client=s3_client,
                                decided=asked.decided)
    except Exception as e:  # noqa: BLE001 - said in the plan
        return _fresh_start("storage", asked.warnings + [{"code": "storage_error",
                                                          "detail": repr(e)[:300]}])
    warnings = asked.warnings
    if asked.unknown_run and sel.generations:
        warnings = warnings + [{"code": "server_unknown_run", "detail": (
            f"the server has no such run (its events never reached it, or it is another "
            f"server), while storage holds {len(sel.generations)} generation(s); storage "
            "decides")}]
    m = sel.manifest or {}
    return {"source": "storage", "generation_id": sel.generation_id, "update": sel.update,
            "logger_rewind_update": logger_rewind_update(sel) if sel.generation_id else None,
            "committed_at": m.get("committed_at"), "objects": m.get("objects") or [],
            "cursor": sel.cursor, "warnings": warnings,
            "rejected": [{"generation_id": g.generation_id, "reasons": g.reasons}
                         for g in sel.rejected],
            "attempt": m.get("attempt") if isinstance(m.get("attempt"), int) else None}


def _manifest_attempt(location: str | None, generation_id: str | None, s3_client) -> int | None:
    """The ``attempt`` recorded in a generation's manifest at ``location`` (None when unknown)."""
    if not location or not generation_id:
        return None
    try:
        m = storage.read_manifest(storage.manifest_uri(location, generation_id),
                                  s3_client=s3_client)
    except Exception:
        return None
    a = m.get("attempt")
    return a if isinstance(a, int) and not isinstance(a, bool) else None


# --- loading ----------------------------------------------------------------------------------------

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
                    full_hash_max_bytes: int = DEFAULT_FULL_HASH_MAX_BYTES,
                    fallback: bool = True) -> Restored:
    """Load a generation written by ``save_generation`` (every rank calls it), or, when it
    fails, the next restorable one.

    location: a folder or an ``s3://bucket/prefix``. Before anything reaches DCP, every object of
    the generation's manifest is checked against it: on a folder, the file under the generation
    folder (size, and sha256 where the manifest has one, for objects of at most
    ``full_hash_max_bytes``; the objects are split between the ranks and the results agreed); from
    S3, each rank downloads into a local staging folder (a fresh temporary folder, under
    ``staging_dir`` when given, removed afterwards) every object of the DCP components in
    ``state`` and its own (or rank 0's) per-rank files, checking each download's size and sha256.

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
    _, rank, world = _dist_info(group)
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
                   full_hash_max_bytes: int, unplaced: dict[str, list[str]]
                   ) -> tuple[dict | None, str | None, str]:
    """Check one candidate's objects (a folder location: where DCP reads them, split between
    the ranks), then load it; every rank learns every rank's problems. Returns ``(this rank's
    per-rank values, None, "")``, or ``(None, reason, message)`` with reason
    ``object_damaged`` or ``load_error`` (DCP may have written into ``state``)."""
    if not _is_s3(location):
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
    if not _is_s3(location):
        return _load_dir(os.path.join(_local_path(location), generation_id), state, rank, group,
                         unplaced)
    if s3_client is None:
        s3_client = storage.make_s3_client()
    staged = _staging(staging_dir, generation_id, rank, "load")
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
                    world: int, full_hash_max_bytes: int) -> list[str]:
    """What is wrong with this rank's share (every ``world``-th object) of a folder generation's
    objects, checked where ``load_generation`` reads them: under ``<location>/<generation_id>``
    (an object URI relative to the generation folder, absolute under the manifest's
    ``base_uri`` or ``<location>/<generation_id>``, or absolute with a ``/<generation_id>/`` in
    it, as in a moved or copied folder, is looked up there: those are the files DCP reads;
    another absolute URI is checked as it stands). One line per failing object."""
    if manifest is None:
        return [f"no readable manifest for {generation_id} under {location}"] if rank == 0 else []
    folder = os.path.join(_local_path(location), generation_id)
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
    dist_on, _, world = _dist_info(group)
    if not dist_on or world == 1:
        return list(mine)
    return [line for lines in _all_gather_json(list(mine), group) for line in lines]


def _next_candidate(location: str, failed: dict | None, tried: set, world: int, s3_client,
                    group) -> str | None:
    """The newest generation storage finds restorable at or below ``failed``'s update and not
    tried yet (rank 0 decides; every rank gets its answer), or None."""
    dist_on, rank, _ = _dist_info(group)
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
        chosen = _all_gather_json(chosen, group)[0]
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
    """Load a generation from a local folder: DCP components in place, per-rank files returned;
    what a saved component holds that its given state dict has no place for goes to
    ``unplaced``."""
    import torch
    import torch.distributed.checkpoint as dcp

    for component, sd in state.items():
        folder = os.path.join(gen_dir, component)
        dcp.load({component: sd}, checkpoint_id=folder, process_group=group)
        if unplaced is not None:
            left = _unplaced_keys(folder, component, sd)
            if left:
                unplaced[component] = left
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
                    out[component] = torch.load(path, weights_only=False)
                break
    return out
