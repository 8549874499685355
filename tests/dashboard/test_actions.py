"""What people change from the dashboard: alert states, silences, tokens, webhooks, contracts."""

from __future__ import annotations

import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.urls import reverse
from django.utils import timezone

from recoverydash.alerts.models import AlertFlip, WebhookEndpoint
from recoverydash.runs.models import ApiToken

pytestmark = pytest.mark.django_db


def test_acknowledging_an_alert_records_who_and_a_flip(owner_client, known_run):
    alert = known_run.alerts.get()
    url = reverse("alert_action", args=[alert.pk, "acknowledge"])
    run_url = reverse("run", args=[known_run.project.name, known_run.run_id])
    response = owner_client.post(url, {"next": run_url})
    assert response.status_code == 302 and response["Location"] == run_url
    alert.refresh_from_db()
    assert (alert.state, alert.acknowledged_by) == ("acknowledged", "olivia")
    flip = AlertFlip.objects.get(alert=alert)
    assert (flip.old_state, flip.new_state) == ("firing", "acknowledged")
    page = owner_client.get(reverse("alerts"), {"state": "acknowledged"}).content.decode()
    assert "acknowledged by olivia" in page


def test_resolving_an_alert_moves_it_to_the_resolved_list(owner_client, known_run):
    alert = known_run.alerts.get()
    owner_client.post(reverse("alert_action", args=[alert.pk, "resolve"]))
    alert.refresh_from_db()
    assert (alert.state, alert.resolved_by) == ("resolved", "olivia")
    assert owner_client.get(reverse("alerts")).context["alerts"] == []
    assert [a.pk for a in owner_client.get(reverse("alerts"), {"state": "resolved"})
            .context["alerts"]] == [alert.pk]
    # a resolved alert cannot be acknowledged again
    owner_client.post(reverse("alert_action", args=[alert.pk, "acknowledge"]))
    alert.refresh_from_db()
    assert alert.state == "resolved"


def test_silencing_mutes_notifications_for_the_chosen_duration(owner_client, known_run):
    alert = known_run.alerts.get()
    before = timezone.now()
    owner_client.post(reverse("alert_action", args=[alert.pk, "silence"]), {"seconds": 3600})
    alert.refresh_from_db()
    assert alert.state == "firing"
    assert before + timedelta(seconds=3590) < alert.silenced_until \
        < before + timedelta(seconds=3610)
    # acknowledging while silenced records the flip without notifying
    owner_client.post(reverse("alert_action", args=[alert.pk, "acknowledge"]))
    assert AlertFlip.objects.get(alert=alert).notify is False


def test_alert_actions_need_post_and_a_csrf_token(client, owner, known_run):
    from django.test import Client

    alert = known_run.alerts.get()
    client.force_login(owner)
    assert client.get(reverse("alert_action", args=[alert.pk, "resolve"])).status_code == 405
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(owner)
    assert strict.post(reverse("alert_action", args=[alert.pk, "resolve"])).status_code == 403
    alert.refresh_from_db()
    assert alert.state == "firing"


def test_it_creates_a_token_post_redirect_get_and_shows_it_once(owner_client, project):
    url = reverse("token_create", args=[project.pk])
    posted = owner_client.post(url, {"name": "trainer", "scopes": ["ingest"]})
    assert posted.status_code == 302
    assert posted["Location"] == reverse("project", args=[project.pk]) + "#new-token"
    response = owner_client.get(reverse("project", args=[project.pk]))
    raw = response.context["new_token"]
    assert raw.startswith("rdt_") and raw in response.content.decode()
    assert 'data-copy="#new-token"' in response.content.decode()
    assert response["Cache-Control"] == "no-store"
    row = ApiToken.authenticate(raw)
    assert row.project == project and row.scopes == ["ingest"] and row.name == "trainer"
    again = owner_client.get(reverse("project", args=[project.pk])).content.decode()
    assert raw not in again and row.prefix in again  # a reload: shown no more, nothing created
    assert ApiToken.objects.filter(project=project).count() == 1


def test_revoking_a_token_makes_it_unusable(owner_client, project):
    row, raw = ApiToken.issue(project, ["ingest", "read"], name="old")
    owner_client.post(reverse("token_revoke", args=[project.pk, row.pk]))
    assert ApiToken.authenticate(raw) is None
    assert "revoked" in owner_client.get(reverse("project", args=[project.pk])).content.decode()


