"""The ``alertmanager_api`` receiver pushes into a real Alertmanager (Debian's
``prometheus-alertmanager``, which ``make install`` installs when root): a firing alert is listed
by Alertmanager's own API with our labels, annotations, ``startsAt`` and ``generatorURL``; an
acknowledged one stays active; the resolve flip ends it (``endsAt``). Found by an operator: the
``alertmanager`` kind sent Alertmanager's outgoing webhook body, which a real Alertmanager's
``POST /api/v2/alerts`` refuses with 400. Without the binary, every body is checked against the
``postableAlerts`` schema of Alertmanager's OpenAPI document, written down below from that
document (the ``webhook`` body kind is tested in ``test_receivers.py``)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import httpx
import pytest
from jsonschema import Draft202012Validator

from recoverydash.alerts.delivery import TRANSPORTS
from recoverydash.alerts.transports import TransportError

BINARY = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
RUN_URL = "https://recoverydash.example/p/alpha/runs/llama-70b/"

#: ``postableAlerts`` of https://github.com/prometheus/alertmanager/blob/main/api/v2/openapi.yaml
#: (v0.25-0.28): an array of objects with ``labels`` (required: a map of strings, names as the
#: data model allows), ``annotations`` (a map of strings), ``startsAt`` / ``endsAt`` (date-time)
#: and ``generatorURL`` (uri).
POSTABLE_ALERTS = {
    "type": "array", "items": {
        "type": "object", "required": ["labels"], "additionalProperties": False,
        "properties": {
            "labels": {"type": "object", "minProperties": 1,
                       "propertyNames": {"pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"},
                       "additionalProperties": {"type": "string", "minLength": 1}},
            "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
            "startsAt": {"type": "string", "format": "date-time"},
            "endsAt": {"type": "string", "format": "date-time"},
            "generatorURL": {"type": "string", "format": "uri"},
        }}}


def payload(status: str, subject: str = "u000000042-a0", **alert) -> dict:
    opened = datetime.now(UTC) - timedelta(minutes=5)
    return {
        "version": "1", "status": status, "change": None,
        "alert": {"id": "al_7", "rule": "generation_rejected", "severity": "critical",
                  "state": status, "opened_at": opened.isoformat(),
                  "resolved_at": (datetime.now(UTC).isoformat()
                                  if status == "resolved" else None),
                  "summary": f"Generation {subject} is rejected: shard_missing.",
                  "subject": subject, "subjects": [subject],
                  "url": "https://recoverydash.example/alerts/7/", "runbook_url": None,
                  **alert},
        "run": {"run_id": "llama-70b", "project": "alpha", "health": "at_risk", "url": RUN_URL},
        "dedup_key": "llama-70b:generation_rejected:",
    }


def transport(url: str):
    endpoint = SimpleNamespace(kind="alertmanager_api", url=url, name="am", routing_key="",
                               secret="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    return TRANSPORTS["alertmanager_api"](endpoint)


@pytest.mark.parametrize("status", ["firing", "acknowledged", "resolved"])
def test_every_body_is_a_list_of_postable_alerts(status):
    body = transport("https://am.example:9093").body(payload(status))
    errors = list(Draft202012Validator(POSTABLE_ALERTS,
                                       format_checker=Draft202012Validator.FORMAT_CHECKER)
                  .iter_errors(body))
    assert not errors, [e.message for e in errors]
    (alert,) = body
    assert alert["labels"] == {"alertname": "generation_rejected", "severity": "critical",
                               "project": "alpha", "run_id": "llama-70b",
                               "subject": "u000000042-a0"}
    assert alert["generatorURL"] == RUN_URL
    assert alert["annotations"]["state"] == status
    ends = datetime.fromisoformat(alert["endsAt"].replace("Z", "+00:00"))
    if status == "resolved":  # resolution is endsAt: the moment it was resolved
        assert ends <= datetime.now(UTC)
    else:  # held open a week: Alertmanager's resolve_timeout would end it in 5 minutes
        assert ends - datetime.now(UTC) > timedelta(days=6, hours=23)


def test_the_url_is_the_alertmanagers_base_or_its_alerts_path():
    assert transport("http://am:9093").url({}) == "http://am:9093/api/v2/alerts"
    assert transport("https://h/alertmanager/").url({}) == "https://h/alertmanager/api/v2/alerts"
    assert transport("http://am:9093/api/v2/alerts").url({}) == "http://am:9093/api/v2/alerts"


def test_an_alert_without_a_subject_has_no_empty_label():
    (alert,) = transport("http://am:9093").body(payload("firing", subject=""))
    assert "subject" not in alert["labels"] and all(alert["labels"].values())


# --- against a real Alertmanager -------------------------------------------------------------
@pytest.fixture
def alertmanager(tmp_path):
    if BINARY is None:
        pytest.skip("no Alertmanager binary (Debian: apt-get install prometheus-alertmanager)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "alertmanager.yml"
    config.write_text("route:\n  receiver: none\n  group_wait: 1h\nreceivers:\n  - name: none\n")
    log = (tmp_path / "alertmanager.log").open("wb")
    proc = subprocess.Popen([BINARY, f"--config.file={config}",
                             f"--storage.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}",
                             "--cluster.listen-address="], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, \
                (tmp_path / "alertmanager.log").read_text()[-2000:]
            time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        proc.wait(10)


def listed(base: str, **params) -> list[dict]:
    return [a for a in httpx.get(f"{base}/api/v2/alerts", params=params, timeout=5).json()
            if a["labels"].get("run_id") == "llama-70b"]


def test_a_real_alertmanager_lists_the_pushed_alert_and_ends_it_on_resolve(alertmanager,
                                                                        settings):
    settings.RECOVERYDASH_WEBHOOK_ALLOW_PRIVATE = True
    am = transport(alertmanager)
    assert am.send(payload("firing"), "msg_1") == 200
    (alert,) = listed(alertmanager)
    assert alert["status"]["state"] == "active"
    assert alert["labels"] == {"alertname": "generation_rejected", "severity": "critical",
                               "project": "alpha", "run_id": "llama-70b",
                               "subject": "u000000042-a0"}
    assert alert["annotations"]["summary"] == \
        "Generation u000000042-a0 is rejected: shard_missing."
    assert alert["generatorURL"] == RUN_URL
    assert alert["annotations"]["alert_url"] == "https://recoverydash.example/alerts/7/"

    assert am.send(payload("acknowledged"), "msg_2") == 200
    (alert,) = listed(alertmanager)  # the same alert (same labels), still active
    assert alert["status"]["state"] == "active"
    assert alert["annotations"]["state"] == "acknowledged"

    assert am.send(payload("resolved"), "msg_3") == 200
    assert listed(alertmanager, active="true") == []


def test_a_real_alertmanager_refuses_the_outgoing_webhook_body_for_good(alertmanager, settings):
    """What the ``alertmanager`` kind sends is the body Alertmanager sends out, not one it
    takes: pointed at a real Alertmanager, that delivery fails permanently."""
    settings.RECOVERYDASH_WEBHOOK_ALLOW_PRIVATE = True
    endpoint = SimpleNamespace(kind="alertmanager", url=f"{alertmanager}/api/v2/alerts",
                               name="am", routing_key="",
                               secret="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
    with pytest.raises(TransportError) as refused:
        TRANSPORTS["alertmanager"](endpoint).send(payload("firing"), "msg_4")
    assert refused.value.status_code in (400, 422) and refused.value.permanent
