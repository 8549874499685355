"""The public client: what a trainer calls (after sentry-python's ``Client``).

A ``Client`` sends the events of one run (docs/ingest-v1.md#4-event-types) to a recoverydash
server and never hurts its host: it never raises into the training loop, never blocks it, and
never loses what it was given without saying so. It is three parts, each in its module:

- ``recoverydash.sdk.client`` (this one): the run's identity (run, attempt, rank), the event
  helpers, ``emit``, ``flush``, ``close``, ``counters``, and ``init`` / ``get_client``;
- ``recoverydash.sdk.worker``: the in-memory queue, the sender thread, batching by the flush
  policy (``recoverydash.sdk.flush``), the write-ahead, and the disk spool it drains
  (``recoverydash.sdk.spool``), exit and fork handling;
- ``recoverydash.sdk.transport`` and ``recoverydash.sdk.delivery``: the HTTP request, the
  backoff and ``Retry-After``, a refused token, and what each answer does to a batch (sent,
  spooled, split, set aside in ``rejected/``).

``recoverydash.sdk.sigterm`` spools the queues on SIGTERM; ``recoverydash.sdk.resend`` sends a
run's spool from outside its sender (before a restore question, or by hand:
``python -m recoverydash.sdk resend --run RUN``); every door into the SDK goes through
``recoverydash.sdk.guard`` (never raise, log once).

What the host pays: ``emit`` is an atomic append (about a microsecond); all JSON, gzip and HTTP
work happens on the sender thread. Measured by ``bench/sdk_overhead.py``. Counters
(``client.counters()``): ``queued`` (accepted by emit), ``sent`` (acknowledged by the server,
counting re-sends from the spool), ``spooled``, ``written_ahead`` (events written to the
write-ahead file, still sent from memory), ``dropped`` (full queue or full spool), ``failed``
(refused by the server for good), ``quarantined`` (set aside in ``rejected/``), ``duplicates``
(already stored), ``pending`` and ``spool_events``. Their losses reach the server in the next
``heartbeat`` as ``sdk_dropped``, ``sdk_quarantined`` and ``sdk_lost_updates``. Only the standard
library is used (``urllib``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from recoverydash.sdk.delivery import POISON_AFTER
from recoverydash.sdk.flush import FlushPolicy
from recoverydash.sdk.guard import Once, log, never_raises
from recoverydash.sdk.options import ClientOptions
from recoverydash.sdk.resend import SpoolSent, send_spool
from recoverydash.sdk.sigterm import install_sigterm_handler, single_process_job
from recoverydash.sdk.transport import MAX_ANSWER_BYTES, api_base
from recoverydash.sdk.worker import Worker


def now_rfc3339() -> str:
    """Current time, RFC 3339 with offset and milliseconds: ``2026-11-01T00:00:05.123+00:00``."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def default_attempt(run_id: str = "run", **kw: Any) -> int:
    """The attempt of this launch of ``run_id`` when none is passed: ``$RECOVERYDASH_ATTEMPT``,
    else a number new for every launch (``recoverydash.sdk.attempt.resolve_attempt``; ``kw``:
    ``url``, ``token``, ``location``, ``restored``, ``spool_dir``...). torchrun's and Slurm's
    restart counts are only a floor: a plain relaunch starts them at 0 again."""
    from recoverydash.sdk.attempt import resolve_attempt

    return resolve_attempt(run_id, **kw)


def _default_rank() -> int | None:
    v = os.environ.get("RANK")
    return int(v) if v and v.isdigit() else None


def _wants_sigterm_handler(handle_sigterm: bool | None, world_size: int | None) -> tuple[bool,
                                                                                         bool]:
    """``(install now, decide at the first attempt_started)``: ``handle_sigterm`` when given,
    else ``$RECOVERYDASH_HANDLE_SIGTERM`` when set (``0``, ``false``, ``no``, ``off``: no), else
    only for a single-process job (a world size unknown yet is decided by the client's first
    ``attempt_started``)."""
    if handle_sigterm is not None:
        return handle_sigterm, False
    setting = os.environ.get("RECOVERYDASH_HANDLE_SIGTERM", "").strip().lower()
    if setting:
        return setting not in ("0", "false", "no", "off"), False
    single = single_process_job(world_size)
    return single, not single and world_size is None


