"""Checkpoint storage access with no Django: object verification and manifest publication.

Shared by the trainer SDK (``recoverydash.sdk``) and the server's Celery workers. Pure functions
over two URI schemes, plus a boto3 client factory; nothing here imports Django or Celery, and boto3
is imported only when an ``s3://`` URI is touched.

URIs
    ``s3://bucket/key`` and ``file:///abs/path``. A *location* (where generations live) is a folder
    (``file:///abs/dir``, or a plain absolute path) or an S3 prefix (``s3://bucket/prefix``).

Layout of a location (decided here, used by the SDK and the server's manifest discovery)::

    <location>/<generation_id>/recoverydash-manifest.json      # the commit marker
    <location>/<generation_id>/...                              # the generation's objects

The manifest document is the manifest of docs/ingest-v1.md#checkpoint_committed (``schema_revision``
1, ``generation_id``, ``update``, ``world_size``, ``required_shards``, ``components``, ``objects``,
``data_progress``, ``dataset_version``, ``config_digest``, ``committed_at``) plus the extra fields
``run_id`` and ``attempt`` (and, when the writer knows it, ``required_components``). Its presence is
the commit: readers enumerate manifests, never raw generation folders.

Errors
    ``verify_object`` reports what it saw as an ``ObjectCheck`` status; it raises only when it could
    not look: ``TransientStorageError`` for what may pass (network, 5xx, throttling, timeouts;
    retry later) and ``PermanentStorageError`` for what will not (access denied, bad credentials,
    malformed URI or bucket). Both derive from ``StorageError``.
"""

from __future__ import annotations

import base64
import binascii
import errno
import hashlib
import json
import os
import tempfile
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

from recoverydash.checkpoints import paths
from recoverydash.recovery.inputs import same_manifest

MANIFEST_NAME = "recoverydash-manifest.json"
"""File name of the commit marker inside ``<location>/<generation_id>/``."""

CHUNK_BYTES = 1024 * 1024
"""Bytes read (and hashed) at a time: the memory one digest being read holds, whatever the
object's size."""

STATUSES = ("ok", "object_missing", "size_mismatch", "digest_mismatch", "storage_unverified",
            "object_outside_locations")


class StorageError(Exception):
    """Storage could not be read; see the two subclasses."""


class TransientStorageError(StorageError):
    """An error that may pass: network failure, timeout, HTTP 5xx, throttling. Retry later."""


class PermanentStorageError(StorageError):
    """An error that retrying will not fix: access denied, no credentials, malformed URI."""


class ManifestConflictError(StorageError):
    """A different manifest is already published for this generation (``manifest_conflict``).

    A second coordinator must verify the published manifest, never overwrite it."""


@dataclass(frozen=True)
class ObjectCheck:
    """What storage says about one object.

    status: one of ``STATUSES`` (``object_outside_locations`` is the server's, for a URI under
    none of the project's storage locations: never looked at). detail: a sentence for humans,
    which never states an observed size or digest of an object that fails. observed_size:
    bytes, or None when the object is missing or unverifiable. observed_sha256: 64 hex chars
    when a digest was obtained
    (from the S3 ``ChecksumSHA256`` or by reading the bytes), else None. ``ok`` with
    ``observed_sha256`` None means either that the manifest gives no sha256 (size only) or that
    a full-object CRC S3 stores with the object matched the manifest's ``checksums`` (``checked``
    says which: ``"size"``, ``"sha256"`` or the CRC's name, e.g. ``"crc32"``). ``deferred``:
    status ``pending``, the size matched and the digest must still be read, which the caller
    asked to do elsewhere (``read_inline_max_bytes``).
    """

    status: str
    detail: str
    observed_size: int | None = None
    observed_sha256: str | None = None
    timed_out: bool = False  # storage_unverified because the caller's deadline passed
    checked: str = ""
    deferred: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class ParsedURI:
    """``scheme`` is ``"s3"``, ``"file"`` or another scheme; ``bucket``/``key`` for s3, ``path`` for
    file (absolute, no trailing slash kept except for ``/``)."""

    scheme: str
    bucket: str = ""
    key: str = ""
    path: str = ""


def parse_uri(uri: str) -> ParsedURI:
    """Split ``s3://bucket/key``, ``file:///abs/path`` (or a plain absolute path, taken as file).

    Raises PermanentStorageError for an s3 URI without a bucket or a file URI with a host or a
    relative path. Other schemes come back with only ``scheme`` set."""
    if not isinstance(uri, str) or not uri:
        raise PermanentStorageError(f"expected a URI string, got {uri!r}")
    if uri.startswith("/"):
        return ParsedURI("file", path=os.path.normpath(uri))
    u = urlparse(uri)
    scheme = u.scheme.lower()
    if scheme == "s3":
        if not u.netloc:
            raise PermanentStorageError(f"s3 URI without a bucket: {uri!r}")
        return ParsedURI("s3", bucket=u.netloc, key=u.path.lstrip("/"))
    if scheme == "file":
        if u.netloc not in ("", "localhost"):
            raise PermanentStorageError(f"file URI with a host is not local: {uri!r}")
        path = unquote(u.path)
        if not path.startswith("/"):
            raise PermanentStorageError(f"file URI must hold an absolute path: {uri!r}")
        return ParsedURI("file", path=os.path.normpath(path))
    return ParsedURI(scheme)


def join_uri(location: str, *parts: str) -> str:
    """``location`` + ``/`` + parts, keeping the scheme (plain paths become ``file://`` URIs)."""
    p = parse_uri(location)
    tail = "/".join(s.strip("/") for s in parts if s)
    if p.scheme == "file":
        return "file://" + os.path.join(p.path, tail) if tail else "file://" + p.path
    if p.scheme == "s3":
        key = "/".join(s for s in (p.key.rstrip("/"), tail) if s)
        return f"s3://{p.bucket}/{key}"
    return location.rstrip("/") + "/" + tail


