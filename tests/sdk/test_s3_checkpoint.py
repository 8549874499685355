"""Checkpoints on S3 (moto's server mode over HTTP): upload and download helpers, and real
torch.distributed ranks (gloo, CPU) publishing DCP saves to an ``s3://`` prefix, a rank whose
uploads fail, a resumed attempt loading from S3, and offline restore selection on the prefix."""

from __future__ import annotations

import base64
import hashlib
import json
import os

import pytest

from recoverydash.checkpoints.objects import (
    MANIFEST_NAME,
    PermanentStorageError,
    download_file,
    list_manifests,
    upload_file,
    verify_object,
)

from .conftest import FakeIngest

DATA = os.urandom(3000)
DIGEST = hashlib.sha256(DATA).hexdigest()


def test_upload_file_stores_the_sha256_and_download_file_hashes_the_copy(s3_server, tmp_path):
    _, s3 = s3_server
    s3.create_bucket(Bucket="updown")
    src = tmp_path / "src.bin"
    src.write_bytes(DATA)
    assert upload_file("s3://updown/g/x.bin", str(src), s3_client=s3) == (len(DATA), DIGEST)
    head = s3.head_object(Bucket="updown", Key="g/x.bin", ChecksumMode="ENABLED")
    assert base64.b64decode(head["ChecksumSHA256"]).hex() == DIGEST
    check = verify_object("s3://updown/g/x.bin", len(DATA), DIGEST, s3_client=s3)
    assert check.ok and "stored by S3" in check.detail  # compared without reading the object
    dst = tmp_path / "deep" / "copy.bin"
    assert download_file("s3://updown/g/x.bin", str(dst), s3_client=s3) == (len(DATA), DIGEST)
    assert dst.read_bytes() == DATA
    with pytest.raises(PermanentStorageError):
        download_file("s3://updown/g/absent", str(tmp_path / "absent"), s3_client=s3)


# --- real ranks ---------------------------------------------------------------------------------

torch = pytest.importorskip("torch")

from recoverydash.checkpoints.selection import select_restorable

from . import test_torch_distributed as dist_tests

WORLD = 2
N = 203             # 102 per rank: 34 microbatches of 3, 8 updates and a partial one per epoch
MICRO, ACCUM = 3, 4
BUCKET = "ckpt"


@pytest.fixture(scope="module")
def s3_runs(s3_server, tmp_path_factory):
    """Three runs of WORLD gloo ranks against one moto server: a clean run publishing u4 and u8;
    a run whose rank 1 cannot upload during the save of u8; its resumed attempt (from S3)."""
    endpoint, s3 = s3_server
    s3.create_bucket(Bucket=BUCKET)
    base = tmp_path_factory.mktemp("s3dist")
    ingest = FakeIngest()
    common = {"url": ingest.url, "token": "t", "spool": str(base / "spool"), "epochs": 1,
              "accum": ACCUM, "micro": MICRO, "n": N, "ckpt_every": 4, "s3_endpoint": endpoint}
    out = {}
    for name, extra in [
        ("clean", {"run_id": "s3clean", "attempt": 0}),
        ("failed", {"run_id": "s3crash", "attempt": 0, "fail_upload_rank": 1,
                    "fail_upload_update": 8}),
        ("resumed", {"run_id": "s3crash", "attempt": 1, "resume": True}),
    ]:
        res = base / f"out-{name}"
        res.mkdir()
        loc = f"s3://{BUCKET}/runs/{extra['run_id']}"
        codes = dist_tests.launch({**common, **extra, "location": loc, "out": str(res)},
                                  world=WORLD)
        results = {int(p.stem[4:]): json.loads(p.read_text()) for p in res.glob("rank*.json")}
        out[name] = {"codes": codes, "location": loc, "results": results,
                     "manifests": list_manifests(loc, s3_client=s3)}
    yield ingest, s3, out
    ingest.stop()


def _keys(s3, prefix):
    page = s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix)
    return sorted(o["Key"] for o in page.get("Contents", []))


