"""The sender: a client that never hurts its host (after sentry-python and posthog-python).

``Client.emit`` puts an event on a bounded in-memory queue (a ``collections.deque``: the append is
atomic, so the caller takes no lock and never waits; when ``max_queue`` events are waiting the
event is dropped and counted). It never raises. A daemon sender thread completes the events
(run_id, attempt, rank, time, event_id), batches them (by count, bytes and time, with jitter),
gzips them and POSTs ``{"events": [...]}`` to ``{url}/api/v1/events`` with
``Authorization: Bearer <token>``. All JSON work happens on the sender thread.

What the host pays: the caller's thread does an atomic append (about a microsecond). The sender
wakes on a timer (the flush policy of ``recoverydash.sdk.flush``: ``flush_interval``, default
1 s, +-20%, stretched to ``world_size / job_requests_per_s`` seconds, at most 60 s, in a large job
so the whole job sends at most about 40 requests a second until that cap; a prompt event such as
checkpoint_committed, or rank 0's attempt_started, within 1 s) or when ``batch_max_events`` are waiting,
never per event; each wake encodes the batch with one prebuilt JSON encoder, compresses
it once with zlib level 1 in gzip framing (zlib releases the GIL while it compresses) and sends
one request. An idle disk spool is listed at most every ``SPOOL_RESCAN_S`` seconds, not on every
wake, and ``heartbeat`` reads the dropped count without touching the spool. Measured by
``bench/sdk_overhead.py``: about 0.5-1 ms of sender CPU per second at 75 updates a second, and
no GIL wait of the training thread above the bench's resolution.

Delivery, per batch:
- 2xx: sent. The server answers ``{"accepted", "duplicates"}``; duplicates are counted.
- 5xx, 408, 429, network errors and timeouts: the batch goes to the *spool* and sending pauses for
  a capped exponential backoff with jitter (``backoff_base * 2**k``, at most ``backoff_cap``
  seconds), or for ``Retry-After`` when the server gives one. While paused, new batches go to the
  spool too (order is kept: the spool is drained oldest first before anything new is sent).
- 409 (an ``event_id`` reused with other content) and 413 (too large): the batch is split in
  halves and each half sent again, so one bad event costs only itself (counted ``failed``). A 409
  on ``attempt_started`` is logged as an error saying the attempt number was most likely reused
  by a relaunch (see ``recoverydash.sdk.attempt`` for how the attempt is chosen).
- 400: the events the answer names by index are set aside and the rest is sent again; an answer
  about the request as a whole sets the batch aside.
- other 4xx: never retried; logged once per status code and counted ``failed``.
- A *poison* batch, one the server answers 5xx to ``POISON_AFTER`` times in a row: the server is
  probed with an empty batch; when that is accepted, the batch is split in halves, again and
  again, until the event(s) the server fails on are isolated. Every other event is sent, the
  poison ones are set aside (counted ``quarantined``), and the spool behind them moves on. When
  the probe is not accepted the server is in trouble, not the batch: it waits in the spool.

Events set aside (refused for good, or poison) go to ``<spool>/<run_id>/rejected/``, one JSON file
per refusal with the server's answer (``recoverydash.sdk.spool``): nothing the trainer gave is
thrown away unseen. Their count, and the number of events dropped (a full queue or spool), reach
the server in the next ``heartbeat`` as ``sdk_dropped`` and ``sdk_quarantined`` with
``sdk_lost_updates`` ``[first, last]``, the updates of the ``update_committed`` events among them,
so the run page can say which omissions the trainer's own losses may explain.

The spool (``recoverydash.sdk.spool``) is a bounded folder of gzipped request bodies,
``<spool_dir>/<run_id>/``, that any process of the same run drains, including a new process after
a trainer restart. Re-sending is safe because the server is idempotent on ``event_id``, and
the event helpers use deterministic ids (``{run_id}:{attempt}:{rank}:u{update}`` and the like).
``spool_dir=False`` keeps the retry store in memory (bounded by ``spool_max_bytes`` too).

At exit nothing is lost to a server that accepts the connection but never answers: when the
sender is still inside a request at the ``atexit_deadline``, the batch it holds is written back
to the spool (the next process of the run sends it; should the answer still come, the re-send is
a duplicate the server counts and ignores).

SIGTERM (torchrun ends the other ranks with it when one fails; Slurm sends it before SIGKILL;
Python's default action skips ``atexit``). ``install_sigterm_handler`` writes every client's
queue and batch in flight to the disk spool (``Client.spool_now``: no network, at most about half
a second of waiting), then hands over to the previous handler (a framework's callable is called;
``SIG_IGN`` stays ignored; ``SIG_DFL`` is restored and SIGTERM raised again, so the exit status
stays "killed by SIGTERM"); the next process of the run sends the spooled events, each with its
own attempt. A Python handler runs only in the main thread between bytecodes: a rank blocked in a
collective in C (``all_reduce`` waiting for a failed rank, where torchrun's SIGTERM finds it)
never runs it, and the handler turns "dies at once" into "lives until torchrun's SIGKILL 30 s
later". So by default a client installs it only for a single-process job
(``single_process_job``: world size 1, not under torchrun), whose SIGTERM then spools the whole
queue; a rank of a multi-process job (or one of unknown world size) keeps SIGTERM's default
action, dies at once and loses what the write-ahead below had not written (at most the last
``write_ahead_s`` seconds). ``handle_sigterm=True`` or ``RECOVERYDASH_HANDLE_SIGTERM=1`` installs
it for any job, with a watchdog thread (``_start_sigterm_watchdog``, when no other wakeup fd is
set): when the main thread has not run the handler 0.5 s after SIGTERM (it is in C), the watchdog
spools the queues and ends the process by SIGTERM's default action (exit -15) itself; without
the watchdog the caveat above stands. ``handle_sigterm=False`` or
``RECOVERYDASH_HANDLE_SIGTERM=0`` never installs it.

SIGKILL (nothing runs), and SIGTERM without the handler: with a disk spool, the sender thread
writes the events queued for ``write_ahead_s`` (default 2 s; a large job's flush interval reaches
60 s, a 1 s interval's jittered wait 1.2 s) to a write-ahead file of the spool
(``DiskSpool.write_ahead``: one gzipped batch, replaced as the batch grows, not fsync-ed) and
still sends them from memory at the flush time, then deletes the file. Such a kill loses at most
the events of the last ``write_ahead_s`` seconds (or of the last jittered flush interval, when
that is shorter) plus one write, and, while a send is under way (a slow server: each socket wait
up to ``request_timeout``), the fresh events of that batch and those queued behind it; the next
process of the run releases the dead process's file as an ordinary spooled batch
(``DiskSpool.release_stale_claims``) and sends it in time order.

Counters (``client.counters()``): ``queued`` (accepted by emit), ``sent`` (acknowledged by the
server, counting re-sends from the spool), ``spooled`` (written to the spool), ``written_ahead``
(events written to the write-ahead file, still sent from memory), ``dropped`` (full
queue or full spool), ``failed`` (rejected by the server for good), ``quarantined`` (set aside in
``rejected/``: refused for good, or poison), ``duplicates`` (already stored).

Fork safety: the sender thread and queue are rebuilt in a child process (``os.register_at_fork``,
plus an ``os.getpid()`` comparison when the thread is (re)started, in flush, close and counters,
and once per ``batch_max_events`` emits). ``atexit`` flushes with a short total deadline
(``atexit_deadline`` seconds), spools what it cannot send, and logs how many events are still
pending. ``sync=True`` sends in the caller's thread (tests).

Only the standard library is used (``urllib``), so the SDK adds no heavy dependency.
"""

from __future__ import annotations

import atexit
import gzip
import hashlib
import json
import logging
import os
import random
import signal
import threading
import time
import urllib.error
import urllib.request
import uuid
import weakref
import zlib
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

from recoverydash.sdk.flush import JOB_REQUESTS_PER_S, MAX_INTERVAL_S, PROMPT_S, FlushPolicy, \
    is_prompt
from recoverydash.sdk.spool import DiskSpool, MemorySpool, run_folder, unsent_events

log = logging.getLogger("recoverydash.sdk")

#: The SDK's own random source for jitter and back-off: the trainer's seeded global ``random``
#: is never drawn from (a draw at the sender's times would change a seeded run's sequence).
_JITTER = random.Random()

RETRYABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
#: A spooled batch the server answers 5xx to this many times in a row is searched for poison.
POISON_AFTER = 3

# One encoder for every event: ``json.dumps`` with keyword arguments builds a new encoder per call.
_encode = json.JSONEncoder(separators=(",", ":"), default=str).encode


