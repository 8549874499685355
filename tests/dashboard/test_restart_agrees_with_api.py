"""One answer per page: every number the restart page shows is the recovery API's for the same
restart (``dashboard.agreement``), for every restart of every worked scenario, ingested and
analysed as in production; and the comparison itself catches a page that disagrees."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.urls import reverse

from recoverydash.dashboard.agreement import HEADLINE, disagreements, marked
from tests.dashboard.conftest import post_scenario

pytestmark = pytest.mark.django_db

SCENARIOS = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "scenarios")
                   .glob("s*.json"))


@pytest.mark.parametrize("name", SCENARIOS)
def test_every_number_on_the_restart_page_is_the_apis(name, client, owner, full_token,
                                                      scenario_loader, tmp_path):
    run, _ = post_scenario(client, full_token, scenario_loader, name, tmp_path)
    answer = client.get(f"/api/v1/runs/{run.run_id}/recovery",
                        HTTP_AUTHORIZATION=f"Bearer {full_token}").json()
    client.force_login(owner)
    for item in answer["restarts"]:
        page = client.get(reverse("restart", args=[run.project.name, run.run_id,
                                                   item["attempt"]])).content.decode()
        assert disagreements(page, item) == [], (name, item["attempt"])
        assert {f for f, _ in marked(page)} >= set(HEADLINE)


def test_a_page_that_disagrees_with_the_api_is_caught():
    page = ('<span data-field="replayed" data-value="64">64</span>'
            '<span data-field="omitted" data-value="16">16</span>'
            '<span data-field="expected_cursor.main.position" data-value="64">64</span>')
    item = {"replayed": 64, "omitted": 0,
            "expected_cursor": [{"stratum": "main", "epoch": 0, "position": 64}]}
    assert disagreements(page, item, required=("replayed", "recomputed")) == [
        "omitted: the page shows 16, the API 0", "recomputed: not shown on the page"]
    assert disagreements('<i data-field="skipped_ids" data-value="16">16</i>', item,
                         required=()) == ["skipped_ids: the page shows 16, the API states "
                                          "nothing"]
