#!/usr/bin/env python
"""End-to-end ingest throughput against a raw ``COPY`` of the same rows (issue 2, "Show").

What it does, by itself, in about a minute:

1. creates a throwaway PostgreSQL database (``BENCH_DATABASE_ADMIN_URL``, default the machine's
   ``postgres://postgres@127.0.0.1:5432/postgres``), migrates it and creates an ingest token with
   ``manage.py create_token``;
2. starts gunicorn (``BENCH_WORKERS`` sync workers, default 2) on a free loopback port;
3. sends batches of 1,000 ``update_committed`` events as an SDK does (64 data-parallel ranks,
   each reporting one strided span per update, spelled as the SDK's recorders spell it:
   ``[base + r, base + r + 512, 64]``, so the ranks of an update fold into one ledger row) from
   ``BENCH_CLIENTS`` threads (default 2, one run each), ``BENCH_SECONDS`` in all (default 20)
   after a warm-up;
4. after each of ``BENCH_ROUNDS`` (default 4) HTTP rounds, COPYs as many events' rows into
   the same tables with psycopg 3 from as many connections, one transaction per 1,000 events,
   twice: the rows exactly as ingest stores them (slim bodies with the hashes of the whole
   events, ledger rows folded one per update) and the rows as received (whole bodies, a ledger
   row per event: the baseline of earlier rounds); alternating keeps a change in the shared
   machine's load from favouring either side;
5. prints the rates in events/s and the ratio HTTP / COPY against each baseline, the ratio of
   each round against the rows as stored (the spread the shared machine gives) and the target
   (issue 13: at least 0.5 against the rows as stored), stops the server and drops the
   database.

Celery's broker is ``memory://`` in the server: what ingest enqueues after commit is counted,
a broker's own latency is not.

Run: ``.venv/bin/python bench/ingest.py`` (``make bench`` runs it too).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path

import httpx
import psycopg

REPO = Path(__file__).resolve().parent.parent
ADMIN_URL = os.environ.get("BENCH_DATABASE_ADMIN_URL",
                           "postgres://postgres@127.0.0.1:5432/postgres")
WORLD = 64
PER_RANK = 8          # samples per rank per update
BATCH = 1000
SECONDS = float(os.environ.get("BENCH_SECONDS", "20"))
CLIENTS = int(os.environ.get("BENCH_CLIENTS", "2"))
WORKERS = int(os.environ.get("BENCH_WORKERS", "2"))
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "4"))


def events_for(run_id: str, batch_no: int) -> list[dict]:
    """Batch ``batch_no`` of a run: events ``batch_no*1000 ...``, rank = i % 64."""
    out = []
    gbs = WORLD * PER_RANK
    for i in range(batch_no * BATCH, (batch_no + 1) * BATCH):
        update, rank = 1 + i // WORLD, i % WORLD
        base = (update - 1) * gbs
        out.append({"event_id": f"{run_id}-{update}-{rank}", "type": "update_committed",
                    "run_id": run_id, "attempt": 0, "time": "2026-11-01T00:00:05.250+00:00",
                    "rank": rank, "update": update, "samples": PER_RANK,
                    "spans": [{"stratum": "main", "epoch": 0,
                               "ranges": [[base + rank, base + rank + gbs, WORLD]]}]})
    return out


def free_port() -> int:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(env: dict, workers: int) -> tuple[subprocess.Popen, int]:
    """gunicorn with ``workers`` sync workers on a free loopback port, in its own process group;
    returns (process, port) once it answers. SystemExit when it does not start."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "recoverydash.wsgi", "--bind",
         f"127.0.0.1:{port}", "--workers", str(workers), "--log-level", "warning",
         "--timeout", "120"], env=env, cwd=REPO, start_new_session=True)
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/v1/openapi.json", timeout=2).is_success:
                return server, port
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or server.poll() is not None:
            stop_server(server)
            raise SystemExit("gunicorn did not start")
        time.sleep(0.2)


def stop_server(server: subprocess.Popen | None) -> None:
    """Stop a server of ``start_server`` (its own process group only)."""
    if server is not None and server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def db_url(name: str) -> str:
    return ADMIN_URL.rsplit("/", 1)[0] + "/" + name


