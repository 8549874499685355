"""The batch fast path of ``Ledger.absorb`` (DistributedSampler groups checked against a template)
gives exactly the state of the general, record-by-record path (``absorb(records, fast=False)``):
same runs, pieces, absorbed updates and times, byte for byte in ``to_bytes``, hence the same
analysis (incremental analysis; docs/definitions.md#counting: re-sent reports of one rank are
united, two ranks reporting a position count it twice, padding never counts)."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recoverydash.recovery import Ledger, LedgerRecord
from recoverydash.recovery import ledger as ledger_module

SETTINGS = settings(max_examples=int(__import__("os").environ.get("RECOVERY_EXAMPLES", "300")),
                    deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

#: What can happen to one update's group of reports (besides nothing, the common case).
PERTURBATIONS = ["missing", "twice", "extra", "overlap", "nontile", "padding", "padding_false",
                 "ids", "coordinator", "empty", "epoch", "order", "shuffle", "jump", "back",
                 "two_ranges", "late", "same_twice", "short_stop", "early"]


def group(draw, k, u, W, m, strided, keys, perturb, when):
    """The reports of attempt k for update u: rank r of W owns its share of ``B = W * m``
    positions of every key, starting at the key's cursor (advanced by the caller)."""
    B = W * m
    out = []
    for r in range(W):
        spans = []
        for key in keys:
            stratum, epoch, order, p = key
            if strided:
                item = [p + r, p + B, W]
            elif draw(st.booleans()):
                item = [p + r * m, p + (r + 1) * m]
            else:
                item = [p + r * m, p + (r + 1) * m, 1]
            span = {"stratum": stratum, "epoch": epoch, "ranges": [item]}
            if order is not None:
                span["order"] = order
            spans.append(span)
        out.append(LedgerRecord(k, u, r, when + 0.01 * draw(st.integers(0, 3)), spans))
    stratum0, epoch0 = (keys[0][0], keys[0][1]) if keys else ("a", 0)
    victim = draw(st.integers(0, W - 1))
    rec = out[victim]
    first = rec.spans[0] if rec.spans else None
    if "missing" in perturb:
        del out[victim]
    if "twice" in perturb:
        out.append(LedgerRecord(k, u, rec.rank, when + 0.5, [dict(s) for s in rec.spans]))
    if "same_twice" in perturb:
        out.insert(draw(st.integers(0, len(out))), LedgerRecord(k, u, rec.rank, when - 0.5,
                                                               list(rec.spans)))
    if "extra" in perturb and first is not None:
        out.append(LedgerRecord(k, u, rec.rank, when, [dict(first, ranges=[[0, 3]])]))
    if "overlap" in perturb and first is not None and out:
        other = out[draw(st.integers(0, len(out) - 1))]
        other.spans.append(dict(first))  # a second rank reports the victim's positions
    if "nontile" in perturb and first is not None:
        s0 = first["ranges"][0]
        first["ranges"] = [[s0[0], s0[1] + W, W + 1]]
    if "short_stop" in perturb and first is not None:
        s0 = first["ranges"][0]
        if len(s0) == 3 and s0[1] - s0[0] > s0[2]:
            first["ranges"] = [[s0[0], s0[1] - 1, s0[2]]]   # same positions, another stop
    if "padding" in perturb:
        rec.spans.append({"stratum": stratum0, "epoch": epoch0, "ranges": [[0, 5]],
                          "padding": True})
    if "padding_false" in perturb and first is not None:
        first["padding"] = False
    if "ids" in perturb:
        rec.spans.append({"stratum": "ids", "epoch": 0, "ids": [f"s{u}", u, "x"]})
    if "coordinator" in perturb:
        out.insert(draw(st.integers(0, len(out))), LedgerRecord(
            k, u, None, when, [{"stratum": stratum0, "epoch": epoch0, "ranges": [[0, 2]]}]))
    if "empty" in perturb:
        rec.spans = []
    if "two_ranges" in perturb and first is not None:
        s0 = first["ranges"][0]
        first["ranges"] = [s0, [s0[1] + 1000, s0[1] + 1002]]
    if "shuffle" in perturb:
        out = draw(st.permutations(out))
    if "early" in perturb:
        # a report of a later update of the victim arrives before this group (out of order):
        # empty, padding only, or what the victim would report then
        ahead = draw(st.integers(1, 3))
        spans = draw(st.sampled_from([
            [], [{"stratum": stratum0, "epoch": epoch0, "ranges": [[0, 5]], "padding": True}],
            [dict(s, ranges=[[x + ahead * B for x in s["ranges"][0][:2]] + s["ranges"][0][2:]])
             for s in rec.spans if "ranges" in s and len(s["ranges"]) == 1]]))
        out.insert(0, LedgerRecord(k, u + ahead, rec.rank, when + 50.0, spans))
    return out


