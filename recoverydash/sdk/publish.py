"""Publishing a checkpoint generation: ``save_generation`` (a DCP save the SDK writes) and
``publish_files`` (files a framework wrote), each composed of the same named steps.

1. **prepare**: where (the location resolved, S3 or a folder), who (this rank, the world, the
   coordinator) and what (components, the contract's required ones: a missing one is said at
   the first save);
2. **announce**: ``checkpoint_started`` from the coordinator, a drill's first crash point;
3. **write** (``save_generation``) or **describe** (``publish_files``): each rank's objects with
   their size and sha256. A DCP save is hashed while it is written (``recoverydash.sdk.hashing``:
   the digest of the bytes as they went to storage, no second read); files a framework wrote
   are read once. On S3 each object goes up with its full-object checksum, recorded in the
   object's ``checksums`` beside its ``sha256`` (docs/ingest-v1.md#objects);
4. **report**: ``shard_written``, then every rank agrees (a rank that failed makes every rank
   publish nothing) and the coordinator gathers every rank's objects and cursor;
5. **commit**: the manifest, checked (every required shard and component, one update), written
   atomically by the coordinator (the commit marker), every rank told whether it was, then
   ``checkpoint_committed``.

``SaveOptions`` and ``FilesOptions`` hold everything but the generation itself; every field is
also a keyword of the function (``save_generation(loc, gen, u, state=..., recorder=rec)``).
Nothing here raises into the training loop: a failure is logged and nothing is published (the
previous generation stays the fallback).
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import logging
import os
import random
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from recoverydash.checkpoints import objects as storage
from recoverydash.checkpoints.objects import StorageError, resolve_location
from recoverydash.checkpoints.selection import DEFAULT_REQUIRED_COMPONENTS
from recoverydash.sdk import faults
from recoverydash.sdk.client import Client, now_rfc3339
from recoverydash.sdk.collective import all_agree, all_gather_json, dist_info
from recoverydash.sdk.guard import ONCE, log
from recoverydash.sdk.hashing import Digest, digest_bytes, hashing_writer, read_digest, written


def shard_name(rank: int) -> str:
    """The shard a rank writes: ``rank<r>``."""
    return f"rank{rank}"


def make_generation_id(update: int, attempt: int) -> str:
    """A generation id unique in the run and sorting by update: ``u<update:09d>-a<attempt>``.

    The attempt is part of it because a resumed attempt reaches the same update again and must
    never write into the folder of the older attempt's (possibly half-written) generation."""
    return f"u{int(update):09d}-a{int(attempt)}"


def merge_cursors(cursors: Iterable[Any]) -> list[dict[str, Any]]:
    """The lineage's frontier from every rank's committed cursor: per stratum the highest
    ``(epoch, position)`` over ranks (each rank knows only the positions it consumed; the
    frontier is the position after the highest one any rank committed). Sorted by stratum."""
    best: dict[Any, tuple[int, int]] = {}
    for cs in cursors:
        for c in cs or []:
            if not isinstance(c, dict) or "stratum" not in c:
                continue
            key = (int(c.get("epoch", 0)), int(c.get("position", 0)))
            if c["stratum"] not in best or key > best[c["stratum"]]:
                best[c["stratum"]] = key
    return [{"stratum": st, "epoch": e, "position": p} for st, (e, p) in sorted(best.items())]


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


def say_missing_components(generation_id: str, required: list[str],
                           held: Iterable[str]) -> list[str]:
    """Warn, once per process and set of components, that a generation holds none of some
    components the contract requires (the server rejects it ``component_missing``, and a restart
    cannot resume from it), naming the contract setting that says a trainer has no scheduler.
    Returns the missing components."""
    have = set(held)
    missing = [c for c in required if c not in have]
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


# --- options --------------------------------------------------------------------------------------

@dataclass
class PublishOptions:
    """What both ``save_generation`` and ``publish_files`` take besides the generation.

    client: the sender of the checkpoint events (default ``recorder.client``). recorder: the
    ledger recorder, whose committed cursor becomes the manifest's ``data_progress``.
    dataset_version: the manifest's (default the recorder's, else ``"unknown"``).
    config_digest: the trainer's identity, written into the manifest when given.
    required_components: the contract's list (default: the client's declared contract's, else
    model, optimizer, scheduler, rng, data_progress). group: the ``torch.distributed`` process
    group. coordinator: the rank that commits. s3_client: a boto3 client for an ``s3://``
    location (default ``make_s3_client()`` from the environment)."""

    client: Client | None = None
    recorder: Any = None
    dataset_version: str | None = None
    config_digest: str | None = None
    required_components: list[str] | None = None
    group: Any = None
    coordinator: int = 0
    s3_client: Any = None


