"""The SDK's transport: one gzipped batch POSTed to ``{url}/api/v1/events``, and when the sender
may send again (after sentry-python's ``HttpTransport`` and its rate limits).

``post_gzip`` sends one body with ``Authorization: Bearer <token>`` and reads at most
``max_bytes`` of the answer; it never raises (a network error is an ``Answer`` without a status).
``Backoff`` keeps the pause the answers call for:

- 5xx, 408, 429 and network errors: a capped exponential backoff with jitter
  (``backoff_base * 2**k``, at most ``backoff_cap`` seconds, times uniform(0.5, 1)), or the
  server's ``Retry-After`` (delta-seconds or an HTTP date, at most ``max_retry_after``);
- 401 and 403 (an unknown, mistyped or revoked token; a token without the ``ingest`` scope) and
  404 (the URL leads to no recoverydash API: a typo in it): the *setup* is refused, not the
  events, so nothing is set aside: sending pauses for ``auth_retry_s`` seconds (default 60) and
  tries again, and the owner logs the refusal as an error each time it is answered
  (``refused``: the status while it lasts);
- a 2xx ends any pause.

``api_base`` makes the one base URL every request of the SDK starts from, so a URL given with
``/api/v1`` at its end (what the API's own pages show) is understood.

Only the standard library is used (``urllib``).
"""

from __future__ import annotations

import logging
import random
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime

from recoverydash.sdk.guard import Once

#: The SDK's own random source for jitter and back-off: the trainer's seeded global ``random``
#: is never drawn from (a draw at the sender's times would change a seeded run's sequence).
JITTER = random.Random()

RETRYABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
#: The setup is refused, not the events: 401 (no, unknown or revoked token), 403 (a token
#: without the scope), 404 (no recoverydash ingest API at the URL).
SETUP_REFUSED_STATUSES = frozenset({401, 403, 404})
#: The most of one answer to a batch that is read: the server's are a few hundred bytes (at
#: most 100 errors); anything answering without end at the configured URL is cut there instead
#: of growing in the training process.
MAX_ANSWER_BYTES = 1024 * 1024
#: The path of the API under the server's base URL (docs/ingest-v1.md).
API_PREFIX = "/api/v1"


def api_base(url: str | None) -> str:
    """The server's base URL from what a trainer gave: blanks and trailing slashes removed, and a
    trailing ``/api/v1`` (or ``/api/v1/events``, the endpoint itself) taken off, so that
    ``https://rd.example/api/v1/`` and ``https://rd.example`` name the same server. ``""`` for
    None or an empty string (sending is off)."""
    base = (url or "").strip().rstrip("/")
    for tail in (API_PREFIX + "/events", API_PREFIX):
        if base.lower().endswith(tail):
            base = base[:-len(tail)].rstrip("/")
            break
    return base


def api_url(url: str | None, path: str) -> str:
    """``{api_base(url)}/api/v1/{path}`` (``path`` without its leading slash)."""
    return f"{api_base(url)}{API_PREFIX}/{path.lstrip('/')}"


def retry_after_seconds(value: str | None, cap: float) -> float | None:
    """Seconds from a ``Retry-After`` header (delta-seconds or HTTP-date), at most ``cap``;
    None when absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, min(cap, float(value)))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
        return max(0.0, min(cap, when.timestamp() - time.time()))
    except (TypeError, ValueError, IndexError):
        return None


def body_text(payload: bytes | None, limit: int = 500) -> str:
    """The start of an answer's body as text for a log line or a warning; an HTML page (a web
    server's error page at a wrong URL) is named by its size instead of quoted."""
    payload = payload or b""
    if payload.lstrip()[:15].lower().startswith((b"<!doctype html", b"<html")):
        return f"(an HTML page of {len(payload)} bytes: not the recoverydash API)"
    return payload[:limit].decode("utf-8", "replace")


@dataclass(frozen=True)
class Answer:
    """The server's answer to one POST: ``status`` (None: no answer, ``error`` says why), its
    headers and at most ``MAX_ANSWER_BYTES`` of its body."""

    status: int | None
    headers: dict[str, str] = field(default_factory=dict)
    payload: bytes = b""
    error: Exception | None = None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    @property
    def retryable(self) -> bool:
        """No answer, or a status worth trying again later (5xx, 408, 429)."""
        return self.status is None or self.status in RETRYABLE_STATUSES

    @property
    def setup_refused(self) -> bool:
        """The token (401, 403) or the URL (404) is refused: the events are not at fault."""
        return self.status in SETUP_REFUSED_STATUSES

    def detail(self, limit: int = 500) -> str:
        """The start of the body as text, for a log line; an HTML page (what answers at a wrong
        URL) is named, not quoted."""
        return body_text(self.payload, limit)


