"""The admin API (docs/ingest-v1.md#8-the-admin-api) and ``manage.py apply_config``: a project's
webhook endpoints, storage locations, run contracts and alerts managed by a script or a file in
git, with the dashboard's checks, only within the token's project, and idempotent."""

from __future__ import annotations

import json
import textwrap

import pytest
from django.core.management import CommandError, call_command
from ingest_support import event, post

from recoverydash.alerts.models import Alert, AlertFlip, WebhookEndpoint
from recoverydash.runs.models import ApiToken, Project, Run
from recoverydash.storage.models import StorageLocation

PUBLIC_URL = "https://93.184.215.14/hooks/recoverydash"  # a public address literal: no DNS
PD_KEY = "0123456789abcdef0123456789ABCDEF"


def _admin(project, name="ci"):
    return ApiToken.issue(project, ["admin"], name=name)[1]


def _call(client, method, path, token, body=None):
    kwargs = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    if body is not None:
        kwargs.update(data=json.dumps(body), content_type="application/json")
    response = getattr(client, method)(f"/api/v1{path}", **kwargs)
    return response.status_code, response.json()


@pytest.fixture
def admin_token(project):
    return _admin(project)


@pytest.fixture
def run(client, project, ingest_token):
    status = post(client, ingest_token, [event("attempt_started", "a0", world_size=2,
                                               dataset_version="d1")]).status_code
    assert status == 202
    return Run.objects.get(project=project, run_id="run-1")


def test_it_needs_a_token_of_scope_admin(client, full_token):
    status, body = _call(client, "get", "/webhooks", full_token)
    assert status == 403 and body["error"] == "forbidden"
    assert "admin" in body["errors"][0]["message"]


def test_it_creates_an_endpoint_then_reports_the_same_body_unchanged(client, project,
                                                                   admin_token):
    spec = {"name": "oncall", "kind": "pagerduty", "url": PUBLIC_URL, "routing_key": PD_KEY,
            "min_severity": "critical"}
    status, body = _call(client, "post", "/webhooks", admin_token, spec)
    assert status == 201
    assert body["change"] == {"kind": "webhook", "key": "oncall", "action": "create",
                              "fields": ["kind", "min_severity", "name", "routing_key", "url"],
                              "warning": ""}
    assert body["webhook"]["routing_key_set"] is True and "secret" not in body["webhook"]
    assert "routing_key" not in body["webhook"]
    status, again = _call(client, "post", "/webhooks", admin_token, spec)
    assert status == 200 and again["change"]["action"] == "unchanged"
    status, changed = _call(client, "post", "/webhooks", admin_token,
                            {"name": "oncall", "min_severity": "warning"})
    assert status == 200 and changed["change"]["action"] == "update"
    assert changed["change"]["fields"] == ["min_severity"]
    endpoint = WebhookEndpoint.objects.get(project=project, name="oncall")
    assert (endpoint.min_severity, endpoint.routing_key, endpoint.url) == ("warning", PD_KEY,
                                                                          PUBLIC_URL)


def test_it_refuses_an_endpoint_the_delivery_guard_or_its_receiver_would_refuse(
        client, project, admin_token):
    status, body = _call(client, "post", "/webhooks", admin_token,
                         {"name": "x", "url": "http://127.0.0.1:9/hook", "kind": "pagerduty",
                          "routing_key": "short"})
    assert status == 400
    paths = {e["path"] for e in body["errors"]}
    assert paths == {"url", "routing_key"}
    url_message = next(e["message"] for e in body["errors"] if e["path"] == "url")
    assert "RECOVERYDASH_WEBHOOK_ALLOW_PRIVATE" in url_message
    assert not WebhookEndpoint.objects.filter(project=project).exists()


def test_it_sets_a_given_signing_secret_and_never_shows_it(client, project, admin_token):
    secret = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    status, body = _call(client, "post", "/webhooks", admin_token,
                         {"name": "std", "url": PUBLIC_URL, "secret": secret})
    assert status == 201 and secret not in json.dumps(body)
    assert WebhookEndpoint.objects.get(project=project, name="std").secret == secret
    status, body = _call(client, "post", "/webhooks", admin_token,
                         {"name": "std", "secret": "not-a-secret"})
    assert status == 400 and body["errors"][0]["path"] == "secret"