@dataclass
class SaveOptions(PublishOptions):
    """``save_generation``'s: capture_rng (also save the ``rng`` component), staging_dir (on S3,
    where each rank's local copy is written before its upload; default a temporary folder)."""

    capture_rng: bool = True
    staging_dir: str | None = None


@dataclass
class FilesOptions(PublishOptions):
    """``publish_files``'s: data_progress (the manifest's; default ``{"cursor":
    recorder.cursor()}``), world_size (default the torch.distributed world size, else the
    recorder's, else 1), collective (every rank calls it with the files it wrote), shard (the
    caller's shard when not collective, default ``rank<r>``), announced (the caller sent
    ``checkpoint_started`` when the save began)."""

    data_progress: dict[str, Any] | None = None
    world_size: int | None = None
    collective: bool = False
    shard: str | None = None
    announced: bool = False


@dataclass
class PublishResult:
    """What ``publish_files`` did: ``published`` (the manifest is committed), ``manifest`` (the
    document, also when an identical one was already there: ``already`` True), ``reason`` (why
    nothing was published), ``warnings`` (published, but the server will say more: a required
    component without files). ``bool(result)`` is ``published``."""

    published: bool
    manifest: dict[str, Any] | None = None
    reason: str | None = None
    already: bool = False
    warnings: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.published


# --- 1. prepare -----------------------------------------------------------------------------------

@dataclass
class _Generation:
    """One generation being published, as this rank sees it."""

    location: str
    generation_id: str
    update: int
    options: PublishOptions
    client: Client | None
    distributed: bool
    rank: int
    world: int
    shard: str
    on_s3: bool
    s3_client: Any

    @property
    def is_coord(self) -> bool:
        return not self.distributed or self.rank == self.options.coordinator

    @property
    def uri(self) -> str:
        return storage.join_uri(self.location, self.generation_id)

    def point(self, name: str, **kw: Any) -> None:
        """A drill's crash point (``recoverydash.sdk.faults``)."""
        faults.save_point(name, self.generation_id, self.update, self.rank, client=self.client,
                          coordinator=self.is_coord, **kw)

    def object(self, uri: str, component: str, digest: Digest,
               checksums: dict[str, str] | None = None) -> dict[str, Any]:
        """A manifest object of this rank's shard."""
        entry: dict[str, Any] = {"uri": uri, "shard": self.shard, "component": component,
                                 "size": digest.size, "sha256": digest.sha256,
                                 "update": self.update}
        if checksums:
            entry["checksums"] = checksums
        return entry


def _prepare(location: str, generation_id: str, update: int, o: PublishOptions, *,
             collective: bool = True, shard: str | None = None) -> _Generation:
    """Where, who and how; raises on a location that cannot be resolved."""
    location = resolve_location(location)
    distributed, rank, world = dist_info(o.group)
    on_s3 = storage.parse_uri(location).scheme == "s3"
    s3_client = o.s3_client if o.s3_client is not None or not on_s3 else storage.make_s3_client()
    return _Generation(location, generation_id, int(update), o,
                       o.client or getattr(o.recorder, "client", None),
                       distributed and collective, rank, world, shard or shard_name(rank),
                       on_s3, s3_client)


# --- 3. write and describe ------------------------------------------------------------------------

def _sha256_b64(sha256: str) -> str:
    return base64.b64encode(bytes.fromhex(sha256)).decode()


def _store_file(gen: _Generation, path: str, component: str, digest: Digest | None,
                name: str | None = None) -> dict[str, Any]:
    """The manifest object of a local file: its digest (``digest`` from the write; None: read
    now), and on S3 its upload to ``<generation>/<component>/<name>`` with that checksum."""
    if digest is None:
        digest = read_digest(path)
    if not gen.on_s3:
        return gen.object(storage.file_uri(path), component, digest)
    uri = storage.join_uri(gen.uri, component, name or os.path.basename(path))
    uploaded = storage.upload_file(uri, path, s3_client=gen.s3_client, sha256=digest.sha256,
                                   crc32=digest.crc32 or None)
    return gen.object(uri, component, digest, _checksums_sent(uploaded, digest))


