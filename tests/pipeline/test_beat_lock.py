"""Several hosts, one beat: two ``celery beat`` processes against one database and one broker
send every periodic task once, not twice; the second waits on the beat lock and says who holds
it, and takes over when the first dies. Found by an operator: a second beat silently doubled
every periodic task, and ``make serve`` on two hosts starts two beats.

The beats are real processes (``celery -A workers.celery beat``) on the machine's Redis (a
database of its own) and the test database's PostgreSQL (the advisory lock) or, on SQLite, a
file lock beside the database; the tasks they send are read from the broker's queues and told
apart by the ``origin`` header each beat stamps on its messages."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import redis

from recoverydash.locks import Lock

REPO = Path(__file__).resolve().parents[2]
BROKER_DB = 13


def _database_url() -> str:
    from django.db import connection

    s = connection.settings_dict
    if connection.vendor != "postgresql":
        return ""
    auth = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


class Beat:
    """One ``celery beat`` process with its own schedule file and log."""

    def __init__(self, name: str, tmp: Path, env: dict):
        self.log = tmp / f"beat-{name}.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "workers.celery", "beat", "--loglevel",
             "INFO", "--schedule", str(tmp / f"schedule-{name}")],
            cwd=REPO, env=env, stdout=self.log.open("wb"), stderr=subprocess.STDOUT)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, words: str, timeout: float = 90.0) -> float:
        """Wait until the log holds ``words``; the monotonic time it was seen."""
        deadline = time.monotonic() + timeout
        while words not in self.text():
            assert self.proc.poll() is None, self.text()[-2000:]
            assert time.monotonic() < deadline, f"no {words!r} in:\n{self.text()[-2000:]}"
            time.sleep(0.1)
        return time.monotonic()

    def stop(self, sig=signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def sent_by(broker, pid: int) -> Counter:
    """The periodic tasks beat ``pid`` sent, by task name (the queues ``celery`` and
    ``webhooks`` of the test's broker database)."""
    out: Counter = Counter()
    for queue in ("celery", "webhooks"):
        for raw in broker.lrange(queue, 0, -1):
            headers = json.loads(raw)["headers"]
            if headers.get("origin", "").startswith(f"gen{pid}@"):
                out[headers["task"]] += 1
    return out


@pytest.fixture
def beats(tmp_path, transactional_db):
    broker = redis.Redis(db=BROKER_DB)
    env = {**os.environ, "CELERY_BROKER_URL": f"redis://127.0.0.1:6379/{BROKER_DB}",
           "DATABASE_URL": _database_url(), "RECOVERYDASH_VAR_DIR": str(tmp_path / "var"),
           "CELERY_TASK_ALWAYS_EAGER": "false"}
    started: list[Beat] = []

    def start(name: str) -> Beat:
        beat = Beat(name, tmp_path, env)
        started.append(beat)
        return beat

    yield start, broker
    for beat in started:
        beat.stop(signal.SIGKILL)
        for queue in ("celery", "webhooks"):  # take back what they sent, nothing else
            for raw in broker.lrange(queue, 0, -1):
                if json.loads(raw)["headers"].get("origin", "").startswith(
                        f"gen{beat.proc.pid}@"):
                    broker.lrem(queue, 0, raw)


@pytest.mark.slow
def test_two_beats_send_each_periodic_task_once_and_the_second_takes_over(beats):
    start, broker = beats
    first = start("a")
    took = first.wait_for("beat: took the beat lock")
    second = start("b")
    second.wait_for("another beat holds the beat lock")
    assert f"pid {first.proc.pid}" in second.text()  # it says who holds it
    # 25 s of the first holding the lock: deliver-due (every 10 s) twice, sweep-runs (15 s) once
    time.sleep(max(0.0, took + 25.0 - time.monotonic()))
    from_first, from_second = sent_by(broker, first.proc.pid), sent_by(broker, second.proc.pid)
    assert from_first["workers.tasks.deliver_due"] == 2, from_first
    assert from_first["workers.tasks.sweep_runs"] == 1, from_first
    assert sum(from_second.values()) == 0, from_second
    assert "took the beat lock" not in second.text()

    first.stop(signal.SIGKILL)  # a host that dies: the lock goes with its connection
    second.wait_for("beat: took the beat lock", timeout=30)
    deadline = time.monotonic() + 15
    while not sent_by(broker, second.proc.pid)["workers.tasks.deliver_due"]:
        assert time.monotonic() < deadline, second.text()[-2000:]
        time.sleep(0.2)


def test_a_lock_is_held_by_one_holder_at_a_time_and_freed_when_released(db):
    first, second = Lock(0x7264_7465_7374_0001, "test", "a"), Lock(0x7264_7465_7374_0001,
                                                                   "test", "b")
    try:
        assert first.try_take() and first.held()
        assert not second.try_take() and not second.held()
        assert "recoverydash a" in second.holder()
        first.release()
        assert not first.held()
        assert second.try_take() and second.held()
    finally:
        first.release()
        second.release()
