"""Folded ledger rows (runs.folding, docs/ingest-v1.md#update_aggregate): the parts of an update
that have the DistributedSampler shape are one row, and everything read from it (the analysis,
the restart page) equals what the per-rank events it replaces give, field by field; a missing
rank, a duplicate position, a rank's own later report stay what they are."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from django.db.models import Q

from recoverydash.dashboard.queries import _windows, restart_detail
from recoverydash.ingest.actions import ingest_batch
from recoverydash.runs.analysis import analyze
from recoverydash.runs.folding import fold, unfold
from recoverydash.runs.models import AuditWindow, LedgerRow, Project, Run, rank_reports

W = 64
B = 2  # samples per rank per update
NOW = 1_793_500_000.0


def at(t: int) -> str:
    return f"2026-11-01T00:{t // 60:02d}:{t % 60:02d}Z"


def spans(u: int, rank: int) -> list[dict]:
    """The SDK's span of rank ``rank`` at update ``u`` (sdk.ledger: ``[r + lo*W, r + hi*W, W]``)."""
    base = (u - 1) * B * W
    return [{"stratum": "m", "epoch": 0, "ranges": [[base + rank, base + rank + B * W, W]]}]


def started(attempt, resumed=None, t=0):
    ev = {"event_id": f"s{attempt}", "type": "attempt_started", "run_id": "r",
          "attempt": attempt, "time": at(t), "world_size": W, "dataset_version": "v",
          "global_batch_size": W * B}
    if resumed:
        ev["resumed_from"] = resumed
    return ev


def own(attempt, u, rank, t, span=None, suffix=""):
    return {"event_id": f"u{attempt}-{u}-{rank}{suffix}", "type": "update_committed",
            "run_id": "r", "attempt": attempt, "rank": rank, "time": at(t), "update": u,
            "samples": B, "spans": span if span is not None else spans(u, rank)}


def aggregate(attempt, u, t, parts, suffix=""):
    return {"event_id": f"agg{attempt}-{u}{suffix}", "type": "update_aggregate", "run_id": "r",
            "attempt": attempt, "rank": 0, "time": at(t), "update": u,
            "ranks": [{"rank": r, "spans": s, "samples": B} for r, s in parts]}


def restart(first_ranks=range(W), first_spans=spans):
    """``(starts, [(attempt, update, t, [(rank, spans)])])``: attempt 0 commits updates 1..6,
    attempt 1 resumes at update 3 and commits 4..6, its first update reported by
    ``first_ranks`` with ``first_spans``."""
    cursor = [{"stratum": "m", "epoch": 0, "position": 3 * B * W}]
    starts = [started(0), started(1, {"update": 3, "cursor": cursor}, 20)]
    updates = [(0, u, u, [(r, spans(u, r)) for r in range(W)]) for u in range(1, 7)]
    updates.append((1, 4, 21, [(r, first_spans(4, r)) for r in first_ranks]))
    updates += [(1, u, 20 + u, [(r, spans(u, r)) for r in range(W)]) for u in (5, 6)]
    return starts, updates


def per_rank(name, starts, updates, extra=()):
    """The run of ``updates`` sent as per-rank events, each rank its own batches (nothing to
    fold: one rank per update in a batch)."""
    project = Project.objects.create(name=name)
    ingest_batch(project, starts)
    for rank in range(W):
        batch = [own(a, u, r, t, s) for a, u, t, parts in updates for r, s in parts if r == rank]
        if batch:
            ingest_batch(project, batch)
    if extra:
        ingest_batch(project, list(extra))
    return Run.objects.get(project=project)


def aggregated(name, starts, updates, extra=()):
    project = Project.objects.create(name=name)
    ingest_batch(project, starts)
    for start in range(0, len(updates), 3):
        ingest_batch(project, [aggregate(a, u, t, parts) for a, u, t, parts in
                               updates[start:start + 3]])
    if extra:
        ingest_batch(project, list(extra))
    return Run.objects.get(project=project)


def reports(run):
    return rank_reports(LedgerRow.objects.filter(run=run).order_by("pk"))


def stored(run, attempt=None, update=None):
    rows = LedgerRow.objects.filter(run=run)
    if attempt is not None:
        rows = rows.filter(attempt=attempt, update=update)
    return sorted(rows.values_list("rank", "ranks", "rank_shift"))


