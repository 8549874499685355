"""One bounded HTTP question to the server, for the questions a trainer asks before its first
update (``checkpoint.restore_plan``, ``attempt.latest_on_server``).

``urllib``'s ``timeout`` bounds each socket operation, not the answer: a server (or anything
listening at the configured URL) that sends a byte just inside every timeout, headers without
end, or a body without end held the launch for as long as it kept sending, and an endless
body grew in memory. :func:`get_json` asks in a daemon thread and waits at most ``timeout``
seconds for the whole answer, read in pieces of at most ``max_bytes`` in all; a thread still
held by a trickling server stops at its next piece.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any

#: The most of one answer that is read (a restore plan names every object of a generation).
MAX_ANSWER_BYTES = 64 * 1024 * 1024


class AnswerTooLarge(ValueError):
    """The server's answer exceeded ``max_bytes``."""


def _read(resp, deadline: float, max_bytes: int, cancelled: threading.Event) -> bytes:
    parts: list[bytes] = []
    size = 0
    while True:
        if cancelled.is_set() or time.monotonic() > deadline:
            raise TimeoutError("the answer did not arrive within the time allowed")
        piece = resp.read1(65536)
        if not piece:
            return b"".join(parts)
        size += len(piece)
        if size > max_bytes:
            raise AnswerTooLarge(f"the answer is larger than {max_bytes} bytes")
        parts.append(piece)


def get_json(req: urllib.request.Request, timeout: float,
             max_bytes: int = MAX_ANSWER_BYTES) -> tuple[int, Any]:
    """``(status, decoded JSON)`` of the answer to ``req`` (``None`` for an empty body), within
    ``timeout`` seconds in all. An HTTP error status is returned like a success, with its body
    decoded when it is JSON (else ``None``). Raises ``TimeoutError`` (the whole answer did not
    arrive in time), ``AnswerTooLarge``, ``ValueError`` (a 2xx body that is not JSON) or the
    network error (``OSError``, ``urllib.error.URLError``, ``http.client.HTTPException``)."""
    deadline = time.monotonic() + timeout
    cancelled = threading.Event()
    out: dict[str, Any] = {}

    def ask() -> None:
        try:
            try:
                with urllib.request.urlopen(req, timeout=timeout) as resp:
                    out["answer"] = (resp.status, _read(resp, deadline, max_bytes, cancelled))
            except urllib.error.HTTPError as e:
                try:
                    body = _read(e, deadline, max_bytes, cancelled)
                except Exception:  # noqa: BLE001 - the status is the answer then
                    body = b""
                out["answer"] = (e.code, body, "error")
        except BaseException as e:  # noqa: BLE001 - handed to the asking thread
            out["error"] = e

    thread = threading.Thread(target=ask, name="recoverydash-ask", daemon=True)
    thread.start()
    thread.join(max(0.0, deadline - time.monotonic()) + 0.05)
    if thread.is_alive():
        cancelled.set()
        raise TimeoutError(f"no complete answer within {timeout} s")
    if "error" in out:
        raise out["error"]
    status, body, *error = out["answer"]
    if error:
        try:
            return status, json.loads(body) if body else None
        except ValueError:
            return status, None
    return status, json.loads(body) if body else None


__all__ = ["MAX_ANSWER_BYTES", "AnswerTooLarge", "get_json"]
