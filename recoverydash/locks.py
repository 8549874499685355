"""Locks that several hosts sharing one database take so that a piece of work runs once: the
beat's (exactly one Celery beat sends the periodic tasks, whatever the number of hosts running
``recoverydash.serve beat``) and the migration's (two hosts starting at once do not migrate
together).

On PostgreSQL a lock is a session-level advisory lock (``pg_try_advisory_lock``) on a connection
of its own, outside Django's (which Django may close between requests): it is held as long as
that connection lives and is given back by the server the moment the holder's process dies or its
connection drops, so a lock is never left behind by a crash and never needs an expiry. The
connection's ``application_name`` names the holder (host and pid), so one that waits can say who
holds it. On SQLite (the embedded default: one host) it is an exclusive ``flock`` on a file beside
the database, given back by the kernel when the process dies.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import time
from pathlib import Path

log = logging.getLogger(__name__)

#: Advisory lock keys (64-bit), one per piece of work, the same in every process.
BEAT_KEY = 0x7264_6265_6174_0001      # "rdbeat" 1
MIGRATE_KEY = 0x7264_6D69_6772_0001   # "rdmigr" 1


def holder_name(role: str) -> str:
    """``recoverydash <role> <host> pid <pid>``: how a lock holder names itself."""
    return f"recoverydash {role} {socket.gethostname()} pid {os.getpid()}"


class Lock:
    """One named lock on the database of Django's ``default`` connection settings (PostgreSQL:
    advisory lock ``key``; SQLite: ``flock`` on ``<database file>.<name>.lock``). ``try_take``
    does not wait; ``held`` says whether it is still held (False once its connection dropped);
    ``release`` gives it back. Not thread-safe: one owner."""

    def __init__(self, key: int, name: str, role: str):
        from django.db import connections

        self.key, self.name, self.role = key, name, role
        self.settings = connections["default"].settings_dict
        self.vendor = connections["default"].vendor
        self._conn = None
        self._file = None

    # --- PostgreSQL -------------------------------------------------------------------------
    def _connect(self):
        import psycopg

        s = self.settings
        params = {"dbname": s["NAME"], "user": s.get("USER") or None,
                  "password": s.get("PASSWORD") or None, "host": s.get("HOST") or None,
                  "port": s.get("PORT") or None, "connect_timeout": 5,
                  "application_name": holder_name(self.role)[:63], "autocommit": True}
        return psycopg.connect(**{k: v for k, v in params.items() if v is not None})

    def holder(self) -> str:
        """Who holds the lock now, as it named itself (``application_name`` on PostgreSQL, the
        pid written in the file on SQLite), or ``"unknown"``."""
        try:
            if self.vendor == "postgresql":
                with self._connect() as conn:
                    row = conn.execute(
                        "SELECT a.application_name, a.client_addr FROM pg_locks l "
                        "JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = "
                        "'advisory' AND l.granted AND ((l.classid::bigint << 32) | "
                        "l.objid::bigint) = %s", (self.key & 0xFFFF_FFFF_FFFF_FFFF,)).fetchone()
                return f"{row[0]} ({row[1] or 'local'})" if row else "unknown"
            return self._path().read_text().strip() or "unknown"
        except Exception as exc:  # noqa: BLE001 - only for a log line
            return f"unknown ({type(exc).__name__})"

    def try_take(self) -> bool:
        """Take the lock if nobody holds it; True when this object holds it afterwards."""
        if self.held():
            return True
        if self.vendor == "postgresql":
            try:
                conn = self._connect()
                if conn.execute("SELECT pg_try_advisory_lock(%s)", (self.key,)).fetchone()[0]:
                    self._conn = conn
                    return True
                conn.close()
            except Exception as exc:  # noqa: BLE001 - the database is down: not taken, retry
                log.warning("%s lock: cannot reach the database: %s", self.name, exc)
            return False
        path = self._path()
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path, "a+")  # noqa: SIM115 - held open as long as the lock is
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            return False
        f.truncate(0)
        f.write(holder_name(self.role) + "\n")
        f.flush()
        self._file = f
        return True

    def held(self) -> bool:
        """Whether this object holds the lock now (PostgreSQL: its connection still answers; a
        dropped connection has lost the lock, which is then forgotten here)."""
        if self._file is not None:
            return True
        if self._conn is None:
            return False
        try:
            self._conn.execute("SELECT 1")
            return True
        except Exception as exc:  # noqa: BLE001 - any failure: the session (and lock) is gone
            log.error("%s lock lost: its database connection dropped (%s)", self.name, exc)
            self._drop()
            return False

    def release(self) -> None:
        """Give the lock back (nothing when not held)."""
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None
        self._drop()

    def _drop(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:  # noqa: BLE001, S110 - closing a broken connection
                pass
            self._conn = None

    def _path(self) -> Path:
        from django.conf import settings

        name = str(self.settings["NAME"])
        base = Path(name) if os.path.isabs(name) else Path(settings.VAR_DIR) / "db"
        return base.with_name(f"{base.name}.{self.name}.lock")

    def wait(self, *, poll_s: float = 1.0, say_every_s: float = 30.0, stopping=lambda: False
             ) -> bool:
        """Take the lock, waiting for it (logging who holds it now and then); False when
        ``stopping()`` became true first."""
        said = 0.0
        while not self.try_take():
            if stopping():
                return False
            now = time.monotonic()
            if now - said >= say_every_s:
                log.warning("%s lock is held by %s: waiting for it", self.name, self.holder())
                said = now
            time.sleep(poll_s)
        return True


def beat_lock() -> Lock:
    """The lock a beat holds while it sends periodic tasks."""
    return Lock(BEAT_KEY, "beat", "beat")


def migrate_lock() -> Lock:
    """The lock ``recoverydash.serve`` holds while it migrates."""
    return Lock(MIGRATE_KEY, "migrate", "migrate")


__all__ = ["BEAT_KEY", "MIGRATE_KEY", "Lock", "beat_lock", "holder_name", "migrate_lock"]
