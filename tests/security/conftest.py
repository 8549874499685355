"""Hostile receivers for the webhook attack tests: raw sockets on loopback, each bounded in the
bytes it sends and the time it takes, so a test that fails never hangs."""

from __future__ import annotations

import socket
import threading
import time

import pytest


class RawReceiver:
    """A one-purpose HTTP receiver on 127.0.0.1: reads a request, then runs ``behave(conn)``.
    ``requests`` holds the raw request heads; ``sent`` counts the bytes ``behave`` managed to
    write before the client went away."""

    def __init__(self, behave):
        self.behave = behave
        self.requests: list[bytes] = []
        self.sent = 0
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn):
        conn.settimeout(5)
        data = b""
        try:
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            self.requests.append(data)
            self.behave(self, conn)
        except OSError:
            pass
        finally:
            conn.close()

    def write(self, conn, data: bytes) -> None:
        conn.sendall(data)
        self.sent += len(data)

    def close(self):
        self.stop.set()
        self.thread.join(2)
        self.sock.close()


@pytest.fixture
def raw_receiver():
    made = []

    def make(behave):
        receiver = RawReceiver(behave)
        made.append(receiver)
        return receiver

    yield make
    for receiver in made:
        receiver.close()


def answer_ok(receiver, conn):
    receiver.write(conn, b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")


def trickle(seconds: float, status: bytes = b"200 OK"):
    """Answer one byte of the status line every 0.1 s for at most ``seconds``: every single
    read is quick, only a total budget stops the client."""

    def behave(receiver, conn):
        line = b"HTTP/1.1 " + status + b"\r\n" + b"X-Slow: " + b"a" * 10_000
        end = time.monotonic() + seconds
        for byte in line:
            if time.monotonic() > end:
                break
            receiver.write(conn, bytes([byte]))
            time.sleep(0.1)
        receiver.write(conn, b"\r\nContent-Length: 0\r\n\r\n")

    return behave


def huge(total: int, status: bytes = b"500 Internal Server Error"):
    """Answer ``status`` announcing a 4 GiB body and send up to ``total`` bytes of it."""

    def behave(receiver, conn):
        receiver.write(conn, b"HTTP/1.1 " + status + b"\r\nContent-Length: 4294967296\r\n\r\n")
        block = b"x" * 65536
        while receiver.sent < total:
            receiver.write(conn, block)

    return behave


@pytest.fixture
def member_client(client, project):
    """A logged-in member of ``project``."""
    from django.contrib.auth import get_user_model

    from recoverydash.runs.models import Membership

    user = get_user_model().objects.create_user("mallory", password="a long passphrase 1")
    Membership.objects.create(project=project, user=user)
    client.force_login(user)
    return client
