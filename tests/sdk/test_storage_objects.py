"""recoverydash.checkpoints.objects: verification statuses, manifest publication and discovery, on
files and on S3 (moto's server mode over HTTP)."""

from __future__ import annotations

import base64
import hashlib
import os

import pytest

from recoverydash.checkpoints.objects import (
    MANIFEST_NAME,
    ManifestConflictError,
    PermanentStorageError,
    TransientStorageError,
    file_uri,
    list_manifests,
    make_s3_client,
    parse_uri,
    read_manifest,
    verify_object,
    write_manifest_atomically,
)

DATA = b"recoverydash" * 100
DIGEST = hashlib.sha256(DATA).hexdigest()


def test_it_parses_s3_and_file_uris():
    assert parse_uri("s3://bkt/a/b.distcp") == parse_uri("s3://bkt/a/b.distcp")
    p = parse_uri("s3://bkt/a/b.distcp")
    assert (p.scheme, p.bucket, p.key) == ("s3", "bkt", "a/b.distcp")
    assert parse_uri("file:///tmp/x/../y").path == "/tmp/y"
    assert parse_uri("/tmp/y").scheme == "file"
    assert parse_uri("gs://b/k").scheme == "gs"
    with pytest.raises(PermanentStorageError):
        parse_uri("s3:///nokey")
    with pytest.raises(PermanentStorageError):
        parse_uri("file://otherhost/x")


def test_it_reports_each_status_of_a_file(tmp_path):
    path = tmp_path / "obj"
    path.write_bytes(DATA)
    uri = file_uri(str(path))
    ok = verify_object(uri, len(DATA), DIGEST)
    assert (ok.status, ok.observed_size, ok.observed_sha256) == ("ok", len(DATA), DIGEST)
    assert verify_object(uri, len(DATA)).status == "ok"
    assert verify_object(uri, len(DATA) + 1, DIGEST).status == "size_mismatch"
    assert verify_object(uri, len(DATA), "0" * 64).status == "digest_mismatch"
    assert verify_object(file_uri(str(tmp_path / "nope")), 1).status == "object_missing"
    assert verify_object("gs://bkt/k", 1).status == "storage_unverified"
    # full_hash_max_bytes is an explicit opt-out: over it the object is not verified, never ok
    big = verify_object(uri, len(DATA), "0" * 64, full_hash_max_bytes=10)
    assert big.status == "storage_unverified" and big.observed_sha256 is None
    assert "not verified" in big.detail


def test_it_publishes_a_manifest_once_and_refuses_a_conflicting_one(tmp_path):
    loc = str(tmp_path / "ckpt")
    m = {"schema_revision": 1, "generation_id": "g1", "update": 3}
    uri = write_manifest_atomically(loc, m)
    assert uri == file_uri(os.path.join(loc, "g1", MANIFEST_NAME))
    assert write_manifest_atomically("file://" + loc, dict(m)) == uri  # same content: no-op
    with pytest.raises(ManifestConflictError):
        write_manifest_atomically(loc, {**m, "update": 4})
    assert read_manifest(uri) == m
    assert sorted(os.listdir(os.path.join(loc, "g1"))) == [MANIFEST_NAME]  # no temp file left
    os.makedirs(os.path.join(loc, "g2"))  # a generation folder without a manifest: not listed
    assert list_manifests(loc) == [uri]
    assert list_manifests(str(tmp_path / "absent")) == []
    with pytest.raises(ValueError):
        write_manifest_atomically(loc, {"generation_id": "a/b"})


