"""Scenario s2 (the worked example resumed at the read cursor) through the real ingest API and the
analysis, then the pages."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.dashboard.conftest import without_definition_links

pytestmark = pytest.mark.django_db


def test_the_omission_scenario_reads_right_on_every_page(client, s2_run, owner):
    client.force_login(owner)
    fleet = client.get("/").content.decode()
    assert "s2-omission" in fleet and "g1250" in fleet
    run_page = client.get(reverse("run", args=[s2_run.project.name, s2_run.run_id]))
    html = without_definition_links(run_page.content.decode())
    assert "Yes, from" in html and "g1250" in html
    assert "<strong>48</strong> omitted, <strong>0</strong> replayed" in html
    assert "restart_omission" in html
    figures = run_page.context["charts"]["figures"]
    assert all(f["data"] for f in figures.values() if not f.get("empty"))
    restart = client.get(
        reverse("restart", args=[s2_run.project.name, s2_run.run_id, 1])).content.decode()
    assert "48 positions ahead: skipped" in restart
    gen = client.get(
        reverse("generation", args=[s2_run.project.name, s2_run.run_id, "g1250"])).content.decode()
    assert "Objects (40)" in gen
