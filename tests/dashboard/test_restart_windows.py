"""The restart page's first window after the resume
(docs/definitions.md#first-window-after-a-restart): expected ids (the failed attempt's windows
past the restored update) beside observed ones, replayed
and skipped ids highlighted and counted, as ``recovery.windows.first_window_comparison`` marks
them; and the sentence saying how to send audit windows when none was sent."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from tests.dashboard.conftest import COMMIT


def _page(client, run) -> str:
    return client.get(reverse("restart", args=[run.project.name, run.run_id, 1])).content.decode()


def _count(html: str, name: str) -> str:
    return re.search(rf'data-count="{name}">([^<]*)<', html).group(1)


@pytest.fixture
def rolled_back_1251(known_run):
    """Attempt 0's windows of update 1251 (ids from position 80,000 on): what the stream had
    delivered past the checkpoint before the failure."""
    from recoverydash.runs.models import AuditWindow

    for rank in range(2):
        for slot in range(2):
            base = 1250 * 64
            AuditWindow.objects.create(run=known_run, attempt=0, update=1251, rank=rank,
                                       accum_slot=slot, time=COMMIT,
                                       sample_ids=[f"s{base + slot * 16 + rank}",
                                                   f"s{base + slot * 16 + rank + 8}"])
    return known_run


def test_it_marks_the_ids_a_resume_at_the_read_cursor_skipped(owner_client, rolled_back_1251):
    html = _page(owner_client, rolled_back_1251)
    assert "First window after the resume: expected beside observed" in html
    # the 8 ids attempt 0 trained on at update 1251 were not delivered by attempt 1
    assert _count(html, "skipped-ids") == "8"
    assert _count(html, "replayed-ids") == "0"
    for rank in range(2):
        for slot in range(2):
            for extra in (0, 8):
                i = 80000 + slot * 16 + rank + extra
                assert f'<span class="id id-skipped" title="skipped">s{i}</span>' in html
    # what attempt 1 delivered instead, 48 positions later
    assert '<span class="id id-other" title="other">s80048</span>' in html
    assert "0 / 8" in html and "✖ differs" in html


def test_it_highlights_the_ids_a_restart_replayed(owner_client, known_run):
    from recoverydash.runs.models import AuditWindow

    # attempt 1's first update delivers update 1250's ids again
    for w in AuditWindow.objects.filter(run=known_run, attempt=1, update=1251):
        w.sample_ids = [f"s{1249 * 64 + w.accum_slot * 16 + w.rank}",
                        f"s{1249 * 64 + w.accum_slot * 16 + w.rank + 8}"]
        w.save()
    html = _page(owner_client, known_run)
    assert _count(html, "replayed-ids") == "8"
    assert '<span class="id id-replayed" title="replayed">s79936</span>' in html
    # attempt 0 sent no window past 1250: the expected ids are unknown, and the page says so
    assert _count(html, "skipped-ids") == "—"
    assert "sent no audit window for the updates after 1,250" in html


def test_it_says_how_to_send_audit_windows_when_none_was_sent(owner_client, known_run):
    from recoverydash.runs.models import AuditWindow

    AuditWindow.objects.filter(run=known_run).delete()
    html = _page(owner_client, known_run)
    assert 'data-empty="audit"' in html
    assert "client.audit_window(update, accum_slot, sample_ids)" in html
    assert "data-count=" not in html


def test_it_compares_the_ids_digest_of_both_attempts_past_the_restore(owner_client, known_run):
    from recoverydash.ingest.actions import stored_body
    from recoverydash.runs.models import Event

    for attempt, digest in ((0, "a" * 32), (1, "b" * 32)):
        # the body as ingest stores it: the rank is the row's column, not in the body
        body = stored_body("update_committed", {
            "type": "update_committed", "update": 1251, "rank": 0, "attempt": attempt,
            "ids_digest": digest, "spans": []})
        assert body == {"update": 1251, "ids_digest": digest}
        Event.objects.create(run=known_run, event_id=f"d{attempt}", type="update_committed",
                             attempt=attempt, rank=0, time=COMMIT, content_hash="x", body=body)
    html = _page(owner_client, known_run)
    assert "ids_digest of each rank" in html
    assert "aaaaaaaaaaaaa…" in html and "bbbbbbbbbbbbb…" in html and "✖ no" in html


def test_the_window_box_says_what_it_shows_in_the_verdicts_words(owner_client, rolled_back_1251):
    """A verdict of replay with no omission beside a window whose expected ids were not delivered
    in the compared updates (a replay delays them): the box does not call them skipped, nor
    colour them as a defect; it names the verdict's counts."""
    from recoverydash.runs.models import Analysis

    analysis = Analysis.objects.get(run=rolled_back_1251)
    restarts = [dict(r, verdict="replay", replayed=64, omitted=0)
                for r in analysis.result["restarts"]]
    analysis.result = dict(analysis.result, restarts=restarts)
    analysis.save()
    html = _page(owner_client, rolled_back_1251)
    assert _count(html, "skipped-ids") == "8"
    assert "counts the whole resume from the ledger's positions: <strong>64</strong> " \
           "replayed and <strong>0</strong> omitted" in html
    assert "expected ids not delivered in these updates; the verdict counts no omitted " \
           "positions, so they are not omissions" in html
    box = re.search(r'<div class="stat ([^"]*)"><span class="stat-n" data-count="skipped-ids">',
                    html).group(1)
    assert "bad" not in box
    assert "the verdict's 64 replayed are not among the ids of these windows" in html
    assert 'class="id id-undelivered"' in html and 'class="id id-skipped"' not in html


def test_with_an_omission_the_expected_ids_not_delivered_are_skipped(owner_client,
                                                                     rolled_back_1251):
    html = _page(owner_client, rolled_back_1251)  # s2: omission of 48
    assert "skipped</mark> ids (expected here, delivered nowhere in these windows)" in html
    box = re.search(r'<div class="stat ([^"]*)"><span class="stat-n" data-count="skipped-ids">',
                    html).group(1)
    assert "bad" in box