def resolve_location(location: str) -> str:
    """A location as storage takes it: a relative folder (no scheme, not absolute, e.g.
    ``ckpt`` or ``./runs/a``) is resolved against the current working directory; absolute folders,
    ``file://`` and ``s3://`` URIs pass unchanged. The caller's string is not rewritten anywhere
    else: only the object URIs of a manifest, which the server must be able to verify, are
    absolute. Raises StorageError for a location that is not a non-empty string."""
    if not isinstance(location, str) or not location:
        raise StorageError(f"expected a folder or URI, got {location!r}")
    if "://" in location or location.startswith("/"):
        return location
    return os.path.abspath(location)


def file_uri(path: str) -> str:
    """``file://`` URI of a local path (made absolute)."""
    return "file://" + os.path.abspath(path)


def make_s3_client(endpoint_url: str | None = None, region: str | None = None,
                   access_key_id: str | None = None, secret_access_key: str | None = None,
                   *, connect_timeout: float = 5.0, read_timeout: float = 30.0,
                   max_attempts: int = 3, role_arn: str | None = None,
                   external_id: str | None = None, session_token: str | None = None,
                   only_given: bool = False) -> Any:
    """A boto3 S3 client. Unset arguments fall back to boto3's usual chain (environment, profile).

    Timeouts are seconds. Path-style addressing is used when ``endpoint_url`` is given (MinIO, moto,
    on-premise gateways). ``role_arn``: the client acts as that role (STS ``AssumeRole`` with the
    given keys, or the usual chain, as the source; ``external_id`` when the role demands one).
    ``only_given``: nothing comes from the environment or configuration files: without keys (or
    a role assumed with keys) PermanentStorageError is raised instead of falling back to the
    usual chain, and endpoints configured in the environment (``AWS_ENDPOINT_URL*``) are
    ignored. Raises PermanentStorageError when boto3 is not installed."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError as e:  # the trainer side installs boto3 only with the s3 extra
        raise PermanentStorageError(
            "boto3 is required for s3:// URIs: pip install 'recoverydash[s3]'") from e
    if only_given and not (access_key_id and secret_access_key):
        raise PermanentStorageError("no credentials: the storage location has no keys and does "
                                    "not allow the server's own (ambient) credentials")
    cfg = Config(connect_timeout=connect_timeout, read_timeout=read_timeout,
                 retries={"max_attempts": max_attempts, "mode": "standard"},
                 s3={"addressing_style": "path"} if endpoint_url else None,
                 ignore_configured_endpoint_urls=only_given)
    session = boto3.session.Session(aws_access_key_id=access_key_id or None,
                                    aws_secret_access_key=secret_access_key or None,
                                    aws_session_token=session_token or None,
                                    region_name=region or "us-east-1")
    if role_arn:
        sts_kw = {"config": cfg}
        if endpoint_url and only_given:
            sts_kw["endpoint_url"] = endpoint_url  # an on-premise STS beside the store
        try:
            kw = {"RoleArn": role_arn, "RoleSessionName": "recoverydash-verify",
                  "DurationSeconds": 900}
            if external_id:
                kw["ExternalId"] = external_id
            creds = session.client("sts", **sts_kw).assume_role(**kw)["Credentials"]
        except Exception as e:
            raise s3_error(e, f"AssumeRole {role_arn}") from e
        session = boto3.session.Session(aws_access_key_id=creds["AccessKeyId"],
                                        aws_secret_access_key=creds["SecretAccessKey"],
                                        aws_session_token=creds["SessionToken"],
                                        region_name=region or "us-east-1")
    return session.client("s3", endpoint_url=endpoint_url, config=cfg)


# --- error classification ---------------------------------------------------------------------

_TRANSIENT_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout",
                    "RequestTimeoutException", "InternalError", "ServiceUnavailable",
                    "RequestLimitExceeded", "TooManyRequestsException", "503", "500", "502", "504"}
_MISSING_CODES = {"404", "NoSuchKey", "NotFound", "NoSuchBucket"}


def s3_error(e: Exception, what: str) -> StorageError:
    """The StorageError for a botocore exception raised while doing ``what`` (a sentence such as
    ``GET s3://b/k``): TransientStorageError for throttling, 5xx, 408/429, timeouts and connection
    failures (worth retrying), PermanentStorageError for other client errors and missing or
    invalid credentials. Missing objects are the caller's to handle first (:func:`is_missing`).
    Public: the format adapters' S3 listing and ranged reads use it too."""
    try:
        from botocore import exceptions as bx
    except ImportError:  # pragma: no cover
        return TransientStorageError(f"{what}: {e}")
    if isinstance(e, bx.ClientError):
        err = e.response.get("Error", {})
        code = str(err.get("Code", ""))
        status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        said = f"{what}: {code or status} {err.get('Message', '')}".strip()
        if code in _TRANSIENT_CODES or status >= 500 or status in (408, 429):
            return TransientStorageError(said)
        return PermanentStorageError(said)
    if isinstance(e, (bx.NoCredentialsError, bx.PartialCredentialsError, bx.ParamValidationError,
                      bx.NoRegionError)):
        return PermanentStorageError(f"{what}: {e}")
    if isinstance(e, (bx.HTTPClientError, bx.ConnectionError, bx.ReadTimeoutError,
                      bx.ConnectTimeoutError, OSError)):
        return TransientStorageError(f"{what}: {e}")
    return TransientStorageError(f"{what}: {type(e).__name__}: {e}")


def is_missing(e: Exception) -> bool:
    """True when a botocore exception says the object, key or bucket does not exist (a 404 or
    ``NoSuchKey`` / ``NotFound`` / ``NoSuchBucket``); False for anything else."""
    try:
        from botocore.exceptions import ClientError
    except ImportError:  # pragma: no cover
        return False
    if not isinstance(e, ClientError):
        return False
    code = str(e.response.get("Error", {}).get("Code", ""))
    status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code in _MISSING_CODES or status == 404


def _s3(s3_client: Any) -> Any:
    """``s3_client``, or a client made from the environment when it is None."""
    return s3_client if s3_client is not None else make_s3_client()


# --- verification -------------------------------------------------------------------------------

class _TimeUp(Exception):
    """The caller's deadline passed while hashing."""


Progress = Callable[[int], None]
"""Called with the number of bytes just hashed (a delta), after each piece."""


def _hash_stream(read: Callable[[int], bytes], chunk: int = CHUNK_BYTES, *,
                 limit: int | None = None, deadline: float | None = None,
                 progress: Progress | None = None) -> tuple[str, int]:
    """(sha256 hex, bytes read) of a stream read in ``chunk`` pieces (the memory held, whatever
    the stream's length); at most ``limit`` bytes are read (None: to the end), ``progress`` is
    called with each piece's length, and ``_TimeUp`` is raised once ``deadline``
    (``time.monotonic()``) has passed."""
    h = hashlib.sha256()
    n = 0
    while limit is None or n < limit:
        if deadline is not None and time.monotonic() > deadline:
            raise _TimeUp()
        b = read(chunk if limit is None else min(chunk, limit - n))
        if not b:
            break
        h.update(b)
        n += len(b)
        if progress is not None:
            progress(len(b))
    return h.hexdigest(), n


def sha256_file(path: str) -> tuple[str, int]:
    """(sha256 hex, size in bytes) of a local file, read in 1 MiB chunks. Raises OSError."""
    with open(path, "rb") as f:
        return _hash_stream(f.read)


def _time_up(size: int) -> ObjectCheck:
    return ObjectCheck("storage_unverified", f"size {size} matches; sha256 not checked: reading "
                                             "took longer than the time allowed", timed_out=True)


def hash_time_allowed_s(size: int, *, base_s: float = 60.0,
                        min_bytes_per_s: float = 20_000_000.0) -> float:
    """Seconds the digest of one object of ``size`` bytes may take to read: ``base_s`` (opening,
    a HEAD, a slow first byte) plus the object read at ``min_bytes_per_s`` (bytes per second),
    the slowest rate storage is expected to deliver. Scales with the size, so a single huge
    object gets a deadline it can meet; the worker gives each object's task this soft time
    limit. Raises ValueError for a negative size or a rate that is not above 0."""
    if size < 0 or not min_bytes_per_s > 0:
        raise ValueError(f"expected size >= 0 and a rate > 0, got {size!r}, {min_bytes_per_s!r}")
    return float(base_s) + size / float(min_bytes_per_s)


@dataclass(frozen=True)
class _Ask:
    """What one ``verify_object`` call checks and how (its keyword arguments)."""

    size: int
    sha256: str | None
    expected: dict[str, bytes]
    size_only: bool
    hash_max_bytes: int | None
    read_inline_max_bytes: int | None
    deadline: float | None
    progress: Progress | None


def _digest_verdict(expected: str | None, observed: str, size: int, how: str) -> ObjectCheck:
    if expected is not None and observed != expected.lower():
        # The observed digest is kept in the result, never in the sentence shown to people.
        return ObjectCheck("digest_mismatch", f"sha256 {how} differs from the manifest's",
                           size, observed)
    return ObjectCheck("ok", f"size {size} and sha256 {how} match" if expected else
                       f"size {size} matches; sha256 {how} (no expected digest)", size, observed,
                       checked="sha256")


def _before_reading(ask: _Ask, observed_size: int) -> ObjectCheck | None:
    """The answer when the size matched and nothing decides without reading: size only, no
    expected digest, over the caller's opt-out limit (``storage_unverified``: not verified,
    never an ``ok``), or a read the caller wants done elsewhere (``pending``, ``deferred``).
    None: read the bytes now."""
    if ask.size_only:
        return ObjectCheck("ok", f"size {ask.size} matches (digest not re-read)", observed_size,
                           checked="size")
    if ask.sha256 is None:
        return ObjectCheck("ok", f"size {ask.size} matches; sha256 not checked (no expected "
                                 "digest)", observed_size, checked="size")
    if ask.hash_max_bytes is not None and observed_size > ask.hash_max_bytes:
        return ObjectCheck("storage_unverified", f"size {ask.size} matches; sha256 not checked: "
                           f"the object is over the {ask.hash_max_bytes}-byte limit this check "
                           "was given (an opt-out), so it is not verified", observed_size)
    if ask.read_inline_max_bytes is not None and observed_size > ask.read_inline_max_bytes:
        return ObjectCheck("pending", f"size {ask.size} matches; its sha256 is read in a task "
                                      "of its own", observed_size, deferred=True)
    return None


def verify_object(uri: str, size: int, sha256: str | None = None, *, s3_client: Any = None,
                  root: str | None = None, deadline: float | None = None,
                  size_only: bool = False, checksums: dict[str, str] | None = None,
                  full_hash_max_bytes: int | None = None,
                  read_inline_max_bytes: int | None = None,
                  progress: Progress | None = None) -> ObjectCheck:
    """Check one object against its manifest entry: its size, then its sha256 read in full
    (streamed in ``CHUNK_BYTES`` pieces, whatever its size) unless S3 stores a full-object
    checksum the manifest also gives.

    uri: ``s3://bucket/key`` or ``file:///abs/path`` (other schemes: ``storage_unverified``).
    size: expected bytes. sha256: expected 64 hex chars, or None to check the size only.
    checksums: the manifest object's ``checksums`` (``{"sha256"|"crc32"|"crc32c"|"crc64nvme":
    base64}``, docs/ingest-v1.md#objects).

    S3: HEAD (``ChecksumMode=ENABLED``) for existence and size; the strongest full-object
    checksum S3 stores with the object that the manifest also gives (``ChecksumSHA256``
    against ``sha256``, then CRC64NVME, CRC32C, CRC32 against ``checksums``;
    :func:`match_stored_checksum`) decides without reading it; otherwise the object is read (a
    ranged GET of at most ``size + 1`` bytes, so an object that grew is seen without reading all
    of it) and hashed. File: opened with ``O_NONBLOCK`` and ``O_NOFOLLOW``; anything but a
    regular file (``fstat``: a FIFO, a device, a folder) is ``object_missing`` and never read;
    then the size, then a sha256 of at most ``size + 1`` bytes. With ``root`` (a folder, links
    already resolved) the file is opened beneath it one component at a time, refusing symbolic
    links (``paths.open_beneath``), so a path confined to ``root`` stays confined while it is
    opened.

    ``size_only`` skips digests (the re-check at the moment of a restore question).
    ``full_hash_max_bytes``: an explicit opt-out (None, the default: every digest is read): an
    object over it that no stored checksum decides is ``storage_unverified``, never ``ok``.
    ``read_inline_max_bytes``: an object over it whose digest must be read is answered
    ``pending`` with ``deferred`` set, unread (the worker reads it in a task of its own).
    ``progress``: called with each piece's length while a digest is read. ``deadline``
    (``time.monotonic()``): hashing stops when it passes, with ``storage_unverified`` saying so.

    Details never state an observed size or digest of an object that fails (they are in
    ``observed_size`` / ``observed_sha256`` for the caller). Returns ObjectCheck. Raises
    TransientStorageError (may pass: retry) or PermanentStorageError (access denied, bad
    credentials, malformed URI)."""
    p = parse_uri(uri)
    ask = _Ask(size, sha256.lower() if isinstance(sha256, str) and sha256 else None,
               manifest_checksums(sha256, checksums), size_only, full_hash_max_bytes,
               read_inline_max_bytes, deadline, progress)
    if p.scheme == "file":
        return _verify_file(p.path, ask, root)
    if p.scheme == "s3":
        return _verify_s3(_s3(s3_client), p.bucket, p.key, ask)
    return ObjectCheck("storage_unverified", f"scheme {p.scheme or '(none)'!r} cannot be verified")


#: errno values that may pass (a storage server or network file system having a bad moment).
_TRANSIENT_ERRNO = {errno.EIO, errno.ETIMEDOUT, errno.EAGAIN, errno.EINTR, errno.ENOMEM,
                    errno.EMFILE, errno.ENFILE, errno.EBUSY, errno.ENOLCK,
                    getattr(errno, "ESTALE", -1), getattr(errno, "EHOSTDOWN", -1),
                    getattr(errno, "ECONNRESET", -1), getattr(errno, "ENETDOWN", -1)}


def _os_error(e: OSError, what: str) -> StorageError:
    if e.errno in _TRANSIENT_ERRNO:
        return TransientStorageError(f"{what}: {e.strerror or e}")
    return PermanentStorageError(f"{what}: {e.strerror or e}")


def _open_file(path: str, root: str | None) -> int:
    if root is None:
        return paths.open_file(path)
    rest = paths.rest_under("file://" + path, "file://" + root)
    if rest is None:
        raise PermanentStorageError(f"{path} is not beneath {root}")
    return paths.open_beneath(root, rest)


def _open_checked(path: str, root: str | None) -> int | ObjectCheck:
    """A descriptor of the regular file at ``path``, or the ``object_missing`` answer."""
    try:
        return _open_file(path, root)
    except paths.NotARegularFile as e:
        return ObjectCheck("object_missing", f"{path} is {e}: never read as a checkpoint object")
    except (FileNotFoundError, NotADirectoryError):
        return ObjectCheck("object_missing", f"no file at {path}")
    except OSError as e:
        if e.errno == errno.ENAMETOOLONG:
            return ObjectCheck("object_missing", f"no file can have this name ({e.strerror})")
        if e.errno == errno.ELOOP:
            raise PermanentStorageError(f"open {path}: a symbolic link on the way (not "
                                        "followed)") from e
        raise _os_error(e, f"open {path}") from e


def _verify_file(path: str, ask: _Ask, root: str | None) -> ObjectCheck:
    fd = _open_checked(path, root)
    if isinstance(fd, ObjectCheck):
        return fd
    size = ask.size
    with os.fdopen(fd, "rb", buffering=0) as f:
        try:
            observed_size = os.fstat(f.fileno()).st_size
        except OSError as e:
            raise _os_error(e, f"stat {path}") from e
        if observed_size != size:
            return ObjectCheck("size_mismatch", f"the file's size differs from the manifest's "
                                                f"{size} bytes", observed_size)
        early = _before_reading(ask, observed_size)
        if early is not None:
            return early
        try:
            observed, n = _hash_stream(f.read, limit=size + 1, deadline=ask.deadline,
                                       progress=ask.progress)
        except _TimeUp:
            return _time_up(size)
        except OSError as e:
            raise _os_error(e, f"read {path}") from e
    if n != size:
        return ObjectCheck("size_mismatch", "the file changed while it was read (its size "
                                            f"differs from the manifest's {size} bytes)", n)
    return _digest_verdict(ask.sha256, observed, n, "of the file")


# --- checksums S3 stores with an object ----------------------------------------------------------

#: (name in a manifest's ``checksums``, HEAD field, digest bytes), strongest first.
CHECKSUM_FIELDS = (("sha256", "ChecksumSHA256", 32), ("crc64nvme", "ChecksumCRC64NVME", 8),
                   ("crc32c", "ChecksumCRC32C", 4), ("crc32", "ChecksumCRC32", 4))


def _b64_digest(value: object, length: int) -> bytes | None:
    """The bytes of a base64 digest of ``length`` bytes; None for anything else (a composite
    ``...-N`` value, bad base64, a wrong length)."""
    if not isinstance(value, str) or not value or "-" in value:
        return None
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if len(raw) == length else None


def stored_checksums(head: dict[str, Any]) -> dict[str, bytes]:
    """The full-object checksums an S3 HEAD (``ChecksumMode=ENABLED``) reports, ``{name: digest
    bytes}`` with the names of ``CHECKSUM_FIELDS``. A composite checksum (``ChecksumType``
    ``COMPOSITE``, or a value ending ``-<parts>``: a checksum of the parts' checksums of a
    multipart upload) says nothing about the whole object's bytes and is left out."""
    if str(head.get("ChecksumType") or "FULL_OBJECT").upper() == "COMPOSITE":
        return {}
    out = {}
    for name, field, length in CHECKSUM_FIELDS:
        raw = _b64_digest(head.get(field), length)
        if raw is not None:
            out[name] = raw
    return out


def manifest_checksums(sha256: str | None, checksums: object) -> dict[str, bytes]:
    """The checksums a manifest object gives, ``{name: digest bytes}``: its ``checksums`` (names
    of ``CHECKSUM_FIELDS``, base64 as S3 writes them; unknown names and malformed values left
    out) and its ``sha256`` (64 hex chars), which wins over ``checksums["sha256"]``."""
    out = {}
    if isinstance(checksums, dict):
        for name, _field, length in CHECKSUM_FIELDS:
            raw = _b64_digest(checksums.get(name), length)
            if raw is not None:
                out[name] = raw
    if isinstance(sha256, str):
        try:
            raw = bytes.fromhex(sha256)
        except ValueError:
            raw = b""
        if len(raw) == 32:
            out["sha256"] = raw
        else:
            out.pop("sha256", None)
    return out


def match_stored_checksum(stored: dict[str, bytes], expected: dict[str, bytes]
                          ) -> tuple[str, bool] | None:
    """``(name, equal)`` for the strongest checksum (``CHECKSUM_FIELDS`` order) that both S3
    stores (:func:`stored_checksums`) and the manifest gives (:func:`manifest_checksums`);
    None when they share none (the object must then be read)."""
    for name, _field, _length in CHECKSUM_FIELDS:
        if name in stored and name in expected:
            return name, stored[name] == expected[name]
    return None


def _stored_verdict(head: dict[str, Any], ask: _Ask, observed_size: int) -> ObjectCheck | None:
    """The answer from a checksum S3 stores with the object, None when none decides."""
    stored = stored_checksums(head)
    match = match_stored_checksum(stored, ask.expected)
    if match is None:
        return None
    name, equal = match
    field = dict((n, f) for n, f, _ in CHECKSUM_FIELDS)[name]
    if name == "sha256":
        return _digest_verdict(ask.expected["sha256"].hex(), stored["sha256"].hex(),
                               observed_size, f"stored by S3 ({field})")
    if not equal:
        return ObjectCheck("digest_mismatch", f"the full-object {name.upper()} stored by S3 "
                           f"({field}) differs from the manifest's checksums", observed_size)
    return ObjectCheck("ok", f"size {ask.size} and the full-object {name.upper()} stored by S3 "
                             f"({field}) match the manifest's", observed_size, checked=name)


def _verify_s3(client: Any, bucket: str, key: str, ask: _Ask) -> ObjectCheck:
    where = f"s3://{bucket}/{key}"
    size = ask.size
    try:
        head = client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    except Exception as e:  # botocore raises many types; classified below
        if is_missing(e):
            return ObjectCheck("object_missing", f"no object at {where}")
        raise s3_error(e, f"HEAD {where}") from e
    observed_size = int(head.get("ContentLength", -1))
    if observed_size != size:
        return ObjectCheck("size_mismatch", f"the object's size differs from the manifest's "
                                            f"{size} bytes", observed_size)
    if not ask.size_only:
        stored = _stored_verdict(head, ask, observed_size)
        if stored is not None:
            return stored
    early = _before_reading(ask, observed_size)
    if early is not None:
        return early
    if size == 0:
        return _digest_verdict(ask.sha256, hashlib.sha256(b"").hexdigest(), 0, "of the object")
    try:
        # At most size + 1 bytes: an object that grew since the HEAD is seen, not streamed whole.
        body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{size}")["Body"]
        try:
            observed, n = _hash_stream(body.read, limit=size + 1, deadline=ask.deadline,
                                       progress=ask.progress)
        finally:
            body.close()
    except _TimeUp:
        return _time_up(size)
    except Exception as e:
        if is_missing(e):
            return ObjectCheck("object_missing", f"object vanished while reading: {where}")
        raise s3_error(e, f"GET {where}") from e
    if n != size:
        return ObjectCheck("size_mismatch", "the object changed while it was read (its size "
                                            f"differs from the manifest's {size} bytes)", n)
    return _digest_verdict(ask.sha256, observed, n, "of the object")


# --- manifests ------------------------------------------------------------------------------------

def manifest_uri(location: str, generation_id: str) -> str:
    """``<location>/<generation_id>/recoverydash-manifest.json``."""
    return join_uri(location, generation_id, MANIFEST_NAME)


def list_manifests(location: str, *, s3_client: Any = None) -> list[str]:
    """URIs of every published manifest directly under ``location`` (one per generation folder).

    location: a folder (``file:///dir`` or ``/dir``) or an S3 prefix (``s3://bucket/prefix``).
    Returns manifest URIs sorted by generation folder name; a location that does not exist gives
    ``[]``. Raises TransientStorageError / PermanentStorageError when the listing fails."""
    p = parse_uri(location)
    if p.scheme == "file":
        try:
            names = sorted(os.listdir(p.path))
        except FileNotFoundError:
            return []
        except PermissionError as e:
            raise PermanentStorageError(f"list {p.path}: {e}") from e
        except OSError as e:
            raise TransientStorageError(f"list {p.path}: {e}") from e
        return [file_uri(os.path.join(p.path, n, MANIFEST_NAME)) for n in names
                if os.path.isfile(os.path.join(p.path, n, MANIFEST_NAME))]
    if p.scheme == "s3":
        return sorted(_list_s3_manifests(_s3(s3_client), p.bucket, p.key))
    raise PermanentStorageError(f"cannot list {location!r}: only s3:// and file:// locations")


def _list_s3_manifests(client: Any, bucket: str, prefix: str) -> Iterator[str]:
    prefix = prefix.rstrip("/") + "/" if prefix.strip("/") else ""
    token = None
    while True:
        kw: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
        if token:
            kw["ContinuationToken"] = token
        try:
            page = client.list_objects_v2(**kw)
        except Exception as e:
            if is_missing(e):
                return
            raise s3_error(e, f"LIST s3://{bucket}/{prefix}") from e
        for obj in page.get("Contents", ()):
            rest = obj["Key"][len(prefix):]
            parts = rest.split("/")
            if len(parts) == 2 and parts[1] == MANIFEST_NAME and parts[0]:
                yield f"s3://{bucket}/{obj['Key']}"
        if not page.get("IsTruncated"):
            return
        token = page.get("NextContinuationToken")


def read_manifest(uri: str, *, s3_client: Any = None) -> dict[str, Any]:
    """The manifest document at ``uri`` (a manifest file URI, not a location).

    Raises PermanentStorageError when it is missing or not a JSON object (a published manifest is
    immutable, so that will not pass), TransientStorageError when reading failed for a reason that
    may pass."""
    raw = read_bytes(uri, s3_client=s3_client)
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as e:
        raise PermanentStorageError(f"manifest {uri} is not JSON: {e}") from e
    if not isinstance(doc, dict):
        raise PermanentStorageError(f"manifest {uri} is not a JSON object")
    return doc


SMALL_OBJECT_MAX_BYTES = 64 * 1024 * 1024
"""The most ``read_bytes`` reads (manifests, per-rank state): a bigger object is refused."""


def read_bytes(uri: str, *, s3_client: Any = None,
               max_bytes: int = SMALL_OBJECT_MAX_BYTES) -> bytes:
    """Whole content of a small object (manifests, per-rank state), at most ``max_bytes``.

    A file is opened with ``O_NONBLOCK`` / ``O_NOFOLLOW`` and must be a regular file. Missing,
    not a regular file or over ``max_bytes``: PermanentStorageError; TransientStorageError for
    what may pass."""
    p = parse_uri(uri)
    if p.scheme == "file":
        try:
            fd = paths.open_file(p.path)
            with os.fdopen(fd, "rb") as f:
                data = f.read(max_bytes + 1)
        except paths.NotARegularFile as e:
            raise PermanentStorageError(f"read {p.path}: {e}") from e
        except (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError) as e:
            raise PermanentStorageError(f"read {p.path}: {e}") from e
        except OSError as e:
            raise _os_error(e, f"read {p.path}") from e
    elif p.scheme == "s3":
        client = _s3(s3_client)
        try:
            body = client.get_object(Bucket=p.bucket, Key=p.key,
                                     Range=f"bytes=0-{max_bytes}")["Body"]
            try:
                data = body.read(max_bytes + 1)
            finally:
                body.close()
        except Exception as e:
            if is_missing(e):
                raise PermanentStorageError(f"no object at {uri}") from e
            if getattr(e, "response", {}).get("Error", {}).get("Code") == "InvalidRange":
                return b""  # an empty object: no byte 0 to start a range at
            raise s3_error(e, f"GET {uri}") from e
    else:
        raise PermanentStorageError(f"cannot read {uri!r}: only s3:// and file:// URIs")
    if len(data) > max_bytes:
        raise PermanentStorageError(f"{uri} holds more than {max_bytes} bytes: not read whole")
    return data


def encode_manifest(manifest: dict[str, Any]) -> bytes:
    """Canonical bytes of a manifest: sorted keys, UTF-8, trailing newline."""
    return (json.dumps(manifest, sort_keys=True, indent=1, ensure_ascii=False) + "\n").encode()


def write_manifest_atomically(location: str, manifest: dict[str, Any], *,
                              s3_client: Any = None) -> str:
    """Publish ``manifest`` as ``<location>/<generation_id>/recoverydash-manifest.json``.

    This is the commit. Filesystem: write a temporary file in the same folder, fsync it, link it
    into place (atomic, and refuses to replace an existing manifest), fsync the folder. S3: one
    PUT with ``IfNoneMatch="*"`` (and a ChecksumSHA256), so readers see all of it or nothing.
    Publishing the same manifest again is a no-op (also with another ``committed_at``:
    :func:`same_manifest`; the copy in place stays); a different manifest already in place raises
    ManifestConflictError (a second coordinator verifies, never overwrites).

    Returns the manifest URI. Raises ManifestConflictError, TransientStorageError,
    PermanentStorageError, or ValueError when ``generation_id`` is missing or holds a ``/``."""
    gen = manifest.get("generation_id")
    if not isinstance(gen, str) or not gen or "/" in gen or gen in (".", ".."):
        raise ValueError(f"manifest needs a generation_id without '/', got {gen!r}")
    data = encode_manifest(manifest)
    uri = manifest_uri(location, gen)
    p = parse_uri(uri)
    if p.scheme == "file":
        return _write_file_atomically(p.path, data, uri)
    if p.scheme == "s3":
        return _put_s3_once(_s3(s3_client), p.bucket, p.key, data, uri)
    raise PermanentStorageError(f"cannot publish to {location!r}: only s3:// and file://")


def _same_manifest(existing: bytes, data: bytes) -> bool:
    try:
        return same_manifest(json.loads(existing), json.loads(data))
    except ValueError:
        return False


def _write_file_atomically(path: str, data: bytes, uri: str) -> str:
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix="." + MANIFEST_NAME + ".", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)          # atomic and never replaces an existing manifest
            except FileExistsError:
                with open(path, "rb") as f:
                    if _same_manifest(f.read(), data):
                        return uri
                raise ManifestConflictError(
                    f"a different manifest is already published at {uri}") from None
            except OSError:                 # filesystems without hard links
                if os.path.exists(path):
                    with open(path, "rb") as f:
                        if _same_manifest(f.read(), data):
                            return uri
                    raise ManifestConflictError(
                        f"a different manifest is published at {uri}") from None
                os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except (ManifestConflictError, StorageError):
        raise
    except PermissionError as e:
        raise PermanentStorageError(f"write {path}: {e}") from e
    except OSError as e:
        raise TransientStorageError(f"write {path}: {e}") from e
    return uri


