"""The SDK's retry store (the *spool*): where a batch the server could not take now waits.

The spool is a bounded folder of gzipped request bodies, ``<spool_dir>/<run_id>/`` (default
``spool_dir``: ``$RECOVERYDASH_SPOOL_DIR``, else ``$XDG_CACHE_HOME/recoverydash/spool``, else
``~/.cache/recoverydash/spool``). Any process of the same run drains it, including a new process
after a trainer restart: files are claimed by an atomic rename, and claims of dead processes
(same host) are released. Re-sending is safe because the server is idempotent on ``event_id``.
``MemorySpool`` is the in-memory alternative (``spool_dir=False``), bounded in bytes the same way.

The same per-run folder holds the attempt state file (``recoverydash.sdk.attempt``), so both
find it through :func:`run_folder`. Only the standard library is used.

Both stores answer the same calls, made by the client's sender thread: ``put(body, n)`` stores a
gzipped body of ``n`` events (False when the store is full: the caller counts them dropped),
``claim()`` takes the oldest batch as ``(handle, body, n)`` (None when empty), ``ack(handle)``
forgets a sent batch, ``nack(handle)`` gives it back as the oldest, ``has_pending()`` and
``pending_events()`` say what waits.

Events the server will not take (refused with a 4xx, or answered 5xx again and again while it
accepts the others: a *poison* event) are set aside by ``reject(events, status, answer,
reason)``: the disk spool writes one JSON file per refusal into ``<spool_dir>/<run_id>/rejected/``
(``{"rejected_at", "status", "reason", "answer", "events": [...]}``, the server's answer as it
came), bounded to a quarter of ``max_bytes``; the memory store keeps the last 100. Nothing there is
sent again: it is for a person to read (and re-post once the cause is fixed).

:func:`newest_spooled_commit` reads what a folder still holds for the restore plan
(``checkpoint.restore_plan``): the newest ``checkpoint_committed`` event not yet sent.
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import re
import threading
import time
import zlib
from collections import deque

_RUN_ID_RE = re.compile(r"[^A-Za-z0-9._:-]")

SPOOL_RESCAN_S = 10.0
"""Seconds a disk spool found empty is trusted to stay empty (batches this process stores reset
it): the sender then skips listing the folder on every batch. Batches another process left there
(a trainer restart) are found within this time."""


def default_spool_dir() -> str:
    """``$RECOVERYDASH_SPOOL_DIR``, else ``$XDG_CACHE_HOME/recoverydash/spool``, else
    ``~/.cache/recoverydash/spool``."""
    env = os.environ.get("RECOVERYDASH_SPOOL_DIR")
    if env:
        return env
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "recoverydash", "spool")


class MemorySpool:
    """In-memory retry store (``spool_dir=False``): a deque of gzipped bodies, bounded in bytes."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._items: deque = deque()
        self._bytes = 0
        self._lock = threading.Lock()
        #: the last 100 refusals, as ``reject`` documents them
        self.rejected: deque = deque(maxlen=100)

    def reject(self, events: list[bytes], status: int | None, answer: bytes,
               reason: str) -> str | None:
        """Keep a refusal in memory (the last 100); returns None (no file)."""
        self.rejected.append(_rejection(events, status, answer, reason))
        return None

    def put(self, body: bytes, n: int, lock_timeout: float | None = None) -> bool:
        with self._lock:
            if self._bytes + len(body) > self.max_bytes:
                return False
            self._items.append((body, n))
            self._bytes += len(body)
            return True

    def claim(self):
        with self._lock:
            if not self._items:
                return None
            body, n = self._items.popleft()
            self._bytes -= len(body)
            return (body, n), body, n

    def ack(self, handle):
        pass

    def nack(self, handle):
        body, n = handle
        with self._lock:
            self._items.appendleft((body, n))
            self._bytes += len(body)

    def __len__(self):
        return len(self._items)

    def has_pending(self) -> bool:
        return bool(self._items)

    def pending_events(self) -> int:
        with self._lock:
            return sum(n for _, n in self._items)


