"""Bearer-token authentication, scope checks and the per-token rate limit
(docs/ingest-v1.md#authentication, #limits).

For API endpoints (django-ninja), pass the ready-made auth objects::

    from recoverydash.ingest.auth import read_auth, run_for

    @api.get("/runs/{run_id}/recovery", auth=read_auth)
    def recovery(request, run_id: str):
        run = run_for(request.auth, run_id)   # 404 for unknown runs and other projects' runs
        ...

``request.auth`` is then the :class:`~recoverydash.runs.models.ApiToken` (``.project`` is its
project). For a plain Django view, call ``token = require_token(request, "read")`` or decorate it
with ``@token_required("read")``; either raises or answers 401 (no, unknown or revoked token), 403
(token without the scope) or 429 (rate limit, with ``Retry-After``) in the shape of
docs/ingest-v1.md#errors.

Rate limit: a token bucket per token, ``RECOVERYDASH_RATE_LIMIT_PER_SECOND`` tokens per second
up to ``RECOVERYDASH_RATE_LIMIT_BURST``; shared through Redis when ``RECOVERYDASH_REDIS_URL`` is
set (one Lua script, atomic across web processes), else kept per process. A Redis that does not
answer lets requests through (logged): an outage of the limiter must not stop ingest.

Token look-ups are reused for ``RECOVERYDASH_TOKEN_CACHE_S`` seconds (default 5) per web
process (:func:`live_token`): one query fewer per request; a revoked token is refused by every
process within that time, at once by the process that revoked it.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.db.models.signals import post_delete, post_save
from django.http import HttpRequest
from ninja.security import HttpBearer

from recoverydash.runs.models import SCOPE_INGEST, SCOPE_READ, ApiToken, Run, hash_token

from .errors import ApiError, Forbidden, NotFound, RateLimited, Unauthorized, error_response

log = logging.getLogger(__name__)


def bearer_value(request: HttpRequest) -> str | None:
    """The raw token of an ``Authorization: Bearer <token>`` header, or None."""
    header = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def require_token(request: HttpRequest, scope: str) -> ApiToken:
    """Authenticate the request's bearer token and check ``scope`` and the rate limit.

    Returns the live :class:`ApiToken`. Raises Unauthorized (401), Forbidden (403) or
    RateLimited (429)."""
    raw = bearer_value(request)
    token = live_token(raw) if raw else None
    if token is None:
        raise Unauthorized("expected Authorization: Bearer <token> with a live token, got "
                           + ("an unknown or revoked token" if raw else "no bearer token"))
    if not token.has_scope(scope):
        raise Forbidden(f"expected a token with scope {scope!r}, got scopes "
                        f"{sorted(token.scopes or [])}")
    limiter().check(token)
    token.touch()
    return token


# --- token look-up cache ------------------------------------------------------------------------
#: hash of a raw token -> (time.monotonic() of the look-up, the live token). Live tokens only: an
#: unknown or revoked one is looked up every time (a new token works at once).
_tokens: dict[str, tuple[float, ApiToken]] = {}
_tokens_lock = threading.Lock()
#: Raised by every :func:`forget_tokens`: a look-up that began before a revoke in this process
#: must not put the token it read (live then) back into the emptied cache.
_tokens_epoch = [0]
#: Entries kept at most (a process serves a few projects' tokens; past this the cache restarts).
TOKEN_CACHE_SIZE = 1024


def live_token(raw: str) -> ApiToken | None:
    """:meth:`ApiToken.authenticate`, reusing a live token this process looked up less than
    ``RECOVERYDASH_TOKEN_CACHE_S`` seconds ago (default 5; 0 looks every request up). So a
    token revoked elsewhere (another web process, the dashboard's queryset update) is refused
    within that many seconds; a revoke or delete in this process (``ApiToken.save``/``delete``,
    cascades included) empties the cache at once (:func:`forget_tokens`). Returns the token or
    None (unknown, revoked, or longer than 200 characters)."""
    ttl = settings.RECOVERYDASH_TOKEN_CACHE_S
    if ttl <= 0 or not raw or len(raw) > 200:
        return ApiToken.authenticate(raw)
    key = hash_token(raw)
    now = time.monotonic()
    hit = _tokens.get(key)
    if hit is not None and now - hit[0] < ttl:
        return hit[1]
    epoch = _tokens_epoch[0]
    token = ApiToken.authenticate(raw)
    with _tokens_lock:
        if token is None:
            _tokens.pop(key, None)
        elif epoch != _tokens_epoch[0]:
            pass  # revoked (or edited) in this process meanwhile: not cached
        else:
            if len(_tokens) >= TOKEN_CACHE_SIZE:
                _tokens.clear()
            _tokens[key] = (now, token)
    return token


def forget_tokens(**_: Any) -> None:
    """Empty this process's token cache (connected to ApiToken's post_save and post_delete;
    called by writers that bypass them, such as a queryset ``update`` revoking tokens)."""
    with _tokens_lock:
        _tokens_epoch[0] += 1
        _tokens.clear()


post_save.connect(forget_tokens, sender=ApiToken, dispatch_uid="recoverydash-token-cache-save")
post_delete.connect(forget_tokens, sender=ApiToken,
                    dispatch_uid="recoverydash-token-cache-delete")


class TokenAuth(HttpBearer):
    """django-ninja auth for one scope: ``auth=TokenAuth("read")``; ``request.auth`` is the
    :class:`ApiToken`. Errors go through the API's one error handler (docs/ingest-v1.md#errors)."""

    def __init__(self, scope: str):
        super().__init__()
        self.scope = scope

    def __call__(self, request: HttpRequest) -> ApiToken:
        return require_token(request, self.scope)

    def authenticate(self, request: HttpRequest, token: str) -> Any:  # pragma: no cover
        return require_token(request, self.scope)


