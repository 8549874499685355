"""Adopted folders: checkpoints another tool wrote (torch DCP, HF Trainer, Lightning, DeepSpeed,
Megatron, Orbax) in a storage location of kind ``adopt``, turned into generations of a run that
may send no events at all (docs/formats.md#adopted-folders-on-the-server).

On discovery's beat schedule (``workers.tasks.discover_manifests``, every 60 s,
``recoverydash.ingest.discovery.discover_all``) each enabled adopt location is listed once
(``recoverydash.checkpoints.formats.store.Tree``, with the location's own credentials), its format's
adapter (``StorageLocation.format``, or detected when it is empty or ``auto``) builds the
generations, and those not known yet reach the run through the same ingest action as the API:

* a committed generation becomes a ``checkpoint_committed`` event whose manifest is the adapter's
  (``Generation.manifest``: objects with the sizes the structure declares, the ``adopted``
  extension with the format, its rule and the reasons found; no data cursor). Its ``time`` is
  the commit marker's modification time, so the seconds since last restorable are counted from
  the file times;
* a generation with no commit marker becomes a ``checkpoint_started`` event at its newest file's
  modification time (the core then calls it ``pending``, or ``abandoned`` with
  ``never_committed`` once a later one exists).

Run id: the location's ``run_id`` when it names one, else ``adopted-`` and the location folder's
last name (``file:///ckpt/llama-7b`` -> ``adopted-llama-7b``). A trainer that later sends events
under that run id joins the same run: its attempts, ledger and own manifests are added; a
generation it reports itself is judged by its own manifest (the adopted one is then ignored,
:meth:`recoverydash.recovery.GenerationRecord.manifest`), and discovery no longer adopts a
generation the run already knows, nor one whose folder holds our own manifest (discovery
ingests that manifest instead: an adopt location is also listed for our manifests).

Confinement: only files of the listing are read, and a file that is a symbolic link is resolved
first with the project's locations (``Locations.resolve``): one leading out of every declared
location is dropped from the listing, never opened, and its generation is rejected with
``object_outside_locations``. Every object of an ingested manifest is then verified by the
storage verifier like any other (sizes; no digest is recorded by these formats).

Each listing is a new observation; a generation already ingested is not ingested again (the
first committed manifest stands, and the verifier notices files that change under it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import posixpath
import re
import urllib.parse

from django.utils import timezone

from recoverydash.checkpoints.formats import ADAPTERS, RULES
from recoverydash.checkpoints.formats.base import Options, finish_all, rfc3339
from recoverydash.checkpoints.formats.store import Tree
from recoverydash.checkpoints.objects import MANIFEST_NAME, PermanentStorageError, StorageError
from recoverydash.ingest.actions import ingest_batch
from recoverydash.runs.models import Generation
from recoverydash.storage.locations import Locations, location_client
from recoverydash.storage.models import StorageLocation

log = logging.getLogger(__name__)

RUN_PREFIX = "adopted-"
"""Run ids made for a location that names none start with this."""


def adopted_run_id(location: StorageLocation) -> str:
    """The run an adopt location's generations belong to: its ``run_id``, else ``adopted-`` and
    the last name of its folder or prefix with each character a run id may not hold
    (``[A-Za-z0-9._:-]``) replaced by ``_`` (at most 128 characters)."""
    if location.run_id:
        return location.run_id
    name = posixpath.basename(location.url.rstrip("/")) or "root"
    if location.url.startswith("s3://") and "/" not in location.url[5:].rstrip("/"):
        name = location.url[5:].rstrip("/")  # a whole bucket: its name
    # a folder may be called anything: what a run id may not hold becomes _ (else ingest
    # refused every adopted generation of it)
    name = re.sub(r"[^A-Za-z0-9._:-]", "_", urllib.parse.unquote(name))
    return (RUN_PREFIX + name)[:128]


def _digest(doc) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def committed_event(manifest: dict, run_id: str, uri: str) -> dict:
    """The ``checkpoint_committed`` event of an adopted generation's manifest found at ``uri``
    (its folder); ``event_id`` derived from the content, so a listing again is a duplicate."""
    return {"event_id": f"adopted:{manifest['generation_id']}:{_digest(manifest)}",
            "type": "checkpoint_committed", "run_id": run_id, "attempt": 0,
            "time": manifest["committed_at"], "manifest": manifest, "discovered_at": uri}


def started_event(gen, run_id: str) -> dict | None:
    """The ``checkpoint_started`` event of a generation without a commit marker, at its newest
    file's modification time; None when the adapter found no update for it."""
    if gen.update is None:
        return None
    newest = max((o.mtime for o in gen.objects), default=None)
    body = {"generation_id": gen.generation_id, "update": gen.update,
            "required_shards": list(gen.required_shards)}
    return {"event_id": f"adopted:{gen.generation_id}:started:{_digest(body)}",
            "type": "checkpoint_started", "run_id": run_id, "attempt": 0,
            "time": rfc3339(newest if newest is not None else timezone.now().timestamp()),
            **body}


