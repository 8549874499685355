"""Deployment hygiene as an operator meets it: the documented production settings pass Django's
deployment checks without a warning; the example secret and a missing database password stop a
production process; HTTPS settings come from the environment; sign-in is throttled; /healthz
says which dependency failed; the admin has the objects the README sends people to."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

REPO = Path(__file__).resolve().parent.parent.parent


def documented_production_env() -> dict[str, str]:
    """The variables .env.example sets, its change-me values replaced as it says, plus what
    docker-compose.yml sets for the app containers."""
    env = {}
    for line in (REPO / ".env.example").read_text().splitlines():
        match = re.match(r"^([A-Z][A-Z0-9_]+)=(.*)$", line)
        if match:
            env[match[1]] = match[2]
    assert env["SECRET_KEY"].startswith("change-me") and env["POSTGRES_PASSWORD"] == "change-me"
    env["SECRET_KEY"] = secrets.token_urlsafe(50)
    env["POSTGRES_PASSWORD"] = secrets.token_urlsafe(24)
    env["DATABASE_URL"] = f"postgres://recoverydash:{env['POSTGRES_PASSWORD']}@postgres:5432/rd"
    env["CELERY_BROKER_URL"] = "redis://redis:6379/0"
    env["RECOVERYDASH_REDIS_URL"] = "redis://redis:6379/1"
    return env


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """Run manage.py in a clean environment (nothing of this test process leaks in)."""
    base = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp"),
            "RECOVERYDASH_VAR_DIR": os.environ.get("PYTEST_TMP_VAR", "/tmp/recoverydash-var")}
    return subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env={**base, **env},
                          capture_output=True, text=True, timeout=120)


def test_check_deploy_with_the_documented_production_settings_prints_no_warning():
    result = manage(documented_production_env(), "check", "--deploy", "--fail-level", "WARNING")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "System check identified no issues (0 silenced)." in output
    assert "WARNING" not in output and "?: (" not in output


def test_the_example_secret_stops_a_production_process():
    env = {**documented_production_env(), "SECRET_KEY": "change-me-to-a-long-random-string"}
    result = manage(env, "check")
    assert result.returncode != 0
    assert "SECRET_KEY is the example value of .env.example" in result.stderr
    assert manage({**env, "DEBUG": "true"}, "check").returncode == 0


@pytest.mark.parametrize("url, refused", [
    ("postgres://recoverydash:@postgres:5432/rd", "has no password for the database server "
                                                  "'postgres'"),
    ("postgres://recoverydash@db.internal:5432/rd", "has no password for the database server "
                                                    "'db.internal'"),
    ("postgres://recoverydash:change-me@postgres:5432/rd", "carries the example password"),
    ("postgres://postgres@127.0.0.1:5432/rd", None),  # local trust authentication
    ("postgres://postgres@localhost/rd", None),
])
def test_a_production_process_refuses_a_database_without_a_real_password(url, refused):
    env = {**documented_production_env(), "DATABASE_URL": url}
    result = manage(env, "check")
    if refused is None:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode != 0 and refused in result.stderr, result.stderr
        assert manage({**env, "DEBUG": "true"}, "check").returncode == 0


def test_docker_compose_refuses_to_start_without_a_database_password():
    compose = (REPO / "docker-compose.yml").read_text()
    assert compose.count("${POSTGRES_PASSWORD:?") == 2 and ":-recoverydash" not in compose


def test_https_settings_come_from_the_environment():
    code = ("from django.conf import settings as s; print(s.SESSION_COOKIE_SECURE, "
            "s.CSRF_COOKIE_SECURE, s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS, "
            "s.SECURE_HSTS_INCLUDE_SUBDOMAINS, s.SECURE_HSTS_PRELOAD, "
            "s.SECURE_PROXY_SSL_HEADER, s.CSRF_TRUSTED_ORIGINS)")
    result = manage(documented_production_env(), "shell", "--no-imports", "-c", code)
    assert result.stdout.strip() == ("True True True 31536000 True True "
                                     "('HTTP_X_FORWARDED_PROTO', 'https') "
                                     "['https://recoverydash.example.org']"), result.stderr
    bad = manage({**documented_production_env(), "SECURE_PROXY_SSL_HEADER": "https"}, "check")
    assert bad.returncode != 0 and "SECURE_PROXY_SSL_HEADER must be" in bad.stderr


@pytest.mark.django_db
def test_behind_the_proxy_plain_http_is_redirected_and_https_gets_hsts(client, settings):
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.SECURE_HSTS_SECONDS = 31536000
    response = client.get("/login/")
    assert response.status_code == 301 and response["Location"] == "https://testserver/login/"
    response = client.get("/login/", HTTP_X_FORWARDED_PROTO="https")
    assert response.status_code == 200
    assert response["Strict-Transport-Security"].startswith("max-age=31536000")
    assert client.get("/healthz").status_code in (200, 503)  # never redirected


# --- sign-in throttle -------------------------------------------------------------------------
@pytest.fixture
def alice(db):
    return get_user_model().objects.create_user("alice", password="the right passphrase")


def sign_in(client, password, ip="198.51.100.7", path="/login/"):
    return client.post(path, {"username": "alice", "password": password},
                       REMOTE_ADDR=ip)


def test_300_wrong_passwords_then_the_right_one_does_not_get_in(client, alice, settings):
    assert settings.AXES_FAILURE_LIMIT == 5
    codes = [sign_in(client, f"guess {i}").status_code for i in range(300)]
    assert codes[:4] == [200] * 4  # the form again, with its error
    assert set(codes[4:]) == {429}
    locked = sign_in(client, "the right passphrase")
    assert locked.status_code == 429
    assert "5 wrong passwords for <strong>alice</strong> from this address" in \
        locked.content.decode()
    assert "_auth_user_id" not in client.session


def test_the_pause_is_per_user_and_address_and_lifted_by_the_admin_command(client, alice):
    for i in range(5):
        sign_in(client, f"guess {i}")
    assert sign_in(client, "the right passphrase").status_code == 429
    # the real user elsewhere is not locked out by someone guessing from another address
    assert sign_in(client, "the right passphrase", ip="203.0.113.9").status_code == 302
    client.logout()
    from django.core.management import call_command

    call_command("axes_reset_username", "alice")
    assert sign_in(client, "the right passphrase").status_code == 302


def test_the_admin_sign_in_is_throttled_too(client, db):
    get_user_model().objects.create_superuser("root", password="the admin passphrase")
    for i in range(5):
        client.post("/admin/login/", {"username": "root", "password": f"guess {i}"},
                    REMOTE_ADDR="198.51.100.7")
    response = client.post("/admin/login/", {"username": "root",
                                             "password": "the admin passphrase"},
                           REMOTE_ADDR="198.51.100.7")
    assert response.status_code == 429


def test_a_success_resets_the_count(client, alice):
    for i in range(4):
        sign_in(client, f"guess {i}")
    assert sign_in(client, "the right passphrase").status_code == 302
    client.logout()
    for i in range(4):
        assert sign_in(client, f"again {i}").status_code == 200


# --- /healthz ---------------------------------------------------------------------------------
@pytest.fixture
def broker_up():
    """The Celery app's broker set to the machine's Redis (other tests leave it pointing at
    brokers they have stopped), restored afterwards."""
    from celery import current_app

    before = current_app.conf.broker_url
    current_app.conf.broker_url = "redis://127.0.0.1:6379/0"
    yield
    current_app.conf.broker_url = before


@pytest.mark.django_db
@pytest.mark.usefixtures("broker_up")
def test_healthz_says_ok_when_the_database_and_the_broker_answer(client):
    response = client.get("/healthz")
    assert response.status_code == 200, response.json()
    assert response.json() == {"ok": True, "checks": {"database": "ok", "broker": "ok"}}


@pytest.mark.django_db
def test_healthz_names_the_broker_when_it_does_not_answer(client):
    from celery import current_app

    before = current_app.conf.broker_url
    current_app.conf.broker_url = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    try:
        response = client.get("/healthz")
    finally:
        current_app.conf.broker_url = before
    assert response.status_code == 503
    body = response.json()
    assert body["ok"] is False and body["failed"] == ["broker"]
    assert body["checks"]["database"] == "ok" and "Connection refused" in body["checks"]["broker"]


@pytest.mark.django_db
@pytest.mark.usefixtures("broker_up")
def test_healthz_names_the_database_when_it_takes_no_write_though_it_reads(client):
    """Found by an operator: /healthz said 200 while the database was read-only (ingest
    answered 503). A read-only transaction still reads; the check's write fails."""
    from django.contrib.sessions.models import Session
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET TRANSACTION READ ONLY")
        else:
            cursor.execute("PRAGMA query_only = ON")
    try:
        assert Session.objects.count() == 0  # reads still pass
        response = client.get("/healthz")
    finally:
        if connection.vendor == "sqlite":
            with connection.cursor() as cursor:
                cursor.execute("PRAGMA query_only = OFF")
    assert response.status_code == 503
    body = response.json()
    assert body["failed"] == ["database"] and body["checks"]["broker"] == "ok"
    assert ("read-only" in body["checks"]["database"]
            or "readonly" in body["checks"]["database"]), body


