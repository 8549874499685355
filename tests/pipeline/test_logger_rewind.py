"""The logger hand-off (docs/definitions.md#logger-rewind-update): the restart answer names the
update loggers rewind to, the restored generation's, on every path a restarting trainer or an
on-call person reads it: the core, the restore-plan API, the run page and the SDK."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
from django.urls import reverse

from recoverydash.recovery.figures import logger_rewind_update
from recoverydash.runs.models import Membership, Run
from recoverydash.sdk import restore_plan

S1 = "s1_resume_at_checkpoint_exact"


def test_the_logger_rewind_update_is_the_restored_generations_update():
    assert logger_rewind_update(SimpleNamespace(update=1250)) == 1250
    assert logger_rewind_update({"generation_id": "g1250", "update": 1250,
                                 "committed_at": "2026-11-01T00:21:01Z"}) == 1250
    assert logger_rewind_update(None) is None  # a fresh start rewinds nothing
    assert logger_rewind_update({"update": None}) is None
    assert logger_rewind_update({"update": True}) is None


@pytest.mark.django_db(transaction=True)
def test_the_restore_plan_the_run_page_and_the_sdk_name_the_update_to_rewind_to(
        client, live_server, full_token, project, scenario_loader, tmp_path, settings,
        django_user_model, declare_location):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.RECOVERYDASH_RATE_LIMIT_PER_SECOND = 0
    declare_location(project, tmp_path)
    events, _ = scenario_loader(S1, str(tmp_path))
    run_id = events[0]["run_id"]
    for i in range(0, len(events), 500):
        response = client.post("/api/v1/events",
                               data=json.dumps({"events": events[i:i + 500]}),
                               content_type="application/json",
                               HTTP_AUTHORIZATION=f"Bearer {full_token}")
        assert response.status_code == 202
    plan = client.get(f"/api/v1/runs/{run_id}/restore-plan",
                      HTTP_AUTHORIZATION=f"Bearer {full_token}").json()
    assert plan["generation_id"] == "g1250"
    assert plan["logger_rewind_update"] == plan["update"] == 1250
    schema = client.get("/api/v1/openapi.json").json()["components"]["schemas"]
    assert "logger_rewind_update" in schema["RestorePlanOut"]["required"]

    user = django_user_model.objects.create_user("oncall", password="pw")
    Membership.objects.create(project=project, user=user)
    client.force_login(user)
    project_name = Run.objects.get(run_id=run_id).project.name
    page = client.get(reverse("run", args=[project_name, run_id])).content.decode()
    text = re.sub(r"<[^>]+>", "", page)
    assert "rewind loggers to update 1250" in text
    assert 'resume_from=f"{run_id}?_step=1250"' in text and "purge_step=1251" in text

    sdk = restore_plan(live_server.url, full_token, run_id, timeout=30)
    assert sdk["source"] == "server" and sdk["logger_rewind_update"] == 1250
    fresh = restore_plan(live_server.url, full_token, "never-started", timeout=30)
    assert fresh["generation_id"] is None and fresh["logger_rewind_update"] is None