class DiskSpool:
    """Folder of gzipped request bodies ``<time_ns>-<pid>-<seq>-n<events>.batch``, oldest first.

    A process claims a file by renaming it to ``<name>.claimed-<pid>``; ack deletes it, nack renames
    it back. Claims of processes that no longer exist on this host are released on open and before
    each drain. A client's write-ahead file (``write_ahead``) is named ``<name>.ahead-<pid>`` and
    released the same way when its process is gone. Bounded by ``max_bytes`` (a full spool refuses
    new batches) and ``max_age_s`` (older files are deleted and counted dropped)."""

    def __init__(self, folder: str, max_bytes: int, max_age_s: float):
        self.folder = folder
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self._seq = itertools.count()
        self._lock = threading.Lock()
        os.makedirs(folder, exist_ok=True)
        self.expired_events = 0
        self._empty_until = 0.0  # time.monotonic() until which the folder is known to be empty
        self._bytes = 0           # bytes in the folder as of the last scan, plus our puts since
        self._bytes_until = 0.0   # time.monotonic() of the next full scan (stat of every file)
        self._candidates: deque = deque()  # names of one listing, oldest first, to claim in turn
        self.rejected_folder = os.path.join(folder, "rejected")
        self._rejected_bytes: int | None = None  # scanned on the first rejection
        self._journals: dict[str, int] = {}  # this process's live write-ahead files -> bytes
        self.release_stale_claims()

    def reject(self, events: list[bytes], status: int | None, answer: bytes,
               reason: str) -> str | None:
        """Write a refusal to ``rejected/<time_ns>-<pid>-<seq>-n<events>.json`` (atomically);
        returns its path, or None when ``rejected/`` already holds a quarter of ``max_bytes``
        (the caller then counts the events dropped). Raises OSError when the disk refuses."""
        data = json.dumps(_rejection(events, status, answer, reason), indent=1).encode()
        with self._lock:
            os.makedirs(self.rejected_folder, exist_ok=True)
            if self._rejected_bytes is None:
                self._rejected_bytes = sum(
                    os.stat(os.path.join(self.rejected_folder, e)).st_size
                    for e in os.listdir(self.rejected_folder) if e.endswith(".json"))
            if self._rejected_bytes + len(data) > self.max_bytes // 4:
                return None
            name = f"{time.time_ns():020d}-{os.getpid()}-{next(self._seq):08d}-n{len(events)}.json"
            path = os.path.join(self.rejected_folder, name)
            tmp = os.path.join(self.rejected_folder, "." + name + ".tmp")
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, path)
            self._rejected_bytes += len(data)
            return path

    @staticmethod
    def _events_in(name: str) -> int:
        m = re.search(r"-n(\d+)\.batch", name)
        return int(m.group(1)) if m else 0

    def _entries(self):
        try:
            return sorted(e for e in os.listdir(self.folder) if ".batch" in e)
        except FileNotFoundError:
            return []

    def _size(self) -> int:
        """Bytes in the folder: a full scan (a stat per file) at most every ``SPOOL_RESCAN_S``,
        else the last scan plus what this process stored and minus what it sent since. A long
        outage leaves thousands of files; stat-ing all of them per stored batch held the GIL for
        milliseconds."""
        now = time.monotonic()
        if now < self._bytes_until:
            return self._bytes
        total = 0
        for e in self._entries():
            try:
                total += os.stat(os.path.join(self.folder, e)).st_size
            except OSError:
                pass
        self._bytes, self._bytes_until = total, now + SPOOL_RESCAN_S
        return total

    def release_stale_claims(self):
        """Give back, as ordinary batches, the claims and write-ahead files of processes that no
        longer exist on this host (and those of this pid that this object did not write: a
        previous process that had the same pid, as in a container)."""
        mine = os.getpid()
        for e in self._entries():
            m = re.search(r"\.(claimed|ahead)-(\d+)$", e)
            if not m:
                continue
            pid = int(m.group(2))
            if pid == mine and e in self._journals:  # our own live write-ahead file
                continue
            if pid != mine and _pid_alive(pid):
                continue
            try:
                os.rename(os.path.join(self.folder, e), os.path.join(self.folder, e[:m.start()]))
            except OSError:
                pass

    def put(self, body: bytes, n: int, lock_timeout: float | None = None) -> bool:
        """Store a gzipped body of ``n`` events as the newest batch (written to a hidden file,
        fsync-ed, renamed: a reader never sees half a batch). False when the folder would pass
        ``max_bytes``. ``lock_timeout`` (the SIGTERM path, which may have interrupted a holder
        of the lock in its own thread): wait at most that many seconds for the lock, then write
        without it (the names stay unique: time, pid, sequence). Raises OSError when the disk
        refuses."""
        if lock_timeout is None:
            with self._lock:
                return self._put(body, n)
        locked = self._lock.acquire(timeout=lock_timeout)
        try:
            return self._put(body, n)
        finally:
            if locked:
                self._lock.release()

    def _put(self, body: bytes, n: int) -> bool:
        if self._size() + len(body) > self.max_bytes:
            return False
        name = f"{time.time_ns():020d}-{os.getpid()}-{next(self._seq):08d}-n{n}.batch"
        tmp = os.path.join(self.folder, "." + name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, os.path.join(self.folder, name))
        self._empty_until = 0.0
        self._bytes += len(body)
        return True

    def write_ahead(self, body: bytes, n: int, previous: str | None = None) -> str | None:
        """The write-ahead of events still in the sender's memory (``Client(write_ahead_s=)``):
        store a gzipped body of ``n`` events as ``<time_ns>-<pid>-<seq>-n<n>.batch.ahead-<pid>``
        (a hidden file renamed into place), then delete ``previous`` (the file it supersedes:
        the body holds its events too). Returns the new file's name, or None when the folder
        would pass ``max_bytes`` (``previous`` is kept then). Not fsync-ed: it is there for a
        process killed with SIGKILL (the page cache outlives the process), not for a power loss.

        Nothing drains such a file while its process lives: ``claim`` skips it and
        ``has_pending`` does not count it; the process sends its events from memory and then
        calls ``drop_ahead``. When the process dies first, ``release_stale_claims`` (run by the
        next process of the run on open and before each drain) renames it to ``.batch``: an
        ordinary batch, drained in time order. Raises OSError when the disk refuses."""
        with self._lock:
            old = self._journals.get(previous, 0) if previous else 0
            if self._size() - old + len(body) > self.max_bytes:
                return None
            name = f"{time.time_ns():020d}-{os.getpid()}-{next(self._seq):08d}-n{n}.batch" \
                f".ahead-{os.getpid()}"
            tmp = os.path.join(self.folder, "." + name + ".tmp")
            with open(tmp, "wb") as f:
                f.write(body)
            self._journals[name] = len(body)
            os.rename(tmp, os.path.join(self.folder, name))
            self._bytes += len(body)
        if previous:
            self.drop_ahead(previous)
        return name

    def drop_ahead(self, name: str):
        """Delete a write-ahead file of this process (its events were sent, spooled or set
        aside from memory)."""
        with self._lock:
            size = self._journals.pop(name, 0)
            try:
                os.unlink(os.path.join(self.folder, name))
                self._bytes = max(0, self._bytes - size)
            except OSError:
                pass

    def claim(self):
        """The oldest unclaimed batch: (handle, body, events), or None. The folder is listed once
        per pass over it, not once per batch (draining n files stays O(n))."""
        cutoff = time.time_ns() - int(self.max_age_s * 1e9)
        if not self._candidates:
            self._candidates.extend(e for e in self._entries()
                                    if e.endswith(".batch") and not e.startswith("."))
        while self._candidates:
            e = self._candidates.popleft()
            src = os.path.join(self.folder, e)
            head = e.split("-", 1)[0]
            if head.isdigit() and int(head) < cutoff:
                try:
                    os.unlink(src)
                    self.expired_events += self._events_in(e)
                except OSError:
                    pass
                continue
            dst = f"{src}.claimed-{os.getpid()}"
            try:
                os.rename(src, dst)  # atomic: exactly one process wins the file
            except OSError:
                continue
            try:
                with open(dst, "rb") as f:
                    body = f.read()
            except OSError:
                continue
            return (src, dst, len(body)), body, self._events_in(e)
        return None

    def ack(self, handle):
        try:
            os.unlink(handle[1])
            self._bytes = max(0, self._bytes - handle[2])
        except OSError:
            pass

    def nack(self, handle):
        self._empty_until = 0.0
        try:
            os.rename(handle[1], handle[0])
            self._candidates.appendleft(os.path.basename(handle[0]))  # still the oldest
        except OSError:
            pass

    def __len__(self):
        return sum(1 for e in self._entries() if e.endswith(".batch") and not e.startswith("."))

    def has_pending(self) -> bool:
        """Whether batches may wait (stale claims count): lists the folder at most once per
        ``SPOOL_RESCAN_S`` while it stays empty, so an idle spool costs the sender nothing."""
        if self._candidates:
            return True
        now = time.monotonic()
        if now < self._empty_until:
            return False
        journals = self._journals
        if any(".batch" in e and not e.startswith(".") and e not in journals
               for e in self._entries()):
            return True
        self._empty_until = now + SPOOL_RESCAN_S
        return False

    def pending_events(self) -> int:
        return sum(self._events_in(e) for e in self._entries()
                   if e.endswith(".batch") and not e.startswith("."))


