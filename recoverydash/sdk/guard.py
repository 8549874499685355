"""The SDK's one seam for "never raise into the host", and its one logger.

Everything the SDK runs on a trainer's behalf (``emit`` on the training thread, the sender
thread, a framework callback, the exit and SIGTERM paths) goes through one of two doors:

- ``@never_raises(default)`` on a function or method: an ``Exception`` raised inside is logged
  (once per function and exception type) and ``default`` is returned instead;
- ``with guarded("what"):`` around a block: an ``Exception`` raised inside is logged the same way
  and the block is left; the code after the ``with`` goes on (sentry-python's
  ``capture_internal_exceptions``).

``KeyboardInterrupt`` and ``SystemExit`` are not swallowed: they are the host's. Messages go to
the ``recoverydash.sdk`` logger (``log``); a failure that repeats (a network error on every
batch) is said once per key through ``Once``, so a noisy failure never floods the trainer's
log. What must be said again and again (a refused token: see ``transport``) is logged by its
owner at most once per pause, through the same logger.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Hashable
from typing import Any, ParamSpec, TypeVar

log = logging.getLogger("recoverydash.sdk")

P = ParamSpec("P")
R = TypeVar("R")


class Once:
    """Logs a message once per key (``key`` any hashable: a place and an exception type, a
    status code). ``reset()`` forgets what was said (a forked child says it again)."""

    def __init__(self) -> None:
        self._seen: set[Hashable] = set()

    def __call__(self, key: Hashable, level: int, msg: str, *args: object) -> None:
        if key in self._seen:
            return
        self._seen.add(key)
        log.log(level, msg, *args)

    def reset(self) -> None:
        self._seen = set()


#: The process's ``Once`` for the doors below when the guarded object has none of its own.
ONCE = Once()


def _say(once: Once | None, what: str, error: BaseException) -> None:
    """The one place a swallowed failure is logged."""
    try:
        (once or ONCE)((what, type(error)), logging.WARNING, "recoverydash: %s failed: %r",
                       what, error)
    except Exception:  # noqa: BLE001 - a broken handler of the host's logging
        pass


class guarded:  # noqa: N801 - used like a function: ``with guarded("flush"):``
    """Context manager: run the block; an ``Exception`` raised in it is logged once per
    (``what``, exception type) through ``once`` (default ``ONCE``) and swallowed. A class, not
    a generator: entering and leaving cost two method calls."""

    __slots__ = ("once", "what")

    def __init__(self, what: str, once: Once | None = None) -> None:
        self.what = what
        self.once = once

    def __enter__(self) -> guarded:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: Any) -> bool:
        if kind is None or error is None or not issubclass(kind, Exception):
            return False
        _say(self.once, self.what, error)
        return True


def never_raises(default: R, what: str | None = None) -> Callable[[Callable[P, R]],
                                                                  Callable[P, R]]:
    """Decorator: the function returns ``default`` instead of raising an ``Exception``, which is
    logged once per (``what``, default the function's name, exception type). On a method, the
    instance's ``_once`` (a ``Once``) is used when it has one, so a forked child says it again.
    ``default`` is returned as it is: give immutable values (``False``, ``0``, ``None``)."""

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        name = what or fn.__name__

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return fn(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - the seam itself
                once = getattr(args[0], "_once", None) if args else None
                _say(once if isinstance(once, Once) else None, name, e)
                return default

        return wrapper

    return decorate


__all__ = ["ONCE", "Once", "guarded", "log", "never_raises"]