@pytest.mark.slow
def test_ranks_publish_dcp_saves_to_s3_and_the_prefix_is_restorable(s3_runs):
    ingest, s3, out = s3_runs
    run = out["clean"]
    assert run["codes"] == [0] * WORLD
    assert run["results"][0]["published"] == ["u000000004-a0", "u000000008-a0"]
    sel = select_restorable(run["location"], world_size=WORLD, dataset_version="ds-1",
                            s3_client=s3, verify_all=True)
    assert sel.generation_id == "u000000008-a0"
    assert [g.status for g in sel.generations] == ["restorable", "restorable"]
    m = sel.manifest
    assert m["required_shards"] == ["rank0", "rank1"]
    assert m["components"] == ["model", "optimizer", "scheduler", "rng", "data_progress"]
    prefix = "runs/s3clean/u000000008-a0/"
    assert all(o["uri"].startswith(f"s3://{BUCKET}/{prefix}") for o in m["objects"])
    assert any(o["uri"].endswith("/model/.metadata") for o in m["objects"])
    assert any(o["uri"].endswith(".distcp") for o in m["objects"])
    # every object of the manifest is in the bucket with its full-object ChecksumSHA256
    keys = _keys(s3, prefix)
    assert sorted(o["uri"][len(f"s3://{BUCKET}/"):] for o in m["objects"]) \
        == [k for k in keys if not k.endswith(MANIFEST_NAME)]
    for o in m["objects"]:
        key = o["uri"][len(f"s3://{BUCKET}/"):]
        head = s3.head_object(Bucket=BUCKET, Key=key, ChecksumMode="ENABLED")
        assert head["ContentLength"] == o["size"]
        assert base64.b64decode(head["ChecksumSHA256"]).hex() == o["sha256"]
        # the manifest records the checksum the upload carried, as S3 stores it
        assert o["checksums"] == {"sha256": head["ChecksumSHA256"]}
    # 8 updates x 4 microbatches x 3 samples x 2 ranks = 192 positions of epoch 0
    assert m["data_progress"]["cursor"] == [{"stratum": "main", "epoch": 0, "position": 192}]
    committed = dist_tests.events(ingest, "s3clean", "checkpoint_committed")
    assert sorted(e["manifest"]["generation_id"] for e in committed) \
        == ["u000000004-a0", "u000000008-a0"]


@pytest.mark.slow
def test_a_rank_whose_upload_fails_publishes_nothing(s3_runs):
    ingest, s3, out = s3_runs
    run = out["failed"]
    assert run["codes"] == [3] * WORLD  # every rank learned that u8 was not published
    assert all(r["failed_generation"] == "u000000008-a0" for r in run["results"].values())
    assert [u.split("/")[-2] for u in run["manifests"]] == ["u000000004-a0"]
    # rank 0's uploads of u8 may be there, but without a manifest they are no generation
    assert not [k for k in _keys(s3, "runs/s3crash/u000000008-a0/") if k.endswith(MANIFEST_NAME)]
    assert not [e for e in dist_tests.events(ingest, "s3crash", "checkpoint_committed", attempt=0)
                if e["manifest"]["generation_id"] == "u000000008-a0"]


@pytest.mark.slow
def test_a_resumed_attempt_loads_its_generation_from_s3(s3_runs):
    ingest, s3, out = s3_runs
    run = out["resumed"]
    assert run["codes"] == [0] * WORLD
    started = dist_tests.events(ingest, "s3crash", "attempt_started", attempt=1)
    assert len(started) == WORLD
    expected = {"generation_id": "u000000004-a0", "update": 4,
                "cursor": [{"stratum": "main", "epoch": 0, "position": 96}]}
    assert all(e["resumed_from"] == expected for e in started)
    assert run["results"][0]["published"] == ["u000000008-a1"]
    assert len(dist_tests.events(ingest, "s3crash", "restore_completed", attempt=1)) == 1
    lineage = [e for e in dist_tests.events(ingest, "s3crash", "update_committed", attempt=0)
               if e["update"] <= 4] + dist_tests.events(ingest, "s3crash", "update_committed",
                                                        attempt=1)
    cov = dist_tests.coverage(lineage)
    assert cov[(0, False)] == list(range(N))  # every position once across the two attempts
    assert select_restorable(run["location"], s3_client=s3).generation_id == "u000000008-a1"


@pytest.mark.slow
def test_a_generation_whose_object_was_deleted_is_rejected(s3_runs):
    _, s3, out = s3_runs
    run = out["clean"]
    m = select_restorable(run["location"], s3_client=s3).manifest
    victim = next(o for o in m["objects"] if o["uri"].endswith(".distcp"))
    s3.delete_object(Bucket=BUCKET, Key=victim["uri"][len(f"s3://{BUCKET}/"):])
    sel = select_restorable(run["location"], world_size=WORLD, s3_client=s3)
    assert sel.generation_id == "u000000004-a0"
    newest = sel.generations[0]
    assert newest.generation_id == "u000000008-a0" and newest.status == "rejected"
    assert [r["code"] for r in newest.reasons] == ["object_missing"]
    assert victim["uri"] in newest.reasons[0]["detail"]