# --- the client -----------------------------------------------------------------------------------

class Client:
    """Sends events of one run to the ingest API. Thread-safe; never raises; never blocks.

    Args:
        url: server base URL (``https://recoverydash.example``; a trailing ``/api/v1`` is
            understood: ``transport.api_base``); None or "" disables sending (events are
            accepted and discarded: counted ``dropped``).
        token: an API token with the ``ingest`` scope. A token (401, 403) or URL (404) the
            server refuses pauses sending and keeps every event in the spool (``flush()``
            answers False, ``refused`` says the status, an error is logged at each retry, every
            ``auth_retry_s``); ``python -m recoverydash.sdk resend --run RUN`` sends them once
            the token is right.
        run_id: the logical run, ``[A-Za-z0-9._:-]{1,128}``.
        attempt: this launch of the run. Default: ``$RECOVERYDASH_ATTEMPT``, else a number new
            for every launch, the same on every rank (``recoverydash.sdk.attempt``: one more than
            the highest attempt seen in the restored manifest, the location's manifests, this
            host's state file and the server's ``latest_attempt``; with ``torch.distributed``
            initialised rank 0 decides and broadcasts it, so every rank must create its client
            at the same point). The server is asked with ``min(request_timeout, 3)`` seconds.
        rank: the data-parallel rank this process reports for (default: ``$RANK``, else None).
        location: the run's checkpoint location, looked at for the attempt rule (not needed
            with an explicit ``attempt``).
        restored: the restored generation (a manifest or a ``restore_plan`` answer), for the
            attempt rule.
        s3_client: a boto3 client for an ``s3://`` ``location``.
        options: a ``ClientOptions`` (``recoverydash.sdk.options``: spool, batching, flush
            policy, timeouts, backoff, SIGTERM, write-ahead).
        **tuning: any field of ``ClientOptions`` as a keyword (``spool_dir=``,
            ``flush_interval=``, ``world_size=``, ``handle_sigterm=``...), over ``options``.
    """

    def __init__(self, url: str | None, token: str | None, run_id: str, *,
                 attempt: int | None = None, rank: int | None | str = "env",
                 location: str | None = None, restored: Any = None, s3_client: Any = None,
                 options: ClientOptions | None = None, **tuning: Any) -> None:
        self.options = o = (options or ClientOptions()).with_changes(**tuning)
        self.url = api_base(url)
        self.token = token or ""
        self.run_id = str(run_id)
        if attempt is None:
            attempt = default_attempt(self.run_id, url=self.url or None, token=self.token,
                                      location=location, restored=restored,
                                      spool_dir=o.spool_dir if self.url else False,
                                      s3_client=s3_client, timeout=min(o.request_timeout, 3.0))
        self.attempt = int(attempt)
        self.rank: int | None = _default_rank() if rank == "env" else \
            (None if rank is None else int(rank))
        self._once = Once()
        #: the contract this process declared in its ``attempt_started`` (None: none, the
        #: server's default or the dashboard's applies); ``save_generation`` and
        #: ``publish_files`` take its ``required_components`` as their default
        self.contract: dict[str, Any] | None = None
        install, self._sigterm_auto = _wants_sigterm_handler(o.handle_sigterm,
                                                              o.job_world_size())
        self._worker = Worker(self.url, self.token, self.run_id, self.rank, o, self.complete,
                              self._learnt_world_size)
        if install and self.url and not o.sync:
            install_sigterm_handler()

    def _learnt_world_size(self, world_size: int) -> None:
        """The world size was unknown when the client was made; an ``attempt_started`` says it."""
        if self._sigterm_auto:
            self._sigterm_auto = False
            if self.url and not self.options.sync and single_process_job(world_size):
                install_sigterm_handler()  # (does nothing outside the main thread)

    @property
    def endpoint(self) -> str:
        """``{url}/api/v1/events`` (``""`` when sending is off)."""
        return self._worker.transport.endpoint

    @property
    def flush_policy(self) -> FlushPolicy:
        return self._worker.flush_policy

    @property
    def sync(self) -> bool:
        return self.options.sync

    @property
    def refused(self) -> int | None:
        """The status the server refuses this client's requests with (401, 403: the token; 404:
        the URL) while sending is paused for it (events wait in the spool); None otherwise."""
        return self._worker.refused

    # -- public API --

    def counters(self) -> dict[str, int]:
        """Snapshot: queued, sent, spooled, written_ahead, dropped, failed, quarantined,
        duplicates (events), plus ``pending`` (in memory, not yet sent, spooled or failed) and
        ``spool_events`` (events now in the spool). ``{}`` if it cannot be taken."""
        return dict(self._worker.snapshot())

    def event_id(self, suffix: str, rank: int | None | str = "client") -> str:
        """Deterministic id ``{run_id}:{attempt}:{rank or 'c'}:{suffix}`` (hashed past 200
        characters)."""
        r = self.rank if rank == "client" else rank
        eid = f"{self.run_id}:{self.attempt}:{'c' if r is None else r}:{suffix}"
        if len(eid) > 200:
            eid = eid[:150] + "~" + hashlib.sha256(eid.encode()).hexdigest()[:40]
        return eid

    @never_raises(False)
    def emit(self, event: dict[str, Any]) -> bool:
        """Queue one event; ``run_id``, ``attempt``, ``rank``, ``time`` (the moment of this call)
        and ``event_id`` (random) are filled by the sender thread when absent. Returns True when
        queued (or sent, in sync mode), False when dropped. Never raises, never blocks: about a
        microsecond (an atomic append; the JSON work happens on the sender thread)."""
        return self._push(event)

    def _push(self, item: Any) -> bool:
        """Hand an event dict, or a lazy report with ``materialize() -> dict`` (the recorders'
        ``ledger``, ``observe``), to the worker: every event of this client passes here."""
        return self._worker.push(item)

    def complete(self, item: Any, t: float) -> dict[str, Any] | None:
        """The wire event of a queued item (on the sender thread): the common fields filled.
        None when it cannot be built (counted ``failed``, logged once)."""
        try:
            ev = item.materialize() if hasattr(item, "materialize") else dict(item)
            ev.setdefault("run_id", self.run_id)
            ev.setdefault("attempt", self.attempt)
            if "rank" not in ev and self.rank is not None:
                ev["rank"] = self.rank
            if "time" not in ev:
                ev["time"] = datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")
            if "event_id" not in ev:
                ev["event_id"] = self.event_id(
                    f"{ev.get('type', 'event')}:{uuid.uuid4().hex[:16]}", ev.get("rank"))
            return ev
        except Exception as e:  # noqa: BLE001 - one event that cannot be built costs itself
            self._worker.counters.add("failed", 1)
            self._once(("complete", type(e)), logging.WARNING,
                       "recoverydash: event could not be built: %r", e)
            return None

    def flush(self, timeout: float | None = 5.0) -> bool:
        """Wait until every event queued so far is sent, spooled or failed, then try once to send
        what the spool holds (unless sending is paused). timeout: seconds (None: no limit).
        Returns True when nothing queued is left unresolved and the spool is empty; False at the
        timeout, and at once while the server refuses the token or URL (``refused``). Never
        raises."""
        return self._worker.flush(timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Stop accepting events, send or spool what is queued within ``timeout`` seconds (default
        ``atexit_deadline``); events still in memory after that are written to the spool by the
        caller. Returns True when nothing was left pending. Never raises."""
        return self._worker.close(timeout)

    def spool_now(self, wait_s: float = 0.5) -> int:
        """Write what is still in memory (the queue, and the batch in flight, as ``close`` does
        at its deadline) to the disk spool now, in the calling thread; the next process of the run
        sends it. No network, no lock the interrupted thread may hold: the SIGTERM path
        (``recoverydash.sdk.sigterm``). Returns the number of events written (0 with an
        in-memory spool). Never raises."""
        return self._worker.spool_now(wait_s)

    # -- event helpers (docs/ingest-v1.md#4-event-types) --

    @never_raises(False)
    def attempt_started(self, *, world_size: int, dataset_version: str,
                        resumed_from: dict[str, Any] | None = None,
                        global_batch_size: int | None = None,
                        micro_batch_size: int | None = None, grad_accum_steps: int | None = None,
                        config_digest: str | None = None, sampler: dict[str, Any] | None = None,
                        contract: dict[str, Any] | None = None, **extra: Any) -> bool:
        """``attempt_started``. resumed_from: None (fresh start at update 0) or
        ``{"generation_id": str|None, "update": int, "cursor": [Cursor]}`` (see
        ``ledger.resumed_from``). A launch of a failure drill (``$RECOVERYDASH_DRILL_ID``, set by
        ``python -m recoverydash.sdk drill``) carries ``drill: {"drill_id", "role"}``
        (docs/ingest-v1.md#drill_result), so the server marks the run as a drill. contract: the
        run's recovery contract (docs/ingest-v1.md#attempt_started), kept as ``self.contract``:
        its ``required_components`` (default model, optimizer, scheduler, rng, data_progress)
        is what every generation must hold; a trainer without an LR scheduler leaves
        ``scheduler`` out."""
        if isinstance(contract, dict):
            self.contract = dict(contract)
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

    @never_raises(False)
    def update_committed(self, update: int, spans: list[dict[str, Any]], *,
                         samples: int | None = None, tokens: int | None = None,
                         ids_digest: str | None = None, event_id: str | None = None,
                         **extra: Any) -> bool:
        """``update_committed``: spans (docs/ingest-v1.md#3-positions-spans-and-cursors) this rank
        contributed to optimizer update ``update`` (>= 1). Event id
        ``{run}:{attempt}:{rank}:u{update}`` unless given."""
        ev = {"type": "update_committed", "update": update, "spans": spans, "samples": samples,
              "tokens": tokens, "ids_digest": ids_digest, **extra}
        if event_id:
            ev["event_id"] = event_id
        return self._emit_typed(ev, f"u{update}")

    @never_raises(False)
    def update_aggregate(self, update: int, ranks: list[dict[str, Any]], *,
                         event_id: str | None = None, **extra: Any) -> bool:
        """``update_aggregate`` (docs/ingest-v1.md#update_aggregate): the parts of several
        data-parallel ranks for optimizer update ``update`` (>= 1) in one event, sent by this
        reporter (a coordinator or node leader that has them, e.g. from
        ``CountingRecorder.commit_part`` of each rank). ``ranks``: ``[{"rank": int, "spans":
        [Span], "samples"?: int, "tokens"?: int, "ids_digest"?: str}]``, each rank once; a rank
        left out is a missing part of the update on the server. Event id
        ``{run}:{attempt}:{rank}:a{update}`` unless given. Queued like every event: never
        blocks, never raises; returns whether it was queued."""
        parts = [{k: v for k, v in part.items() if v is not None} for part in ranks]
        ev = {"type": "update_aggregate", "update": update, "ranks": parts, **extra}
        if event_id:
            ev["event_id"] = event_id
        return self._emit_typed(ev, f"a{update}")

    @never_raises(False)
    def heartbeat(self, update: int, fetched: list[dict[str, Any]] | None = None,
                  **extra: Any) -> bool:
        """``heartbeat``: last committed update and the read cursor ``fetched`` ([Cursor])."""
        ev = {"type": "heartbeat", "update": update, "fetched": fetched, **extra}
        # extra fields (docs/ingest-v1.md#heartbeat): what this process could not deliver
        dropped, quarantined, lost = self._worker.losses()  # no counters(): it lists the spool
        if dropped:
            ev.setdefault("sdk_dropped", dropped)
        if quarantined:
            ev.setdefault("sdk_quarantined", quarantined)
        if (dropped or quarantined) and lost:
            ev.setdefault("sdk_lost_updates", lost)
        return self._emit_typed(ev, None)

    @never_raises(False)
    def checkpoint_started(self, generation_id: str, update: int, required_shards: list[str],
                           components: list[str], **extra: Any) -> bool:
        ev = {"type": "checkpoint_started", "generation_id": generation_id, "update": update,
              "required_shards": required_shards, "components": components, **extra}
        return self._emit_typed(ev, f"g:{generation_id}:started")

    @never_raises(False)
    def shard_written(self, generation_id: str, shard: str, update: int,
                      objects: list[dict[str, Any]], **extra: Any) -> bool:
        ev = {"type": "shard_written", "generation_id": generation_id, "shard": shard,
              "update": update, "objects": objects, **extra}
        return self._emit_typed(ev, f"g:{generation_id}:shard:{shard}")

    @never_raises(False)
    def checkpoint_committed(self, manifest: dict[str, Any], **extra: Any) -> bool:
        """``checkpoint_committed`` carrying the published manifest document."""
        ev = {"type": "checkpoint_committed", "generation_id": manifest.get("generation_id"),
              "manifest": manifest, **extra}
        return self._emit_typed(ev, f"g:{manifest.get('generation_id')}:committed")

    @never_raises(False)
    def restore_completed(self, generation_id: str, seconds: float, **extra: Any) -> bool:
        ev = {"type": "restore_completed", "generation_id": generation_id, "seconds": seconds,
              **extra}
        return self._emit_typed(ev, f"g:{generation_id}:restored")

    @never_raises(False)
    def restore_failed(self, generation_id: str, reason: str, message: str = "",
                       **extra: Any) -> bool:
        """``restore_failed`` (docs/ingest-v1.md#restore_failed, an extension): loading
        ``generation_id`` did not complete. reason: ``object_damaged`` (an object's size or
        sha256 differs from the manifest), ``load_error`` (loading raised) or
        ``nothing_restorable`` (no candidate was left). May be sent before ``attempt_started``:
        the attempt then shows with its failure."""
        ev = {"type": "restore_failed", "generation_id": generation_id, "reason": reason,
              "message": (message or "")[:2000] or None, **extra}
        return self._emit_typed(ev, f"g:{generation_id}:restore_failed:{reason}")

    @never_raises(False)
    def attempt_ended(self, reason: str, update: int, *,
                      fetched: list[dict[str, Any]] | None = None, message: str | None = None,
                      **extra: Any) -> bool:
        """reason: ``completed``, ``failed``, ``preempted`` or ``cancelled``."""
        ev = {"type": "attempt_ended", "reason": reason, "update": update, "fetched": fetched,
              "message": message[:2000] if message else None, **extra}
        return self._emit_typed(ev, "end")

    @never_raises(False)
    def audit_window(self, update: int, accum_slot: int, sample_ids: Iterable[Any], *,
                     rank: int | None = None, **extra: Any) -> bool:
        """``audit_window``: up to 4,096 readable sample identities of one microbatch slot."""
        r = self.rank if rank is None else rank
        ev = {"type": "audit_window", "update": update, "rank": r if r is not None else 0,
              "accum_slot": accum_slot, "sample_ids": list(sample_ids)[:4096], **extra}
        return self._emit_typed(ev, f"audit:u{update}:s{accum_slot}")

    def _emit_typed(self, ev: dict[str, Any], id_suffix: str | None) -> bool:
        ev = {k: v for k, v in ev.items() if v is not None or k == "resumed_from"}
        if id_suffix is not None and "event_id" not in ev:
            ev["event_id"] = self.event_id(id_suffix, ev.get("rank", "client"))
        return self._push(ev)


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
    except Exception as e:  # noqa: BLE001 - a bad argument must not stop the training
        log.warning("recoverydash: init failed (%r); events are discarded", e)
        _default_client = Client(None, None, run_id or "run")
    return _default_client


def get_client() -> Client | None:
    """The client made by ``init``, or None."""
    return _default_client


__all__ = ["MAX_ANSWER_BYTES", "POISON_AFTER", "Client", "ClientOptions", "SpoolSent",
           "default_attempt", "get_client", "init", "install_sigterm_handler", "now_rfc3339",
           "send_spool", "single_process_job"]