ingest_auth = TokenAuth(SCOPE_INGEST)
read_auth = TokenAuth(SCOPE_READ)


def token_required(scope: str) -> Callable:
    """Decorator for plain Django views: sets ``request.auth`` to the token, or answers
    401/403/429 in the shape of docs/ingest-v1.md#errors."""

    def decorate(view: Callable) -> Callable:
        @functools.wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any):
            try:
                request.auth = require_token(request, scope)
            except ApiError as exc:
                return error_response(exc)
            return view(request, *args, **kwargs)

        return wrapped

    return decorate


def run_for(token: ApiToken, run_id: str) -> Run:
    """The token's project's run named ``run_id``; NotFound (404) otherwise, also for a run of
    another project (invisible: docs/ingest-v1.md#authentication)."""
    run = Run.objects.filter(project_id=token.project_id, run_id=run_id).first()
    if run is None:
        raise NotFound(f"expected a run of this project, got unknown run_id {run_id!r}")
    return run


# --- rate limit ----------------------------------------------------------------------------------
_LUA_BUCKET = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1])
local at = tonumber(state[2])
if tokens == nil then tokens = burst; at = now end
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
local wait = 0
if tokens >= 1 then tokens = tokens - 1 else wait = (1 - tokens) / rate end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('EXPIRE', KEYS[1], math.ceil(burst / rate) + 60)
return tostring(wait)
"""


class RateLimiter:
    """Token bucket per API token. :meth:`check` raises RateLimited with the seconds to wait."""

    def __init__(self, rate: float, burst: int, redis_url: str = ""):
        self.rate, self.burst, self.redis_url = rate, burst, redis_url
        self._local: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()
        self._script = None
        if redis_url:
            import redis

            client = redis.Redis.from_url(redis_url, socket_timeout=0.5,
                                          socket_connect_timeout=0.5)
            self._script = client.register_script(_LUA_BUCKET)

    def key(self, token: ApiToken) -> str:
        return f"recoverydash:ratelimit:{token.token_hash[:32]}"

    def check(self, token: ApiToken) -> None:
        """Take one request from the token's bucket; raise RateLimited if it is empty."""
        if self.rate <= 0:
            return
        wait = self._take_redis(token) if self._script is not None else self._take_local(token)
        if wait > 0:
            raise RateLimited(wait)

    def _take_redis(self, token: ApiToken) -> float:
        try:
            return float(self._script(keys=[self.key(token)], args=[self.rate, self.burst]))
        except Exception:  # noqa: BLE001 - fail open: the limiter must not take ingest down
            log.warning("rate limiter: Redis unavailable, request let through", exc_info=True)
            return 0.0

    def _take_local(self, token: ApiToken) -> float:
        now = time.monotonic()
        with self._lock:
            tokens, at = self._local.get(token.token_hash, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.rate)
            if tokens >= 1:
                self._local[token.token_hash] = (tokens - 1, now)
                return 0.0
            self._local[token.token_hash] = (tokens, now)
            return (1 - tokens) / self.rate


_limiter: RateLimiter | None = None
_limiter_config: tuple | None = None


def limiter() -> RateLimiter:
    """The process's limiter, rebuilt when the settings change (tests override them)."""
    global _limiter, _limiter_config
    config = (settings.RECOVERYDASH_RATE_LIMIT_PER_SECOND, settings.RECOVERYDASH_RATE_LIMIT_BURST,
              settings.RECOVERYDASH_REDIS_URL)
    if _limiter is None or config != _limiter_config:
        _limiter, _limiter_config = RateLimiter(*config), config
    return _limiter