def _checksums_sent(uploaded: Any, digest: Digest) -> dict[str, str]:
    """The full-object checksums an upload declared (S3 checked the bytes against them and
    stores them): what ``upload_file`` reports (a multipart upload's CRC32), else the
    ``ChecksumSHA256`` of its single PUT."""
    sent = getattr(uploaded, "checksums", None)
    if isinstance(sent, dict) and sent:
        return {str(k).lower(): str(v) for k, v in sent.items()}
    return {"sha256": _sha256_b64(digest.sha256)}


def _put_bytes(gen: _Generation, component: str, name: str, data: bytes) -> dict[str, Any]:
    """A small per-rank file (held in memory): written to storage, described from the bytes."""
    uri = storage.join_uri(gen.uri, component, name)
    digest = digest_bytes(data)
    storage.put_object(uri, data, s3_client=gen.s3_client)
    if not gen.on_s3:
        gen.point("during_shard", files=[storage.parse_uri(uri).path])
        return gen.object(uri, component, digest)
    return gen.object(uri, component, digest, {"sha256": _sha256_b64(digest.sha256)})


def _own_dcp_files(folder: str, rank: int, coordinator: bool) -> list[str]:
    """Files DCP wrote for this rank in one component folder: ``__<rank>_*.distcp`` (and the
    ``.metadata`` when this rank is the coordinator)."""
    out = []
    for name in sorted(os.listdir(folder)):
        mine = name.startswith(f"__{rank}_") and name.endswith(".distcp")
        if mine or (coordinator and name == ".metadata"):
            out.append(name)
    return out


def _write_dcp(gen: _Generation, gen_dir: str, component: str, sd: Any,
               describe: bool = True) -> list[dict[str, Any]]:
    """One DCP component, ``dcp.save({component: sd})`` into its own folder (a collective: every
    rank calls it, ``describe`` or not), hashed as it is written; with ``describe`` this rank's
    files described (and uploaded, on S3)."""
    import torch.distributed.checkpoint as dcp

    folder = os.path.join(gen_dir, component)
    writer = hashing_writer(folder, crc32=gen.on_s3)  # a CRC32 only for an S3 upload
    dcp.save({component: sd}, storage_writer=writer, process_group=gen.options.group)
    if not describe:
        return []
    mine = [os.path.join(folder, n) for n in _own_dcp_files(folder, gen.rank, gen.is_coord)]
    objects = [_store_file(gen, path, component, written(writer, path)) for path in mine]
    if not gen.on_s3:
        gen.point("during_shard", files=[p for p in mine if not p.endswith(".metadata")])
    return objects


def _rng_state() -> bytes:
    import torch

    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def _progress_file(shard: str, progress: dict[str, Any]) -> tuple[str, bytes]:
    """This rank's data progress file: ``rank<r>.json``, or ``rank<r>.pt`` (torch.save) when the
    state is not JSON (a loader state holding tensors)."""
    try:
        return f"{shard}.json", json.dumps(progress, sort_keys=True).encode()
    except (TypeError, ValueError):
        import torch

        buf = io.BytesIO()
        torch.save(progress, buf)
        return f"{shard}.pt", buf.getvalue()


def _small_files(gen: _Generation, rank_state: dict[str, Any], capture_rng: bool,
                 progress: dict[str, Any]) -> dict[str, tuple[str, bytes]]:
    """This rank's per-rank components: ``torch.save`` of each ``rank_state`` value, the RNG
    states, the data progress."""
    import torch

    files: dict[str, tuple[str, bytes]] = {}
    for component, value in rank_state.items():
        buf = io.BytesIO()
        torch.save(value, buf)
        files[component] = (f"{gen.shard}.pt", buf.getvalue())
    if capture_rng:
        files["rng"] = (f"{gen.shard}.pt", _rng_state())
    files["data_progress"] = _progress_file(gen.shard, progress)
    return files


def staging_folder(staging_dir: str | None, generation_id: str, rank: int, what: str) -> str:
    """A fresh local folder for one rank's copy of a generation on S3 (removed by the caller)."""
    if staging_dir:
        os.makedirs(staging_dir, exist_ok=True)
    return tempfile.mkdtemp(prefix=f"recoverydash-{what}-{generation_id}-rank{rank}-",
                            dir=staging_dir)


