"""``Ledger.to_parts`` / ``from_parts`` (state format 6): a head and time blocks of 4,096
updates; only the blocks written since the state was loaded are given to be stored again, and
the stored parts load into the state a single value (``to_bytes``) holds."""
from __future__ import annotations

import pytest

from recoverydash.recovery import Ledger, LedgerRecord


def records(updates, shift=0.0):
    return [LedgerRecord(0, u, r, 100.0 + u + shift,
                         [{"stratum": "s", "epoch": 0, "ranges": [[4 * u + r, 4 * u + r + 1]]}])
            for u in updates for r in range(4)]


def load(head, stored):
    return Ledger.from_parts(head, [(a, b, d) for (a, b), d in stored.items()])


def test_only_the_blocks_written_since_the_load_are_given():
    whole = Ledger.from_records(records(range(10_000)))
    head, blocks = whole.to_parts()
    assert sorted(blocks) == [(0, 0), (0, 1), (0, 2)]  # updates 0-4,095, 4,096-8,191, 8,192-
    assert whole.to_parts()[1] == {}  # given once
    stored = dict(blocks)
    state = load(head, stored)
    assert state.state_format == 6 and state.to_bytes() == whole.to_bytes()
    for ledger in (state, whole):
        ledger.absorb(records(range(10_000, 10_100)))  # fast path (lanes) into block 2
    head, blocks = state.to_parts()
    assert sorted(blocks) == [(0, 2)]
    stored.update(blocks)
    state = load(head, stored)
    for ledger in (state, whole):
        ledger.absorb(records([5], shift=-50.0))  # an earlier report of an old update
        ledger.absorb(records([20_000]))  # a far update: a new block
    head, blocks = state.to_parts()
    assert sorted(blocks) == [(0, 0), (0, 4)]
    stored.update(blocks)
    state = load(head, stored)
    assert state.to_bytes() == whole.to_bytes()
    assert state.update_time(0, 5) == 55.0 and state.update_time(0, 20_000) == 20_100.0
    assert sorted(state.to_parts(every=True)[1]) == [(0, 0), (0, 1), (0, 2), (0, 4)]


def test_a_missing_or_damaged_block_is_refused_and_an_older_state_loads_whole():
    whole = Ledger.from_records(records(range(5000)))
    head, blocks = whole.to_parts()
    with pytest.raises(ValueError, match="missing"):
        load(head, {(0, 0): blocks[(0, 0)]})
    with pytest.raises(ValueError, match="bytes"):
        load(head, {**blocks, (0, 1): blocks[(0, 1)][:-3]})
    with pytest.raises(ValueError, match="in parts"):
        Ledger.from_bytes(head)
    single = Ledger.from_parts(whole.to_bytes(), [])  # format 5: whole, every block to write
    assert single.state_format == 5
    assert sorted(single.to_parts()[1]) == [(0, 0), (0, 1)]
