"""Declaring storage locations: ``manage.py add_location`` (like a token), the project's storage
locations page, the admin; a declaration makes what was outside verifiable at once; and the data
migration that declares, for existing deployments, the prefixes their stored generations use."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from recoverydash.runs.models import Membership, Project
from recoverydash.storage.models import StorageLocation

from .conftest import checks, generation, manifest, run_events, write_generation

pytestmark = pytest.mark.django_db(transaction=True)


def add_location(*args) -> str:
    out = StringIO()
    call_command("add_location", *args, stdout=out)
    return out.getvalue()


def test_the_command_declares_a_folder_like_a_token_is_issued(tmp_path):
    folder = tmp_path / "ckpt"
    out = add_location("--project", "team", "--uri", f"file://{folder}//", "--trainer-uri",
                       "/mnt/ckpt/")
    assert out == ("created project team\n"
                   f"declared storage location file://{folder} (trainers: file:///mnt/ckpt) for "
                   "project team: server file system\n")
    loc = StorageLocation.objects.get()
    assert (loc.url, loc.trainer_url, loc.origin, loc.kind) == (
        f"file://{folder}", "file:///mnt/ckpt", "command", "manifests")
    out = add_location("--project", "team", "--uri", f"file://{folder}", "--no-discover")
    assert out.startswith(f"updated storage location file://{folder} for project team")
    assert StorageLocation.objects.get().discover is False


def test_the_command_takes_s3_keys_from_the_environment(monkeypatch):
    monkeypatch.setenv("TEAM_SECRET", "s3cr3t")
    out = add_location("--project", "team", "--uri", "s3://ckpt-bucket/runs",
                       "--endpoint-url", "http://minio:9000", "--region", "eu-west-1",
                       "--access-key-id", "AKIAEXAMPLE", "--secret-access-key-env", "TEAM_SECRET")
    assert out.endswith("declared storage location s3://ckpt-bucket/runs for project team: "
                        "key AKIA...\n")
    loc = StorageLocation.objects.get()
    assert (loc.secret_access_key, loc.endpoint_url, loc.region, loc.use_ambient_credentials) == \
        ("s3cr3t", "http://minio:9000", "eu-west-1", False)
    add_location("--project", "team", "--uri", "s3://ckpt-bucket/other", "--ambient-credentials")
    assert StorageLocation.objects.get(url="s3://ckpt-bucket/other").use_ambient_credentials


@pytest.mark.parametrize("args, message", [
    (["--uri", "file:///etc"], "url: file:///etc may not be a storage location: it is the "
                               "system folder /etc"),
    (["--uri", "ckpt"], "url: expected file:///absolute/folder or s3://bucket/prefix, got 'ckpt'"),
    (["--uri", "s3://b-1/x", "--access-key-id", "AKIA"],
     "secret_access_key: give both the access key id and the secret"),
    (["--uri", "s3://b-1/x", "--run-id", ".."],
     "run_id: expected a run id of 1-128 characters from A-Z a-z 0-9 . _ : -, not '.' or '..', "
     "got '..'"),
])
def test_the_command_refuses_what_may_not_be_a_location(args, message):
    with pytest.raises(CommandError) as refused:
        add_location("--project", "team", *args)
    assert str(refused.value) == message
    assert not StorageLocation.objects.exists()


@pytest.fixture
def member(project, django_user_model):
    user = django_user_model.objects.create_user("member", password="pw")
    Membership.objects.create(project=project, user=user)
    c = Client()
    c.force_login(user)
    return c


@pytest.fixture
def operator(project, django_user_model):
    user = django_user_model.objects.create_user("operator", password="pw", is_staff=True)
    Membership.objects.create(project=project, user=user)
    c = Client()
    c.force_login(user)
    return c


FORM = {"kind": "manifests", "discover": "on", "enabled": "on"}


def test_a_member_declares_an_s3_prefix_with_its_own_keys(project, member):
    answer = member.post(f"/projects/{project.pk}/locations/", dict(
        FORM, url="s3://team-bucket/ckpt/", access_key_id="AKIATEAM",
        secret_access_key="team-secret-9f2"))
    assert answer.status_code == 302
    loc = StorageLocation.objects.get(project=project)
    assert (loc.url, loc.origin, loc.secret_access_key) == ("s3://team-bucket/ckpt", "dashboard",
                                                            "team-secret-9f2")
    page = member.get(f"/projects/{project.pk}/locations/").content.decode()
    assert "s3://team-bucket/ckpt" in page and "AKIA…" in page
    assert "team-secret-9f2" not in page


@pytest.mark.parametrize("fields, error", [
    ({"url": "file:///srv/ckpt"}, "needs a staff account: it acts with the server&#x27;s own "
                                  "file system"),
    ({"url": "s3://b-1/x", "use_ambient_credentials": "on"}, "needs a staff account: it acts "
                                                             "with the server&#x27;s own identity"),
    ({"url": "s3://b-1/x", "endpoint_url": "http://10.0.0.5:9000"},
     "needs a staff account: it acts with the server&#x27;s own network"),
])
def test_a_member_cannot_lend_themselves_the_servers_files_identity_or_network(
        project, member, fields, error):
    answer = member.post(f"/projects/{project.pk}/locations/", dict(FORM, **fields))
    assert answer.status_code == 400
    assert error in answer.content.decode()
    assert not StorageLocation.objects.exists()


def test_declaring_a_location_verifies_what_was_outside_at_once(project, operator, tmp_path,
                                                               ingest):
    folder = tmp_path / "ckpt"
    ingest(project, run_events("late", [manifest("g1", 2, write_generation(folder, "g1"))], 2))
    assert {s for s, _ in checks("late").values()} == {"object_outside_locations"}
    page = operator.get(f"/projects/{project.pk}/locations/").content.decode()
    assert "5 objects outside every location" in page
    answer = operator.post(f"/projects/{project.pk}/locations/",
                           dict(FORM, url=f"file://{folder}"))
    assert answer.status_code == 302
    assert {s for s, _ in checks("late").values()} == {"ok"}
    assert generation("late", "g1").status == "restorable"


def test_another_project_cannot_see_or_change_the_locations(project, other_project, member):
    StorageLocation.objects.create(project=other_project, url="s3://beta-bucket/x")
    assert member.get(f"/projects/{other_project.pk}/locations/").status_code == 404
    assert member.post(f"/projects/{other_project.pk}/locations/",
                       dict(FORM, url="s3://beta-bucket/y")).status_code == 404
    loc = StorageLocation.objects.get()
    assert member.post(f"/projects/{project.pk}/locations/{loc.pk}/delete/").status_code == 302
    assert StorageLocation.objects.filter(pk=loc.pk).exists()


def test_the_admin_declares_a_location_with_a_write_only_secret(project, django_user_model):
    admin = django_user_model.objects.create_superuser("root", "r@example.invalid", "pw")
    c = Client()
    c.force_login(admin)
    fields = {"project": project.pk, "url": "s3://admin-bucket/runs/", "kind": "manifests",
              "access_key_id": "AKIAADMIN", "secret_access_key": "admin-secret-51c",
              "enabled": "on", "discover": "on"}
    assert c.post("/admin/storage/storagelocation/add/", fields).status_code == 302
    loc = StorageLocation.objects.get()
    assert (loc.url, loc.origin, loc.secret_access_key) == ("s3://admin-bucket/runs", "admin",
                                                            "admin-secret-51c")
    form = c.get(f"/admin/storage/storagelocation/{loc.pk}/change/").content.decode()
    assert "admin-secret-51c" not in form
    fields.update(secret_access_key="", region="eu-west-1")
    assert c.post(f"/admin/storage/storagelocation/{loc.pk}/change/", fields).status_code == 302
    loc.refresh_from_db()
    assert (loc.secret_access_key, loc.region) == ("admin-secret-51c", "eu-west-1")
    fields.update(url="file:///etc")
    refused = c.post(f"/admin/storage/storagelocation/{loc.pk}/change/", fields)
    assert refused.status_code == 200 and "the system folder /etc" in refused.content.decode()


def test_the_migration_declares_the_prefixes_stored_generations_already_use(tmp_path):
    """Migrate back to before the locations existed, store what an old deployment holds, and
    migrate forward: every prefix whose objects verified is declared for its project, nothing
    else, and what was observed of failing objects is forgotten."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    before = [("storage", "0002_storage_confinement"), ("runs", "0005_storage_confinement")]
    executor = MigrationExecutor(connection)
    executor.migrate([("storage", "0002_storage_confinement")])
    executor.loader.build_graph()
    apps = executor.loader.project_state(before).apps
    P = apps.get_model("runs", "Project")
    R = apps.get_model("runs", "Run")
    G = apps.get_model("runs", "Generation")
    Obj = apps.get_model("runs", "CheckpointObject")
    L = apps.get_model("storage", "StorageLocation")
    alpha, beta = P.objects.create(name="old-alpha"), P.objects.create(name="old-beta")
    L.objects.create(project=alpha, url="s3://alpha-bucket/declared")  # keys from the env
    ok = {"in_manifest": True, "check_status": "ok", "size": 1}

    def objects(project, run_id, generation_id, *rows):
        gen = G.objects.create(run=R.objects.create(project=project, run_id=run_id),
                               generation_id=generation_id)
        for uri, extra in rows:
            Obj.objects.create(generation=gen, uri=uri, **{**ok, **extra})

    objects(alpha, "a1", "g10",
            (f"file://{tmp_path}/ckpt/a1/g10/model/__0_0.distcp", {}),
            (f"file://{tmp_path}/ckpt/a1/g10/optimizer/__0_0.distcp", {}),
            ("s3://alpha-bucket/declared/g10/x", {}),           # already covered
            ("s3://alpha-bucket/other/runs/g10/x", {}),
            ("file:///etc/shadow", {"check_status": "digest_mismatch", "observed_size": 1234,
                                    "observed_sha256": "ab" * 32,
                                    "check_detail": "sha256 of the file is abab..."}))
    objects(alpha, "a2", "g20", (f"file://{tmp_path}/ckpt/a2/g20/model", {}),
            ("file:///etc/hostname", {}))                       # verified, but a system folder
    objects(beta, "b1", "g1", (f"file://{tmp_path}/beta/b1/g1/m", {}),
            (f"file://{tmp_path}/never/verified", {"check_status": "object_missing"}))

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    declared = {(loc.project.name, loc.url, loc.origin, loc.discover, loc.use_ambient_credentials)
                for loc in StorageLocation.objects.select_related("project")}
    assert declared == {
        ("old-alpha", "s3://alpha-bucket/declared", "", True, True),
        ("old-alpha", f"file://{tmp_path}/ckpt/a1", "migration", False, False),
        ("old-alpha", f"file://{tmp_path}/ckpt/a2", "migration", False, False),
        ("old-alpha", "s3://alpha-bucket/other/runs", "migration", False, True),
        ("old-beta", f"file://{tmp_path}/beta/b1", "migration", False, False),
    }
    from recoverydash.runs.models import CheckpointObject

    shadow = CheckpointObject.objects.get(uri="file:///etc/shadow")
    assert (shadow.observed_size, shadow.observed_sha256, shadow.check_detail) == (
        None, "", "sha256 differs from the manifest's")
    assert Project.objects.count() == 2
