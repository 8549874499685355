"""Opsgenie Alert API v2: create an alert when it fires, acknowledge and close it under its alias.

The endpoint's URL is the API's alert collection, ``https://api.opsgenie.com/v2/alerts`` (or
``https://api.eu.opsgenie.com/v2/alerts`` for the EU instance); its key (``routing_key``) is an API
integration's key, sent as ``Authorization: GenieKey <key>``, the only credential (Opsgenie signs
nothing). https://docs.opsgenie.com/docs/alert-api

* firing: ``POST <url>`` with ``message`` (at most 130 characters), ``alias`` (512), ``description``
  (15,000), ``tags`` (at most 20, 50 characters each), ``details`` (string to string, 8,000
  characters in all), ``entity`` (512), ``source`` (100) and ``priority`` (``P1`` critical,
  ``P3`` warning, ``P5`` info);
* acknowledged / resolved: ``POST <url>/<alias>/acknowledge?identifierType=alias`` /
  ``.../close?identifierType=alias`` with ``user`` (100), ``source`` (100) and ``note`` (25,000);
* a change of an open alert's subjects (``payload["change"]``): ``POST
  <url>/<alias>/notes?identifierType=alias`` (Add Note) with the same three fields, the note
  naming the subjects added and removed (a second create under the alias would only raise its
  count, leaving message and description as they were).

The alias is the alert's dedup key, shortened to 512 characters by
:func:`~.transports.bounded_key` (stable across flips). Opsgenie answers 202 and processes the
request asynchronously.
"""

from __future__ import annotations

import re
from urllib.parse import quote

from .transports import Transport, bounded_key, change_words, clip, headline

MESSAGE_LIMIT = 130
ALIAS_LIMIT = 512
DESCRIPTION_LIMIT = 15000
ENTITY_LIMIT = 512
SOURCE_LIMIT = 100
USER_LIMIT = 100
NOTE_LIMIT = 25000
TAG_LIMIT = 50
MAX_TAGS = 20
DETAILS_LIMIT = 8000
PRIORITIES = {"critical": "P1", "warning": "P3", "info": "P5"}
API_KEY = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
                     r"[0-9a-fA-F]{12}")


def bounded_details(details: dict[str, str], limit: int = DETAILS_LIMIT) -> dict[str, str]:
    """``details`` whose keys and values together hold at most ``limit`` characters: values are
    clipped in order, and a key that no longer fits is left out."""
    out, used = {}, 0
    for key, value in details.items():
        room = limit - used - len(key)
        if room <= 0:
            break
        value = clip(value, room)
        out[key] = value
        used += len(key) + len(value)
    return out


class OpsgenieTransport(Transport):
    """Opsgenie Alert API v2 (module docstring)."""

    key_label = "Opsgenie API key (an API integration's key, a UUID)"
    ACTIONS = {"acknowledged": "acknowledge", "resolved": "close"}

    @classmethod
    def check_key(cls, key: str) -> str:
        """An Opsgenie API key as Opsgenie issues it (a UUID); ValueError otherwise."""
        key = (key or "").strip()
        if not API_KEY.fullmatch(key):
            raise ValueError("expected the Opsgenie API integration's key (a UUID such as "
                             "1b2c3d4e-aaaa-bbbb-cccc-0123456789ab), got "
                             + ("no key" if not key else f"{len(key)} characters"))
        return key

    def alias(self, payload: dict) -> str:
        return bounded_key(payload.get("dedup_key") or payload["alert"]["id"], ALIAS_LIMIT)

    def action(self, payload: dict) -> str | None:
        """The path after the alias: ``notes`` for a change of subjects, ``acknowledge`` or
        ``close`` for those flips, None to create the alert."""
        if payload.get("change"):
            return "notes"
        return self.ACTIONS.get(payload["status"])

    def url(self, payload: dict) -> str:
        action = self.action(payload)
        base = self.endpoint.url.rstrip("/")
        if action is None:
            return base
        return f"{base}/{quote(self.alias(payload), safe='')}/{action}?identifierType=alias"

    def headers(self, webhook_id: str, data: str) -> dict[str, str]:
        return {"Authorization": f"GenieKey {self.endpoint.routing_key}"}

    def body(self, payload: dict) -> dict:
        alert, run = payload["alert"], payload["run"]
        if self.action(payload) is not None:
            words = change_words(payload)
            note = f"{headline(payload)}\n" + (f"Subjects {words}.\n" if words else "")
            return {"user": "recoverydash", "source": "recoverydash",
                    "note": clip(f"{note}{run['url']}", NOTE_LIMIT)}
        tags = [clip(t, TAG_LIMIT) for t in ("recoverydash", alert["rule"], alert["severity"],
                                             f"run:{run['run_id']}") if t][:MAX_TAGS]
        details = {"run_id": run["run_id"], "run_url": run["url"],
                   "health": str(run.get("health", "")), "rule": alert["rule"],
                   "severity": alert["severity"], "alert_id": alert["id"],
                   "opened_at": str(alert.get("opened_at") or ""),
                   "subject": str(alert.get("subject") or "")}
        if run.get("project"):
            details["project"] = run["project"]
        return {"message": clip(headline(payload), MESSAGE_LIMIT),
                "alias": self.alias(payload),
                "description": clip(f"{alert['summary']}\n\nRun: {run['url']}", DESCRIPTION_LIMIT),
                "tags": tags, "details": bounded_details(details),
                "entity": clip(run["run_id"], ENTITY_LIMIT), "source": "recoverydash",
                "priority": PRIORITIES.get(alert["severity"], "P3")}
