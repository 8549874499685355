"""The worker's analysis is incremental and exact: a run ingested in batches and analysed after
each equals the analysis rebuilt from every row, field by field, heartbeat-derived fields
(recomputed, the fetched chart) included; an analysis with nothing new reads no row twice."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from recoverydash import recovery
from recoverydash.ingest.actions import ingest_batch
from recoverydash.runs import analysis as bridge
from recoverydash.runs.models import Analysis, Heartbeat, LedgerRow, Run

pytestmark = pytest.mark.django_db

S2 = "s2_resume_at_read_cursor_omission"
NOW = datetime(2026, 11, 1, 1, 0, tzinfo=UTC).timestamp()


def with_heartbeats(events, count=700):
    """The scenario plus ``count`` heartbeats of attempt 0 from its 8 ranks (more than twice the
    chart's points, so the fold's stride doubles), read cursors below the final one."""
    run_id, start = events[0]["run_id"], datetime(2026, 11, 1, 0, 0, 6, tzinfo=UTC)
    beats = [{"event_id": f"{run_id}-hb{i}", "type": "heartbeat", "run_id": run_id,
              "attempt": 0, "rank": i % 8, "time": (start + timedelta(seconds=1.7 * i)).isoformat(),
              "update": i, "fetched": [{"stratum": "main", "epoch": 0, "position": 64 * i + 8}]}
             for i in range(count)]
    out, step = [], max(1, len(events) // count)
    for i, ev in enumerate(events):  # interleaved, as a trainer sends them
        out.append(ev)
        if i % step == 0 and beats:
            out.append(beats.pop(0))
    return out + beats


def full_input(run: Run) -> recovery.RunInput:
    """Every row of the run read whole, the way the analysis read it before the fold."""
    run_input = bridge.load_input(run)
    run_input.heartbeats = [recovery.HeartbeatRecord(h.attempt, h.rank, h.time.timestamp(),
                                                     h.update, h.fetched)
                            for h in Heartbeat.objects.filter(run=run).order_by("seq", "pk")]
    run_input.ledger = [recovery.LedgerRecord(r.attempt, r.update,
                                              None if r.rank == -1 else r.rank,
                                              r.time.timestamp(), r.spans)
                        for r in LedgerRow.objects.filter(run=run)]
    return run_input


def test_it_folds_batches_into_the_same_analysis_as_a_rebuild_from_every_row(
        project, scenario_loader, tmp_path, declare_location):
    declare_location(project, tmp_path)
    events, _ = scenario_loader(S2, str(tmp_path))
    events = with_heartbeats(events)
    cuts = [0, 1, 37, 300, 301, 900, 1500, len(events)]
    for lo, hi in zip(cuts, cuts[1:]):
        ingest_batch(project, events[lo:hi])
        bridge.analyze(Run.objects.get(run_id=events[0]["run_id"]), now=NOW)
    run = Run.objects.get(run_id=events[0]["run_id"])
    incremental = Analysis.objects.get(run=run).result

    Analysis.objects.filter(run=run).update(state=None, ingest_seq=0)
    rebuilt = bridge.analyze(run, now=NOW).result
    whole = recovery.analyze(full_input(run), NOW).to_dict()
    for name in whole:
        assert incremental[name] == rebuilt[name] == whole[name], name
    restart = incremental["restarts"][0]
    assert (restart["verdict"], restart["omitted"], restart["replayed"]) == ("omission", 48, 0)
    points = incremental["charts"]["fetched"][0]["points"]
    assert recovery.figures.CHART_POINTS <= len(points) - 1 <= 2 * recovery.figures.CHART_POINTS
    assert points[-1]["fetched"] == [{"stratum": "main", "epoch": 0, "position": 80_048}]


def test_it_reads_only_rows_above_the_absorbed_seq(project, scenario_loader, tmp_path):
    events, _ = scenario_loader(S2, str(tmp_path))
    events = with_heartbeats(events, count=100)
    ingest_batch(project, events[:1000])
    run = Run.objects.get(run_id=events[0]["run_id"])
    bridge.analyze(run, now=NOW)
    seq = Analysis.objects.get(run=run).ingest_seq
    state = bridge.load_state(*Analysis.objects.filter(run=run).values_list("pk", "state").get())
    assert bridge.absorb_new(run, state, seq, seq) == (0, 0)
    ingest_batch(project, events[1000:])
    new_rows = LedgerRow.objects.filter(run=run, last_seq__gt=seq).count()
    new_beats = Heartbeat.objects.filter(run=run, seq__gt=seq).count()
    assert new_rows and new_beats
    run.refresh_from_db()
    assert bridge.absorb_new(run, state, seq, run.ingest_seq) == (new_rows, new_beats)
    assert set(Heartbeat.objects.filter(run=run).values_list("seq", flat=True)) \
        == {seq, run.ingest_seq}


def test_it_rebuilds_a_state_of_an_older_format_from_every_row(project, scenario_loader, tmp_path):
    import json
    import zlib

    events, _ = scenario_loader(S2, str(tmp_path))
    ingest_batch(project, events)
    run = Run.objects.get(run_id=events[0]["run_id"])
    expected = bridge.analyze(run, now=NOW).result
    from state_formats import format_4

    stored = bridge.load_state(*Analysis.objects.filter(run=run).values_list("pk", "state").get())
    doc = json.loads(zlib.decompress(format_4(stored)))
    doc["format"] = 3
    del doc["heartbeats"]  # a format 3 state: no heartbeats folded
    Analysis.objects.filter(run=run).update(state=zlib.compress(json.dumps(doc).encode()))
    ingest_batch(project, [{"event_id": "late-hb", "type": "heartbeat", "run_id": run.run_id,
                            "attempt": 1, "time": "2026-11-01T00:40:00Z", "update": 1260}])
    again = bridge.analyze(run, now=NOW).result
    assert again["restarts"] == expected["restarts"]
    assert again["charts"]["fetched"][0] == expected["charts"]["fetched"][0]  # attempt 0's beat
    assert [p["update"] for p in again["charts"]["fetched"][1]["points"]] == [1260]
    stored = bridge.load_state(*Analysis.objects.filter(run=run).values_list("pk", "state").get())
    assert stored.state_format == recovery.ledger.STATE_FORMAT


def test_it_stores_no_state_again_when_nothing_new_was_absorbed(project, scenario_loader,
                                                                  tmp_path):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    events, _ = scenario_loader(S2, str(tmp_path))
    ingest_batch(project, with_heartbeats(events, count=100))
    run = Run.objects.get(run_id=events[0]["run_id"])
    first = bridge.analyze(run, now=NOW)
    stored = bytes(first.state)
    with CaptureQueriesContext(connection) as queries:
        again = bridge.analyze(run, now=NOW + 600)
    writes = [q["sql"] for q in queries.captured_queries
              if q["sql"].startswith("UPDATE") and "runs_analysis" in q["sql"]]
    assert writes and not any('"state"' in sql for sql in writes)
    assert bytes(Analysis.objects.get(run=run).state) == stored
    assert again.ingest_seq == first.ingest_seq
    assert again.result["seconds_since_last_restorable"] == \
        first.result["seconds_since_last_restorable"] + 600


@pytest.mark.parametrize("later", [600.0, 30 * 86400.0])
def test_nothing_new_writes_only_the_clock_driven_figures_and_equals_a_rebuild(
        project, scenario_loader, tmp_path, later):
    """With nothing new, the result is not sent again (only its clock-driven keys, merged into
    the stored jsonb), the generations' statuses are neither read nor written, and what is
    stored equals the analysis of a rebuild from every row at the same time."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    events, _ = scenario_loader(S2, str(tmp_path))
    ingest_batch(project, with_heartbeats(events, count=100))
    run = Run.objects.get(run_id=events[0]["run_id"])
    first = bridge.analyze(run, now=NOW)
    assert first.result["generations"]
    with CaptureQueriesContext(connection) as queries:
        bridge.analyze(run, now=NOW + later)
    sqls = [q["sql"] for q in queries.captured_queries]
    writes = [sql for sql in sqls if sql.startswith("UPDATE") and "runs_analysis" in sql]
    assert len(writes) == 2  # the merge of the clock-driven keys, the row's small columns
    # PostgreSQL merges into the stored jsonb; SQLite rewrites the result (_merge_result)
    assert connection.vendor != "postgresql" or not any(
        '"generations"' in sql or '"strata"' in sql or '"committed_cursor"' in sql
        for sql in writes)
    assert not any(sql.startswith('SELECT "runs_generation"."id", '
                                  '"runs_generation"."generation_id", '
                                  '"runs_generation"."status"') or
                   sql.startswith('UPDATE "runs_generation"') for sql in sqls)
    stored = Analysis.objects.get(run=run)
    Analysis.objects.filter(run=run).delete()
    rebuilt = bridge.analyze(run, now=NOW + later)
    assert stored.result == rebuilt.result
    assert (stored.clock, stored.clock_since_s, stored.health) == \
        (rebuilt.clock, rebuilt.clock_since_s, rebuilt.health)
    assert stored.ingest_seq == rebuilt.ingest_seq
    assert stored.result["seconds_since_last_restorable"] == \
        first.result["seconds_since_last_restorable"] + later


