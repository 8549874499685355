"""The table "Who may change what" of docs/ingest-v1.md, walked through both surfaces: each row is
tried by a staff account (the operator) and a member on the dashboard, and by an admin token of
the project on the admin API, and each must do exactly what the table says: ``yes`` changes the
stored object, ``no`` leaves it as it was, ``no route`` finds no way to ask. Any member can issue
an admin token, so the token's column must equal the member's wherever both have a route.
Found by an attacker: an admin token deleted the operator's ``file://`` location and rewrote its
``trainer_url``, both refused to the same member on the dashboard."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse

from recoverydash.alerts.models import Alert, RuleRunbook, WebhookEndpoint
from recoverydash.runs.models import ApiToken, Membership, Run
from recoverydash.storage.models import StorageLocation

DOC = Path(__file__).resolve().parents[2] / "docs" / "ingest-v1.md"
PUBLIC_URL = "https://93.184.215.14/hooks/recoverydash"  # a public address literal: no DNS
NO_ROUTE = "no route"
ACTORS = ("operator", "member", "token")


def table() -> dict[str, dict[str, str]]:
    """``{case: {actor: "yes" | "no" | "no route"}}`` from the doc's table."""
    text = DOC.read_text()
    section = text[text.index("### Who may change what"):]
    section = section[:section.index("\n\n", section.index("| case |"))]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = dict(zip(ACTORS, cells[3:], strict=True))
    return rows


TABLE = table()


class World:
    """One project with a run, an alert, a project's and two operator's locations, an endpoint;
    a staff account and a member on the dashboard, and an admin token."""

    def __init__(self, project, django_user_model, tmp_path):
        self.project = project
        self.tmp = tmp_path
        self.clients = {}
        for name, staff in (("operator", True), ("member", False)):
            user = django_user_model.objects.create_user(name, password=None, is_staff=staff)
            Membership.objects.create(project=project, user=user)
            self.clients[name] = Client()
            self.clients[name].force_login(user)
        self.token = ApiToken.issue(project, ["admin"], name="member-issued")[1]
        self.run = Run.objects.create(project=project, run_id="run-1")
        self.alert = Alert.objects.create(run=self.run, rule="checkpoint_stale",
                                          dedup_key="run-1:checkpoint_stale:",
                                          severity="warning", summary="stale")
        self.endpoint = WebhookEndpoint.objects.create(project=project, name="oncall",
                                                       url=PUBLIC_URL)
        folder = tmp_path / "ckpt"
        folder.mkdir()
        self.folder_url = folder.resolve().as_uri()
        self.operator_file = StorageLocation.objects.create(
            project=project, url=self.folder_url, trainer_url="file:///mnt/ckpt",
            origin="command")
        self.operator_s3 = StorageLocation.objects.create(
            project=project, url="s3://ops-bucket/ckpt", access_key_id="AKIAOPS",
            secret_access_key="ops-secret", origin="command")
        self.team_s3 = StorageLocation.objects.create(
            project=project, url="s3://team-bucket/ckpt", access_key_id="AKIATEAM",
            secret_access_key="team-secret", origin="dashboard")

    # --- the two surfaces --------------------------------------------------------------------
    def api(self, method: str, path: str, body=None) -> int:
        kwargs = {"HTTP_AUTHORIZATION": f"Bearer {self.token}"}
        if body is not None:
            kwargs.update(data=json.dumps(body), content_type="application/json")
        return getattr(Client(), method)(f"/api/v1{path}", **kwargs).status_code

    def page(self, actor: str, path: str, data: dict | None = None) -> int:
        return self.clients[actor].post(path, data or {}).status_code

    def location_form(self, actor: str, location: StorageLocation, **changes) -> int:
        """The locations page's form for ``location`` as it is, with ``changes``: booleans
        as checkboxes (ticked when true), the secret left empty (the stored one is kept)."""
        fields = {"url": location.url, "trainer_url": location.trainer_url,
                  "run_id": location.run_id, "kind": location.kind, "format": location.format,
                  "endpoint_url": location.endpoint_url, "region": location.region,
                  "access_key_id": location.access_key_id, "secret_access_key": "",
                  "role_arn": location.role_arn, "external_id": location.external_id,
                  "use_ambient_credentials": location.use_ambient_credentials,
                  "discover": location.discover, "enabled": location.enabled, **changes}
        data = {k: ("on" if v is True else v) for k, v in fields.items() if v is not False}
        return self.page(actor, f"/projects/{self.project.pk}/locations/", data)

    def location(self, actor: str, body: dict) -> None:
        """Declare or change a location as ``actor``: the form for a new one built from
        ``body`` on the dashboard, the admin API's POST with ``body`` for the token."""
        if actor == "token":
            self.api("post", "/locations", body)
            return
        stored = StorageLocation.objects.filter(project=self.project, url=body["url"]).first()
        if stored is None:
            stored = StorageLocation(project=self.project, url=body["url"])
        extra = {k: v for k, v in body.items() if k != "url"}
        if "access_key_id" in extra and "secret_access_key" in extra:
            extra["secret_access_key"] = body["secret_access_key"]
        self.location_form(actor, stored, **extra)

    def delete_location(self, actor: str, location: StorageLocation) -> None:
        if actor == "token":
            self.api("delete", f"/locations/{location.pk}")
        else:
            self.page(actor, f"/projects/{self.project.pk}/locations/{location.pk}/delete/")


