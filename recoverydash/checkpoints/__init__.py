"""Checkpoints, the pure layer both sides share: what the trainer's SDK and the server's workers
both need to know about checkpoints in storage, with no server library (no Django, no Celery).

- ``objects``: the location layout, canonical object URIs, verification of one object (size,
  sha256, S3's stored checksums), manifests listed, read and written atomically.
- ``paths``: canonical ``file://`` / ``s3://`` URIs, confinement under a folder, safe opens.
- ``selection``: offline restore selection (``select_restorable``), from storage alone.
- ``formats``: adapters that read other tools' checkpoint folders (DCP, HF, Lightning, DeepSpeed,
  Megatron, Orbax) into generations with a status and reasons.

It imports only the recovery core (``recoverydash.recovery``) and the standard library (boto3
only for ``s3://``, inside the functions that need it). This package's ``__init__`` imports
nothing, so importing one module loads only what that module needs.
"""
