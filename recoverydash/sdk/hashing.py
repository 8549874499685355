"""Hashing the bytes of a checkpoint as they are written: the SDK pays no second read.

``save_generation`` lets ``torch.distributed.checkpoint`` write each component through
``hashing_filesystem()`` (a ``FileSystem`` of DCP's ``FileSystemWriter``): every stream DCP opens
for writing is wrapped in ``HashingWriter``, which updates a sha256, a CRC32 (the full-object
checksum a multipart S3 upload declares, ``recoverydash.checkpoints.objects.upload_file``) and a
byte count with each block on its way to the file. The manifest then records the digest of the
bytes as they went to storage, and nothing is read back.

What it cannot hash, it says: a stream that was moved backwards (``seek`` to before its end:
the bytes already hashed could be overwritten) gives no digest, and the caller reads that file
(``written`` answers None). DCP 2.x writes each file front to back; the fallback covers a
writer that would not. ``Digest`` is also what ``digest_bytes`` gives for bytes held in memory
(the per-rank ``torch.save`` files).
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import io
import os
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Digest:
    """What was written: ``size`` (bytes), ``sha256`` (hex) and ``crc32`` (base64 of the 4
    big-endian bytes, as S3 writes ``ChecksumCRC32``; ``""`` when it was not computed: a file
    that goes to no S3 upload needs none)."""

    size: int
    sha256: str
    crc32: str


def _crc32_b64(crc: int) -> str:
    return base64.b64encode((crc & 0xFFFFFFFF).to_bytes(4, "big")).decode()


def digest_bytes(data: bytes) -> Digest:
    """The ``Digest`` of bytes held in memory."""
    return Digest(len(data), hashlib.sha256(data).hexdigest(), _crc32_b64(zlib.crc32(data)))


def read_digest(path: str, chunk: int = 8 * 1024 * 1024) -> Digest:
    """The ``Digest`` of a file, read once (sha256 and CRC32 from the same reads), in pieces of
    ``chunk`` bytes: for bytes another program wrote. Raises OSError."""
    sha, crc, size = hashlib.sha256(), 0, 0
    buf = bytearray(chunk)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while got := f.readinto(view):
            part = view[:got]
            sha.update(part)
            crc = zlib.crc32(part, crc)
            size += got
    return Digest(size, sha.hexdigest(), _crc32_b64(crc))


class HashingWriter(io.RawIOBase):
    """A writable stream that hashes every byte it passes to ``raw`` (module doc): sha256, and
    CRC32 with ``crc32``. ``digest()`` is None when the stream was moved backwards."""

    def __init__(self, raw: Any, crc32: bool = True) -> None:
        super().__init__()
        self.raw = raw
        self._with_crc = crc32
        self._sha = hashlib.sha256()
        self._crc = 0
        self._size = 0
        self._intact = True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return bool(self.raw.seekable())

    def write(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        written = self.raw.write(view)
        n = len(view) if written is None else int(written)
        part = view[:n]
        self._sha.update(part)
        if self._with_crc:
            self._crc = zlib.crc32(part, self._crc)
        self._size += n
        return n

    def tell(self) -> int:
        return int(self.raw.tell())

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        at = int(self.raw.seek(offset, whence))
        if at != self._size:  # anywhere but the end of what was written: not hashable here
            self._intact = False
        return at

    def fileno(self) -> int:
        return int(self.raw.fileno())

    def flush(self) -> None:
        if not self.raw.closed:
            self.raw.flush()

    def close(self) -> None:
        if not self.closed:
            super().close()
            self.raw.close()

    def digest(self) -> Digest | None:
        if not self._intact:
            return None
        return Digest(self._size, self._sha.hexdigest(),
                      _crc32_b64(self._crc) if self._with_crc else "")


class _Digests:
    """Path -> ``Digest`` of what a ``HashingFileSystem`` wrote (None: not hashable), kept
    across DCP's renames; thread-safe (DCP may write from several threads)."""

    def __init__(self) -> None:
        self._by_path: dict[str, Digest | None] = {}
        self._lock = threading.Lock()

    def put(self, path: str, digest: Digest | None) -> None:
        with self._lock:
            self._by_path[path] = digest

    def move(self, path: str, new_path: str) -> None:
        with self._lock:
            if path in self._by_path:
                self._by_path[new_path] = self._by_path.pop(path)

    def drop(self, path: str) -> None:
        with self._lock:
            self._by_path.pop(path, None)

    def get(self, path: str) -> Digest | None:
        with self._lock:
            return self._by_path.get(path)


@functools.cache
def hashing_filesystem(crc32: bool = True) -> type:
    """``HashingFileSystem``: DCP's local ``FileSystem`` whose write streams are
    ``HashingWriter``s; its ``digests`` (``_Digests``) maps each file's path, after DCP's
    renames (``.metadata.tmp`` to ``.metadata``), to its ``Digest``. Made on first use: the
    SDK's base install has no torch."""
    from torch.distributed.checkpoint.filesystem import FileSystem

    class HashingFileSystem(FileSystem):
        def __init__(self) -> None:
            super().__init__()
            self.digests = _Digests()

        @contextlib.contextmanager
        def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[Any]:
            if not any(m in mode for m in "wa+"):
                with super().create_stream(path, mode) as stream:
                    yield stream
                return
            with super().create_stream(path, mode) as stream:
                writer = HashingWriter(stream, crc32)
                try:
                    yield writer
                finally:  # a stream appended to or read back is not hashed here
                    whole = "a" not in mode and "+" not in mode
                    self.digests.put(os.fspath(path), writer.digest() if whole else None)

        def rename(self, path: str | os.PathLike[str],
                   new_path: str | os.PathLike[str]) -> None:
            super().rename(path, new_path)
            self.digests.move(os.fspath(path), os.fspath(new_path))

        def rm_file(self, path: str | os.PathLike[str]) -> None:
            super().rm_file(path)
            self.digests.drop(os.fspath(path))

    return HashingFileSystem


def hashing_writer(folder: str, crc32: bool = True) -> Any:
    """A DCP ``FileSystemWriter`` for ``folder`` (DCP's defaults, as ``dcp.save(...,
    checkpoint_id=folder)`` makes it) that hashes what it writes (sha256; CRC32 with ``crc32``,
    for a file an S3 upload takes next): its ``fs`` is a ``hashing_filesystem(crc32)``;
    ``written(writer, path)`` reads a file's digest back."""
    from torch.distributed.checkpoint import FileSystemWriter

    writer = FileSystemWriter(folder)
    writer.fs = hashing_filesystem(crc32)()
    return writer


def written(writer: Any, path: str) -> Digest | None:
    """The digest of the file ``writer`` (``hashing_writer``) wrote at ``path``; None when it
    did not write it or could not hash it (the caller reads the file)."""
    digests = getattr(getattr(writer, "fs", None), "digests", None)
    return digests.get(os.fspath(path)) if isinstance(digests, _Digests) else None


__all__ = ["Digest", "HashingWriter", "digest_bytes", "hashing_filesystem", "hashing_writer",
           "read_digest", "written"]
