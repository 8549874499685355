"""S3 on moto's server over HTTP, with every request the server receives counted: an object in
another tenant's bucket is refused without a single request; each location's own keys sign the
requests under it, never the server's ambient ones unless the location allows them."""

from __future__ import annotations

import base64
import hashlib
import re
import threading
import uuid

import pytest

from recoverydash.checkpoints.objects import make_s3_client

from .conftest import COMPONENTS, checks, generation, manifest, run_events

pytestmark = pytest.mark.django_db(transaction=True)


class CountingS3:
    """moto's S3 behind a WSGI layer that records each request: method, path (bucket/key) and
    the access key id of its signature."""

    def __init__(self):
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        self.requests: list[dict] = []
        app = DomainDispatcherApplication(create_backend_app)

        def counting(environ, start_response):
            auth = environ.get("HTTP_AUTHORIZATION", "")
            key = re.search(r"Credential=([^/]+)/", auth)
            self.requests.append({"method": environ["REQUEST_METHOD"],
                                  "path": environ.get("PATH_INFO", ""),
                                  "key": key.group(1) if key else ""})
            return app(environ, start_response)

        self.server = make_server("127.0.0.1", 0, counting, True,
                                  request_handler=MotoRequestHandler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def client(self, key: str):
        return make_s3_client(self.endpoint, access_key_id=key, secret_access_key="secret")

    def stop(self):
        self.server.shutdown()
        self.thread.join()


@pytest.fixture
def s3():
    server = CountingS3()
    yield server
    server.stop()


def put_generation(client, bucket: str, prefix: str, generation_id: str) -> list[dict]:
    objects = []
    for component in COMPONENTS:
        key = f"{prefix}/{generation_id}/{component}/__0_0.distcp"
        data = hashlib.sha256(key.encode()).digest() * 8
        client.put_object(Bucket=bucket, Key=key, Body=data,
                          ChecksumSHA256=base64.b64encode(hashlib.sha256(data).digest()).decode())
        objects.append({"uri": f"s3://{bucket}/{key}", "shard": "rank0", "component": component,
                        "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    return objects


def test_another_tenants_bucket_is_refused_without_a_request(s3, project, other_project,
                                                             declare_location, ingest):
    mine, theirs = f"alpha-{uuid.uuid4().hex[:8]}", f"beta-{uuid.uuid4().hex[:8]}"
    s3.client("alpha-key").create_bucket(Bucket=mine)
    s3.client("beta-key").create_bucket(Bucket=theirs)
    their_objects = put_generation(s3.client("beta-key"), theirs, "runs", "g1")
    declare_location(other_project, f"s3://{theirs}/runs", endpoint_url=s3.endpoint,
                     access_key_id="beta-key", secret_access_key="secret")
    declare_location(project, f"s3://{mine}/runs", endpoint_url=s3.endpoint,
                     access_key_id="alpha-key", secret_access_key="secret")
    objects = put_generation(s3.client("alpha-key"), mine, "runs", "g1")
    objects[0] = dict(their_objects[0])  # the probe: beta's model shard, size and digest right
    s3.requests.clear()

    ingest(project, run_events("probe", [manifest("g1", 2, objects)], 2))

    assert [r for r in s3.requests if theirs in r["path"]] == []
    assert {r["key"] for r in s3.requests} == {"alpha-key"}
    assert len([r for r in s3.requests if r["method"] == "HEAD"]) == 4  # alpha's own four
    status, detail = checks("probe")[their_objects[0]["uri"]]
    assert status == "object_outside_locations"
    assert detail.startswith(f"{their_objects[0]['uri']} is under none of the project's storage "
                             f"locations (s3://{mine}/runs): never read")
    assert generation("probe", "g1").status == "rejected"


def test_each_location_signs_with_its_own_keys_never_the_servers(s3, project, declare_location,
                                                                 ingest, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "server-ambient-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "server-ambient-secret")
    bucket = f"keys-{uuid.uuid4().hex[:8]}"
    s3.client("setup-key").create_bucket(Bucket=bucket)
    a = put_generation(s3.client("setup-key"), bucket, "team-a", "g1")
    b = put_generation(s3.client("setup-key"), bucket, "team-b", "g2")
    declare_location(project, f"s3://{bucket}/team-a", endpoint_url=s3.endpoint,
                     access_key_id="team-a-key", secret_access_key="secret")
    declare_location(project, f"s3://{bucket}/team-b", endpoint_url=s3.endpoint)  # no keys
    s3.requests.clear()

    ingest(project, run_events("keys", [manifest("g1", 2, a), manifest("g2", 4, b)], 4))

    assert {r["key"] for r in s3.requests} == {"team-a-key"}
    assert all("/team-a/" in r["path"] for r in s3.requests)
    assert {s for u, (s, _) in checks("keys").items() if "/team-a/" in u} == {"ok"}
    (detail,) = {d for u, (s, d) in checks("keys").items() if "/team-b/" in u}
    assert detail == (f"cannot verify: storage location s3://{bucket}/team-b: no credentials: the "
                      "storage location has no keys and does not allow the server's own "
                      "(ambient) credentials")
    assert generation("keys", "g2").status == "committed"


def test_a_location_that_allows_the_servers_credentials_uses_them(s3, project, declare_location,
                                                                  ingest, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "server-ambient-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "server-ambient-secret")
    bucket = f"ambient-{uuid.uuid4().hex[:8]}"
    s3.client("setup-key").create_bucket(Bucket=bucket)
    objects = put_generation(s3.client("setup-key"), bucket, "runs", "g1")
    declare_location(project, f"s3://{bucket}/runs", endpoint_url=s3.endpoint,
                     use_ambient_credentials=True)
    s3.requests.clear()
    ingest(project, run_events("ambient", [manifest("g1", 2, objects)], 2))
    assert {r["key"] for r in s3.requests} == {"server-ambient-key"}
    assert generation("ambient", "g1").status == "restorable"
