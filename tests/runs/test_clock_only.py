"""The worker's analysis with nothing new takes the clock-only path (``runs.analysis.analyze``):
the clock-driven figures come from the stored ``Analysis.clock_basis``, the ledger state and
the stored inputs are neither read nor decoded, no generation is judged again, and what is
stored equals a full analysis of every row at the same time (exact values)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from recoverydash import recovery
from recoverydash.ingest.actions import ingest_batch
from recoverydash.recovery import analysis as core_analysis
from recoverydash.runs import analysis as bridge
from recoverydash.runs.models import Analysis, Run

pytestmark = pytest.mark.django_db

S2 = "s2_resume_at_read_cursor_omission"
NOW = datetime(2026, 11, 1, 1, 0, tzinfo=UTC).timestamp()


class Calls:
    """Counts the calls of a few core functions (each still runs as it is)."""

    def __init__(self, monkeypatch):
        self.counts = {"from_parts": 0, "analyze": 0}
        real_from_parts = recovery.Ledger.from_parts.__func__
        real_analyze = core_analysis.analyze

        def from_parts(cls, head, blocks):
            self.counts["from_parts"] += 1
            return real_from_parts(cls, head, blocks)

        def analyze(*args, **kwargs):
            self.counts["analyze"] += 1
            return real_analyze(*args, **kwargs)

        monkeypatch.setattr(recovery.Ledger, "from_parts", classmethod(from_parts))
        monkeypatch.setattr(recovery, "analyze", analyze)


def rebuilt(run, now):
    """The stored analysis of a rebuild from every row at ``now`` (the row deleted first)."""
    Analysis.objects.filter(run=run).delete()
    return bridge.analyze(run, now=now)


@pytest.mark.parametrize("later", [600.0, 30 * 86400.0])
def test_nothing_new_reads_no_state_and_equals_a_full_analysis(project, scenario_loader, tmp_path,
                                                               monkeypatch, later):
    events, _ = scenario_loader(S2, str(tmp_path))
    ingest_batch(project, events)
    run = Run.objects.get(run_id=events[0]["run_id"])
    first = bridge.analyze(run, now=NOW)
    assert first.clock_basis["now"] == NOW
    calls = Calls(monkeypatch)
    with CaptureQueriesContext(connection) as queries:
        again = bridge.analyze(run, now=NOW + later)
    assert calls.counts == {"from_parts": 0, "analyze": 0}
    reads = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT")]
    assert not any('"runs_analysis"."state"' in sql or '"runs_analysis"."inputs"' in sql
                   for sql in reads)
    assert again.result["seconds_since_last_restorable"] == \
        first.result["seconds_since_last_restorable"] + later
    stored = Analysis.objects.get(run=run)
    full = rebuilt(run, NOW + later)
    assert calls.counts["analyze"] == 1
    assert stored.result == full.result
    assert (stored.health, stored.clock, stored.ingest_seq) == \
        (full.health, full.clock, full.ingest_seq)


def events_of(run_id, updates, last_ranks):
    """A 2-rank run, one update every 10 s from 00:00:10: updates ``1..updates`` reported by
    both ranks but the last, reported by ``last_ranks`` only."""
    t0 = datetime(2026, 11, 1, 0, 0, tzinfo=UTC)
    out = [{"event_id": f"{run_id}-start", "type": "attempt_started", "run_id": run_id,
            "attempt": 0, "time": t0.isoformat(), "world_size": 2, "dataset_version": "ds",
            "global_batch_size": 4, "micro_batch_size": 2, "grad_accum_steps": 1}]
    for u in range(1, updates + 1):
        for rank in (range(2) if u < updates else last_ranks):
            out.append({"event_id": f"{run_id}-u{u}-{rank}", "type": "update_committed",
                        "run_id": run_id, "attempt": 0, "rank": rank, "update": u,
                        "samples": 2, "time": (t0 + timedelta(seconds=10 * u)).isoformat(),
                        "spans": [{"stratum": "main", "epoch": 0,
                                   "ranges": [[4 * (u - 1) + 2 * rank,
                                               4 * (u - 1) + 2 * rank + 2]]}]})
    return out


def test_an_update_settling_by_age_takes_the_full_analysis(project, monkeypatch, settings):
    settings.RECOVERYDASH_SETTLE_S = 300.0
    ingest_batch(project, events_of("settling", 5, [0]))
    run = Run.objects.get(run_id="settling")
    t5 = datetime(2026, 11, 1, 0, 0, 50, tzinfo=UTC).timestamp()  # update 5's report
    first = bridge.analyze(run, now=t5 + 60)
    assert first.clock_basis["earliest_unsettled"] == t5
    counted = first.result["strata"][0]
    calls = Calls(monkeypatch)
    bridge.analyze(run, now=t5 + 299)  # update 5 not settled yet: clock only
    assert calls.counts == {"from_parts": 0, "analyze": 0}
    assert Analysis.objects.get(run=run).result["strata"][0] == counted
    settled = bridge.analyze(run, now=t5 + 300)  # it settles by age: a full analysis
    assert calls.counts == {"from_parts": 1, "analyze": 1}
    assert settled.result["strata"][0] != counted
    assert settled.clock_basis["earliest_unsettled"] is None
    stored = Analysis.objects.get(run=run)
    assert stored.result == rebuilt(run, t5 + 300).result
    # from then on the clock-only path again, equal to a rebuild at each time
    bridge.analyze(run, now=t5 + 4000)
    assert calls.counts["analyze"] == 2  # the rebuild's only
    assert Analysis.objects.get(run=run).result == rebuilt(run, t5 + 4000).result


def test_analyze_with_result_always_analyses(project, scenario_loader, tmp_path, monkeypatch):
    events, _ = scenario_loader(S2, str(tmp_path))
    ingest_batch(project, events)
    run = Run.objects.get(run_id=events[0]["run_id"])
    bridge.analyze(run, now=NOW)
    calls = Calls(monkeypatch)
    row, outcome = bridge.analyze_with_result(run, now=NOW + 60)
    assert calls.counts == {"from_parts": 1, "analyze": 1}
    assert outcome.to_dict() == row.result