def detect_other(tree: Tree) -> str | None:
    """The other tool's format the folder matches best (``recoverydash.checkpoints.formats.detect``
    without our own manifests: discovery reads those beside), or None."""
    scores = {name: m.detect(tree) for name, m in ADAPTERS.items()}
    best = max(scores, key=lambda n: scores[n])
    return best if scores[best] > 0 else None


def confine(tree: Tree, location: StorageLocation) -> dict[str, str]:
    """Drop from ``tree`` every file that is a symbolic link leading out of the project's
    locations (resolved with ``Locations.resolve``, never opened); returns ``{relative path:
    why}`` of those dropped."""
    if not tree.links:
        return {}
    locations = Locations(location.project_id)
    dropped = {}
    for rel in sorted(tree.links):
        where = locations.resolve(tree.uri(rel), uri_is_server=True)
        if where.refused or where.location is None:
            dropped[rel] = where.refused or f"{tree.uri(rel)}: not under a storage location"
    tree.drop(dropped)
    return dropped


def scan_location(location: StorageLocation, tree: Tree):
    """``(format, generations, dropped)`` of an adopt location's folder listed as ``tree``: the
    format used (None when nothing is recognised), the adapter's generations with statuses
    (newest first), and the files dropped by :func:`confine`. Raises StorageError when a read
    fails in a way the adapter does not record on a generation."""
    dropped = confine(tree, location)
    fmt = location.format if location.format not in ("", "auto") else detect_other(tree)
    if fmt is None or fmt not in ADAPTERS:
        return fmt, [], dropped
    gens = ADAPTERS[fmt].scan(tree)
    for gen in gens:
        prefix = f"{gen.folder}/" if gen.folder else ""
        for rel, why in dropped.items():
            if rel.startswith(prefix):
                gen.problem("object_outside_locations", why)
    return fmt, finish_all(gens, Options()), dropped


def adopt_location(location: StorageLocation) -> int:
    """Ingest the generations of one adopt location that its run does not know yet; returns how
    many events were accepted. Listing errors are stored on the location (shown on the
    locations page) and raised for the task to retry when they may pass."""
    try:
        tree = Tree(location.url, s3_client=location_client(location))
        fmt, gens, dropped = scan_location(location, tree)
    except StorageError as exc:
        StorageLocation.objects.filter(pk=location.pk).update(
            last_error=str(exc)[:2000], last_listed_at=timezone.now())
        if isinstance(exc, PermanentStorageError):
            return 0
        raise
    if fmt is None or fmt not in ADAPTERS:
        StorageLocation.objects.filter(pk=location.pk).update(
            last_error=f"no checkpoint layout recognised under {location.url}"
                       + (f" (format {fmt!r} unknown)" if fmt else ""),
            last_listed_at=timezone.now())
        return 0
    run_id = adopted_run_id(location)
    known = dict(Generation.objects.filter(run__project=location.project, run__run_id=run_id)
                 .values_list("generation_id", "manifest"))
    base = location.url.rstrip("/")
    events = []
    for gen in gens:
        folder_uri = f"{base}/{gen.folder}" if gen.folder else base
        own = f"{gen.folder}/{MANIFEST_NAME}" if gen.folder else MANIFEST_NAME
        if own in tree.files:
            continue  # the trainer wrote our manifest here: plain discovery's, not ours
        if gen.committed:
            if gen.generation_id in known and known[gen.generation_id] is not None:
                continue
            events.append(committed_event(gen.manifest(run_id, RULES[fmt]), run_id, folder_uri))
        elif gen.generation_id not in known:
            event = started_event(gen, run_id)
            if event is not None:
                events.append(event)
    accepted = 0
    for event in events:  # one by one: an invalid one must not block the others
        try:
            result = ingest_batch(location.project, [event], adopted=True)
        except Exception as exc:
            log.warning("adopted %s of %s not ingested: %s", event["event_id"], location.url, exc)
            continue
        if result.accepted:
            accepted += 1
            if event["type"] == "checkpoint_committed":
                Generation.objects.filter(
                    run__project=location.project, run__run_id=run_id,
                    generation_id=event["manifest"]["generation_id"]).update(
                    discovered=True, found_at=event["discovered_at"])
    note = (f"{len(dropped)} linked file(s) lead outside the storage locations: never read"
            if dropped else "")
    StorageLocation.objects.filter(pk=location.pk).update(last_error=note,
                                                          last_listed_at=timezone.now())
    return accepted


