"""The base of every alert channel, and the guarded HTTP delivery they share.

A transport turns the stored payload (docs/ingest-v1.md#6-alert-webhooks) into the channel's body
and headers and sends it with httpx. This module holds the base (:class:`Transport`), the signed
JSON body of the wire contract (:class:`StandardWebhookTransport`) and the helpers every body is
made of; each other channel is one small module beside it: ``transports_slack``,
``transports_pagerduty``, ``transports_alertmanager``, ``transports_opsgenie``,
``transports_teams``. Failures raise ``TransportError(message, permanent=...)``; retrying happens
in one place (``recoverydash.alerts.delivery``), never here.

A monitoring server must not become a way to reach the inside of its network, nor a way to tie
up its own processes. Every delivery therefore:

* resolves the endpoint's name **once** (:func:`resolve_endpoint`) and refuses it when any answer
  is not a public unicast address (:func:`address_refusal`: loopback, private, link-local,
  multicast, unspecified, reserved, shared, site-local, and the IPv6 forms that embed such an
  IPv4 address: IPv4-mapped ``::ffff:a.b.c.d``, IPv4-compatible ``::a.b.c.d``, NAT64
  ``64:ff9b::/96``, 6to4 ``2002::/16``, Teredo), unless ``RECOVERYDASH_WEBHOOK_ALLOW_PRIVATE``
  is true;
* connects to the address that was checked, never to a second answer of the resolver (DNS
  rebinding): the connection is pinned to it while the ``Host`` header, TLS SNI and certificate
  check use the endpoint's name (:class:`PinnedTransport`);
* spends at most ``RECOVERYDASH_WEBHOOK_TIMEOUT_S`` seconds in total (resolving, connecting,
  TLS, sending and reading together: every socket operation gets only what is left of the
  budget);
* reads the body of an answer only when it is not a 2xx, and then at most
  ``RECOVERYDASH_WEBHOOK_MAX_RESPONSE_BYTES`` of it (streamed; reading stops at the cap, the
  rest is never downloaded): enough for an error text.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from datetime import UTC, datetime

import httpcore
import httpx
from django.conf import settings

ALLOW_SETTING = "RECOVERYDASH_WEBHOOK_ALLOW_PRIVATE"


class TransportError(Exception):
    """A delivery failed. ``permanent``: retrying cannot help (a 4xx other than 408/429, a refused
    address); ``status_code``: the receiver's answer, if any."""

    def __init__(self, message: str, *, permanent: bool = False, status_code: int | None = None):
        super().__init__(message)
        self.message = message
        self.permanent = permanent
        self.status_code = status_code


# --- which addresses may be reached ---------------------------------------------------------
_NAT64 = ipaddress.ip_network("64:ff9b::/96")            # RFC 6052 well-known prefix
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")    # RFC 8215 local-use prefix
_V4_COMPATIBLE = ipaddress.ip_network("::/96")           # RFC 4291 2.5.5.1, deprecated
_GLOBAL_UNICAST = ipaddress.ip_network("2000::/3")
_IETF_PROTOCOL = ipaddress.ip_network("192.0.0.0/24")    # RFC 6890 protocol assignments


