"""``/healthz`` for load balancers and compose health checks, and the answer when the database
does not (locked, full, unreachable): a 503 that says so, quickly, instead of a 500.

``healthz`` checks each dependency the service cannot work without and answers 200
``{"ok": true, "checks": {"database": "ok", "broker": "ok"}}``, or 503 with ``ok`` false, the
``failed`` names and what each check saw. Each check proves what the service needs, not that a
port answers: the database check writes a row and rolls it back (a read-only database, a full
disk or a SQLite file another process has locked fails it, as they would fail ingest), and on
SQLite looks at the free space beside the file; the broker check puts a message on a queue of
its own and reads it back. Each check waits at most ``HEALTH_TIMEOUT_S``
(docs/operating.md#health-checks says what each means).

``server_error`` is the project's ``handler500``: an unexpected error that is a database being
unavailable (``OperationalError``, ``InterfaceError``) becomes a 503 with ``Retry-After``, in JSON
under ``/api/`` and as a page elsewhere; any other error stays a 500.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import uuid

from django.db import InterfaceError, OperationalError, connection, transaction
from django.http import HttpResponse, JsonResponse
from django.template import loader

log = logging.getLogger(__name__)

HEALTH_TIMEOUT_S = 2.0
#: Below this much free space on a SQLite database's disk the database check fails.
MIN_FREE_BYTES = 16 * 1024 * 1024
RETRY_AFTER_S = 5
UNAVAILABLE = (OperationalError, InterfaceError)


#: The row the database check writes and rolls back (``django_session``: a table every
#: deployment has, whose key holds a probe's name; nobody ever sees the row).
PROBE_PREFIX = "healthz-"


def check_database() -> str:
    """``"ok"`` when the database takes a write, or what is wrong: the server does not answer,
    refuses writes (a read-only database or replica, a full disk), or holds its write lock
    past the timeout (a SQLite file another process has locked); on SQLite also a (nearly) full
    disk beside the file. The write is real and thrown away: one row inserted into
    ``django_session`` inside a transaction (a savepoint when one is open) that is rolled back,
    so a read-only server fails the check exactly as ingest would fail its writes."""
    try:
        if connection.vendor == "sqlite":
            path = str(connection.settings_dict["NAME"])
            if os.path.isabs(path):
                free = shutil.disk_usage(os.path.dirname(path)).free
                if free < MIN_FREE_BYTES:
                    return f"disk full: {free:,} bytes free beside {os.path.basename(path)}"
        _write_and_roll_back()
    except Exception as exc:  # noqa: BLE001 - any database error means not ready
        return f"{type(exc).__name__}: {str(exc).strip()[:200]}"
    return "ok"


def _write_and_roll_back() -> None:
    """Insert a probe row within ``HEALTH_TIMEOUT_S`` and roll it back (raises what the
    database raised)."""
    from django.contrib.sessions.models import Session
    from django.utils import timezone

    sqlite = connection.vendor == "sqlite"
    with connection.cursor() as cursor:
        if sqlite:
            cursor.execute(f"PRAGMA busy_timeout = {int(HEALTH_TIMEOUT_S * 1000)}")
    try:
        with transaction.atomic():
            if not sqlite:
                with connection.cursor() as cursor:
                    cursor.execute(f"SET LOCAL statement_timeout = {int(HEALTH_TIMEOUT_S * 1000)}")
            Session.objects.create(session_key=PROBE_PREFIX + uuid.uuid4().hex,
                                   session_data="", expire_date=timezone.now())
            transaction.set_rollback(True)
    finally:
        if sqlite:
            timeout = connection.settings_dict["OPTIONS"].get("timeout", 5)
            with connection.cursor() as cursor:
                cursor.execute(f"PRAGMA busy_timeout = {int(float(timeout) * 1000)}")


def check_broker() -> str:
    """``"ok"`` when a message goes through the Celery broker and comes back within the
    timeout: a queue of its own (``recoverydash.healthz.<random>``) is declared, one message put
    and read back (its random body compared), and the queue deleted. Else why not: the broker
    does not answer, refuses the write (Redis out of memory or read-only), or the message did not
    come back."""
    from celery import current_app

    probe = uuid.uuid4().hex
    try:
        with current_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0,
                                   timeout=HEALTH_TIMEOUT_S)
            queue = conn.SimpleQueue(f"recoverydash.healthz.{probe}", serializer="json")
            try:
                queue.put({"probe": probe})
                message = queue.get(block=True, timeout=HEALTH_TIMEOUT_S)
                message.ack()
            finally:
                try:
                    queue.queue.delete()
                finally:
                    queue.close()
    except Exception as exc:  # noqa: BLE001 - kombu raises many types (Empty: no message back)
        return f"{type(exc).__name__}: {str(exc).strip()[:200] or 'no answer in time'}"
    if message.payload != {"probe": probe}:
        return f"the broker gave back another message than the one put: {message.payload!r:.200}"
    return "ok"


def healthz(request):
    """200 when the database and the broker answer, 503 naming the one(s) that do not."""
    checks = {"database": check_database(), "broker": check_broker()}
    failed = [name for name, result in checks.items() if result != "ok"]
    if failed:
        log.warning("healthz: %s", "; ".join(f"{n}: {checks[n]}" for n in failed))
        return JsonResponse({"ok": False, "failed": failed, "checks": checks}, status=503)
    return JsonResponse({"ok": True, "checks": checks})


def unavailable_response(request, exc: BaseException) -> HttpResponse:
    """The 503 for a database that does not answer: JSON in the API's error shape under
    ``/api/``, a page elsewhere; ``Retry-After`` in both."""
    detail = f"{type(exc).__name__}: {str(exc).strip()[:200]}"
    message = (f"the database is unavailable (locked, full or unreachable): {detail}; "
               f"retry in {RETRY_AFTER_S} s")
    if request.path.startswith("/api/"):
        response = JsonResponse({"error": "database_unavailable", "errors": [
            {"index": None, "path": "", "message": message}]}, status=503)
    else:
        response = HttpResponse(loader.render_to_string("503.html", {"message": message}),
                                status=503)
    response["Retry-After"] = str(RETRY_AFTER_S)
    return response


def server_error(request):
    """handler500: a 503 when the error is the database being unavailable, else a 500."""
    exc = sys.exc_info()[1]
    if isinstance(exc, UNAVAILABLE):
        return unavailable_response(request, exc)
    if request.path.startswith("/api/"):
        return JsonResponse({"error": "internal", "errors": [
            {"index": None, "path": "", "message": "internal error; it has been logged"}]},
            status=500)
    return HttpResponse(loader.render_to_string("500.html"), status=500)


def not_found(request, exception=None):
    """handler404: under ``/api/`` a JSON 404 in the API's error shape, naming the path that no
    route matches (a name with a character a route refuses, e.g. a newline, lands here); else
    Django's page."""
    if request.path.startswith("/api/"):
        return JsonResponse({"error": "not_found", "errors": [
            {"index": None, "path": "", "message": f"no API route matches {request.path!r}: "
                                                   "see /api/v1/openapi.json for the routes"}]},
            status=404)
    from django.views.defaults import page_not_found

    return page_not_found(request, exception)