def test_a_token_needs_a_scope(owner_client, project):
    response = owner_client.post(reverse("token_create", args=[project.pk]), {"name": "x"})
    assert response.status_code == 200 and "new_token" not in response.context
    assert ApiToken.objects.count() == 0


def test_members_edit_the_run_contract(owner_client, known_run):
    url = reverse("run_contract", args=[known_run.project.name, known_run.run_id])
    page = owner_client.get(url).content.decode()
    assert "the latest one wins" in page and 'value="3600' in page
    response = owner_client.post(url, {"max_replay_samples": 64, "max_omission_samples": 0,
                                       "max_checkpoint_age_s": 7200,
                                       "required_components": "model, optimizer, rng"})
    assert response.status_code == 302
    known_run.refresh_from_db()
    assert known_run.contract == {"max_replay_samples": 64, "max_omission_samples": 0,
                                  "max_checkpoint_age_s": 7200.0,
                                  "required_components": ["model", "optimizer", "rng"]}
    assert "of 2h 00m" in owner_client.get("/").content.decode()


def test_a_contract_with_a_negative_limit_is_refused(owner_client, known_run):
    url = reverse("run_contract", args=[known_run.project.name, known_run.run_id])
    response = owner_client.post(url, {"max_replay_samples": -1, "max_omission_samples": 0,
                                       "max_checkpoint_age_s": 60, "required_components": "model"})
    assert response.status_code == 200 and "greater than or equal to 0" in response.content.decode()
    known_run.refresh_from_db()
    assert known_run.contract == {"max_checkpoint_age_s": 3600}


def test_webhook_endpoints_are_created_tested_and_deleted(owner_client, project, settings):
    settings.RECOVERYDASH_WEBHOOK_ALLOW_PRIVATE = True
    settings.CELERY_TASK_ALWAYS_EAGER = True  # the worker's part runs here, at once
    received, answers = [], [204, 500]

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            received.append(dict(self.headers))
            self.send_response(answers.pop(0))
            body = b"boom" if received and len(received) == 2 else b""
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    try:
        owner_client.post(reverse("webhook_create", args=[project.pk]),
                          {"name": "ops", "url": url, "kind": "standard",
                           "min_severity": "warning"})
        endpoint = WebhookEndpoint.objects.get(project=project)
        assert endpoint.secret.startswith("whsec_")

        page = owner_client.post(reverse("webhook_test", args=[project.pk, endpoint.pk]),
                                 follow=True).content.decode()
        endpoint.refresh_from_db()
        assert f"Test notification {endpoint.test_webhook_id} queued" in page
        assert "✔ delivered</span> the receiver answered HTTP 204" in page
        assert received[0]["webhook-signature"].startswith("v1,")
        assert received[0]["webhook-id"] == endpoint.test_webhook_id

        page = owner_client.post(reverse("webhook_test", args=[project.pk, endpoint.pk]),
                                 follow=True).content.decode()
        assert "✖ failed</span> HTTP 500: boom" in page
        endpoint.refresh_from_db()
        assert endpoint.last_error == "HTTP 500: boom" and endpoint.enabled
    finally:
        server.shutdown()
        server.server_close()

    owner_client.post(reverse("webhook_delete", args=[project.pk, endpoint.pk]))
    assert not WebhookEndpoint.objects.filter(project=project).exists()


def test_a_pagerduty_endpoint_needs_its_routing_key(owner_client, project):
    for key in ("", "R0UT1NG"):
        response = owner_client.post(reverse("webhook_create", args=[project.pk]),
                                     {"url": "https://events.pagerduty.com/v2/enqueue",
                                      "kind": "pagerduty", "min_severity": "critical",
                                      "routing_key": key})
        assert "routing key (32 letters and digits)" in response.content.decode()
    assert not WebhookEndpoint.objects.exists()


def test_an_endpoint_name_is_taken_once_per_project(owner_client, project):
    WebhookEndpoint.objects.create(project=project, name="ops", url="https://a.example/")
    response = owner_client.post(reverse("webhook_create", args=[project.pk]),
                                 {"name": "ops", "url": "https://b.example/", "kind": "teams",
                                  "min_severity": "info"})
    assert "expected a name no other endpoint" in response.content.decode()
    assert WebhookEndpoint.objects.count() == 1