@st.composite
def streams(draw):
    """Records of 1-2 attempts in sampler shape, with perturbations, in update order except for
    ``late`` groups (moved to the end) and some swapped neighbours."""
    records = []
    late = []
    for k in range(draw(st.integers(1, 2))):
        W = draw(st.integers(1, 5))
        m = draw(st.integers(1, 3))
        B = W * m
        strided = draw(st.booleans())
        keys = [[s, 0, None, draw(st.integers(0, 50))]
                for s in draw(st.lists(st.sampled_from("abc"), min_size=0, max_size=3,
                                       unique=True))]
        # per key advance: the sampler's B, or a key that skips, repeats or goes back
        advance = [draw(st.sampled_from([B, B, B, 2 * B, B + 3, 0, -1])) for _ in keys]
        u = draw(st.integers(0, 3))
        for _ in range(draw(st.integers(0, 14))):
            u += 1
            perturb = draw(st.lists(st.sampled_from(PERTURBATIONS), max_size=2))
            if "epoch" in perturb and keys:
                key = keys[draw(st.integers(0, len(keys) - 1))]
                key[1] += 1
                key[3] = 0
            if "order" in perturb and keys:
                keys[0][2] = f"o{u}"
            recs = group(draw, k, u, W, m, strided, [tuple(x) for x in keys], perturb,
                         1000.0 + k * 100 + u)
            (late if "late" in perturb else records).extend(recs)
            for key, adv in zip(keys, advance):
                if "jump" in perturb:
                    key[3] += B + 7
                elif "back" in perturb:
                    key[3] = max(0, key[3] - 3)
                else:
                    key[3] = max(0, key[3] + adv)
    records += late
    return records


def absorbed_both_ways(records, cuts):
    """(fast state, general state) after absorbing ``records`` in the chunks ``cuts``, with a
    to_bytes/from_bytes round trip between chunks (as a worker does)."""
    fast, general = Ledger(), Ledger()
    for lo, hi in zip([0] + cuts, cuts + [len(records)]):
        fast = Ledger.from_bytes(fast.to_bytes())
        general = Ledger.from_bytes(general.to_bytes())
        fast.absorb(records[lo:hi])
        general.absorb(records[lo:hi], fast=False)
    return fast, general


def same_state(fast, general):
    assert fast.to_bytes() == general.to_bytes()
    for number in general.attempts:
        for after, upto in ((-1, None), (2, 6), (5, None)):
            mine = fast.segment(number, after, upto)
            want = general.segment(number, after, upto)
            assert {k: (c.consumed, c.positions) for k, c in mine.items()} == \
                {k: (c.consumed, c.positions) for k, c in want.items()}


@SETTINGS
@given(streams(), st.data())
def test_the_fast_path_gives_the_general_paths_state(records, data):
    cuts = sorted(data.draw(st.lists(st.integers(0, len(records)), max_size=3)))
    fast, general = absorbed_both_ways(records, cuts)
    same_state(fast, general)


def plain(k, u, W, m, p, keys=("a", "b"), when=None):
    B = W * m
    return [LedgerRecord(k, u, r, 100.0 + u if when is None else when,
                         [{"stratum": s, "epoch": 0, "ranges": [[p + r, p + B, W]]} for s in keys])
            for r in range(W)]


def sampler_run(updates, W=4, m=2, start=0):
    out = []
    for i, u in enumerate(updates):
        out += plain(0, u, W, m, start + i * W * m)
    return out


