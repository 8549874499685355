"""S3 through moto's server mode over HTTP: verification of present, missing, wrong-size and
wrong-checksum objects, and discovery of a manifest written to a bucket with no event at all
(the coordinator died after publishing: docs/ingest-v1.md#7-checkpoints-in-storage)."""

from __future__ import annotations

import base64
import hashlib
import socket
import uuid

import pytest

from recoverydash.checkpoints.objects import make_s3_client, write_manifest_atomically
from recoverydash.ingest.discovery import discover_all
from recoverydash.runs.models import CheckpointObject, Generation, Run
from recoverydash.storage.models import StorageLocation

pytestmark = pytest.mark.django_db(transaction=True)
COMPONENTS = ["model", "optimizer", "scheduler", "rng", "data_progress"]


@pytest.fixture
def s3():
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    client = make_s3_client(endpoint, access_key_id="testing", secret_access_key="testing")
    global BUCKET  # moto keeps state per process: a fresh bucket per test
    BUCKET = f"ckpt-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=BUCKET)
    yield endpoint, client
    server.stop()


def put(client, key: str, data: bytes, checksum: bool = True) -> dict:
    extra = {}
    if checksum:
        extra["ChecksumSHA256"] = base64.b64encode(hashlib.sha256(data).digest()).decode()
    client.put_object(Bucket=BUCKET, Key=key, Body=data, **extra)
    return {"uri": f"s3://{BUCKET}/{key}", "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest()}


def manifest(generation_id: str, update: int, objects: list[dict]) -> dict:
    return {"schema_revision": 1, "generation_id": generation_id, "update": update,
            "world_size": 2, "required_shards": ["rank0", "rank1"], "components": COMPONENTS,
            "objects": objects, "data_progress": {"cursor": [
                {"stratum": "main", "epoch": 0, "position": 0}]},
            "dataset_version": "ds-v1", "committed_at": "2026-11-01T00:10:00Z",
            "run_id": "s3-run", "attempt": 0}


def generation_objects(client, generation_id: str, spoil: str | None = None) -> list[dict]:
    """Objects of a 2-shard generation, written to the bucket; ``spoil`` damages rank1/model:
    ``missing`` (not written), ``size`` (one byte short), ``checksum`` (S3 holds another
    ChecksumSHA256 than the manifest's digest)."""
    objects = []
    for shard in ("rank0", "rank1"):
        for component in COMPONENTS:
            key = f"runs/{generation_id}/{shard}/{component}"
            data = hashlib.sha256(key.encode()).digest() * 64
            target = shard == "rank1" and component == "model"
            if target and spoil == "missing":
                obj = {"uri": f"s3://{BUCKET}/{key}", "size": len(data),
                       "sha256": hashlib.sha256(data).hexdigest()}
            elif target and spoil == "size":
                obj = put(client, key, data[:-1])
                obj["size"] = len(data)
            elif target and spoil == "checksum":
                obj = put(client, key, b"\x00" * len(data))
                obj["sha256"] = hashlib.sha256(data).hexdigest()
            else:
                obj = put(client, key, data)
            objects.append(dict(obj, shard=shard, component=component))
    return objects


@pytest.mark.parametrize("spoil, status, code", [
    (None, "restorable", None),
    ("missing", "rejected", "object_missing"),
    ("size", "rejected", "size_mismatch"),
    ("checksum", "rejected", "digest_mismatch"),
])
def test_it_discovers_and_verifies_a_manifest_in_a_bucket(s3, project, settings, spoil, status,
                                                          code):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    endpoint, client = s3
    objects = generation_objects(client, "g10", spoil)
    uri = write_manifest_atomically(f"s3://{BUCKET}/runs", manifest("g10", 0, objects),
                                    s3_client=client)
    assert uri == f"s3://{BUCKET}/runs/g10/recoverydash-manifest.json"
    StorageLocation.objects.create(project=project, url=f"s3://{BUCKET}/runs",
                                   endpoint_url=endpoint, access_key_id="testing",
                                   secret_access_key="testing")
    assert discover_all() == 1
    assert discover_all() == 0  # seen: not read or ingested again
    run = Run.objects.get(project=project, run_id="s3-run")
    gen = Generation.objects.get(run=run, generation_id="g10")
    assert gen.discovered is True
    checks = dict(CheckpointObject.objects.filter(generation=gen)
                  .values_list("uri", "check_status"))
    assert len(checks) == 10
    spoiled = f"s3://{BUCKET}/runs/g10/rank1/model"
    if spoil is None:
        assert set(checks.values()) == {"ok"}
    else:
        assert checks.pop(spoiled) == code
        assert set(checks.values()) == {"ok"}
    assert gen.status == status
    if code:
        assert code in {r["code"] for r in gen.reasons}
