"""The sender's background worker: the in-memory queue, the sender thread, batching, the
write-ahead, and the spool it drains (after sentry-python's ``BackgroundWorker``).

``Worker.push`` puts an item on a bounded ``collections.deque`` (the append is atomic, so the
caller takes no lock and never waits; when ``max_queue`` items are waiting it is dropped and
counted). A daemon thread completes the items into wire events (the client's ``complete``:
run_id, attempt, rank, time, event_id), batches them (by count, bytes and the flush policy's
time, ``recoverydash.sdk.flush``), encodes them with one prebuilt JSON encoder and hands each
batch to ``recoverydash.sdk.delivery`` (send, spool, split, set aside). All JSON work happens on
the sender thread.

What the host pays: one atomic append per event (about a microsecond). The sender wakes on the
flush policy's timer (``flush_interval``, +-20%, stretched to ``world_size /
job_requests_per_s`` seconds in a large job, at most 60 s; a prompt event within 1 s), when
``batch_max_events`` are waiting, on ``flush`` / ``close``, or when a pause ends (then it drains
the spool); never per event. An idle disk spool is listed at most every ``SPOOL_RESCAN_S``.

Write-ahead (``write_ahead_s``, with a disk spool): events queued that long before their send
are written by the sender thread to a write-ahead file of the spool (``DiskSpool.write_ahead``:
one gzipped batch, replaced as the batch grows, not fsync-ed) and still sent from memory at the
flush time, then the file is deleted. A SIGKILL then loses at most the events of the last
``write_ahead_s`` seconds plus one write (and, while a send is under way, the fresh events of that
batch and those queued behind it); the next process of the run releases the dead process's file
as an ordinary spooled batch (``DiskSpool.release_stale_claims``).

At exit (``close``, run by ``atexit`` for every worker of the process) nothing is lost to a
server that accepts the connection but never answers: when the sender is still inside a request
at the deadline, the batch it holds is written back to the spool (should the answer still come,
the re-send is a duplicate the server counts and ignores). ``spool_now`` writes what is in memory
to the disk spool without the network (the SIGTERM path, ``recoverydash.sdk.sigterm``).

Fork safety: a forked child rebuilds the queue, thread, counters and transport
(``os.register_at_fork``, plus an ``os.getpid()`` comparison when the thread is (re)started, in
flush, close and counters, and once per ``batch_max_events`` pushes).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from recoverydash.sdk.delivery import Counters, Delivery, Spool, batch_body
from recoverydash.sdk.flush import FlushPolicy, is_prompt
from recoverydash.sdk.guard import Once, guarded, log, never_raises
from recoverydash.sdk.options import ClientOptions
from recoverydash.sdk.spool import DiskSpool, MemorySpool, run_folder
from recoverydash.sdk.transport import JITTER, Backoff, HttpTransport

# One encoder for every event: ``json.dumps`` with keyword arguments builds a new encoder per call.
encode = json.JSONEncoder(separators=(",", ":"), default=str).encode

#: What ``snapshot`` answers when it cannot be taken (never changed: callers copy it).
NO_COUNTS: dict[str, int] = {}

#: An item of the queue: an event dict, or a lazy report with ``materialize() -> dict``.
Complete = Callable[[Any, float], "dict | None"]


class Worker:
    """Sends the events of one run (module doc). ``url`` None or ``""``: nothing is sent (every
    pushed event is counted ``dropped``). ``complete(item, queued_at)`` makes the wire event of
    a queued item (None when it cannot; it counts that ``failed`` in ``counters`` itself).
    ``on_world_size(n)`` is called once when the world size, unknown before, is learnt from an
    ``attempt_started``."""

    def __init__(self, url: str | None, token: str | None, run_id: str, rank: int | None,
                 options: ClientOptions, complete: Complete,
                 on_world_size: Callable[[int], None] | None = None) -> None:
        self.options = options
        self.url, self.token, self.run_id, self.rank = url, token, run_id, rank
        self.complete = complete
        self.on_world_size = on_world_size
        self.sync = options.sync
        self.max_queue = options.max_queue
        self.batch_max_events = options.batch_max_events
        self.batch_max_bytes = options.batch_max_bytes
        self.write_ahead_s = float(options.write_ahead_s or 0.0)
        self.flush_policy = FlushPolicy(base_interval=options.flush_interval,
                                        world_size=options.job_world_size(),
                                        job_requests_per_s=options.job_requests_per_s,
                                        max_interval=options.max_flush_interval,
                                        prompt_s=options.prompt_flush_s)
        self._once = Once()
        self.closed = False
        self.spool: Spool | None = self._open_spool() if url else None
        self._init_process_state()
        _workers.add(self)

    # -- process-local state (rebuilt after fork) --

    def _init_process_state(self) -> None:
        o = self.options
        self.pid = os.getpid()
        # The hand-off to the sender: deque.append/popleft are atomic, so push takes no lock.
        # Items are (event dict or lazy report, time.time()); the sender completes them.
        self._buf: deque[tuple[Any, float]] = deque()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self.thread: threading.Thread | None = None
        self._stopping = False
        self.queued = 0             # written by producers only (no lock: the hot path)
        self._dropped_full = 0      # idem
        self._inflight = 0          # events taken from the buffer, not yet sent/spooled/failed
        self._inflight_batch: list[bytes] | None = None  # the batch inside a request now
        self._taking = False  # the sender is moving events from the buffer into a batch
        # Write-ahead (write_ahead_s): encoded events taken from the buffer, also written to the
        # spool's write-ahead file _ahead_file, sent from memory at the next send.
        self._ahead: list[bytes] = []
        self._ahead_bytes = 0
        self._ahead_file: str | None = None
        self._ahead_armed = True  # False: the sender waits without a write-ahead deadline
        self._flush_req = 0
        self._flush_done = 0
        # The flush policy's cycle (recoverydash.sdk.flush): its start and jitter, and when the
        # oldest prompt event still queued was queued (None: none is), all time.monotonic().
        self._cycle_start = time.monotonic()
        self._jitter = JITTER.uniform(*self.flush_policy.jitter_range(first=True))
        self._prompt_since: float | None = None
        self.counters = Counters()
        self.transport = HttpTransport(
            self.url, self.token, user_agent=o.user_agent, request_timeout=o.request_timeout,
            backoff=Backoff(o.backoff_base, o.backoff_cap, o.max_retry_after, o.auth_retry_s),
            once=self._once)
        self.delivery = Delivery(self.transport, self.spool, self.counters, self._once,
                                 self.run_id)

    def _open_spool(self) -> Spool:
        o = self.options
        if o.spool_dir is False:
            return MemorySpool(o.spool_max_bytes)
        folder = run_folder(o.spool_dir if isinstance(o.spool_dir, str) else None, self.run_id)
        try:
            return DiskSpool(folder, o.spool_max_bytes, o.spool_max_age_s)
        except OSError as e:
            log.warning("recoverydash: spool folder %s unusable (%s); retrying from memory",
                        folder, e)
            return MemorySpool(o.spool_max_bytes)

    def after_fork(self) -> None:
        self._init_process_state()
        self._once.reset()

    def _check_fork(self) -> None:
        if self.pid != os.getpid():
            self.after_fork()

    def ensure_thread(self) -> None:
        self._check_fork()
        t = self.thread
        if t is not None and t.is_alive():
            return
        with self._lock:
            if self.thread is not None and self.thread.is_alive():
                return
            self._stopping = False
            self.thread = threading.Thread(target=self._run, name="recoverydash-sender",
                                           daemon=True)
            self.thread.start()

    # -- the caller's side --

    def push(self, item: Any) -> bool:
        """Hand an event dict, or a lazy report with ``materialize() -> dict``, to the sender.
        True when queued (or sent, in sync mode), False when dropped. The hot path: no lock."""
        if self.closed:
            return False
        self.queued += 1
        if not self.url:
            self._dropped_full += 1
            return False
        if self.sync:
            self._check_fork()
            ev = self.complete(item, time.time())
            if ev is not None:
                self.delivery.deliver([encode(ev).encode()])
                self.delivery.drain()
            return True
        if self.thread is None:  # first call, or the first after a fork
            self.ensure_thread()
        buf = self._buf
        if len(buf) >= self.max_queue:
            self._dropped_full += 1
            self._note_lost_item(item)
            self._once("full", logging.WARNING,
                       "recoverydash: event queue full (%d); dropping events (counted)",
                       self.max_queue)
            return False
        buf.append((item, time.time()))
        if not self._ahead_armed:  # the sender now times this event's write-ahead
            self._ahead_armed = True
            self._wake.set()
        if self.flush_policy.world_size is None and type(item) is dict and \
                item.get("type") == "attempt_started" and type(item.get("world_size")) is int:
            self.flush_policy.world_size = item["world_size"]
            if self.on_world_size is not None:
                self.on_world_size(item["world_size"])
        if self._prompt_since is None and is_prompt(item, self.rank):
            self._prompt_since = time.monotonic()
            self._wake.set()  # the sender recomputes its wait: at most prompt_flush_s now
        if len(buf) >= self.batch_max_events:
            self.ensure_thread()  # cheap insurance: a fork the at-fork hook did not see
            self._wake.set()
        return True

    def _note_lost_item(self, item: Any) -> None:
        """Widen ``lost_updates`` by a queued item dropped before it was built (a full queue)."""
        with guarded("drop", self._once):
            if type(item) is dict:
                if item.get("type") == "update_committed":
                    self.counters.note_update(item.get("update"))
            else:
                self.counters.note_update(getattr(item, "update", None))

    @never_raises(NO_COUNTS, "counters")
    def snapshot(self) -> dict[str, int]:
        """``Client.counters``: the counters plus ``queued``, ``pending`` (in memory, not yet
        sent, spooled or failed) and ``spool_events`` (events now in the spool)."""
        self._check_fork()
        c = self.counters.snapshot()
        c["queued"] = self.queued
        c["dropped"] += self._dropped_full
        c["pending"] = len(self._buf) + self._inflight + len(self._ahead)
        c["spool_events"] = self.spool.pending_events() if self.spool is not None else 0
        return c

    def losses(self) -> tuple[int, int, list[int] | None]:
        """``(dropped, quarantined, lost_updates)`` without listing the spool (the heartbeat's)."""
        c = self.counters
        return c.values["dropped"] + self._dropped_full, c.values["quarantined"], \
            (list(c.lost_updates) if c.lost_updates else None)

    @property
    def refused(self) -> int | None:
        """The status the server refused this sender's setup with (401, 403: the token; 404: the
        URL), while sending is paused for it; else None."""
        return self.transport.backoff.refused

    @never_raises(False, "flush")
    def flush(self, timeout: float | None = 5.0) -> bool:
        """``Client.flush``: wait until every event queued so far is sent, spooled or failed,
        then try once to send what the spool holds (unless sending is paused). True when
        nothing queued is left unresolved and the spool is empty; False at ``timeout`` seconds
        (None: no limit), and at once while the server refuses the token or URL."""
        self._check_fork()
        if not self.url:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.sync:
            return self._flush_sync(deadline)
        self.ensure_thread()
        while True:
            if not self._wait_for_sender(deadline):
                return False
            with self._lock:
                done = not self._buf and self._inflight == 0 and not self._ahead
            if done and self._spool_empty():
                return True
            if self.refused is not None:
                return False  # what is left waits in the spool for a token and URL taken
            if not self._sleep_in_pause(deadline):
                return False

    def _flush_sync(self, deadline: float | None) -> bool:
        while True:
            self.delivery.drain(force=True)
            if self._spool_empty():
                return True
            if self.refused is not None:
                return False
            if not self._sleep_in_pause(deadline):
                return False

    def _spool_empty(self) -> bool:
        return self.spool is None or len(self.spool) == 0

    def _wait_for_sender(self, deadline: float | None) -> bool:
        """Ask the sender for a pass and wait for it; False at ``deadline``."""
        with self._lock:
            self._flush_req += 1
            req = self._flush_req
        self._wake.set()
        with self._cond:
            while self._flush_done < req:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(0.5 if left is None else min(left, 0.5))
        return True

    def _sleep_in_pause(self, deadline: float | None) -> bool:
        """The spool still holds batches: sleep until the pause ends (at most until
        ``deadline``). False when the deadline has passed."""
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            return False
        wait = max(0.01 if not self.sync else 0.001,
                   self.transport.backoff.paused_until - now)
        if deadline is not None:
            wait = min(wait, deadline - now)
        time.sleep(wait)
        return True

    @never_raises(False, "close")
    def close(self, timeout: float | None = None) -> bool:
        """``Client.close``: stop accepting events, send or spool what is queued within
        ``timeout`` seconds (default ``atexit_deadline``); what is still in memory after that is
        written to the spool here. True when nothing was left pending."""
        self._check_fork()
        if self.closed:
            return True
        timeout = self.options.atexit_deadline if timeout is None else timeout
        deadline = time.monotonic() + timeout
        self.closed = True
        if not self.url:
            return True
        self.delivery.exit_timeout = max(0.2, self.options.atexit_deadline / 2)
        if not self.sync and self.thread is not None and self.thread.is_alive():
            with self._lock:
                self._stopping = True
            self._wake.set()
            self.thread.join(max(0.0, deadline - time.monotonic()))
        if self.sync:
            self.delivery.drain(force=True)
        pending = self._spool_what_is_left(timeout)
        self._say_what_waits()
        return pending == 0

    def _spool_what_is_left(self, timeout: float) -> int:
        """At close: spool the queue (fast, local) so a later process sends it, and a copy of
        the batch a sender still waits on. Returns the events pending that were not spooled."""
        alive = self.thread is not None and self.thread.is_alive()
        left: list[bytes] = []
        journal = None
        if self._ahead and not alive:
            # written ahead, never sent (a sender that died): spooled as a batch below
            left, self._ahead, self._ahead_bytes = list(self._ahead), [], 0
            journal, self._ahead_file = self._ahead_file, None
        left += self.take_queued()
        if left:
            self.delivery.store(left)
        if journal and isinstance(self.spool, DiskSpool):
            self.spool.drop_ahead(journal)
        pending = self._inflight
        inflight = self._inflight_batch
        if inflight and alive:
            # The sender is still waiting for an answer: keep a copy for the next process.
            self.delivery.store(list(inflight))
            log.warning("recoverydash: the server did not answer within the exit deadline "
                        "(%.1fs); the %d events in flight were written back to the spool",
                        timeout, len(inflight))
            return 0
        if pending:
            log.warning("recoverydash: %d events pending at exit were not delivered "
                        "(a batch was in flight)", pending)
        return pending

    def _say_what_waits(self) -> None:
        spooled = self.spool.pending_events() if self.spool is not None else 0
        if not spooled:
            return
        folder = getattr(self.spool, "folder", "(memory)")
        if self.refused is not None:
            log.error("recoverydash: %d events of run %s wait in the spool %s: the server "
                      "refused the %s (HTTP %s). Fix it and run `python -m recoverydash.sdk "
                      "resend --run %s`, or let the next process of the run send them", spooled,
                      self.run_id, folder, "URL" if self.refused == 404 else "token",
                      self.refused, self.run_id)
            return
        log.warning("recoverydash: %d events wait in the spool %s; the next process of "
                    "run %s sends them", spooled, folder, self.run_id)

    def take_queued(self) -> list[bytes]:
        """Empty the queue: every queued event completed and encoded (bytes of its JSON), in
        queue order; an event that cannot be encoded is counted ``failed``. The caller writes
        them to the spool (``close`` at its deadline, ``spool_now`` on SIGTERM)."""
        out: list[bytes] = []
        while True:
            try:
                item, t = self._buf.popleft()
            except IndexError:
                return out
            ev = self.complete(item, t)
            if ev is None:
                continue
            try:
                out.append(encode(ev).encode())
            except (TypeError, ValueError):
                self.counters.add_unlocked("failed", 1)

    @never_raises(0, "spool_now")
    def spool_now(self, wait_s: float = 0.5) -> int:
        """``Client.spool_now``: write what is still in memory (the queue, and the batch in
        flight) to the disk spool now, in the calling thread, with no network and no lock the
        interrupted thread may hold (the SIGTERM path). Waits at most ``wait_s`` seconds for
        the sender to finish moving events into a batch. Returns the events written (0 with an
        in-memory spool, whose events die with the process)."""
        spool = self.spool
        if not self.url or self.sync or self.pid != os.getpid() or \
                not isinstance(spool, DiskSpool):
            return 0
        end = time.monotonic() + wait_s
        while self._taking and time.monotonic() < end:
            time.sleep(0.002)  # releases the GIL: the sender finishes its batch
        events = list(self._inflight_batch or ())
        if self._ahead and self._ahead_file is None:  # not on disk (the spool was full)
            events.extend(self._ahead)
        events += self.take_queued()
        written = 0
        for i in range(0, len(events), self.batch_max_events):
            part = events[i:i + self.batch_max_events]
            if spool.put(batch_body(part), len(part), lock_timeout=wait_s):
                written += len(part)
                self.counters.add_unlocked("spooled", len(part))
            else:
                self.counters.add_unlocked("dropped", len(part))
        return written

    # -- the sender thread --

    def _run(self) -> None:
        while True:
            try:
                if self._pass():
                    return
            except Exception as e:  # noqa: BLE001 - the thread must survive anything
                self._inflight = 0
                self._once(("run", type(e)), logging.WARNING,
                           "recoverydash: sender error: %r", e)
                time.sleep(0.05)

    def _pass(self) -> bool:
        """One wake of the sender: a write-ahead, or a send of everything queued and a drain of
        the spool. True when the worker is stopping and nothing is left."""
        if not self._sleep_until_due():
            self._write_ahead()  # the oldest queued event reached write_ahead_s
            return False
        with self._lock:
            stopping = self._stopping
            req = self._flush_req
        now = time.monotonic()
        if now >= self._cycle_start + self.flush_policy.interval() * self._jitter:
            # a periodic send: the next cycle starts (a prompt, full or flush send leaves the
            # cycle as it is: the job's ranks stay spread)
            self._cycle_start = now
            self._jitter = JITTER.uniform(*self.flush_policy.jitter_range(first=False))
        self._prompt_since = None  # before taking: a later prompt event sets it again
        while self._send_one_batch():  # one batch at a time: the buffer stays the bound
            pass
        flushing = req > self._flush_done
        if not self.transport.backoff.paused() or stopping or flushing:
            self.delivery.drain(force=stopping or flushing)
        with self._cond:
            if req > self._flush_done:
                self._flush_done = req
                self._cond.notify_all()
        return stopping and not self._buf

    def _send_one_batch(self) -> bool:
        """Take one batch (the written-ahead events first, the oldest) and deliver it. False
        when there was nothing to take."""
        self._taking = True  # the SIGTERM path waits for this batch to be visible
        try:
            batch = self._ahead + self._take(self.batch_max_events - len(self._ahead),
                                             self.batch_max_bytes - self._ahead_bytes)
            journal = self._ahead_file
            self._ahead, self._ahead_bytes, self._ahead_file = [], 0, None
            self._inflight_batch = batch or None
        finally:
            self._taking = False
        if not batch:
            return False
        try:
            self.delivery.deliver(batch)
        finally:
            self._inflight = 0
            self._inflight_batch = None
            if journal and isinstance(self.spool, DiskSpool):
                self.spool.drop_ahead(journal)  # its events are sent, spooled or set aside
        return True

    def _sleep_until_due(self) -> bool:
        """Sleep until the flush policy's next send (periodic deadline, or a queued prompt
        event's bound), the end of a pause (the spool is drained then), a full batch, a flush
        or close: returns True. Returns False instead when the oldest queued event has waited
        ``write_ahead_s`` before any of those (``_write_ahead_left``). Woken early by a prompt
        event or by the first event queued after the buffer was empty, it recomputes."""
        while True:
            with self._lock:
                if self._stopping or self._flush_req > self._flush_done:
                    break
            if len(self._buf) + len(self._ahead) >= self.batch_max_events or \
                    self._ahead_bytes >= self.batch_max_bytes:
                break  # a full batch
            now = time.monotonic()
            wait = self.flush_policy.due(self._cycle_start, self._jitter,
                                         self._prompt_since) - now
            paused_left = self.transport.backoff.paused_until - now
            if 0 < paused_left < wait:
                wait = paused_left
            if wait <= 0:
                break
            ahead_left = self._write_ahead_left()
            if ahead_left is not None and ahead_left <= 0:
                self._wake.clear()
                return False
            timeout = wait if ahead_left is None else min(wait, ahead_left)
            woken = self._wake.wait(timeout)
            self._wake.clear()
            if not woken and timeout == paused_left:
                break  # the pause is over: drain the spool
        self._wake.clear()
        return True

    def _write_ahead_left(self) -> float | None:
        """Seconds until the oldest queued event has waited ``write_ahead_s``; None when there
        is no write-ahead: off, no disk spool, or nothing queued (then the next push wakes the
        sender). Whatever the flush interval: a 1 s interval's jittered wait reaches 1.2 s, a
        1.8 s one's 2.16 s, past the 2 s bound (a healthy sender then sends first and writes
        nothing ahead)."""
        if self.write_ahead_s <= 0 or not isinstance(self.spool, DiskSpool):
            return None
        self._ahead_armed = False  # before looking at the buffer: a push after it wakes us
        try:
            queued_at = self._buf[0][1]
        except IndexError:
            return None
        self._ahead_armed = True
        return queued_at + self.write_ahead_s - time.time()

    def _write_ahead(self) -> None:
        """Move the queued events (up to one batch) to the write-ahead file (sender thread):
        ``_ahead`` holds them encoded, ``DiskSpool.write_ahead`` writes them all as one file
        that replaces the previous one; they are sent from memory at the next send. A full
        batch is sent at once; a full spool leaves them in memory only."""
        self._taking = True
        try:
            part = self._take(self.batch_max_events - len(self._ahead),
                              self.batch_max_bytes - self._ahead_bytes)
            self._ahead.extend(part)
            self._ahead_bytes += sum(len(e) for e in part)
            self._inflight = 0
        finally:
            self._taking = False
        if not part or not isinstance(self.spool, DiskSpool):
            return
        name = None
        try:
            name = self.spool.write_ahead(batch_body(self._ahead), len(self._ahead),
                                          self._ahead_file)
        except OSError as e:
            self._once(("write-ahead", type(e)), logging.WARNING,
                       "recoverydash: write-ahead to the spool failed: %r", e)
        if name:
            self._ahead_file = name
            self.counters.add("written_ahead", len(part))

    def _take(self, max_events: int | None = None, max_bytes: int | None = None) -> list[bytes]:
        """Up to ``max_events`` / ``max_bytes`` (default ``batch_max_events`` /
        ``batch_max_bytes``) of encoded events from the buffer."""
        batch: list[bytes] = []
        size = 0
        buf = self._buf
        max_events = self.batch_max_events if max_events is None else max_events
        max_bytes = self.batch_max_bytes if max_bytes is None else max_bytes
        while buf and len(batch) < max_events and size < max_bytes:
            try:
                item, t = buf.popleft()
            except IndexError:
                break
            self._inflight += 1
            ev = self.complete(item, t)
            if ev is None:
                self._inflight -= 1
                continue
            try:
                b = encode(ev).encode()
            except (TypeError, ValueError) as e:
                self._inflight -= 1
                self.counters.add("failed", 1)
                self._once(("json",), logging.WARNING, "recoverydash: event not JSON: %r", e)
                continue
            batch.append(b)
            size += len(b)
        return batch


# --- the process's workers: atexit, fork, SIGTERM -------------------------------------------------

_workers: weakref.WeakSet[Worker] = weakref.WeakSet()


def every_worker() -> list[Worker]:
    """The workers of this process (made here, not inherited through a fork), open or not."""
    pid = os.getpid()
    return [w for w in list(_workers) if w.pid == pid]


def live_worker(run_id: str, folder: str) -> Worker | None:
    """An open worker of this process sending run ``run_id`` through the disk spool ``folder``
    (its sender drains that folder: a second drainer would release its claims)."""
    for w in every_worker():
        spool = w.spool
        if not w.closed and w.url and w.run_id == str(run_id) and \
                isinstance(spool, DiskSpool) and os.path.abspath(spool.folder) == folder:
            return w
    return None


def _close_every_worker() -> None:
    for w in every_worker():
        with guarded("close at exit"):
            w.close()


def _after_fork_in_child() -> None:
    for w in list(_workers):
        with guarded("after fork"):
            w.after_fork()


atexit.register(_close_every_worker)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


__all__ = ["Worker", "encode", "every_worker", "live_worker"]