def _kind(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """The special-purpose kind of ``address`` (without looking inside IPv6 embeddings)."""
    if address.is_loopback:
        return "a loopback address"
    if address.is_unspecified:
        return "the unspecified address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_multicast:
        return "a multicast address"
    if isinstance(address, ipaddress.IPv6Address) and address.is_site_local:
        return "a site-local address"
    if address.is_reserved:
        return "a reserved address"
    if address.is_private:
        return "a private address"
    if isinstance(address, ipaddress.IPv4Address) and address in _IETF_PROTOCOL:
        return "an IETF protocol address (192.0.0.0/24)"
    if not address.is_global:
        return "an address that is not globally reachable"
    return None


def address_refusal(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why a webhook may not connect to ``address`` (a phrase such as "a loopback address" or
    "a NAT64 form of 127.0.0.1, a loopback address"), or None for a public unicast address.

    IPv4: anything Python does not call global, multicast, reserved or in 192.0.0.0/24. IPv6:
    only global unicast (2000::/3) passes, except that the forms which carry an IPv4 address
    are judged by that address (IPv4-mapped, NAT64 ``64:ff9b::/96``, 6to4 ``2002::/16``: so
    ``[::ffff:127.0.0.1]``, ``[64:ff9b::7f00:1]`` and ``[2002:7f00:1::]`` are loopback), and
    IPv4-compatible ``::a.b.c.d``, local-use NAT64 ``64:ff9b:1::/48`` and Teredo ``2001::/32``
    are refused whatever they embed."""
    if isinstance(address, ipaddress.IPv4Address):
        return _kind(address)
    if address.ipv4_mapped is not None:
        inner = address_refusal(address.ipv4_mapped)
        return inner and f"an IPv4-mapped form of {address.ipv4_mapped}, {inner}"
    if address in _NAT64:
        v4 = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        inner = address_refusal(v4)
        return inner and f"a NAT64 form of {v4}, {inner}"
    if address.sixtofour is not None:
        inner = address_refusal(address.sixtofour)
        return inner and f"a 6to4 form of {address.sixtofour}, {inner}"
    if address in _V4_COMPATIBLE and int(address) > 1:
        v4 = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        return f"an IPv4-compatible form of {v4} (deprecated, never routed)"
    if address in _NAT64_LOCAL:
        return "a local-use NAT64 address"
    if address.teredo is not None:
        return "a Teredo address"
    kind = _kind(address)
    if kind is None and address not in _GLOBAL_UNICAST:
        kind = "an address outside IPv6 global unicast (2000::/3)"
    return kind


@dataclass(frozen=True)
class Endpoint:
    """A checked webhook URL: ``host`` as written (the name for Host and SNI), ``port``, and
    ``address``, the one IP the delivery connects to."""

    url: str
    scheme: str
    host: str
    port: int
    address: str


_resolver_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="webhook-dns")


def _getaddrinfo(host: str, port: int) -> list:
    return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)


def split_url(url: str) -> tuple[str, str, int]:
    """``(scheme, host, port)`` of an http(s) URL, the host as it goes on the wire (IDNA,
    lower case, IPv6 without brackets). TransportError(permanent) for another scheme, no host,
    or a port outside 1-65535."""
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError) as exc:
        raise TransportError(f"webhook URL {url!r} is not valid: {exc}", permanent=True) from None
    if parsed.scheme not in ("http", "https") or not parsed.raw_host:
        raise TransportError(f"webhook URL must be http(s)://host/..., got {url!r}", permanent=True)
    port = parsed.port
    if port is None:
        port = 443 if parsed.scheme == "https" else 80
    if not 1 <= port <= 65535:
        raise TransportError(f"webhook URL port must be 1-65535, got {port}", permanent=True)
    return parsed.scheme, parsed.raw_host.decode("ascii"), port


def resolve_endpoint(url: str, allow_private: bool | None = None,
                     timeout: float | None = None) -> Endpoint:
    """Check ``url`` and resolve its host once: the :class:`Endpoint` to connect to.

    Every address the name resolves to must be public (:func:`address_refusal`) unless
    ``allow_private`` (default: the ``RECOVERYDASH_WEBHOOK_ALLOW_PRIVATE`` setting); the first
    one is the address the delivery connects to. Resolution waits at most ``timeout`` seconds
    (default: the delivery budget). Raises TransportError(permanent=True) for a bad URL or a
    refused address (the message names the address, why, and the setting that allows it), and
    TransportError(permanent=False) when the name does not resolve (DNS may recover)."""
    if allow_private is None:
        allow_private = getattr(settings, ALLOW_SETTING)
    if timeout is None:
        timeout = settings.RECOVERYDASH_WEBHOOK_TIMEOUT_S
    scheme, host, port = split_url(url)
    future = _resolver_pool.submit(_getaddrinfo, host, port)
    try:
        infos = future.result(timeout=max(timeout, 0.001))
    except FutureTimeout:
        raise TransportError(f"resolving {host} took longer than {timeout:g} s") from None
    except (socket.gaierror, UnicodeError, OSError) as exc:
        raise TransportError(f"cannot resolve {host}: {exc}") from None
    addresses = []
    for info in infos:
        text = info[4][0].split("%", 1)[0]
        address = ipaddress.ip_address(text)
        if not allow_private:
            why = address_refusal(address)
            if why is not None:
                where = f"{host} is" if host == text else f"{host} resolves to {address},"
                raise TransportError(
                    f"{where} {why}: webhooks go to public addresses only; set "
                    f"{ALLOW_SETTING}=true to allow private ones", permanent=True)
        if str(address) not in addresses:
            addresses.append(str(address))
    if not addresses:
        raise TransportError(f"cannot resolve {host}: no address")
    return Endpoint(url, scheme, host, port, addresses[0])


def check_address(url: str, allow_private: bool | None = None) -> None:
    """Refuse a URL that is not http(s), has an invalid port, or whose host resolves to a
    non-public address (see :func:`resolve_endpoint`, which raises the same errors)."""
    resolve_endpoint(url, allow_private)


# --- a connection pinned to the checked address, within one time budget ----------------------
class _BudgetStream(httpcore.NetworkStream):
    """A network stream whose every operation waits at most what is left until ``deadline``
    (``time.monotonic()`` seconds)."""

    def __init__(self, inner: httpcore.NetworkStream, deadline: float):
        self.inner, self.deadline = inner, deadline

    def _left(self, timeout: float | None) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise httpcore.ReadTimeout("webhook delivery time budget spent")
        return left if timeout is None else min(timeout, left)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self.inner.read(max_bytes, self._left(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.inner.write(buffer, self._left(timeout))

    def close(self) -> None:
        self.inner.close()

    def start_tls(self, ssl_context, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return _BudgetStream(self.inner.start_tls(ssl_context, server_hostname,
                                                  self._left(timeout)), self.deadline)

    def get_extra_info(self, info: str):
        return self.inner.get_extra_info(info)


def _connect_tcp(address: str, port: int, timeout: float | None,
                 local_address: str | None, socket_options) -> httpcore.NetworkStream:
    """Open the TCP connection (a module function so that tests can watch where it goes)."""
    return httpcore.SyncBackend().connect_tcp(address, port, timeout=timeout,
                                              local_address=local_address,
                                              socket_options=socket_options)


class _PinnedBackend(httpcore.NetworkBackend):
    """Connects every request for the endpoint's host to its one checked address."""

    def __init__(self, endpoint: Endpoint, deadline: float):
        self.endpoint, self.deadline = endpoint, deadline

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None, socket_options=None):
        if host.strip("[]").lower() != self.endpoint.host.lower() or port != self.endpoint.port:
            raise httpcore.ConnectError(f"refusing a connection to {host}:{port}, not the "
                                        f"checked endpoint")
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise httpcore.ConnectTimeout("webhook delivery time budget spent")
        stream = _connect_tcp(self.endpoint.address, port,
                              left if timeout is None else min(timeout, left),
                              local_address, socket_options)
        return _BudgetStream(stream, self.deadline)

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        raise httpcore.ConnectError("webhooks do not use Unix sockets")

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class PinnedTransport(httpx.HTTPTransport):
    """httpx transport for one delivery: connects to ``endpoint.address`` (checked) while
    httpx sends ``Host`` and the TLS layer uses SNI and verifies the certificate for
    ``endpoint.host``; no proxy from the environment; every operation within ``deadline``."""

    def __init__(self, endpoint: Endpoint, deadline: float):
        super().__init__(trust_env=False, retries=0)
        # httpx exposes no network backend option: give it a pool that has ours (the same
        # arguments HTTPTransport passes, plus network_backend).
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False), max_connections=1,
            max_keepalive_connections=0, network_backend=_PinnedBackend(endpoint, deadline))