def _put_s3_once(client: Any, bucket: str, key: str, data: bytes, uri: str) -> str:
    checksum = base64.b64encode(hashlib.sha256(data).digest()).decode()
    try:
        client.put_object(Bucket=bucket, Key=key, Body=data, ContentType="application/json",
                          ChecksumAlgorithm="SHA256", ChecksumSHA256=checksum,
                          IfNoneMatch="*")
        return uri
    except Exception as e:
        status = None
        code = ""
        if hasattr(e, "response"):
            code = str(e.response.get("Error", {}).get("Code", ""))
            status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status == 412 or code == "PreconditionFailed":
            existing = read_bytes(uri, s3_client=client)
            if _same_manifest(existing, data):
                return uri
            raise ManifestConflictError(
                f"a different manifest is already published at {uri}") from e
        raise s3_error(e, f"PUT {uri}") from e


def put_object(uri: str, data: bytes, *, s3_client: Any = None) -> tuple[int, str]:
    """Write ``data`` at ``uri`` (file: temp + fsync + rename; s3: one PUT with ChecksumSHA256).

    Returns (size in bytes, sha256 hex). For the SDK's small per-rank state files.
    Raises TransientStorageError / PermanentStorageError."""
    digest = hashlib.sha256(data).hexdigest()
    p = parse_uri(uri)
    if p.scheme == "file":
        folder = os.path.dirname(p.path)
        try:
            os.makedirs(folder, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, p.path)
        except PermissionError as e:
            raise PermanentStorageError(f"write {p.path}: {e}") from e
        except OSError as e:
            raise TransientStorageError(f"write {p.path}: {e}") from e
        return len(data), digest
    if p.scheme == "s3":
        client = _s3(s3_client)
        try:
            client.put_object(Bucket=p.bucket, Key=p.key, Body=data, ChecksumAlgorithm="SHA256",
                              ChecksumSHA256=base64.b64encode(bytes.fromhex(digest)).decode())
        except Exception as e:
            raise s3_error(e, f"PUT {uri}") from e
        return len(data), digest
    raise PermanentStorageError(f"cannot write {uri!r}: only s3:// and file://")


