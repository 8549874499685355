"""manage.py create_project / create_token: the token is printed alone on the last line and
works against the API with exactly the scopes asked for."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from ingest_support import post, update

from recoverydash.runs.models import ApiToken, Project

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_it_creates_the_project_and_prints_the_token_last(client):
    out = run("create_token", "--project", "gamma", "--scopes", "ingest", "--name", "ci")
    raw = out.strip().splitlines()[-1]
    assert raw.startswith("rdt_") and " " not in raw
    token = ApiToken.authenticate(raw)
    assert token.project.name == "gamma" and token.scopes == ["ingest"] and token.name == "ci"
    assert post(client, raw, [update("a", 1)]).status_code == 202
    r = client.get("/api/v1/runs", headers={"Authorization": f"Bearer {raw}"})
    assert r.status_code == 403


def test_it_reuses_an_existing_project(project):
    run("create_token", "--project", project.name, "--scopes", "ingest,read")
    assert Project.objects.count() == 1
    assert ApiToken.objects.get(project=project).scopes == ["ingest", "read"]


def test_it_refuses_an_unknown_scope():
    with pytest.raises(CommandError):
        run("create_token", "--project", "gamma", "--scopes", "ingest,write")
    assert not ApiToken.objects.exists()


def test_it_creates_a_project_once():
    assert "created" in run("create_project", "delta")
    assert "exists" in run("create_project", "delta")
    assert Project.objects.filter(name="delta").count() == 1