def location_path(location: str) -> str:
    """The folder of a ``file://`` location; StorageError for another scheme."""
    p = storage.parse_uri(location)
    if p.scheme != "file":
        raise StorageError(f"not a filesystem location: {location!r}")
    return p.path


def _write_shard(gen: _Generation, o: SaveOptions, state: dict[str, Any],
                 rank_state: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
    """Write this rank's share: ``(objects, data progress)``, or None when it failed (logged)."""
    staged = None
    if gen.on_s3:
        staged = staging_folder(o.staging_dir, gen.generation_id, gen.rank, "save")
    try:
        gen_dir = staged or os.path.join(location_path(gen.location), gen.generation_id)
        objects: list[dict[str, Any]] = []
        failed: Exception | None = None
        for component, sd in state.items():
            try:
                objects += _write_dcp(gen, gen_dir, component, sd, describe=failed is None)
            except Exception as e:  # noqa: BLE001 - this rank only: its next dcp.save runs,
                failed = e             # every rank reaches the vote at the same collective
        if failed is not None:
            raise failed
        recorder = o.recorder
        progress = {**(recorder.state_dict() if recorder is not None else {"cursor": []}),
                    "update": gen.update}
        for component, (name, data) in _small_files(gen, rank_state, o.capture_rng,
                                                     progress).items():
            objects.append(_put_bytes(gen, component, name, data))
        return objects, progress
    except Exception as e:  # noqa: BLE001 - this rank votes no; nothing is published
        log.warning("recoverydash: rank %d could not save generation %s: %r", gen.rank,
                    gen.generation_id, e)
        return None
    finally:
        if staged is not None:
            shutil.rmtree(staged, ignore_errors=True)


def _expand(paths: Any) -> list[str]:
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


def _describe_files(gen: _Generation, files: dict[str, Any]) -> tuple[list[dict[str, Any]],
                                                                      str | None]:
    """The objects of a trainer's own files (each read once; uploaded on S3). A file named under
    several components is listed once, ``components`` naming them all. Returns ``(objects,
    problem or None)``."""
    try:
        by_path: dict[str, dict[str, Any]] = {}
        objects: list[dict[str, Any]] = []
        for component, paths in files.items():
            for path in _expand(paths):
                entry = by_path.get(path)
                if entry is not None:
                    entry.setdefault("components", [entry["component"]]).append(component)
                    continue
                by_path[path] = entry = _store_file(gen, path, component, None)
                objects.append(entry)
        return objects, None if objects else "no files"
    except Exception as e:  # noqa: BLE001 - said in the result
        return [], f"rank {gen.rank} could not describe its files: {e!r}"


def _tear_for_drill(gen: _Generation, files: dict[str, Any]) -> None:
    """A drill's torn write (``during_shard``): the largest of this rank's files (the framework's
    own, written already) is the one truncated."""
    if faults.active_fault() is None:
        return
    try:
        mine = sorted({p for paths in files.values() for p in _expand(paths)},
                      key=lambda p: (-os.path.getsize(p), p))
    except Exception:  # noqa: BLE001 - a drill hook never stops a publication
        mine = []
    gen.point("during_shard", files=mine)


# --- 4. report ------------------------------------------------------------------------------------

def _gathered(gen: _Generation, mine: dict[str, Any] | None,
              problem: str | None) -> tuple[list[dict[str, Any]] | None, str | None]:
    """Every rank agrees on success (an all_reduce), then the reports are gathered: ``(reports,
    None)``, or ``(None, why)`` when this or another rank failed or a rank is gone (logged)."""
    try:
        if gen.distributed:
            if not all_agree(mine is not None, gen.options.group):
                why = problem or "another rank failed: nothing published"
                log.warning("recoverydash: generation %s not published: %s",
                            gen.generation_id, why)
                return None, why
            return all_gather_json(mine, gen.options.group), None
    except Exception as e:  # noqa: BLE001 - a rank died under a collective
        log.warning("recoverydash: generation %s not published (a rank is gone?): %r",
                    gen.generation_id, e)
        return None, f"ranks could not agree: {e!r}"
    if mine is None:
        log.warning("recoverydash: generation %s not published: %s", gen.generation_id,
                    problem or "this rank failed")
        return None, problem or "this rank failed"
    return [mine], None


def _check_reports(reports: list[dict[str, Any]], shards: list[str], components: list[str],
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


# --- 5. commit ------------------------------------------------------------------------------------

def _manifest(gen: _Generation, world_size: int, shards: list[str], components: list[str],
              objects: list[dict[str, Any]], progress: dict[str, Any],
              required: list[str]) -> dict[str, Any]:
    """The manifest document (docs/ingest-v1.md#checkpoint_committed)."""
    o = gen.options
    manifest: dict[str, Any] = {
        "schema_revision": 1, "generation_id": gen.generation_id, "update": gen.update,
        "world_size": int(world_size or 1), "required_shards": shards, "components": components,
        "objects": objects, "data_progress": progress,
        "dataset_version": o.dataset_version or getattr(o.recorder, "dataset_version", None)
        or "unknown",
        "committed_at": now_rfc3339(), "required_components": required,
    }
    if o.config_digest:
        manifest["config_digest"] = o.config_digest
    if gen.client is not None:
        manifest["run_id"] = gen.client.run_id
        manifest["attempt"] = gen.client.attempt
    return manifest


def _told(gen: _Generation, value: Any) -> tuple[str | None, Any]:
    """The coordinator's ``value`` on every rank: ``(None, value)``, or ``(error, None)`` when
    the collective failed (logged)."""
    if not gen.distributed:
        return None, value
    try:
        return None, all_gather_json(value, gen.options.group)[gen.options.coordinator]
    except Exception as e:  # noqa: BLE001 - a rank is gone
        log.warning("recoverydash: could not learn whether %s was published: %r",
                    gen.generation_id, e)
        return repr(e), None


def _committed(gen: _Generation, manifest: dict[str, Any], every_rank: bool) -> None:
    """After the commit: the drill's last crash point (every rank knows the commit here, so it
    kills them all at one step), then ``checkpoint_committed`` from the coordinator."""
    gen.point("after_commit", every_rank=every_rank, group=gen.options.group)
    if gen.is_coord and gen.client is not None:
        gen.client.checkpoint_committed(manifest)


def _commit_manifest(location: str, manifest: dict[str, Any], s3_client: Any,
                     warnings: list[str]) -> PublishResult:
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
    except Exception as e:  # noqa: BLE001 - said in the result
        log.warning("recoverydash: manifest of %s not written: %r", gid, e)
        return PublishResult(False, manifest, reason=f"manifest not written: {e!r}",
                             warnings=warnings)
    return PublishResult(True, manifest, warnings=warnings)


# --- save_generation ------------------------------------------------------------------------------

def _not_published_yet(gen: _Generation) -> bool:
    """Never write into a published generation: its files are someone's restore point. Every
    rank agrees."""
    try:
        taken = gen.is_coord and storage.object_exists(
            storage.manifest_uri(gen.location, gen.generation_id), s3_client=gen.s3_client)
        free = all_agree(not taken, gen.options.group) if gen.distributed else not taken
    except Exception as e:  # noqa: BLE001 - not saved; training goes on
        log.warning("recoverydash: generation %s not saved: %r", gen.generation_id, e)
        return False
    if not free:
        log.warning("recoverydash: generation %s is already published; not saving over it "
                    "(use make_generation_id(update, attempt))", gen.generation_id)
    return free


def save_generation(location: str, generation_id: str, update: int, *,
                    state: dict[str, Any], rank_state: dict[str, Any] | None = None,
                    options: SaveOptions | None = None, **kw: Any) -> dict[str, Any] | None:
    """Save and publish one generation; every rank calls it (a collective).

    location: a folder (``/ckpt`` or ``file:///ckpt``; a relative folder is resolved against the
    working directory) or an S3 prefix (``s3://bucket/prefix``: each rank lets DCP write into a
    local staging folder, uploads each file with its full-object checksum and reports the
    ``s3://`` URIs; the manifest is then one conditional PUT). generation_id: unique in the run,
    no ``/`` (``make_generation_id``). update: optimizer updates completed that this state
    represents (the same on every rank). state: DCP components, e.g. ``{"model": model_sd,
    "optimizer": optim_sd}``, each saved with ``dcp.save`` into its own folder and hashed as it
    is written (use ``torch.distributed.checkpoint.state_dict.get_state_dict`` for sharded
    models). rank_state: small per-rank components, e.g. ``{"scheduler":
    scheduler.state_dict()}`` (``torch.save`` per rank). options / keywords: ``SaveOptions``
    (``recorder``, ``client``, ``dataset_version``, ``required_components``, ``capture_rng``,
    ``group``, ``coordinator``, ``s3_client``, ``staging_dir``...).

    The manifest's ``data_progress.cursor`` is the maximum over ranks of their recorders'
    committed cursors (``merge_cursors``); this rank's ``data_progress`` file is its recorder's
    ``state_dict()``. A component the contract requires that the save does not hold is said in
    a warning at the first save (the server rejects such a generation ``component_missing``).

    Returns the published manifest on every rank, or None when nothing was published (a failure
    on any rank, a rank that died, a mismatch of update across ranks, an existing manifest).
    Never raises: training goes on and the previous generation stays the fallback."""
    o = dataclasses.replace(options or SaveOptions(), **kw)
    try:
        gen = _prepare(location, generation_id, update, o)
    except Exception as e:  # noqa: BLE001 - nothing published
        log.warning("recoverydash: checkpoint %s not published: %r", generation_id, e)
        return None
    rank_state = dict(rank_state or {})
    components = list(dict.fromkeys(list(state) + list(rank_state)
                                    + (["rng"] if o.capture_rng else []) + ["data_progress"]))
    required = required_components_of(o.required_components, gen.client)
    if gen.is_coord:
        say_missing_components(generation_id, required, components)
    shards = [shard_name(r) for r in range(gen.world)]
    if gen.is_coord and gen.client is not None:
        gen.client.checkpoint_started(generation_id, gen.update, shards, components)
    gen.point("before_shards", every_rank=True, group=o.group)
    if not _not_published_yet(gen):
        return None
    written_ = _write_shard(gen, o, state, rank_state)
    if written_ is not None and gen.client is not None:
        gen.client.shard_written(generation_id, gen.shard, gen.update, written_[0],
                                 rank=gen.rank)
    mine = None if written_ is None else {"rank": gen.rank, "update": gen.update,
                                          "objects": written_[0],
                                          "cursor": written_[1].get("cursor")}
    reports, _ = _gathered(gen, mine, None)
    if reports is None:
        return None
    problem = _check_reports(reports, shards, components, gen.update)
    if problem:
        log.warning("recoverydash: generation %s not published: %s", generation_id, problem)
        return None
    progress = written_[1] if written_ is not None else {}
    data_progress: dict[str, Any] = {"cursor": merge_cursors(r.get("cursor") for r in reports)}
    if "samples_committed" in progress:
        data_progress["samples_committed"] = progress["samples_committed"]
    manifest = _manifest(gen, gen.world, shards, components,
                         [obj for r in reports for obj in r["objects"]], data_progress, required)
    return _commit_saved(gen, manifest)


def _commit_saved(gen: _Generation, manifest: dict[str, Any]) -> dict[str, Any] | None:
    """The coordinator writes the manifest (the commit); every rank learns whether it did."""
    gen.point("before_commit", every_rank=True, group=gen.options.group)
    published = False
    if gen.is_coord:
        try:
            storage.write_manifest_atomically(gen.location, manifest, s3_client=gen.s3_client)
            published = True
        except Exception as e:  # noqa: BLE001 - not published
            log.warning("recoverydash: manifest of %s not written: %r", gen.generation_id, e)
    error, told = _told(gen, manifest if published else None)
    if error is not None or told is None:
        return None
    _committed(gen, told, every_rank=True)
    return told


# --- publish_files --------------------------------------------------------------------------------

def publish_files(location: str, generation_id: str, update: int, files: dict[str, Any], *,
                  options: FilesOptions | None = None, **kw: Any) -> PublishResult:
    """Publish a generation made of files a trainer wrote itself (HF Trainer's ``checkpoint-N/``,
    Lightning's ``.ckpt``, your own ``torch.save``): every file is sized and sha256-hashed (read
    once), and the manifest is committed atomically at
    ``<location>/<generation_id>/recoverydash-manifest.json``, as ``save_generation`` does.

    files: ``{component: path or [paths]}``; a folder stands for every file below it. One file
    may hold several components (a Lightning ``.ckpt``): name it under each; the manifest then
    lists the object once with ``components`` naming them all. On a folder location the files
    stay where they are (object URIs are their absolute ``file://`` URIs); on an S3 location each
    file is uploaded to ``<location>/<generation_id>/<component>/<name>`` with its full-object
    checksum. update: optimizer updates the files' state represents. options / keywords:
    ``FilesOptions`` (``client``, ``recorder``, ``data_progress``, ``dataset_version``,
    ``world_size``, ``required_components``, ``collective``, ``shard``, ``announced``...):
    collective, every rank calls it with the files it wrote (shard ``rank<r>``) and the
    coordinator publishes only when every rank succeeded, with the cursor merged over ranks;
    otherwise the caller's files are one shard and the only required one. A required component
    without files is published as it is (the server rejects it ``component_missing``), said in
    a warning at the first save and named in ``warnings``.

    A manifest already committed for ``generation_id`` with the same objects (a re-save of the
    same update on resume) is not an error: ``already`` is True. A different one is never
    overwritten: ``reason`` says so. Never raises: failures are logged and returned.

    Failure drills (``recoverydash.sdk.faults``): ``during_shard`` (the largest of this rank's
    files truncated to half, before any is described), ``before_commit`` (files described and
    ``shard_written`` sent, no manifest) and ``after_commit`` (manifest committed,
    ``checkpoint_committed`` not sent). ``before_shards`` belongs to the integration."""
    o = dataclasses.replace(options or FilesOptions(), **kw)
    try:
        gen = _prepare(location, generation_id, update, o, collective=o.collective,
                       shard=o.shard)
        world_size = o.world_size
        if world_size is None:
            world_size = gen.world if dist_info(o.group)[0] else \
                getattr(o.recorder, "world_size", 1)
        components = list(files)
        if gen.client is not None and not o.announced and gen.is_coord:
            shards = [shard_name(r) for r in range(gen.world)] if gen.distributed \
                else [gen.shard]
            gen.client.checkpoint_started(generation_id, gen.update, shards, components)
    except Exception as e:  # noqa: BLE001 - said in the result
        log.warning("recoverydash: generation %s not published: %r", generation_id, e)
        return PublishResult(False, reason=f"bad arguments: {e!r}")
    _tear_for_drill(gen, files)
    objects, problem = _describe_files(gen, files)
    cursor = _cursor_of(o)
    if problem is None and gen.client is not None:
        gen.client.shard_written(generation_id, gen.shard, gen.update, objects, rank=gen.rank)
    mine = None if problem is not None else {"objects": objects, "cursor": cursor}
    reports, why = _gathered(gen, mine, problem)
    if reports is None:
        return PublishResult(False, reason=why)
    return _commit_files(gen, int(world_size or 1), components, reports)


def _cursor_of(o: FilesOptions) -> list[Any]:
    if o.data_progress is not None:
        return list(o.data_progress.get("cursor") or [])
    recorder = o.recorder
    return list(recorder.cursor()) if recorder is not None and hasattr(recorder, "cursor") \
        else []


def _commit_files(gen: _Generation, world_size: int, components: list[str],
                  reports: list[dict[str, Any]]) -> PublishResult:
    """The manifest of the gathered files, committed by the coordinator; every rank learns the
    result."""
    o = gen.options
    assert isinstance(o, FilesOptions)
    objects = [obj for r in reports for obj in r["objects"]]
    required = required_components_of(o.required_components, gen.client)
    carried = {c for obj in objects for c in obj.get("components", [obj["component"]])}
    if gen.is_coord:
        say_missing_components(gen.generation_id, required, carried)
    progress = dict(o.data_progress or {})
    progress["cursor"] = merge_cursors(r.get("cursor") for r in reports)
    manifest = _manifest(gen, world_size, list(dict.fromkeys(obj["shard"] for obj in objects)),
                         list(dict.fromkeys(components + sorted(carried - set(components)))),
                         objects, progress, required)
    warnings = [f"required component {c!r} has no file" for c in required if c not in carried]
    result = PublishResult(False, manifest, warnings=warnings)
    gen.point("before_commit", every_rank=gen.distributed, group=o.group)
    if gen.is_coord:
        result = _commit_manifest(gen.location, manifest, gen.s3_client, warnings)
    error, told = _told(gen, [result.published, result.already, result.reason])
    if error is not None:
        return PublishResult(False, manifest, reason=f"unknown: {error}")
    result.published, result.already, result.reason = told
    if result.published and not result.already and result.manifest is not None:
        _committed(gen, result.manifest, every_rank=gen.distributed)
    return result


__all__ = ["FilesOptions", "PublishOptions", "PublishResult", "SaveOptions", "make_generation_id",
           "location_path", "merge_cursors", "publish_files", "required_components_of",
           "save_generation", "say_missing_components", "shard_name", "staging_folder"]
