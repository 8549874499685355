"""The one error hierarchy of the v1 API, and the one place it turns into JSON
(docs/ingest-v1.md#errors).

Every refusal the API makes is an :class:`ApiError` subclass with an HTTP status and a short
machine code. :func:`error_response` renders any of them into the wire contract's shape::

    {"error": "<code>", "errors": [{"index": int | null, "path": str, "message": str}, ...]}

``errors`` holds at most :data:`MAX_ERRORS` items ("at most 100 errors"). ``index`` is the
position of the offending event in the batch (null when the problem is the request as a whole),
``path`` uses the wire's field names and indexes (``events[3].spans[0].ranges[1]``), and every
``message`` says what was expected and what came. A 409 names the index of the conflicting event
both in ``errors[0]`` and at the top level (``"index"``). A 429 carries a ``Retry-After`` header.

:func:`install` registers the handlers on a NinjaAPI so that views and auth callbacks only raise.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest, HttpResponse

log = logging.getLogger(__name__)

MAX_ERRORS = 100


@dataclass(frozen=True)
class ErrorItem:
    """One problem: where (``index`` of the event, wire ``path``) and what (``message``)."""

    index: int | None
    path: str
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"index": self.index, "path": self.path, "message": self.message}


class ApiError(Exception):
    """Base of every refusal. ``status`` is the HTTP status, ``code`` the machine-readable word."""

    status = 400
    code = "bad_request"

    def __init__(self, message: str = "", items: Iterable[ErrorItem] = (),
                 headers: dict[str, str] | None = None):
        super().__init__(message or self.code)
        self.message = message or self.code
        self.items = list(items) or [ErrorItem(None, "", self.message)]
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": self.code,
                "errors": [item.as_dict() for item in self.items[:MAX_ERRORS]]}


class BadRequest(ApiError):
    """400: the body is not JSON, gzip that does not inflate, or events that break docs/ingest-v1.md
    sections 2-4."""

    status = 400
    code = "invalid"


class Unauthorized(ApiError):
    """401: no bearer token, or one that is unknown or revoked."""

    status = 401
    code = "unauthorized"

    def __init__(self, message: str = "a valid bearer token is required"):
        super().__init__(message, headers={"WWW-Authenticate": 'Bearer realm="recoverydash"'})


class Forbidden(ApiError):
    """403: the token is valid but lacks the scope the endpoint needs."""

    status = 403
    code = "forbidden"


class NotFound(ApiError):
    """404: no such object in the token's project (other projects' runs are invisible)."""

    status = 404
    code = "not_found"


class Conflict(ApiError):
    """409: an ``event_id`` already stored for the run (or earlier in the batch) with different
    content. ``index`` is the position of the offending event in the batch."""

    status = 409
    code = "event_conflict"

    def __init__(self, index: int, message: str):
        super().__init__(message, [ErrorItem(index, f"events[{index}]", message)])
        self.index = index

    def body(self) -> dict[str, Any]:
        return {**super().body(), "index": self.index}


class AttemptConflict(Conflict):
    """409: an ``attempt_started`` for an attempt that already started with other values
    (world size, dataset, batch sizes, config digest, what it resumed from): a relaunch that
    reused the attempt number. Another rank's report of the same values is no conflict."""

    code = "attempt_conflict"


class PayloadTooLarge(ApiError):
    """413: over the events-per-request or decoded-body-bytes limit (settings)."""

    status = 413
    code = "too_large"


class UnsupportedMediaType(ApiError):
    """415: a content type other than JSON, or a content encoding other than gzip/identity."""

    status = 415
    code = "unsupported_media_type"


class RateLimited(ApiError):
    """429: the token's bucket is empty; ``retry_after`` (seconds, rounded up) goes out as the
    ``Retry-After`` header."""

    status = 429
    code = "rate_limited"

    def __init__(self, retry_after: float):
        seconds = max(1, math.ceil(retry_after))
        super().__init__(f"rate limit exceeded for this token: retry after {seconds} s",
                         headers={"Retry-After": str(seconds)})
        self.retry_after = seconds