@pytest.mark.django_db
@pytest.mark.usefixtures("broker_up")
def test_healthz_leaves_no_row_and_no_queue_behind(client):
    import redis
    from django.contrib.sessions.models import Session

    keys_before = set(redis.Redis(db=0).keys("*healthz*"))
    assert client.get("/healthz").status_code == 200
    assert not Session.objects.filter(session_key__startswith="healthz-").exists()
    assert set(redis.Redis(db=0).keys("*healthz*")) == keys_before


@pytest.fixture
def read_only_redis(tmp_path):
    """A real Redis that answers PING but refuses every write: a read-only replica of a primary
    that is not there (as a failed-over or misconfigured broker is)."""
    import shutil
    import socket
    import time

    import redis

    if shutil.which("redis-server") is None:
        pytest.skip("no redis-server binary")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--dir", str(tmp_path),
                             "--replicaof", "127.0.0.1", "1", "--replica-read-only", "yes"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                redis.Redis(port=port).ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.django_db
def test_healthz_names_the_broker_when_it_answers_but_takes_no_message(client,
                                                                       read_only_redis):
    """A connection alone is not health: this broker connects and answers PING, yet no task
    could be queued on it."""
    from celery import current_app

    before = current_app.conf.broker_url
    current_app.conf.broker_url = read_only_redis
    try:
        response = client.get("/healthz")
    finally:
        current_app.conf.broker_url = before
    assert response.status_code == 503
    body = response.json()
    assert body["failed"] == ["broker"] and "read only replica" in body["checks"]["broker"], body