SINGLE_PUT_MAX_BYTES = 5 * 1024**3
"""S3's limit for one PUT; larger files go up as a multipart upload."""

PART_BYTES = 64 * 1024 * 1024
"""Part size of a multipart upload (raised for files over 10,000 parts)."""


class Uploaded(tuple[int, str]):
    """``(size in bytes, sha256 hex)`` of an upload, with ``checksums``: the full-object
    checksums it declared, ``{"sha256" | "crc32": base64}`` as the manifest's ``checksums``
    records them (docs/ingest-v1.md#shard_written); empty for a ``file://`` copy."""

    checksums: dict[str, str]

    def __new__(cls, size: int, sha256: str, checksums: dict[str, str] | None = None
                ) -> Uploaded:
        self = super().__new__(cls, (size, sha256))
        self.checksums = dict(checksums or {})
        return self


def _crc32_file(path: str) -> str:
    """Base64 of the big-endian CRC32 of a file (as S3 writes ``ChecksumCRC32``)."""
    crc = 0
    with open(path, "rb", buffering=0) as f:
        while b := f.read(8 * CHUNK_BYTES):
            crc = zlib.crc32(b, crc)
    return base64.b64encode((crc & 0xFFFFFFFF).to_bytes(4, "big")).decode()


def _multipart_full_object_crc32(client: Any, bucket: str, key: str, path: str, size: int,
                                 crc32: str, part_bytes: int) -> None:
    """A multipart upload with a full-object CRC32 (``ChecksumType=FULL_OBJECT``): S3 checks
    each part's CRC32 and, on completion, the whole object's against ``crc32``, and stores it,
    so a HEAD later answers for every byte. Aborted when anything fails."""
    part_bytes = max(part_bytes, -(-size // 10_000))
    up = client.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm="CRC32",
                                        ChecksumType="FULL_OBJECT")
    uid = up["UploadId"]
    try:
        parts = []
        with open(path, "rb") as f:
            number = 1
            while data := f.read(part_bytes):
                r = client.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=number,
                                       Body=data, ChecksumAlgorithm="CRC32")
                parts.append({"PartNumber": number, "ETag": r["ETag"],
                              "ChecksumCRC32": r.get("ChecksumCRC32")})
                number += 1
        client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=uid,
                                         MultipartUpload={"Parts": parts},
                                         ChecksumCRC32=crc32, ChecksumType="FULL_OBJECT")
    except BaseException:
        try:
            client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=uid)
        except Exception:  # noqa: BLE001 - the first error is the one to report
            pass
        raise


