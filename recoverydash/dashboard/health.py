"""``/healthz`` for load balancers and compose health checks, and the answer when the database
does not (locked, full, unreachable): a 503 that says so, quickly, instead of a 500.

``healthz`` checks each dependency the service cannot work without and answers 200
``{"ok": true, "checks": {"database": "ok", "broker": "ok"}}``, or 503 with ``ok`` false, the
``failed`` names and what each check saw. The database check takes the write lock and gives it
back (a SQLite file another process holds is locked for writes while reads still pass) and, on
SQLite, looks at the free space of the database's disk; the broker check opens a connection to
the Celery broker. Each check waits at most ``HEALTH_TIMEOUT_S``.

``server_error`` is the project's ``handler500``: an unexpected error that is a database being
unavailable (``OperationalError``, ``InterfaceError``) becomes a 503 with ``Retry-After``, in JSON
under ``/api/`` and as a page elsewhere; any other error stays a 500.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection
from django.http import HttpResponse, JsonResponse
from django.template import loader

log = logging.getLogger(__name__)

HEALTH_TIMEOUT_S = 2.0
#: Below this much free space on a SQLite database's disk the database check fails.
MIN_FREE_BYTES = 16 * 1024 * 1024
RETRY_AFTER_S = 5
UNAVAILABLE = (OperationalError, InterfaceError)


def check_database() -> str:
    """``"ok"``, or what is wrong: the write lock could not be taken within the timeout (locked),
    the disk is (nearly) full, or the server does not answer."""
    try:
        with connection.cursor() as cursor:
            if connection.vendor == "sqlite":
                path = str(connection.settings_dict["NAME"])
                if os.path.isabs(path):
                    free = shutil.disk_usage(os.path.dirname(path)).free
                    if free < MIN_FREE_BYTES:
                        return f"disk full: {free:,} bytes free beside {os.path.basename(path)}"
                cursor.execute(f"PRAGMA busy_timeout = {int(HEALTH_TIMEOUT_S * 1000)}")
                try:
                    if connection.in_atomic_block:
                        cursor.execute("SELECT 1")
                    else:
                        cursor.execute("BEGIN IMMEDIATE")  # the write lock, given back at once
                        cursor.execute("ROLLBACK")
                finally:
                    timeout = connection.settings_dict["OPTIONS"].get("timeout", 5)
                    cursor.execute(f"PRAGMA busy_timeout = {int(float(timeout) * 1000)}")
            else:
                cursor.execute(f"SET statement_timeout = {int(HEALTH_TIMEOUT_S * 1000)}")
                try:
                    cursor.execute("SELECT 1")
                finally:
                    cursor.execute("SET statement_timeout = DEFAULT")
    except Exception as exc:  # noqa: BLE001 - any database error means not ready
        return f"{type(exc).__name__}: {str(exc).strip()[:200]}"
    return "ok"


def check_broker() -> str:
    """``"ok"`` when a connection to the Celery broker opens within the timeout, else why not."""
    from celery import current_app

    try:
        with current_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0,
                                   timeout=HEALTH_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - kombu raises many types
        return f"{type(exc).__name__}: {str(exc).strip()[:200]}"
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