def test_it_keeps_each_project_to_its_own_endpoints_alerts_and_runs(client, project,
                                                                    other_project, run):
    WebhookEndpoint.objects.create(project=project, name="mine", url=PUBLIC_URL)
    alert = Alert.objects.create(run=run, rule="checkpoint_stale", dedup_key="run-1:cs",
                                 severity="warning", summary="stale")
    other = _admin(other_project)
    assert _call(client, "get", "/webhooks", other) == (200, [])
    assert _call(client, "get", "/webhooks/mine", other)[0] == 404
    assert _call(client, "delete", "/webhooks/mine", other)[0] == 404
    assert _call(client, "get", "/alerts", other) == (200, [])
    assert _call(client, "post", f"/alerts/{alert.pk}/resolve", other)[0] == 404
    assert _call(client, "get", "/runs/run-1/contract", other)[0] == 404
    assert _call(client, "put", "/runs/run-1/contract", other,
                 {"max_replay_samples": 5})[0] == 404
    alert.refresh_from_db()
    assert alert.state == "firing" and WebhookEndpoint.objects.filter(name="mine").exists()


def test_it_declares_changes_and_deletes_a_storage_location(client, project, admin_token):
    status, body = _call(client, "post", "/locations", admin_token,
                         {"url": "s3://ckpt/runs/", "trainer_url": "file:///mnt/ckpt",
                          "access_key_id": "AKIA", "secret_access_key": "s"})
    assert status == 201 and body["change"]["action"] == "create"
    assert body["location"]["url"] == "s3://ckpt/runs"  # canonical, no trailing /
    assert body["location"]["origin"] == "api"
    status, body = _call(client, "post", "/locations", admin_token,
                         {"url": "s3://ckpt/runs", "discover": False})
    assert status == 200 and body["change"]["fields"] == ["discover"]
    location = StorageLocation.objects.get(project=project)
    assert (location.trainer_url, location.discover) == ("file:///mnt/ckpt", False)
    status, body = _call(client, "delete", f"/locations/{location.pk}", admin_token)
    assert status == 200 and body["action"] == "delete"
    assert not StorageLocation.objects.filter(project=project).exists()


def test_it_refuses_a_location_that_would_expose_the_server(client, project, admin_token):
    status, body = _call(client, "post", "/locations", admin_token, {"url": "file:///"})
    assert status == 400 and body["errors"][0]["path"] == "url"
    status, body = _call(client, "post", "/locations", admin_token, {"url": "ftp://x/y"})
    assert status == 400 and "file:///" in body["errors"][0]["message"]
    assert not StorageLocation.objects.filter(project=project).exists()


def test_it_edits_a_run_contract_and_shows_the_effective_one(client, run, admin_token):
    status, body = _call(client, "put", "/runs/run-1/contract", admin_token,
                         {"max_checkpoint_age_s": 0, "required_components": ["model", "rng"]})
    assert status == 200
    assert body["change"]["fields"] == ["max_checkpoint_age_s", "required_components"]
    assert body["contract"]["effective"] == {"max_replay_samples": 0,
                                             "max_omission_samples": 0,
                                             "required_components": ["model", "rng"],
                                             "max_checkpoint_age_s": 0}
    run.refresh_from_db()
    assert run.contract == {"max_checkpoint_age_s": 0, "required_components": ["model", "rng"]}
    status, body = _call(client, "put", "/runs/run-1/contract", admin_token,
                         {"max_replay_samples": -1})
    assert status == 400 and body["errors"][0]["path"] == "max_replay_samples"
    assert _call(client, "put", "/runs/run-1/contract", admin_token,
                 {"max_checkpoint_age_s": 0})[1]["change"]["action"] == "unchanged"


