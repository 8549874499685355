"""The run's new heartbeats reduced by the database (runs.beats: grouped per rank and per
distinct ``fetched``, the chart points read alone) fold exactly as the rows folded one by one in
``(seq, id)`` order: the stored fold (cursors, the last heartbeat of every rank,
counts, chart points, stride, the order of every key) is the same document, in one batch and in
several. On PostgreSQL through the aggregates; elsewhere ``absorb_reduced`` says None and the
rows are folded one by one (the same code either way through ``runs.analysis.absorb_new``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from recoverydash import recovery
from recoverydash.recovery.heartbeats import CHART_POINTS
from recoverydash.runs import analysis as bridge
from recoverydash.runs import beats
from recoverydash.runs.models import Heartbeat, Run

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 1, tzinfo=UTC)


def _cursors(i: int) -> list:
    """Heartbeat ``i``'s read cursors: two strata, epochs moving, orders of several kinds
    (string, integer, 1 spelled 1.0, null, a list: never a key), a rank key beside."""
    out = [{"stratum": "main", "epoch": i // 700, "position": (i * 37) % 5000}]
    if i % 3 == 0:
        out.append({"stratum": "aux", "epoch": 0, "position": i, "order": f"s{i % 4}"})
    if i % 5 == 0:
        out.append({"stratum": "aux", "epoch": 0, "position": 2 * i,
                    "order": 1 if i % 10 else 1.0})
    if i % 7 == 0:
        out.append({"stratum": "main", "epoch": 0, "position": i, "order": None, "rank": i % 9})
    if i % 11 == 0:
        out.append({"stratum": "main", "epoch": 0, "position": i, "order": [1]})
    return out


def _rows(run: Run, n: int) -> list:
    """``n`` heartbeats over three attempts (1 before 0 by seq: keys in order of first sight),
    ranks 0-40 and None, times out of order and tied, ``fetched`` empty now and then,
    seq growing by batches of 97; rank 99's latest time twice, in consecutive batches."""
    out = []
    for i in range(n):
        attempt = 1 if i < 50 else (0 if i % 4 else 2)
        rank = None if i % 13 == 0 else (i * 7) % 41
        when = T0 + timedelta(seconds=(i * 31) % 600, microseconds=(i % 3) * 250)
        fetched = [] if i % 17 == 0 else _cursors(i)
        out.append(Heartbeat(run=run, attempt=attempt, rank=rank, time=when, update=i,
                             fetched=fetched, seq=1 + i // 97))
    for i in range(0, n, 100):  # the same time again for rank 99, its latest: the later wins
        b = out[i]
        late = T0 + timedelta(seconds=900 + i)
        out += [Heartbeat(run=run, attempt=b.attempt, rank=99, time=late, update=100_000 + i,
                          fetched=[], seq=b.seq),
                Heartbeat(run=run, attempt=b.attempt, rank=99, time=late, update=200_000 + i,
                          fetched=[], seq=b.seq + 1)]
    Heartbeat.objects.bulk_create(out)
    return out


def _one_by_one(run: Run, cuts: list) -> recovery.HeartbeatFold:
    fold = recovery.HeartbeatFold()
    for since, upto in zip(cuts, cuts[1:], strict=False):
        for chunk in bridge._new_beats(run, since, upto):
            fold.absorb([recovery.HeartbeatRecord(a, r, t, u, f or []) for a, r, t, u, f in chunk])
    return fold


def _doc(fold: recovery.HeartbeatFold) -> str:
    return json.dumps(fold.to_doc())  # order kept: keys and lists in the fold's own order


@pytest.mark.parametrize("cuts", [[0, 100], [0, 3, 4, 9, 25, 100], [0, 1, 2, 5, 6, 7, 100]])
def test_the_reduced_heartbeats_fold_as_the_rows_one_by_one(project, cuts):
    run = Run.objects.create(project=project, run_id="beats")
    rows = _rows(run, 2400)  # attempt 0: 1,763 beats, the chart's stride doubled 3 times
    expected = _one_by_one(run, cuts)
    assert expected.attempts[0].stride == 8 and expected.attempts[0].seen == 1763
    assert list(expected.attempts) == [1, 0, 2]
    fold = recovery.HeartbeatFold()
    counted = 0
    for since, upto in zip(cuts, cuts[1:], strict=False):
        got = beats.absorb_reduced(run.pk, since, upto, fold)
        if connection.vendor != "postgresql":
            assert got is None  # the rows one by one, in absorb_new
            return
        assert got is not None
        counted += got
    assert counted == len(rows)
    assert _doc(fold) == _doc(expected)
    assert fold.fetched(0) == expected.fetched(0)
    assert len(fold.chart_points(0)) == len(expected.chart_points(0)) >= CHART_POINTS


def test_absorb_new_reduces_or_not_and_the_state_is_the_same(project):
    run = Run.objects.create(project=project, run_id="beats")
    rows = _rows(run, 500)
    ledger = recovery.Ledger()
    assert bridge.absorb_new(run, ledger, 0, 2) == (0, 197)
    assert bridge.absorb_new(run, ledger, 2, 100) == (0, len(rows) - 197)
    assert _doc(ledger.beats) == _doc(_one_by_one(run, [0, 2, 100]))


def test_cursors_ingest_would_refuse_fold_the_same_reduced(project):
    """A position spelled 2.5 and an epoch spelled "3" (never through ingest's validation): the
    core's int() of them, reduced or not."""
    run = Run.objects.create(project=project, run_id="beats")
    _rows(run, 300)
    Heartbeat.objects.create(run=run, attempt=0, rank=3, time=T0, update=9, seq=2,
                             fetched=[{"stratum": "main", "epoch": "3", "position": 2.5}])
    ledger = recovery.Ledger()
    assert bridge.absorb_new(run, ledger, 0, 100) == (0, 307)
    assert _doc(ledger.beats) == _doc(_one_by_one(run, [0, 100]))
    assert {"stratum": "main", "epoch": 3, "position": 2} in ledger.beats.fetched(0)
