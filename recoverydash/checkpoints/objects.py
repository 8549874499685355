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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

from recoverydash.checkpoints import paths
from recoverydash.recovery.inputs import same_manifest

MANIFEST_NAME = "recoverydash-manifest.json"
"""File name of the commit marker inside ``<location>/<generation_id>/``."""

DEFAULT_FULL_HASH_MAX_BYTES = 256 * 1024 * 1024
"""Objects up to this size (bytes) are read whole to compute sha256 when storage holds no digest."""

CHUNK_BYTES = 1024 * 1024

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
    ``observed_sha256`` None means the size matched but the digest was not checked (no expected
    digest, or the object is over ``full_hash_max_bytes`` and storage holds no full-object sha256);
    the detail says which.
    """

    status: str
    detail: str
    observed_size: int | None = None
    observed_sha256: str | None = None
    timed_out: bool = False  # storage_unverified because the caller's deadline passed

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


def _hash_stream(read: Callable[[int], bytes], chunk: int = CHUNK_BYTES, *,
                 limit: int | None = None, deadline: float | None = None) -> tuple[str, int]:
    """(sha256 hex, bytes read) of a stream read in ``chunk`` pieces; at most ``limit`` bytes
    are read (None: to the end), and ``_TimeUp`` is raised once ``deadline``
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
    return h.hexdigest(), n


def sha256_file(path: str) -> tuple[str, int]:
    """(sha256 hex, size in bytes) of a local file, read in 1 MiB chunks. Raises OSError."""
    with open(path, "rb") as f:
        return _hash_stream(f.read)


def _time_up(size: int) -> ObjectCheck:
    return ObjectCheck("storage_unverified", f"size {size} matches; sha256 not checked: reading "
                                             "took longer than the time allowed", timed_out=True)


def _digest_verdict(expected: str | None, observed: str, size: int, how: str) -> ObjectCheck:
    if expected is not None and observed != expected.lower():
        # The observed digest is kept in the result, never in the sentence shown to people.
        return ObjectCheck("digest_mismatch", f"sha256 {how} differs from the manifest's",
                           size, observed)
    return ObjectCheck("ok", f"size {size} and sha256 {how} match" if expected else
                       f"size {size} matches; sha256 {how} (no expected digest)", size, observed)


def verify_object(uri: str, size: int, sha256: str | None = None, *, s3_client: Any = None,
                  full_hash_max_bytes: int = DEFAULT_FULL_HASH_MAX_BYTES,
                  root: str | None = None, deadline: float | None = None,
                  size_only: bool = False) -> ObjectCheck:
    """Check one object against its manifest entry.

    uri: ``s3://bucket/key`` or ``file:///abs/path`` (other schemes: ``storage_unverified``). size:
    expected bytes. sha256: expected 64 hex chars, or None to check size only. S3: HEAD (with
    ``ChecksumMode=ENABLED``) for existence and size; a full-object ``ChecksumSHA256`` stored with
    the object is compared without reading it; otherwise objects of at most ``full_hash_max_bytes``
    are read (a ranged GET of at most ``size + 1`` bytes, so an object that grew is seen without
    reading all of it) and hashed. File: opened with ``O_NONBLOCK`` and ``O_NOFOLLOW``; anything but
    a regular file (``fstat``: a FIFO, a device, a folder) is ``object_missing`` and never read;
    then the size, then a sha256 of at most ``size + 1`` bytes under the same limit. With ``root``
    (a folder, links already resolved) the file is opened beneath it one component at a time,
    refusing symbolic links (``paths.open_beneath``), so a path confined to ``root`` stays confined
    while it is opened. Over the limit with no stored digest: ``ok`` with ``observed_sha256`` None
    and a detail saying the digest was not checked. ``size_only`` skips digests (the re-check at the
    moment of a restore question). ``deadline`` (``time.monotonic()``): hashing stops when it
    passes, with ``storage_unverified`` saying so.

    Details never state an observed size or digest of an object that fails (they are in
    ``observed_size`` / ``observed_sha256`` for the caller). Returns ObjectCheck. Raises
    TransientStorageError (may pass: retry) or PermanentStorageError (access denied, bad
    credentials, malformed URI)."""
    p = parse_uri(uri)
    limit = -1 if size_only else full_hash_max_bytes
    if p.scheme == "file":
        return _verify_file(p.path, size, sha256, limit, root, deadline)
    if p.scheme == "s3":
        return _verify_s3(_s3(s3_client), p.bucket, p.key, size, sha256, limit, deadline)
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


