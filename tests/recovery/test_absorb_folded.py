"""``Ledger.absorb_folded`` (folded ledger rows, docs/ingest-v1.md#update_aggregate "Storage")
gives exactly the state of absorbing the rows' unfolded per-rank records in the same order, byte
for byte in ``to_bytes``; and a DistributedSampler update folded into one row continues the
previous update's row in O(1) (``ledger._Band``), whatever its number of ranks."""
from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_absorb_fast_path import SETTINGS, same_state, streams

from recoverydash.recovery import Ledger, LedgerRecord
from recoverydash.recovery import ledger as ledger_module
from recoverydash.runs.folding import fold, unfold

ORDER = "e1875493d62216fc6d36670795049f08"


def folded_rows(records):
    """Records grouped by ``(attempt, update)`` (a group's times floored to whole seconds, as a
    folded row holds one time), each group's first report of every rank folded with
    ``runs.folding.fold`` (the ingest's folding), other reports rows of one rank; rows in
    ``(attempt, update, rank)`` order as the worker reads them. Returns ``[(attempt, update,
    rank, ranks, shift, time, spans)]``."""
    groups: dict = {}
    for rec in records:
        groups.setdefault((rec.attempt, rec.update), []).append(rec)
    rows = []
    for (attempt, update), recs in sorted(groups.items()):
        parts, rest = {}, []
        for rec in recs:
            entry = {"time": float(math.floor(rec.time)), "spans": rec.spans, "samples": None,
                     "tokens": None}
            if rec.rank is None or rec.rank in parts:
                rest.append((rec.rank, 1, 0, entry))
            else:
                parts[rec.rank] = entry
        mine = [(rank, n, shift, entry) for rank, n, shift, entry in fold(parts)] + rest
        mine.sort(key=lambda row: -1 if row[0] is None else row[0])
        rows += [(attempt, update, rank, n, shift, entry["time"], entry["spans"])
                 for rank, n, shift, entry in mine]
    return rows


def as_columns(rows):
    """The rows ``absorb_folded`` takes: a row of the common shape (one span of one range, no
    padding, ids or indices, a str order or none) as columns, every other one with its spans."""
    out = []
    for attempt, update, rank, n, shift, when, spans in rows:
        span = spans[0] if len(spans) == 1 else None
        if span is not None and set(span) <= {"stratum", "epoch", "ranges", "order"} \
                and isinstance(span.get("order", ""), str) and len(span["ranges"]) == 1 \
                and len(span["ranges"][0]) in (2, 3):
            item = span["ranges"][0]
            out.append((attempt, update, rank, n, shift, when, None, span["stratum"],
                        span["epoch"], span.get("order"), item[0], item[1],
                        item[2] if len(item) == 3 else None))
        else:
            out.append((attempt, update, rank, n, shift, when, spans, None, None, None, None,
                        None, None))
    return out


def unfolded(rows):
    """The per-rank records the rows hold, in the rows' order (``runs.folding.unfold``)."""
    return [LedgerRecord(attempt, update, mine, when, list(part))
            for attempt, update, rank, n, shift, when, spans in rows
            for mine, part in unfold(rank, n, shift, spans)]


@SETTINGS
@given(streams(), st.data())
def test_folded_rows_give_the_state_of_their_unfolded_records(records, data):
    rows = folded_rows(records)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(rows)), max_size=3)))
    folded, general = Ledger(), Ledger()
    for lo, hi in zip([0] + cuts, cuts + [len(rows)], strict=True):
        folded = Ledger.from_bytes(folded.to_bytes())
        general = Ledger.from_bytes(general.to_bytes())
        part = rows[lo:hi]
        assert folded.absorb_folded(as_columns(part)) == sum(row[3] for row in part)
        general.absorb(unfolded(part), fast=False)
    same_state(folded, general)


