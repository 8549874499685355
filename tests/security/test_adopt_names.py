"""An adopt location's run is named after its folder, whatever the folder is called: a name
holding characters run ids may not hold (spaces, brackets, accents, ``<``) becomes a run id by
replacing each with ``_``, instead of every adopted generation being refused by ingest one by
one while the locations page said nothing was wrong; and a run id declared with the location
must be one ingest takes (a 400 naming ``run_id``)."""

from __future__ import annotations

import json

import pytest

from recoverydash.ingest.adoption import adopted_run_id
from recoverydash.runs.models import ApiToken, Generation, Run
from recoverydash.storage.models import KIND_ADOPT, StorageLocation
from tests.checkpoints.conftest import dcp_save

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_names_the_run_of_a_folder_with_any_name_with_an_id_ingest_takes(
        project, tmp_path, declare_location, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    root = tmp_path / "Llama 3 (ré-run) <b>"
    root.mkdir()
    dcp_save(root, 10)
    declare_location(project, root, kind=KIND_ADOPT, format="dcp")
    from workers.tasks import discover_manifests

    discover_manifests.apply().get()
    run = Run.objects.get(project=project)
    assert run.run_id == "adopted-Llama_3__r_-run___b_"
    assert list(Generation.objects.filter(run=run).values_list("generation_id", "status")) == [
        ("step-10", "restorable")]


def test_a_bucket_or_a_long_name_stays_within_the_id_rule():
    loc = StorageLocation(url="s3://my.bucket")
    assert adopted_run_id(loc) == "adopted-my.bucket"
    loc = StorageLocation(url="file:///data/" + "é" * 300)
    assert adopted_run_id(loc) == "adopted-" + "_" * 120


@pytest.mark.parametrize("run_id", ["../other", "a b", "x<script>", "é", "x" * 129])
def test_it_refuses_a_location_run_id_that_ingest_would_refuse(client, project, run_id):
    token = ApiToken.issue(project, ["admin"], name="ci")[1]
    response = client.post("/api/v1/locations", data=json.dumps(
        {"url": "s3://bucket/p", "kind": "adopt", "format": "dcp", "run_id": run_id}),
        content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 400, response.content
    assert response.json()["errors"][0]["path"] == "run_id"
    assert not StorageLocation.objects.filter(project=project).exists()
