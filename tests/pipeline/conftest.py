"""Real worker processes for the pipeline tests: a Celery worker (and, where needed, a private
redis-server) started as subprocesses against the test database."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A private redis-server on a free loopback port, which a test may stop and start."""

    def __init__(self):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            [shutil.which("redis-server") or "redis-server", "--port", str(self.port),
             "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Worker:
    """``celery -A workers.celery worker`` in its own process group, on the test database."""

    def __init__(self, broker_url: str, queue: str, visibility_s: int = 3600):
        db = connection.settings_dict
        self.env = dict(os.environ,
                        DATABASE_URL=f"postgres://{db['USER'] or 'postgres'}"
                                     f"@{db['HOST'] or '127.0.0.1'}"
                                     f":{db['PORT'] or 5432}/{db['NAME']}",
                        CELERY_BROKER_URL=broker_url, CELERY_TASK_DEFAULT_QUEUE=queue,
                        RECOVERYDASH_BROKER_VISIBILITY_TIMEOUT_S=str(visibility_s),
                        RECOVERYDASH_WEBHOOK_ALLOW_PRIVATE="true",
                        RECOVERYDASH_ANALYSIS_DEBOUNCE_S="0.2")
        self.queue = queue
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "workers.celery", "worker",
             "-Q", f"{self.queue},{self.queue}.webhooks",
             "--concurrency", "1", "--loglevel", "WARNING", "--without-gossip",
             "--without-mingle", "--hostname", f"test-{self.queue}-{time.monotonic_ns()}@%h"],
            cwd=REPO, env=self.env, start_new_session=True)
        return self

    def kill(self):
        """SIGKILL the whole process group: main process and pool children, no clean-up."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


def point_app_at(broker_url: str, queue: str, settings) -> None:
    """Make this process's Celery app publish to ``broker_url`` / ``queue``."""
    from workers.celery import app

    settings.CELERY_TASK_ALWAYS_EAGER = False
    app.conf.broker_url = broker_url
    app.conf.task_default_queue = queue
    # Forget (without closing: kombu keeps producer pools in a global registry keyed by
    # connection) the pools of a previous broker; they are rebuilt for the new URL.
    app._pool = None
    app.amqp._producer_pool = None


@pytest.fixture
def redis_server():
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture
def workers_on(settings):
    """``start(broker_url, visibility_s=...) -> Worker`` started on a queue of this test."""
    started: list[Worker] = []
    queue = f"test-{os.getpid()}-{time.monotonic_ns()}"

    def start(broker_url: str, visibility_s: int = 3600) -> Worker:
        point_app_at(broker_url, queue, settings)
        worker = Worker(broker_url, queue, visibility_s).start()
        started.append(worker)
        return worker

    start.queue = queue
    yield start
    for worker in started:
        worker.stop()


def wait_for(predicate, timeout: float = 60.0, interval: float = 0.2):
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"condition not met within {timeout} s")