@st.composite
def folded_streams(draw):
    """Folded rows of 1-2 attempts of a W-rank sampler (strided, ``[p + r, p + W * m, W]``
    moved by 1 rank to rank, or contiguous, ``[p + r * m, p + (r + 1) * m]`` moved by ``m``),
    one key with or without an order, an update's ranks in one row or cut into several, with
    what breaks a band: a rank re-sending (the same or other positions), a rank missing, a jump
    or a step back of the positions, a new epoch, a coordinator's row, a late update (at the
    end); in ``(attempt, update, rank)`` order but for the late ones."""
    rows, late = [], []
    for k in range(draw(st.integers(1, 2))):
        W = draw(st.integers(1, 8))
        m = draw(st.integers(1, 3))
        strided = draw(st.booleans())
        three = draw(st.booleans())  # a contiguous range written [start, stop, 1]
        order = draw(st.sampled_from([None, ORDER, "o2"]))
        epoch, p = 0, draw(st.integers(0, 40))
        u = draw(st.integers(0, 2))
        for _ in range(draw(st.integers(0, 16))):
            u += 1
            perturb = draw(st.lists(st.sampled_from(
                ["cut", "cut", "resend", "resend_same", "missing", "jump", "back", "epoch",
                 "coordinator", "late", "time"]), max_size=2))
            if "epoch" in perturb:
                epoch, p = epoch + 1, 0
            if strided:
                first, shift = ([p, p + W * m, W] if W > 1 else [p, p + m]), 1
            else:
                first, shift = ([p, p + m, 1] if three else [p, p + m]), m
            ranks = [r for r in range(W) if not ("missing" in perturb and r == W // 2)]
            cuts = sorted(set(draw(st.lists(st.integers(1, W - 1), max_size=2)))) \
                if "cut" in perturb and W > 1 else []
            pieces, start = [], 0
            for cut in cuts + [W]:
                mine = [r for r in ranks if start <= r < cut]
                while mine:  # consecutive ranks only
                    n = 1
                    while n < len(mine) and mine[n] == mine[0] + n:
                        n += 1
                    pieces.append((mine[0], n))
                    mine = mine[n:]
                start = cut
            when = 100.0 + 10 * k + u + (0.5 if "time" in perturb else 0.0)
            out = []
            for rank, n in pieces:
                item = [first[0] + rank * shift, first[1] + rank * shift, *first[2:]]
                span = {"stratum": "s", "epoch": epoch, "ranges": [item]}
                if order is not None:
                    span["order"] = order
                out.append((k, u, rank, n, shift if n > 1 else 0, when - 0.25 * (rank > 0),
                            [span]))
            if ("resend" in perturb or "resend_same" in perturb) and out:
                rank = draw(st.sampled_from(ranks))
                item = [first[0] + rank * shift, first[1] + rank * shift, *first[2:]]
                if "resend" in perturb:
                    item = [item[0] + 1000, item[1] + 1000, *item[2:]]
                span = {"stratum": "s", "epoch": epoch, "ranges": [item]}
                if order is not None:
                    span["order"] = order
                out.append((k, u, rank, 1, 0, when + 1.0, [span]))
            if "coordinator" in perturb:
                out.append((k, u, None, 1, 0, when, [{"stratum": "s", "epoch": epoch,
                                                      "ranges": [[0, 2]]}]))
            out.sort(key=lambda row: -1 if row[2] is None else row[2])
            (late if "late" in perturb else rows).extend(out)
            p += W * m
            if "jump" in perturb:
                p += 7
            elif "back" in perturb:
                p = max(0, p - 3)
    return rows + late


@SETTINGS
@given(folded_streams(), st.data())
def test_folded_sampler_rows_give_the_state_of_their_unfolded_records(rows, data):
    cuts = sorted(data.draw(st.lists(st.integers(0, len(rows)), max_size=3)))
    folded, general = Ledger(), Ledger()
    for lo, hi in zip([0] + cuts, cuts + [len(rows)], strict=True):
        folded = Ledger.from_bytes(folded.to_bytes())
        general = Ledger.from_bytes(general.to_bytes())
        part = rows[lo:hi]
        assert folded.absorb_folded(as_columns(part)) == sum(row[3] for row in part)
        general.absorb(unfolded(part), fast=False)
    same_state(folded, general)


def sampler_rows(updates, W, m, start=0, order=ORDER, when=None):
    """One folded row per update of a W-rank DistributedSampler run, the SDK's span (rank r's
    ``[p + r, p + W * m, W]`` with the epoch's order digest), ``m`` positions per rank."""
    rows = []
    for i, u in enumerate(updates):
        p = start + i * W * m
        span = {"stratum": "main", "epoch": 0, "ranges": [[p, p + W * m, W]], "order": order}
        rows.append((0, u, 0, W, 1, 100.0 + u if when is None else when, [span]))
    return rows


def band_steps(monkeypatch) -> list:
    """The outcome of every band try (True: a row taken in O(1))."""
    taken: list = []
    original = ledger_module._Band.take

    def counting(self, *args):
        ok = original(self, *args)
        taken.append(ok)
        return ok

    monkeypatch.setattr(ledger_module._Band, "take", counting)
    return taken


def test_a_folded_sampler_run_continues_in_one_band_of_all_its_ranks(monkeypatch):
    taken = band_steps(monkeypatch)
    rows = sampler_rows(range(1, 31), W=16, m=8)
    general_records = []
    each = Ledger._absorb_each

    def counted(self, recs, touched):
        general_records.extend(recs)
        return each(self, recs, touched)

    monkeypatch.setattr(Ledger, "_absorb_each", counted)
    state = Ledger()
    assert state.absorb_folded(as_columns(rows)) == 30 * 16
    monkeypatch.setattr(Ledger, "_absorb_each", each)
    # update 1 opens each rank's run (general records), update 2 gives their advance (per rank),
    # updates 3..30 are taken by the band of the 16 ranks
    assert [r.update for r in general_records] == [1] * 16
    assert taken == [True] * 28
    general = Ledger()
    general.absorb(unfolded(rows), fast=False)
    same_state(state, general)
    runs = state.attempts[0].runs
    assert [(r[0], r[3], r[4], r[5], r[6], r[7], r[8]) for r in runs] == \
        [(rank, 1, 30, rank, 128, 8, 16) for rank in range(16)]
    assert list(state.attempts[0].absorbed[15]) == list(range(1, 31))
    assert state.attempts[0].update_time(30) == 130.0


def test_a_resent_report_inside_a_band_is_united_and_the_band_built_again(monkeypatch):
    taken = band_steps(monkeypatch)
    rows = sampler_rows(range(1, 11), W=8, m=2)
    # rank 3 reports update 6 again with one more position, and later than the row
    extra = {"stratum": "main", "epoch": 0, "ranges": [[5000, 5001]], "order": ORDER}
    rows.insert(6, (0, 6, 3, 1, 0, 150.0, [extra]))
    state = Ledger()
    state.absorb_folded(as_columns(rows))
    general = Ledger()
    general.absorb(unfolded(rows), fast=False)
    same_state(state, general)
    # 3..6 by the band; the re-send flushes and drops it (rank 3's run ends at 5, update 6
    # becomes a piece); at 7 rank 3 opens a new run, at 8 it gets its advance and the band is
    # built again; 9 and 10 by the band
    assert taken == [True] * 6
    assert len(state.attempts[0].pieces[("main", 0, ORDER)]) == 1


def test_rows_that_split_an_update_in_two_continue_as_two_bands(monkeypatch):
    taken = band_steps(monkeypatch)
    rows = []
    for u in range(1, 9):
        p = (u - 1) * 16
        rows.append((0, u, 0, 4, 1, 10.0 + u, [{"stratum": "s", "epoch": 0,
                                                "ranges": [[p, p + 16, 8]]}]))
        rows.append((0, u, 4, 4, 1, 10.5 + u, [{"stratum": "s", "epoch": 0,
                                                "ranges": [[p + 4, p + 20, 8]]}]))
    # update 9: one row of all 8 ranks, another epoch from update 10
    rows.append((0, 9, 0, 8, 1, 19.0, [{"stratum": "s", "epoch": 0, "ranges": [[128, 144, 8]]}]))
    rows.append((0, 10, 0, 8, 1, 20.0, [{"stratum": "s", "epoch": 1, "ranges": [[0, 16, 8]]}]))
    state = Ledger()
    assert state.absorb_folded(as_columns(rows)) == 16 * 4 + 16
    general = Ledger()
    general.absorb(unfolded(rows), fast=False)
    same_state(state, general)
    assert taken.count(True) == 12  # updates 3..8 of both halves


def test_a_band_row_leaving_the_positions_raises_as_absorb_does_and_keeps_the_rows_before(
        monkeypatch):
    limit = ledger_module.POSITION_LIMIT
    rows = []
    for u in range(1, 6):
        p = limit - 20 + (u - 1) * 4   # rank 3's stop reaches 2**63 at update 5
        rows.append((0, u, 0, 4, 1, 1.0, [{"stratum": "s", "epoch": 0, "ranges": [[p, p + 1]]}]))
    taken = band_steps(monkeypatch)
    state, general = Ledger(), Ledger()
    with pytest.raises(ValueError) as folded_error:
        state.absorb_folded(as_columns(rows))
    with pytest.raises(ValueError) as general_error:
        general.absorb(unfolded(rows), fast=False)
    assert str(folded_error.value) == str(general_error.value)
    assert state.to_bytes() == general.to_bytes()
    assert taken == [True, True, False]  # updates 3 and 4; 5 per rank, rank 3 raises
    assert state.last_update(0) == 5  # ranks 0..2 of update 5 were in range
    assert sorted(state.attempts[0].absorbed) == [0, 1, 2, 3]
    assert state.attempts[0].open[(3, ("s", 0, None), 0)][4] == 4  # rank 3's run ends at 4


def test_a_folded_row_of_other_spans_unfolds_each_rank_as_sent():
    spans = [{"stratum": "a", "epoch": 0, "ranges": [[0, 4, 2], [100, 102]], "order": ORDER},
             {"stratum": "b", "epoch": 2, "ranges": [[7, 8]], "padding": True}]
    rows = [(0, 1, 5, 3, 10, 3.0, spans), (0, 2, 5, 3, 10, 4.0, spans)]
    state = Ledger()
    assert state.absorb_folded(as_columns(rows)) == 6
    general = Ledger()
    general.absorb(unfolded(rows), fast=False)
    same_state(state, general)
    assert sorted(state.attempts[0].absorbed) == [5, 6, 7]
    assert sorted(state.segment(0, 1, 2)[("a", 0, ORDER)].positions) == \
        [0, 2, 10, 12, 20, 22, 100, 101, 110, 111, 120, 121]