def post_gzip(endpoint: str, token: str, body: bytes, timeout: float, user_agent: str,
              max_bytes: int = MAX_ANSWER_BYTES) -> Answer:
    """POST one gzipped batch body (``{"events": [...]}``) to ``endpoint``, within ``timeout``
    seconds per socket operation. An HTTP error status is answered like a success; a network
    error (URLError, timeouts, resets, DNS, SSL) is an ``Answer`` with status None. Never
    raises. The client's sender, ``send_spool`` and ``resend`` all send through it."""
    req = urllib.request.Request(endpoint, data=body, method="POST", headers={
        "Content-Type": "application/json", "Content-Encoding": "gzip",
        "Authorization": f"Bearer {token}", "User-Agent": user_agent})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return Answer(resp.status, dict(resp.headers), resp.read(max_bytes))
    except urllib.error.HTTPError as e:
        try:
            payload = e.read(max_bytes)
        except Exception:  # noqa: BLE001 - the status is the answer then
            payload = b""
        return Answer(e.code, dict(e.headers or {}), payload)
    except Exception as e:  # noqa: BLE001 - URLError, timeouts, resets, DNS, SSL
        return Answer(None, {}, b"", e)


class Backoff:
    """When the sender may send again. ``paused()`` is true until ``paused_until``
    (``time.monotonic()``); ``refused`` is the status of a refused setup (401, 403: the token;
    404: the URL) while that pause lasts, else None. Times in seconds."""

    def __init__(self, base: float, cap: float, max_retry_after: float,
                 auth_retry_s: float) -> None:
        self.base = base
        self.cap = cap
        self.max_retry_after = max_retry_after
        self.auth_retry_s = auth_retry_s
        self.failures = 0          # consecutive retryable failures (the backoff exponent)
        self.paused_until = 0.0
        self.refused: int | None = None

    def paused(self) -> bool:
        return time.monotonic() < self.paused_until

    def after(self, answer: Answer) -> float:
        """Record ``answer``; returns the pause it starts (0.0 for none): a 2xx ends every
        pause, a refused setup (token, URL) pauses ``auth_retry_s``, a retryable answer backs
        off. Other answers (a batch refused for good) leave the backoff as it is and reset its
        exponent."""
        if answer.ok:
            self.failures, self.paused_until, self.refused = 0, 0.0, None
            return 0.0
        if answer.setup_refused:
            self.refused = answer.status
            self.paused_until = time.monotonic() + self.auth_retry_s
            return self.auth_retry_s
        if not answer.retryable:
            self.failures = 0
            return 0.0
        self.failures += 1
        pause = min(self.cap, self.base * 2 ** (self.failures - 1)) * JITTER.uniform(0.5, 1.0)
        ra = retry_after_seconds(answer.headers.get("Retry-After"), self.max_retry_after)
        if ra is not None:
            pause = ra
        self.paused_until = time.monotonic() + pause
        return pause

    def resume(self) -> None:
        """End the pause now (the server answers: the backoff is for outages)."""
        self.paused_until, self.failures = 0.0, 0


class HttpTransport:
    """Sends gzipped batches of one run to ``{api_base(url)}/api/v1/events`` with ``token``
    (each socket operation within ``request_timeout`` seconds) and keeps the ``Backoff`` their
    answers call for. A network error is logged once per exception type."""

    def __init__(self, url: str | None, token: str | None, *, user_agent: str,
                 request_timeout: float, backoff: Backoff, once: Once) -> None:
        self.base = api_base(url)
        self.endpoint = api_url(self.base, "events") if self.base else ""
        self.token = token or ""
        self.user_agent = user_agent
        self.request_timeout = request_timeout
        self.backoff = backoff
        self._once = once

    def post(self, body: bytes, timeout: float | None = None) -> Answer:
        """POST ``body`` (at most ``timeout`` seconds per socket operation, default
        ``request_timeout``); the caller records the answer in ``backoff``. Never raises."""
        answer = post_gzip(self.endpoint, self.token, body,
                           self.request_timeout if timeout is None else timeout, self.user_agent)
        if answer.error is not None:
            self._once(("net", type(answer.error)), logging.WARNING,
                       "recoverydash: cannot reach %s: %r (events are spooled)", self.endpoint,
                       answer.error)
        return answer


__all__ = ["API_PREFIX", "JITTER", "MAX_ANSWER_BYTES", "RETRYABLE_STATUSES",
           "SETUP_REFUSED_STATUSES", "Answer", "Backoff", "HttpTransport", "api_base", "api_url",
           "body_text", "post_gzip", "retry_after_seconds"]
