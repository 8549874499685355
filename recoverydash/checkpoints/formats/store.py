"""One listing of a checkpoint folder (a local folder or an ``s3://`` prefix) and reads of the
files in it, for the format adapters. No Django, no torch; boto3 only for ``s3://``.

A :class:`Tree` is taken once per check: every file under the root with its size (bytes) and
modification time (POSIX seconds), kept per folder (name -> size, name -> time) and seen through
:class:`Listing` as one mapping keyed by the path relative to the root with ``/`` separators
(the full path strings are made only when someone iterates it).
Adapters decide from that listing and read only the few small files a format declares its
structure in (DCP ``.metadata``, safetensors headers, a torch zip's central directory and
``data.pkl``, tag files), through :meth:`Tree.open` (a seekable reader; ranged GETs on S3).
"""

from __future__ import annotations

import io
import os
import stat as statmod
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

from recoverydash.checkpoints import objects as storage
from recoverydash.checkpoints.objects import (
    PermanentStorageError,
    StorageError,
    TransientStorageError,
)


class Entry(NamedTuple):
    """A file: ``size`` in bytes, ``mtime`` in POSIX seconds (S3: LastModified)."""

    size: int
    mtime: float


def _split(rel: str) -> tuple[str, str]:
    folder, _, name = rel.rpartition("/")
    return folder, name


#: one folder's files: ``({name: size in bytes}, {name: modification time, POSIX seconds})``
FolderTables = tuple[dict[str, int], dict[str, float]]


class Listing:
    """The listed files as one read-mostly mapping ``relative path -> Entry`` over the per-folder
    tables ``{folder: (sizes, mtimes)}`` (each ``{name: int}`` / ``{name: float}``: a folder's
    files are looked up and compared as columns, and these dicts of plain numbers are never
    traversed by the cyclic garbage collector). ``get``, ``in``, ``[]``, ``pop``, ``len`` and
    iteration (paths made as they are yielded) behave as for a dict."""

    __slots__ = ("_count", "_dirs")

    def __init__(self, dirs: dict[str, FolderTables]):
        self._dirs = dirs
        self._count = sum(len(sizes) for sizes, _ in dirs.values())

    def get(self, rel: str, default: Entry | None = None) -> Entry | None:
        folder, _, name = rel.rpartition("/")
        table = self._dirs.get(folder)
        if table is None:
            return default
        size = table[0].get(name)
        if size is None:
            return default
        return Entry(size, table[1][name])

    def __contains__(self, rel: object) -> bool:
        if not isinstance(rel, str):
            return False
        folder, _, name = rel.rpartition("/")
        table = self._dirs.get(folder)
        return table is not None and name in table[0]

    def __getitem__(self, rel: str) -> Entry:
        got = self.get(rel)
        if got is None:
            raise KeyError(rel)
        return got

    def pop(self, rel: str, *default: Entry | None) -> Entry | None:
        got = self.get(rel)
        if got is None:
            if default:
                return default[0]
            raise KeyError(rel)
        folder, name = _split(rel)
        sizes, mtimes = self._dirs[folder]
        del sizes[name], mtimes[name]
        self._count -= 1
        return got

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[str]:
        for folder, (sizes, _) in self._dirs.items():
            prefix = folder + "/" if folder else ""
            for name in sizes:
                yield prefix + name

    def keys(self) -> list[str]:
        return list(self)

    def items(self) -> Iterator[tuple[str, Entry]]:
        for folder, (sizes, mtimes) in self._dirs.items():
            prefix = folder + "/" if folder else ""
            for name, size in sizes.items():
                yield prefix + name, Entry(size, mtimes[name])

    def values(self) -> list[Entry]:
        return [e for _, e in self.items()]

    def folder(self, folder: str) -> FolderTables:
        """The files directly in ``folder`` (relative, ``""`` the root) as ``({name: size},
        {name: mtime})``; empty dicts when nothing is listed there. Do not modify them."""
        return self._dirs.get(folder) or ({}, {})

    def folders(self) -> Iterator[tuple[str, dict[str, int]]]:
        """``(folder, {name: size})`` for every listed folder."""
        return ((folder, t[0]) for folder, t in self._dirs.items())


def listing_of(entries: dict[str, Entry]) -> Listing:
    """A :class:`Listing` of a plain ``{relative path: Entry}`` dict (tests, other listings)."""
    dirs: dict[str, FolderTables] = {}
    for rel, e in entries.items():
        folder, name = _split(rel)
        sizes, mtimes = dirs.setdefault(folder, ({}, {}))
        sizes[name], mtimes[name] = e[0], e[1]
    return Listing(dirs)