def unsent_names(folder: str) -> list[str]:
    """The files of a run's spool folder whose events the server has not acknowledged, oldest
    first: batches, batches claimed by a sender (a request may be under way) and write-ahead
    files (``DiskSpool``'s names, ``...-n<events>.batch[.claimed-<pid>|.ahead-<pid>]``). Never
    raises (a missing folder holds none)."""
    try:
        return sorted(e for e in os.listdir(folder) if ".batch" in e and not e.startswith("."))
    except OSError:
        return []


def unsent_events(folder: str) -> int:
    """Events in ``unsent_names(folder)`` (the count each file's name carries)."""
    return sum(DiskSpool._events_in(e) for e in unsent_names(folder))


def newest_spooled_commit(folder: str, deadline: float | None = None) -> tuple[dict | None, int]:
    """The newest ``checkpoint_committed`` event a run's spool folder still holds (not sent),
    and how many files were left unread.

    Files (``unsent_names``) are read newest first (their names start with the time they were
    written) and the reading stops at the first file holding a commit: the last commit in it is
    the answer, ``{"generation_id": str | None, "update": int | None, "attempt": int | None}``
    (the update from the event's manifest). deadline: a ``time.monotonic()`` after which no
    further file is read; the files not read by then are counted as unread (they may hold a
    newer commit). A file that cannot be read or decoded (gone meanwhile: sent by another
    process; torn) is skipped: the server could not take it either. Returns ``(None, 0)`` when
    the folder holds no commit. Never raises."""
    names = unsent_names(folder)[::-1]
    for i, name in enumerate(names):
        if deadline is not None and time.monotonic() > deadline:
            return None, len(names) - i
        try:
            with open(os.path.join(folder, name), "rb") as f:
                doc = json.loads(gzip.decompress(f.read()))
            events = doc.get("events") if isinstance(doc, dict) else None
        except (OSError, ValueError, EOFError, zlib.error):
            continue
        commits = [e for e in events or () if isinstance(e, dict)
                   and e.get("type") == "checkpoint_committed"]
        if not commits:
            continue
        ev = commits[-1]
        found = ev.get("manifest")
        manifest: dict = found if isinstance(found, dict) else {}
        update = manifest.get("update")
        attempt = ev.get("attempt")
        return {"generation_id": ev.get("generation_id") or manifest.get("generation_id"),
                "update": update if isinstance(update, int) and not isinstance(update, bool)
                else None,
                "attempt": attempt if isinstance(attempt, int) and not isinstance(attempt, bool)
                else None}, 0
    return None, 0


def _rejection(events: list[bytes], status: int | None, answer: bytes, reason: str) -> dict:
    """The document of one refusal: when, the HTTP status, why, the server's answer (parsed when
    it is JSON) and the events as they were sent."""
    text = (answer or b"")[:65536].decode("utf-8", "replace")
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = text
    decoded = []
    for e in events:
        try:
            decoded.append(json.loads(e))
        except ValueError:
            decoded.append(e.decode("utf-8", "replace"))
    return {"rejected_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "status": status,
            "reason": reason, "answer": parsed, "events": decoded}


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_folder(spool_dir: str | None, run_id: str) -> str:
    """``<spool_dir>/<run_id>/``: the run's folder under ``spool_dir`` (``default_spool_dir()``
    when None), the run id with every character outside ``[A-Za-z0-9._:-]`` replaced by ``_``,
    and ``.`` or ``..`` (which ingest refuses) spelled with ``_``: never the spool's own folder
    or its parent."""
    name = _RUN_ID_RE.sub("_", str(run_id)) or "_"
    if name in (".", ".."):
        name = name.replace(".", "_")
    return os.path.join(spool_dir or default_spool_dir(), name)