def upload_file(uri: str, path: str, *, s3_client: Any = None, sha256: str | None = None,
                crc32: str | None = None, single_put_max_bytes: int = SINGLE_PUT_MAX_BYTES,
                part_bytes: int = PART_BYTES) -> Uploaded:
    """Copy the local file ``path`` to ``uri`` (``s3://`` or ``file://``); returns
    ``Uploaded(size, sha256 hex)`` with the full-object checksums the upload declared.

    The file is hashed first (or ``sha256``, and ``crc32`` as base64, are trusted when given:
    the digests of the bytes as they were written). S3: files up to ``single_put_max_bytes``
    (5 GiB, S3's limit) go up in one ``put_object`` carrying that full-object
    ``ChecksumSHA256``; larger ones as a multipart upload (parts of ``part_bytes``) with a
    full-object ``ChecksumCRC32`` (``ChecksumType=FULL_OBJECT``). Either way S3 refuses bytes that
    do not match and stores the checksum, so ``verify_object`` can later compare it from a HEAD
    without reading the object. Raises TransientStorageError / PermanentStorageError (OSError for
    an unreadable local file)."""
    if sha256 is None:
        sha256, size = sha256_file(path)
    else:
        size = os.path.getsize(path)
    p = parse_uri(uri)
    if p.scheme == "file":
        with open(path, "rb") as f:
            data = f.read()
        put_object(uri, data)
        return Uploaded(size, sha256)
    if p.scheme != "s3":
        raise PermanentStorageError(f"cannot write {uri!r}: only s3:// and file://")
    client = _s3(s3_client)
    try:
        if size <= single_put_max_bytes:
            sent = {"sha256": base64.b64encode(bytes.fromhex(sha256)).decode()}
            with open(path, "rb") as f:
                client.put_object(Bucket=p.bucket, Key=p.key, Body=f, ContentLength=size,
                                  ChecksumAlgorithm="SHA256", ChecksumSHA256=sent["sha256"])
        else:
            sent = {"crc32": crc32 or _crc32_file(path)}
            _multipart_full_object_crc32(client, p.bucket, p.key, path, size, sent["crc32"],
                                         part_bytes)
    except OSError:
        raise
    except Exception as e:
        raise s3_error(e, f"PUT {uri}") from e
    return Uploaded(size, sha256, sent)