def now_rfc3339() -> str:
    """Current time, RFC 3339 with offset and milliseconds: ``2026-11-01T00:00:05.123+00:00``."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def default_attempt(run_id: str = "run", **kw) -> int:
    """The attempt of this launch of ``run_id`` when none is passed: ``$RECOVERYDASH_ATTEMPT``,
    else a number new for every launch (``recoverydash.sdk.attempt.resolve_attempt``; ``kw``:
    ``url``, ``token``, ``location``, ``restored``, ``spool_dir``...). torchrun's and Slurm's
    restart counts are only a floor: a plain relaunch starts them at 0 again."""
    from recoverydash.sdk.attempt import resolve_attempt

    return resolve_attempt(run_id, **kw)


def _default_rank() -> int | None:
    v = os.environ.get("RANK")
    return int(v) if v and v.isdigit() else None


def _retry_after_seconds(value: str | None, cap: float) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or HTTP-date), capped; None if absent."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, min(cap, float(value)))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
        return max(0.0, min(cap, when.timestamp() - time.time()))
    except (TypeError, ValueError, IndexError):
        return None


#: The most of one answer to a batch that is read: the server's are a few hundred bytes (at
#: most 100 errors); anything answering without end at the configured URL is cut there instead
#: of growing in the training process.
MAX_ANSWER_BYTES = 1024 * 1024

class _Once:
    """Logs a message once per key (a noisy failure must not flood the trainer's log)."""

    def __init__(self):
        self._seen: set = set()

    def __call__(self, key, level, msg, *args):
        if key in self._seen:
            return
        self._seen.add(key)
        log.log(level, msg, *args)


# --- the client -----------------------------------------------------------------------------------

class Client:
    """Sends events of one run to the ingest API. Thread-safe; never raises; never blocks.

    Args:
        url: server base URL (``https://recoverydash.example``); None or "" disables sending
            (events are accepted and discarded: counted ``dropped``).
        token: an API token with the ``ingest`` scope.
        run_id: the logical run, ``[A-Za-z0-9._:-]{1,128}``.
        attempt: this launch of the run. Default: ``$RECOVERYDASH_ATTEMPT``, else a number new
            for every launch, the same on every rank (``recoverydash.sdk.attempt``: one more than
            the highest attempt seen in the restored manifest, the location's manifests, this
            host's state file and the server's ``latest_attempt``; with ``torch.distributed``
            initialised rank 0 decides and broadcasts it, so every rank must create its client
            at the same point). The server is asked with ``min(request_timeout, 3)`` seconds.
        location: the run's checkpoint location, looked at for the attempt rule (not needed
            with an explicit ``attempt``).
        restored: the restored generation (a manifest or a ``restore_plan`` answer), for the
            attempt rule.
        s3_client: a boto3 client for an ``s3://`` ``location``.
        rank: the data-parallel rank this process reports for (default: ``$RANK``, else None).
        spool_dir: root of the on-disk spool (default ``default_spool_dir()``); the run's batches
            live in ``<spool_dir>/<run_id>/``. ``False``: an in-memory retry store.
        spool_max_bytes: bound of the spool, bytes of gzipped bodies (default 256 MiB).
        spool_max_age_s: spooled batches older than this (seconds) are deleted (default 7 days).
        max_queue: events held in memory before emit drops (default 10,000).
        batch_max_events / batch_max_bytes: a batch is sent when it reaches either (defaults 500
            events, 1 MiB of JSON) or when the flush policy's interval (+-20% jitter) has passed
            (``recoverydash.sdk.flush``).
        flush_interval: the shortest periodic wait, seconds (default 1). The wait is
            ``min(max_flush_interval, max(flush_interval, world_size / job_requests_per_s))``:
            1 s up to 40 processes, 25.6 s at 1,024, 60 s from 2,400 on, so a whole job sends at
            most about ``job_requests_per_s`` requests a second until the 60 s cap
            (``recoverydash.sdk.flush``).
        world_size: processes of the job that each run a client like this one (default
            ``$WORLD_SIZE``, else the ``world_size`` of this client's first ``attempt_started``,
            else 1). A single reporter (e.g. of ``update_aggregate``) passes 1.
        job_requests_per_s: the whole job's request budget (default 40 requests/s: under the
            server's default per-token rate limit of 50).
        max_flush_interval: the longest periodic wait, seconds (default 60: within the rank
            silence floor of 120 s with jitter).
        prompt_flush_s: checkpoint_committed and restore_failed, and from rank 0 (or a
            client without a rank) attempt_started, attempt_ended and restore_completed, are
            sent at most this many seconds after they are queued (default 1), whatever the
            interval; other ranks' copies of those three go with their periodic send or close.
        request_timeout: seconds per HTTP request.
        backoff_base / backoff_cap: seconds; pause after k consecutive failures is
            ``min(cap, base * 2**k) * uniform(0.5, 1)``; ``Retry-After`` wins when given (capped at
            ``max_retry_after``).
        atexit_deadline: seconds the interpreter's exit may spend flushing (default 2).
        sync: deliver in the caller's thread (tests); retries are then paused batches in the spool,
            re-sent by the next emit or flush.
        write_ahead_s: with a disk spool, events queued for this many seconds (default 2)
            before their send are written by the sender thread to a write-ahead file in the
            spool (``DiskSpool.write_ahead``) and still sent from memory at the flush time; a
            process killed with SIGKILL (or SIGTERM without the handler) loses at most the
            events of its last ``write_ahead_s`` seconds (plus the time of one write, and a send
            under way), the next process of the run sends the rest. 0 turns it off.
        handle_sigterm: install the SIGTERM hand-over (``install_sigterm_handler``) when this
            client is made in the main thread: on SIGTERM what is queued is written to the disk
            spool, then the previous handler runs (or the default action: the process still dies
            of SIGTERM). Caveat: a Python handler never runs while the main thread is blocked in
            C (a collective waiting for a failed rank); the watchdog thread then spools and ends
            the process by SIGTERM 0.5 s later, and where it could not start (another wakeup fd
            was set) such a process lives on until SIGKILL. None (default): ``$RECOVERYDASH_HANDLE_SIGTERM`` when set (``0``,
            ``false``, ``no``, ``off``: no; anything else: yes), else only for a single-process
            job (``single_process_job(world_size)``; a world size unknown here is decided by
            this client's first ``attempt_started``).
    """

    def __init__(self, url: str | None, token: str | None, run_id: str, *,
                 attempt: int | None = None, rank: int | None | str = "env",
                 spool_dir: str | bool | None = None, spool_max_bytes: int = 256 * 1024 * 1024,
                 spool_max_age_s: float = 7 * 86400.0, max_queue: int = 10_000,
                 batch_max_events: int = 500, batch_max_bytes: int = 1024 * 1024,
                 flush_interval: float = 1.0, world_size: int | None = None,
                 job_requests_per_s: float = JOB_REQUESTS_PER_S,
                 max_flush_interval: float = MAX_INTERVAL_S, prompt_flush_s: float = PROMPT_S,
                 request_timeout: float = 10.0,
                 backoff_base: float = 0.5, backoff_cap: float = 30.0,
                 max_retry_after: float = 300.0, atexit_deadline: float = 2.0,
                 sync: bool = False, user_agent: str = "recoverydash-sdk/1",
                 location: str | None = None, restored: Any = None, s3_client=None,
                 handle_sigterm: bool | None = None, write_ahead_s: float = 2.0):
        self.url = (url or "").rstrip("/")
        self.endpoint = self.url + "/api/v1/events" if self.url else ""
        self.token = token or ""
        self.run_id = str(run_id)
        if attempt is None:
            attempt = default_attempt(self.run_id, url=self.url or None, token=self.token,
                                      location=location, restored=restored,
                                      spool_dir=spool_dir if self.url else False,
                                      s3_client=s3_client,
                                      timeout=min(request_timeout, 3.0))
        self.attempt = int(attempt)
        self.rank = _default_rank() if rank == "env" else rank
        self.sync = sync
        self.max_queue = max_queue
        self.batch_max_events = batch_max_events
        self.batch_max_bytes = batch_max_bytes
        self.flush_interval = flush_interval
        if world_size is None:
            try:
                world_size = int(os.environ.get("WORLD_SIZE", "")) or None
            except ValueError:
                world_size = None
        self.flush_policy = FlushPolicy(base_interval=flush_interval, world_size=world_size,
                                        job_requests_per_s=job_requests_per_s,
                                        max_interval=max_flush_interval,
                                        prompt_s=prompt_flush_s)
        self.request_timeout = request_timeout
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.max_retry_after = max_retry_after
        self.atexit_deadline = atexit_deadline
        self.write_ahead_s = float(write_ahead_s or 0.0)
        self.user_agent = user_agent
        self._once = _Once()
        self._spool_args = (spool_dir, spool_max_bytes, spool_max_age_s)
        self._spool = None
        self._closed = False
        self._init_process_state()
        if self.url:
            self._open_spool()
        _register(self)
        # "auto" (the default): only a single-process job, whose SIGTERM handler can never be
        # held up behind a collective of other ranks (install_sigterm_handler)
        self._sigterm_auto = False
        if handle_sigterm is None:
            setting = os.environ.get("RECOVERYDASH_HANDLE_SIGTERM", "").strip().lower()
            if setting:
                handle_sigterm = setting not in ("0", "false", "no", "off")
            else:
                handle_sigterm = single_process_job(world_size)
                self._sigterm_auto = not handle_sigterm and world_size is None
        if handle_sigterm and self.url and not sync:
            install_sigterm_handler()

    # -- process-local state (rebuilt after fork) --

    def _init_process_state(self):
        self._pid = os.getpid()
        # The hand-off to the sender: deque.append/popleft are atomic, so emit takes no lock.
        # Items are (event dict or lazy report, time.time()); the sender completes them.
        self._buf: deque = deque()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._send_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._queued = 0            # written by producers only (no lock: the hot path)
        self._dropped_full = 0      # idem
        self._inflight = 0          # events taken from the buffer, not yet sent/spooled/failed
        self._c = {"sent": 0, "spooled": 0, "dropped": 0, "failed": 0, "duplicates": 0,
                   "quarantined": 0, "written_ahead": 0}
        self._inflight_batch: list[bytes] | None = None  # the batch inside a request now
        self._taking = False  # the sender is moving events from the buffer into a batch
        # Write-ahead (write_ahead_s): encoded events taken from the buffer, also written to the
        # spool's write-ahead file _ahead_file, sent from memory at the next send.
        self._ahead: list[bytes] = []
        self._ahead_bytes = 0
        self._ahead_file: str | None = None
        self._ahead_armed = True  # False: the sender waits without a write-ahead deadline
        self._fails: dict[bytes, int] = {}  # sha1 of a spooled body -> 5xx answers in a row
        self._last_status: int | None = None    # of the last request: status and answer
        self._last_payload = b""
        self._lost_updates: list[int] | None = None  # [first, last] update not delivered
        self._accepted = 0  # requests with events the server took (2xx)
        self._flush_req = 0
        self._flush_done = 0
        self._paused_until = 0.0    # time.monotonic(); no network sends before it
        # The flush policy's cycle (recoverydash.sdk.flush): its start and jitter, and when the
        # oldest prompt event still queued was queued (None: none is), all time.monotonic().
        self._cycle_start = time.monotonic()
        self._jitter = _JITTER.uniform(*self.flush_policy.jitter_range(first=True))
        self._prompt_since: float | None = None
        self._failures = 0          # consecutive retryable failures (backoff exponent)

    def _open_spool(self):
        spool_dir, max_bytes, max_age = self._spool_args
        if spool_dir is False:
            self._spool = MemorySpool(max_bytes)
            return
        folder = run_folder(spool_dir, self.run_id)
        try:
            self._spool = DiskSpool(folder, max_bytes, max_age)
        except OSError as e:
            log.warning("recoverydash: spool folder %s unusable (%s); retrying from memory", folder, e)
            self._spool = MemorySpool(max_bytes)

    def _after_fork(self):
        self._init_process_state()
        self._once = _Once()

    def _check_fork(self):
        if self._pid != os.getpid():
            self._after_fork()

    def _ensure_thread(self):
        if self._pid != os.getpid():
            self._after_fork()
        t = self._thread
        if t is not None and t.is_alive():
            return
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stopping = False
            self._thread = threading.Thread(target=self._run, name="recoverydash-sender",
                                            daemon=True)
            self._thread.start()

    # -- public API --

    def counters(self) -> dict[str, int]:
        """Snapshot: queued, sent, spooled, dropped, failed, quarantined, duplicates (events), plus
        ``pending`` (in memory, not yet sent, spooled or failed) and ``spool_events`` (events now
        in the spool)."""
        try:
            self._check_fork()
            with self._lock:
                c = dict(self._c)
            c["queued"] = self._queued
            c["dropped"] += self._dropped_full
            c["pending"] = len(self._buf) + self._inflight + len(self._ahead)
            c["spool_events"] = self._spool.pending_events() if self._spool is not None else 0
            return c
        except Exception:  # pragma: no cover - counters must never hurt
            return {}

    def event_id(self, suffix: str, rank: int | None | str = "client") -> str:
        """Deterministic id ``{run_id}:{attempt}:{rank or 'c'}:{suffix}`` (hashed past 200 chars)."""
        r = self.rank if rank == "client" else rank
        eid = f"{self.run_id}:{self.attempt}:{'c' if r is None else r}:{suffix}"
        if len(eid) > 200:
            eid = eid[:150] + "~" + hashlib.sha256(eid.encode()).hexdigest()[:40]
        return eid

    def emit(self, event: dict) -> bool:
        """Queue one event; ``run_id``, ``attempt``, ``rank``, ``time`` (the moment of this call)
        and ``event_id`` (random) are filled by the sender thread when absent. Returns True when
        queued (or sent, in sync mode), False when dropped. Never raises, never blocks: about a
        microsecond (an atomic append; the JSON work happens on the sender thread)."""
        try:
            return self._push(event)
        except Exception as e:  # never into the training loop
            self._once(("emit", type(e)), logging.WARNING, "recoverydash: emit failed: %r", e)
            return False

    def _push(self, item) -> bool:
        """Hand an event dict, or a lazy report with ``materialize() -> dict``, to the sender."""
        if self._closed:
            return False
        self._queued += 1
        if not self.url:
            self._dropped_full += 1
            return False
        if self.sync:
            if self._pid != os.getpid():
                self._after_fork()
            ev = self._complete(item, time.time())
            if ev is not None:
                self._deliver([_encode(ev).encode()])
                self._drain_spool()
            return True
        if self._thread is None:  # first call, or the first after a fork
            self._ensure_thread()
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
        policy = self.flush_policy
        if policy.world_size is None and type(item) is dict and \
                item.get("type") == "attempt_started" and type(item.get("world_size")) is int:
            policy.world_size = item["world_size"]
            if self._sigterm_auto:  # the world size was unknown when the client was made
                self._sigterm_auto = False
                if self.url and not self.sync and single_process_job(item["world_size"]):
                    install_sigterm_handler()  # (does nothing outside the main thread)
        if self._prompt_since is None and is_prompt(item, self.rank):
            self._prompt_since = time.monotonic()
            self._wake.set()  # the sender recomputes its wait: at most prompt_flush_s now
        if len(buf) >= self.batch_max_events:
            self._ensure_thread()  # cheap insurance: a fork the at-fork hook did not see
            self._wake.set()
        return True

    def _complete(self, item, t: float) -> dict | None:
        """The wire event of a queued item (sender thread): fills the common fields."""
        try:
            ev = item.materialize() if hasattr(item, "materialize") else dict(item)
            ev.setdefault("run_id", self.run_id)
            ev.setdefault("attempt", self.attempt)
            if "rank" not in ev and self.rank is not None:
                ev["rank"] = self.rank
            if "time" not in ev:
                ev["time"] = datetime.fromtimestamp(t, UTC).isoformat(
                    timespec="milliseconds")
            if "event_id" not in ev:
                ev["event_id"] = self.event_id(f"{ev.get('type', 'event')}:{uuid.uuid4().hex[:16]}",
                                               ev.get("rank"))
            return ev
        except Exception as e:
            self._count("failed", 1)
            self._once(("complete", type(e)), logging.WARNING,
                       "recoverydash: event could not be built: %r", e)
            return None

    def flush(self, timeout: float | None = 5.0) -> bool:
        """Wait until every event queued so far is sent, spooled or failed, then try once to send
        what the spool holds (unless sending is paused). timeout: seconds (None: no limit).
        Returns True when nothing queued is left unresolved and the spool is empty."""
        try:
            self._check_fork()
            if not self.url:
                return True
            deadline = None if timeout is None else time.monotonic() + timeout
            if self.sync:
                while True:
                    self._drain_spool(force=True)
                    if self._spool is None or len(self._spool) == 0:
                        return True
                    wait = self._paused_until - time.monotonic()
                    if deadline is not None:
                        wait = min(wait, deadline - time.monotonic())
                    if wait <= 0 and (deadline is not None and time.monotonic() >= deadline):
                        return False
                    time.sleep(max(0.0, wait) + 0.001)
            self._ensure_thread()
            while True:
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
                    done = not self._buf and self._inflight == 0 and not self._ahead
                if done and len(self._spool) == 0:
                    return True
                # the spool still holds batches: wait for the pause to end, then drain again
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    return False
                wait = max(0.01, self._paused_until - now)
                if deadline is not None:
                    wait = min(wait, deadline - now)
                time.sleep(wait)
        except Exception as e:
            self._once(("flush", type(e)), logging.WARNING, "recoverydash: flush failed: %r", e)
            return False

    def close(self, timeout: float | None = None) -> bool:
        """Stop accepting events, send or spool what is queued within ``timeout`` seconds (default
        ``atexit_deadline``); events still in memory after that are written to the spool by the
        caller. Returns True when nothing was left pending. Never raises."""
        try:
            self._check_fork()
            if self._closed:
                return True
            timeout = self.atexit_deadline if timeout is None else timeout
            deadline = time.monotonic() + timeout
            self._closed = True
            if not self.url:
                return True
            if not self.sync and self._thread is not None and self._thread.is_alive():
                with self._lock:
                    self._stopping = True
                self._wake.set()
                self._thread.join(max(0.0, deadline - time.monotonic()))
            if self.sync:
                self._drain_spool(force=True)
            # Whatever is still queued: spool it here (fast, local) so a later process sends it.
            left, journal = [], None
            if self._ahead and not (self._thread is not None and self._thread.is_alive()):
                # written ahead, never sent (a sender that died): spooled as a batch below
                left, self._ahead, self._ahead_bytes = list(self._ahead), [], 0
                journal, self._ahead_file = self._ahead_file, None
            left += self._take_queued()
            if left:
                self._store(left)
            if journal and isinstance(self._spool, DiskSpool):
                self._spool.drop_ahead(journal)
            pending = self._inflight
            inflight = self._inflight_batch
            if inflight and self._thread is not None and self._thread.is_alive():
                # The sender is still waiting for an answer: keep a copy for the next process.
                self._store(list(inflight))
                log.warning("recoverydash: the server did not answer within the exit deadline "
                            "(%.1fs); the %d events in flight were written back to the spool",
                            timeout, len(inflight))
                pending = 0
            elif pending:
                log.warning("recoverydash: %d events pending at exit were not delivered "
                            "(a batch was in flight)", pending)
            spooled = self._spool.pending_events() if self._spool is not None else 0
            if spooled:
                log.warning("recoverydash: %d events wait in the spool %s; the next process of "
                            "run %s sends them", spooled, getattr(self._spool, "folder", "(memory)"),
                            self.run_id)
            return pending == 0
        except Exception as e:
            self._once(("close", type(e)), logging.WARNING, "recoverydash: close failed: %r", e)
            return False

    def _take_queued(self) -> list[bytes]:
        """Empty the queue: every queued event completed and encoded (bytes of its JSON), in
        queue order; an event that cannot be encoded is counted ``failed``. The caller writes
        them to the spool (``close`` at its deadline, ``spool_now`` on SIGTERM)."""
        out: list[bytes] = []
        while True:
            try:
                item, t = self._buf.popleft()
            except IndexError:
                return out
            ev = self._complete(item, t)
            if ev is not None:
                try:
                    out.append(_encode(ev).encode())
                except (TypeError, ValueError):
                    self._c["failed"] += 1

    def spool_now(self, wait_s: float = 0.5) -> int:
        """Write what is still in memory (the queue, and the batch in flight, as ``close`` does
        at its deadline) to the disk spool now, in the calling thread; the next process of the run
        sends it. No network, no lock the interrupted thread may hold: the SIGTERM path
        (``install_sigterm_handler``). It waits at most ``wait_s`` seconds for the sender to
        finish moving events into a batch (CPU work of a few milliseconds). Returns the number
        of events written (0 with an in-memory spool, whose events die with the process: the
        queue is left as it is then). Never raises."""
        try:
            spool = self._spool
            if not self.url or self.sync or self._pid != os.getpid() or \
                    not isinstance(spool, DiskSpool):
                return 0
            end = time.monotonic() + wait_s
            while self._taking and time.monotonic() < end:
                time.sleep(0.002)  # releases the GIL: the sender finishes its batch
            events = list(self._inflight_batch or ())
            if self._ahead and self._ahead_file is None:  # not on disk (the spool was full)
                events.extend(self._ahead)
            events += self._take_queued()
            written = 0
            for i in range(0, len(events), self.batch_max_events):
                part = events[i:i + self.batch_max_events]
                if spool.put(self._body(part), len(part), lock_timeout=wait_s):
                    written += len(part)
                    self._c["spooled"] += len(part)  # no lock: the main thread may hold it
                else:
                    self._c["dropped"] += len(part)
            return written
        except Exception:  # noqa: BLE001 - the signal path must never raise
            return 0

    # -- event helpers (docs/ingest-v1.md#4-event-types) --

    def attempt_started(self, *, world_size: int, dataset_version: str,
                        resumed_from: dict | None = None, global_batch_size: int | None = None,
                        micro_batch_size: int | None = None, grad_accum_steps: int | None = None,
                        config_digest: str | None = None, sampler: dict | None = None,
                        contract: dict | None = None, **extra) -> bool:
        """``attempt_started``. resumed_from: None (fresh start at update 0) or
        ``{"generation_id": str|None, "update": int, "cursor": [Cursor]}`` (see
        ``ledger.resumed_from``). A launch of a failure drill (``$RECOVERYDASH_DRILL_ID``, set by
        ``python -m recoverydash.sdk drill``) carries ``drill: {"drill_id", "role"}``
        (docs/ingest-v1.md#drill_result), so the server marks the run as a drill."""
        drill_id = os.environ.get("RECOVERYDASH_DRILL_ID")
        if drill_id and "drill" not in extra:
            extra["drill"] = {"drill_id": drill_id,
                              "role": os.environ.get("RECOVERYDASH_DRILL_ROLE", "")[:64]}
        ev = {"type": "attempt_started", "world_size": world_size,
              "dataset_version": dataset_version, "resumed_from": resumed_from,
              "global_batch_size": global_batch_size, "micro_batch_size": micro_batch_size,
              "grad_accum_steps": grad_accum_steps, "config_digest": config_digest,
              "sampler": sampler, "contract": contract, **extra}
        return self._emit_typed(ev, "start")

    def update_committed(self, update: int, spans: list[dict], *, samples: int | None = None,
                         tokens: int | None = None, ids_digest: str | None = None,
                         event_id: str | None = None, **extra) -> bool:
        """``update_committed``: spans (docs/ingest-v1.md#3-positions-spans-and-cursors) this rank
        contributed to optimizer update ``update`` (>= 1). Event id
        ``{run}:{attempt}:{rank}:u{update}`` unless given."""
        ev = {"type": "update_committed", "update": update, "spans": spans, "samples": samples,
              "tokens": tokens, "ids_digest": ids_digest, **extra}
        if event_id:
            ev["event_id"] = event_id
        return self._emit_typed(ev, f"u{update}")

    def update_aggregate(self, update: int, ranks: list[dict], *, event_id: str | None = None,
                         **extra) -> bool:
        """``update_aggregate`` (docs/ingest-v1.md#update_aggregate): the parts of several
        data-parallel ranks for optimizer update ``update`` (>= 1) in one event, sent by this
        reporter (a coordinator or node leader that has them, e.g. from
        ``CountingRecorder.commit_part`` of each rank). ``ranks``: ``[{"rank": int, "spans":
        [Span], "samples"?: int, "tokens"?: int, "ids_digest"?: str}]``, each rank once; a rank
        left out is a missing part of the update on the server. Event id
        ``{run}:{attempt}:{rank}:a{update}`` unless given. Queued like every event: never
        blocks, never raises; returns whether it was queued."""
        try:
            parts = [{k: v for k, v in part.items() if v is not None} for part in ranks]
        except Exception as e:  # never into the training loop
            self._once(("aggregate", type(e)), logging.WARNING,
                       "recoverydash: update_aggregate failed: %r", e)
            return False
        ev = {"type": "update_aggregate", "update": update, "ranks": parts, **extra}
        if event_id:
            ev["event_id"] = event_id
        return self._emit_typed(ev, f"a{update}")

    def heartbeat(self, update: int, fetched: list[dict] | None = None, **extra) -> bool:
        """``heartbeat``: last committed update and the read cursor ``fetched`` ([Cursor])."""
        ev = {"type": "heartbeat", "update": update, "fetched": fetched, **extra}
        # extra fields (docs/ingest-v1.md#heartbeat): what this process could not deliver
        dropped = self._c["dropped"] + self._dropped_full  # no counters(): it lists the spool
        quarantined = self._c["quarantined"]
        if dropped:
            ev.setdefault("sdk_dropped", dropped)
        if quarantined:
            ev.setdefault("sdk_quarantined", quarantined)
        if (dropped or quarantined) and self._lost_updates:
            ev.setdefault("sdk_lost_updates", list(self._lost_updates))
        return self._emit_typed(ev, None)

    def checkpoint_started(self, generation_id: str, update: int, required_shards: list[str],
                           components: list[str], **extra) -> bool:
        ev = {"type": "checkpoint_started", "generation_id": generation_id, "update": update,
              "required_shards": required_shards, "components": components, **extra}
        return self._emit_typed(ev, f"g:{generation_id}:started")

    def shard_written(self, generation_id: str, shard: str, update: int, objects: list[dict],
                      **extra) -> bool:
        ev = {"type": "shard_written", "generation_id": generation_id, "shard": shard,
              "update": update, "objects": objects, **extra}
        return self._emit_typed(ev, f"g:{generation_id}:shard:{shard}")

    def checkpoint_committed(self, manifest: dict, **extra) -> bool:
        """``checkpoint_committed`` carrying the published manifest document."""
        ev = {"type": "checkpoint_committed", "generation_id": manifest.get("generation_id"),
              "manifest": manifest, **extra}
        return self._emit_typed(ev, f"g:{manifest.get('generation_id')}:committed")

    def restore_completed(self, generation_id: str, seconds: float, **extra) -> bool:
        ev = {"type": "restore_completed", "generation_id": generation_id, "seconds": seconds,
              **extra}
        return self._emit_typed(ev, f"g:{generation_id}:restored")

    def restore_failed(self, generation_id: str, reason: str, message: str = "",
                       **extra) -> bool:
        """``restore_failed`` (docs/ingest-v1.md#restore_failed, an extension): loading
        ``generation_id`` did not complete. reason: ``object_damaged`` (an object's size or
        sha256 differs from the manifest), ``load_error`` (loading raised) or
        ``nothing_restorable`` (no candidate was left). May be sent before ``attempt_started``:
        the attempt then shows with its failure."""
        ev = {"type": "restore_failed", "generation_id": generation_id, "reason": reason,
              "message": (message or "")[:2000] or None, **extra}
        return self._emit_typed(ev, f"g:{generation_id}:restore_failed:{reason}")

    def attempt_ended(self, reason: str, update: int, *, fetched: list[dict] | None = None,
                      message: str | None = None, **extra) -> bool:
        """reason: ``completed``, ``failed``, ``preempted`` or ``cancelled``."""
        ev = {"type": "attempt_ended", "reason": reason, "update": update, "fetched": fetched,
              "message": message[:2000] if message else None, **extra}
        return self._emit_typed(ev, "end")

    def audit_window(self, update: int, accum_slot: int, sample_ids: Iterable, *,
                     rank: int | None = None, **extra) -> bool:
        """``audit_window``: up to 4,096 readable sample identities of one microbatch slot."""
        r = self.rank if rank is None else rank
        ev = {"type": "audit_window", "update": update, "rank": r if r is not None else 0,
              "accum_slot": accum_slot, "sample_ids": list(sample_ids)[:4096], **extra}
        return self._emit_typed(ev, f"audit:u{update}:s{accum_slot}")

    def _emit_typed(self, ev: dict, id_suffix: str | None) -> bool:
        try:
            ev = {k: v for k, v in ev.items() if v is not None or k == "resumed_from"}
            if id_suffix is not None and "event_id" not in ev:
                ev["event_id"] = self.event_id(id_suffix, ev.get("rank", "client"))
            return self.emit(ev)
        except Exception as e:  # pragma: no cover
            self._once(("typed", type(e)), logging.WARNING, "recoverydash: event failed: %r", e)
            return False

    # -- sender thread --

    def _run(self):
        while True:
            try:
                with self._lock:
                    stopping = self._stopping
                    req = self._flush_req
                if not self._sleep_until_due():
                    self._write_ahead()  # the oldest queued event reached write_ahead_s
                    continue
                with self._lock:
                    stopping = self._stopping
                    req = self._flush_req
                now = time.monotonic()
                if now >= self._cycle_start + self.flush_policy.interval() * self._jitter:
                    # a periodic send: the next cycle starts (a prompt, full or flush send
                    # leaves the cycle as it is: the job's ranks stay spread)
                    self._cycle_start = now
                    self._jitter = _JITTER.uniform(*self.flush_policy.jitter_range(first=False))
                self._prompt_since = None  # before taking: a later prompt event sets it again
                while True:  # one batch at a time: the buffer stays the bound on memory
                    self._taking = True  # the SIGTERM path waits for this batch to be visible
                    try:
                        # the written-ahead events first (the oldest), then the buffer
                        batch = self._ahead + self._take(
                            self.batch_max_events - len(self._ahead),
                            self.batch_max_bytes - self._ahead_bytes)
                        journal = self._ahead_file
                        self._ahead, self._ahead_bytes, self._ahead_file = [], 0, None
                        self._inflight_batch = batch or None
                    finally:
                        self._taking = False
                    if not batch:
                        break
                    try:
                        self._deliver(batch)
                    finally:
                        self._inflight = 0
                        self._inflight_batch = None
                        if journal:  # its events are now sent, spooled or set aside
                            self._spool.drop_ahead(journal)
                if not self._paused() or stopping or req > self._flush_done:
                    self._drain_spool(force=stopping or req > self._flush_done)
                with self._cond:
                    if req > self._flush_done:
                        self._flush_done = req
                        self._cond.notify_all()
                if stopping and not self._buf:
                    return
            except Exception as e:  # the thread must survive anything
                self._inflight = 0
                self._once(("run", type(e)), logging.WARNING, "recoverydash: sender error: %r", e)
                time.sleep(0.05)

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
            paused_left = self._paused_until - now
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
        is no write-ahead: off, no disk spool, or nothing queued (then the next emit wakes the
        sender). Whatever the flush interval: a 1 s interval's jittered wait reaches 1.2 s, a
        1.8 s one's 2.16 s, past the 2 s bound (a healthy sender then sends first and writes
        nothing ahead)."""
        if self.write_ahead_s <= 0 or not isinstance(self._spool, DiskSpool):
            return None
        self._ahead_armed = False  # before looking at the buffer: an emit after it wakes us
        try:
            queued_at = self._buf[0][1]
        except IndexError:
            return None
        self._ahead_armed = True
        return queued_at + self.write_ahead_s - time.time()

    def _write_ahead(self):
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
        if not part:
            return
        name = None
        try:
            name = self._spool.write_ahead(self._body(self._ahead), len(self._ahead),
                                           self._ahead_file)
        except OSError as e:
            self._once(("write-ahead", type(e)), logging.WARNING,
                       "recoverydash: write-ahead to the spool failed: %r", e)
        if name:
            self._ahead_file = name
            self._count("written_ahead", len(part))

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
            ev = self._complete(item, t)
            if ev is None:
                self._inflight -= 1
                continue
            try:
                b = _encode(ev).encode()
            except (TypeError, ValueError) as e:
                self._inflight -= 1
                self._count("failed", 1)
                self._once(("json",), logging.WARNING, "recoverydash: event not JSON: %r", e)
                continue
            batch.append(b)
            size += len(b)
        return batch

    def _paused(self) -> bool:
        return time.monotonic() < self._paused_until

    def _count(self, key: str, n: int, resolved: bool = True):
        """Add to a counter (``resolved`` is kept for call sites; pending is measured directly)."""
        with self._lock:
            self._c[key] += n

    @staticmethod
    def _body(events: list[bytes]) -> bytes:
        # zlib level 1 in gzip framing (wbits 31): the fastest stdlib path, and zlib releases the
        # GIL while it compresses. JSON of events compresses ~15x even at level 1.
        return zlib.compress(b'{"events":[' + b",".join(events) + b"]}", 1, 31)

    def _deliver(self, events: list[bytes]):
        """Send fresh events, or spool them while paused or while older batches wait."""
        with self._send_lock:
            if self._paused() or (self._spool is not None and self._spool.has_pending()):
                self._store(events)
                return
            outcome = self._send(self._body(events), len(events), events)
            if outcome == "retry":
                self._store(events)

    def _store(self, events: list[bytes]):
        body = self._body(events)
        n = len(events)
        ok = False
        try:
            ok = self._spool is not None and self._spool.put(body, n)
        except OSError as e:
            self._once(("spool-write", type(e)), logging.WARNING,
                       "recoverydash: spool write failed: %r", e)
        if ok:
            self._count("spooled", n)
        else:
            self._count("dropped", n)
            self._note_lost(events)
            self._once("spool-full", logging.WARNING,
                       "recoverydash: spool full or unusable; dropping %d events (counted)", n)

    def _drain_spool(self, force: bool = False):
        """Send spooled batches oldest first until one fails or the spool is empty. ``force``
        (flush, close) lists the folder even when it was found empty a moment ago."""
        if self._spool is None or not (force or self._spool.has_pending()):
            return
        with self._send_lock:
            if isinstance(self._spool, DiskSpool):
                self._spool.release_stale_claims()
            while not self._paused():
                item = self._spool.claim()
                if item is None:
                    break
                handle, body, n = item
                outcome = self._send(body, n, None, from_spool=True)
                key = hashlib.sha1(body).digest() if outcome == "retry" or self._fails else b""
                if outcome == "retry":
                    fails = self._fails[key] = self._fails.get(key, 0) + 1
                    status = self._last_status
                    if status is not None and status >= 500 and fails >= POISON_AFTER and \
                            self._isolate(body):
                        self._fails.pop(key, None)
                        self._spool.ack(handle)
                        continue
                    self._spool.nack(handle)
                    break
                self._fails.pop(key, None)
                self._spool.ack(handle)
            if isinstance(self._spool, DiskSpool) and self._spool.expired_events:
                self._count("dropped", self._spool.expired_events, resolved=False)
                self._spool.expired_events = 0

    def _send(self, body: bytes, n: int, events: list[bytes] | None, *,
              from_spool: bool = False) -> str:
        """POST one gzipped body. Returns "sent", "failed" or "retry" (caller spools / keeps it).

        Counting: fresh events resolve here when sent or failed; spooled ones were resolved when
        spooled, so their send adds to ``sent`` only."""
        status, headers, payload = self._post(body)
        self._last_status, self._last_payload = status, payload or b""
        resolved = not from_spool
        if status is not None and 200 <= status < 300:
            self._failures = 0
            dup = 0
            try:
                dup = int(json.loads(payload or b"{}").get("duplicates", 0))
            except (ValueError, AttributeError, TypeError):
                pass
            self._count("sent", n, resolved)
            if n:
                self._accepted += 1
            if dup:
                self._count("duplicates", dup, resolved=False)
            return "sent"
        if status is None or status in RETRYABLE_STATUSES:
            self._failures += 1
            pause = min(self.backoff_cap, self.backoff_base * 2 ** (self._failures - 1))
            pause *= _JITTER.uniform(0.5, 1.0)
            ra = _retry_after_seconds((headers or {}).get("Retry-After"), self.max_retry_after)
            if ra is not None:
                pause = ra
            self._paused_until = time.monotonic() + pause
            self._once(("retry", status), logging.WARNING,
                       "recoverydash: server answered %s; spooling and retrying in %.2fs "
                       "(logged once)", status if status is not None else "no connection", pause)
            return "retry"
        if status in (409, 413) and n > 1:
            if events is None:
                events = self._split_body(body)
            if events is not None and len(events) > 1:
                half = len(events) // 2
                outcomes = []
                for part in (events[:half], events[half:]):
                    o = self._send(self._body(part), len(part), part, from_spool=from_spool)
                    if o == "retry":
                        # the rest goes back to the retry store as its own batch
                        self._store_part(part, from_spool)
                        o = "sent"
                    outcomes.append(o)
                return "sent"
        if status == 400 and n > 1:
            if events is None:
                events = self._split_body(body)
            named = _refused_indexes(payload, len(events or ()))
            if events and named and len(named) < len(events):
                # set aside what the answer names, send the rest again
                self._refuse([events[i] for i in sorted(named)], status, payload, resolved)
                rest = [e for i, e in enumerate(events) if i not in named]
                if self._send(self._body(rest), len(rest), rest, from_spool=from_spool) == \
                        "retry":
                    self._store_part(rest, from_spool)
                return "sent"
        self._failures = 0
        if events is None:
            events = self._split_body(body)
        self._refuse(events, status, payload, resolved, n)
        detail = (payload or b"")[:500].decode("utf-8", "replace")
        if status == 409 and n == 1:
            self._explain_conflict(events, body, detail)
        self._once(("status", status), logging.ERROR,
                   "recoverydash: server refused a batch with %s (not retried, kept in %s; "
                   "logged once): %s", status,
                   getattr(self._spool, "rejected_folder", "memory"), detail)
        return "failed"

    def _explain_conflict(self, events: list[bytes] | None, body: bytes, detail: str):
        """A 409 on ``attempt_started``: its event id (run, attempt, rank, ``start``) is stored
        with other content, so this attempt number was already used by an earlier launch. Every
        event of this launch then lands in (or is refused from) the older attempt: logged as an
        error naming the cause, once per event id."""
        try:
            if events is None:
                events = self._split_body(body) or []
            ev = json.loads(events[0]) if events else {}
        except (ValueError, TypeError, IndexError):
            return
        if not isinstance(ev, dict) or ev.get("type") != "attempt_started":
            return
        self._once(("attempt-reused", ev.get("event_id")), logging.ERROR,
                   "recoverydash: the server refused attempt_started of run %s attempt %s "
                   "(409: event id %s is already stored with other content). Attempt %s was "
                   "most likely used by an earlier launch of this run: this launch's events "
                   "would be merged into it (no restart recorded, false duplicates). Let the SDK "
                   "pick the attempt (no attempt= and no RECOVERYDASH_ATTEMPT), or pass a new "
                   "number. Server said: %s", ev.get("run_id"), ev.get("attempt"),
                   ev.get("event_id"), ev.get("attempt"), detail)

    def _refuse(self, events: list[bytes] | None, status: int | None, payload: bytes,
                resolved: bool, n: int | None = None):
        """Events the server refused for good: counted ``failed`` and set aside."""
        n = len(events) if n is None and events is not None else (n or 0)
        self._count("failed", n, resolved)
        if events:
            self._set_aside(events, status, payload, f"refused by the server with HTTP {status}",
                            quiet=True)

    def _set_aside(self, events: list[bytes], status: int | None, payload: bytes, reason: str,
                   quiet: bool = False):
        """Write events the server will not take to ``rejected/`` with its answer; counted
        ``quarantined`` (``dropped`` when the folder is full or the disk refuses)."""
        self._note_lost(events)
        path = None
        try:
            path = self._spool.reject(events, status, payload or b"", reason) \
                if self._spool is not None else None
            kept = self._spool is not None and (path is not None
                                                or not isinstance(self._spool, DiskSpool))
        except OSError as e:
            kept = False
            self._once(("reject-write", type(e)), logging.WARNING,
                       "recoverydash: cannot write to rejected/: %r", e)
        self._count("quarantined" if kept else "dropped", len(events))
        if quiet:  # the caller logs
            return
        self._once(("set-aside", status), logging.ERROR,
                   "recoverydash: %d event(s) set aside (%s) in %s; logged once per status",
                   len(events), reason, path or getattr(self._spool, "rejected_folder", "memory"))

    def _isolate(self, body: bytes) -> bool:
        """A spooled batch the server answered 5xx to ``POISON_AFTER`` times in a row: find the
        event(s) it fails on. Probes the server with an empty batch first; when that is not
        accepted the server is in trouble, not the batch: returns False (the caller keeps it).
        Else splits the batch in halves until each part is sent, refused for good, or is a
        single event answered 5xx. Those single events are set aside as poison only when the
        server accepted other events meanwhile (a server that fails on every event is broken,
        and its events wait in the spool); a server that stops answering midway, or a search
        longer than ``4 * log2(n) + 8`` requests, leaves the rest in the spool. Returns True:
        the batch's events are all accounted for (sent, set aside or spooled again)."""
        events = self._split_body(body)
        if not events:
            return False
        status, _, _ = self._post(self._body([]))
        if status is None or not 200 <= status < 300:
            return False
        accepted_before = self._accepted
        budget = 4 * len(events).bit_length() + 8
        stack, suspects = [events], []
        while stack and budget > 0:
            budget -= 1
            part = stack.pop()
            self._paused_until = 0.0  # the server answers: the backoff is for outages
            if self._send(self._body(part), len(part), part, from_spool=True) != "retry":
                continue
            status, payload = self._last_status, self._last_payload
            if status is None or status < 500:  # no answer, 408 or 429: wait in the spool
                stack.append(part)
                break
            if len(part) == 1:
                suspects.append((part, status, payload))
            else:
                half = len(part) // 2
                stack.extend((part[half:], part[:half]))
        proven = self._accepted > accepted_before  # the server takes other events
        for part, status, payload in suspects:
            if proven:
                self._set_aside(part, status, payload,
                                f"HTTP {status} again and again while the server accepted the "
                                "other events of its batch (poison)")
            else:
                stack.append(part)
        for rest in stack[::-1]:
            self._store_part(rest, True)
        if proven:
            self._paused_until, self._failures = 0.0, 0
        return True

    def _note_lost(self, events: list[bytes]):
        """Widen ``[first, last]`` of the updates among events not delivered."""
        for e in events:
            if b'"update_committed"' not in e:
                continue
            try:
                self._note_update(json.loads(e).get("update"))
            except (ValueError, AttributeError):
                pass

    def _note_lost_item(self, item):
        """The same for a queued item dropped before it was built (a full queue)."""
        try:
            if type(item) is dict:
                if item.get("type") == "update_committed":
                    self._note_update(item.get("update"))
            else:
                self._note_update(getattr(item, "update", None))
        except Exception:  # noqa: BLE001 - the drop path must not raise
            pass

    def _note_update(self, update):
        if type(update) is not int:
            return
        with self._lock:
            lost = self._lost_updates
            if lost is None:
                self._lost_updates = [update, update]
            else:
                lost[0], lost[1] = min(lost[0], update), max(lost[1], update)

    def _store_part(self, part: list[bytes], from_spool: bool):
        if from_spool:
            # already counted as spooled once; store again without counting it twice
            try:
                if self._spool is not None and self._spool.put(self._body(part), len(part)):
                    return
            except OSError:
                pass
            self._count("dropped", len(part), resolved=False)
            self._note_lost(part)
        else:
            self._store(part)

    @staticmethod
    def _split_body(body: bytes) -> list[bytes] | None:
        try:
            doc = json.loads(gzip.decompress(body))
            return [json.dumps(e, separators=(",", ":")).encode() for e in doc["events"]]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _post(self, body: bytes):
        """(status or None on network error, headers dict, body bytes)."""
        timeout = self.request_timeout
        if self._stopping:
            timeout = min(timeout, max(0.2, self.atexit_deadline / 2))
        status, headers, payload, error = _post_gzip(self.endpoint, self.token, body, timeout,
                                                     self.user_agent, MAX_ANSWER_BYTES)
        if error is not None:
            self._once(("net", type(error)), logging.WARNING,
                       "recoverydash: cannot reach %s: %r (events are spooled)", self.endpoint,
                       error)
        return status, headers, payload


