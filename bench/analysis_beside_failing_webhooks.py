#!/usr/bin/env python
"""Analysis latency with 100 failing webhook endpoints beside it (issue 29, build 9): can
deliveries and their retries starve analysis?

An attacker's report saw new runs unanalysed for more than 2 minutes after 40 minutes of load with
about 70 failing endpoints. Here 100 endpoints of one project point at a receiver on loopback that
accepts the connection and never answers, so every delivery attempt spends its whole time budget
(``RECOVERYDASH_WEBHOOK_TIMEOUT_S``, 10 s by default). One alert flip makes 100 deliveries,
enqueued as the service does; then ``RUNS`` new runs are posted through the ingest API and the
time from the post to a current stored analysis is measured for each, with real ``celery
worker`` processes on the machine's Redis and this PostgreSQL database:

- ``one pool``: the layout before this change: deliveries on the analysis queue, one worker of 2
  processes taking both (what ``make serve`` and compose ran);
- ``split``: deliveries on their own queue (``recoverydash.runs.queue.WEBHOOK_TASKS``), a worker
  of 2 processes for analysis and one of 2 for webhooks (``recoverydash.serve``'s worker role).

Prints the median and the longest latency of each (a run not analysed within ``WAIT_S`` counts as
``WAIT_S``, said so), and their ratio last.

    .venv/bin/python bench/analysis_beside_failing_webhooks.py   (PostgreSQL and Redis on localhost)
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DB = "recoverydash_bench_queues"
QUEUE = f"bench-queues-{os.getpid()}"
ENDPOINTS, RUNS, CONCURRENCY = 100, 4, 2
WAIT_S = float(os.environ.get("BENCH_WAIT_S", "150"))
ENV = {
    "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{DB}",
    "CELERY_BROKER_URL": "redis://127.0.0.1:6379/0",
    "CELERY_TASK_DEFAULT_QUEUE": QUEUE,
    "RECOVERYDASH_WEBHOOK_ALLOW_PRIVATE": "true",
    "RECOVERYDASH_ANALYSIS_DEBOUNCE_S": "0.2",
    "RECOVERYDASH_RATE_LIMIT_PER_SECOND": "0",
}
os.environ.update(ENV)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "recoverydash.settings")
sys.path.insert(0, str(REPO))


def recreate_database() -> None:
    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{DB}"')


class BlackHole:
    """A receiver that accepts every connection and never answers (until stopped)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(512)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self.stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
                self.held.append(conn)
            except OSError:
                continue


def worker(queues: str, name: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "workers.celery", "worker", "-Q", queues,
         "--concurrency", str(CONCURRENCY), "--loglevel", "ERROR", "--without-gossip",
         "--without-mingle", "--hostname", f"{name}-{os.getpid()}@%h"],
        cwd=REPO, env=dict(os.environ), start_new_session=True)


def events(run_id: str) -> list[dict]:
    t = "2026-11-01T00:00:%02dZ"
    out = [{"type": "attempt_started", "world_size": 2, "dataset_version": "v1",
            "global_batch_size": 4, "time": t % 0},
           {"type": "update_committed", "update": 1, "time": t % 1,
            "spans": [{"stratum": "main", "epoch": 0, "ranges": [[0, 4]]}]}]
    for i, e in enumerate(out):
        e.update(event_id=f"{run_id}-{i}", run_id=run_id, attempt=0)
    return out


def measure(layout: str, hole: BlackHole, client, token, project) -> list[float]:
    """Make 100 failing deliveries, start the layout's workers, post RUNS runs; each run's
    latency to a current analysis (seconds)."""
    from celery import current_app

    from recoverydash.alerts.delivery import process_flips
    from recoverydash.alerts.models import Alert, AlertFlip
    from recoverydash.runs import queue
    from recoverydash.runs.models import Run

    run = Run.objects.create(project=project, run_id=f"noisy-{layout.replace(' ', '-')}")
    alert = Alert.objects.create(run=run, rule="checkpoint_stale", dedup_key=f"{run.pk}:cs:",
                                 severity="critical", summary="stale")
    AlertFlip.objects.create(alert=alert, new_state="firing", snapshot=alert.snapshot())
    deliveries = process_flips()
    assert len(deliveries) == ENDPOINTS, len(deliveries)
    for pk in deliveries:
        if layout == "one pool":  # before: every task on the analysis queue
            current_app.send_task(queue.DELIVER_WEBHOOK, args=(pk,), queue=QUEUE)
        else:
            queue.enqueue(queue.DELIVER_WEBHOOK, pk)
    procs = ([worker(f"{QUEUE},{QUEUE}.webhooks", "all")] if layout == "one pool" else
             [worker(QUEUE, "analysis"), worker(f"{QUEUE}.webhooks", "webhooks")])
    latencies = []
    try:
        time.sleep(4.0)  # workers connect and take the first deliveries
        posted = {}
        for i in range(RUNS):
            run_id = f"fresh-{layout.replace(' ', '-')}-{i}"
            response = client.post("/api/v1/events", data=json.dumps({"events": events(run_id)}),
                                   content_type="application/json",
                                   HTTP_AUTHORIZATION=f"Bearer {token}")
            assert response.status_code == 202, response.content
            posted[run_id] = time.monotonic()
        waiting = dict(posted)
        while waiting and time.monotonic() - min(posted.values()) < WAIT_S:
            for run_id in list(waiting):
                r = Run.objects.select_related("analysis").get(project=project, run_id=run_id)
                a = getattr(r, "analysis", None)
                if a is not None and a.ingest_seq >= r.ingest_seq:
                    latencies.append(time.monotonic() - waiting.pop(run_id))
            time.sleep(0.2)
        latencies += [WAIT_S] * len(waiting)
        if waiting:
            print(f"  {layout}: {len(waiting)} of {RUNS} runs not analysed within {WAIT_S:g} s")
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        import redis

        broker = redis.Redis(db=0)
        broker.delete(QUEUE, f"{QUEUE}.webhooks")
    return latencies


def main() -> int:
    recreate_database()
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.test import Client

    from recoverydash.alerts.models import WebhookEndpoint
    from recoverydash.runs.models import ApiToken, Project

    call_command("migrate", verbosity=0)
    settings.CELERY_TASK_ALWAYS_EAGER = False
    hole = BlackHole()
    project = Project.objects.create(name="bench")
    _, token = ApiToken.issue(project, ["ingest", "read"])
    for i in range(ENDPOINTS):
        WebhookEndpoint.objects.create(project=project, name=f"dead-{i}",
                                       url=f"http://127.0.0.1:{hole.port}/hook/{i}")
    client = Client()
    print(f"{ENDPOINTS} endpoints that never answer (budget "
          f"{settings.RECOVERYDASH_WEBHOOK_TIMEOUT_S:g} s each), {RUNS} new runs, workers of "
          f"{CONCURRENCY} processes")
    results = {}
    for layout in ("one pool", "split"):
        lat = measure(layout, hole, client, token, project)
        results[layout] = lat
        print(f"  {layout}: analysis latency median {statistics.median(lat):.1f} s, "
              f"longest {max(lat):.1f} s")
    hole.stop.set()
    ratio = max(results["split"]) / max(results["one pool"])
    print(f"ratio split / one pool (longest latency): {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