def download_file(uri: str, path: str, *, s3_client: Any = None) -> tuple[int, str]:
    """Copy the object at ``uri`` (``s3://`` or ``file://``) to the local file ``path`` (folders
    made), hashing while it streams; returns (size, sha256 hex). A missing object raises
    PermanentStorageError; other failures TransientStorageError / PermanentStorageError."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    p = parse_uri(uri)
    h = hashlib.sha256()
    n = 0
    if p.scheme == "file":
        if not os.path.isfile(p.path):
            raise PermanentStorageError(f"no file at {p.path}")
        with open(p.path, "rb") as src, open(path, "wb") as out:
            while chunk := src.read(CHUNK_BYTES):
                h.update(chunk)
                out.write(chunk)
                n += len(chunk)
        return n, h.hexdigest()
    if p.scheme != "s3":
        raise PermanentStorageError(f"cannot read {uri!r}: only s3:// and file:// URIs")
    client = _s3(s3_client)
    try:
        body = client.get_object(Bucket=p.bucket, Key=p.key)["Body"]
        try:
            with open(path, "wb") as out:
                while chunk := body.read(CHUNK_BYTES):
                    h.update(chunk)
                    out.write(chunk)
                    n += len(chunk)
        finally:
            body.close()
    except OSError:
        raise
    except Exception as e:
        if is_missing(e):
            raise PermanentStorageError(f"no object at {uri}") from e
        raise s3_error(e, f"GET {uri}") from e
    return n, h.hexdigest()


def object_exists(uri: str, *, s3_client: Any = None) -> bool:
    """Whether an object or file exists at ``uri`` (a HEAD on S3). Raises StorageError when
    storage cannot answer."""
    p = parse_uri(uri)
    if p.scheme == "file":
        return os.path.exists(p.path)
    if p.scheme == "s3":
        try:
            _s3(s3_client).head_object(Bucket=p.bucket, Key=p.key)
            return True
        except Exception as e:
            if is_missing(e):
                return False
            raise s3_error(e, f"HEAD {uri}") from e
    raise PermanentStorageError(f"cannot look up {uri!r}: only s3:// and file:// URIs")


# --- verification progress ----------------------------------------------------------------------

UNCHECKED_STATUSES = ("pending", "error")
"""Check statuses of an object whose verification has not finished (``error``: storage did not
answer; checked again)."""


@dataclass(frozen=True)
class VerificationProgress:
    """How far the verification of one generation's manifest objects has come
    (docs/definitions.md#verification-progress).

    ``objects_checked`` of ``objects_total``: objects with a result (any status but ``pending``
    and ``error``). ``bytes_checked`` of ``bytes_total``: the declared sizes of those objects,
    plus the bytes hashed so far of the objects still being read. ``done`` is True once every
    object has a result: until then the generation is ``committed``, never ``restorable``."""

    objects_checked: int
    objects_total: int
    bytes_checked: int
    bytes_total: int

    @property
    def done(self) -> bool:
        return self.objects_checked >= self.objects_total

    def text(self) -> str:
        """``"verifying: 37 of 64 objects, 210 GB of 512 GB"`` (decimal units, the unit of the
        total); ``"verified: 64 of 64 objects, 512 GB"`` once ``done``."""
        unit, scale = _byte_unit(self.bytes_total)
        total = _amount(self.bytes_total / scale)
        if self.done:
            return f"verified: {self.objects_checked} of {self.objects_total} objects, " \
                   f"{total} {unit}"
        return (f"verifying: {self.objects_checked} of {self.objects_total} objects, "
                f"{_amount(self.bytes_checked / scale)} {unit} of {total} {unit}")

    def to_dict(self) -> dict[str, Any]:
        return {"objects_checked": self.objects_checked, "objects_total": self.objects_total,
                "bytes_checked": self.bytes_checked, "bytes_total": self.bytes_total,
                "done": self.done, "text": self.text()}


def _byte_unit(n: int) -> tuple[str, int]:
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= scale:
            return unit, scale
    return "bytes", 1


def _amount(x: float) -> str:
    return f"{x:.0f}" if x >= 10 or x == int(x) else f"{x:.1f}"


def verification_progress(objects: Iterable[tuple[int | None, str, int]]
                          ) -> VerificationProgress:
    """The ``VerificationProgress`` of a generation from its manifest objects, each given as
    ``(declared size in bytes or None, check status, bytes hashed so far)``. An object without
    a declared size counts 0 bytes; the bytes hashed of an unfinished object are capped at its
    size."""
    n = checked = total = done = 0
    for size, status, hashed in objects:
        size = max(int(size or 0), 0)
        n += 1
        total += size
        if status in UNCHECKED_STATUSES:
            done += min(max(int(hashed or 0), 0), size)
        else:
            checked += 1
            done += size
    return VerificationProgress(checked, n, done, total)