class Tree:
    """Every file under ``root`` (``/abs/dir``, ``file:///abs/dir`` or ``s3://bucket/prefix``).

    ``files`` maps a relative path (``step-10/__0_0.distcp``) to its :class:`Entry` (a
    :class:`Listing`; ``files.folder(rel)`` gives one folder's sizes and times). A root that
    does not exist lists as empty. Raises TransientStorageError / PermanentStorageError when the
    listing fails."""

    def __init__(self, root: str, *, s3_client: Any = None):
        self.root = root
        p = storage.parse_uri(root)
        self.scheme = p.scheme
        self._s3 = s3_client
        self._links: set[str] = set()
        self._children: dict[str, list[str] | tuple[str, ...]] | None = None
        #: adapters' memo of what they decoded from this listing's files (lives as long as the
        #: tree: one check, one discovery pass), e.g. ``dcp``'s layouts of ``.metadata`` files
        self.decoded: dict[Any, Any] = {}
        if p.scheme == "file":
            self._path = p.path
            self._children = {}
            self.files = Listing(_list_local(p.path, self._links, self._children))
        elif p.scheme == "s3":
            self._bucket, self._prefix = p.bucket, p.key.strip("/")
            if self._s3 is None:
                self._s3 = storage.make_s3_client()
            self.files = listing_of(_list_s3(self._s3, self._bucket, self._prefix))
        else:
            raise PermanentStorageError(f"cannot list {root!r}: only folders and s3:// prefixes")

    @property
    def links(self) -> set[str]:
        """Relative paths of the listed files that are symbolic links (local folders only; a
        link's Entry is its target's size and time). A server reading someone's folder resolves
        these before opening them (``recoverydash.ingest.adoption.confine``)."""
        return self._links

    def drop(self, rels: Iterable[str]) -> None:
        """Forget files of the listing (never to be read): they are then absent to adapters."""
        for rel in rels:
            self.files.pop(rel, None)
            self._links.discard(rel)
        self._children = None  # rebuilt from the files that remain

    # --- names -------------------------------------------------------------------------------

    def uri(self, rel: str) -> str:
        """The ``file://`` or ``s3://`` URI of a relative path (``base_uri + rel`` when ``rel``
        is not empty)."""
        if not rel:
            return self.base_uri.rstrip("/") if self.scheme == "file" else \
                f"s3://{self._bucket}/{self._prefix}"
        return self.base_uri + rel

    @property
    def base_uri(self) -> str:
        """The URI every file's relative path is appended to (ends with ``/``)."""
        if self.scheme == "file":
            return f"file://{self._path.rstrip('/')}/"
        return f"s3://{self._bucket}/{self._prefix}/" if self._prefix else f"s3://{self._bucket}/"

    def children(self, folder: str = "") -> list[str]:
        """Names directly under ``folder`` (files and sub-folders), sorted; ``""`` is the root."""
        if self._children is None:
            kids: dict[str, set[str]] = {}
            for rel in self.files:
                parts = rel.split("/")
                for depth in range(len(parts)):
                    kids.setdefault("/".join(parts[:depth]), set()).add(parts[depth])
            self._children = {k: sorted(v) for k, v in kids.items()}
        got = self._children.get(folder.strip("/") if folder else "")
        if got is None:
            return []
        if not isinstance(got, list):  # as listed: sorted once, when first asked for
            got = self._children[folder.strip("/")] = sorted(got)
        return got

    def under(self, folder: str) -> dict[str, Entry]:
        """Files below ``folder`` (any depth), keyed by their path relative to ``folder``."""
        base = folder.strip("/") + "/" if folder.strip("/") else ""
        return {rel[len(base):]: e for rel, e in self.files.items() if rel.startswith(base)}

    def is_dir(self, rel: str) -> bool:
        return bool(self.children(rel)) and rel not in self.files

    # --- reading -----------------------------------------------------------------------------

    def open(self, rel: str) -> io.BufferedIOBase | io.RawIOBase:
        """A seekable binary reader of a file (a local file, or ranged GETs on S3). Raises
        PermanentStorageError when it is gone, TransientStorageError when storage cannot answer."""
        if self.scheme == "file":
            path = os.path.join(self._path, *rel.split("/"))
            try:
                return open(path, "rb")
            except (FileNotFoundError, IsADirectoryError, PermissionError) as e:
                raise PermanentStorageError(f"read {path}: {e}") from e
            except OSError as e:
                raise TransientStorageError(f"read {path}: {e}") from e
        entry = self.files.get(rel)
        if entry is None:
            raise PermanentStorageError(f"no object {self.uri(rel)}")
        return S3RangeReader(self._s3, self._bucket,
                             self.uri(rel)[len(f"s3://{self._bucket}/"):], entry.size)

    def read(self, rel: str, start: int = 0, length: int | None = None) -> bytes:
        """Bytes ``[start, start + length)`` of a file (to its end when ``length`` is None)."""
        with self.open(rel) as f:
            f.seek(start)
            try:
                return bytes(f.read() if length is None else f.read(length))
            except StorageError:
                raise
            except OSError as e:
                raise TransientStorageError(f"read {self.uri(rel)}: {e}") from e

    def sha256(self, rel: str, progress: Callable[[int], object] | None = None) -> str:
        """sha256 hex of a whole file, read in 1 MiB chunks; ``progress(n)`` gets each chunk's
        length in bytes."""
        import hashlib

        h = hashlib.sha256()
        with self.open(rel) as f:
            while True:
                chunk = f.read(storage.CHUNK_BYTES)
                if not chunk:
                    return h.hexdigest()
                h.update(chunk)
                if progress is not None:
                    progress(len(chunk))