def test_publishing_again_with_a_new_committed_at_is_a_no_op(tmp_path, s3_server):
    """docs/definitions.md#volatile-manifest-fields: the copy in place is the same manifest."""
    m = {"schema_revision": 1, "generation_id": "g1", "update": 3,
         "committed_at": "2026-11-01T00:00:00Z"}
    again = {**m, "committed_at": "2026-11-01T00:05:00Z"}
    loc = str(tmp_path / "ckpt")
    uri = write_manifest_atomically(loc, m)
    assert write_manifest_atomically(loc, again) == uri
    assert read_manifest(uri) == m  # the first one stays
    with pytest.raises(ManifestConflictError):
        write_manifest_atomically(loc, {**again, "update": 4})
    _, s3 = s3_server
    s3.create_bucket(Bucket="republish")
    uri = write_manifest_atomically("s3://republish/run", m, s3_client=s3)
    assert write_manifest_atomically("s3://republish/run", again, s3_client=s3) == uri
    assert read_manifest(uri, s3_client=s3) == m
    with pytest.raises(ManifestConflictError):
        write_manifest_atomically("s3://republish/run", {**again, "update": 4}, s3_client=s3)


def test_it_verifies_s3_objects_present_missing_and_wrong(s3_server):
    _, s3 = s3_server
    s3.create_bucket(Bucket="verify")
    s3.put_object(Bucket="verify", Key="plain", Body=DATA)
    ok = verify_object("s3://verify/plain", len(DATA), DIGEST, s3_client=s3)
    assert ok.status == "ok" and ok.observed_sha256 == DIGEST  # read and hashed
    assert verify_object("s3://verify/plain", len(DATA) - 1, DIGEST, s3_client=s3).status \
        == "size_mismatch"
    assert verify_object("s3://verify/absent", 3, s3_client=s3).status == "object_missing"
    assert verify_object("s3://verify/plain", len(DATA), "1" * 64, s3_client=s3).status \
        == "digest_mismatch"
    assert verify_object("s3://verify/plain", len(DATA), "1" * 64, s3_client=s3,
                         full_hash_max_bytes=10).status == "storage_unverified"  # opted out


def test_it_uses_the_stored_s3_checksum_without_reading_the_object(s3_server):
    _, s3 = s3_server
    s3.create_bucket(Bucket="checksum")
    s3.put_object(Bucket="checksum", Key="k", Body=DATA, ChecksumAlgorithm="SHA256",
                  ChecksumSHA256=base64.b64encode(bytes.fromhex(DIGEST)).decode())
    # full_hash_max_bytes=0 forbids reading: only the stored ChecksumSHA256 can decide
    good = verify_object("s3://checksum/k", len(DATA), DIGEST, s3_client=s3, full_hash_max_bytes=0)
    assert good.status == "ok" and "ChecksumSHA256" in good.detail
    bad = verify_object("s3://checksum/k", len(DATA), "2" * 64, s3_client=s3, full_hash_max_bytes=0)
    assert bad.status == "digest_mismatch" and bad.observed_sha256 == DIGEST


def test_it_discovers_a_manifest_written_to_a_bucket_by_listing(s3_server):
    _, s3 = s3_server
    s3.create_bucket(Bucket="ckpts")
    m = {"schema_revision": 1, "generation_id": "g7", "update": 7, "run_id": "r"}
    uri = write_manifest_atomically("s3://ckpts/runs/r", m, s3_client=s3)
    assert uri == f"s3://ckpts/runs/r/g7/{MANIFEST_NAME}"
    s3.put_object(Bucket="ckpts", Key="runs/r/g8/__0_0.distcp", Body=b"x")  # uncommitted
    assert list_manifests("s3://ckpts/runs/r", s3_client=s3) == [uri]
    assert list_manifests("s3://ckpts/runs/r/", s3_client=s3) == [uri]
    assert list_manifests("s3://ckpts/other", s3_client=s3) == []
    assert read_manifest(uri, s3_client=s3) == m
    with pytest.raises(ManifestConflictError):
        write_manifest_atomically("s3://ckpts/runs/r", {**m, "update": 8}, s3_client=s3)


def test_it_tells_transient_from_permanent_s3_errors(s3_server):
    dead = make_s3_client("http://127.0.0.1:9", access_key_id="a", secret_access_key="b",
                          connect_timeout=0.5, max_attempts=1)
    with pytest.raises(TransientStorageError):
        verify_object("s3://verify/plain", 1, s3_client=dead)
    _, s3 = s3_server
    with pytest.raises(PermanentStorageError):
        read_manifest("s3://no-such-bucket-here/x/" + MANIFEST_NAME, s3_client=s3)
