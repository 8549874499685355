"""A stored state of format 4 (the release before format 5's layout) is continued by the
worker, also on a compacted run (docs/retention.md: it holds everything format 5 holds), and
written again in format 5; the analysis equals a rebuild from every row."""

from __future__ import annotations

from datetime import datetime, timezone as tz

import pytest
from django.utils import timezone

from recoverydash import recovery
from state_formats import format_4
from recoverydash.ingest.actions import ingest_batch
from recoverydash.recovery.ledger import STATE_FORMAT
from recoverydash.runs import analysis as bridge
from recoverydash.runs.models import Analysis, Run

pytestmark = pytest.mark.django_db

S2 = "s2_resume_at_read_cursor_omission"
NOW = datetime(2026, 11, 1, 1, 0, tzinfo=tz.utc).timestamp()


def test_a_format_4_state_is_continued_and_written_in_format_5(project, scenario_loader,
                                                                  tmp_path):
    events, _ = scenario_loader(S2, str(tmp_path))
    cut = len(events) - 40
    ingest_batch(project, events[:cut])
    run = Run.objects.get(run_id=events[0]["run_id"])
    bridge.analyze(run, now=NOW)
    stored = Analysis.objects.get(run=run)
    old = format_4(recovery.Ledger.from_bytes(bytes(stored.state)))
    # as the previous release left it, its raw rows said compacted: a state that could not be
    # continued would be refused, not rebuilt
    Analysis.objects.filter(run=run).update(state=old, state_format=4,
                                            compacted_at=timezone.now())
    ingest_batch(project, events[cut:])
    continued = bridge.analyze(run, now=NOW)
    assert continued.error == ""
    assert continued.state_format == STATE_FORMAT == 5
    assert recovery.Ledger.from_bytes(bytes(
        Analysis.objects.get(run=run).state)).state_format == 5
    Analysis.objects.filter(run=run).delete()
    assert continued.result == bridge.analyze(run, now=NOW).result
