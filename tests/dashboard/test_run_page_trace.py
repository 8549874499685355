"""The run page leaves a trace of every restart (a restore that failed, also before
attempt_started) and tells the clock truthfully: an ended run is not at risk and not stale, a
running attempt shows each rank's last event (docs/definitions.md#silence)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from tests.dashboard.conftest import without_definition_links

pytestmark = pytest.mark.django_db


def page(owner_client, run):
    return without_definition_links(
        owner_client.get(reverse("run", args=[run.project.name, run.run_id])).content.decode())


def test_it_shows_an_attempt_that_died_restoring_instead_of_the_older_restarts_verdict(
        owner_client, known_run):
    from recoverydash.runs.models import Attempt

    att = Attempt.objects.create(run=known_run, attempt=2)
    att.note_restore_failure("g1250", "object_damaged",
                             "file:///ckpt/g1250/model/__0_0.distcp: size_mismatch",
                             datetime.now(UTC), None)
    att.save()
    html = page(owner_client, known_run)
    assert "✖ Attempt 2 failed to restore" in html
    assert (f"Attempt 2 could not restore <a href=\"/p/alpha/runs/{known_run.run_id}"
            "/generations/g1250/\">g1250</a>: "
            "<code>object_damaged</code> (file:///ckpt/g1250/model/__0_0.distcp: size_mismatch)"
            "; it restored nothing.") in html
    assert "✖ restore failed</span> <span class=\"muted\">no attempt_started" in html


def test_it_says_an_ended_run_ended_and_is_not_over_the_limit(owner_client, known_run):
    from recoverydash.runs.models import Analysis

    a = Analysis.objects.get(run=known_run)
    a.result = {**a.result, "health": "ended", "ended_at": "2026-11-01T00:40:00+00:00"}
    a.health = "ended"
    a.save()
    html = page(owner_client, known_run)
    assert "over the limit" not in html and "A failure now loses" not in html
    assert "10 updates beyond the last restorable checkpoint" in html
    assert ("The run ended at 2026-11-01 00:40:00 UTC, 18m 59s after the last restorable "
            "checkpoint: a resume from it would redo 10 updates.") in html
    a.result = {**a.result, "updates_at_risk": 0}
    a.save()
    html = page(owner_client, known_run)
    assert "✔ Nothing at risk" in html
    assert "ended at 2026-11-01 00:40:00 UTC: nothing at risk" in html


def test_it_shows_each_ranks_last_event_and_marks_the_silent_one(owner_client, known_run,
                                                                  settings):
    from seen_rows import set_ranks_seen

    from recoverydash.runs.models import Attempt

    live = Attempt.objects.filter(run=known_run).order_by("-attempt").first()
    Attempt.objects.filter(pk=live.pk).update(ended_at=None, end_reason="")
    now = datetime.now(UTC)
    live.refresh_from_db()
    set_ranks_seen(live, {"0": (now - timedelta(seconds=3)).isoformat(),
                          "1": (now - timedelta(seconds=400)).isoformat()})
    html = page(owner_client, known_run)
    # ages at the page's clock: rank 0 a few seconds, rank 1 400 s (over the 120 s floor)
    assert re.search(r'last event <span class="">rank 0 [3-9](\.\d)?s ago</span> · '
                     r'<span class="bad">rank 1 6m 4\ds ago \(silent\)</span>', html), html