@dataclass
class Answer:
    """What the receiver said: ``status_code`` and at most the size cap of its ``body`` (empty
    for a 2xx, whose body is not read)."""

    status_code: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


def post(url: str, data: bytes, headers: dict[str, str]) -> Answer:
    """POST ``data`` to ``url`` the guarded way (module docstring): resolve once, refuse
    non-public addresses, connect to the checked one, stay within the time budget, read at most
    the response cap. Raises TransportError (see :func:`resolve_endpoint`; a timeout or a
    connection error is not permanent)."""
    budget = settings.RECOVERYDASH_WEBHOOK_TIMEOUT_S
    cap = settings.RECOVERYDASH_WEBHOOK_MAX_RESPONSE_BYTES
    deadline = time.monotonic() + budget
    endpoint = resolve_endpoint(url, timeout=budget)
    headers = {**headers, "Accept-Encoding": "identity"}
    try:
        client = httpx.Client(transport=PinnedTransport(endpoint, deadline), trust_env=False,
                              follow_redirects=False, timeout=budget)
        with client, client.stream("POST", url, content=data, headers=headers) as response:
            if 200 <= response.status_code < 300:  # delivered: the body says nothing more
                return Answer(response.status_code, b"")
            body = bytearray()
            for chunk in response.iter_raw(min(cap, 65536) or 1):
                body += chunk
                if len(body) >= cap:  # stop reading: the rest is never downloaded
                    break
            return Answer(response.status_code, bytes(body[:cap]))
    except httpx.TimeoutException as exc:
        raise TransportError(f"no complete answer within {budget:g} s "
                             f"({type(exc).__name__})") from None
    except httpx.HTTPError as exc:
        raise TransportError(f"{type(exc).__name__}: {exc}") from None


