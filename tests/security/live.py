"""A real server for the attack tests: gunicorn (2 sync workers) on a free loopback port, on a
throwaway PostgreSQL database or a SQLite file, with a superuser, an ingest+read token and the
memory broker (nothing is enqueued anywhere). ``LiveServer.manage(...)`` runs manage.py against
the same database."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import closing
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent.parent
ADMIN_URL = os.environ.get("RECOVERYDASH_FUZZ_ADMIN_URL",
                           "postgres://postgres@127.0.0.1:5432/postgres")
PASSWORD = "fuzz passphrase 7"


def free_port() -> int:
    with closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    def __init__(self, engine: str, scopes: str = "ingest,read", gunicorn_args: tuple = (),
                 **env: str):
        self.engine = engine
        self.var = tempfile.mkdtemp(prefix="recoverydash-live-")
        self.db_name = f"recoverydash_live_{os.getpid()}_{free_port()}"
        if engine == "postgresql":
            import psycopg

            with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
                admin.execute(f'CREATE DATABASE "{self.db_name}"')
            self.database_url = ADMIN_URL.rsplit("/", 1)[0] + "/" + self.db_name
        else:
            self.database_url = f"sqlite:///{self.var}/live.sqlite3"
        self.env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"),
                    "DATABASE_URL": self.database_url, "SECRET_KEY": "live-" + "k" * 60,
                    "DEBUG": "false", "RECOVERYDASH_VAR_DIR": self.var, "LOG_LEVEL": "ERROR",
                    "CELERY_BROKER_URL": "memory://", "RECOVERYDASH_REDIS_URL": "",
                    "RECOVERYDASH_RATE_LIMIT_PER_SECOND": "0",
                    "DJANGO_SUPERUSER_PASSWORD": PASSWORD, **env}
        self.server = None
        self.manage("migrate", "--noinput", "-v", "0")
        self.manage("createsuperuser", "--noinput", "--username", "root",
                    "--email", "root@example.org")
        out = self.manage("create_token", "--project", "fuzz", "--scopes", scopes)
        self.token = out.stdout.strip().splitlines()[-1]
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "recoverydash.wsgi", "--bind",
             f"127.0.0.1:{self.port}", "--workers", "2", "--timeout", "60",
             "--log-level", "warning", *gunicorn_args], cwd=REPO, env=self.env,
            start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(self.var, "server.log"), "wb"))
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(self.url + "/api/v1/openapi.json", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or self.server.poll() is not None:
                self.close()
                raise RuntimeError("gunicorn did not start: " + self.log()[-2000:])
            time.sleep(0.2)

    def manage(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env=self.env,
                              capture_output=True, text=True, timeout=600, check=check)

    def log(self) -> str:
        try:
            return Path(self.var, "server.log").read_text(errors="replace")
        except OSError:
            return ""

    def headers(self, **extra) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json",
                **extra}

    def session(self) -> httpx.Client:
        """A signed-in browser-like client (the superuser)."""
        c = httpx.Client(base_url=self.url, timeout=60, follow_redirects=False)
        page = c.get("/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)[1]
        r = c.post("/login/", data={"username": "root", "password": PASSWORD,
                                    "csrfmiddlewaretoken": token},
                   headers={"Referer": self.url + "/login/"})
        assert r.status_code == 302, r.text[:500]
        return c

    def close(self):
        if self.server is not None and self.server.poll() is None:
            os.killpg(self.server.pid, signal.SIGTERM)  # our own process group only
            try:
                self.server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.server.pid, signal.SIGKILL)
                self.server.wait()
        if self.engine == "postgresql":
            import psycopg

            with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')
        subprocess.run(["rm", "-rf", self.var], check=False)
