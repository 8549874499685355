"""Compaction (docs/retention.md): absorbed raw update and heartbeat rows past their retention
go in bounded batches; the analysis from the stored state is unchanged; rows not yet absorbed,
rows of audited updates and every other kind of row stay; a state that can no longer be
continued is not rebuilt from what is left."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from recoverydash.ingest.actions import ingest_batch
from recoverydash.runs import analysis as bridge
from recoverydash.runs.compaction import compact
from recoverydash.runs.models import (
    Analysis,
    Attempt,
    AuditWindow,
    Event,
    Generation,
    Heartbeat,
    LedgerRow,
    Run,
)
from tests.pipeline.test_incremental_analysis import NOW, S2, with_heartbeats

pytestmark = pytest.mark.django_db

LATER = timezone.now() + timedelta(days=8)  # every event of the scenario is past the retention
WITHIN = datetime(2026, 11, 6, tzinfo=UTC)  # 5 days after the scenario's events


def ingest_s2(project, scenario_loader, tmp_path, audit_update=None):
    events, _ = scenario_loader(S2, str(tmp_path))
    events = with_heartbeats(events, count=300)
    if audit_update is not None:
        events.append({"event_id": "aw", "type": "audit_window", "run_id": events[0]["run_id"],
                       "attempt": 0, "time": "2026-11-01T00:10:00Z", "update": audit_update,
                       "rank": 3, "accum_slot": 0, "sample_ids": [1, 2, 3]})
    ingest_batch(project, events)
    return Run.objects.get(run_id=events[0]["run_id"]), events


def test_it_deletes_absorbed_raw_rows_and_the_analysis_stays_the_same(
        project, scenario_loader, tmp_path):
    run, events = ingest_s2(project, scenario_loader, tmp_path)
    before = bridge.analyze(run, now=NOW).result
    raw = sum(1 for e in events if e["type"] in ("update_committed", "heartbeat"))
    kept_events = Event.objects.exclude(type__in=("update_committed", "heartbeat")).count()
    rows, beats = LedgerRow.objects.count(), Heartbeat.objects.count()
    assert (raw, rows, beats) == (1260 + 301, 1260, 301)
    assert compact(now=LATER, batch=500) == raw + rows + beats
    assert (LedgerRow.objects.count(), Heartbeat.objects.count()) == (0, 0)
    assert Event.objects.count() == kept_events == len(events) - raw
    assert Attempt.objects.count() == 2 and Generation.objects.count() == 1
    assert bridge.analyze(run, now=NOW).result == before
    assert Analysis.objects.get(run=run).compacted_at == LATER


def test_it_keeps_rows_not_yet_absorbed_or_within_the_retention(project, scenario_loader,
                                                                 tmp_path):
    run, events = ingest_s2(project, scenario_loader, tmp_path)
    assert compact(now=LATER) == 0  # never analysed: nothing absorbed
    bridge.analyze(run, now=NOW)
    assert compact(now=WITHIN) == 0  # absorbed, but within the 7 days
    ingest_batch(project, [{"event_id": "late", "type": "heartbeat", "run_id": run.run_id,
                            "attempt": 1, "time": "2026-11-01T00:40:00Z", "update": 1260}])
    compact(now=LATER)
    assert list(Heartbeat.objects.values_list("update", flat=True)) == [1260]
    assert Event.objects.filter(event_id="late").exists()


def test_it_keeps_the_ledger_rows_and_events_of_audited_updates(project, scenario_loader,
                                                                 tmp_path):
    run, _ = ingest_s2(project, scenario_loader, tmp_path, audit_update=600)
    bridge.analyze(run, now=NOW)
    compact(now=LATER, batch=100, max_batches=1000)
    assert set(LedgerRow.objects.values_list("attempt", "update")) == {(0, 600)}
    assert LedgerRow.objects.count() == 1  # the scenario reports each update once
    assert {e.body["update"] for e in Event.objects.filter(type="update_committed")} == {600}
    assert AuditWindow.objects.count() == 1


def test_it_stops_after_max_batches_and_goes_on_at_the_next_call(project, scenario_loader,
                                                                  tmp_path):
    run, _ = ingest_s2(project, scenario_loader, tmp_path)
    bridge.analyze(run, now=NOW)
    assert compact(now=LATER, batch=100, max_batches=3) == 300
    assert compact(now=LATER, batch=100_000) > 0
    assert compact(now=LATER) == 0


def test_it_refuses_to_rebuild_a_compacted_run_from_the_rows_left(project, scenario_loader,
                                                                   tmp_path):
    run, _ = ingest_s2(project, scenario_loader, tmp_path)
    bridge.analyze(run, now=NOW)
    compact(now=LATER)
    Analysis.objects.filter(run=run).update(state=b"not a state")
    # with nothing new the clock-only path reads no state (the stored result stands); any
    # analysis that reads it refuses
    assert bridge.analyze(run, now=NOW + 60).error == ""
    with pytest.raises(bridge.AnalysisFailed, match="compacted"):
        bridge.analyze_with_result(run, now=NOW + 60)
    assert "docs/retention.md" in Analysis.objects.get(run=run).error
    with pytest.raises(bridge.AnalysisFailed, match="compacted"):
        bridge.analyze(run, now=NOW + 120)  # the stored error: no clock-only path either


def test_it_compacts_nothing_when_compaction_is_off(project, scenario_loader, tmp_path,
                                                    settings):
    settings.RECOVERYDASH_COMPACTION = False
    run, _ = ingest_s2(project, scenario_loader, tmp_path)
    bridge.analyze(run, now=NOW)
    assert compact(now=LATER) == 0
