"""Unknown runs, restarts and pages answer a styled 404 (the dashboard's top bar and a way back),
never Django's bare "Not Found"; a refused action answers a styled 403."""

from __future__ import annotations

from django.urls import reverse


def test_it_answers_an_unknown_run_with_the_styled_404(owner_client, known_run):
    for url in (reverse("run", args=[known_run.project.name, known_run.run_id + "-gone"]),
                reverse("restart", args=[known_run.project.name, known_run.run_id, 7]),
                reverse("generation", args=[known_run.project.name, known_run.run_id, "g0"]),
                "/no/such/page/"):
        response = owner_client.get(url)
        assert response.status_code == 404
        html = response.content.decode()
        assert 'data-status="404"' in html and "Back to the fleet" in html, url
        assert 'class="topbar"' in html


def test_an_outsider_gets_the_same_404_as_for_a_run_that_does_not_exist(client, outsider,
                                                                       known_run):
    import re

    client.force_login(outsider)

    def page(run_id):
        url = reverse("run", args=[known_run.project.name, run_id])
        html = client.get(url).content.decode()
        return re.sub(r'name="csrfmiddlewaretoken" value="[^"]*"', "", html.replace(url, "URL"))

    html = page(known_run.run_id)
    # the address asked for is echoed, nothing else of the run: the page of a run that
    # does not exist is the same
    assert 'data-status="404"' in html and known_run.run_id not in html
    assert html == page("no-such-run")


def test_a_refused_form_answers_the_styled_403(owner, known_run):
    from django.test import Client

    c = Client(enforce_csrf_checks=True)
    c.force_login(owner)
    response = c.post(reverse("run_contract", args=[known_run.project.name, known_run.run_id]), {})
    assert response.status_code == 403
    html = response.content.decode()
    assert 'data-status="403"' in html and "security token" in html