def _refused_indexes(payload: bytes | None, n: int) -> set[int] | None:
    """The indexes a 400 answer names (``{"errors": [{"index": i}, ...]}``), or None when it
    names none, or speaks of the request as a whole (a null index)."""
    try:
        errors = json.loads(payload or b"{}").get("errors") or []
        named = {e["index"] for e in errors}
    except (ValueError, AttributeError, TypeError, KeyError):
        return None
    if not named or None in named or not all(type(i) is int and 0 <= i < n for i in named):
        return None
    return named


# --- process-wide registry: atexit flush and fork handling ---------------------------------------

_clients: weakref.WeakSet[Client] = weakref.WeakSet()


def _register(client: Client):
    _clients.add(client)


def _atexit_flush():
    for c in list(_clients):
        try:
            if c._pid == os.getpid():
                c.close()
        except Exception:  # pragma: no cover
            pass


def _after_fork_in_child():
    for c in list(_clients):
        try:
            c._after_fork()
        except Exception:  # pragma: no cover
            pass


atexit.register(_atexit_flush)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# --- SIGTERM: spool what is queued, then hand over ------------------------------------------------

_sigterm_previous: Any = None   # the handler ours replaced: SIG_DFL, SIG_IGN or a callable
_sigterm_running = False
_sigterm_installed = False  # ours was installed in this process (a fork's child inherits it)


