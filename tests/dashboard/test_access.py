"""Who sees what: members of a project see its runs; outsiders get 404; anonymous users are sent
to sign in; superusers see every project."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.dashboard.conftest import PASSWORD

pytestmark = pytest.mark.django_db


def _run_urls(run):
    at = [run.project.name, run.run_id]
    return [reverse("run", args=at), reverse("run_charts", args=at),
            reverse("run_contract", args=at), reverse("generation", args=[*at, "g1250"]),
            reverse("restart", args=[*at, 1])]


def test_it_sends_anonymous_users_to_sign_in(client, known_run):
    for url in ["/", reverse("alerts"), reverse("projects")] + _run_urls(known_run):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("login"))


def test_it_signs_in_with_a_password_and_out_with_a_post(client, owner):
    page = client.get(reverse("login"))
    assert b"Sign in" in page.content
    bad = client.post(reverse("login"), {"username": "olivia", "password": "nope"})
    assert b"do not match" in bad.content
    ok = client.post(reverse("login"), {"username": "olivia", "password": PASSWORD})
    assert ok.status_code == 302 and ok["Location"] == "/"
    assert client.get("/").status_code == 200
    out = client.post(reverse("logout"))
    assert out.status_code == 302
    assert client.get("/").status_code == 302


@pytest.mark.parametrize("who", ["owner", "teammate"])
def test_members_see_every_page_of_their_runs(client, known_run, who, request):
    client.force_login(request.getfixturevalue(who))
    for url in _run_urls(known_run):
        assert client.get(url).status_code == 200, url
    assert b"s2-omission" in client.get("/").content


def test_an_outsider_gets_404_for_every_page_of_anothers_run(client, known_run, outsider):
    client.force_login(outsider)
    for url in _run_urls(known_run):
        assert client.get(url).status_code == 404, url
    assert b"s2-omission" not in client.get("/").content
    assert b"s2-omission" not in client.get(reverse("alerts")).content
    assert client.get(reverse("project", args=[known_run.project.pk])).status_code == 404


def test_an_outsider_cannot_act_on_anothers_alerts_tokens_or_contract(client, known_run, outsider):
    client.force_login(outsider)
    alert = known_run.alerts.get()
    assert client.post(reverse("alert_action", args=[alert.pk, "acknowledge"])).status_code == 404
    alert.refresh_from_db()
    assert alert.state == "firing"
    project = known_run.project
    assert client.post(reverse("token_create", args=[project.pk]),
                       {"name": "x", "scopes": ["ingest"]}).status_code == 404
    assert project.tokens.count() == 0
    assert client.post(reverse("run_contract", args=[known_run.project.name, known_run.run_id]),
                       {"max_replay_samples": 9}).status_code == 404


def test_a_superuser_sees_every_project(client, known_run, admin_user):
    client.force_login(admin_user)
    assert b"s2-omission" in client.get("/").content
    run_url = reverse("run", args=[known_run.project.name, known_run.run_id])
    assert client.get(run_url).status_code == 200


def test_fleet_filters_by_project_health_and_run_id(client, known_run, owner, other_project):
    from recoverydash.runs.models import Analysis, Membership, Run

    Membership.objects.create(project=other_project, user=owner)
    quiet = Run.objects.create(project=other_project, run_id="quiet-run")
    Analysis.objects.create(run=quiet, health="ok", result={"health": "ok"})
    client.force_login(owner)
    # the default view holds the runs needing attention; ?view=all every run, failing first
    assert [r.run.run_id for r in client.get("/").context["rows"]] == ["s2-omission"]
    rows = client.get("/", {"view": "all"}).context["rows"]
    assert [r.run.run_id for r in rows] == ["s2-omission", "quiet-run"]
    everything = {"view": "all"}
    assert [r.run.run_id for r in client.get("/", {**everything, "health": "ok"})
            .context["rows"]] == ["quiet-run"]
    assert [r.run.run_id for r in client.get("/", {**everything, "q": "OMISS"})
            .context["rows"]] == ["s2-omission"]
    only = client.get("/", {**everything, "project": other_project.pk}).context["rows"]
    assert [r.run.run_id for r in only] == ["quiet-run"]
    empty = client.get("/", {**everything, "q": "nothing-like-this"})
    assert b"No run matches these filters" in empty.content