def lane_steps(monkeypatch) -> list:
    """Record the outcome of every fast-path try (True: a group taken by the lane)."""
    taken: list = []
    original = ledger_module._Lane.take

    def counting(self, records, i, j):
        ok = original(self, records, i, j)
        taken.append(ok)
        return ok

    monkeypatch.setattr(ledger_module._Lane, "take", counting)
    return taken


def test_the_fast_path_is_taken_on_sampler_shaped_reports(monkeypatch):
    taken = lane_steps(monkeypatch)
    records = sampler_run(range(1, 41))
    fast, general = absorbed_both_ways(records, [])
    same_state(fast, general)
    # the first group goes the general way, the second too (its runs get their advance),
    # then every group is one lane step
    assert taken.count(True) == 38
    counts = fast.segment(0, 0, None)
    assert counts[("a", 0, None)].consumed == 40 * 8
    assert len(fast.attempts[0].runs) == 8        # one run per (rank, key)


@pytest.mark.parametrize("case", [
    "missing", "twice", "same_twice", "extra", "overlap", "nontile", "padding", "padding_false",
    "ids", "coordinator", "empty", "out_of_order", "shuffled_ranks", "gap", "two_calls",
    "coordinator_lane", "time_nan", "float_positions", "early_empty", "early_same",
    "early_coordinator"])
def test_edge_cases_of_the_fast_path_agree_with_the_general_path(case):
    records = sampler_run(range(1, 11))
    W = 4
    at = 6 * W  # first record of update 7
    if case == "missing":
        del records[at + 2]
    elif case == "twice":
        records.insert(at + 3, LedgerRecord(0, 7, 2, 50.0, records[at + 2].spans))
    elif case == "same_twice":
        records.insert(at + 1, records[at])
    elif case == "extra":
        records.insert(at + 4, LedgerRecord(0, 7, 1, 50.0, [{"stratum": "a", "ranges": [[0, 1]]}]))
    elif case == "overlap":
        records[at + 1].spans = records[at + 1].spans + [dict(records[at].spans[0])]
    elif case == "nontile":
        for rec in records[at:at + W]:
            item = rec.spans[0]["ranges"][0]
            rec.spans[0] = dict(rec.spans[0], ranges=[[item[0], item[1], W + 1]])
    elif case == "padding":
        records[at].spans = records[at].spans + [
            {"stratum": "a", "epoch": 0, "ranges": [[0, 4]], "padding": True}]
    elif case == "padding_false":
        for rec in records[at:]:
            rec.spans = [dict(s, padding=False) for s in rec.spans]
    elif case == "ids":
        records[at].spans = [{"stratum": "i", "epoch": 0, "ids": ["x", "y"]}]
    elif case == "coordinator":
        records.insert(at + 2, LedgerRecord(0, 7, None, 1.0, [{"stratum": "a",
                                                               "ranges": [[0, 2]]}]))
    elif case == "empty":
        records[at].spans = []
    elif case == "out_of_order":
        records = records[at:at + W] + records[:at] + records[at + W:]
    elif case == "shuffled_ranks":
        records[at:at + W] = reversed(records[at:at + W])
    elif case == "gap":
        records = records[:at] + [LedgerRecord(r.attempt, r.update, r.rank, r.time,
                                               [dict(s, ranges=[[s["ranges"][0][0] + 3,
                                                                 s["ranges"][0][1] + 3,
                                                                 s["ranges"][0][2]]])
                                                for s in r.spans]) for r in records[at:]]
    elif case == "two_calls":
        pass  # cut below
    elif case == "coordinator_lane":
        records = [LedgerRecord(0, u, None, 1.0 * u, [{"stratum": "a", "ranges": [[u, u + 1]]}])
                   for u in range(1, 20)]
    elif case == "time_nan":
        records[at].time = float("nan")
        records[at + W].time = float("nan")
        records[at + W + 1].time = float("inf")
    elif case == "float_positions":
        records[at].spans = [dict(s, ranges=[[float(x) for x in s["ranges"][0]]])
                             for s in records[at].spans]
    elif case == "early_empty":
        records.insert(at, LedgerRecord(0, 8, 1, 500.0, []))
    elif case == "early_same":
        records.insert(at, LedgerRecord(0, 8, 1, 500.0, records[at + W + 1].spans))
    elif case == "early_coordinator":
        records.insert(at, LedgerRecord(0, 9, None, 500.0, []))
    cuts = [at + 1, at + W + 2] if case == "two_calls" else []
    fast, general = absorbed_both_ways(records, cuts)
    same_state(fast, general)