def single_process_job(world_size: int | None) -> bool:
    """Whether this process is known to be a whole job of one process: ``world_size`` (the
    client's, else ``$WORLD_SIZE``) is 1 and the process was not started by torchrun /
    torchelastic (``$TORCHELASTIC_RUN_ID`` and ``$LOCAL_RANK`` unset). Only then does
    ``Client`` install the SIGTERM handler by default: a rank of a multi-process job is, when
    torchrun sends SIGTERM, most likely blocked in a collective in C (``all_reduce`` waiting for
    the failed rank), where a Python handler never runs, so the handler would keep it alive
    until torchrun's SIGKILL 30 s later instead of letting SIGTERM end it at once."""
    if world_size is None:
        try:
            world_size = int(os.environ.get("WORLD_SIZE", "")) or None
        except ValueError:
            world_size = None
    return world_size == 1 and not os.environ.get("TORCHELASTIC_RUN_ID") and \
        not os.environ.get("LOCAL_RANK")


def install_sigterm_handler() -> bool:
    """Install the SDK's SIGTERM handler once per process (``Client`` calls it by default only
    for a single-process job, ``single_process_job``; ``Client(handle_sigterm=True)`` or
    ``RECOVERYDASH_HANDLE_SIGTERM=1`` for any job, ``False`` / ``0`` never). Caveat: Python runs
    it only in the main thread between bytecodes; a process whose main thread is blocked in C (a
    collective waiting for a failed rank) does not run it, so instead of dying of SIGTERM at once
    it would live until SIGKILL (torchrun's, 30 s later): the watchdog started with it
    (``_start_sigterm_watchdog``) then spools and ends the process by SIGTERM after
    ``WATCHDOG_GRACE_S`` (0.5 s), unless another wakeup fd was set first. torchrun sends SIGTERM
    to the other ranks when one fails, Slurm before its SIGKILL; Python's default action ends the
    process without ``atexit``, so the queued events were lost. On SIGTERM the handler writes
    every client's queue and batch in flight to the disk spool (``Client.spool_now``: local
    files, no network, at most about half a second of waiting for the sender), then hands over:
    the previous handler when it was a Python callable (a framework's own: Lightning,
    accelerate, torchelastic) is called with the same arguments; ``SIG_IGN`` keeps the signal
    ignored; ``SIG_DFL`` is restored and SIGTERM raised again, so the process still dies of
    SIGTERM (exit status -15, which torchrun and Slurm read).

    Installs only in the main thread of the main interpreter and only when the current handler
    was set from Python (``signal.getsignal`` is not None), so it can be handed over, and only
    once per process: a handler set after ours (a framework's, which calls the one it replaced)
    is left in place by a later client, since putting ours in front of it again would make the
    two call each other without end. Returns True when the handler is (now or already) in
    place, False when it was not installed."""
    global _sigterm_previous, _sigterm_installed
    try:
        if not hasattr(signal, "SIGTERM") or \
                threading.current_thread() is not threading.main_thread():
            return False
        current = signal.getsignal(signal.SIGTERM)
        if current is _on_sigterm:
            return True
        if current is None or _sigterm_installed:  # set outside Python; or replaced after ours
            return False
        signal.signal(signal.SIGTERM, _on_sigterm)
        _sigterm_previous = current
        _sigterm_installed = True
        _start_sigterm_watchdog()
        return True
    except (ValueError, OSError, RuntimeError, AttributeError):
        return False


