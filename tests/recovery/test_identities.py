"""Dataset indices beside positions (docs/ingest-v1.md#3-positions-spans-and-cursors, a span's
``indices``): the ledger keeps what every report named, through every way it is stored, and
says when a report named none."""
from __future__ import annotations

import random

from pyroaring import BitMap64

from recoverydash.recovery import Ledger, LedgerRecord
from recoverydash.recovery.positions import index_set

KEY = ("main", 0, "o1")


def report(update, rank, indices, start=None, order="o1"):
    start = 4 * update if start is None else start
    span = {"stratum": "main", "epoch": 0, "order": order, "ranges": [[start, start + 4]]}
    if indices is not None:
        span["indices"] = indices
    return LedgerRecord(0, update, rank, float(update), [span])


def test_a_spans_indices_are_integers_and_ranges_of_them():
    assert list(index_set([7, [10, 13], [20, 27, 3]])) == [7, 10, 11, 12, 20, 23, 26]


def test_it_keeps_the_indices_each_update_named_and_those_of_a_range_of_updates():
    ledger = Ledger.from_records([report(1, 0, [5, 9]), report(1, 1, [3]),
                                  report(2, 0, [[100, 103]]), report(3, 0, [2**40])])
    assert list(ledger.identities(0, KEY, 0, 1)) == [3, 5, 9]
    assert list(ledger.identities(0, KEY, 1, None)) == [100, 101, 102, 2**40]
    assert list(ledger.identities(0, KEY, 0, None)) == [3, 5, 9, 100, 101, 102, 2**40]


def test_a_report_that_named_no_indices_makes_the_samples_of_its_updates_unknown():
    ledger = Ledger.from_records([report(1, 0, [5]), report(2, 0, None), report(3, 0, [7])])
    assert ledger.identities(0, KEY, 0, None) is None
    assert ledger.identities(0, KEY, 0, 1) == BitMap64([5])
    assert ledger.identities(0, KEY, 2, 3) == BitMap64([7])
    other = Ledger.from_records([report(1, 0, [5]), report(1, 1, None, start=100)])
    assert other.identities(0, KEY, 0, None) is None   # rank 1 of the same update named none


def test_a_re_sent_report_unites_its_indices():
    ledger = Ledger.from_records([report(1, 0, [5]), report(1, 0, [6])])
    assert list(ledger.identities(0, KEY, 0, None)) == [5, 6]


def test_indices_survive_every_stored_form_and_incremental_absorption():
    rnd = random.Random(3)
    records = [report(u, r, rnd.sample(range(10**6), 3) + ([2**33 + u] if u % 7 == 0 else []),
                      start=8 * u + 4 * r)
               for u in range(1, 9000, 3) for r in range(2)]
    whole = Ledger.from_records(records)
    assert Ledger.from_bytes(whole.to_bytes()).to_bytes() == whole.to_bytes()
    head, blocks = whole.to_parts()
    stored = dict(blocks)
    state = Ledger.from_parts(head, [(a, b, d) for (a, b), d in stored.items()])
    assert state.to_bytes() == whole.to_bytes()
    # the worker's way: absorb in batches, store the head and the blocks that changed
    state, stored = Ledger(), {}
    for lo in range(0, len(records), 700):
        head, blocks = state.to_parts()
        stored.update(blocks)
        state = Ledger.from_parts(head, [(a, b, d) for (a, b), d in stored.items()])
        state.absorb(records[lo:lo + 700])
    assert state.to_bytes() == whole.to_bytes()
    assert state.identities(0, KEY, 0, None) == whole.identities(0, KEY, 0, None)
    assert len(whole.identities(0, KEY, 3000, 6001)) == len(
        {i for rec in records if 3000 < rec.update <= 6001
         for i in index_set(rec.spans[0]["indices"])})
