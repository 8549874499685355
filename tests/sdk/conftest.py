"""Fixtures of the SDK tests: a tiny ingest server in a thread, free ports, a moto S3 server.

Nothing here needs Django: run the pure parts with ``pytest tests/sdk -p no:django``."""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def wait_for(pred, timeout=10.0, step=0.02) -> bool:
    """Poll ``pred`` every ``step`` seconds until it is true or ``timeout`` seconds passed;
    returns its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return pred()


def drained_by_next_attempt(ingest, spool, run_id: str, attempt: int) -> list[str]:
    """A client of ``attempt`` of ``run_id`` (no SIGTERM handler) drains the run's spool in
    ``spool`` into ``ingest``; returns the stored event ids as stored (unsorted)."""
    from recoverydash.sdk.client import Client

    later = Client(ingest.url, "tok-1", run_id, attempt=attempt, rank=0, spool_dir=spool,
                   flush_interval=0.05, handle_sigterm=False)
    try:
        assert later.flush(30)
    finally:
        later.close(0.5)
    return list(ingest.stored)


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class LocalServer:
    """An HTTP server on 127.0.0.1 answering with a handler class from a daemon thread; the
    SDK tests' scripted servers are made of it (``serve`` in their ``__init__``)."""

    def serve(self, handler, port: int | None = None) -> None:
        """Serve ``handler`` on ``port`` (a free one by default); sets ``port`` and ``url``."""
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


def stopped_after(cls):
    """A fixture's body: yields ``make(*args)`` that starts a ``cls`` server, and stops every
    server it made when the test ends."""
    made = []

    def make(*a, **kw):
        made.append(cls(*a, **kw))
        return made[-1]

    yield make
    for server in made:
        server.stop()


class FakeIngest(LocalServer):
    """Records every request to ``/api/v1/events``; stores events idempotently on event_id.

    ``script``: a list of responses used one per request before the default 202, each
    ``(status, headers_dict)`` or ``(status, headers_dict, body_dict)``. ``tokens``: when set,
    a request with another bearer token is refused with ``token_status`` (401 or 403) before
    anything else (recorded in ``refused_tokens``, not in ``requests``). ``poison``: a predicate
    on an event; a batch holding one it is true for is answered 500 (and nothing of it stored),
    as a server that fails on that event would."""

    def __init__(self):
        self.requests: list[dict] = []
        self.stored: dict[str, dict] = {}
        self.deliveries: dict[str, int] = {}
        self.script: list[tuple[int, dict]] = []
        self.delay = 0.0  # seconds each request waits before it is answered
        self.gate = None  # a threading.Event: while it is not set, every POST waits for it
        self.runs: list[dict] = []  # GET /api/v1/runs answers this list
        self.runs_status = 200      # ... with this status (403: a token without read scope)
        self.gets: list[str] = []
        self.poison = None
        self.tokens: set[str] | None = None  # tokens taken; another is refused ``token_status``
        self.token_status = 401
        self.refused_tokens: list[str] = []  # the Authorization headers refused, in order
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                fake.gets.append(self.path)
                if not self.path.startswith("/api/v1/runs"):
                    status, out = 404, b'{"detail": "not found"}'
                elif fake.runs_status != 200:
                    status, out = fake.runs_status, b'{"detail": "scripted"}'
                else:
                    status, out = 200, json.dumps(fake.runs).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def refuse_token(self) -> bool:
                given = self.headers.get("Authorization") or ""
                if fake.tokens is None or given in {f"Bearer {t}" for t in fake.tokens}:
                    return False
                with fake.lock:
                    fake.refused_tokens.append(given)
                code = {401: "unauthorized", 403: "forbidden"}[fake.token_status]
                out = json.dumps({"error": code, "errors": [{"index": None, "path": "",
                                                             "message": "scripted"}]}).encode()
                self.send_response(fake.token_status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)
                return True

            def not_the_api(self) -> bool:
                """A path other than the events endpoint: a web server's HTML 404 page."""
                if self.path == "/api/v1/events":
                    return False
                out = b"<!DOCTYPE html><html><body><h1>Not Found</h1>" + b"." * 4000 + \
                    b"</body></html>"
                self.send_response(404)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)
                return True

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n)
                if self.refuse_token() or self.not_the_api():
                    return
                gzipped = self.headers.get("Content-Encoding") == "gzip"
                body = gzip.decompress(raw) if gzipped else raw
                events = json.loads(body)["events"]
                if fake.delay:
                    time.sleep(fake.delay)
                if fake.gate is not None:
                    fake.gate.wait(30)
                with fake.lock:
                    fake.requests.append({"path": self.path, "headers": dict(self.headers),
                                          "raw_len": len(raw), "events": events,
                                          "t": time.monotonic()})
                    answer = fake.script.pop(0) if fake.script else (202, {})
                    status, headers = answer[0], answer[1]
                    if status == 202 and fake.poison and any(fake.poison(e) for e in events):
                        status = 500
                    dup = 0
                    if status == 202:
                        for e in events:
                            eid = e["event_id"]
                            fake.deliveries[eid] = fake.deliveries.get(eid, 0) + 1
                            if e["event_id"] in fake.stored:
                                dup += 1
                            else:
                                fake.stored[e["event_id"]] = e
                out = json.dumps({"accepted": len(events) - dup, "duplicates": dup}
                                 if status == 202 else answer[2] if len(answer) > 2
                                 else {"errors": [{"index": None, "path": "",
                                                   "message": "scripted"}]}).encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.serve(Handler)

    def restart(self):
        """Serve again on the same port (after ``stop``), keeping what was stored."""
        self.serve(self.server.RequestHandlerClass, self.port)

    def event_count(self) -> int:
        return sum(len(r["events"]) for r in self.requests)


