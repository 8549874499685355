"""Where an object URI points: canonical URIs, prefixes, relative object URIs, trainer-to-server
path mapping, and opening a file beneath a folder without following links.

Pure (no Django, no boto3). The server uses it to confine every storage access to a project's
declared storage locations: an object is read only when its canonical URI lies under a location's
canonical prefix, and a file is then opened component by component beneath that location's
folder, refusing symbolic links, so what was checked is what is read.

Canonical forms
    ``file:///abs/path``: percent-decoded once (``%2e%2e`` is ``..``), duplicate slashes
    collapsed, ``.`` and ``..`` resolved, ``file://localhost/`` taken as local, any other host
    refused; with ``real=True`` symbolic links are resolved too (``os.path.realpath``). A plain
    absolute path is a file URI. ``s3://bucket/key``: the key is kept literally (S3 keys are not
    paths), but a key with a ``.`` or ``..`` segment (also percent-encoded) or a malformed bucket
    is refused, since gateways that normalise paths would take it elsewhere.

Errors: ``UnsafeURI`` (a ValueError) for what cannot be given a canonical form.
"""

from __future__ import annotations

import os
import re
import stat
from urllib.parse import unquote, urlparse

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_BUCKET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.\-_]{1,254}$")

#: System folders that no storage location may be, lie in, or contain.
SYSTEM_FOLDERS = ("/proc", "/sys", "/dev", "/etc", "/boot", "/run", "/root", "/var/run")


class UnsafeURI(ValueError):
    """A URI that has no canonical form here: a remote file host, a NUL byte, a relative path
    where an absolute one is needed, an S3 key with dot segments, a malformed bucket."""


def is_relative(uri: str) -> bool:
    """True for an object URI relative to its generation folder (``model/__0_0.distcp``): no
    scheme and no leading ``/``."""
    return isinstance(uri, str) and bool(uri) and not uri.startswith("/") \
        and not _SCHEME.match(uri)


def scheme_of(uri: str) -> str:
    """``"file"`` for file URIs and absolute paths, ``"s3"``, another scheme in lower case, or
    ``""`` for a relative URI."""
    if uri.startswith("/"):
        return "file"
    m = _SCHEME.match(uri)
    return m.group(0)[:-1].lower() if m else ""


def _clean_path(path: str, real: bool) -> str:
    if "\x00" in path:
        raise UnsafeURI("a path with a NUL byte")
    path = "/" + path.lstrip("/")
    path = re.sub(r"/{2,}", "/", path)
    path = os.path.realpath(path) if real else os.path.normpath(path)
    return "/" + path.lstrip("/")


def canonical(uri: str, *, real: bool = False) -> str:
    """The canonical form of an absolute ``file://`` / path / ``s3://`` URI (see the module
    docstring); other schemes come back unchanged. ``real`` resolves symbolic links of file
    paths (the file system is consulted). Raises UnsafeURI."""
    if not isinstance(uri, str) or not uri:
        raise UnsafeURI(f"expected a URI, got {uri!r}")
    scheme = scheme_of(uri)
    if scheme == "file":
        if uri.startswith("/"):
            path = uri
        else:
            u = urlparse(uri)
            if u.netloc not in ("", "localhost"):
                raise UnsafeURI(f"a file URI on another host ({u.netloc!r}) is not local")
            if u.query or u.fragment:
                raise UnsafeURI("a file URI with a query or fragment")
            path = u.path
        return "file://" + _clean_path(unquote(path), real)
    if scheme == "s3":
        rest = uri.split("://", 1)[1] if "://" in uri else ""
        bucket, _, key = rest.partition("/")
        if not _BUCKET.match(bucket):
            raise UnsafeURI(f"not an S3 bucket name: {bucket!r}")
        for seg in key.split("/"):
            if unquote(seg) in (".", ".."):
                raise UnsafeURI(f"an S3 key with a {unquote(seg)!r} segment")
        if "\x00" in key:
            raise UnsafeURI("an S3 key with a NUL byte")
        return f"s3://{bucket}/{key}"
    if not scheme:
        raise UnsafeURI(f"a relative URI needs a base: {uri!r}")
    return uri


def file_path(canonical_uri: str) -> str:
    """The path of a canonical ``file://`` URI."""
    return canonical_uri[len("file://"):]


