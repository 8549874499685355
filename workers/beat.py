"""The beat that runs once however many hosts start one: ``celery beat -S
workers.beat:LockedScheduler`` (what ``recoverydash.serve beat`` runs).

A second ``celery beat`` against the same broker used to send every periodic task a second time.
This scheduler sends periodic tasks only while it holds the beat lock
(``recoverydash.locks.beat_lock``: a PostgreSQL advisory lock on a connection of its own, or a
file lock on SQLite). A beat that does not hold it sends nothing, logs who holds it (at start and
every ``SAY_EVERY_S``), and tries again every ``RETRY_S``; when the holder dies or its connection
drops, the server frees the lock and the next try takes it over, which that beat logs. A holder
checks its lock before every tick (at least every ``CHECK_S``) and stops sending the moment it
is lost.

After a takeover the new holder's schedule is its own file's: a job whose period passed there
is sent at once, so a takeover may send each job once early, never twice per period from then
on (and a periodic task's ``expires`` drops what lay in the queue too long).
"""

from __future__ import annotations

import logging
import time

from celery.beat import PersistentScheduler

log = logging.getLogger(__name__)

RETRY_S = 2.0
CHECK_S = 5.0
SAY_EVERY_S = 30.0


class LockedScheduler(PersistentScheduler):
    """Celery's file-backed scheduler, active only while it holds the beat lock."""

    def __init__(self, *args, **kwargs):
        self._lock = None
        self._said = 0.0
        self._holding = False
        super().__init__(*args, **kwargs)

    def _beat_lock(self):
        if self._lock is None:
            from recoverydash.locks import beat_lock

            self._lock = beat_lock()
        return self._lock

    def tick(self, *args, **kwargs) -> float:
        """Send what is due when holding the lock (then sleep at most ``CHECK_S``), else try to
        take it and sleep ``RETRY_S``."""
        lock = self._beat_lock()
        if not lock.try_take():
            if self._holding:
                self._holding = False
                log.error("beat: lost the beat lock; sending no periodic task until it is "
                          "taken again")
            now = time.monotonic()
            if now - self._said >= SAY_EVERY_S:
                log.warning("beat: another beat holds the beat lock (%s): this one waits and "
                            "sends no periodic task", lock.holder())
                self._said = now
            return RETRY_S
        if not self._holding:
            self._holding = True
            log.warning("beat: took the beat lock; this beat sends the periodic tasks")
        return min(super().tick(*args, **kwargs), CHECK_S)

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self._lock is not None:
                self._lock.release()