# The watchdog: Python runs ``_on_sigterm`` only in the main thread between bytecodes, never while
# it is blocked in C (a collective waiting for a failed rank). CPython's C-level signal handler
# writes the signal number to the wakeup fd at once (``signal.set_wakeup_fd``); a daemon thread
# blocked on that pipe sees SIGTERM and, when the Python handler has not started within
# WATCHDOG_GRACE_S, spools the queues itself and, when SIGTERM's disposition before ours was the
# default, restores SIG_DFL process-wide (libc ``signal`` through ctypes: ``signal.signal`` works
# in the main thread only) and raises SIGTERM again: the process dies of SIGTERM as it would have
# without the SDK. Without libc's ``signal`` it ends the process with SIGKILL (exit -9). When the
# disposition before ours was a framework's callable or SIG_IGN, it only spools (those run, or
# not, when the main thread can, as without the SDK). A forked child unsets the inherited wakeup
# fd in its at-fork hook; a SIGTERM it receives before that hook ran (or in a fork made from C
# without Python's at-fork hooks) would reach the parent's watchdog.
WATCHDOG_GRACE_S = 0.5
_spooling = threading.Lock()    # one of the handler and the watchdog spools a SIGTERM
_handler_calls = 0   # times _on_sigterm started in this process (the watchdog stands aside)
_watchdog_fds: tuple[int, int] | None = None  # (read, write) of the wakeup pipe, this process


