"""The SDK pays no second read (issue 28): ``save_generation`` records the digest of each file
as DCP writes it, never reading a file back; what it records is the digest of the file as it is
in storage; a stream moved backwards is read instead of trusted."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import zlib

import pytest

torch = pytest.importorskip("torch")

from recoverydash.sdk import hashing, publish  # noqa: E402
from recoverydash.sdk.checkpoint import save_generation  # noqa: E402


def stored_digest(path: str) -> tuple[int, str]:
    with open(path, "rb") as f:
        data = f.read()
    return len(data), hashlib.sha256(data).hexdigest()


def test_save_generation_describes_each_file_without_reading_it_back(tmp_path, monkeypatch):
    def no_read(*a, **kw):
        raise AssertionError("a file was read back")

    monkeypatch.setattr(publish, "read_digest", no_read)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Linear(64, 4))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 32)).sum().backward()
    opt.step()
    manifest = save_generation(str(tmp_path), "g1", 1,
                               state={"model": model.state_dict(),
                                      "optimizer": opt.state_dict()},
                               rank_state={"scheduler": {"last_epoch": 1}})
    assert manifest is not None
    names = sorted(o["uri"].split("/g1/")[1] for o in manifest["objects"])
    assert names == ["data_progress/rank0.json", "model/.metadata", "model/__0_0.distcp",
                     "optimizer/.metadata", "optimizer/__0_0.distcp", "rng/rank0.pt",
                     "scheduler/rank0.pt"]
    for o in manifest["objects"]:
        assert (o["size"], o["sha256"]) == stored_digest(o["uri"][len("file://"):])
        assert "checksums" not in o  # a folder: no S3 checksum to record


def test_a_writer_that_moves_back_gives_no_digest_and_the_file_is_read(tmp_path):
    raw = open(tmp_path / "f", "wb")  # noqa: SIM115 - closed by the writer
    w = hashing.HashingWriter(raw)
    w.write(b"abcdef")
    assert w.digest() == hashing.digest_bytes(b"abcdef")
    assert w.digest().crc32 == base64.b64encode(zlib.crc32(b"abcdef").to_bytes(4, "big")).decode()
    w.seek(2)
    w.write(b"XY")
    assert w.digest() is None
    w.close()
    assert hashing.read_digest(str(tmp_path / "f")) == hashing.digest_bytes(b"abXYef")


def test_torch_save_through_the_writer_hashes_what_lands_in_the_file(tmp_path):
    path = tmp_path / "t.pt"
    with open(path, "wb") as raw:
        w = hashing.HashingWriter(raw)
        buffered = io.BufferedWriter(w)
        torch.save({"x": torch.arange(1000)}, buffered)
        buffered.flush()
        digest = w.digest()
    assert digest is not None
    assert (digest.size, digest.sha256) == stored_digest(str(path))
    assert digest == hashing.read_digest(str(path))
    assert os.path.getsize(path) == digest.size
