"""Refuse, before any view runs, a request whose URL carries text no database column can hold.

PostgreSQL's text type cannot store a NUL character, and psycopg refuses to send one: a path
segment or query value holding ``%00`` (a run id, a generation id, an endpoint name, a filter)
reached the database as a lookup and answered 500. Every such request is answered 400 here
instead: on the API (``/api/``, ``/metrics``) in the shape of docs/ingest-v1.md#errors with the
offending part named, elsewhere as a plain 400. Bodies are the views' own concern (ingest's
schemas, the admin API's checks, Django forms refuse NUL characters).
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest

from .errors import BadRequest, ErrorItem, error_response


def _unstorable(text: str) -> bool:
    if "\x00" in text:
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        return True
    return False


def unstorable_part(request: HttpRequest) -> str | None:
    """``"path"`` or ``"query.<name>"`` of the first part of the request's URL holding a NUL
    character or a lone surrogate, or None."""
    if _unstorable(request.path):
        return "path"
    for key, values in request.GET.lists():
        if _unstorable(key) or any(_unstorable(v) for v in values):
            return f"query.{key}" if not _unstorable(key) else "query"
    return None


class UnstorableTextMiddleware:
    """Answer 400 to a URL holding a NUL character or a lone surrogate (see the module)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        part = unstorable_part(request)
        if part is None:
            return self.get_response(request)
        message = (f"expected a URL without NUL characters or lone surrogates, got one in "
                   f"{part}")
        if request.path.startswith(("/api/", "/metrics")):
            return error_response(BadRequest("unstorable text",
                                             [ErrorItem(None, part, message)]))
        return HttpResponseBadRequest(message, content_type="text/plain; charset=utf-8")


__all__ = ["UnstorableTextMiddleware", "unstorable_part"]