def test_it_folds_and_unfolds_the_distributed_sampler_shape_exactly():
    when = datetime(2026, 11, 1, tzinfo=timezone.utc)
    parts = {r: {"time": when, "spans": spans(3, r), "samples": B, "tokens": None}
             for r in range(W)}
    ((rank, ranks, shift, entry),) = fold(parts)
    assert (rank, ranks, shift) == (0, 64, 1)
    assert entry["spans"] == [{"stratum": "m", "epoch": 0, "ranges": [[256, 384, 64]]}]
    assert dict(unfold(rank, ranks, shift, entry["spans"])) == {r: parts[r]["spans"]
                                                                for r in range(W)}
    # rank 17 absent, rank 40 with another sample count, rank 41 reporting rank 40's position
    # again, a null rank: each breaks the fold where it stands, and the rows give back the parts
    del parts[17]
    parts[40] = dict(parts[40], samples=3)
    parts[41] = dict(parts[41], spans=spans(3, 40))
    parts[-1] = {"time": when, "spans": spans(3, 0), "samples": B, "tokens": None}
    rows = fold(parts)
    # (41 and 42 are 2 apart: one fold of shift 2, then 43-63 of shift 1)
    assert [(r, n, s) for r, n, s, _ in rows] == [(-1, 1, 0), (0, 17, 1), (18, 22, 1),
                                                 (40, 1, 0), (41, 2, 2), (43, 21, 1)]
    back = {rank: spans for r, n, s, e in rows for rank, spans in unfold(r, n, s, e["spans"])}
    assert back == {r: p["spans"] for r, p in parts.items()}
    # sample ids never fold
    ids = {r: {"time": when, "spans": [{"stratum": "x", "ids": [r]}], "samples": 1,
               "tokens": None} for r in range(3)}
    assert [(r, n, s) for r, n, s, _ in fold(ids)] == [(0, 1, 0), (1, 1, 0), (2, 1, 0)]


@pytest.mark.django_db
def test_it_stores_an_aggregate_of_64_ranks_as_one_row_with_the_per_rank_analysis():
    starts, updates = restart()
    want_run, agg_run = per_rank("per-rank", starts, updates), aggregated("agg", starts, updates)
    assert LedgerRow.objects.filter(run=want_run).count() == 9 * W
    assert stored(agg_run) == [(0, 64, 1)] * 9  # one row per update
    assert stored(agg_run, 1, 4) == [(0, 64, 1)]
    assert reports(agg_run) == reports(want_run)
    assert len(reports(agg_run)) == 9 * W
    want, got = analyze(want_run, now=NOW).result, analyze(agg_run, now=NOW).result
    assert set(got) == set(want)
    for key in want:
        assert got[key] == want[key], key
    (item,) = got["restarts"]
    assert item["resumed_update"] == 3


@pytest.mark.django_db
def test_it_keeps_a_rank_missing_from_a_folded_update_missing():
    starts, updates = restart(first_ranks=[r for r in range(W) if r != 17])
    want_run, agg_run = per_rank("per-rank", starts, updates), aggregated("agg", starts, updates)
    assert stored(agg_run, 1, 4) == [(0, 17, 1), (18, 46, 1)]
    assert reports(agg_run) == reports(want_run)
    want, got = analyze(want_run, now=NOW).result, analyze(agg_run, now=NOW).result
    assert got == want
    (item,) = got["restarts"]
    (finding,) = [f for f in item["findings"] if f["code"] == "incomplete_first_update"]
    assert finding["detail"].startswith("rank 17 of 64 never reported update 4")


