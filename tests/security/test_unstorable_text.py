"""A NUL character in a URL or an admin body never reaches PostgreSQL as a lookup or a value
(its text type cannot hold one; psycopg refuses to send it and the request answered 500): a
token of any scope gets a 400 naming where it was, and a signed-in member gets a 400 from the
dashboard."""

from __future__ import annotations

import json

import pytest

from recoverydash.alerts.models import WebhookEndpoint
from recoverydash.runs.models import ApiToken, Run

pytestmark = pytest.mark.django_db

PUBLIC_URL = "https://93.184.215.14/hooks/recoverydash"


@pytest.fixture
def token(project):
    Run.objects.create(project=project, run_id="run-1")
    return ApiToken.issue(project, ["ingest", "read", "metrics", "admin"], name="all")[1]


@pytest.mark.parametrize("path, part", [
    ("/api/v1/runs/%00/recovery", "path"),
    ("/api/v1/runs/run-1%00/restore-plan", "path"),
    ("/api/v1/runs/%00/contract", "path"),
    ("/api/v1/webhooks/%00", "path"),
    ("/api/v1/alerts?run_id=%00", "query.run_id"),
    ("/api/v1/runs?health=%00", "query.health"),
    ("/metrics?x=%00", "query.x"),
])
def test_it_answers_400_to_a_url_with_a_nul_character(client, token, path, part):
    response = client.get(path, HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 400, response.content[:300]
    body = response.json()
    assert body["error"] == "invalid" and body["errors"][0]["path"] == part
    assert "NUL" in body["errors"][0]["message"]


def test_the_dashboard_answers_400_to_a_url_with_a_nul_character(member_client, project,
                                                                 token):
    run = Run.objects.get(project=project, run_id="run-1")
    for path in (f"/runs/{run.pk}/generations/g%00/", "/?q=%00", "/alerts/?run=%00"):
        response = member_client.get(path)
        assert response.status_code == 400, (path, response.status_code)


@pytest.mark.parametrize("method, path, body, field", [
    ("post", "/api/v1/webhooks", {"name": "hook\x00", "url": PUBLIC_URL}, "name"),
    ("post", "/api/v1/webhooks", {"name": "hook", "url": PUBLIC_URL + "\x00"}, "url"),
    ("put", "/api/v1/runs/run-1/contract", {"required_components": ["model\x00"]},
     "required_components"),
    ("post", "/api/v1/locations", {"url": "s3://bucket/p", "region": "eu\x00"}, "region"),
])
def test_it_refuses_an_admin_body_with_a_nul_character(client, project, token, method, path,
                                                       body, field):
    response = getattr(client, method)(path, data=json.dumps(body),
                                       content_type="application/json",
                                       HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 400, response.content[:300]
    assert response.json()["errors"][0]["path"] == field
    assert not WebhookEndpoint.objects.filter(project=project).exists()
    assert Run.objects.get(project=project, run_id="run-1").contract in (None, {})
