"""recoverydash trainer SDK: the data ledger and checkpoint manifests of a PyTorch run.

Two lines in a training script::

    rec = recoverydash.sdk.LedgerRecorder.for_sampler(recoverydash.sdk.init(url, token, run_id), sampler)
    rec.commit(update)        # after optimizer.step(), at each accumulation boundary

and, for checkpoints, ``save_generation(location, generation_id, update, state=..., recorder=rec)``
publishes a DCP save with its manifest (the commit marker); on restart,
``restore_plan(url, token, run_id, location=...)`` (or ``select_restorable(location)`` offline)
names the generation to load, ``load_generation(location, generation_id, state=...)`` loads it,
and ``rec.restore(cursor, update)`` says where the loader resumes.

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
pass ``s3_client=recoverydash.storage.objects.make_s3_client(endpoint, ...)`` or let boto3 read
its usual environment). On S3, each rank lets DCP write to a local staging folder, uploads its
files with their ``ChecksumSHA256`` (S3 refuses bytes that do not match), and only when every
rank succeeded does the coordinator publish the manifest with one conditional PUT
(``IfNoneMatch="*"``); a failure on any rank publishes nothing. ``load_generation`` downloads the
objects it needs to a staging folder, checks size and sha256 against the manifest, and loads from
there. ``select_restorable`` verifies S3 objects by HEAD (the stored ChecksumSHA256), so a deleted
or damaged object rejects its generation.

Needs only the ``sdk`` extra: no Django, no Celery; torch is imported only by the torch helpers.
Nothing here raises into or blocks the training loop (``load_generation`` excepted: a restore that
fails must stop the job). Command line: ``python -m recoverydash.sdk check LOCATION`` (storage only:
the data ledger, hence ``data_cursor_mismatch`` and ``stale_state``, needs the server).
"""

from recoverydash.sdk.attempt import resolve_attempt
from recoverydash.sdk.checkpoint import (
    DEFAULT_REQUIRED_COMPONENTS,
    GenerationCheck,
    Selection,
    load_generation,
    make_generation_id,
    restore_plan,
    save_generation,
    select_restorable,
    shard_name,
)
from recoverydash.sdk.client import Client, get_client, init, now_rfc3339
from recoverydash.sdk.ledger import (
    LedgerRecorder,
    SkipFirst,
    batch_length,
    order_digest,
    padded_length,
    resume_skip,
    resumed_from,
)
from recoverydash.sdk.spool import default_spool_dir
from recoverydash.storage.objects import (
    MANIFEST_NAME,
    ObjectCheck,
    TransientStorageError,
    list_manifests,
    read_manifest,
    verify_object,
    write_manifest_atomically,
)

__all__ = [
    "DEFAULT_REQUIRED_COMPONENTS",
    "MANIFEST_NAME",
    "Client",
    "GenerationCheck",
    "LedgerRecorder",
    "ObjectCheck",
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
    "now_rfc3339",
    "order_digest",
    "padded_length",
    "read_manifest",
    "resolve_attempt",
    "restore_plan",
    "resume_skip",
    "resumed_from",
    "save_generation",
    "select_restorable",
    "shard_name",
    "verify_object",
    "write_manifest_atomically",
]
