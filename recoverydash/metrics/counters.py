"""What only the web processes see: ingest requests by answer status and ingest events by
outcome, counted with prometheus_client, correct with several gunicorn workers.

A gunicorn master forks workers that share nothing; a scrape reaches one of them. Counters kept in
a worker's memory would then go back and forth between scrapes (Prometheus reads each drop as a
counter reset). So under gunicorn the counters use prometheus_client's multiprocess mode: every
worker writes its counts to memory-mapped files in ``PROMETHEUS_MULTIPROC_DIR``, and a scrape
sums the files of every worker, the ones that exited included (a counter keeps what a dead
worker counted). :mod:`recoverydash.metrics.gunicorn` sets the directory up, empty, before the
workers start (``gunicorn --config python:recoverydash.metrics.gunicorn``, what ``make serve``,
the compose file and the Dockerfile run). Without the variable (``manage.py runserver``, tests, a
single process) the counters are this process's own.

One web host, one set of files: behind a load balancer with several web hosts, Prometheus scrapes
each host (``sum`` over ``instance`` in queries). Everything else on ``/metrics`` is read from the
database at scrape time (:mod:`.collector`) and is the same from any host.
"""

from __future__ import annotations

import json
import logging
import os

from prometheus_client import CollectorRegistry, Counter, disable_created_metrics

# A ``_created`` series beside each counter doubles the series for nothing Grafana uses.
disable_created_metrics()

log = logging.getLogger(__name__)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: The ingest path whose answers are counted.
INGEST_PATH = "/api/v1/events"

REGISTRY = CollectorRegistry(auto_describe=True)
INGEST_REQUESTS = Counter(
    "recoverydash_ingest_requests", "POST /api/v1/events answers by HTTP status; project is the "
    "token's ('' when no live token was presented).", ["project", "status"], registry=REGISTRY)
INGEST_EVENTS = Counter(
    "recoverydash_ingest_events", "Events of accepted batches: outcome accepted (stored) or "
    "duplicate (already stored, counted and not stored again).", ["project", "outcome"],
    registry=REGISTRY)


def multiprocess_dir() -> str | None:
    """The directory the workers' counter files are in, or None (counters of this process)."""
    return os.environ.get(MULTIPROC_ENV) or None


def counter_registry() -> CollectorRegistry:
    """The registry a scrape reads the counters from: the sum over every worker's files in
    multiprocess mode, else this process's :data:`REGISTRY`."""
    path = multiprocess_dir()
    if path is None:
        return REGISTRY
    from prometheus_client import multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=path)
    return registry


def count_ingest(project: str, status: int, body: bytes | None) -> None:
    """Count one ingest answer: its ``status``, and for a 202 the ``accepted`` and
    ``duplicates`` of its body (docs/ingest-v1.md#answers)."""
    INGEST_REQUESTS.labels(project=project, status=str(status)).inc()
    if status != 202 or not body:
        return
    try:
        answer = json.loads(body)
    except ValueError:
        return
    for outcome, key in (("accepted", "accepted"), ("duplicate", "duplicates")):
        value = answer.get(key)
        if isinstance(value, int) and value > 0:
            INGEST_EVENTS.labels(project=project, outcome=outcome).inc(value)


class IngestMetricsMiddleware:
    """Counts every answer to ``POST /api/v1/events`` (:func:`count_ingest`), whatever produced
    it: the view, the API's error handler, a database that does not answer. Outermost in
    ``MIDDLEWARE`` so that it sees the final answer; the project is that of the token the API
    authenticated (``request.auth``)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if request.method == "POST" and request.path.rstrip("/") == INGEST_PATH:
            token = getattr(request, "auth", None)
            project = getattr(getattr(token, "project", None), "name", "") or ""
            streaming = getattr(response, "streaming", False)
            try:
                count_ingest(project, response.status_code,
                             None if streaming else response.content)
            except Exception:  # noqa: BLE001 - counting must never cost an answer
                log.warning("ingest counters not updated", exc_info=True)
        return response
