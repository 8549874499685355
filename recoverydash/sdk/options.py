"""How a ``Client`` sends: every tuning knob in one dataclass (``Client(..., **options)`` takes
each field as a keyword; ``Client(..., options=ClientOptions(...))`` takes them all at once).

Times are seconds, sizes bytes, unless a name says events. The defaults suit a job of any
size (``recoverydash.sdk.flush``); tests shorten the times.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from recoverydash.sdk.flush import JOB_REQUESTS_PER_S, MAX_INTERVAL_S, PROMPT_S


@dataclass
class ClientOptions:
    """The sender's settings.

    spool_dir: root of the on-disk spool (None: ``default_spool_dir()``); the run's batches live
    in ``<spool_dir>/<run_id>/``. ``False``: an in-memory retry store (lost with the process).
    spool_max_bytes: bound of the spool, bytes of gzipped bodies (256 MiB).
    spool_max_age_s: spooled batches older than this are deleted, counted dropped (7 days).
    max_queue: events held in memory before ``emit`` drops (10,000).
    batch_max_events / batch_max_bytes: a batch is sent when it reaches either (500 events,
    1 MiB of JSON) or when the flush policy's interval (+-20% jitter) has passed.
    flush_interval: the shortest periodic wait (1 s). The wait is ``min(max_flush_interval,
    max(flush_interval, world_size / job_requests_per_s))``: 1 s up to 40 processes, 25.6 s at
    1,024, 60 s from 2,400 on (``recoverydash.sdk.flush``).
    world_size: processes of the job that each run a client like this one (None:
    ``$WORLD_SIZE``, else the ``world_size`` of the client's first ``attempt_started``, else 1).
    A single reporter (of ``update_aggregate``) passes 1.
    job_requests_per_s: the whole job's request budget (40 requests/s: under the server's
    default per-token rate limit of 50).
    max_flush_interval: the longest periodic wait (60 s: within the rank silence floor of 120 s
    with jitter).
    prompt_flush_s: ``checkpoint_committed`` and ``restore_failed``, and from rank 0 (or a
    client without a rank) ``attempt_started``, ``attempt_ended`` and ``restore_completed``,
    are sent at most this long after they are queued (1 s).
    request_timeout: per socket operation of a request (10 s).
    backoff_base / backoff_cap: the pause after k consecutive failures is
    ``min(cap, base * 2**k) * uniform(0.5, 1)`` (0.5 s, 30 s); ``Retry-After`` wins when given,
    at most ``max_retry_after`` (300 s).
    auth_retry_s: the pause after the server refused the token (401, 403), before it is tried
    again (60 s); events wait in the spool meanwhile.
    atexit_deadline: what the interpreter's exit may spend sending (2 s); the rest is spooled.
    sync: deliver in the caller's thread (tests); retries are then paused batches in the spool,
    sent again by the next emit or flush.
    user_agent: the requests' ``User-Agent``.
    handle_sigterm: install the SIGTERM hand-over (``recoverydash.sdk.sigterm``). None:
    ``$RECOVERYDASH_HANDLE_SIGTERM`` when set (``0``, ``false``, ``no``, ``off``: no; anything
    else: yes), else only for a single-process job.
    write_ahead_s: with a disk spool, events queued this long before their send are written to
    a write-ahead file of the spool and still sent from memory (2 s; 0 turns it off): a SIGKILL
    loses at most the events of the last ``write_ahead_s``.
    """

    spool_dir: str | bool | None = None
    spool_max_bytes: int = 256 * 1024 * 1024
    spool_max_age_s: float = 7 * 86400.0
    max_queue: int = 10_000
    batch_max_events: int = 500
    batch_max_bytes: int = 1024 * 1024
    flush_interval: float = 1.0
    world_size: int | None = None
    job_requests_per_s: float = JOB_REQUESTS_PER_S
    max_flush_interval: float = MAX_INTERVAL_S
    prompt_flush_s: float = PROMPT_S
    request_timeout: float = 10.0
    backoff_base: float = 0.5
    backoff_cap: float = 30.0
    max_retry_after: float = 300.0
    auth_retry_s: float = 60.0
    atexit_deadline: float = 2.0
    sync: bool = False
    user_agent: str = "recoverydash-sdk/1"
    handle_sigterm: bool | None = None
    write_ahead_s: float = 2.0

    def with_changes(self, **changes: Any) -> ClientOptions:
        """A copy with ``changes`` (keyword names are fields; an unknown one raises TypeError,
        as a mistyped keyword argument does)."""
        return dataclasses.replace(self, **changes) if changes else self

    def job_world_size(self) -> int | None:
        """``world_size``, else ``$WORLD_SIZE`` (None when unset or not a number)."""
        if self.world_size is not None:
            return self.world_size
        try:
            return int(os.environ.get("WORLD_SIZE", "")) or None
        except ValueError:
            return None


__all__ = ["ClientOptions"]
