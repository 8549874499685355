"""recoverydash trainer SDK: the data ledger and checkpoint manifests of a PyTorch run.

The data ledger is observed (``recoverydash.sdk.observe``): the position of every sample travels
with it through the loader and is recorded where the model receives it::

    rec = recoverydash.sdk.ObservedRecorder(recoverydash.sdk.init(url, token, run_id))
    loader = DataLoader(rec.dataset(ds), sampler=rec.sampler(sampler), batch_size=b,
                        collate_fn=rec.collate())
    for batch in loader:
        loss(model(*rec.observe(batch))).backward()      # or rec.attach(model)
        ...; optimizer.step(); rec.commit()              # at each accumulation boundary

(``recoverydash.integrations`` builds those loaders for plain PyTorch and torchdata.) The
``CountingRecorder`` infers positions from a count instead: a fallback for loops that cannot
carry positions. For checkpoints, ``save_generation(location, generation_id, update, state=...,
recorder=rec)`` publishes a DCP save with its manifest (the commit marker; the recorder's
``state_dict()`` is the data progress); ``publish_files`` publishes files a trainer wrote itself.
On restart, ``restore_plan(url, token, run_id, location=...)`` (or ``select_restorable(location)``
offline) names the generation to load (it sends the run's spool first, and lets storage decide
when the server has not decided yet or a spooled commit could not reach it),
``load_generation(location, generation_id, state=...)`` loads it, and
``rec.load_state_dict(progress)`` resumes the loader.

Attempts: every launch of a run is a new attempt, the same number on every rank. ``init`` /
``Client`` take ``attempt=`` or ``$RECOVERYDASH_ATTEMPT`` as given; otherwise the number is one
more than the highest attempt found in the restored generation's manifest (``restored=``, e.g.
the ``restore_plan`` answer), the manifests under ``location=``, this host's state file
``<spool_dir>/<run_id>/attempts.json`` and the server's ``latest_attempt`` (``GET /api/v1/runs``,
scope ``read``; skipped when refused or unreachable), and at least torchrun's / Slurm's restart
count. With ``torch.distributed`` initialised, rank 0 decides and broadcasts it (every rank must
create its client at the same point). ``recoverydash.sdk.attempt`` has the details; a 409 on
``attempt_started`` (a reused attempt) is logged as an error. A complete script:
``examples/train_ddp.py``.

A location is a folder (``/ckpt``, ``file:///ckpt``) or an S3 prefix (``s3://bucket/prefix``;
pass ``s3_client=recoverydash.checkpoints.objects.make_s3_client(endpoint, ...)`` or let boto3 read
its usual environment). On S3, each rank lets DCP write to a local staging folder, uploads its
files with their ``ChecksumSHA256`` (S3 refuses bytes that do not match), and only when every
rank succeeded does the coordinator publish the manifest with one conditional PUT
(``IfNoneMatch="*"``); a failure on any rank publishes nothing. ``load_generation`` downloads the
objects it needs to a staging folder, checks size and sha256 against the manifest, and loads from
there. ``select_restorable`` verifies S3 objects by HEAD (the stored ChecksumSHA256), so a deleted
or damaged object rejects its generation.

Needs only the base install (``pip install recoverydash``: pyroaring), no Django, no Celery;
``[s3]`` adds boto3 for ``s3://`` locations; torch is imported only by the torch helpers.
Nothing here raises into or blocks the training loop. ``load_generation`` checks every object
against the manifest before loading; a generation that fails is reported (``restore_failed``) and
the next restorable one is loaded instead (its ``.generation_id`` / ``.update`` /
``.resumed_from`` say which); it raises ``RestoreError`` only when a load had begun writing into
the state and nothing was left to load. Command line: ``python -m recoverydash.sdk check
LOCATION`` (storage only: the data ledger, hence ``data_cursor_mismatch`` and ``stale_state``,
needs the server) and ``python -m recoverydash.sdk resend --run RUN`` (a run's spooled events,
once a token the server refused is right).
"""

from recoverydash.checkpoints.objects import (
    MANIFEST_NAME,
    ObjectCheck,
    TransientStorageError,
    list_manifests,
    read_manifest,
    verify_object,
    write_manifest_atomically,
)
from recoverydash.checkpoints.selection import (
    DEFAULT_REQUIRED_COMPONENTS,
    GenerationCheck,
    Selection,
    select_restorable,
)
from recoverydash.sdk.attempt import resolve_attempt
from recoverydash.sdk.checkpoint import (
    FilesOptions,
    PublishResult,
    Restored,
    RestoreError,
    SaveOptions,
    load_generation,
    make_generation_id,
    merge_cursors,
    publish_files,
    resolve_location,
    restore_plan,
    save_generation,
    shard_name,
)
from recoverydash.sdk.client import Client, get_client, init, now_rfc3339
from recoverydash.sdk.ledger import (
    CountingRecorder,
    SkipFirst,
    batch_length,
    order_digest,
    padded_length,
    resume_skip,
    resumed_from,
)
from recoverydash.sdk.observe import (
    BATCH_KEY,
    BatchTag,
    Draw,
    ObservedCollate,
    ObservedDataset,
    ObservedIterableDataset,
    ObservedRecorder,
    PositionSampler,
    strip,
)
from recoverydash.sdk.options import ClientOptions
from recoverydash.sdk.spool import default_spool_dir

__all__ = [
    "BATCH_KEY",
    "DEFAULT_REQUIRED_COMPONENTS",
    "MANIFEST_NAME",
    "BatchTag",
    "Client",
    "ClientOptions",
    "CountingRecorder",
    "Draw",
    "FilesOptions",
    "GenerationCheck",
    "ObjectCheck",
    "ObservedCollate",
    "ObservedDataset",
    "ObservedIterableDataset",
    "ObservedRecorder",
    "PositionSampler",
    "PublishResult",
    "RestoreError",
    "SaveOptions",
    "Restored",
    "Selection",
    "SkipFirst",
    "TransientStorageError",
    "batch_length",
    "default_spool_dir",
    "get_client",
    "init",
    "list_manifests",
    "load_generation",
    "make_generation_id",
    "merge_cursors",
    "now_rfc3339",
    "order_digest",
    "padded_length",
    "publish_files",
    "read_manifest",
    "resolve_attempt",
    "resolve_location",
    "restore_plan",
    "resume_skip",
    "resumed_from",
    "save_generation",
    "select_restorable",
    "shard_name",
    "strip",
    "verify_object",
    "write_manifest_atomically",
]
