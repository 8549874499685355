"""The ingest counters under gunicorn with several workers: every scrape, whichever worker answers
it, shows every answer counted once, also after a worker exited (slow: a real server)."""

from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.metrics.conftest import Scrape
from tests.security.live import LiveServer

pytestmark = pytest.mark.slow


def batch(i: int) -> str:
    return json.dumps({"events": [{"event_id": f"hb-{i}", "type": "heartbeat", "run_id": "mp",
                                   "attempt": 0, "time": "2026-11-29T08:00:00Z", "update": i}]})


def test_it_sums_the_counters_of_every_gunicorn_worker():
    server = LiveServer("postgresql", scopes="ingest,read,metrics", gunicorn_args=(
        "--workers", "3", "--config", "python:recoverydash.metrics.gunicorn"))
    try:
        def scrape() -> Scrape:
            # A new connection each time: the master hands it to whichever worker is free.
            response = httpx.get(server.url + "/metrics", headers=server.headers(), timeout=30)
            assert response.status_code == 200, response.text[:500]
            return Scrape(response.text)

        def accepted(page: Scrape) -> float | None:
            return page.value("recoverydash_ingest_requests_total", project="fuzz",
                              status="202")

        def post(i: int) -> int:
            return httpx.post(server.url + "/api/v1/events", content=batch(i),
                              headers=server.headers(), timeout=30).status_code

        # Six at a time: a sync worker serves one request at once, so the others must take some
        # (one after another, one fast worker could accept every connection).
        with ThreadPoolExecutor(6) as pool:
            assert list(pool.map(post, range(30))) == [202] * 30
        httpx.post(server.url + "/api/v1/events", content="{", headers=server.headers(),
                   timeout=30)
        pages = [scrape() for _ in range(12)]
        assert [accepted(p) for p in pages] == [30.0] * 12
        assert {p.value("recoverydash_ingest_requests_total", project="fuzz", status="400")
                for p in pages} == {1.0}
        assert {p.value("recoverydash_ingest_events_total", project="fuzz",
                        outcome="accepted") for p in pages} == {30.0}
        files = os.listdir(os.path.join(server.var, "prometheus"))
        assert len({f for f in files if f.startswith("counter_")}) >= 2, files  # per worker
        # One worker fewer (TTOU): what it counted stays counted.
        os.kill(server.server.pid, signal.SIGTTOU)
        time.sleep(3)
        assert [accepted(scrape()) for _ in range(6)] == [30.0] * 6
    finally:
        server.close()
