#!/usr/bin/env python
"""What a batch full of mistakes costs the server, against an accepted batch of the same size
(issue: "3,000 events x 31 errors from one token cost 5 s of CPU each and pushed another
project's latency from 7 ms to 17 s").

What it does, by itself, in about a minute:

1. **In process**: CPU seconds of decoding and validating one request body (``json.loads`` and
   ``validate_events``, what ``POST /api/v1/events`` does before it touches the database) of
   3,000 ``update_committed`` events each carrying 31 errors (30 backwards ranges, a string
   count), against the same 3,000 events made valid (the baseline, same process, interleaved,
   median of ``BENCH_REPEAT``, default 5). Ratio invalid / valid.
2. **Through the real server** (gunicorn, ``BENCH_WORKERS`` sync workers, default 2, on a
   throwaway PostgreSQL database as in bench/ingest.py, default rate limit): latency of a small
   valid request of another project (one ``heartbeat``), alone and while one token sends the
   invalid batch from 2 threads for ``BENCH_SECONDS`` (default 10). Median and p95 of each,
   and how the attacker's requests were answered (400, 429).

Run: ``.venv/bin/python bench/ingest_invalid.py`` (``make bench`` runs it too). Prints the
ratio invalid / valid CPU last.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psycopg

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from ingest import start_server, stop_server  # noqa: E402  (bench/ingest.py, beside this one)

ADMIN_URL = os.environ.get("BENCH_DATABASE_ADMIN_URL",
                           "postgres://postgres@127.0.0.1:5432/postgres")
N_EVENTS = 3000
REPEAT = int(os.environ.get("BENCH_REPEAT", "5"))
SECONDS = float(os.environ.get("BENCH_SECONDS", "10"))
WORKERS = int(os.environ.get("BENCH_WORKERS", "2"))


def bad_event(i: int) -> dict:
    """31 errors: 30 spans with a backwards range, and a string sample count."""
    return {"event_id": f"e{i}", "type": "update_committed", "run_id": "attack", "attempt": 0,
            "time": "2026-11-01T00:00:05Z", "update": 1 + i, "samples": "x",
            "spans": [{"stratum": "s", "epoch": 0, "ranges": [[5, 1]]} for _ in range(30)]}


def good_event(i: int) -> dict:
    """The same event made valid: 30 forward ranges, an integer count."""
    ev = bad_event(i)
    ev["samples"] = 30
    ev["spans"] = [{"stratum": "s", "epoch": 0, "ranges": [[i * 64 + j, i * 64 + j + 1]]}
                   for j in range(30)]
    return ev


def body(events: list[dict]) -> bytes:
    return json.dumps({"events": events}).encode()


def in_process() -> float:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "recoverydash.settings")
    os.environ.setdefault("RECOVERYDASH_VAR_DIR", tempfile.mkdtemp(prefix="recoverydash-bench-"))
    import django

    django.setup()
    from recoverydash.ingest.errors import BadRequest
    from recoverydash.ingest.schemas import validate_events

    bad, good = body([bad_event(i) for i in range(N_EVENTS)]), \
        body([good_event(i) for i in range(N_EVENTS)])

    def cost(data: bytes) -> tuple[float, int]:
        started = time.process_time()
        errors = 0
        try:
            validate_events(json.loads(data)["events"])
        except BadRequest as exc:
            errors = len(exc.items)
        return time.process_time() - started, errors

    cost(good)  # warm-up: imports, pydantic's first calls
    bad_s, good_s = [], []
    for _ in range(REPEAT):
        t, errors = cost(bad)
        bad_s.append(t)
        good_s.append(cost(good)[0])
    b, g = statistics.median(bad_s), statistics.median(good_s)
    print(f"in process, {N_EVENTS} events ({len(bad):,} bytes): invalid {b * 1000:.0f} ms CPU "
          f"({errors} errors answered), valid {g * 1000:.0f} ms CPU (median of {REPEAT})")
    return b / g


def through_server() -> None:
    name = f"recoverydash_bench_invalid_{os.getpid()}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    var_dir = tempfile.mkdtemp(prefix="recoverydash-bench-")
    env = {**os.environ, "DATABASE_URL": url, "SECRET_KEY": "bench-only-" + "x" * 40,
           "DEBUG": "false", "RECOVERYDASH_VAR_DIR": var_dir, "LOG_LEVEL": "ERROR",
           "CELERY_BROKER_URL": "memory://", "RECOVERYDASH_REDIS_URL": ""}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    server = None
    try:
        manage = [sys.executable, str(REPO / "manage.py")]
        subprocess.run(manage + ["migrate", "--noinput", "-v", "0"], env=env, check=True,
                       cwd=REPO)

        def token(project: str) -> str:
            out = subprocess.run(manage + ["create_token", "--project", project, "--scopes",
                                           "ingest"], env=env, check=True, cwd=REPO,
                                 capture_output=True, text=True)
            return out.stdout.strip().splitlines()[-1]

        attacker, victim = token("attacker"), token("victim")
        server, port = start_server(env, WORKERS)
        api = f"http://127.0.0.1:{port}/api/v1/events"
        beat = iter(range(10**9))

        def victim_latency(seconds: float) -> list[float]:
            out = []
            with httpx.Client(timeout=120) as c:
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    n = next(beat)
                    ev = {"event_id": f"hb{n}", "type": "heartbeat", "run_id": "victim",
                          "attempt": 0, "time": "2026-11-01T00:00:05Z", "update": n}
                    started = time.perf_counter()
                    r = c.post(api, content=body([ev]), headers={
                        "Authorization": f"Bearer {victim}", "Content-Type": "application/json"})
                    out.append(time.perf_counter() - started)
                    assert r.status_code == 202, r.text
                    time.sleep(0.05)
            return out

        def summary(xs: list[float]) -> str:
            xs = sorted(xs)
            return (f"median {statistics.median(xs) * 1000:.0f} ms, "
                    f"p95 {xs[int(0.95 * (len(xs) - 1))] * 1000:.0f} ms ({len(xs)} requests)")

        victim_latency(1.0)  # warm-up
        alone = victim_latency(SECONDS / 2)
        stop, answers = threading.Event(), []
        bad = body([bad_event(i) for i in range(N_EVENTS)])

        def attack() -> None:
            with httpx.Client(timeout=120) as c:
                while not stop.is_set():
                    r = c.post(api, content=bad, headers={
                        "Authorization": f"Bearer {attacker}",
                        "Content-Type": "application/json"})
                    answers.append(r.status_code)
                    if r.status_code == 429:
                        time.sleep(float(r.headers.get("Retry-After", "1")))

        threads = [threading.Thread(target=attack) for _ in range(2)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        attacked = victim_latency(SECONDS)
        stop.set()
        for t in threads:
            t.join()
        codes = {code: answers.count(code) for code in sorted(set(answers))}
        print(f"through gunicorn ({WORKERS} workers): another project's heartbeat alone: "
              f"{summary(alone)}")
        print(f"  while one token sends the invalid batch from 2 threads: {summary(attacked)}; "
              f"the attacker's answers: {codes}")
    finally:
        stop_server(server)
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        subprocess.run(["rm", "-rf", var_dir], check=False)


def main() -> int:
    through_server()
    ratio = in_process()
    print(f"ratio invalid/valid CPU per request: {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