@pytest.mark.parametrize("case", ["update_mix", "attempt_mix", "uneven_advance"])
def test_a_group_that_looks_like_the_template_but_is_not_the_next_update(case, monkeypatch):
    """Same positions every update (advance 0): a group slice can match ranks and spans while
    mixing updates or attempts; and keys advancing by different amounts."""
    records = []
    for u in range(1, 6):
        records += plain(0, u, 2, 1, 10)
    if case == "update_mix":
        records += plain(0, 6, 2, 1, 10)[:1] + plain(0, 7, 2, 1, 10)[1:] + plain(0, 7, 2, 1, 10)[:1]
    elif case == "attempt_mix":
        records += plain(0, 6, 2, 1, 10)[:1] + plain(1, 6, 2, 1, 10)[1:]
    else:
        records = []
        for u in range(1, 12):
            records += [LedgerRecord(0, u, r, 1.0, [
                {"stratum": "a", "epoch": 0, "ranges": [[2 * u + r, 2 * u + 2, 2]]},
                {"stratum": "b", "epoch": 0, "ranges": [[5 * u + r, 5 * u + 2, 2]]}])
                for r in range(2)]
    taken = lane_steps(monkeypatch)
    fast, general = absorbed_both_ways(records, [])
    same_state(fast, general)
    if case == "uneven_advance":
        assert taken.count(True) == 9


def test_a_rank_reporting_a_position_twice_and_two_ranks_reporting_it_count_as_in_the_spec():
    records = sampler_run(range(1, 9), W=2, m=1)
    # update 5: rank 1 re-sends its report (united: nothing new) and then adds position 0 once
    at = 4 * 2
    records.insert(at + 2, LedgerRecord(0, 5, 1, 1.0, records[at + 1].spans))
    records.insert(at + 3, LedgerRecord(0, 5, 1, 1.0, [{"stratum": "a", "epoch": 0,
                                                        "ranges": [[0, 1]]}]))
    # update 6: rank 0 also reports rank 1's position: counted twice
    records[at + 4].spans = records[at + 4].spans + [dict(records[at + 5].spans[0])]
    fast, general = absorbed_both_ways(records, [])
    same_state(fast, general)
    count = fast.segment(0, 0, None)[("a", 0, None)]
    assert count.consumed == 8 * 2 + 1 + 1
    assert count.distinct == 16


def test_a_malformed_range_raises_on_both_paths_and_leaves_the_same_state():
    records = []
    for u in range(1, 9):
        records += [LedgerRecord(0, u, r, 1.0, [{"stratum": "a", "epoch": 0,
                                                 "ranges": [[30 - 8 * u + r, 32 - 8 * u, 2]]}])
                    for r in range(2)]
    fast, general = Ledger(), Ledger()
    with pytest.raises(ValueError):
        fast.absorb(records)
    with pytest.raises(ValueError):
        general.absorb(records, fast=False)
    same_state(fast, general)


def as_plain_rows(records):
    """The rows ``Ledger.absorb_plain`` takes for ``records``: a record of one span of one range
    without order, padding or ids as columns (a stratum), every other one with its spans."""
    rows = []
    for rec in records:
        spans = rec.spans
        span = spans[0] if len(spans) == 1 else None
        if span is not None and set(span) == {"stratum", "epoch", "ranges"} \
                and len(span["ranges"]) == 1 and len(span["ranges"][0]) in (2, 3):
            item = span["ranges"][0]
            rows.append((rec.attempt, rec.update, rec.rank, rec.time, None, span["stratum"],
                         span["epoch"], item[0], item[1], item[2] if len(item) == 3 else None))
        else:
            rows.append((rec.attempt, rec.update, rec.rank, rec.time, spans, None, None, None,
                         None, None))
    return rows