class HttpSender:
    """CLIENTS threads, one run each, posting pre-serialised batches in order."""

    def __init__(self, port: int, token: str):
        self.url = f"http://127.0.0.1:{port}/api/v1/events"
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.next_batch = [0] * CLIENTS
        self.sessions = [httpx.Client(timeout=60) for _ in range(CLIENTS)]

    def body(self, c: int, b: int) -> bytes:
        return json.dumps({"events": events_for(f"bench-http-{c}", b)}).encode()

    def run(self, seconds: float) -> tuple[int, float]:
        """Send for ``seconds``; returns (events accepted, elapsed seconds)."""
        stop = threading.Event()
        counts = [0] * CLIENTS
        errors: list[str] = []
        # Pre-serialise: the client's JSON encoding is not the server's cost.
        bodies = {c: [self.body(c, b) for b in range(self.next_batch[c],
                                                    self.next_batch[c] + int(seconds * 40))]
                  for c in range(CLIENTS)}

        def client(c: int) -> None:
            for body in bodies[c]:
                if stop.is_set():
                    return
                r = self.sessions[c].post(self.url, content=body, headers=self.headers)
                if r.status_code != 202 or r.json()["accepted"] != BATCH:
                    errors.append(f"{r.status_code} {r.text[:200]}")
                    stop.set()
                    return
                counts[c] += BATCH
                self.next_batch[c] += 1

        threads = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
        started = time.perf_counter()
        for t in threads:
            t.start()
        stop.wait(seconds)
        stop.set()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - started
        if errors:
            raise SystemExit(f"ingest failed: {errors[0]}")
        return sum(counts), elapsed