@pytest.fixture
def ingest():
    srv = FakeIngest()
    yield srv
    try:
        srv.stop()
    except Exception:
        pass


@pytest.fixture(autouse=True)
def _default_spool_dir(tmp_path, monkeypatch):
    """Every test's default spool (``RECOVERYDASH_SPOOL_DIR``) is its own: a client made
    without ``spool_dir``, and ``restore_plan``, which sends the run's spool before it asks,
    never touch the home folder's, nor another test's."""
    monkeypatch.setenv("RECOVERYDASH_SPOOL_DIR", str(tmp_path / "default-spool"))


@pytest.fixture
def spool(tmp_path):
    return str(tmp_path / "spool")


@pytest.fixture(scope="session")
def s3_server():
    """moto's S3 in server mode over HTTP on 127.0.0.1: ``(endpoint_url, client)``."""
    from moto.server import ThreadedMotoServer

    from recoverydash.checkpoints.objects import make_s3_client

    port = free_port()
    srv = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    srv.start()
    endpoint = f"http://127.0.0.1:{port}"
    client = make_s3_client(endpoint, access_key_id="testing", secret_access_key="testing")
    yield endpoint, client
    srv.stop()


def api_get(live_server, token: str, path: str):
    """The JSON answer of a GET on the live server's API."""
    import urllib.request

    req = urllib.request.Request(f"{live_server.url}{path}",
                                 headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


@pytest.fixture
def trainer_env(live_server, settings, tmp_path, project, declare_location):
    """For trainer processes against the live server: tasks run eagerly, no rate limit, the
    environment of a fresh launch (no launcher or SDK variables, a spool in ``tmp_path``), and
    ``tmp_path`` declared as a storage location of ``project`` (the server reads checkpoints
    only under its project's locations)."""
    import os

    declare_location(project, tmp_path)

    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.RECOVERYDASH_RATE_LIMIT_PER_SECOND = 0
    settings.RECOVERYDASH_REDIS_URL = ""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RECOVERYDASH_", "TORCHELASTIC_", "SLURM_", "RANK", "WORLD_SIZE",
                                "LOCAL_RANK", "MASTER_"))}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1",
               RECOVERYDASH_SPOOL_DIR=str(tmp_path / "spool"))
    return env