@SETTINGS
@given(streams(), st.data())
def test_it_absorbs_plain_rows_into_the_state_absorb_gives_their_records(records, data):
    single = [LedgerRecord(r.attempt, r.update, r.rank, r.time, r.spans[:1]) for r in records
              if data.draw(st.booleans(), label="one span only")] if records else []
    records = records + single
    cuts = sorted(data.draw(st.lists(st.integers(0, len(records)), max_size=3)))
    plain_state, general = Ledger(), Ledger()
    for lo, hi in zip([0] + cuts, cuts + [len(records)]):
        plain_state = Ledger.from_bytes(plain_state.to_bytes())
        general = Ledger.from_bytes(general.to_bytes())
        assert plain_state.absorb_plain(as_plain_rows(records[lo:hi])) == hi - lo
        general.absorb(records[lo:hi])
    same_state(plain_state, general)


def test_it_takes_the_plain_path_for_a_sampler_run_and_extends_one_run_per_rank(monkeypatch):
    records = sampler_run(range(1, 41), W=4, m=2)
    one_key = [LedgerRecord(r.attempt, r.update, r.rank, r.time, r.spans[:1]) for r in records]
    general_records = []
    each = Ledger._absorb_each

    def counted(self, recs, touched):
        general_records.extend(recs)
        return each(self, recs, touched)

    monkeypatch.setattr(Ledger, "_absorb_each", counted)
    state = Ledger()
    assert state.absorb_plain(as_plain_rows(one_key)) == len(one_key)
    assert [r.update for r in general_records] == [1, 1, 1, 1]  # the ranks' first update only
    monkeypatch.setattr(Ledger, "_absorb_each", each)
    general = Ledger()
    general.absorb(one_key, fast=False)
    assert state.to_bytes() == general.to_bytes()
    assert len(state.attempts[0].runs) == 4
    assert state.attempts[0].runs[0][3:5] == [one_key[0].update, one_key[-1].update]


def test_a_malformed_plain_row_raises_as_absorb_does_and_keeps_the_rows_before():
    good = sampler_run(range(1, 4), W=2, m=2)
    good = [LedgerRecord(r.attempt, r.update, r.rank, r.time, r.spans[:1]) for r in good]
    bad = LedgerRecord(0, good[-1].update + 1, 0, 1.0,
                       [{"stratum": "a", "epoch": 0, "ranges": [[5, 2]]}])
    plain_state, general = Ledger(), Ledger()
    with pytest.raises(ValueError) as plain_error:
        plain_state.absorb_plain(as_plain_rows(good + [bad]))
    with pytest.raises(ValueError) as general_error:
        general.absorb(good + [bad], fast=False)
    assert str(plain_error.value) == str(general_error.value)
    assert plain_state.to_bytes() == general.to_bytes()


def test_plain_rows_read_again_are_skipped_keeping_the_earlier_time(monkeypatch):
    # a folded ledger row that grew is read again whole: the ranks already absorbed with these
    # positions at this update take no general record, and the state is the general path's
    records = sampler_run(range(1, 11), W=4, m=2)
    one_key = [LedgerRecord(r.attempt, r.update, r.rank, r.time, r.spans[:1]) for r in records]
    again = [LedgerRecord(r.attempt, r.update, r.rank, r.time - 0.25 * (r.update == 5),
                          r.spans) for r in one_key if r.update in (5, 10)]
    general_records = []
    each = Ledger._absorb_each

    def counted(self, recs, touched):
        general_records.extend(recs)
        return each(self, recs, touched)

    state = Ledger()
    state.absorb_plain(as_plain_rows(one_key))
    monkeypatch.setattr(Ledger, "_absorb_each", counted)
    assert state.absorb_plain(as_plain_rows(again)) == len(again)
    assert general_records == []
    monkeypatch.setattr(Ledger, "_absorb_each", each)
    general = Ledger()
    general.absorb(one_key, fast=False)
    general.absorb(again, fast=False)
    assert state.to_bytes() == general.to_bytes()
    assert state.attempts[0].update_time(5) == min(r.time for r in again if r.update == 5)