class AnalysisUnavailable(ApiError):
    """503: the run's analysis cannot be brought up to date (the core refused its inputs); the
    message says why. Retrying helps only after new events change the run."""

    status = 503
    code = "analysis_failed"


class DatabaseUnavailable(ApiError):
    """503: the database does not answer in time (locked, full, unreachable); nothing was
    stored, and the same request may be sent again after ``Retry-After`` seconds."""

    status = 503
    code = "database_unavailable"

    def __init__(self, cause: BaseException, retry_after: int = 5):
        detail = f"{type(cause).__name__}: {str(cause).strip()[:200]}"
        super().__init__(f"the database is unavailable (locked, full or unreachable): {detail}; "
                         f"nothing was stored, retry in {retry_after} s",
                         headers={"Retry-After": str(retry_after)})


def error_response(exc: ApiError) -> HttpResponse:
    """Render an :class:`ApiError` as the JSON response of docs/ingest-v1.md#errors with its
    headers."""
    response = HttpResponse(json.dumps(exc.body()), status=exc.status,
                            content_type="application/json")
    for name, value in exc.headers.items():
        response[name] = value
    return response


def install(api) -> None:
    """Register the handlers on ``api`` (a NinjaAPI): ApiError, ninja's own validation and
    authentication errors, a database that does not answer (503 ``database_unavailable`` with
    ``Retry-After``), and a last-resort handler so that no request gets a bare 500 page."""
    from django.db import InterfaceError, OperationalError
    from ninja.errors import AuthenticationError, HttpError
    from ninja.errors import ValidationError as NinjaValidationError

    def on_api_error(request: HttpRequest, exc: ApiError) -> HttpResponse:
        return error_response(exc)

    def on_ninja_validation(request: HttpRequest, exc: NinjaValidationError) -> HttpResponse:
        items = []
        for err in exc.errors[:MAX_ERRORS]:
            where = err.get("loc", ())
            loc = [p for p in where if p not in ("query", "path", "body")]
            received = err.get("input", _MISSING)
            if (received is _MISSING or received is None) and loc and "query" in where:
                # ninja does not pass the raw query value on: read it from the request
                received = request.GET.get(str(loc[-1]), _MISSING)
            items.append(ErrorItem(None, ".".join(str(p) for p in loc),
                                   f"{err.get('msg', 'invalid')}, got {short(received)}"))
        return error_response(BadRequest("invalid request parameters", items))

    def on_auth_error(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
        return error_response(Unauthorized())

    def on_http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
        err = ApiError(str(exc))
        err.status, err.code = exc.status_code, "error"
        return error_response(err)

    def on_database_unavailable(request: HttpRequest, exc: Exception) -> HttpResponse:
        log.warning("database unavailable in %s %s: %s", request.method, request.path, exc)
        return error_response(DatabaseUnavailable(exc))

    def on_unexpected(request: HttpRequest, exc: Exception) -> HttpResponse:
        log.exception("unexpected error in %s %s", request.method, request.path)
        err = ApiError("internal error; it has been logged")
        err.status, err.code = 500, "internal"
        return error_response(err)

    api.add_exception_handler(ApiError, on_api_error)
    api.add_exception_handler(NinjaValidationError, on_ninja_validation)
    api.add_exception_handler(AuthenticationError, on_auth_error)
    api.add_exception_handler(HttpError, on_http_error)
    api.add_exception_handler(OperationalError, on_database_unavailable)
    api.add_exception_handler(InterfaceError, on_database_unavailable)
    api.add_exception_handler(Exception, on_unexpected)


def short(value: Any, limit: int = 80) -> str:
    """A short JSON rendering of a received value for error messages (``nothing`` if absent)."""
    if value is _MISSING:
        return "nothing"
    try:
        text = json.dumps(value, ensure_ascii=True, default=repr)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_MISSING = object()