def _verify_file(path: str, size: int, sha256: str | None, limit: int, root: str | None,
                 deadline: float | None) -> ObjectCheck:
    try:
        fd = _open_file(path, root)
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
    with os.fdopen(fd, "rb", buffering=0) as f:
        try:
            observed_size = os.fstat(f.fileno()).st_size
        except OSError as e:
            raise _os_error(e, f"stat {path}") from e
        if observed_size != size:
            return ObjectCheck("size_mismatch", f"the file's size differs from the manifest's "
                                                f"{size} bytes", observed_size)
        if limit < 0:
            return ObjectCheck("ok", f"size {size} matches (digest not re-read)", observed_size)
        if sha256 is None or observed_size > limit:
            why = "no expected digest" if sha256 is None else f"over {limit} bytes"
            return ObjectCheck("ok", f"size {size} matches; sha256 not checked ({why})",
                               observed_size)
        try:
            observed, n = _hash_stream(f.read, limit=size + 1, deadline=deadline)
        except _TimeUp:
            return _time_up(size)
        except OSError as e:
            raise _os_error(e, f"read {path}") from e
    if n != size:
        return ObjectCheck("size_mismatch", "the file changed while it was read (its size "
                                            f"differs from the manifest's {size} bytes)", n)
    return _digest_verdict(sha256, observed, n, "of the file")


def _b64_sha256_to_hex(value: str) -> str | None:
    """Hex of a full-object base64 ChecksumSHA256; None for composite (multipart ``...-N``) ones."""
    if not value or "-" in value:
        return None
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw.hex() if len(raw) == 32 else None


def _verify_s3(client: Any, bucket: str, key: str, size: int, sha256: str | None,
               limit: int, deadline: float | None) -> ObjectCheck:
    where = f"s3://{bucket}/{key}"
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
    if limit < 0:
        return ObjectCheck("ok", f"size {size} matches (digest not re-read)", observed_size)
    if sha256 is None:
        return ObjectCheck("ok", f"size {size} matches; sha256 not checked (no expected digest)",
                           observed_size)
    stored = None
    if head.get("ChecksumType", "FULL_OBJECT") != "COMPOSITE":
        stored = _b64_sha256_to_hex(head.get("ChecksumSHA256") or "")
    if stored is not None:
        return _digest_verdict(sha256, stored, observed_size, "stored by S3 (ChecksumSHA256)")
    if observed_size > limit:
        return ObjectCheck("ok", f"size {size} matches; sha256 not checked (over {limit} bytes "
                                 "and no full-object ChecksumSHA256 stored)", observed_size)
    if size == 0:
        return _digest_verdict(sha256, hashlib.sha256(b"").hexdigest(), 0, "of the object")
    try:
        # At most size + 1 bytes: an object that grew since the HEAD is seen, not streamed whole.
        body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{size}")["Body"]
        try:
            observed, n = _hash_stream(body.read, limit=size + 1, deadline=deadline)
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
    return _digest_verdict(sha256, observed, n, "of the object")


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


def upload_file(uri: str, path: str, *, s3_client: Any = None, sha256: str | None = None
                ) -> tuple[int, str]:
    """Copy the local file ``path`` to ``uri`` (``s3://`` or ``file://``); returns (size, sha256
    hex).

    The file is hashed first (or ``sha256`` is trusted when given). S3: files up to 5 GiB go up in
    one ``put_object`` carrying that full-object ``ChecksumSHA256``, so S3 refuses bytes that do
    not match it and ``verify_object`` can later compare it without reading the object; larger
    files use boto3's multipart ``upload_file`` with ``ChecksumAlgorithm=SHA256`` (a composite
    checksum: verification then reads the object when it is small enough, else checks the size).
    Raises TransientStorageError / PermanentStorageError (OSError for an unreadable local file)."""
    if sha256 is None:
        sha256, size = sha256_file(path)
    else:
        size = os.path.getsize(path)
    p = parse_uri(uri)
    if p.scheme == "file":
        with open(path, "rb") as f:
            data = f.read()
        put_object(uri, data)
        return size, sha256
    if p.scheme != "s3":
        raise PermanentStorageError(f"cannot write {uri!r}: only s3:// and file://")
    client = _s3(s3_client)
    try:
        if size <= SINGLE_PUT_MAX_BYTES:
            with open(path, "rb") as f:
                client.put_object(Bucket=p.bucket, Key=p.key, Body=f, ContentLength=size,
                                  ChecksumAlgorithm="SHA256",
                                  ChecksumSHA256=base64.b64encode(bytes.fromhex(sha256)).decode())
        else:  # pragma: no cover - needs a > 5 GiB file
            client.upload_file(path, p.bucket, p.key, ExtraArgs={"ChecksumAlgorithm": "SHA256"})
    except OSError:
        raise
    except Exception as e:
        raise s3_error(e, f"PUT {uri}") from e
    return size, sha256


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
