"""Every digest checked whatever the size (recoverydash.checkpoints.objects): a large file read
in full in bounded memory, the opt-out that leaves an object unverified, the deadline that
scales with the size, the verification progress figure, and full-object checksums S3 stores
compared from a HEAD without reading the object (moto's server mode where it stores them, botocore
Stubber answers where it does not)."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import zlib

import pytest

from recoverydash.checkpoints.objects import (
    CHUNK_BYTES,
    VerificationProgress,
    hash_time_allowed_s,
    manifest_checksums,
    match_stored_checksum,
    stored_checksums,
    verification_progress,
    verify_object,
)

MiB = 1024 * 1024


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _crc32(data: bytes) -> str:
    return _b64(zlib.crc32(data).to_bytes(4, "big"))


def test_a_file_over_the_old_256_mib_limit_is_hashed_in_full_and_a_flipped_byte_is_seen(
        tmp_path):
    big = tmp_path / "shard.bin"
    size = 300 * MiB
    with open(big, "wb") as f:  # sparse: 300 MiB of zeros to hash, nothing on disk
        f.truncate(size)
    digest = hashlib.sha256(b"\0" * size).hexdigest()
    seen = []
    ok = verify_object(f"file://{big}", size, digest, progress=seen.append)
    assert (ok.status, ok.observed_sha256, ok.checked) == ("ok", digest, "sha256")
    assert sum(seen) == size and max(seen) == CHUNK_BYTES  # read in 1 MiB pieces
    with open(big, "r+b") as f:  # one byte flipped after commit, the size kept
        f.seek(200 * MiB)
        f.write(b"\x01")
    bad = verify_object(f"file://{big}", size, digest)
    assert bad.status == "digest_mismatch"
    assert bad.detail == "sha256 of the file differs from the manifest's"
    # the explicit opt-out never says ok: the object is not verified
    skipped = verify_object(f"file://{big}", size, digest, full_hash_max_bytes=256 * MiB)
    assert skipped.status == "storage_unverified" and not skipped.ok
    # deferred to a task of its own: pending, nothing read
    later = verify_object(f"file://{big}", size, digest, read_inline_max_bytes=64 * MiB)
    assert (later.status, later.deferred, later.observed_sha256) == ("pending", True, None)


def test_the_time_allowed_scales_with_the_size():
    assert hash_time_allowed_s(0) == 60.0
    assert hash_time_allowed_s(512 * MiB) == 60.0 + 512 * MiB / 20e6
    assert hash_time_allowed_s(10**12, base_s=30, min_bytes_per_s=1e9) == 1030.0
    with pytest.raises(ValueError):
        hash_time_allowed_s(-1)


def test_verification_progress_counts_objects_and_bytes():
    gb = 10**9
    assert VerificationProgress(37, 64, 210 * gb, 512 * gb).text() == \
        "verifying: 37 of 64 objects, 210 GB of 512 GB"
    rows = [(8 * gb, "ok", 0), (8 * gb, "digest_mismatch", 0), (8 * gb, "pending", 3 * gb),
            (8 * gb, "error", 0), (None, "pending", 5)]
    p = verification_progress(rows)
    assert (p.objects_checked, p.objects_total, p.bytes_checked, p.bytes_total, p.done) == \
        (2, 5, 19 * gb, 32 * gb, False)
    assert p.text() == "verifying: 2 of 5 objects, 19 GB of 32 GB"
    done = verification_progress([(1280, "ok", 0), (256, "size_mismatch", 7)])
    assert done.done and done.text() == "verified: 2 of 2 objects, 1.5 kB"
    assert verification_progress([]).to_dict() == {
        "objects_checked": 0, "objects_total": 0, "bytes_checked": 0, "bytes_total": 0,
        "done": True, "text": "verified: 0 of 0 objects, 0 bytes"}


def test_stored_and_manifest_checksums_are_matched_strongest_first():
    sha = hashlib.sha256(b"x").digest()
    head = {"ChecksumCRC32": _b64(b"\1\2\3\4"), "ChecksumCRC64NVME": _b64(b"\0" * 8),
            "ChecksumSHA256": _b64(sha) + "-3"}  # a composite value is left out
    assert stored_checksums(head) == {"crc32": b"\1\2\3\4", "crc64nvme": b"\0" * 8}
    assert stored_checksums({**head, "ChecksumType": "COMPOSITE"}) == {}
    given = manifest_checksums(sha.hex(), {"crc32": _b64(b"\1\2\3\4"), "md5": "x",
                                           "crc32c": "not base64!", "sha256": _b64(b"\0" * 32)})
    assert given == {"crc32": b"\1\2\3\4", "sha256": sha}  # the manifest's sha256 wins
    assert match_stored_checksum(stored_checksums(head), given) == ("crc32", True)
    assert match_stored_checksum({"crc64nvme": b"\0" * 8}, {"crc64nvme": b"\1" * 8}) == \
        ("crc64nvme", False)
    assert match_stored_checksum({"crc32c": b"\0" * 4}, given) is None


# --- S3: moto's server mode -----------------------------------------------------------------------

DATA = os.urandom(3000)
DIGEST = hashlib.sha256(DATA).hexdigest()


def test_a_full_object_crc32_s3_stores_decides_from_a_head(s3_server):
    _, s3 = s3_server
    s3.create_bucket(Bucket="crc")
    s3.put_object(Bucket="crc", Key="k", Body=DATA, ChecksumAlgorithm="CRC32",
                  ChecksumCRC32=_crc32(DATA))
    # full_hash_max_bytes=0 forbids reading: only what S3 stores can decide
    ok = verify_object("s3://crc/k", len(DATA), DIGEST, s3_client=s3, full_hash_max_bytes=0,
                       checksums={"crc32": _crc32(DATA)})
    assert (ok.status, ok.checked, ok.observed_sha256) == ("ok", "crc32", None)
    assert ok.detail == (f"size {len(DATA)} and the full-object CRC32 stored by S3 "
                         "(ChecksumCRC32) match the manifest's")
    bad = verify_object("s3://crc/k", len(DATA), DIGEST, s3_client=s3, full_hash_max_bytes=0,
                        checksums={"crc32": _crc32(DATA + b"!")})
    assert bad.status == "digest_mismatch"
    # a manifest without checksums: the object is read and hashed
    read = verify_object("s3://crc/k", len(DATA), DIGEST, s3_client=s3)
    assert (read.status, read.checked, read.observed_sha256) == ("ok", "sha256", DIGEST)
    assert verify_object("s3://crc/k", len(DATA), DIGEST, s3_client=s3,
                         full_hash_max_bytes=0).status == "storage_unverified"


def test_a_multipart_upload_with_a_full_object_crc32_is_verified_from_a_head(s3_server):
    _, s3 = s3_server
    s3.create_bucket(Bucket="multi")
    parts = [os.urandom(5 * MiB), os.urandom(1000)]
    whole = b"".join(parts)
    up = s3.create_multipart_upload(Bucket="multi", Key="big", ChecksumAlgorithm="CRC32",
                                    ChecksumType="FULL_OBJECT")
    done = []
    for n, part in enumerate(parts, 1):
        r = s3.upload_part(Bucket="multi", Key="big", UploadId=up["UploadId"], PartNumber=n,
                           Body=part, ChecksumAlgorithm="CRC32")
        done.append({"PartNumber": n, "ETag": r["ETag"], "ChecksumCRC32": r["ChecksumCRC32"]})
    s3.complete_multipart_upload(Bucket="multi", Key="big", UploadId=up["UploadId"],
                                 ChecksumCRC32=_crc32(whole), ChecksumType="FULL_OBJECT",
                                 MultipartUpload={"Parts": done})
    digest = hashlib.sha256(whole).hexdigest()
    ok = verify_object("s3://multi/big", len(whole), digest, s3_client=s3,
                       full_hash_max_bytes=0, checksums={"crc32": _crc32(whole)})
    assert (ok.status, ok.checked) == ("ok", "crc32")


# --- S3: recorded answers (botocore Stubber) ------------------------------------------------------

@pytest.fixture
def stubbed():
    boto3 = pytest.importorskip("boto3")
    from botocore.stub import Stubber

    client = boto3.client("s3", region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing")
    with Stubber(client) as stub:
        yield client, stub
        stub.assert_no_pending_responses()


def _head(stub, **fields):
    stub.add_response("head_object", {"ContentLength": len(DATA), **fields},
                      {"Bucket": "b", "Key": "k", "ChecksumMode": "ENABLED"})


def test_a_full_object_crc64nvme_or_crc32c_decides_without_a_get(stubbed):
    client, stub = stubbed
    crc64 = _b64(b"\x12" * 8)
    _head(stub, ChecksumCRC64NVME=crc64, ChecksumType="FULL_OBJECT")
    ok = verify_object("s3://b/k", len(DATA), DIGEST, s3_client=client,
                       checksums={"crc64nvme": crc64, "crc32": _crc32(DATA)})
    assert (ok.status, ok.checked) == ("ok", "crc64nvme")  # no get_object answer was recorded
    _head(stub, ChecksumCRC32C=_b64(b"\1\1\1\1"), ChecksumType="FULL_OBJECT")
    bad = verify_object("s3://b/k", len(DATA), DIGEST, s3_client=client,
                        checksums={"crc32c": _b64(b"\2\2\2\2")})
    assert bad.status == "digest_mismatch"
    assert bad.detail == ("the full-object CRC32C stored by S3 (ChecksumCRC32C) differs from the "
                          "manifest's checksums")


def test_a_composite_multipart_checksum_is_not_used_and_the_object_is_read(stubbed):
    from botocore.response import StreamingBody

    client, stub = stubbed
    _head(stub, ChecksumCRC32=_b64(b"\1\2\3\4") + "-3", ChecksumType="COMPOSITE")
    stub.add_response("get_object", {"Body": StreamingBody(io.BytesIO(DATA), len(DATA)),
                                     "ContentLength": len(DATA)},
                      {"Bucket": "b", "Key": "k", "Range": f"bytes=0-{len(DATA)}"})
    ok = verify_object("s3://b/k", len(DATA), DIGEST, s3_client=client,
                       checksums={"crc32": _b64(b"\1\2\3\4")})
    assert (ok.status, ok.checked, ok.observed_sha256) == ("ok", "sha256", DIGEST)


def test_upload_file_declares_a_full_object_checksum_the_worker_compares_from_a_head(
        s3_server, tmp_path):
    from recoverydash.checkpoints.objects import upload_file

    _, s3 = s3_server
    s3.create_bucket(Bucket="upload")
    small = tmp_path / "small.bin"
    small.write_bytes(DATA)
    up = upload_file("s3://upload/g/small.bin", str(small), s3_client=s3)
    assert up == (len(DATA), DIGEST) and up.checksums == {"sha256": _b64(bytes.fromhex(DIGEST))}
    # over the single-PUT limit: a multipart upload with a full-object CRC32
    data = os.urandom(11 * MiB)
    big = tmp_path / "big.bin"
    big.write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    up = upload_file("s3://upload/g/big.bin", str(big), s3_client=s3,
                     single_put_max_bytes=5 * MiB, part_bytes=5 * MiB)
    assert up == (len(data), digest) and up.checksums == {"crc32": _crc32(data)}
    head = s3.head_object(Bucket="upload", Key="g/big.bin", ChecksumMode="ENABLED")
    assert (head["ChecksumType"], head["ChecksumCRC32"]) == ("FULL_OBJECT", _crc32(data))
    ok = verify_object("s3://upload/g/big.bin", len(data), digest, s3_client=s3,
                       checksums=up.checksums, full_hash_max_bytes=0)
    assert (ok.status, ok.checked) == ("ok", "crc32")
