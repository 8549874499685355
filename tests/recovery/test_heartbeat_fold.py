"""The heartbeat fold (recovery.heartbeats.HeartbeatFold): what the analysis keeps of heartbeats,
with exact values, and that batches fold like one."""
from __future__ import annotations

import pytest
from state_formats import format_4

from recoverydash.recovery import HeartbeatFold, HeartbeatRecord, Ledger
from recoverydash.recovery.heartbeats import CHART_POINTS
from recoverydash.recovery.ledger import STATE_FORMAT


def beat(i, attempt=0, rank=0, fetched=None):
    return HeartbeatRecord(attempt, rank, 1000.0 + i, i, fetched if fetched is not None else
                           [{"stratum": "main", "epoch": 0, "position": 64 * i}])


def test_it_keeps_the_furthest_read_cursor_per_stratum_epoch_and_order():
    fold = HeartbeatFold()
    fold.absorb([
        beat(0, fetched=[{"stratum": "main", "epoch": 0, "position": 96},
                         {"stratum": "main", "epoch": 1, "position": 8}]),
        beat(1, rank=1, fetched=[{"stratum": "main", "epoch": 0, "position": 64},
                                 {"stratum": "main", "epoch": 0, "position": 40, "order": "s1"}]),
        beat(2, attempt=1, fetched=[{"stratum": "main", "epoch": 0, "position": 5}]),
    ])
    assert sorted(fold.fetched(0), key=lambda c: (c["epoch"], "order" in c)) == [
        {"stratum": "main", "epoch": 0, "position": 96},
        {"stratum": "main", "epoch": 0, "position": 40, "order": "s1"},
        {"stratum": "main", "epoch": 1, "position": 8}]
    assert fold.fetched(1) == [{"stratum": "main", "epoch": 0, "position": 5}]
    assert fold.fetched(7) == []


def test_it_keeps_the_last_heartbeat_of_every_rank_by_time():
    fold = HeartbeatFold()
    fold.absorb([beat(5, rank=0), beat(3, rank=0), beat(4, rank=1), beat(6, rank=None)])
    assert fold.last_heartbeat(0) == {0: (1005.0, 5), 1: (1004.0, 4), None: (1006.0, 6)}
    assert fold.last_heartbeat(1) == {}


def test_it_keeps_every_stride_th_heartbeat_doubling_the_stride_past_twice_the_chart_points():
    fold = HeartbeatFold()
    fold.absorb(beat(i) for i in range(2 * CHART_POINTS))
    assert [p[2] for p in fold.chart_points(0)] == list(range(2 * CHART_POINTS))
    fold.absorb([beat(2 * CHART_POINTS)])  # one more: stride 2, the even ones
    assert [p[2] for p in fold.chart_points(0)] == list(range(0, 2 * CHART_POINTS + 1, 2))
    fold.absorb(beat(i) for i in range(2 * CHART_POINTS + 1, 10_000))
    kept = [p[2] for p in fold.chart_points(0)]
    assert kept == list(range(0, 10_000, 32))  # 10,000 beats: stride 32, 313 points
    assert CHART_POINTS <= len(kept) <= 2 * CHART_POINTS