def _start_sigterm_watchdog() -> bool:
    """Start the SIGTERM watchdog (main thread, once per process, from
    ``install_sigterm_handler``). Only when no wakeup fd was set (asyncio's loop, another
    library's): ``set_wakeup_fd`` returns the previous one, which is then put back and the
    watchdog skipped (the handler alone: it waits for the main thread). Returns True when it
    runs."""
    global _watchdog_fds
    if _watchdog_fds is not None or not hasattr(signal, "set_wakeup_fd"):
        return _watchdog_fds is not None
    r, w = os.pipe()   # non-inheritable: an exec-ed child does not get them
    try:
        os.set_blocking(w, False)
        previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        if previous != -1:
            signal.set_wakeup_fd(previous)
            raise OSError("a wakeup fd is already set")
    except (OSError, ValueError):
        os.close(r)
        os.close(w)
        return False
    _watchdog_fds = (r, w)
    threading.Thread(target=_sigterm_watchdog, args=(r,), name="recoverydash-sigterm-watchdog",
                     daemon=True).start()
    return True


def _sigterm_watchdog(fd: int):
    """The watchdog thread (see ``_start_sigterm_watchdog``): reads signal numbers from the
    wakeup pipe; other signals are ignored."""
    seen = _handler_calls
    while True:
        try:
            data = os.read(fd, 512)
        except InterruptedError:  # pragma: no cover - PEP 475 retries
            continue
        except OSError:
            return  # closed (a fork's child closed its copy)
        if not data:
            return
        terms = data.count(int(signal.SIGTERM))
        if not terms:
            continue
        seen += terms
        end = time.monotonic() + WATCHDOG_GRACE_S
        while _handler_calls < seen and time.monotonic() < end:
            time.sleep(0.01)
        if _handler_calls < seen:
            seen = _handler_calls  # (coalesced signals run the handler once)
            _watchdog_takes_over(seen)


