"""Orbax (JAX) ``CheckpointManager`` step folders.

Rule (``RULE``): Orbax writes a step into ``<step>.orbax-checkpoint-tmp-<timestamp>/`` and
finalises it by renaming it to ``<step>/`` (atomic on a POSIX filesystem) or, on object stores
where a rename is not atomic, by writing ``commit_success.txt`` into it. So a ``tmp`` folder never
committed; on ``s3://`` a step folder without ``commit_success.txt`` never committed either.
Complete when every item named by the step's ``_CHECKPOINT_METADATA`` (``item_handlers``) has its
folder, each item folder has a parseable ``_METADATA`` (or, for JSON items, its file), and with
OCDBT every process that wrote (``ocdbt.process_<i>/``) left its ``manifest.ocdbt``. Shards are
processes. ``update`` is the step number.

A structural check cannot open the tensorstore chunks; that a chunk is missing inside an OCDBT
database is not seen here (docs/formats.md).
"""

from __future__ import annotations

import json
import re

from recoverydash.checkpoints.formats.base import Generation
from recoverydash.checkpoints.formats.store import Tree
from recoverydash.checkpoints.objects import StorageError

NAME = "orbax"
RULE = ("a <step>.orbax-checkpoint-tmp-* folder never committed; <step>/ is committed by its "
        "rename (and, on object stores, by commit_success.txt); complete when every item of "
        "_CHECKPOINT_METADATA has its folder with a parseable _METADATA and every OCDBT process "
        "its manifest.ocdbt")
COMMIT = "commit_success.txt"
STEP_META = "_CHECKPOINT_METADATA"
_TMP = re.compile(r"(?:.*?_)?(\d+)\.orbax-checkpoint-tmp-\d+")
_STEP = re.compile(r"(?:.*?_)?(\d+)")
_PROCESS = re.compile(r"ocdbt\.process_(\d+)")


def detect(tree: Tree) -> int:
    score = 0
    for n in tree.children():
        if _TMP.fullmatch(n) or _STEP.fullmatch(n) and tree.is_dir(n) and (
                STEP_META in tree.children(n) or COMMIT in tree.children(n)
                or any(f"{n}/{c}/_METADATA" in tree.files for c in tree.children(n))):
            score += 3
    return score


def scan(tree: Tree) -> list[Generation]:
    out = []
    for n in tree.children():
        tmp = _TMP.fullmatch(n)
        found = tmp or _STEP.fullmatch(n)
        if found is None or not tree.is_dir(n):
            continue
        gen = Generation(NAME, n, n, update=int(found.group(1)))
        check_step(tree, gen, n)
        if tmp:
            gen.uncommitted = ("an .orbax-checkpoint-tmp folder: never renamed into place, the "
                               "save did not finish")
        elif f"{n}/{COMMIT}" in tree.files:
            gen.commit(tree, f"{n}/{COMMIT}", when=gen.committed_at)
        elif tree.scheme == "s3":
            gen.uncommitted = (f"no {COMMIT}: on an object store Orbax commits a step by writing "
                               "it last")
        else:
            gen.commit(tree, f"{n}/{STEP_META}" if f"{n}/{STEP_META}" in tree.files else None,
                       when=gen.committed_at)
            if gen.commit_marker is None:  # an older Orbax without step metadata
                gen.commit_marker = n + "/"
                gen.committed_at = max((o.mtime for o in gen.objects), default=None)
            gen.notes.append("committed by its rename into place (a POSIX filesystem)")
        out.append(gen)
    return out


def check_step(tree: Tree, gen: Generation, folder: str) -> None:
    """Items and processes of one step folder (committed_at from commit_timestamp_nsecs)."""
    names = tree.children(folder)
    items = [n for n in names if tree.is_dir(f"{folder}/{n}")]
    declared = []
    meta_rel = f"{folder}/{STEP_META}"
    if meta_rel in tree.files:
        gen.add(tree, meta_rel, "process0", "checkpoint_metadata")
        try:
            meta = json.loads(tree.read(meta_rel))
        except StorageError as e:
            gen.problem("storage_unverified", f"{meta_rel}: {e}")
            meta = {}
        except (UnicodeDecodeError, ValueError) as e:
            gen.problem("schema_unsupported", f"{meta_rel} is not JSON: {e}")
            meta = {}
        handlers = meta.get("item_handlers") if isinstance(meta, dict) else None
        if isinstance(handlers, dict):
            declared = sorted(handlers)
        elif isinstance(handlers, str):
            declared = []  # a single unnamed item: the step folder itself holds it
        ns = meta.get("commit_timestamp_nsecs") if isinstance(meta, dict) else None
        if isinstance(ns, int):
            gen.committed_at = ns / 1e9
    gen.required_components = declared or items
    processes = set()
    for item in items:
        base = f"{folder}/{item}"
        files = tree.under(base)
        if f"{base}/_METADATA" in tree.files:
            rel = f"{base}/_METADATA"
            gen.add(tree, rel, "process0", item)
            try:
                json.loads(tree.read(rel))
            except StorageError as e:
                gen.problem("storage_unverified", f"{rel}: {e}")
            except (UnicodeDecodeError, ValueError) as e:
                gen.problem("schema_unsupported", f"{rel} is not JSON: {e}")
        elif item in files:  # a JSON item (JsonCheckpointHandler): <item>/<item>
            gen.add(tree, f"{base}/{item}", "process0", item)
        elif files:
            gen.problem("object_missing", f"{base}: no _METADATA")
        writers = set()
        for rel in sorted(files):
            head = rel.split("/", 1)[0]
            m = _PROCESS.fullmatch(head)
            if m:
                writers.add(int(m.group(1)))
                if rel == f"{head}/manifest.ocdbt":
                    gen.add(tree, f"{base}/{rel}", f"process{m.group(1)}", item)
        processes |= writers
        for p in sorted(writers):
            if f"{base}/ocdbt.process_{p}/manifest.ocdbt" not in tree.files:
                gen.problem("object_missing", f"{base}/ocdbt.process_{p}: no manifest.ocdbt")
        if "manifest.ocdbt" in files:
            gen.add(tree, f"{base}/manifest.ocdbt", "process0", item)
        if not files:
            gen.problem("object_missing", f"{base}: empty item folder")
    if processes:
        gen.required_shards = [f"process{p}" for p in range(max(processes) + 1)]
        gen.world_size = len(gen.required_shards)
    else:
        gen.required_shards = ["process0"]
    if not items and not declared:
        gen.problem("object_missing", f"{folder}: no item folder")