def test_split_clock_driven_takes_apart_and_puts_back_the_result(project, scenario_loader,
                                                                 tmp_path):
    events, _ = scenario_loader(S2, str(tmp_path))
    ingest_batch(project, events)
    result = bridge.analyze(Run.objects.get(run_id=events[0]["run_id"]), now=NOW).result
    rest, timed = recovery.split_clock_driven(result)
    assert set(timed) == {"health", "seconds_since_last_restorable", "costs", "charts"}
    assert set(timed["charts"]) == {"tslrc"}
    assert set(rest["charts"]) == {"committed_cursor", "fetched"}
    assert {**rest, **timed, "charts": {**rest["charts"], **timed["charts"]}} == result


def test_it_reads_every_span_shape_into_the_state_of_the_rows_records(project):
    """The common shape read as columns (PostgreSQL) and every other shape read as JSON give
    the ledger state of the rows' records absorbed by the core."""
    run = Run.objects.create(project=project, run_id="shapes")
    when = datetime(2026, 11, 1, tzinfo=UTC)
    odd = [[{"stratum": "m", "epoch": 0, "ranges": [[0, 4]]}],
           [{"stratum": 'q"uote', "epoch": 0, "ranges": [[0, 4, 2]]}],
           [{"stratum": "m", "epoch": 0, "order": "o1", "ranges": [[8, 12]]}],
           [{"stratum": "m", "epoch": 0, "ranges": [[20, 24], [30, 34]]}],
           [{"stratum": "m", "epoch": 1, "ranges": [[0, 6]], "padding": True}],
           [{"stratum": "ids", "epoch": 0, "ids": [3, "x", 9]}],
           [{"stratum": "m", "epoch": 0, "ranges": [[40, 44]]},
            {"stratum": "n", "epoch": 0, "ranges": [[0, 2]]}],
           [], [{"stratum": "é", "ranges": [[0, 4]]}],
           [{"stratum": "é", "epoch": 2, "ranges": [[0, 4]]}]]
    rows = []
    for update in range(1, 30):
        for rank in range(4):
            if update % 5 == 0 and rank == 1:
                spans = odd[(update // 5 + rank) % len(odd)]
            else:
                spans = [{"stratum": "main", "epoch": 0,
                          "ranges": [[update * 16 + rank, update * 16 + 16, 4]]}]
            rows.append(LedgerRow(run=run, attempt=0, update=update,
                                  rank=-1 if (update, rank) == (7, 3) else rank,
                                  time=when + timedelta(seconds=update), spans=spans,
                                  first_seq=update, last_seq=update))
    rows += [LedgerRow(run=run, attempt=1, update=u, rank=0, time=when, spans=odd[u % len(odd)],
                       first_seq=40, last_seq=40) for u in range(len(odd))]
    LedgerRow.objects.bulk_create(rows)
    state = recovery.Ledger()
    assert bridge.absorb_new(run, state, -1, 15) == (60, 0)
    state = recovery.Ledger.from_bytes(state.to_bytes())
    assert bridge.absorb_new(run, state, 15, 100) == (len(rows) - 60, 0)
    records = [recovery.LedgerRecord(r.attempt, r.update, None if r.rank == -1 else r.rank,
                                     r.time.timestamp(), r.spans)
               for r in LedgerRow.objects.filter(run=run).order_by("last_seq", "attempt",
                                                                   "update", "rank")]
    assert state.to_bytes() == recovery.Ledger.from_records(records).to_bytes()


def test_it_reads_folded_rows_into_the_state_of_their_unfolded_records(project):
    """Folded rows (docs/ingest-v1.md#update_aggregate, "Storage"; the SDK's span with its
    order, an update split in two rows, a rank re-sent beside its row, other shapes folded) read
    by the worker (PostgreSQL: the common shape as columns, handed folded to the core) give the
    ledger state of the records they hold, each row's ranks in rank order."""
    from datetime import UTC

    from recoverydash.runs.folding import unfold

    run = Run.objects.create(project=project, run_id="folded")
    when = datetime(2026, 11, 1, tzinfo=UTC)
    W, m = 16, 4
    rows = []

    def span(rank, update):  # the SDK's report of a DistributedSampler rank
        p = (update - 1) * W * m
        return [{"stratum": "main", "epoch": 0, "ranges": [[p + rank, p + W * m + rank, W]],
                 "order": "e187"}]

    for update in range(1, 41):
        seq = 1 + update // 10
        if update % 7 == 0:  # the update in two rows, the second half later
            rows += [LedgerRow(run=run, attempt=0, update=update, rank=0, ranks=9, rank_shift=1,
                               time=when + timedelta(seconds=update), spans=span(0, update),
                               first_seq=seq, last_seq=seq),
                     LedgerRow(run=run, attempt=0, update=update, rank=9, ranks=7, rank_shift=1,
                               time=when + timedelta(seconds=update + 0.5), spans=span(9, update),
                               first_seq=seq, last_seq=seq)]
        else:
            rows.append(LedgerRow(run=run, attempt=0, update=update, rank=0, ranks=W,
                                  rank_shift=1, time=when + timedelta(seconds=update),
                                  spans=span(0, update), first_seq=seq, last_seq=seq))
        if update == 12:  # rank 5 again, other positions
            rows.append(LedgerRow(run=run, attempt=0, update=12, rank=5, ranks=1,
                                  time=when + timedelta(seconds=30), spans=[
                                      {"stratum": "main", "epoch": 0, "order": "e187",
                                       "ranges": [[90_000, 90_002]]}],
                                  first_seq=seq, last_seq=seq))
    rows += [LedgerRow(run=run, attempt=1, update=u, rank=2, ranks=3, rank_shift=100,
                       time=when, first_seq=9, last_seq=9, spans=[
                           {"stratum": "a", "epoch": 0,
                            "ranges": [[u * 10, u * 10 + 2], [5000, 5001]]},
                           {"stratum": "b", "epoch": 1, "ranges": [[u, u + 1]], "padding": True}])
             for u in range(1, 4)]
    LedgerRow.objects.bulk_create(rows)
    state = recovery.Ledger()
    assert bridge.absorb_new(run, state, -1, 3) == (W * 29 + 1, 0)  # updates 1..29
    state = recovery.Ledger.from_bytes(state.to_bytes())
    assert bridge.absorb_new(run, state, 3, 100) == (W * 11 + 9, 0)  # 30..40, attempt 1
    records = [recovery.LedgerRecord(r.attempt, r.update, rank, r.time.timestamp(), list(part))
               for r in sorted(LedgerRow.objects.filter(run=run),
                               key=lambda r: (r.last_seq > 3, r.attempt, r.update, r.rank))
               for rank, part in unfold(r.rank, r.ranks, r.rank_shift, r.spans)]
    assert state.to_bytes() == recovery.Ledger.from_records(records).to_bytes()
    assert state.segment(0, 11, 12)[("main", 0, "e187")].consumed == W * m + 2
