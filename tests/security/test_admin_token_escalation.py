"""An admin token is issued by any member of a project (the tokens page), so it may declare no
more than a member may on the storage locations page: a folder of the server's file system, the
server's own (ambient) credentials and a custom S3 endpoint act with the server's files,
identity or network and stay with the operator (``manage.py add_location`` / ``apply_config``,
or a staff account in the dashboard). Without this, another project's admin token declared
``file:///data/team-a`` (kind ``adopt``) and the server listed team A's checkpoints into it."""

from __future__ import annotations

import json

import pytest

from recoverydash.runs.models import ApiToken
from recoverydash.storage.models import StorageLocation


def _call(client, method, path, token, body=None):
    kwargs = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    if body is not None:
        kwargs.update(data=json.dumps(body), content_type="application/json")
    response = getattr(client, method)(f"/api/v1{path}", **kwargs)
    return response.status_code, response.json()


@pytest.fixture
def admin_token(other_project):
    return ApiToken.issue(other_project, ["admin"], name="attacker")[1]


@pytest.mark.parametrize("body, field", [
    ({"url": "file:///srv/team-a", "kind": "adopt"}, "url"),
    ({"url": "file:///home"}, "url"),
    ({"url": "s3://team-a-bucket/ckpt", "use_ambient_credentials": True},
     "use_ambient_credentials"),
    ({"url": "s3://team-b/ckpt", "endpoint_url": "http://169.254.169.254",
      "access_key_id": "AKIA", "secret_access_key": "s"}, "endpoint_url"),
])
def test_it_refuses_an_admin_token_what_only_the_operator_may_declare(client, other_project,
                                                                      admin_token, body, field):
    status, answer = _call(client, "post", "/locations", admin_token, body)
    assert status == 400, answer
    assert answer["errors"][0]["path"] == field
    assert "operator" in answer["errors"][0]["message"]
    assert not StorageLocation.objects.filter(project=other_project).exists()


def test_it_refuses_an_admin_token_turning_an_operator_folder_into_more(client, other_project,
                                                                         admin_token, tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    location = StorageLocation.objects.create(project=other_project, url=folder.as_uri(),
                                              origin="command")
    status, answer = _call(client, "post", "/locations", admin_token,
                           {"url": folder.as_uri(), "use_ambient_credentials": True})
    # the operator's location: no field of it is the token's to change (403, the item refused)
    assert status == 403 and answer["errors"][0]["path"] == ""
    assert "operator" in answer["errors"][0]["message"]
    location.refresh_from_db()
    assert location.use_ambient_credentials is False


def test_it_lets_an_admin_token_declare_an_s3_prefix_with_its_own_keys(client, other_project,
                                                                       admin_token):
    status, answer = _call(client, "post", "/locations", admin_token,
                           {"url": "s3://mine/ckpt", "access_key_id": "AKIA",
                            "secret_access_key": "s", "region": "eu-west-1"})
    assert status == 201, answer
    assert StorageLocation.objects.get(project=other_project).url == "s3://mine/ckpt"
