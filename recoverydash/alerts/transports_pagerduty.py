"""PagerDuty Events API v2: trigger, acknowledge and resolve one incident per alert.

Body (https://developer.pagerduty.com/docs/events-api-v2/trigger-events/ and
.../acknowledge-events/, .../resolve-events/): ``routing_key`` (the integration's 32-character
key, the only credential: PagerDuty signs nothing and checks nothing else), ``event_action``,
``dedup_key`` (at most 255 characters), and for a trigger ``payload`` (``summary`` at most 1,024
characters, ``source``, ``severity`` one of critical/error/warning/info, ``timestamp``,
``component``, ``group``, ``class``, ``custom_details``), ``links``, ``client`` and
``client_url``. Acknowledge and resolve carry only the first three.

The alert's dedup key (``run:rule:subject``) can exceed 255 characters (a 128-character run id and
a 200-character generation id); :func:`~.transports.bounded_key` shortens it to a stable value,
the same for every flip of the alert, so PagerDuty still ties the resolve to its trigger.
A change of an open alert's subjects (``payload["change"]``) is a ``trigger`` under the same
dedup key, also while the alert is acknowledged: PagerDuty appends it to the open incident's
alert (summary and details as they are now) and does not notify again while the incident is
acknowledged, so the acknowledgement holds at both ends. An
endpoint without a routing key is a permanent failure: the endpoint's signing secret is never sent
in its place.
"""

from __future__ import annotations

import re

from django.conf import settings

from .transports import Transport, TransportError, bounded_key, clip, headline, rfc3339

#: Events v2 field limits.
DEDUP_KEY_LIMIT = 255
SUMMARY_LIMIT = 1024
ROUTING_KEY = re.compile(r"[A-Za-z0-9]{32}")


class PagerDutyTransport(Transport):
    """PagerDuty Events v2 under the alert's (bounded) dedup key."""

    ACTIONS = {"firing": "trigger", "acknowledged": "acknowledge", "resolved": "resolve"}
    key_label = "PagerDuty routing key (integration key, 32 characters)"

    @classmethod
    def check_key(cls, key: str) -> str:
        """A routing key as PagerDuty issues it: exactly 32 letters and digits. ValueError
        otherwise (no key included)."""
        key = (key or "").strip()
        if not ROUTING_KEY.fullmatch(key):
            raise ValueError(f"expected the PagerDuty integration's routing key (32 letters and "
                             f"digits), got {'no key' if not key else f'{len(key)} characters'}")
        return key

    def body(self, payload: dict) -> dict:
        if not self.endpoint.routing_key:
            raise TransportError("this PagerDuty endpoint has no routing key", permanent=True)
        alert, run = payload["alert"], payload["run"]
        body = {"routing_key": self.endpoint.routing_key,
                "event_action": "trigger" if payload.get("change")
                else self.ACTIONS[payload["status"]],
                "dedup_key": bounded_key(payload.get("dedup_key") or alert["id"],
                                         DEDUP_KEY_LIMIT)}
        if body["event_action"] != "trigger":
            return body
        body["payload"] = {
            "summary": clip(headline(payload), SUMMARY_LIMIT),
            "source": run["run_id"],
            "severity": alert["severity"],  # info, warning, critical: all three are PagerDuty's
            "timestamp": rfc3339(alert.get("opened_at")),
            "component": alert.get("subject") or run["run_id"],
            "class": alert["rule"],
            "custom_details": {**alert, "run_url": run["url"], "health": run.get("health"),
                               "dedup_key": payload.get("dedup_key"),
                               **({"change": payload["change"]} if payload.get("change")
                                  else {})},
        }
        if run.get("project"):
            body["payload"]["group"] = run["project"]
        body["links"] = [{"href": run["url"], "text": "recoverydash run"}]
        body["client"] = "recoverydash"
        body["client_url"] = settings.SITE_URL + "/"
        return body
