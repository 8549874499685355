"""Each receiver's body against its documented schema (``receiver_schemas.py``), with hostile
strings where a run id, a generation id or a summary comes from a trainer: Slack control
sequences, Markdown in Teams, a 400-character run id for PagerDuty and Opsgenie keys. Then the
save-time key checks, and every kind delivered end to end to a local receiver."""

from __future__ import annotations

import json
import re
from datetime import datetime
from types import SimpleNamespace

import pytest
from django import forms
from jsonschema import Draft202012Validator

from recoverydash.alerts.delivery import TRANSPORTS, deliver, process_flips, transport_for
from recoverydash.alerts.forms import clean_endpoint, clean_routing_key
from recoverydash.alerts.models import Alert, AlertFlip, WebhookEndpoint
from recoverydash.alerts.transports import TransportError, bounded_key
from recoverydash.runs.models import Run

from . import receiver_schemas as schemas

PING = "<!channel> *ping*"
# Every kind of trouble a trainer-controlled string can carry, padded to 400 characters.
HOSTILE_RUN_ID = ("<!channel> <!here> <@U024BE7LH> <https://evil.example|click> & *bold* "
                  "[click](https://evil.example) **x** _y_ `z` # h\n> quote ").ljust(400, "x")
ROUTING_KEY = "e93facc04764012d7bfb002500d5d1a6"
GENIE_KEY = "1b2c3d4e-aaaa-bbbb-cccc-0123456789ab"
RUN_URL = "https://recoverydash.example/runs/7/"


def validate(schema: dict, body: dict) -> None:
    errors = sorted(Draft202012Validator(schema).iter_errors(body), key=str)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors[:10])


def payload(status="firing", run_id=HOSTILE_RUN_ID, subject=PING, summary=None,
            severity="warning") -> dict:
    summary = summary or f"Generation {subject} (update 5) is rejected: shard_missing."
    return {
        "version": "1", "status": status,
        "alert": {"id": "al_7", "rule": "generation_rejected", "severity": severity,
                  "state": status, "opened_at": "2026-03-01T10:00:00+00:00",
                  "resolved_at": "2026-03-01T11:00:00+00:00" if status == "resolved" else None,
                  "summary": summary, "subject": subject},
        "run": {"run_id": run_id, "project": "alpha", "health": "at_risk", "url": RUN_URL},
        "dedup_key": f"{run_id}:generation_rejected:{subject}",
    }


def endpoint(kind: str, routing_key: str = "", name: str = "oncall") -> SimpleNamespace:
    return SimpleNamespace(kind=kind, url="https://receiver.example/hook", name=name,
                           routing_key=routing_key,
                           secret="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")


def body_of(kind: str, p: dict, routing_key: str = "") -> dict:
    return TRANSPORTS[kind](endpoint(kind, routing_key)).body(p)


