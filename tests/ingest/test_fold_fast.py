"""The ledger fold's shortcuts store exactly what the general path stores.

``runs.folding.fold`` walks each part's spans once (``ok``) and refuses on the first range
before building moved spans; ``_Projection._join_stored`` skips ``runs.folding.join`` for a
group with no stored row to join whose batch rows share one time (fold's maximal runs: join
would chain none). Pinned three ways: fold against the fold it replaced (a copy below), join
chaining none of fold's rows of one time (random parts of every shape the wire allows: the SDK's
strided ranges whose stop moves with the rank, the benches' fixed stop, ids, the global rank,
other samples, shifts and times), and ingest with and without the shortcut storing the same
ledger rows (PostgreSQL and SQLite)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recoverydash.ingest import actions
from recoverydash.ingest.actions import ingest_batch
from recoverydash.runs.folding import GLOBAL_RANK, fold, foldable, join, shifted, unfold
from recoverydash.runs.models import LedgerRow, Project


def reference_fold(parts: dict) -> list[tuple[int, int, int, dict]]:
    """The fold before its shortcuts (main at 729651e), kept as the reference."""
    out = []
    order = sorted(parts)
    i = 0
    while i < len(order):
        rank = order[i]
        entry = parts[rank]
        n, shift = 1, 0
        if rank != GLOBAL_RANK and foldable(entry["spans"]):
            prev = entry
            while i + n < len(order) and order[i + n] == rank + n:
                nxt = parts[order[i + n]]
                if nxt["time"] != entry["time"] or nxt["samples"] != entry["samples"] \
                        or nxt["tokens"] != entry["tokens"] or not foldable(nxt["spans"]):
                    break
                first, then = prev["spans"][0]["ranges"][0], nxt["spans"][0]["ranges"][0]
                step = then[0] - first[0]
                if n > 1 and step != shift:
                    break
                if then[1] - first[1] != step or shifted(prev["spans"], step) != nxt["spans"]:
                    break
                shift = step
                prev = nxt
                n += 1
        if n == 1:
            shift = 0
        out.append((rank, n, shift, entry))
        i += n
    return out


def _spans(shape: str, base: int, r: int, world: int) -> list:
    if shape == "sdk":  # the SDK's CountingRecorder: stop moves with the rank
        return [{"stratum": "m", "epoch": 0, "ranges": [[base + r, base + r + 4 * world, world]]}]
    if shape == "fixed":  # the benches' shape: the stop stays
        return [{"stratum": "m", "epoch": 0, "ranges": [[base + r, base + 4 * world, world]]}]
    if shape == "two":
        return [{"stratum": "m", "epoch": 0,
                 "ranges": [[base + r, base + r + 9], [50 + r, 60 + r]]},
                {"stratum": "x", "epoch": 1, "ranges": [[r, r + 1]]}]
    if shape == "dup":
        return [{"stratum": "m", "epoch": 0, "ranges": [[base, base + 4 * world, world]]}]
    if shape == "neg":
        return [{"stratum": "m", "epoch": 0, "ranges": [[1000 - 3 * r, 1005 - 3 * r]]}]
    if shape == "ids":
        return [{"stratum": "i", "epoch": 0, "ids": [f"id{r}"]}]
    return [{"stratum": "m", "epoch": 0, "ranges": [[base + 2 * r, base + 2 * r + 4, 1]]}]


_SHAPES = ("sdk", "sdk", "sdk", "fixed", "two", "dup", "neg", "ids", "wide")


@st.composite
def update_parts(draw):
    world = draw(st.integers(2, 12))
    base = draw(st.integers(0, 2 ** 40))
    parts = {}
    for r in draw(st.lists(st.integers(-1, world - 1), unique=True, max_size=world + 1)):
        shape = draw(st.sampled_from(_SHAPES))
        parts[r] = {"time": draw(st.sampled_from([1, 1, 1, 2])),
                    "spans": _spans(shape, base, r, world),
                    "samples": draw(st.sampled_from([4, 4, 4, 3])),
                    "tokens": draw(st.sampled_from([None, None, 7]))}
    return parts


@settings(max_examples=400, deadline=None)
@given(update_parts())
def test_fold_gives_the_rows_of_the_fold_it_replaced_and_walks_each_part_once(parts):
    ok: dict = {}
    rows = fold(parts, ok)
    assert rows == reference_fold(parts)
    assert ok == {r: r != GLOBAL_RANK and foldable(e["spans"]) for r, e in parts.items()}
    back = {rank: spans for row in rows for rank, spans in unfold(row[0], row[1], row[2],
                                                                    row[3]["spans"])}
    assert back == {r: e["spans"] for r, e in parts.items()}


@settings(max_examples=400, deadline=None)
@given(update_parts())
def test_join_chains_none_of_folds_rows_of_one_time(parts):
    parts = {r: dict(e, time=1) for r, e in parts.items()}
    ok: dict = {}
    rows = [row for row in fold(parts, ok) if ok[row[0]]]
    segs = [{"rank": rank, "ranks": n, "shift": shift, "spans": e["spans"],
             "samples": e["samples"], "tokens": e["tokens"], "ok": True}
            for rank, n, shift, e in rows]
    assert all(len(members) == 1 for members, _ in join(segs))
    # the same answer without the precomputed ok
    assert join([{k: v for k, v in s.items() if k != "ok"} for s in segs]) == join(segs)


def _batches(seed: int) -> list[list[dict]]:
    rng = random.Random(seed)
    world = 8
    events = []
    for u in range(1, 7):
        base = (u - 1) * 32
        time = f"2026-11-01T00:00:{u:02d}.{rng.choice([0, 0, 250]):03d}Z"
        if rng.random() < 0.4:
            parts = []
            for r in range(world):
                if rng.random() < 0.1:
                    continue
                shape = rng.choice(_SHAPES[:-2] + ("wide",))
                parts.append({"rank": r, "samples": 4, "spans": _spans(shape, base, r, world)})
            if parts:
                events.append({"event_id": f"a{u}", "type": "update_aggregate", "run_id": "r",
                               "attempt": 0, "time": time, "update": u, "world_size": world,
                               "ranks": parts})
            continue
        for r in range(world):
            if rng.random() < 0.1:
                continue
            t = time if rng.random() < 0.85 else f"2026-11-01T00:01:{r:02d}Z"
            shape = rng.choice(_SHAPES)
            events.append({"event_id": f"u{u}-{r}", "type": "update_committed", "run_id": "r",
                           "attempt": 0, "time": t, "rank": r, "update": u,
                           "samples": rng.choice([4, 4, 4, 3]),
                           "spans": _spans(shape, base, r, world)})
    rng.shuffle(events)
    out, i = [], 0
    while i < len(events):
        n = rng.randrange(1, 30)
        out.append(events[i:i + n])
        i += n
    return out


def _ledger(project) -> list[tuple]:
    return sorted((row.attempt, row.update, row.rank, row.ranks, row.rank_shift, row.time,
                   repr(row.spans), row.samples, row.tokens)
                  for row in LedgerRow.objects.filter(run__project=project))


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("seed", range(12))
def test_ingest_stores_the_same_ledger_rows_with_and_without_the_join_shortcut(seed, monkeypatch):
    batches = _batches(seed)
    fast = Project.objects.create(name="fast")
    for batch in batches:
        ingest_batch(fast, batch)
    monkeypatch.setattr(actions, "_one_time", lambda pending, keys: False)
    slow = Project.objects.create(name="slow")
    for batch in batches:
        ingest_batch(slow, batch)
    assert _ledger(fast) == _ledger(slow)
    assert _ledger(fast)