@pytest.mark.django_db(transaction=True)
def test_a_locked_postgresql_table_is_a_503_quickly_not_a_500(client, ingest_token):
    """Another session holds the runs table; ingest waits at most the lock timeout (0.5 s here)
    and answers 503 with Retry-After; nothing is stored."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's lock_timeout (the SQLite case runs against a live server)")
    import psycopg

    params = connection.get_connection_params()
    params.pop("options", None)
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    holder = psycopg.connect(**{k: v for k, v in params.items() if v is not None})
    try:
        holder.execute("LOCK TABLE runs_run IN ACCESS EXCLUSIVE MODE")
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = 500")
        response = client.post("/api/v1/events", data=(
            '{"events": [{"event_id": "h", "type": "heartbeat", "run_id": "r", "attempt": 0, '
            '"time": "2026-11-01T00:00:05Z", "update": 1}]}'), content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {ingest_token}")
    finally:
        holder.rollback()
        holder.close()
    assert response.status_code == 503, response.content
    assert response["Retry-After"] == "5"
    body = response.json()
    assert body["error"] == "database_unavailable"
    assert "LockNotAvailable" in body["errors"][0]["message"] or \
        "lock timeout" in body["errors"][0]["message"]


# --- admin ------------------------------------------------------------------------------------
@pytest.mark.django_db
def test_the_admin_has_memberships_webhooks_alerts_and_deliveries(admin_client):
    page = admin_client.get("/admin/").content.decode()
    for path in ("/admin/runs/membership/", "/admin/alerts/webhookendpoint/",
                 "/admin/alerts/alert/", "/admin/alerts/delivery/"):
        assert f'href="{path}"' in page, path
        assert admin_client.get(path).status_code == 200
        assert admin_client.get(path + "add/").status_code == 200


@pytest.mark.django_db
def test_the_admin_refuses_a_webhook_url_the_guard_refuses(admin_client, project, settings):
    settings.RECOVERYDASH_WEBHOOK_ALLOW_PRIVATE = False
    response = admin_client.post("/admin/alerts/webhookendpoint/add/", {
        "project": project.pk, "url": "http://[::ffff:127.0.0.1]:8000/x", "kind": "standard",
        "min_severity": "info", "enabled": "on"})
    assert response.status_code == 200
    assert "an IPv4-mapped form of 127.0.0.1, a loopback address" in response.content.decode()
    from recoverydash.alerts.models import WebhookEndpoint

    assert not WebhookEndpoint.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("broker_up")
def test_the_compose_health_check_passes_with_production_allowed_hosts(live_server, settings):
    """The web container's health check speaks to 127.0.0.1, which ALLOWED_HOSTS does not list in
    production: it sends the first allowed name as Host (before: a 400, the container unhealthy)."""
    import yaml

    settings.ALLOWED_HOSTS = ["recoverydash.example.org"]
    test = yaml.safe_load((REPO / "docker-compose.yml").read_text())[
        "services"]["web"]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"]
    port = live_server.url.rsplit(":", 1)[1]
    code = test[3].replace("127.0.0.1:8000", f"127.0.0.1:{port}")
    env = {"PATH": os.environ["PATH"], "ALLOWED_HOSTS": "recoverydash.example.org,other.org"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, timeout=60)
    import httpx

    assert result.returncode == 0, (result.stderr[-300:], httpx.get(
        live_server.url + "/healthz", headers={"Host": "recoverydash.example.org"}).text)
    plain = subprocess.run([sys.executable, "-c", code.replace("headers={'Host': h}", "")],
                           env=env, capture_output=True, text=True, timeout=60)
    assert plain.returncode != 0 and "400" in plain.stderr
