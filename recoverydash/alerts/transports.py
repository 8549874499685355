"""One transport per alert channel: signed JSON (Standard Webhooks), Slack, PagerDuty Events v2.

Each transport turns the stored spec-6 payload into the channel's body and headers and sends it
with httpx. Failures raise ``TransportError(message, permanent=...)``; retrying happens in one
place (``recoverydash.alerts.delivery``), never here. Outgoing requests to private, loopback or
link-local addresses are refused unless ``RECOVERYDASH_WEBHOOK_ALLOW_PRIVATE`` is true (a monitoring
server must not become a way to reach the inside of its network).
"""

from __future__ import annotations

import ipaddress
import json
import socket
from datetime import datetime, timezone
from urllib.parse import urlsplit

import httpx
from django.conf import settings


class TransportError(Exception):
    """A delivery failed. ``permanent``: retrying cannot help (a 4xx other than 408/429, a refused
    address); ``status_code``: the receiver's answer, if any."""

    def __init__(self, message: str, *, permanent: bool = False, status_code: int | None = None):
        super().__init__(message)
        self.message = message
        self.permanent = permanent
        self.status_code = status_code


def check_address(url: str, allow_private: bool | None = None) -> None:
    """Refuse URLs that are not http(s) or whose host resolves to a non-public address.

    Raises TransportError(permanent=True) for a bad scheme or a refused address and
    TransportError(permanent=False) when the name does not resolve (DNS may recover).
    """
    if allow_private is None:
        allow_private = settings.RECOVERYDASH_WEBHOOK_ALLOW_PRIVATE
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TransportError(f"webhook URL must be http(s)://host/..., got {url!r}", permanent=True)
    if allow_private:
        return
    try:
        infos = socket.getaddrinfo(parts.hostname, parts.port or 443, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise TransportError(f"cannot resolve {parts.hostname}: {exc}") from None
    for info in infos:
        address = ipaddress.ip_address(info[4][0].split("%", 1)[0])
        if not address.is_global:
            raise TransportError(
                f"{parts.hostname} resolves to {address}, a private or loopback address; set "
                "RECOVERYDASH_WEBHOOK_ALLOW_PRIVATE=true to allow it", permanent=True)


class Transport:
    """Base: ``body(payload)`` and ``headers(...)`` per channel; ``send`` posts and classifies."""

    content_type = "application/json"

    def __init__(self, endpoint):
        self.endpoint = endpoint

    def body(self, payload: dict) -> dict:
        raise NotImplementedError

    def headers(self, webhook_id: str, data: str) -> dict[str, str]:
        return {}

    def send(self, payload: dict, webhook_id: str) -> int:
        """POST the channel's body; returns the HTTP status on 2xx, raises TransportError else."""
        url = self.endpoint.url
        check_address(url)
        data = json.dumps(self.body(payload), separators=(",", ":"), sort_keys=True)
        headers = {"Content-Type": self.content_type, "User-Agent": "recoverydash-webhooks/1"}
        headers.update(self.headers(webhook_id, data))
        try:
            response = httpx.post(url, content=data.encode(), headers=headers,
                                  timeout=settings.RECOVERYDASH_WEBHOOK_TIMEOUT_S,
                                  follow_redirects=False)
        except httpx.HTTPError as exc:
            raise TransportError(f"{type(exc).__name__}: {exc}") from None
        code = response.status_code
        if 200 <= code < 300:
            return code
        text = response.text[:300]
        permanent = 400 <= code < 500 and code not in (408, 425, 429)
        raise TransportError(f"HTTP {code}: {text}", permanent=permanent, status_code=code)


class StandardWebhookTransport(Transport):
    """Spec 6: the payload as is, signed per Standard Webhooks with the endpoint's secret."""

    def body(self, payload: dict) -> dict:
        return payload

    def headers(self, webhook_id: str, data: str) -> dict[str, str]:
        from standardwebhooks.webhooks import Webhook

        now = datetime.now(timezone.utc).replace(microsecond=0)
        signature = Webhook(self.endpoint.secret).sign(webhook_id, now, data)
        return {"webhook-id": webhook_id, "webhook-timestamp": str(int(now.timestamp())),
                "webhook-signature": signature}


def _line(payload: dict) -> str:
    alert, run = payload["alert"], payload["run"]
    return (f"[{payload['status'].upper()}] {alert['severity']} {alert['rule']} on run "
            f"{run['run_id']}: {alert['summary']}")


class SlackTransport(Transport):
    """Slack incoming-webhook body: a text line and a section with a link to the run."""

    def body(self, payload: dict) -> dict:
        text = _line(payload)
        return {"text": text, "blocks": [{"type": "section", "text": {
            "type": "mrkdwn", "text": f"{text}\n<{payload['run']['url']}|Open the run>"}}]}


class PagerDutyTransport(Transport):
    """PagerDuty Events v2: trigger / acknowledge / resolve under the alert's dedup key."""

    ACTIONS = {"firing": "trigger", "acknowledged": "acknowledge", "resolved": "resolve"}

    def body(self, payload: dict) -> dict:
        alert = payload["alert"]
        return {
            "routing_key": self.endpoint.routing_key or self.endpoint.secret,
            "event_action": self.ACTIONS[payload["status"]],
            "dedup_key": payload.get("dedup_key", alert["id"]),
            "payload": {"summary": _line(payload)[:1024], "source": payload["run"]["run_id"],
                        "severity": alert["severity"], "custom_details": alert},
            "links": [{"href": payload["run"]["url"], "text": "recoverydash run"}],
        }


TRANSPORTS = {"standard": StandardWebhookTransport, "slack": SlackTransport,
              "pagerduty": PagerDutyTransport}


def transport_for(endpoint) -> Transport:
    """The transport of an endpoint's ``kind``; KeyError for an unknown kind."""
    return TRANSPORTS[endpoint.kind](endpoint)
