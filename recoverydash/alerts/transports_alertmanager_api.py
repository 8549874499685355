"""Push into a Prometheus Alertmanager: ``POST <url>/api/v2/alerts`` (Alertmanager's API v2, the
call Prometheus itself makes), so recoverydash's alerts join the routing, grouping, inhibition and
silences people already run in Alertmanager.

The endpoint's URL is the Alertmanager's base (``http://alertmanager:9093``, or behind a path
prefix ``https://host/alertmanager``); ``/api/v2/alerts`` is appended unless the URL already ends
with it. The body is a list of one ``postableAlert``
(https://github.com/prometheus/alertmanager/blob/main/api/v2/openapi.yaml): ``labels`` (its
identity in Alertmanager, the same on every flip of one alert: ``alertname`` the rule,
``severity``, ``project``, ``run_id`` and, when the alert has one, ``subject``), ``annotations``
(``summary``, ``state``, ``dedup_key``, ``alert_id``, ``alert_url``, ``run_url`` and when there
are ``subjects`` and ``runbook_url``; a change of subjects adds ``subjects_added`` /
``subjects_removed``), ``startsAt`` (when the alert opened), ``endsAt`` and ``generatorURL`` (the
run's page). Alertmanager knows no acknowledgement: an acknowledged alert stays active with
``state: acknowledged``.

Resolution is ``endsAt``: a resolved alert is sent with its ``resolved_at``, which Alertmanager
takes as resolved. A firing alert is sent with ``endsAt`` ``FIRING_HOLD_S`` (7 days) after the
notification: Alertmanager resolves an alert whose ``endsAt`` passed, and without one it would
resolve ours after its ``resolve_timeout`` (5 minutes by default), since recoverydash sends at
each flip and does not repeat a firing alert as Prometheus does. An alert open longer than that
with no flip in between shows as resolved in Alertmanager while recoverydash still shows it open.

Alertmanager's API takes no signature: the Standard Webhooks headers are not sent. Put it behind
your reverse proxy's authentication if it is reachable from elsewhere; an answer of 400 (a body it
refuses) is permanent, like any 4xx but 408/425/429.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from .transports import Transport, rfc3339

API_PATH = "/api/v2/alerts"
FIRING_HOLD_S = 7 * 24 * 3600


def _moment(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


class AlertmanagerApiTransport(Transport):
    """Alertmanager API v2 ``postableAlerts`` (module docstring)."""

    def url(self, payload: dict) -> str:
        base = self.endpoint.url.rstrip("/")
        return base if base.endswith(API_PATH) else base + API_PATH

    def body(self, payload: dict) -> list[dict]:  # type: ignore[override]
        alert, run = payload["alert"], payload["run"]
        labels = {"alertname": alert["rule"], "severity": alert["severity"],
                  "project": run.get("project") or "", "run_id": run["run_id"],
                  "subject": str(alert.get("subject") or "")}
        labels = {k: v for k, v in labels.items() if v}  # an empty value means no label there
        annotations = {"summary": alert["summary"], "state": alert.get("state", payload["status"]),
                       "dedup_key": payload.get("dedup_key") or alert["id"],
                       "alert_id": alert["id"], "run_url": run["url"]}
        if alert.get("url"):
            annotations["alert_url"] = alert["url"]
        if alert.get("subjects"):
            annotations["subjects"] = ", ".join(str(s) for s in alert["subjects"])
        if alert.get("runbook_url"):
            annotations["runbook_url"] = str(alert["runbook_url"])
        for key in ("added", "removed"):
            if (payload.get("change") or {}).get(key):
                annotations[f"subjects_{key}"] = ", ".join(str(s) for s in payload["change"][key])
        now = datetime.now(UTC)
        if payload["status"] == "resolved":
            ends = rfc3339(alert.get("resolved_at")) or _moment(now)
        else:
            ends = _moment(now + timedelta(seconds=FIRING_HOLD_S))
        return [{"labels": labels, "annotations": annotations,
                 "startsAt": rfc3339(alert.get("opened_at")) or _moment(now), "endsAt": ends,
                 "generatorURL": run["url"]}]