def rest_under(uri: str, prefix: str) -> str | None:
    """The part of canonical ``uri`` below canonical ``prefix`` (``""`` when equal), or None
    when ``uri`` is not under it. Both must be canonical (see ``canonical``)."""
    base = prefix.rstrip("/")
    if uri.rstrip("/") == base:
        return ""
    if uri.startswith(base + "/"):
        return uri[len(base) + 1:]
    return None


def join(base: str, rest: str) -> str:
    """``base`` + ``/`` + ``rest`` (no slash doubled)."""
    if not rest:
        return base
    return base.rstrip("/") + "/" + rest.lstrip("/")


def resolve(uri: str, base: str | None) -> str:
    """An object URI made absolute: a relative one joined to ``base`` (the generation folder),
    an absolute one unchanged. Raises UnsafeURI for a relative URI without a base."""
    if not is_relative(uri):
        return uri
    if not base:
        raise UnsafeURI(f"relative object URI {uri!r} and no folder to resolve it against")
    return join(base, uri)


def map_prefix(uri: str, source: str, target: str) -> str | None:
    """Rewrite ``uri`` from one namespace to another (trainer ``/mnt/ckpt`` -> server
    ``/data/ckpt``): ``target`` + what lies under ``source``, or None when ``uri`` is not under
    ``source``. Compared in canonical form without resolving links (``source`` names the
    trainer's file system, not this one). Raises UnsafeURI."""
    rest = rest_under(canonical(uri), canonical(source))
    if rest is None:
        return None
    return join(target, rest)


def is_unsafe_folder(path: str, protected: list[str]) -> str | None:
    """Why the folder ``path`` (absolute, canonical) may not be a storage location, or None:
    the file system root, a system folder or inside one, or a folder holding one of the
    ``protected`` paths (the server's own data, code, secret key)."""
    if path == "/":
        return "the file system root"
    for folder in SYSTEM_FOLDERS:
        if path == folder or path.startswith(folder + "/"):
            return f"the system folder {folder}"
    for p in protected:
        p = os.path.realpath(p)
        if p == path or p.startswith(path.rstrip("/") + "/"):
            return f"a folder that holds the server's own files ({p})"
    return None


OPEN_FLAGS = (os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
              | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0))
_DIR_FLAGS = (os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
              | getattr(os, "O_CLOEXEC", 0))


def open_beneath(root: str, rest: str) -> int:
    """Open the file ``root/rest`` for reading, walking ``rest`` one component at a time from
    the folder ``root`` with ``O_NOFOLLOW`` (a symbolic link anywhere below ``root`` fails with
    ELOOP, or ENOTDIR for a linked folder) and ``O_NONBLOCK`` (opening a FIFO does not wait for
    a writer). Returns a file descriptor of a regular file; raises ``FileNotFoundError``,
    ``NotARegularFile`` (closed again) or another OSError."""
    parts = [p for p in rest.split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        raise FileNotFoundError(f"no file name below {root}")
    fd = os.open(root, _DIR_FLAGS)
    try:
        for name in parts[:-1]:
            nxt = os.open(name, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nxt
        out = os.open(parts[-1], OPEN_FLAGS, dir_fd=fd)
    finally:
        os.close(fd)
    return regular_or_close(out)


def open_file(path: str) -> int:
    """Open ``path`` for reading with ``O_NONBLOCK`` and ``O_NOFOLLOW`` (the last component may
    not be a link); returns the descriptor of a regular file, else raises ``NotARegularFile``
    (closed again) or an OSError."""
    return regular_or_close(os.open(path, OPEN_FLAGS))


class NotARegularFile(OSError):
    """The path names a FIFO, a device, a folder or a socket: never read as a checkpoint."""

    def __init__(self, kind: str):
        super().__init__(f"not a regular file (a {kind})")
        self.kind = kind


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "folder"), (stat.S_ISFIFO, "FIFO"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISSOCK, "socket"), (stat.S_ISLNK, "symbolic link")):
        if test(mode):
            return name
    return "special file"


def regular_or_close(fd: int) -> int:
    """``fd`` when ``fstat`` says regular file; otherwise close it and raise NotARegularFile."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotARegularFile(_kind(mode))
    return fd
