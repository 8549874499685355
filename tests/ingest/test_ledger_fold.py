"""Folded ledger rows (runs.folding, docs/ingest-v1.md#update_aggregate): the parts of an update
that have the DistributedSampler shape are one row, and everything read from it (the analysis,
the restart page) equals what the per-rank events it replaces give, field by field; a missing
rank, a duplicate position, a rank's own later report stay what they are."""

from __future__ import annotations

import random
from contextlib import contextmanager, nullcontext
from datetime import UTC, datetime
from unittest import mock

import pytest
from django.db.models import Q

from recoverydash.dashboard.queries import _windows, restart_detail
from recoverydash.ingest.actions import _Projection, ingest_batch
from recoverydash.runs.analysis import analyze
from recoverydash.runs.folding import fold, join, unfold
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


@contextmanager
def unjoined():
    """Ingest without folding across batches (``_Projection._join_stored`` off): the per-rank
    rows the folded storage replaces, the reference every folded run is compared with."""
    with mock.patch.object(_Projection, "_join_stored", lambda self, pending: pending):
        yield


def per_rank(name, starts, updates, extra=(), joined=False):
    """The run of ``updates`` sent as per-rank events, each rank its own batches (one rank per
    update in a batch); stored one row per rank-update unless ``joined``."""
    project = Project.objects.create(name=name)
    with (nullcontext() if joined else unjoined()):
        ingest_batch(project, starts)
        for rank in range(W):
            batch = [own(a, u, r, t, s) for a, u, t, parts in updates for r, s in parts
                     if r == rank]
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
    when = datetime(2026, 11, 1, tzinfo=UTC)
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
                                                                       tzinfo=UTC),
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


# --- folding across batches: per-rank events, each rank its own requests ----------------------

def at_ms(t: int, ms: int) -> str:
    """``at(t)`` plus ``ms`` milliseconds (ranks' clocks differ by a few)."""
    return at(t)[:-1] + f".{ms:03d}Z"


def shuffled_batches(updates, seed, per_batch=None, extra=()):
    """The per-rank events of ``updates`` as batches of one rank each, ranks in a shuffled
    order, each rank's time ``rank % 7`` ms after the update's second (clocks differ), a rank's
    events split into batches of ``per_batch`` updates (all in one by default)."""
    rng = random.Random(seed)
    order = list(range(W))
    rng.shuffle(order)
    batches = []
    for rank in order:
        events = []
        for a, u, t, parts in updates:
            for r, s in parts:
                if r == rank:
                    ev = own(a, u, r, t, s)
                    ev["time"] = at_ms(t, 1 + (rank * 5) % 7)
                    events.append(ev)
        step = per_batch or max(len(events), 1)
        batches += [events[i:i + step] for i in range(0, len(events), step) if events[i:i + step]]
    return batches + [list(extra)] if extra else batches


def sent(name, starts, batches, joined=True, analyse_every=None):
    """A run of ``batches`` (after ``starts``), folded across batches unless not ``joined``;
    analysed after every ``analyse_every`` batches (the incremental path)."""
    project = Project.objects.create(name=name)
    with (nullcontext() if joined else unjoined()):
        ingest_batch(project, starts)
        for i, batch in enumerate(batches):
            ingest_batch(project, batch)
            if analyse_every and i % analyse_every == 0:
                analyze(Run.objects.get(project=project), now=NOW)
    return Run.objects.get(project=project)


def timeless(run):
    """``reports(run)`` without times, and the earliest report time per (attempt, update): what
    folding keeps of the ranks' times (a row keeps the earliest of its ranks')."""
    out, earliest = {}, {}
    for key, report in reports(run).items():
        out[key] = {k: v for k, v in report.items() if k != "time"}
        earliest[key[:2]] = min(earliest.get(key[:2], report["time"]), report["time"])
    return out, earliest


def assert_same_analysis(got_run, want_run):
    assert timeless(got_run) == timeless(want_run)
    want, got = analyze(want_run, now=NOW).result, analyze(got_run, now=NOW).result
    assert set(got) == set(want)
    for key in want:
        assert got[key] == want[key], key
    return got


def test_join_chains_consecutive_shifted_segments_whatever_their_order():
    def seg(rank, ranks=1, shift=0, u=3, samples=B):
        return {"rank": rank, "ranks": ranks, "shift": shift, "spans": spans(u, rank),
                "samples": samples, "tokens": None}

    segs = [seg(5), seg(0, 3, 1), seg(3), seg(4), seg(7), seg(8, samples=3), seg(-1), seg(3)]
    got = sorted((sorted(m), s) for m, s in join(segs))
    # 0-2 (a fold), 3, 4, 5 chain; the second rank-3 segment, 7 (6 is missing), 8 (another
    # sample count) and the global rank stay alone
    assert got == [([0, 1, 2, 3], 1), ([4], 0), ([5], 0), ([6], 0), ([7], 0)]
    # a fold of another shift does not continue a chain of shift 1
    far = {"rank": 3, "ranks": 2, "shift": 2, "spans": spans(3, 3), "samples": B, "tokens": None}
    assert sorted((sorted(m), s) for m, s in join([seg(0, 3, 1), far])) == [([0], 1), ([1], 2)]


@pytest.mark.django_db
@pytest.mark.parametrize("seed,per_batch,analyse_every", [(1, None, None), (2, 2, 5),
                                                           (3, 1, 17)])
