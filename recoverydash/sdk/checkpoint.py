"""Checkpoint generations: publish them around ``torch.distributed.checkpoint`` (DCP), choose the
one to restore without the server, and load it.

Layout of one generation (``recoverydash.checkpoints.objects`` documents the location layout)::

    <location>/<generation_id>/model/__<rank>_0.distcp, .metadata    DCP save of state["model"]
    <location>/<generation_id>/optimizer/__<rank>_0.distcp, ...      DCP save of state["optimizer"]
    <location>/<generation_id>/scheduler/rank<r>.pt                  torch.save of rank_state[...]
    <location>/<generation_id>/rng/rank<r>.pt                        CPU/CUDA/python RNG states
    <location>/<generation_id>/data_progress/rank<r>.json            the recorder's state_dict()
    <location>/<generation_id>/recoverydash-manifest.json            the commit marker

On an S3 location (``s3://bucket/prefix``) the layout is the same under the prefix: DCP writes
into a per-rank local staging folder (removed afterwards), and each rank uploads the files it
wrote to ``<prefix>/<generation_id>/<component>/<name>`` with their full-object checksum
(``ChecksumSHA256`` of one PUT up to 5 GiB; a multipart upload's CRC32), which the manifest
object records in ``checksums``. Manifest object URIs are then ``s3://`` URIs, and
``load_generation`` downloads them to a staging folder before loading.

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
coordinator reports ``checkpoint_started``; every rank saves its files, hashed as they are written
(``recoverydash.sdk.hashing``: no second read), and reports ``shard_written``; all ranks agree
on success (an all-reduce of a success flag, so a rank that failed or died makes every rank
publish nothing); the coordinator gathers every rank's objects, checks that every required shard
and component reported and that all parts are at the same update, writes the manifest atomically
(the commit: temporary file and link on a filesystem, one ``IfNoneMatch="*"`` PUT on S3), then
reports ``checkpoint_committed``. On S3 a rank whose upload
fails votes no in that all-reduce, so nothing is published; objects already uploaded for the failed
generation stay under its folder without a manifest, which readers never treat as a generation (the
next attempt uses another generation id). Collectives are plain tensor collectives (no ``*_object``
helpers, which need numpy).

The code is in one module per part, all re-exported here: ``recoverydash.sdk.publish``
(``save_generation``, ``publish_files`` and their options, as named steps),
``recoverydash.sdk.hashing`` (hashing while writing), ``recoverydash.sdk.restore``
(``restore_plan``), ``recoverydash.sdk.load`` (``load_generation``) and
``recoverydash.sdk.collective`` (plain tensor collectives). Restore selection without the server
(``select_restorable``, with ``GenerationCheck`` and ``Selection``) lives in the pure layer,
``recoverydash.checkpoints.selection``, which the server's ``check`` shares; ``restore_plan``
asks the server first and falls back to it.

torch is imported only inside the functions that need it.
"""

from __future__ import annotations

from recoverydash.checkpoints.objects import resolve_location
from recoverydash.checkpoints.selection import (
    DEFAULT_REQUIRED_COMPONENTS,
    GenerationCheck,
    Selection,
    select_restorable,
)
from recoverydash.sdk.collective import all_gather_json, dist_info
from recoverydash.sdk.load import Restored, RestoreError, load_generation
from recoverydash.sdk.publish import (
    FilesOptions,
    PublishOptions,
    PublishResult,
    SaveOptions,
    make_generation_id,
    merge_cursors,
    publish_files,
    required_components_of,
    save_generation,
    say_missing_components,
    shard_name,
)
from recoverydash.sdk.restore import restore_plan

#: The names the integrations imported before ``recoverydash.sdk.collective`` (kept for code
#: written against them; use ``all_gather_json`` and ``dist_info``).
_all_gather_json = all_gather_json
_dist_info = dist_info

__all__ = ["DEFAULT_REQUIRED_COMPONENTS", "FilesOptions", "GenerationCheck", "PublishOptions",
           "PublishResult", "RestoreError", "Restored", "SaveOptions", "Selection",
           "load_generation", "make_generation_id", "merge_cursors", "publish_files",
           "required_components_of", "resolve_location", "restore_plan", "save_generation",
           "say_missing_components", "select_restorable", "shard_name"]