class Transport:
    """Base of the channels: ``body(payload)``, ``headers(...)`` and ``url(payload)`` per channel;
    ``send`` posts the guarded way and classifies the answer. One module per channel
    (``transports_<kind>.py``); ``recoverydash.alerts.delivery.TRANSPORTS`` maps a
    ``WebhookEndpoint.kind`` to its class.

    ``key_label``: what the endpoint's ``routing_key`` holds for this channel ("" when the channel
    uses none); ``check_key`` refuses, when an endpoint is saved, a key the receiver would refuse.
    """

    content_type = "application/json"
    key_label = ""

    def __init__(self, endpoint):
        self.endpoint = endpoint

    @classmethod
    def check_key(cls, key: str) -> str:
        """The key to store for this channel, stripped; ValueError saying what was expected when
        the receiver would refuse it. A channel without ``key_label`` takes none."""
        key = (key or "").strip()
        if key and not cls.key_label:
            raise ValueError("expected no key: this kind of endpoint uses none (PagerDuty and "
                             "Opsgenie endpoints do)")
        return key

    def url(self, payload: dict) -> str:
        """Where this payload goes: the endpoint's URL (a channel with one path per action,
        Opsgenie, builds it from there)."""
        return self.endpoint.url

    def body(self, payload: dict) -> dict:
        raise NotImplementedError

    def headers(self, webhook_id: str, data: str) -> dict[str, str]:
        return {}

    def send(self, payload: dict, webhook_id: str) -> int:
        """POST the channel's body the guarded way (:func:`post`); returns the HTTP status on
        2xx, raises TransportError else (4xx other than 408/425/429: permanent)."""
        data = json.dumps(self.body(payload), separators=(",", ":"), sort_keys=True)
        headers = {"Content-Type": self.content_type, "User-Agent": "recoverydash-webhooks/1"}
        headers.update(self.headers(webhook_id, data))
        answer = post(self.url(payload), data.encode(), headers)
        code = answer.status_code
        if 200 <= code < 300:
            return code
        text = answer.text[:300]
        permanent = 400 <= code < 500 and code not in (408, 425, 429)
        raise TransportError(f"HTTP {code}: {text}", permanent=permanent, status_code=code)


class StandardWebhookTransport(Transport):
    """docs/ingest-v1.md#6-alert-webhooks: the payload as is, signed per Standard Webhooks with the
    endpoint's secret."""

    def body(self, payload: dict) -> dict:
        return payload

    def headers(self, webhook_id: str, data: str) -> dict[str, str]:
        from standardwebhooks.webhooks import Webhook

        now = datetime.now(UTC).replace(microsecond=0)
        signature = Webhook(self.endpoint.secret).sign(webhook_id, now, data)
        return {"webhook-id": webhook_id, "webhook-timestamp": str(int(now.timestamp())),
                "webhook-signature": signature}


# --- what every channel's body is made of -----------------------------------------------------
def headline(payload: dict) -> str:
    """``[FIRING] critical restart_omission on run llama-70b: <summary>``: the one line every
    channel shows (raw text: each channel escapes it its own way); ``[FIRING, UPDATED] ...`` when
    the payload tells a change of the open alert's subjects (``payload["change"]``)."""
    alert, run = payload["alert"], payload["run"]
    status = payload["status"].upper() + (", UPDATED" if payload.get("change") else "")
    return (f"[{status}] {alert['severity']} {alert['rule']} on run "
            f"{run['run_id']}: {alert['summary']}")


def change_words(payload: dict) -> str:
    """What a subjects change did, in words: ``added g60; removed g20`` (raw text), or ``""``
    for a state change (``payload["change"]`` null or absent)."""
    change = payload.get("change") or {}
    words = []
    for key in ("added", "removed"):
        if change.get(key):
            words.append(f"{key} {', '.join(str(s) for s in change[key])}")
    return "; ".join(words)


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, ending in an ellipsis when it was cut."""
    text = str(text)
    return text if len(text) <= limit else text[:max(limit - 1, 0)] + "\u2026"


def bounded_key(key: str, limit: int) -> str:
    """A receiver's deduplication key of at most ``limit`` characters for ``key``: the key itself
    when it fits, else its first characters, ``~`` and the sha256 (hex) of the whole key. Stable:
    every flip of one alert maps to the same value, and two long keys that share their first
    ``limit - 65`` characters still differ."""
    if len(key) <= limit:
        return key
    import hashlib

    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()
    return key[:limit - len(digest) - 1] + "~" + digest


def rfc3339(moment: str | None) -> str | None:
    """An ISO 8601 time as stored (``...+00:00``) in the ``Z`` form receivers print."""
    if not moment:
        return None
    parsed = datetime.fromisoformat(moment).astimezone(UTC)
    return parsed.isoformat().replace("+00:00", "Z")