def test_it_folds_batches_stored_and_loaded_between_them_like_one_batch():
    beats = [beat(i, attempt=i // 3000, rank=i % 64,
                  fetched=[{"stratum": "main", "epoch": i // 1000, "position": 7 * i}])
             for i in range(9000)]
    whole = Ledger()
    whole.beats.absorb(beats)
    state = Ledger()
    for lo in range(0, 9000, 1234):
        state = Ledger.from_bytes(state.to_bytes())
        state.beats.absorb(beats[lo:lo + 1234])
    assert state.beats.to_doc() == whole.beats.to_doc()
    assert Ledger.from_bytes(state.to_bytes()).to_bytes() == whole.to_bytes()
    assert state.beats.last_heartbeat(2)[8999 % 64] == (1000.0 + 8999, 8999)


def _reduced(fold, beats):
    """What a database's aggregates give of ``beats`` for ``absorb_reduced`` (the reference,
    written out in Python): per attempt in order of first sight, the count, per rank its
    latest by time (ties: the later), per cursor but its position the largest, the points."""
    out: dict = {}
    for b in beats:
        count, last, cursors, rows = out.setdefault(b.attempt, [0, {}, {}, []])
        out[b.attempt][0] = count + 1
        if b.rank not in last or b.time >= last[b.rank][0]:
            last[b.rank] = (b.time, b.update)
        for c in b.fetched:
            key = repr(sorted((k, repr(v)) for k, v in c.items() if k != "position"))
            held = cursors.get(key)
            if held is None or c["position"] > held["position"]:
                cursors[key] = dict(c)
        rows.append(b)
    return {a: (n, [(r, t, u) for r, (t, u) in last.items()], list(cursors.values()),
                [(o, rows[o].time, rows[o].rank, rows[o].update, rows[o].fetched)
                 for o in fold.chart_offsets(a, n)])
            for a, (n, last, cursors, rows) in out.items()}


def test_reduced_heartbeats_fold_exactly_as_the_heartbeats_one_by_one():
    """``absorb_reduced`` (a row per rank, per cursor and per chart point: what runs.beats has
    PostgreSQL compute) after any history equals ``absorb`` of the heartbeats themselves: the
    same document, key order included, strides doubled across batches."""
    beats = [beat(i, attempt=(i // 7) % 3, rank=None if i % 11 == 0 else i % 37,
                  fetched=[{"stratum": "main", "epoch": i // 900, "position": (13 * i) % 4000},
                           *([{"stratum": "aux", "epoch": 0, "position": i, "order": i % 3}]
                             if i % 4 == 0 else [])])
             for i in range(6000)]
    beats = [b if i % 50 else HeartbeatRecord(b.attempt, b.rank, b.time - 3, b.update, b.fetched)
             for i, b in enumerate(beats)]  # out of time order, ties
    whole, reduced = HeartbeatFold(), HeartbeatFold()
    for lo, hi in ((0, 5), (5, 300), (300, 1301), (1301, 1302), (1302, 6000)):
        whole.absorb(beats[lo:hi])
        for attempt, (n, last, cursors, points) in _reduced(reduced, beats[lo:hi]).items():
            seen, stride = reduced.chart_rule(attempt, n)
            assert [p[0] for p in points] == [o for o in range(n) if (seen + o) % stride == 0]
            assert reduced.absorb_reduced(attempt, n, last, cursors, points) == n
        assert reduced.to_doc() == whole.to_doc()
        assert list(reduced.to_doc()) == list(whole.to_doc())
    assert [len(whole.chart_points(a)) for a in range(3)] == [251, 251, 250]
    assert whole.attempts[0].stride == 8


def test_reduced_heartbeats_must_bring_the_chart_points_asked_for():
    fold = HeartbeatFold()
    assert fold.chart_offsets(0, 3) == [0, 1, 2]
    with pytest.raises(ValueError, match="chart points"):
        fold.absorb_reduced(0, 3, [], [], [(0, 1.0, 0, 0, [])])
    assert fold.to_doc() == {}


def test_a_state_of_format_3_loads_without_heartbeats_and_says_its_format():
    import json
    import zlib

    ledger = Ledger()
    ledger.beats.absorb([beat(1)])
    doc = json.loads(zlib.decompress(format_4(ledger)))
    assert doc["format"] == 4
    doc["format"] = 3
    del doc["heartbeats"]
    old = Ledger.from_bytes(zlib.compress(json.dumps(doc).encode()))
    assert old.state_format == 3 and old.beats.attempts == {}
    assert Ledger.from_bytes(ledger.to_bytes()).state_format == 5  # the single-value layout
    assert Ledger.from_parts(*ledger.to_parts()[:1], []).state_format == STATE_FORMAT == 6


def test_a_state_of_format_4_loads_whole_and_is_written_again_in_format_5():
    """Format 5 changes the layout only: a format 4 state (times base64 in the JSON) loads
    into the same ledger, continued (``state_format`` 4, not below ``CONTINUED_FORMAT``)."""
    from recoverydash.recovery import LedgerRecord
    from recoverydash.recovery.ledger import CONTINUED_FORMAT

    ledger = Ledger.from_records(
        [LedgerRecord(0, u, r, 100.0 + u + 0.25 * r,
                      [{"stratum": "s", "epoch": 0, "ranges": [[4 * u + r, 4 * u + r + 1]]}])
         for u in list(range(200)) + [10_000] for r in range(4)]
        + [LedgerRecord(1, 3, None, 5.5, [{"stratum": "s", "epoch": 0, "ids": [7, 9]}])])
    ledger.beats.absorb([beat(i) for i in range(500)])
    old = Ledger.from_bytes(format_4(ledger))
    assert old.state_format == CONTINUED_FORMAT == 4
    assert old.to_bytes() == ledger.to_bytes()
    assert [old.update_time(0, u) for u in (0, 199, 200, 10_000)] == [100.0, 299.0, None, 10_100.0]
    again = Ledger.from_bytes(ledger.to_bytes())
    assert again.state_format == 5 and again.to_bytes() == ledger.to_bytes()