def test_per_rank_events_in_separate_batches_fold_into_one_row_per_update(seed, per_batch,
                                                                          analyse_every):
    starts, updates = restart()
    batches = shuffled_batches(updates, seed, per_batch)
    want_run = sent("per-rank", starts, batches, joined=False)
    got_run = sent("joined", starts, batches, analyse_every=analyse_every)
    assert LedgerRow.objects.filter(run=want_run).count() == 9 * W
    assert stored(got_run) == [(0, 64, 1)] * 9  # the fold grew and its pieces merged
    row = LedgerRow.objects.get(run=got_run, attempt=1, update=4)
    assert row.time == datetime(2026, 11, 1, 0, 0, 21, 1000, tzinfo=UTC)  # rank 0's
    assert row.spans == spans(4, 0)
    got = assert_same_analysis(got_run, want_run)
    (item,) = got["restarts"]
    assert item["resumed_update"] == 3


@pytest.mark.django_db
def test_a_rank_missing_from_separate_batches_stays_missing():
    starts, updates = restart(first_ranks=[r for r in range(W) if r != 17])
    batches = shuffled_batches(updates, 4)
    want_run = sent("per-rank", starts, batches, joined=False)
    got_run = sent("joined", starts, batches)
    assert stored(got_run, 1, 4) == [(0, 17, 1), (18, 46, 1)]
    got = assert_same_analysis(got_run, want_run)
    (item,) = got["restarts"]
    (finding,) = [f for f in item["findings"] if f["code"] == "incomplete_first_update"]
    assert finding["detail"].startswith("rank 17 of 64 never reported update 4")
    # rank 17's report arrives at last: the two rows are one
    late = [own(1, 4, 17, 21)]
    ingest_batch(want_run.project, late)
    ingest_batch(got_run.project, late)
    assert stored(got_run, 1, 4) == [(0, 64, 1)]
    got = assert_same_analysis(got_run, want_run)
    assert not [f for f in got["restarts"][0]["findings"]
                if f["code"] == "incomplete_first_update"]


@pytest.mark.django_db
def test_a_duplicate_position_and_a_resend_across_batches_stay_what_they_are():
    # attempt 1's rank 41 reports rank 40's positions at update 4; rank 9's report is sent
    # again under another event_id, and rank 12's a second time with one more range
    def first(u, rank):
        return spans(u, 40 if rank == 41 else rank)

    starts, updates = restart(first_spans=first)
    more = [{"stratum": "m", "epoch": 0, "ranges": [[7000, 7002]]}]
    extra = [own(1, 4, 9, 25, suffix="-again"), own(1, 4, 12, 26, spans(4, 12) + more, "-more")]
    batches = shuffled_batches(updates, 5, extra=extra)
    want_run = sent("per-rank", starts, batches, joined=False)
    got_run = sent("joined", starts, batches, analyse_every=9)
    # 41 (at 40's position) breaks the fold (which chain takes 42 depends on the arrival
    # order; the analysis does not); the re-sent rank 9 and the second piece of rank 12 are
    # rows of their own
    assert stored(got_run, 1, 4) == [(0, 41, 1), (9, 1, 0), (12, 1, 0), (41, 1, 0), (42, 22, 1)]
    got = assert_same_analysis(got_run, want_run)
    base = analyze(aggregated("clean", *restart()), now=NOW).result
    (stratum,) = got["strata"]
    (clean,) = base["strata"]
    assert stratum["duplicates"] == clean["duplicates"] + B
    # the same events again (same event_ids): duplicates accepted, nothing stored changes
    before = list(LedgerRow.objects.filter(run=got_run).order_by("pk").values())
    for batch in batches:
        ingest_batch(got_run.project, batch)
    assert list(LedgerRow.objects.filter(run=got_run).order_by("pk").values()) == before
    assert analyze(got_run, now=NOW).result == analyze(want_run, now=NOW).result


@pytest.mark.django_db
def test_the_restart_page_reads_rows_folded_across_batches_as_per_rank_rows():
    starts, updates = restart()
    batches = shuffled_batches(updates, 6)
    runs = [sent("per-rank", starts, batches, joined=False), sent("joined", starts, batches)]
    details = []
    for run in runs:
        for rank in (0, 5, 63):
            AuditWindow.objects.create(run=run, attempt=1, update=4, rank=rank, accum_slot=0,
                                       time=datetime(2026, 11, 1, tzinfo=UTC),
                                       sample_ids=[f"s4-{rank}"])
        details.append(restart_detail(run, 1, analyze(run, now=NOW).result["restarts"]))
        details.append([(w["update"], w["rank"], w["epoch"]) for w in _windows(run, 1, Q())])
    assert details[0].before == details[2].before and details[0].after == details[2].after
    assert details[0].windows == details[2].windows
    assert details[1] == details[3] == [(4, r, 0) for r in (0, 5, 63)]


@pytest.mark.django_db(transaction=True)
def test_a_batch_row_reads_only_its_neighbours_and_still_joins_both():
    from django.db import connection, transaction

    from recoverydash.ingest.actions import _stored_rows

    project = Project.objects.create(name="neighbours")
    ingest_batch(project, [started(1)])
    for rank in (0, 2, 4, 6, 8, 10):  # one batch each: gaps, so six rows of one rank
        ingest_batch(project, [own(1, 4, rank, 21)])
    run = Run.objects.get(project=project)
    assert stored(run, 1, 4) == [(r, 1, 0) for r in (0, 2, 4, 6, 8, 10)]
    with transaction.atomic():
        read = sorted(r.rank for r in _stored_rows({(run.pk, 1, 4): [(run.pk, 1, 4, 5, 1)]}))
    # PostgreSQL reads the right neighbour (6) and the left one (4); SQLite every row
    assert read == ([4, 6] if connection.vendor == "postgresql" else [0, 2, 4, 6, 8, 10])
    ingest_batch(project, [own(1, 4, 5, 22)])
    assert stored(run, 1, 4) == [(0, 1, 0), (2, 1, 0), (4, 3, 1), (8, 1, 0), (10, 1, 0)]