class CopyWriter:
    """The rows the server writes for the same events, COPYed by CLIENTS connections into fresh
    runs, one transaction per 1,000 events. ``shape`` ``"stored"``: the rows exactly as ingest
    stores them (each event's slim body, ``ingest.actions.stored_body``, with the hash of its
    canonical JSON; the batch's ledger rows folded by ``runs.folding.fold``, one row per update
    of 64 ranks); ``"received"``: the baseline of earlier rounds (each event's whole canonical
    JSON as its body, one ledger row per event)."""

    def __init__(self, url: str, shape: str = "stored"):
        self.url, self.shape = url, shape
        self.next_batch = [0] * CLIENTS
        with psycopg.connect(url, autocommit=True) as conn:
            project_id = conn.execute(
                "SELECT id FROM runs_project WHERE name = 'bench'").fetchone()[0]
            now = datetime.now(UTC)
            self.run_pks = [conn.execute(
                "INSERT INTO runs_run (project_id, run_id, created_at, event_count, ingest_seq, "
                "contract, strata) VALUES (%s, %s, %s, 0, 0, '{}', '{}') RETURNING id",
                (project_id, f"bench-copy-{shape}-{c}", now)).fetchone()[0]
                for c in range(CLIENTS)]

    def rows(self, c: int, b: int) -> tuple[list, list]:
        t_event = datetime(2026, 11, 1, 0, 0, 5, 250000, tzinfo=UTC)
        now = datetime.now(UTC)
        ev_rows, ledger_rows = [], []
        parts: dict[int, dict[int, dict]] = {}
        stored_body = _stored_body() if self.shape == "stored" else None
        for ev in events_for(f"bench-copy-{self.shape}-{c}", b):
            text = json.dumps(ev, sort_keys=True, separators=(",", ":"))
            digest = hashlib.sha256(text.encode()).hexdigest()
            body = text if stored_body is None else json.dumps(
                stored_body(ev["type"], ev), sort_keys=True, separators=(",", ":"))
            ev_rows.append((self.run_pks[c], ev["event_id"], ev["type"], 0, ev["rank"], t_event,
                            now, b + 1, digest, body))
            parts.setdefault(ev["update"], {})[ev["rank"]] = {
                "time": t_event, "spans": ev["spans"], "samples": ev["samples"], "tokens": None}
        from recoverydash.runs.folding import fold

        for u, of_update in parts.items():
            rows = (fold(of_update) if self.shape == "stored"
                    else [(r, 1, 0, e) for r, e in of_update.items()])
            for rank, ranks, shift, entry in rows:
                ledger_rows.append((self.run_pks[c], 0, u, rank, ranks, shift, t_event,
                                    json.dumps(entry["spans"]), entry["samples"], None, b + 1,
                                    b + 1))
        return ev_rows, ledger_rows

    def run(self, n_events: int) -> tuple[int, float]:
        """COPY about ``n_events``; returns (events, elapsed seconds)."""
        per_client = max(1, n_events // BATCH // CLIENTS)
        prepared = {c: [self.rows(c, b) for b in range(self.next_batch[c],
                                                       self.next_batch[c] + per_client)]
                    for c in range(CLIENTS)}
        for c in range(CLIENTS):
            self.next_batch[c] += per_client

        def client(c: int) -> None:
            with psycopg.connect(self.url) as conn:
                for ev_rows, ledger_rows in prepared[c]:
                    with conn.transaction(), conn.cursor() as cur:
                        with cur.copy("COPY runs_event (run_id, event_id, type, attempt, rank, "
                                      "time, received_at, batch_seq, content_hash, body) "
                                      "FROM STDIN") as cp:
                            for row in ev_rows:
                                cp.write_row(row)
                        with cur.copy("COPY runs_ledgerrow (run_id, attempt, update, rank, "
                                      "ranks, rank_shift, time, spans, samples, tokens, "
                                      "first_seq, last_seq) FROM STDIN") as cp:
                            for row in ledger_rows:
                                cp.write_row(row)

        threads = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
        started = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return per_client * CLIENTS * BATCH, time.perf_counter() - started


def _stored_body():
    """``recoverydash.ingest.actions.stored_body`` (Django set up in this process, no database
    used)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "recoverydash.settings")
    os.environ.setdefault("SECRET_KEY", "bench-only")
    import django

    django.setup()
    from recoverydash.ingest.actions import stored_body

    return stored_body


@contextlib.contextmanager
def bench_database(prefix: str):
    """A throwaway PostgreSQL database ``<prefix>_<pid>``, migrated, with an ingest token of
    project ``bench``; yields ``(name, url, env, token)``: ``env`` is the server's environment
    for it (no rate limit: the benches measure the ingest path, not the per-token limiter).
    Drops the database and the server's var folder afterwards."""
    name = f"{prefix}_{os.getpid()}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = db_url(name)
    var_dir = tempfile.mkdtemp(prefix="recoverydash-bench-")
    env = {**os.environ, "DATABASE_URL": url, "SECRET_KEY": "bench-only", "DEBUG": "false",
           "RECOVERYDASH_VAR_DIR": var_dir, "LOG_LEVEL": "WARNING",
           "RECOVERYDASH_RATE_LIMIT_PER_SECOND": "0", "CELERY_BROKER_URL": "memory://"}
    try:
        run = [sys.executable, str(REPO / "manage.py")]
        subprocess.run(run + ["migrate", "--noinput", "-v", "0"], env=env, check=True, cwd=REPO)
        out = subprocess.run(run + ["create_token", "--project", "bench", "--scopes", "ingest"],
                             env=env, check=True, cwd=REPO, capture_output=True, text=True)
        yield name, url, env, out.stdout.strip().splitlines()[-1]
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        subprocess.run(["rm", "-rf", var_dir], check=False)


def main() -> int:
    with bench_database("recoverydash_bench") as (name, url, env, token):
        server = None
        try:
            server, port = start_server(env, WORKERS)
            print(f"PostgreSQL database {name}; gunicorn with {WORKERS} sync workers on port "
                  f"{port}; {CLIENTS} clients; batches of {BATCH} update_committed events, "
                  f"{WORLD} ranks")
            sender = HttpSender(port, token)
            writers = {shape: CopyWriter(url, shape) for shape in ("stored", "received")}
            sender.run(2)  # warm-up: imports, connections, first rows of each run
            # Alternate in rounds: the machine is shared, and a load change then hits all.
            n_http = t_http = 0.0
            copied = {shape: [0.0, 0.0] for shape in writers}
            rounds = []  # per round: HTTP / COPY of the rows as stored
            for _ in range(ROUNDS):
                n, t = sender.run(SECONDS / ROUNDS)
                n_http, t_http = n_http + n, t_http + t
                rates = {}
                for shape, writer in writers.items():
                    m, t2 = writer.run(n)
                    copied[shape][0] += m
                    copied[shape][1] += t2
                    rates[shape] = m / t2
                rounds.append((n / t) / rates["stored"])
            http_rate = n_http / t_http
            print(f"HTTP ingest:  {n_http:.0f} events in {t_http:.2f} s = "
                  f"{http_rate:,.0f} events/s")
            labels = {"stored": "raw COPY of the rows as stored (slim bodies, folded ledger rows)",
                      "received": "raw COPY of the rows as received (whole bodies, a ledger row "
                                  "per event; earlier rounds' baseline)"}
            for shape, (m, t) in copied.items():
                print(f"{labels[shape]}: {m:.0f} events in {t:.2f} s = {m / t:,.0f} events/s; "
                      f"ratio HTTP/COPY {http_rate / (m / t):.2f}")
            ratio = http_rate / (copied["stored"][0] / copied["stored"][1])
            print(f"rounds, HTTP/COPY of the rows as stored: "
                  f"{' '.join(f'{r:.2f}' for r in rounds)}")
            print(f"target (issue 13): HTTP ingest at least 0.5x a raw COPY of the rows as "
                  f"stored: {ratio:.2f}, {'met' if ratio >= 0.5 else 'not met'}")
            return 0
        finally:
            stop_server(server)


if __name__ == "__main__":
    sys.exit(main())