def _list_local(root: str, links: set[str] | None = None,
                children: dict[str, list[str] | tuple[str, ...]] | None = None
                ) -> dict[str, FolderTables]:
    """Files under a local folder, per folder: ``{folder: ({name: size}, {name: mtime})}``
    (``folder`` relative, ``""`` the root; symbolic links followed for files, not for folders;
    the relative paths of file links are added to ``links``). ``children`` gets, per folder, the
    names directly in it as listed (unsorted tuples of files and sub-folders that hold files or
    are empty). One ``os.scandir`` per folder and one ``stat`` per file, from the directory
    entries: nothing is asked twice, and no full path string is made."""
    out: dict[str, FolderTables] = {}
    if not os.path.isdir(root):
        if os.path.isfile(root):  # a single file named as the location
            st = os.stat(root)
            name = os.path.basename(root)
            if children is not None:
                children[""] = (name,)
            return {"": ({name: st.st_size}, {name: st.st_mtime})}
        return out
    regular = statmod.S_IFREG
    stack = [("", root)]
    folders: list[tuple[str, dict[str, int], list[str]]] = []  # parents before sub-folders
    try:
        while stack:
            rel, path = stack.pop()
            prefix = rel + "/" if rel else ""
            sizes: dict[str, int] = {}
            mtimes: dict[str, float] = {}
            subs: list[str] = []
            with os.scandir(path) as it:
                for d in it:
                    name = d.name
                    try:
                        if d.is_dir(follow_symlinks=False):
                            stack.append((prefix + name, d.path))
                            subs.append(name)
                            continue
                        st = d.stat()  # follows a link to its file (Lightning's last.ckpt)
                    except FileNotFoundError:
                        continue  # removed while listing, or a dangling link
                    if st.st_mode & 0o170000 == regular:
                        sizes[name] = st.st_size
                        mtimes[name] = st.st_mtime
                        if links is not None and d.is_symlink():  # from the entry: no syscall
                            links.add(prefix + name)
            out[rel] = (sizes, mtimes)
            folders.append((rel, sizes, subs))
    except PermissionError as e:
        raise PermanentStorageError(f"list {root}: {e}") from e
    except OSError as e:
        raise TransientStorageError(f"list {root}: {e}") from e
    if children is not None:  # a folder with no file below it is not a child (as on S3)
        for rel, sizes, subs in reversed(folders):
            prefix = rel + "/" if rel else ""
            names = list(sizes)
            names.extend(s for s in subs if prefix + s in children)
            if names or not rel:
                children[rel] = tuple(names)  # unsorted: Tree.children sorts when asked
    return out


def _list_s3(client: Any, bucket: str, prefix: str) -> dict[str, Entry]:
    base = prefix + "/" if prefix else ""
    out: dict[str, Entry] = {}
    token = None
    while True:
        kw: dict[str, Any] = {"Bucket": bucket, "Prefix": base}
        if token:
            kw["ContinuationToken"] = token
        try:
            page = client.list_objects_v2(**kw)
        except Exception as e:
            if storage.is_missing(e):
                return out
            raise storage.s3_error(e, f"LIST s3://{bucket}/{base}") from e
        for obj in page.get("Contents", ()):
            rel = obj["Key"][len(base):]
            if rel and not rel.endswith("/"):
                when = obj.get("LastModified")
                out[rel] = Entry(int(obj.get("Size", 0)), when.timestamp() if when else 0.0)
        if not page.get("IsTruncated"):
            return out
        token = page.get("NextContinuationToken")


class S3RangeReader(io.RawIOBase):
    """A seekable reader of one S3 object through ranged GETs, with a 1 MiB read-ahead, so that
    ``zipfile`` and header readers fetch only the bytes they look at."""

    def __init__(self, client: Any, bucket: str, key: str, size: int,
                 readahead: int = 1 << 20):
        self._c, self._b, self._k, self._size = client, bucket, key, size
        self._pos = 0
        self._buf_at, self._buf = 0, b""
        self._ahead = readahead

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def _fetch(self, start: int, end: int) -> bytes:
        try:
            body = self._c.get_object(Bucket=self._b, Key=self._k,
                                      Range=f"bytes={start}-{end - 1}")["Body"]
            try:
                return bytes(body.read())
            finally:
                body.close()
        except Exception as e:
            if storage.is_missing(e):
                raise PermanentStorageError(f"no object s3://{self._b}/{self._k}") from e
            raise storage.s3_error(e, f"GET s3://{self._b}/{self._k}") from e

    def read(self, n: int | None = -1) -> bytes:
        if self._pos >= self._size:
            return b""
        end = self._size if n is None or n < 0 else min(self._size, self._pos + n)
        lo, hi = self._buf_at, self._buf_at + len(self._buf)
        if not (lo <= self._pos and end <= hi):
            fetch_end = min(self._size, max(end, self._pos + self._ahead))
            self._buf_at, self._buf = self._pos, self._fetch(self._pos, fetch_end)
        out = self._buf[self._pos - self._buf_at:end - self._buf_at]
        self._pos += len(out)
        return out

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)