@pytest.mark.django_db
def test_it_counts_two_ranks_reporting_one_position_as_a_duplicate():
    # attempt 1's rank 41 reports rank 40's positions at update 4 (and rank 41's are omitted)
    def first(u, rank):
        return spans(u, 40 if rank == 41 else rank)

    starts, updates = restart(first_spans=first)
    want_run, agg_run = per_rank("per-rank", starts, updates), aggregated("agg", starts, updates)
    # 41 (at 40's position) and 42 are 2 apart: folds of shift 1, 2, 1
    assert stored(agg_run, 1, 4) == [(0, 41, 1), (41, 2, 2), (43, 21, 1)]
    assert reports(agg_run) == reports(want_run)
    want, got = analyze(want_run, now=NOW).result, analyze(agg_run, now=NOW).result
    assert got == want
    base = analyze(aggregated("clean", *restart()), now=NOW).result
    (stratum,) = got["strata"]
    (clean,) = base["strata"]
    assert stratum["duplicates"] == clean["duplicates"] + B
    assert stratum["omissions"] == clean["omissions"] + B


@pytest.mark.django_db
def test_it_unites_a_ranks_own_later_report_with_its_part_in_a_folded_row():
    starts, updates = restart()
    # rank 7's own report of attempt 1's update 4 arrives later with one more range
    more = [{"stratum": "m", "epoch": 0, "ranges": [[5000, 5002]]}]
    later = [own(1, 4, 7, 30, more, suffix="-late")]
    want_run = per_rank("per-rank", starts, updates, later)
    agg_run = aggregated("agg", starts, updates)
    first = analyze(agg_run, now=NOW)  # the folded row is absorbed before the late report
    ingest_batch(agg_run.project, later)
    assert stored(agg_run, 1, 4) == [(0, 64, 1), (7, 1, 0)]
    assert reports(agg_run)[(1, 4, 7)]["spans"] == spans(4, 7) + more
    assert reports(agg_run) == reports(want_run)
    got = analyze(agg_run, now=NOW).result
    want = analyze(want_run, now=NOW).result
    assert got == want
    assert got != first.result  # the late range counts
    # the same aggregate again under another event_id unites into the folded row (no new row)
    ingest_batch(agg_run.project, [aggregate(1, 4, 21, [(r, spans(4, r)) for r in range(W)],
                                             suffix="-again")])
    assert stored(agg_run, 1, 4) == [(0, 64, 1), (7, 1, 0)]
    assert analyze(agg_run, now=NOW).result == want


@pytest.mark.django_db
def test_it_unites_folds_of_another_shift_rank_by_rank():
    starts, updates = restart()
    agg_run = aggregated("agg", starts, updates)
    # a second aggregate of update 4 in which every rank adds a range 2 * rank apart (shift 2)
    extra = [(r, [{"stratum": "m", "epoch": 0, "ranges": [[9000 + 2 * r, 9001 + 2 * r]]}])
             for r in range(W)]
    ingest_batch(agg_run.project, [aggregate(1, 4, 21, extra, suffix="-b")])
    assert stored(agg_run, 1, 4) == [(0, 1, 0)] + [(0, 64, 1)] + [(r, 1, 0) for r in range(1, W)]
    want_run = per_rank("per-rank", starts, updates,
                        [own(1, 4, r, 21, s, suffix="-b") for r, s in extra])
    assert reports(agg_run) == reports(want_run)
    assert analyze(agg_run, now=NOW).result == analyze(want_run, now=NOW).result


@pytest.mark.django_db
def test_the_restart_page_shows_the_same_ledger_detail_from_folded_rows():
    starts, updates = restart()
    runs = [per_rank("per-rank", starts, updates), aggregated("agg", starts, updates)]
    details, epochs = [], []
    for run in runs:
        for attempt, update in ((0, 3), (0, 4), (1, 4)):
            for rank in (0, 5, 63):
                AuditWindow.objects.create(run=run, attempt=attempt, update=update, rank=rank,
                                           accum_slot=0, time=datetime(2026, 11, 1,
                                                                       tzinfo=timezone.utc),
                                           sample_ids=[f"s{update}-{rank}"])
        result = analyze(run, now=NOW).result
        details.append(restart_detail(run, 1, result["restarts"]))
        epochs.append([(w["update"], w["rank"], w["epoch"]) for a in (0, 1)
                       for w in _windows(run, a, Q())])
    want, got = details
    assert got.before == want.before and got.after == want.after
    assert got.windows == want.windows and got.windows
    assert epochs[0] == epochs[1]
    assert sorted(epochs[1]) == sorted([(u, r, 0) for u in (3, 4) for r in (0, 5, 63)]
                                       + [(4, r, 0) for r in (0, 5, 63)])
