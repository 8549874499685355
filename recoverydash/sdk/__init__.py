"""recoverydash trainer SDK: the data ledger and checkpoint manifests of a PyTorch run.

Two lines in a training script::

    rec = recoverydash.sdk.LedgerRecorder.for_sampler(recoverydash.sdk.init(url, token, run_id), sampler)
    rec.commit(update)        # after optimizer.step(), at each accumulation boundary

and, for checkpoints, ``save_generation(location, generation_id, update, state=..., recorder=rec)``
publishes a DCP save with its manifest (the commit marker); on restart,
``restore_plan(url, token, run_id, location=...)`` (or ``select_restorable(location)`` offline)
names the generation to load and ``rec.restore(cursor, update)`` where the loader resumes.

Needs only the ``sdk`` extra: no Django, no Celery; torch is imported only by the torch helpers.
Nothing here raises into or blocks the training loop (``load_generation`` excepted: a restore that
fails must stop the job). Command line: ``python -m recoverydash.sdk check LOCATION``.
"""

from recoverydash.sdk.checkpoint import (DEFAULT_REQUIRED_COMPONENTS, GenerationCheck, Selection,
                                         load_generation, make_generation_id, restore_plan, save_generation,
                                         select_restorable, shard_name)
from recoverydash.sdk.client import Client, default_spool_dir, get_client, init, now_rfc3339
from recoverydash.sdk.ledger import (LedgerRecorder, SkipFirst, batch_length, order_digest,
                                     padded_length, resume_skip, resumed_from)
from recoverydash.storage.objects import (MANIFEST_NAME, ObjectCheck, TransientStorageError,
                                          list_manifests, read_manifest, verify_object,
                                          write_manifest_atomically)

__all__ = [
    "Client", "init", "get_client", "default_spool_dir", "now_rfc3339",
    "LedgerRecorder", "SkipFirst", "order_digest", "padded_length", "batch_length",
    "resume_skip", "resumed_from",
    "save_generation", "load_generation", "select_restorable", "restore_plan", "Selection",
    "GenerationCheck", "DEFAULT_REQUIRED_COMPONENTS", "shard_name", "make_generation_id",
    "MANIFEST_NAME", "ObjectCheck", "TransientStorageError", "verify_object", "list_manifests",
    "read_manifest", "write_manifest_atomically",
]
