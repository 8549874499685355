"""A stored state of format 4 (the release before formats 5 and 6's layouts) is continued by
the worker, also on a compacted run (docs/retention.md: it holds everything format 6 holds), and
written again in format 6 (a head and its time blocks); the analysis equals a rebuild from every
row. A format 6 state writes only the blocks that changed."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.utils import timezone
from state_formats import format_4

from recoverydash.ingest.actions import ingest_batch
from recoverydash.recovery.ledger import STATE_FORMAT
from recoverydash.runs import analysis as bridge
from recoverydash.runs.models import Analysis, Run, StateBlock

pytestmark = pytest.mark.django_db

S2 = "s2_resume_at_read_cursor_omission"
NOW = datetime(2026, 11, 1, 1, 0, tzinfo=UTC).timestamp()


def test_a_format_4_state_is_continued_and_written_in_format_6(project, scenario_loader,
                                                                  tmp_path):
    events, _ = scenario_loader(S2, str(tmp_path))
    cut = len(events) - 40
    ingest_batch(project, events[:cut])
    run = Run.objects.get(run_id=events[0]["run_id"])
    bridge.analyze(run, now=NOW)
    stored = Analysis.objects.get(run=run)
    old = format_4(bridge.load_state(stored.pk, stored.state))
    # as the previous release left it, its raw rows said compacted: a state that could not be
    # continued would be refused, not rebuilt
    Analysis.objects.filter(run=run).update(state=old, state_format=4,
                                            compacted_at=timezone.now())
    ingest_batch(project, events[cut:])
    continued = bridge.analyze(run, now=NOW)
    assert continued.error == ""
    assert continued.state_format == STATE_FORMAT == 6
    assert bridge.load_state(continued.pk, continued.state).state_format == 6
    assert StateBlock.objects.filter(analysis=continued).count() > 0
    Analysis.objects.filter(run=run).delete()
    assert continued.result == bridge.analyze(run, now=NOW).result


def test_an_analysis_writes_the_head_and_only_the_time_blocks_that_changed(project):
    """5,000 updates fill time blocks 0 (updates 0-4,095) and 1; 20 more touch block 1 only:
    block 0's stored bytes are not written again, and the state loads equal to a rebuild."""
    t0 = datetime(2026, 11, 1, 0, 0, tzinfo=UTC).timestamp()

    def events(first, last):
        return [{"event_id": f"u{u}", "type": "update_committed", "run_id": "blocks",
                       "attempt": 0, "rank": 0, "update": u, "samples": 2,
                       "time": datetime.fromtimestamp(t0 + u, UTC).isoformat(),
                       "spans": [{"stratum": "main", "epoch": 0,
                                  "ranges": [[2 * u, 2 * u + 2]]}]}
                      for u in range(first, last + 1)]

    ingest_batch(project, [{
        "event_id": "start", "type": "attempt_started", "run_id": "blocks", "attempt": 0,
        "time": datetime.fromtimestamp(t0, UTC).isoformat(), "world_size": 1,
        "dataset_version": "ds",
        "global_batch_size": 2, "micro_batch_size": 2, "grad_accum_steps": 1}])
    for lo in range(1, 5001, 1000):
        ingest_batch(project, events(lo, lo + 999))
    run = Run.objects.get(run_id="blocks")
    first = bridge.analyze(run, now=t0 + 6000)
    before = dict(((a, b), bytes(d)) for a, b, d in
                  StateBlock.objects.filter(analysis=first).values_list("attempt", "block", "data"))
    assert sorted(before) == [(0, 0), (0, 1)]
    ingest_batch(project, events(5001, 5020))
    again = bridge.analyze(run, now=t0 + 6000)
    after = {(a, b): (pk, bytes(d)) for pk, a, b, d in StateBlock.objects.filter(
        analysis=again).values_list("pk", "attempt", "block", "data")}
    assert after[(0, 0)][1] == before[(0, 0)]
    assert after[(0, 1)][1] != before[(0, 1)]
    state = bridge.load_state(again.pk, again.state)
    assert state.update_time(0, 5020) == t0 + 5020 and state.update_time(0, 17) == t0 + 17
    result = again.result
    Analysis.objects.filter(run=run).delete()
    rebuilt = bridge.analyze(run, now=t0 + 6000)
    assert rebuilt.result == result
    assert bridge.load_state(rebuilt.pk, rebuilt.state).to_bytes() == state.to_bytes()