def strings(value):
    """Every string inside a JSON value (keys excluded)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)


# --- Slack ---------------------------------------------------------------------------------------
def slack_texts(body: dict) -> list[str]:
    texts = [body["text"]]
    for block in body["blocks"]:
        texts += [block["text"]["text"]] if "text" in block else \
            [e["text"] for e in block["elements"]]
    return texts


def test_it_escapes_slack_control_characters_in_every_text_so_nothing_pings():
    for status in ("firing", "acknowledged", "resolved"):
        body = body_of("slack", payload(status))
        validate(schemas.SLACK, body)
        for text in slack_texts(body):
            # The one control sequence in a body is the link to the run page.
            assert re.findall(r"<[^>]*>", text) in ([], [f"<{RUN_URL}|Open the run>"]), text
            assert "<!" not in text and "<@" not in text
            assert not re.search(r"&(?!amp;|lt;|gt;)", text), text  # no bare ampersand
        section = body["blocks"][0]["text"]["text"]
        assert "&lt;!channel&gt; *ping*" in section
        assert "&lt;https://evil.example|click&gt;" in section
        assert body["text"].startswith(f"[{status.upper()}] warning generation_rejected on run "
                                       "&lt;!channel&gt; &lt;!here&gt;")


def test_it_cuts_slack_texts_to_their_limits_without_breaking_an_escape():
    body = body_of("slack", payload(summary="&" * 5000 + "<" * 5000))
    validate(schemas.SLACK, body)
    for text in slack_texts(body):
        assert not re.search(r"&(?!amp;|lt;|gt;)", text)
        assert "<" not in text.replace(f"<{RUN_URL}|Open the run>", "")
    assert body["blocks"][0]["text"]["text"].endswith("&amp;\u2026")


# --- PagerDuty -----------------------------------------------------------------------------------
def test_it_bounds_the_pagerduty_dedup_key_to_255_characters_the_same_on_every_flip():
    keys = set()
    for status in ("firing", "acknowledged", "resolved"):
        body = body_of("pagerduty", payload(status), ROUTING_KEY)
        validate(schemas.PAGERDUTY_TRIGGER if status == "firing" else
                 schemas.PAGERDUTY_FOLLOW_UP, body)
        keys.add(body["dedup_key"])
    [key] = keys
    long_key = payload()["dedup_key"]
    assert len(long_key) > 400 and len(key) == 255
    assert key == long_key[:190] + "~" + __import__("hashlib").sha256(
        long_key.encode()).hexdigest()
    # Two long keys that differ only at the end still differ.
    assert bounded_key(long_key + "1", 255) != bounded_key(long_key + "2", 255)
    short = body_of("pagerduty", payload(run_id="llama-70b"), ROUTING_KEY)
    assert short["dedup_key"] == "llama-70b:generation_rejected:" + PING


def test_it_sends_pagerduty_a_trigger_with_the_summary_within_1024_characters():
    body = body_of("pagerduty", payload(summary="s" * 3000), ROUTING_KEY)
    validate(schemas.PAGERDUTY_TRIGGER, body)
    assert body["routing_key"] == ROUTING_KEY
    assert len(body["payload"]["summary"]) == 1024
    assert body["payload"]["severity"] == "warning"
    assert body["payload"]["class"] == "generation_rejected"
    assert datetime.fromisoformat(body["payload"]["timestamp"]).utcoffset().total_seconds() == 0
    assert body["links"] == [{"href": RUN_URL, "text": "recoverydash run"}]


def test_it_never_sends_the_signing_secret_as_a_pagerduty_routing_key():
    transport = TRANSPORTS["pagerduty"](endpoint("pagerduty", routing_key=""))
    with pytest.raises(TransportError) as info:
        transport.body(payload())
    assert info.value.permanent and "no routing key" in info.value.message


def test_it_checks_routing_and_api_keys_when_an_endpoint_is_saved():
    assert clean_routing_key("pagerduty", f" {ROUTING_KEY} ") == ROUTING_KEY
    assert clean_routing_key("pagerduty", "R" + "0" * 31) == "R" + "0" * 31  # orchestration key
    for bad in ("", "R0UT1NG", ROUTING_KEY + "0", ROUTING_KEY[:-1] + "-",
                "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2La"):
        with pytest.raises(forms.ValidationError) as info:
            clean_routing_key("pagerduty", bad)
        assert "32 letters and digits" in info.value.messages[0]
    assert clean_routing_key("opsgenie", GENIE_KEY) == GENIE_KEY
    with pytest.raises(forms.ValidationError):
        clean_routing_key("opsgenie", ROUTING_KEY)
    with pytest.raises(forms.ValidationError) as info:
        clean_routing_key("slack", ROUTING_KEY)
    assert "uses none" in info.value.messages[0]
    assert clean_routing_key("slack", "") == ""
    with pytest.raises(forms.ValidationError):
        clean_routing_key("discord", "")


# --- Alertmanager --------------------------------------------------------------------------------
def test_it_shapes_an_alertmanager_version_4_body_with_a_stable_fingerprint():
    bodies = {s: body_of("alertmanager", payload(s)) for s in ("firing", "acknowledged",
                                                                "resolved")}
    for body in bodies.values():
        validate(schemas.ALERTMANAGER, body)
        [alert] = body["alerts"]
        assert alert["labels"] == {"alertname": "generation_rejected", "severity": "warning",
                                   "project": "alpha", "run_id": HOSTILE_RUN_ID,
                                   "subject": PING}
        assert body["commonLabels"] == alert["labels"]
        assert body["groupLabels"] == {k: alert["labels"][k]
                                       for k in ("alertname", "project", "run_id", "subject")}
        assert body["receiver"] == "oncall" and alert["generatorURL"] == RUN_URL
        assert body["groupKey"].startswith('{}:{alertname="generation_rejected", '
                                           'project="alpha", run_id="<!channel>')
    firing, acknowledged, resolved = bodies.values()
    assert firing["status"] == acknowledged["status"] == "firing"
    assert acknowledged["alerts"][0]["annotations"]["state"] == "acknowledged"
    assert firing["alerts"][0]["endsAt"] == "0001-01-01T00:00:00Z"
    assert firing["alerts"][0]["startsAt"] == "2026-03-01T10:00:00Z"
    assert resolved["status"] == "resolved"
    assert resolved["alerts"][0]["endsAt"] == "2026-03-01T11:00:00Z"
    # One fingerprint for every flip, also after the severity changed in between.
    critical = body_of("alertmanager", payload("resolved", severity="critical"))
    prints = {b["alerts"][0]["fingerprint"] for b in [*bodies.values(), critical]}
    assert len(prints) == 1 and re.fullmatch(r"[0-9a-f]{16}", prints.pop())


# --- Opsgenie ------------------------------------------------------------------------------------
def test_it_creates_and_closes_an_opsgenie_alert_under_a_bounded_alias():
    p = payload(summary="s" * 20000, subject=PING.ljust(200, "g"))  # a 621-character key
    transport = TRANSPORTS["opsgenie"](endpoint("opsgenie", GENIE_KEY))
    body = transport.body(p)
    validate(schemas.OPSGENIE_CREATE, body)
    assert sum(len(k) + len(v) for k, v in body["details"].items()) \
        <= schemas.OPSGENIE_DETAILS_LIMIT
    assert len(body["message"]) == 130 and len(body["alias"]) == 512
    assert body["priority"] == "P3"
    assert transport.url(p) == "https://receiver.example/hook"
    assert transport.headers("msg_1", "{}") == {"Authorization": f"GenieKey {GENIE_KEY}"}
    for status, action in (("acknowledged", "acknowledge"), ("resolved", "close")):
        follow = payload(status, summary="s" * 30000, subject=PING.ljust(200, "g"))
        validate(schemas.OPSGENIE_FOLLOW_UP, transport.body(follow))
        url = transport.url(follow)
        path, _, query = url.partition("?")
        assert query == "identifierType=alias"
        assert path.startswith("https://receiver.example/hook/") and path.endswith("/" + action)
        quoted = path.removeprefix("https://receiver.example/hook/").removesuffix("/" + action)
        assert "/" not in quoted and "<" not in quoted and " " not in quoted
        from urllib.parse import unquote

        assert unquote(quoted) == body["alias"]


# --- Microsoft Teams -----------------------------------------------------------------------------
def test_it_keeps_trainer_strings_out_of_markdown_in_the_teams_card():
    body = body_of("teams", payload(summary="**urgent** [login](https://evil.example) " * 200))
    validate(schemas.TEAMS, body)
    assert len(json.dumps(body).encode()) <= schemas.TEAMS_MAX_BYTES
    card = body["attachments"][0]["content"]
    markdown = [b["text"] for b in card["body"] if b["type"] == "TextBlock"]
    plain = [i["text"] for b in card["body"] if b["type"] == "RichTextBlock"
             for i in b["inlines"]]
    assert markdown == ["recoverydash: firing"]  # only the transport's own words
    assert any(t.startswith("**urgent** [login](https://evil.example)") for t in plain)
    assert any(t.startswith("<!channel> <!here>") for t in plain)
    assert card["actions"] == [{"type": "Action.OpenUrl", "title": "Open the run",
                                "url": RUN_URL}]
    assert "evil.example" not in json.dumps(card["actions"])


# --- every kind, end to end ----------------------------------------------------------------------
@pytest.mark.django_db
def test_it_delivers_every_kind_with_a_schema_valid_body(project, receiver):
    run = Run.objects.create(project=project, run_id="r" * 128)
    subject = (PING + " ").ljust(200, "g")
    keys = {"pagerduty": ROUTING_KEY, "opsgenie": GENIE_KEY}
    for kind in TRANSPORTS:
        WebhookEndpoint.objects.create(project=project, url=receiver.url, kind=kind, name=kind,
                                       routing_key=keys.get(kind, ""))
    alert = Alert.objects.create(run=run, rule="generation_rejected", subject=subject,
                                 dedup_key=f"{run.run_id}:generation_rejected:{subject}",
                                 severity="warning", summary=f"Generation {subject} rejected")
    AlertFlip.objects.create(alert=alert, new_state="firing", reason="test")
    for pk in process_flips():
        assert deliver(pk) == "delivered"
    alert.change_state("resolved", reason="cleared")
    for pk in process_flips():
        assert deliver(pk) == "delivered"
    seen = {}
    for request in receiver.requests:
        body = json.loads(request["body"])
        kind = next(k for k in TRANSPORTS if k == _kind_of(body, request))
        seen.setdefault(kind, []).append((request["path"], body))
    assert sorted(seen) == sorted(TRANSPORTS) and all(len(v) == 2 for v in seen.values())
    validate(schemas.SLACK, seen["slack"][0][1])
    validate(schemas.PAGERDUTY_TRIGGER, seen["pagerduty"][0][1])
    validate(schemas.PAGERDUTY_FOLLOW_UP, seen["pagerduty"][1][1])
    assert len(alert.dedup_key) == 128 + len(":generation_rejected:") + 200
    assert seen["pagerduty"][1][1]["dedup_key"] == seen["pagerduty"][0][1]["dedup_key"] \
        == bounded_key(alert.dedup_key, 255)
    validate(schemas.ALERTMANAGER, seen["alertmanager"][0][1])
    validate(schemas.OPSGENIE_CREATE, seen["opsgenie"][0][1])
    assert seen["opsgenie"][0][0] == "/hook"
    assert seen["opsgenie"][1][0].endswith("/close?identifierType=alias")
    validate(schemas.TEAMS, seen["teams"][0][1])
    assert seen["standard"][0][1]["alert"]["subject"] == subject
    assert seen["standard"][0][1]["run"]["project"] == project.name
    assert all(PING not in text for text in strings(seen["slack"][0][1]))


def _kind_of(body, request: dict) -> str:
    if isinstance(body, list):  # postableAlerts (test_alertmanager_api.py checks the rest)
        assert request["path"].endswith("/api/v2/alerts")
        return "alertmanager_api"
    if body.get("type") == "message":
        return "teams"
    if body.get("version") == "4":
        return "alertmanager"
    if "routing_key" in body:
        return "pagerduty"
    if "blocks" in body:
        return "slack"
    if request["headers"].get("Authorization", "").startswith("GenieKey "):
        return "opsgenie"
    return "standard"


@pytest.mark.django_db
def test_it_refuses_an_endpoint_whose_key_or_name_its_project_cannot_take(project, settings):
    settings.RECOVERYDASH_WEBHOOK_ALLOW_PRIVATE = True
    WebhookEndpoint.objects.create(project=project, url="https://a.example/", name="pager")
    with pytest.raises(forms.ValidationError) as info:
        clean_endpoint(project, {"name": "pager", "kind": "pagerduty",
                                 "url": "http://127.0.0.1/x", "routing_key": "short"})
    assert set(info.value.message_dict) == {"name", "routing_key"}
    values, warning = clean_endpoint(project, {"name": "pd", "kind": "pagerduty",
                                               "url": "http://127.0.0.1/x",
                                               "routing_key": ROUTING_KEY})
    assert values["routing_key"] == ROUTING_KEY and warning == ""
    assert transport_for(WebhookEndpoint(kind="teams")).__class__.__name__ == "TeamsTransport"
