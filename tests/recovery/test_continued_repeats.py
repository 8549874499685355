"""``stale_state`` and ``optimizer_stateless`` continued
(docs/definitions.md#stale-state-and-stateless-optimizers): the pass of :func:`state_repeats`
over generations split at any update, the later part continued from the earlier one's basis with
only the first occurrences of its own
digests given (what the worker's ``InputDigest`` rows answer), finds exactly what one pass over
every generation finds; a row at or below the basis' top is refused."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recoverydash.recovery import GenerationRecord
from recoverydash.recovery.generations import continue_repeats, repeat_row, state_repeats

gen = st.tuples(st.integers(0, 12), st.sampled_from(["a", "b", "c"]),
                st.lists(st.tuples(st.sampled_from(["model", "optimizer", "rng"]),
                                   st.integers(0, 4)), max_size=4),
                st.booleans())


def record(k: int, update, objects, conflict: bool) -> GenerationRecord:
    doc = {"schema_revision": 1, "generation_id": f"g{k}", "update": update,
           "objects": [{"uri": f"file:///g{k}/{i}", "component": c, "sha256": f"{c[0]}{d}"}
                       for i, (c, d) in enumerate(objects)]}
    docs = [doc, {**doc, "world_size": 9}] if conflict else [doc]
    return GenerationRecord(f"g{k}", 0, manifests=docs)


def as_json(out: dict) -> str:
    return json.dumps({gid: (stale, None if r is None else r.to_dict())
                       for gid, (stale, r) in out.items()}, sort_keys=True)


@settings(max_examples=300, deadline=None)
@given(st.lists(gen, max_size=12), st.lists(st.integers(0, 13), max_size=4))
def test_continued_in_parts_equals_one_pass(specs, cuts):
    gens = [record(k, u, objs, conflict and k % 3 == 0) for k, (u, _, objs, conflict)
            in enumerate(specs)]
    whole = state_repeats(gens)
    rows = [r for r in map(repeat_row, gens) if r is not None]
    out, basis, index = {}, None, {}
    bounds = sorted(set(cuts)) + [None]
    lo = None
    for hi in bounds:
        part = [r for r in rows if (lo is None or r[0] >= lo) and (hi is None or r[0] < hi)]
        lo = hi
        seen = {(c, sha): index[(c, sha)] for _, _, objs, _ in part for c, sha, _ in objs
                if (c, sha) in index}
        found, first, basis = continue_repeats(part, json.loads(json.dumps(basis)), seen)
        assert not set(first) & set(index)
        index.update(first)
        out.update(found)
    assert as_json(out) == as_json(whole)


def test_a_row_not_above_the_top_is_refused():
    rows = [repeat_row(record(1, 5, [("model", 1)], False))]
    _, _, basis = continue_repeats(rows)
    assert basis["top"] == [0, 5]  # attempt 0, update 5: the order of commit
    with pytest.raises(ValueError):
        continue_repeats([repeat_row(record(2, 5, [("model", 1)], False))], basis, {})