def test_it_acknowledges_silences_and_resolves_an_alert_saying_which_token(client, run,
                                                                          admin_token):
    alert = Alert.objects.create(run=run, rule="restart_replay", subject="1",
                                 dedup_key="run-1:restart_replay:1", severity="critical",
                                 summary="Attempt 1 replayed 64 positions")
    status, body = _call(client, "get", "/alerts", admin_token)
    assert status == 200 and [a["id"] for a in body] == [alert.pk]
    status, body = _call(client, "post", f"/alerts/{alert.pk}/acknowledge", admin_token)
    assert status == 200 and body["changed"] is True
    assert (body["alert"]["state"], body["alert"]["acknowledged_by"]) == ("acknowledged",
                                                                         "token ci")
    assert _call(client, "post", f"/alerts/{alert.pk}/acknowledge",
                 admin_token)[1]["changed"] is False
    status, body = _call(client, "post", f"/alerts/{alert.pk}/silence", admin_token,
                         {"seconds": 3600})
    assert status == 200 and body["alert"]["silenced_until"] is not None
    assert _call(client, "post", f"/alerts/{alert.pk}/silence", admin_token,
                 {"seconds": -5})[0] == 400
    status, body = _call(client, "post", f"/alerts/{alert.pk}/resolve", admin_token)
    assert body["alert"]["state"] == "resolved" and body["alert"]["resolved_by"] == "token ci"
    flips = list(AlertFlip.objects.filter(alert=alert).order_by("pk")
                 .values_list("new_state", "reason"))
    assert flips == [("acknowledged", "acknowledged by token ci"),
                     ("resolved", "resolved by token ci")]
    assert _call(client, "get", "/alerts?state=resolved", admin_token)[1][0]["id"] == alert.pk
    assert _call(client, "get", "/alerts", admin_token)[1] == []


def test_it_describes_every_admin_path_in_the_openapi_document(client):
    paths = client.get("/api/v1/openapi.json").json()["paths"]
    for path in ("/api/v1/webhooks", "/api/v1/webhooks/{name}", "/api/v1/locations",
                 "/api/v1/locations/{location_id}", "/api/v1/runs/{run_id}/contract",
                 "/api/v1/alerts", "/api/v1/alerts/{alert_id}/acknowledge",
                 "/api/v1/alerts/{alert_id}/resolve", "/api/v1/alerts/{alert_id}/silence"):
        assert path in paths, path


# --- manage.py apply_config ----------------------------------------------------------------------
def _config(tmp_path, folder, extra_webhook=""):
    path = tmp_path / "recoverydash.yml"
    path.write_text(textwrap.dedent(f"""\
        projects:
          - name: alpha
            webhooks:
              - name: oncall
                kind: pagerduty
                url: {PUBLIC_URL}
                routing_key: ${{RD_TEST_PD_KEY}}
                min_severity: critical
              {extra_webhook}
            locations:
              - url: {folder.as_uri()}
                trainer_url: file:///mnt/ckpt
            contracts:
              run-1:
                max_checkpoint_age_s: 1800
              run-not-yet:
                max_replay_samples: 3
        """))
    return path


def _state(project):
    hooks = list(WebhookEndpoint.objects.filter(project=project).order_by("name").values(
        "name", "kind", "url", "routing_key", "min_severity", "secret", "enabled"))
    locations = list(StorageLocation.objects.filter(project=project).values(
        "url", "trainer_url", "discover", "origin"))
    return hooks, locations, dict(Run.objects.filter(project=project)
                                  .values_list("run_id", "contract"))


def _apply(path, *args):
    import io

    out = io.StringIO()
    call_command("apply_config", str(path), *args, stdout=out)
    return out.getvalue().splitlines()


def test_it_applies_a_config_file_and_the_second_time_changes_nothing(
        project, run, tmp_path, monkeypatch):
    monkeypatch.setenv("RD_TEST_PD_KEY", PD_KEY)
    folder = tmp_path / "ckpt"
    folder.mkdir()
    path = _config(tmp_path, folder)
    first = _apply(path)
    assert first == [
        "create webhook 'oncall'",
        f"create location '{folder.as_uri()}'",
        "update contract 'run-1': max_checkpoint_age_s",
        "skipped contract 'run-not-yet' (warning: no such run yet: applied once it exists)",
        "4 items, changed 3",
    ]
    state = _state(project)
    assert state[0][0]["routing_key"] == PD_KEY and state[1][0]["origin"] == "config"
    assert state[2]["run-1"]["max_checkpoint_age_s"] == 1800
    second = _apply(path)
    assert second[-1] == "4 items, changed 0"
    assert [line.split(" ")[0] for line in second[:-1]] == ["unchanged", "unchanged",
                                                          "unchanged", "skipped"]
    assert _state(project) == state