def _spool_every_client() -> None:
    """``spool_now`` of every client of the process (each never raises): the SIGTERM paths."""
    for c in list(_clients):
        c.spool_now()


def _watchdog_takes_over(calls: int):
    """SIGTERM found the main thread in C: spool every client's queue from this thread
    (``spool_now`` takes no lock the main thread may hold; a duplicate of the batch in flight is
    counted and ignored by the server), then, when the disposition before ours was SIG_DFL and
    ours is still the handler, end the process by SIGTERM's default action."""
    if not _spooling.acquire(blocking=False):
        return  # the handler is spooling
    try:
        _spool_every_client()
    finally:
        _spooling.release()
    if _handler_calls > calls or signal.getsignal(signal.SIGTERM) is not _on_sigterm or \
            _sigterm_previous != signal.SIG_DFL:
        return  # a framework's handler (or SIG_IGN) decides; it runs when the main thread can
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
        if libc.signal(int(signal.SIGTERM), None) == ctypes.c_void_p(-1).value:  # SIG_ERR
            raise OSError(ctypes.get_errno(), "signal(SIGTERM, SIG_DFL) failed")
        os.kill(os.getpid(), signal.SIGTERM)
    except Exception:  # noqa: BLE001 - no libc signal(): still end the process as SIGTERM would
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(5)  # pragma: no cover - the process is ending