def _row(location: StorageLocation) -> dict | None:
    found = StorageLocation.objects.filter(pk=location.pk).values().first()
    return found and {k: v for k, v in found.items() if k not in ("last_listed_at",)}


def _changed(before, after) -> bool:
    return before != after


# --- one attempt per case: returns True (the change took), False (refused) or NO_ROUTE --------
def webhook_create(w: World, actor: str):
    spec = {"name": "new-hook", "url": PUBLIC_URL, "kind": "standard", "min_severity": "info"}
    if actor == "token":
        w.api("post", "/webhooks", spec)
    else:
        w.page(actor, f"/projects/{w.project.pk}/webhooks/", {**spec, "routing_key": ""})
    return WebhookEndpoint.objects.filter(project=w.project, name="new-hook").exists()


def webhook_update(w: World, actor: str):
    if actor != "token":
        # the dashboard has no form that changes an endpoint: neither URL answers a change
        codes = {w.clients[actor].post(f"/projects/{w.project.pk}/webhooks/{w.endpoint.pk}/",
                                       {"min_severity": "critical"}).status_code,
                 w.clients[actor].get(f"/projects/{w.project.pk}/webhooks/{w.endpoint.pk}/edit/")
                 .status_code}
        assert codes <= {404, 405}, codes
        return NO_ROUTE
    w.api("post", "/webhooks", {"name": "oncall", "min_severity": "critical"})
    return WebhookEndpoint.objects.get(pk=w.endpoint.pk).min_severity == "critical"


def webhook_delete(w: World, actor: str):
    if actor == "token":
        w.api("delete", "/webhooks/oncall")
    else:
        w.page(actor, f"/projects/{w.project.pk}/webhooks/{w.endpoint.pk}/delete/")
    return not WebhookEndpoint.objects.filter(pk=w.endpoint.pk).exists()


def location_create_s3(w: World, actor: str):
    w.location(actor, {"url": "s3://mine/ckpt", "access_key_id": "AKIAMINE",
                       "secret_access_key": "mine-secret", "region": "eu-west-1"})
    return StorageLocation.objects.filter(project=w.project, url="s3://mine/ckpt").exists()


def location_update_s3(w: World, actor: str):
    before = _row(w.team_s3)
    w.location(actor, {"url": w.team_s3.url, "trainer_url": "file:///mnt/team",
                       "discover": False})
    after = _row(w.team_s3)
    return _changed(before, after) and after["trainer_url"] == "file:///mnt/team"


def location_delete_s3(w: World, actor: str):
    w.delete_location(actor, w.team_s3)
    return _row(w.team_s3) is None


def location_create_file(w: World, actor: str):
    folder = w.tmp / "other"
    folder.mkdir()
    w.location(actor, {"url": folder.as_uri()})
    return StorageLocation.objects.filter(project=w.project, url=folder.as_uri()).exists()


def location_set_ambient(w: World, actor: str):
    w.location(actor, {"url": "s3://ambient/ckpt", "use_ambient_credentials": True})
    return StorageLocation.objects.filter(project=w.project, url="s3://ambient/ckpt").exists()


def location_set_endpoint(w: World, actor: str):
    w.location(actor, {"url": "s3://minio/ckpt", "endpoint_url": "https://minio.example.com",
                       "access_key_id": "AKIA", "secret_access_key": "s"})
    return StorageLocation.objects.filter(project=w.project, url="s3://minio/ckpt").exists()


def location_remap_operator(w: World, actor: str):
    before = _row(w.operator_file)
    w.location(actor, {"url": w.folder_url, "trainer_url": "file:"})
    w.location(actor, {"url": w.folder_url, "trainer_url": "file:///mnt/elsewhere"})
    return _changed(before, _row(w.operator_file))


