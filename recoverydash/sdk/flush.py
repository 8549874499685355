"""When the sender thread sends: the flush policy (README "SDK",
docs/ingest-v1.md#sdk-flush-policy).

Every process of a job runs its own sender, so the job's request rate is the sum of theirs. A
fixed one-second timer makes a 16,384-rank job send 16,384 requests a second, each costing the
server ~5-7 ms of web CPU whatever it carries (bench/ingest_one_run.py): some 100 cores for
requests that carry one event each. The default policy therefore spreads the job's requests:

- each process waits ``interval = min(max_interval, max(base_interval, world_size /
  job_requests_per_s))`` seconds between periodic sends (times a jitter in [0.8, 1.2], so the
  ranks of a job that started together drift apart), so the whole job sends at most about
  ``job_requests_per_s`` (:data:`JOB_REQUESTS_PER_S`, 40: under the server's default per-token
  rate limit of 50) requests a second until ``max_interval`` (:data:`MAX_INTERVAL_S`, 60 s)
  caps the wait, from 2,400 ranks on: at 16,384 ranks the interval is 60 s and the job sends
  16,384 / 60 = 273 requests a second (the server's rate limit must allow them), each with the ~60
  updates and heartbeats its rank gathered meanwhile. The cap keeps every rank's events reaching the
  server well within the rank silence limit (``RECOVERYDASH_RANK_SILENT_FLOOR_S``, 120 s,
  docs/definitions.md#silence-limits): 1.2 x 60 s = 72 s at the latest;
- a *prompt* event (:data:`PROMPT_TYPES`: checkpoint_committed and restore_failed from any
  rank; :data:`LEAD_PROMPT_TYPES`: attempt_started, attempt_ended and restore_completed from the
  lead reporter, rank 0 or a client without a rank: what the restore decision and the on-call
  view wait for) is sent at most ``prompt_s`` (:data:`PROMPT_S`, 1 s) after it was queued,
  never later than the periodic send would have taken it, together with everything queued
  before it (order is kept); such a send does not restart the periodic cycle. The other ranks'
  attempt_started, attempt_ended and restore_completed (every rank sends one at the same
  moment) go with their next periodic send, or at ``close()`` (the SDK's exit path);
- the first cycle of a large job's process (interval stretched past ``base_interval``) draws its
  jitter from [0.05, 1.2], so ranks started together spread their first sends over the interval;
- ``batch_max_events`` / ``batch_max_bytes`` waiting, ``flush()`` and ``close()`` send at once,
  as before.

Nothing here blocks or drops: the policy only decides how long the sender thread sleeps; the
queue (``max_queue``, 10,000 events) holds a rank's 60 s of updates and heartbeats many times
over. ``world_size`` comes from the ``Client`` argument, else ``$WORLD_SIZE`` (torchrun, Slurm
launchers), else the ``world_size`` of the first ``attempt_started`` the client sends, else 1.

Pure (no clock of its own, no randomness of its own): the sender passes ``now`` and the jitter,
so the tests use exact values.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Requests a second the whole job aims at (all its processes together), before MAX_INTERVAL_S:
#: below the server's default per-token rate limit (RECOVERYDASH_RATE_LIMIT_PER_SECOND, 50).
JOB_REQUESTS_PER_S = 40.0
#: The longest periodic wait (seconds): half the rank silence floor, with jitter 72 s at most.
MAX_INTERVAL_S = 60.0
#: Seconds a prompt event may wait at most before it is sent.
PROMPT_S = 1.0
#: Event types sent within PROMPT_S from any rank: a restore decision or a page waits for them.
PROMPT_TYPES = frozenset({"checkpoint_committed", "restore_failed"})
#: Event types every rank sends at the same moment (a launch, a restore, an exit): sent within
#: PROMPT_S from the lead reporter (rank 0, or a client without a rank), which is what makes the
#: server know the attempt; the other ranks' copies go with their next periodic send (or
#: ``close()``), so a launch of 16,384 ranks is not 16,384 requests in one second.
LEAD_PROMPT_TYPES = frozenset({"attempt_started", "attempt_ended", "restore_completed"})
#: Periodic waits are multiplied by a factor drawn uniformly from this interval.
JITTER = (0.8, 1.2)


@dataclass
class FlushPolicy:
    """The sender's timing for one client (module docstring).

    ``base_interval``: the shortest periodic wait, seconds (``Client(flush_interval=...)``,
    default 1 s). ``world_size``: processes of the job sending like this one (None: unknown,
    counted as 1). ``job_requests_per_s``: the job's request budget (requests/s, > 0).
    ``max_interval``: the longest periodic wait, seconds (never below ``base_interval``).
    ``prompt_s``: the longest wait of a prompt event, seconds."""

    base_interval: float = 1.0
    world_size: int | None = None
    job_requests_per_s: float = JOB_REQUESTS_PER_S
    max_interval: float = MAX_INTERVAL_S
    prompt_s: float = PROMPT_S

    def interval(self) -> float:
        """Seconds between this process's periodic sends, before jitter:
        ``min(max(max_interval, base_interval), max(base_interval, world_size /
        job_requests_per_s))``. E.g. 1 s up to 40 ranks, 25.6 s at 1,024, 60 s from 2,400 ranks
        on."""
        spread = (self.world_size or 1) / self.job_requests_per_s if \
            self.job_requests_per_s > 0 else 0.0
        return min(max(self.max_interval, self.base_interval), max(self.base_interval, spread))

    def due(self, cycle_start: float, jitter: float, prompt_since: float | None) -> float:
        """The time (same clock as the arguments, seconds) the sender should send next: the
        periodic deadline ``cycle_start + interval() * jitter``, or ``prompt_since +
        prompt_s`` when a prompt event queued at ``prompt_since`` is waiting and that is
        earlier."""
        deadline = cycle_start + self.interval() * jitter
        if prompt_since is not None:
            deadline = min(deadline, prompt_since + self.prompt_s)
        return deadline

    def jitter_range(self, first: bool) -> tuple[float, float]:
        """The interval the sender draws a cycle's jitter from: :data:`JITTER`, except the first
        cycle of a process whose interval was stretched past ``base_interval`` (a large job):
        ``(0.05, 1.2)``, so ranks that start together spread their first periodic sends over
        the whole interval instead of sending them within the same 40 %."""
        if first and self.interval() > self.base_interval:
            return (0.05, JITTER[1])
        return JITTER

    def job_requests(self) -> float:
        """Requests a second the whole job sends with this policy when every process sends
        periodically: ``world_size / interval()`` (jitter averages out)."""
        return (self.world_size or 1) / self.interval()


def is_prompt(item, client_rank: int | None = None) -> bool:
    """Whether a queued item (an event dict, or a lazy report without a ``type`` key) must be
    sent within ``prompt_s``: of :data:`PROMPT_TYPES`, or of :data:`LEAD_PROMPT_TYPES` from the
    lead reporter (the event's ``rank``, else ``client_rank``, is 0 or None). Never raises."""
    try:
        if type(item) is not dict:
            return False
        kind = item.get("type")
        if kind in PROMPT_TYPES:
            return True
        if kind in LEAD_PROMPT_TYPES:
            rank = item.get("rank", client_rank)
            return rank is None or rank == 0
        return False
    except Exception:  # pragma: no cover - a dict's get does not raise
        return False
