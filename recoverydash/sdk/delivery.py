"""What the sender does with a batch and the server's answer to it: send, spool, split, set
aside (``recoverydash.sdk.worker`` decides *when*; this decides *what*).

Per batch (``Delivery.deliver``):

- 2xx: sent. The server answers ``{"accepted", "duplicates"}``; duplicates are counted.
- 5xx, 408, 429, network errors and timeouts: the batch goes to the *spool* and sending pauses
  (``transport.Backoff``: capped exponential backoff with jitter, or ``Retry-After``). While
  paused, new batches go to the spool too; the spool is drained oldest first before anything new
  is sent, so order is kept.
- 401 and 403 (the token is refused: unknown, mistyped, revoked, or without the ``ingest``
  scope) and 404 (no recoverydash API at the URL): nothing is wrong with the events, so they stay
  in the spool, sending pauses for ``auth_retry_s`` (60 s) and is tried again; each refusal is
  logged as an error naming the spool and the way out (fix the token or URL; ``python -m
  recoverydash.sdk resend --run RUN`` sends the spool from any process); ``Client.flush``
  answers False while it lasts.
- 409 (an ``event_id`` reused with other content) and 413 (too large): the batch is split in
  halves and each half sent again, so one bad event costs only itself (counted ``failed``). A 409
  on ``attempt_started`` is logged as an error saying the attempt number was most likely reused
  by a relaunch (see ``recoverydash.sdk.attempt``).
- 400: the events the answer names by index are set aside and the rest is sent again; an answer
  about the request as a whole sets the batch aside.
- other 4xx: never retried; logged once per status code and counted ``failed``.
- A *poison* batch, one the server answers 5xx to ``POISON_AFTER`` times in a row: the server is
  probed with an empty batch; when that is accepted, the batch is split in halves, again and
  again, until the event(s) the server fails on are isolated. Every other event is sent, the
  poison ones are set aside (counted ``quarantined``), and the spool behind them moves on. When
  the probe is not accepted the server is in trouble, not the batch: it waits in the spool.

Events set aside (refused for good, or poison) go to ``<spool>/<run_id>/rejected/`` with the
server's answer (``recoverydash.sdk.spool``): nothing the trainer gave is thrown away unseen, and
``resend`` offers them again. The updates of the ``update_committed`` events among what was not
delivered are kept as ``[first, last]`` (``lost_updates``) for the next heartbeat.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import threading
import zlib

from recoverydash.sdk.guard import Once, log
from recoverydash.sdk.spool import DiskSpool, MemorySpool
from recoverydash.sdk.transport import Answer, HttpTransport

#: A spooled batch the server answers 5xx to this many times in a row is searched for poison.
POISON_AFTER = 3

Spool = DiskSpool | MemorySpool


def batch_body(events: list[bytes]) -> bytes:
    """The gzipped request body of encoded events. zlib level 1 in gzip framing (wbits 31): the
    fastest stdlib path, and zlib releases the GIL while it compresses; JSON of events
    compresses ~15x even at level 1."""
    return zlib.compress(b'{"events":[' + b",".join(events) + b"]}", 1, 31)


def split_body(body: bytes) -> list[bytes] | None:
    """The encoded events of a gzipped body, or None when it cannot be read."""
    try:
        doc = json.loads(gzip.decompress(body))
        return [json.dumps(e, separators=(",", ":")).encode() for e in doc["events"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def refused_indexes(payload: bytes | None, n: int) -> set[int] | None:
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


class Counters:
    """The sender's counts of events (``Client.counters``): ``sent``, ``spooled``, ``dropped``,
    ``failed``, ``duplicates``, ``quarantined``, ``written_ahead``; and the updates of the
    ``update_committed`` events not delivered, ``lost_updates`` ``[first, last]`` (None: none)."""

    KEYS = ("sent", "spooled", "dropped", "failed", "duplicates", "quarantined", "written_ahead")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.values: dict[str, int] = dict.fromkeys(self.KEYS, 0)
        self.lost_updates: list[int] | None = None

    def add(self, key: str, n: int) -> None:
        with self.lock:
            self.values[key] += n

    def add_unlocked(self, key: str, n: int) -> None:
        """For the SIGTERM path, which may have interrupted a holder of the lock."""
        self.values[key] += n

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return dict(self.values)

    def note_update(self, update: object) -> None:
        """Widen ``lost_updates`` by ``update`` (an int; anything else is ignored)."""
        if type(update) is not int:
            return
        with self.lock:
            lost = self.lost_updates
            if lost is None:
                self.lost_updates = [update, update]
            else:
                lost[0], lost[1] = min(lost[0], update), max(lost[1], update)

    def note_lost(self, events: list[bytes]) -> None:
        """Widen ``lost_updates`` by the updates among encoded events not delivered."""
        for e in events:
            if b'"update_committed"' not in e:
                continue
            try:
                self.note_update(json.loads(e).get("update"))
            except (ValueError, AttributeError):
                pass


class Delivery:
    """Sends batches of one run through ``transport`` and keeps what it cannot send in
    ``spool`` (module doc). Used by the sender thread (and the caller's thread in ``sync``
    mode); ``lock`` serialises sends and spool drains."""

    def __init__(self, transport: HttpTransport, spool: Spool | None, counters: Counters,
                 once: Once, run_id: str) -> None:
        self.transport = transport
        self.spool = spool
        self.counters = counters
        self._once = once
        self.run_id = run_id
        self.lock = threading.Lock()
        self.exit_timeout: float | None = None  # set while closing: shorter requests
        self.last = Answer(None)                # the last answer
        self.accepted = 0  # requests with events the server took (2xx)
        self._fails: dict[bytes, int] = {}  # sha1 of a spooled body -> 5xx answers in a row

    # -- fresh batches --

    def deliver(self, events: list[bytes]) -> None:
        """Send fresh events, or spool them while paused or while older batches wait."""
        with self.lock:
            if self.transport.backoff.paused() or (self.spool is not None
                                                   and self.spool.has_pending()):
                self.store(events)
                return
            if self.send(batch_body(events), len(events), events) == "retry":
                self.store(events)

    def store(self, events: list[bytes]) -> None:
        """Spool fresh events (counted ``spooled``; ``dropped`` when the spool is full)."""
        n = len(events)
        ok = False
        try:
            ok = self.spool is not None and self.spool.put(batch_body(events), n)
        except OSError as e:
            self._once(("spool-write", type(e)), logging.WARNING,
                       "recoverydash: spool write failed: %r", e)
        if ok:
            self.counters.add("spooled", n)
            return
        self.counters.add("dropped", n)
        self.counters.note_lost(events)
        self._once("spool-full", logging.WARNING,
                   "recoverydash: spool full or unusable; dropping %d events (counted)", n)

    def store_part(self, part: list[bytes], from_spool: bool) -> None:
        """Spool part of a batch again; one that came from the spool was counted ``spooled``
        once already."""
        if not from_spool:
            self.store(part)
            return
        try:
            if self.spool is not None and self.spool.put(batch_body(part), len(part)):
                return
        except OSError:
            pass
        self.counters.add("dropped", len(part))
        self.counters.note_lost(part)

    # -- the spool --

    def drain(self, force: bool = False) -> None:
        """Send spooled batches oldest first until one fails, sending pauses, or the spool is
        empty. ``force`` (flush, close) lists the folder even when it was found empty a moment
        ago."""
        spool = self.spool
        if spool is None or not (force or spool.has_pending()):
            return
        with self.lock:
            if isinstance(spool, DiskSpool):
                spool.release_stale_claims()
            while not self.transport.backoff.paused() and self._drain_one(spool):
                pass
            if isinstance(spool, DiskSpool) and spool.expired_events:
                self.counters.add("dropped", spool.expired_events)
                spool.expired_events = 0

    def _drain_one(self, spool: Spool) -> bool:
        """Send the oldest spooled batch; True when the next one may follow."""
        item = spool.claim()
        if item is None:
            return False
        handle, body, n = item
        outcome = self.send(body, n, None, from_spool=True)
        key = hashlib.sha1(body).digest() if outcome == "retry" or self._fails else b""
        if outcome != "retry":
            self._fails.pop(key, None)
            spool.ack(handle)
            return True
        fails = self._fails[key] = self._fails.get(key, 0) + 1
        status = self.last.status
        if status is not None and status >= 500 and fails >= POISON_AFTER and \
                self.isolate(body):
            self._fails.pop(key, None)
            spool.ack(handle)
            return True
        spool.nack(handle)
        return False

    # -- one request and its answer --

    def _post(self, body: bytes) -> Answer:
        timeout = self.transport.request_timeout
        if self.exit_timeout is not None:
            timeout = min(timeout, self.exit_timeout)
        return self.transport.post(body, timeout)

    def send(self, body: bytes, n: int, events: list[bytes] | None, *,
             from_spool: bool = False) -> str:
        """POST one gzipped body of ``n`` events and act on the answer (module doc). Returns
        ``"sent"`` (sent, or split and every part resolved), ``"failed"`` (refused for good and
        set aside) or ``"retry"`` (the caller spools or keeps it). Fresh events resolve here;
        spooled ones were counted when spooled, so their send adds to ``sent`` only."""
        answer = self._post(body)
        backoff = self.transport.backoff
        refused_before = backoff.refused
        self.last = answer
        pause = backoff.after(answer)
        if answer.ok:
            self._sent(answer, n, refused_before)
            return "sent"
        if answer.setup_refused:
            self._setup_refused(answer, n, pause)
            return "retry"
        if answer.retryable:
            self._once(("retry", answer.status), logging.WARNING,
                       "recoverydash: server answered %s; spooling and retrying in %.2fs "
                       "(logged once)",
                       answer.status if answer.status is not None else "no connection", pause)
            return "retry"
        if n > 1 and events is None:
            events = split_body(body)
        if answer.status in (409, 413) and events is not None and len(events) > 1:
            self._send_halves(events, from_spool)
            return "sent"
        if answer.status == 400 and events is not None and len(events) > 1 and \
                self._send_unnamed(events, answer, from_spool):
            return "sent"
        self._refused(body, n, events, answer)
        return "failed"

    def _sent(self, answer: Answer, n: int, refused_before: int | None) -> None:
        dup = 0
        try:
            dup = int(json.loads(answer.payload or b"{}").get("duplicates", 0))
        except (ValueError, AttributeError, TypeError):
            pass
        self.counters.add("sent", n)
        if n:
            self.accepted += 1
        if dup:
            self.counters.add("duplicates", dup)
        if refused_before is not None:
            log.warning("recoverydash: the server accepts the token and URL again (it answered "
                        "%s before): sending of run %s resumed", refused_before, self.run_id)

    def _setup_refused(self, answer: Answer, n: int, pause: float) -> None:
        """401/403/404: loud, every time (at most once per ``auth_retry_s``: sending is
        paused)."""
        what, why, fix = {
            401: ("the token", "no, an unknown or a revoked token", "the token "
                  "(RECOVERYDASH_TOKEN)"),
            403: ("the token", "the token lacks the ingest scope", "the token's scopes"),
        }.get(answer.status or 0, ("the URL", f"no recoverydash API at {self.transport.endpoint}",
                                   "the URL (RECOVERYDASH_URL: the server's base URL)"))
        spool = self.spool
        waiting = n + (spool.pending_events() if spool is not None else 0)
        where = getattr(spool, "folder", "memory (lost when this process ends)")
        log.error("recoverydash: the server refused %s (HTTP %s: %s) for run %s; sending is "
                  "paused and nothing is lost: %d event(s) wait in the spool %s. Fix %s; this "
                  "process tries again in %.0f s, and `python -m recoverydash.sdk resend --run "
                  "%s` sends them from any process. Server said: %s", what, answer.status, why,
                  self.run_id, waiting, where, fix, pause, self.run_id, answer.detail(200))

    def _send_halves(self, events: list[bytes], from_spool: bool) -> None:
        """409 / 413: each half on its own; a half to retry goes back to the spool."""
        half = len(events) // 2
        for part in (events[:half], events[half:]):
            if self.send(batch_body(part), len(part), part, from_spool=from_spool) == "retry":
                self.store_part(part, from_spool)

    def _send_unnamed(self, events: list[bytes], answer: Answer, from_spool: bool) -> bool:
        """400: set aside the events the answer names, send the rest again. False when it names
        none (or all): the batch is refused as a whole."""
        named = refused_indexes(answer.payload, len(events))
        if not named or len(named) >= len(events):
            return False
        self.refuse([events[i] for i in sorted(named)], answer)
        rest = [e for i, e in enumerate(events) if i not in named]
        if self.send(batch_body(rest), len(rest), rest, from_spool=from_spool) == "retry":
            self.store_part(rest, from_spool)
        return True

    def _refused(self, body: bytes, n: int, events: list[bytes] | None, answer: Answer) -> None:
        """Refused for good: set aside, logged once per status."""
        if events is None:
            events = split_body(body)
        self.refuse(events, answer, n)
        detail = answer.detail()
        if answer.status == 409 and n == 1:
            self._explain_conflict(events, detail)
        self._once(("status", answer.status), logging.ERROR,
                   "recoverydash: server refused a batch with %s (not retried, kept in %s; "
                   "logged once): %s", answer.status,
                   getattr(self.spool, "rejected_folder", "memory"), detail)

    def _explain_conflict(self, events: list[bytes] | None, detail: str) -> None:
        """A 409 on ``attempt_started``: its event id (run, attempt, rank, ``start``) is stored
        with other content, so this attempt number was already used by an earlier launch. Every
        event of this launch then lands in (or is refused from) the older attempt: logged as an
        error naming the cause, once per event id."""
        try:
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

    def refuse(self, events: list[bytes] | None, answer: Answer, n: int | None = None) -> None:
        """Events the server refused for good: counted ``failed`` and set aside."""
        count = len(events) if n is None and events is not None else (n or 0)
        self.counters.add("failed", count)
        if events:
            self.set_aside(events, answer, f"refused by the server with HTTP {answer.status}",
                           quiet=True)

    def set_aside(self, events: list[bytes], answer: Answer, reason: str,
                  quiet: bool = False) -> None:
        """Write events the server will not take to ``rejected/`` with its answer; counted
        ``quarantined`` (``dropped`` when the folder is full or the disk refuses)."""
        self.counters.note_lost(events)
        path = None
        spool = self.spool
        try:
            path = spool.reject(events, answer.status, answer.payload, reason) \
                if spool is not None else None
            kept = spool is not None and (path is not None or not isinstance(spool, DiskSpool))
        except OSError as e:
            kept = False
            self._once(("reject-write", type(e)), logging.WARNING,
                       "recoverydash: cannot write to rejected/: %r", e)
        self.counters.add("quarantined" if kept else "dropped", len(events))
        if quiet:  # the caller logs
            return
        self._once(("set-aside", answer.status), logging.ERROR,
                   "recoverydash: %d event(s) set aside (%s) in %s; logged once per status",
                   len(events), reason, path or getattr(spool, "rejected_folder", "memory"))

    def isolate(self, body: bytes) -> bool:
        """A spooled batch the server answered 5xx to ``POISON_AFTER`` times in a row: find the
        event(s) it fails on. Probes the server with an empty batch first; when that is not
        accepted the server is in trouble, not the batch: returns False (the caller keeps it).
        Else splits the batch in halves until each part is sent, refused for good, or is a
        single event answered 5xx. Those single events are set aside as poison only when the
        server accepted other events meanwhile (a server that fails on every event is broken,
        and its events wait in the spool); a server that stops answering midway, or a search
        longer than ``4 * log2(n) + 8`` requests, leaves the rest in the spool. Returns True:
        the batch's events are all accounted for (sent, set aside or spooled again)."""
        events = split_body(body)
        if not events or not self._post(batch_body([])).ok:
            return False
        backoff = self.transport.backoff
        accepted_before = self.accepted
        budget = 4 * len(events).bit_length() + 8
        stack, suspects = [events], []
        while stack and budget > 0:
            budget -= 1
            part = stack.pop()
            backoff.paused_until = 0.0  # the server answers: the backoff is for outages
            if self.send(batch_body(part), len(part), part, from_spool=True) != "retry":
                continue
            status = self.last.status
            if status is None or status < 500:  # no answer, 401, 403, 404, 408, 429: wait
                stack.append(part)
                break
            if len(part) == 1:
                suspects.append((part, self.last))
            else:
                half = len(part) // 2
                stack.extend((part[half:], part[:half]))
        proven = self.accepted > accepted_before  # the server takes other events
        for part, answer in suspects:
            if proven:
                self.set_aside(part, answer, f"HTTP {answer.status} again and again while the "
                               "server accepted the other events of its batch (poison)")
            else:
                stack.append(part)
        for rest in stack[::-1]:
            self.store_part(rest, True)
        if proven:
            backoff.resume()
        return True


__all__ = ["POISON_AFTER", "Counters", "Delivery", "batch_body", "refused_indexes", "split_body"]