def location_disable_operator(w: World, actor: str):
    w.location(actor, {"url": w.folder_url, "enabled": False})
    return _row(w.operator_file)["enabled"] is False


def location_delete_operator(w: World, actor: str):
    w.delete_location(actor, w.operator_file)
    return _row(w.operator_file) is None


def location_update_operator_s3(w: World, actor: str):
    before = _row(w.operator_s3)
    w.location(actor, {"url": w.operator_s3.url, "trainer_url": "file:///mnt/ops"})
    return _changed(before, _row(w.operator_s3))


def contract_update(w: World, actor: str):
    values = {"max_replay_samples": 7, "max_omission_samples": 3, "max_checkpoint_age_s": 900.0,
              "required_components": ["model"]}
    if actor == "token":
        w.api("put", "/runs/run-1/contract", values)
    else:
        w.page(actor, reverse("run_contract", args=[w.project.name, "run-1"]),
               {**values, "required_components": "model"})
    w.run.refresh_from_db()
    return (w.run.contract or {}).get("max_replay_samples") == 7


def _alert_action(w: World, actor: str, action: str, body: dict | None = None):
    if actor == "token":
        w.api("post", f"/alerts/{w.alert.pk}/{action}", body)
    else:
        w.page(actor, f"/alerts/{w.alert.pk}/{action}/", {"seconds": 3600} if body else None)
    return Alert.objects.get(pk=w.alert.pk)


def alert_acknowledge(w: World, actor: str):
    return _alert_action(w, actor, "acknowledge").state == "acknowledged"


def alert_resolve(w: World, actor: str):
    return _alert_action(w, actor, "resolve").state == "resolved"


def alert_silence(w: World, actor: str):
    return _alert_action(w, actor, "silence", {"seconds": 3600}).silenced_until is not None


def _no_api_route(w: World, *paths: str) -> str:
    for path in paths:
        for method in ("get", "post", "put"):
            assert w.api(method, path, {} if method != "get" else None) in (404, 405), path
    return NO_ROUTE


def runbook_set(w: World, actor: str):
    if actor == "token":
        return _no_api_route(w, "/runbooks", "/runbooks/checkpoint_stale")
    w.page(actor, f"/projects/{w.project.pk}/runbooks/",
           {"rule": "checkpoint_stale", "url": "https://wiki.example.com/stale"})
    return RuleRunbook.objects.filter(project=w.project, rule="checkpoint_stale").exists()


def token_issue(w: World, actor: str):
    if actor == "token":
        return _no_api_route(w, "/tokens")
    before = ApiToken.objects.filter(project=w.project).count()
    w.page(actor, f"/projects/{w.project.pk}/tokens/", {"name": "ci", "scopes": ["admin"]})
    return ApiToken.objects.filter(project=w.project).count() == before + 1


def token_revoke(w: World, actor: str):
    victim, _ = ApiToken.issue(w.project, ["read"], name="victim")
    if actor == "token":
        return _no_api_route(w, "/tokens", f"/tokens/{victim.pk}")
    w.page(actor, f"/projects/{w.project.pk}/tokens/{victim.pk}/revoke/")
    victim.refresh_from_db()
    return victim.revoked_at is not None


ATTEMPTS = {name.replace("_", ".", 1): fn for name, fn in list(globals().items())
            if callable(fn) and re.match(r"(webhook|location|contract|alert|runbook|token)_",
                                         name)}


def test_every_row_of_the_table_has_an_attempt_and_every_attempt_a_row():
    assert set(TABLE) == set(ATTEMPTS)
    assert len(TABLE) >= 20
    for case, row in TABLE.items():
        assert set(row.values()) <= {"yes", "no", NO_ROUTE}, (case, row)
        # a token may do what a member may, never more
        if NO_ROUTE not in (row["member"], row["token"]):
            assert row["member"] == row["token"], case


@pytest.mark.parametrize("actor", ACTORS)
@pytest.mark.parametrize("case", sorted(TABLE))
def test_each_actor_may_change_exactly_what_the_table_says(case, actor, project,
                                                           django_user_model, tmp_path):
    world = World(project, django_user_model, tmp_path)
    got = ATTEMPTS[case](world, actor)
    expected = TABLE[case][actor]
    assert got == (expected if expected == NO_ROUTE else expected == "yes"), \
        f"{case} by the {actor}: the table says {expected!r}"
