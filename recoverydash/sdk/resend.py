"""Sending what a run's spool holds from outside its sender: before a restore question
(``send_spool``) and by hand once a token is right again (``resend``, the command line's
``python -m recoverydash.sdk resend --run RUN``).

A run's spool folder (``<spool_dir>/<run_id>/``, ``recoverydash.sdk.spool``) holds the batches a
sender could not send (the server down, a token it refused) and, in ``rejected/``, the events the
server refused for good (one JSON file per refusal with its answer). Every event carries its own
``event_id``, run and attempt, and the server is idempotent on ``event_id``: sending a batch
again, from any process, is safe (a batch the server already has is counted as duplicates).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field

from recoverydash.sdk.delivery import batch_body
from recoverydash.sdk.guard import log
from recoverydash.sdk.spool import DiskSpool, run_folder, unsent_events
from recoverydash.sdk.transport import Answer, api_url, post_gzip
from recoverydash.sdk.worker import encode, live_worker


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


def _stopped_by(answer: Answer) -> str:
    return (f"answered {answer.status}" if answer.status is not None
            else f"unreachable: {repr(answer.error)[:200]}")


def _send_batches(spool: DiskSpool, endpoint: str, token: str, user_agent: str,
                  deadline: float, stop: threading.Event, out: SpoolSent) -> None:
    """Send the folder's batches oldest first until it is empty (``out.stopped`` ``""``), one is
    not taken (put back), ``stop`` is set or ``deadline`` (``time.monotonic()``) passes."""
    try:
        while not stop.is_set():
            item = spool.claim()
            if item is None:
                out.stopped = ""
                return
            handle, body, n = item
            left = deadline - time.monotonic()
            if left <= 0:
                spool.nack(handle)
                return
            # at most 64 KiB of the answer is read: its status is what counts here
            answer = post_gzip(endpoint, token, body, left, user_agent, 65536)
            if answer.ok:
                spool.ack(handle)
                out.sent += n
                continue
            spool.nack(handle)
            out.stopped = _stopped_by(answer)
            return
    except Exception as e:  # noqa: BLE001 - a thread of the SDK must never raise
        out.stopped = f"error: {e!r}"[:200]


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
        live = live_worker(run_id, folder)
        if live is not None:
            done = live.flush(max(0.0, deadline - time.monotonic()))
            out.left = unsent_events(folder)
            out.stopped = "" if done and not out.left else "timeout"
            return out
        if not unsent_events(folder):
            return out  # an empty or missing folder: nothing to send (and none is made)
        # no expiry (1e9 s): deleting old batches, and counting them dropped, is the client's
        spool = DiskSpool(folder, max_bytes=1 << 62, max_age_s=1e9)
        stop = threading.Event()
        sending = SpoolSent(stopped="timeout")
        thread = threading.Thread(target=_send_batches, name="recoverydash-spool-send",
                                  args=(spool, api_url(url, "events"), token or "", user_agent,
                                        deadline, stop, sending), daemon=True)
        thread.start()
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            stop.set()
        out.sent, out.stopped = sending.sent, sending.stopped
        out.left = unsent_events(folder)
        if not out.left and out.stopped == "timeout":
            out.stopped = ""
        return out
    except Exception as e:  # noqa: BLE001 - the restore question goes on without it
        out.stopped = f"error: {e!r}"[:200]
        return out


@dataclass
class Resent:
    """What ``resend`` did. ``spool``: the spool's batches (``SpoolSent``). From ``rejected/``:
    ``rejected_sent`` files the server took now (deleted, ``rejected_events`` events in them),
    ``rejected_left`` files still there with the status it answered each
    (``[(file name, status or None)]``). ``refused``: the status when the server refused
    the token (401, 403) or the URL (404): everything is then left as it was."""

    spool: SpoolSent = field(default_factory=SpoolSent)
    rejected_sent: int = 0
    rejected_events: int = 0
    rejected_left: list[tuple[str, int | None]] = field(default_factory=list)
    refused: int | None = None

    @property
    def complete(self) -> bool:
        """Nothing of the run is left unsent (spool and ``rejected/``)."""
        return not self.spool.left and not self.rejected_left and self.refused is None


def _rejected_events(path: str) -> list[dict]:
    """The events of one ``rejected/`` file (``DiskSpool.reject``'s document); [] when it
    cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return []
    events = doc.get("events") if isinstance(doc, dict) else None
    return [e for e in events or () if isinstance(e, dict)]


def _resend_rejected(folder: str, endpoint: str, token: str, timeout: float, user_agent: str,
                     out: Resent) -> None:
    """Offer each file of ``<folder>/rejected/`` to the server again, oldest first: a file it
    takes (2xx) is deleted; one it refuses stays. A refused token stops it."""
    rejected = os.path.join(folder, "rejected")
    try:
        names = sorted(n for n in os.listdir(rejected) if n.endswith(".json")
                       and not n.startswith("."))
    except OSError:
        return
    for name in names:
        path = os.path.join(rejected, name)
        events = _rejected_events(path)
        if not events:
            out.rejected_left.append((name, None))
            continue
        answer = post_gzip(endpoint, token, batch_body([encode(e).encode() for e in events]),
                           timeout, user_agent, 65536)
        if answer.setup_refused:
            out.refused = answer.status
            out.rejected_left.extend((n, answer.status) for n in names[names.index(name):])
            return
        if not answer.ok:
            out.rejected_left.append((name, answer.status))
            continue
        os.unlink(path)
        out.rejected_sent += 1
        out.rejected_events += len(events)


def resend(url: str | None, token: str | None, run_id: str, *,
           spool_dir: str | None = None, timeout: float = 600.0, rejected: bool = True,
           user_agent: str = "recoverydash-sdk/1") -> Resent:
    """Send a run's spool (``send_spool`` within ``timeout`` seconds) and then, with
    ``rejected``, offer every file of its ``rejected/`` folder again (each request within
    ``min(timeout, 60)`` seconds per socket operation): what a person runs once the token of a
    trainer the server refused is right (a 401 or 403 keeps a run's events in its spool). A
    file the server takes is deleted; one it refuses again (the events really are invalid)
    stays, with the status listed. Nothing is sent past a refused token. Returns a ``Resent``.
    Never raises."""
    out = Resent()
    try:
        out.spool = send_spool(url, token, run_id, spool_dir=spool_dir, timeout=timeout,
                               user_agent=user_agent)
        refused = out.spool.stopped.split()
        if out.spool.stopped.startswith("answered ") and refused[-1] in ("401", "403", "404"):
            out.refused = int(refused[-1])
        if not rejected or out.refused is not None or not url or not out.spool.folder:
            return out
        _resend_rejected(out.spool.folder, api_url(url, "events"), token or "",
                         min(timeout, 60.0), user_agent, out)
    except Exception as e:  # noqa: BLE001 - said, never raised
        log.error("recoverydash: resend of run %s stopped: %r", run_id, e)
    return out


__all__ = ["Resent", "SpoolSent", "resend", "send_spool"]
