"""The body Prometheus Alertmanager sends to a ``webhook_config`` receiver (version 4), so that the
receivers and bridges already written for Alertmanager (alert routers, chat bridges, ticketing
hooks) accept recoverydash's alerts unchanged.

Body (https://prometheus.io/docs/alerting/latest/configuration/#webhook_config): ``version``
``"4"``, ``groupKey``, ``truncatedAlerts``, ``status`` (``firing`` | ``resolved``), ``receiver``,
``groupLabels``, ``commonLabels``, ``commonAnnotations``, ``externalURL`` and ``alerts``, each with
``status``, ``labels``, ``annotations``, ``startsAt``, ``endsAt``, ``generatorURL`` and
``fingerprint``. One notification carries one alert, so the group is that alert: its labels are
the group's and the common ones.

Labels: ``alertname`` (the rule), ``severity``, ``project``, ``run_id`` and, when the rule has one,
``subject`` (a generation id or an attempt number). Annotations: ``summary``, ``state``
(``firing``, ``acknowledged`` or ``resolved``: Alertmanager knows no acknowledgement, so an
acknowledged alert is sent as still ``firing`` with ``state: acknowledged``, as Alertmanager
itself repeats a firing alert), ``dedup_key``, ``alert_id``, ``run_url``, and when there are
``subjects`` (every subject the grouped alert lists, comma-separated) and ``runbook_url``; a
change of an open alert's subjects is sent as Alertmanager re-sends a group an alert joined: the
same ``firing`` alert (fingerprint and group key unchanged) with its annotations as they are now,
plus ``subjects_added`` / ``subjects_removed``. ``endsAt`` is
Alertmanager's zero time (``0001-01-01T00:00:00Z``) while the alert fires. ``fingerprint`` is the
first 16 hex digits of the sha256 of the alert's dedup key: the same on every flip, also when the
severity changed in between. Alertmanager signs nothing; these bodies also carry the Standard
Webhooks headers of docs/ingest-v1.md#6-alert-webhooks, which receivers may check or ignore.
"""

from __future__ import annotations

import hashlib
import json

from django.conf import settings

from .transports import StandardWebhookTransport, rfc3339

ZERO_TIME = "0001-01-01T00:00:00Z"
IDENTITY = ("alertname", "project", "run_id", "subject")


def group_key(labels: dict) -> str:
    """Alertmanager's form ``{}:{name="value", ...}`` over the identity labels, values quoted and
    escaped like Go's ``%q`` (JSON strings are the same for what labels hold)."""
    inner = ", ".join(f"{name}={json.dumps(labels[name], ensure_ascii=False)}"
                      for name in IDENTITY if name in labels)
    return "{}:{" + inner + "}"


class AlertmanagerTransport(StandardWebhookTransport):
    """Alertmanager webhook body (module docstring), signed like the standard one."""

    def body(self, payload: dict) -> dict:
        alert, run = payload["alert"], payload["run"]
        labels = {"alertname": alert["rule"], "severity": alert["severity"],
                  "project": run.get("project") or "", "run_id": run["run_id"]}
        if alert.get("subject"):
            labels["subject"] = alert["subject"]
        dedup = payload.get("dedup_key") or alert["id"]
        annotations = {"summary": alert["summary"], "state": alert.get("state", payload["status"]),
                       "dedup_key": dedup, "alert_id": alert["id"], "run_url": run["url"]}
        if alert.get("subjects"):
            annotations["subjects"] = ", ".join(str(s) for s in alert["subjects"])
        if alert.get("runbook_url"):
            annotations["runbook_url"] = str(alert["runbook_url"])
        for key in ("added", "removed"):  # a change of the open alert's subjects
            if (payload.get("change") or {}).get(key):
                annotations[f"subjects_{key}"] = ", ".join(str(s) for s in payload["change"][key])
        status = "resolved" if payload["status"] == "resolved" else "firing"
        item = {"status": status, "labels": labels, "annotations": annotations,
                "startsAt": rfc3339(alert.get("opened_at")),
                "endsAt": rfc3339(alert.get("resolved_at")) if status == "resolved"
                else ZERO_TIME,
                "generatorURL": run["url"],
                "fingerprint": hashlib.sha256(dedup.encode("utf-8")).hexdigest()[:16]}
        group = {name: labels[name] for name in IDENTITY if name in labels}
        return {"version": "4", "groupKey": group_key(labels), "truncatedAlerts": 0,
                "status": status, "receiver": self.endpoint.name or "recoverydash",
                "groupLabels": group, "commonLabels": dict(labels),
                "commonAnnotations": dict(annotations), "externalURL": settings.SITE_URL,
                "alerts": [item]}
