"""A run's pages live at /p/<project>/runs/<run_id>/ (and restarts/<attempt>/,
generations/<generation_id>/, contract/, charts.json below it); the numeric /runs/<pk>/ addresses
of before redirect a member permanently and are a 404 for anyone else; another project's run is
the same 404 as an unknown one; every name a run, generation or project may have round-trips."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from urllib.parse import unquote

import pytest
from django.urls import resolve, reverse

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 1, tzinfo=UTC)

#: Generation ids the identifier rule allows (docs/ingest-v1.md#identifiers), hostile ones first.
ALLOWED_GENERATION_IDS = ["epoch=3-step=1250", "u@host+1~2", "a.b:c", "x...y", "g.", "~", "=",
                          "@", "+", ":", "_", "A" * 200, "u000001250-a0", "checkpoint-1250"]
#: Run ids a trainer may send ([A-Za-z0-9._:-]{1,128}), dot segments included.
ALLOWED_RUN_IDS = ["run.1", "a:b", ".", "..", "...", "-", ".hidden", "r" * 128, "x-1.2:3_4"]
#: Names stored without the rules (adopted folders, project names, generations of before).
STORED_NAMES = ["ckpt/g10", "step 20?#%", "50%", "%2F", "%252F", "a%2Eb", "ünï", "sp ace",
                "/", "//", "a/../b", "./", "q?x=1", "#frag"]


@pytest.mark.parametrize("name", ALLOWED_GENERATION_IDS + ALLOWED_RUN_IDS + STORED_NAMES)
def test_it_round_trips_every_name_through_reverse_and_resolve(name):
    for page, extra in (("run", []), ("restart", [3]), ("generation", [name]),
                        ("run_contract", []), ("run_charts", [])):
        path = reverse(page, args=[name, name, *extra])
        match = resolve(unquote(path))  # the server decodes the path once (PATH_INFO)
        assert match.url_name == page
        assert match.kwargs["project"] == name and match.kwargs["run_id"] == name
        if page == "generation":
            assert match.kwargs["generation_id"] == name
        assert path.startswith("/p/") and "//" not in path


def test_it_writes_the_identifier_characters_into_the_url_as_they_are():
    assert reverse("generation", args=["alpha", "r:1.x", "epoch=3-step=1250"]) == \
        "/p/alpha/runs/r:1.x/generations/epoch=3-step=1250/"
    assert reverse("generation", args=["alpha", "run-1", "u@host+1~2"]) == \
        "/p/alpha/runs/run-1/generations/u@host+1~2/"
    assert reverse("restart", args=["alpha", "run-1", 4]) == "/p/alpha/runs/run-1/restarts/4/"
    # what a path segment cannot carry plainly is escaped, so a browser never resolves it away
    assert reverse("run", args=["alpha", ".."]) == "/p/alpha/runs/%252E%252E/"
    assert reverse("generation", args=["team a", "r", "ckpt/g10"]) == \
        "/p/team%20a/runs/r/generations/ckpt%252Fg10/"


@pytest.fixture
def hostile_run(owner, project):
    """A run of a project named ``ml/team a@x`` whose run id and generation are hostile but
    allowed: ``..`` and ``epoch=3@a+b~c:d.e``; the owner is a member."""
    from recoverydash.runs.models import Generation, Membership, Project, Run

    odd = Project.objects.create(name="ml/team a@x")
    Membership.objects.create(project=odd, user=owner)
    run = Run.objects.create(project=odd, run_id="..", first_event_at=T0, last_event_at=T0,
                             last_received_at=T0)
    Generation.objects.create(run=run, generation_id="epoch=3@a+b~c:d.e", attempt=0, update=10,
                              committed_at=T0, status="committed",
                              manifest={"generation_id": "epoch=3@a+b~c:d.e", "update": 10})
    return run


def test_a_run_with_hostile_names_answers_every_page_and_links_them(owner_client, hostile_run):
    page = reverse("run", args=["ml/team a@x", ".."])
    assert page == "/p/ml%252Fteam%20a@x/runs/%252E%252E/"
    response = owner_client.get(page)
    assert response.status_code == 200
    html = response.content.decode()
    generation = reverse("generation", args=["ml/team a@x", "..", "epoch=3@a+b~c:d.e"])
    assert generation == "/p/ml%252Fteam%20a@x/runs/%252E%252E/generations/epoch=3@a+b~c:d.e/"
    assert f'href="{generation}"' in html
    shown = owner_client.get(generation)
    assert shown.status_code == 200 and "epoch=3@a+b~c:d.e" in shown.content.decode()
    contract = reverse("run_contract", args=["ml/team a@x", ".."])
    assert owner_client.get(contract).status_code == 200
    fleet = owner_client.get("/?view=all").content.decode()
    assert f'href="{page}"' in fleet


def test_it_serves_every_page_of_a_run_at_its_project_and_run_id(owner_client, known_run):
    base = f"/p/alpha/runs/{known_run.run_id}/"
    assert reverse("run", args=["alpha", known_run.run_id]) == base
    for url in (base, f"{base}?fragment=live", f"{base}charts.json", f"{base}contract/",
                f"{base}restarts/1/", f"{base}generations/g1250/"):
        assert owner_client.get(url).status_code == 200, url
    html = owner_client.get(base).content.decode()
    assert f'href="{base}restarts/1/"' in html and f'href="{base}generations/g1250/"' in html
    assert f'href="{base}contract/"' in html


def test_it_redirects_the_old_addresses_permanently_for_a_member(owner_client, known_run):
    base = f"/p/alpha/runs/{known_run.run_id}/"
    pk = known_run.pk
    for old, new in ((f"/runs/{pk}/", base),
                     (f"/runs/{pk}/?fragment=live", f"{base}?fragment=live"),
                     (f"/runs/{pk}/charts.json", f"{base}charts.json"),
                     (f"/runs/{pk}/contract/", f"{base}contract/"),
                     (f"/runs/{pk}/restarts/1/", f"{base}restarts/1/"),
                     (f"/runs/{pk}/generations/g1250/", f"{base}generations/g1250/")):
        response = owner_client.get(old)
        assert response.status_code == 301, old
        assert response["Location"] == new, old


def test_the_old_addresses_are_a_404_for_a_non_member(client, outsider, known_run):
    client.force_login(outsider)
    pk = known_run.pk
    for old in (f"/runs/{pk}/", f"/runs/{pk}/restarts/1/", f"/runs/{pk}/generations/g1250/",
                f"/runs/{pk + 1000}/"):
        response = client.get(old)
        assert response.status_code == 404, old
        assert 'data-status="404"' in response.content.decode()
        assert "Location" not in response


def test_another_projects_run_is_the_same_404_as_an_unknown_one(owner_client, known_run,
                                                               other_project):
    from recoverydash.runs.models import Run

    theirs = Run.objects.create(project=other_project, run_id="their-run")
    answers = []
    for project, run_id in (("beta", "their-run"),        # exists, the owner is no member
                            ("alpha", "their-run"),       # that id is no run of alpha
                            ("beta", known_run.run_id),   # alpha's run under beta's name
                            ("gamma", "their-run"),       # no such project
                            ("alpha", "no-such-run")):
        for url in (reverse("run", args=[project, run_id]),
                    reverse("restart", args=[project, run_id, 1]),
                    reverse("generation", args=[project, run_id, "g1250"]),
                    reverse("run_contract", args=[project, run_id])):
            response = owner_client.get(url)
            assert response.status_code == 404, url
            html = re.sub(r'name="csrfmiddlewaretoken" value="[^"]*"', "",
                          response.content.decode())
            answers.append(html.replace(url, "").replace(run_id, ""))
    assert len(set(answers)) == 1  # nothing tells an existing run from a missing one
    assert "their-run" not in answers[0] and theirs.pk
    assert owner_client.get(f"/runs/{theirs.pk}/").status_code == 404