def _watchdog_after_fork_in_child():
    """A forked child (a DataLoader worker) inherits the wakeup fd, not the thread: its SIGTERM
    would be written to the parent's pipe and wake the parent's watchdog. Unset it (the forking
    thread is the child's main thread) and close the child's copies of the pipe."""
    global _watchdog_fds
    fds, _watchdog_fds = _watchdog_fds, None
    if fds is None:
        return
    try:
        signal.set_wakeup_fd(-1)
    except (ValueError, OSError):  # pragma: no cover
        pass
    for fd in fds:
        try:
            os.close(fd)
        except OSError:  # pragma: no cover
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_watchdog_after_fork_in_child)


def _on_sigterm(signum, frame):
    """The SIGTERM handler (see ``install_sigterm_handler``)."""
    global _sigterm_running, _handler_calls
    _handler_calls += 1
    if not _sigterm_running:  # a second SIGTERM during the first goes straight to the hand-over
        _sigterm_running = True
        locked = _spooling.acquire(timeout=2.0)  # the watchdog may be spooling (then it is done)
        try:
            if locked:
                _spool_every_client()
        finally:
            if locked:
                _spooling.release()
            _sigterm_running = False
    previous = _sigterm_previous
    if callable(previous):
        previous(signum, frame)
        return
    if previous == signal.SIG_IGN:
        return
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except (ValueError, OSError):  # pragma: no cover
        pass
    os.kill(os.getpid(), signal.SIGTERM)


_default_client: Client | None = None


def init(url: str | None = None, token: str | None = None, run_id: str | None = None,
         **kwargs: Any) -> Client:
    """Create the process's default client. Unset arguments come from ``RECOVERYDASH_URL``,
    ``RECOVERYDASH_TOKEN`` and ``RECOVERYDASH_RUN_ID``. Returns the client (also kept as the
    default one, ``get_client()``). Never raises: with no URL the client sends nothing.

    ``kwargs`` go to ``Client``; with no ``attempt`` (and no ``$RECOVERYDASH_ATTEMPT``) the
    attempt is new for every launch (``recoverydash.sdk.attempt``): pass ``location=`` (and
    ``restored=`` the restore plan) so the checkpoint location counts too. With
    ``torch.distributed`` initialised, call it on every rank at the same point (rank 0 decides
    the attempt and broadcasts it)."""
    global _default_client
    try:
        _default_client = Client(url or os.environ.get("RECOVERYDASH_URL"),
                                 token or os.environ.get("RECOVERYDASH_TOKEN"),
                                 run_id or os.environ.get("RECOVERYDASH_RUN_ID") or "run", **kwargs)
    except Exception as e:  # pragma: no cover
        log.warning("recoverydash: init failed (%r); events are discarded", e)
        _default_client = Client(None, None, run_id or "run")
    return _default_client


def get_client() -> Client | None:
    """The client made by ``init``, or None."""
    return _default_client


# --- sending a run's spool before the restore question -------------------------------------------

@dataclass
class SpoolSent:
    """What ``send_spool`` did: ``sent`` events the server took (2xx), ``left`` events still in
    the run's spool folder afterwards (batches, claims, write-ahead files: ``unsent_events``),
    ``stopped`` why it ended before the folder was empty (``""``: nothing is left;
    ``"timeout"``; ``"answered <status>"``; ``"unreachable: <error>"``; ``"error: ..."``) and
    ``folder`` the run's spool folder (None: no disk spool to send)."""

    sent: int = 0
    left: int = 0
    stopped: str = ""
    folder: str | None = None


def _post_gzip(endpoint: str, token: str, body: bytes, timeout: float, user_agent: str,
               max_bytes: int) -> tuple[int | None, dict, bytes, Exception | None]:
    """POST one gzipped batch body (``{"events": [...]}``) to ``endpoint``, within ``timeout``
    seconds per socket operation: ``(status, headers, at most max_bytes of the answer, None)``,
    an HTTP error status answered like a success, or ``(None, {}, b"", the error)`` on a network
    error (URLError, timeouts, resets, DNS, SSL). Never raises. The client's sender and
    ``send_spool`` both send through it."""
    req = urllib.request.Request(endpoint, data=body, method="POST", headers={
        "Content-Type": "application/json", "Content-Encoding": "gzip",
        "Authorization": f"Bearer {token}", "User-Agent": user_agent})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read(max_bytes), None
    except urllib.error.HTTPError as e:
        try:
            payload = e.read(max_bytes)
        except Exception:  # noqa: BLE001 - the status is the answer then
            payload = b""
        return e.code, dict(e.headers or {}), payload, None
    except Exception as e:  # noqa: BLE001 - URLError, timeouts, resets, DNS, SSL
        return None, {}, b"", e


def _live_client(run_id: str, folder: str) -> Client | None:
    """A client of this process, open, sending run ``run_id`` through the disk spool
    ``folder`` (its sender drains that folder: a second drainer would release its claims)."""
    for c in list(_clients):
        spool = c._spool
        if c._pid == os.getpid() and not c._closed and c.url and c.run_id == str(run_id) and \
                isinstance(spool, DiskSpool) and os.path.abspath(spool.folder) == folder:
            return c
    return None


def send_spool(url: str | None, token: str | None, run_id: str, *,
               spool_dir: str | bool | None = None, timeout: float = 2.5,
               user_agent: str = "recoverydash-sdk/1") -> SpoolSent:
    """Send what the run's disk spool (``<spool_dir>/<run_id>/``, ``spool_dir`` None:
    ``default_spool_dir()``; False: none) holds to ``{url}/api/v1/events``, oldest first, within
    ``timeout`` seconds in all: what a resumed launch does before it asks its restore plan, so
    the server has heard what the previous attempt could not send (its ``checkpoint_committed``
    above all).

    The batches of processes that are gone (claims, write-ahead files) are released first
    (``DiskSpool.release_stale_claims``). A batch the server takes (2xx) is deleted; the first one
    it does not take (any other status, a network error) is put back and ends the sending: the
    run's own client later handles it as usual (retries, splitting, setting aside), since this
    token may lack the ingest scope and nothing here is ever set aside or expired. When a client
    of this process already sends this run through that folder, its ``flush(timeout)`` does it.
    The requests run in a daemon thread: at ``timeout`` this call returns, and the thread stops
    after the request under way (whose batch stays claimed until it is answered). Returns a
    ``SpoolSent``. Never raises."""
    out = SpoolSent()
    try:
        if not url or spool_dir is False:
            return out
        folder = os.path.abspath(run_folder(spool_dir if isinstance(spool_dir, str) else None,
                                            run_id))
        out.folder = folder
        deadline = time.monotonic() + max(0.0, timeout)
        live = _live_client(run_id, folder)
        if live is not None:
            done = live.flush(max(0.0, deadline - time.monotonic()))
            out.left = unsent_events(folder)
            out.stopped = "" if done and not out.left else "timeout"
            return out
        if not unsent_events(folder):
            return out  # an empty or missing folder: nothing to send (and none is made)
        # no expiry (1e9 s): deleting old batches, and counting them dropped, is the client's
        spool = DiskSpool(folder, max_bytes=1 << 62, max_age_s=1e9)
        endpoint = url.rstrip("/") + "/api/v1/events"
        stop = threading.Event()
        result = {"sent": 0, "stopped": "timeout"}

        def send() -> None:
            try:
                while not stop.is_set():
                    item = spool.claim()
                    if item is None:
                        result["stopped"] = ""
                        return
                    handle, body, n = item
                    left = deadline - time.monotonic()
                    if left <= 0:
                        spool.nack(handle)
                        return
                    # at most 64 KiB of the answer is read: its status is what counts here
                    status, _, _, error = _post_gzip(endpoint, token or "", body, left,
                                                     user_agent, 65536)
                    if status is not None and 200 <= status < 300:
                        spool.ack(handle)
                        result["sent"] += n
                        continue
                    spool.nack(handle)
                    result["stopped"] = (f"answered {status}" if status is not None
                                         else f"unreachable: {repr(error)[:200]}")
                    return
            except Exception as e:  # noqa: BLE001 - a thread of the SDK must never raise
                result["stopped"] = f"error: {e!r}"[:200]

        thread = threading.Thread(target=send, name="recoverydash-spool-send", daemon=True)
        thread.start()
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            stop.set()
        out.sent, out.stopped = result["sent"], result["stopped"]
        out.left = unsent_events(folder)
        if not out.left and out.stopped == "timeout":
            out.stopped = ""
        return out
    except Exception as e:  # noqa: BLE001 - the restore question goes on without it
        out.stopped = f"error: {e!r}"[:200]
        return out