def test_it_dry_runs_without_writing_and_prunes_what_the_file_does_not_name(
        project, run, tmp_path, monkeypatch):
    monkeypatch.setenv("RD_TEST_PD_KEY", PD_KEY)
    folder = tmp_path / "ckpt"
    folder.mkdir()
    WebhookEndpoint.objects.create(project=project, name="old", url=PUBLIC_URL)
    path = _config(tmp_path, folder)
    before = _state(project)
    lines = _apply(path, "--dry-run", "--prune")
    assert "would create webhook 'oncall'" in lines and "would delete webhook 'old'" in lines
    assert lines[-1] == "5 items, would change 4"
    assert _state(project) == before
    _apply(path, "--prune")
    assert [h["name"] for h in _state(project)[0]] == ["oncall"]
    assert not Project.objects.filter(name="beta").exists()


def test_it_refuses_a_file_with_one_bad_item_and_writes_nothing(project, run, tmp_path,
                                                                monkeypatch):
    monkeypatch.setenv("RD_TEST_PD_KEY", PD_KEY)
    folder = tmp_path / "ckpt"
    folder.mkdir()
    path = _config(tmp_path, folder, extra_webhook="- {name: bad, url: 'http://10.0.0.1/x'}")
    before = _state(project)
    with pytest.raises(CommandError, match=r"project 'alpha', webhooks\[1\]: url:"):
        _apply(path)
    assert _state(project) == before
    monkeypatch.delenv("RD_TEST_PD_KEY")
    with pytest.raises(CommandError, match="RD_TEST_PD_KEY is not set"):
        _apply(_config(tmp_path, folder))


@pytest.mark.parametrize("name", ["../../etc", "..", ".hidden", "-x", "on call", "a/b", "x" * 101,
                                  "caf\u00e9", "%2e%2e"])
def test_it_refuses_an_endpoint_name_that_is_not_one_url_segment(client, project, admin_token,
                                                                  name):
    status, body = _call(client, "post", "/webhooks", admin_token,
                         {"name": name, "url": PUBLIC_URL})
    assert status == 400 and body["errors"][0]["path"] == "name", body
    assert "A-Z a-z 0-9 _ . - :" in body["errors"][0]["message"]
    assert not WebhookEndpoint.objects.filter(project=project).exists()


def test_it_still_reads_and_deletes_an_endpoint_named_before_names_were_checked(
        client, project, admin_token):
    WebhookEndpoint.objects.create(project=project, name="../../etc", url=PUBLIC_URL)
    status, body = _call(client, "get", "/webhooks/..%2F..%2Fetc", admin_token)
    assert status == 200 and body["name"] == "../../etc"
    status, body = _call(client, "delete", "/webhooks/..%2F..%2Fetc", admin_token)
    assert status == 200 and body["action"] == "delete"
    assert not WebhookEndpoint.objects.filter(project=project).exists()


def test_a_name_no_route_takes_is_a_json_404_not_a_page(client, admin_token):
    # schemathesis found it: a newline in {name} matches no route, and Django answered its page
    headers = {"HTTP_AUTHORIZATION": f"Bearer {admin_token}"}
    got = client.delete("/api/v1/webhooks/a%0Ab", **headers)
    assert got.status_code == 404 and got["Content-Type"] == "application/json"
    assert got.json() == {"error": "not_found", "errors": [{
        "index": None, "path": "",
        "message": "no API route matches '/api/v1/webhooks/a\\nb': see /api/v1/openapi.json "
                   "for the routes"}]}
    # outside the API a missing page is still the dashboard's page
    assert client.get("/no-such-page/")["Content-Type"].startswith("text/html")
