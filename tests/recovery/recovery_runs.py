"""Random training runs for the property tests: a small simulator driven by hypothesis draws.

Each attempt consumes a global stream per stratum (rank r of W reports strided or blocked shares),
saves generations whose manifest declares the stream's cursor (sometimes off by one), and the next
attempt resumes a random older generation with an offset before, at or after the right cursor, an
epoch jump or an order change; or starts fresh, or from an unknown generation; a resumed attempt
sometimes numbers its updates from at or below the restored update (docs/definitions.md#
renumbered-updates). World size and global batch change between attempts. Padding, re-sent
reports, tensor-parallel peers, coordinator reports and cross-rank duplicates are sprinkled in.
The attempts name the samples of their positions (a span's ``indices``), some or none do, or
none does and the orders are DistributedSampler orders the server re-creates (named by their
``order_digest``, the attempts declaring the seeds: docs/definitions.md#re-created-orders).
"""
from __future__ import annotations

import math

from hypothesis import strategies as st

from recoverydash.recovery import (
    AttemptRecord,
    GenerationRecord,
    HeartbeatRecord,
    LedgerRecord,
    RunInput,
)
from recoverydash.recovery.samplers import SAMPLER_ALGORITHM, order_digest

COMPONENTS = ["model", "optimizer", "scheduler", "rng", "data_progress"]


def manifest_for(gid, update, world_size, cursor, committed_at):
    objects = [{"uri": f"file:///ckpt/{gid}/{c}", "shard": "rank0", "component": c, "size": 10,
                "sha256": f"{abs(hash((gid, c))):064x}"[:64]} for c in COMPONENTS]
    return {"schema_revision": 1, "generation_id": gid, "update": update,
            "world_size": world_size, "required_shards": ["rank0"], "components": COMPONENTS,
            "objects": objects, "data_progress": {"cursor": cursor}, "dataset_version": "ds",
            "committed_at": committed_at}


def sample_of(order: str, epoch: int, position: int, length: int | None) -> int:
    """The dataset index at ``position`` of an epoch under ``order``: a permutation of
    ``[0, length)`` (an affine map modulo the length) when the length is known, else of the
    integers (an exclusive or with a salt); positions at or past the length are their own."""
    salt = sum((i + 1) * ord(c) for i, c in enumerate(f"{order}:{epoch}"))
    if length is None:
        return position ^ (salt % 64)
    if position >= length:
        return position
    units = [a for a in range(1, length + 1) if math.gcd(a, length) == 1]
    return (units[salt % len(units)] * position + salt) % length


def with_indices(span: dict, length: int | None) -> dict:
    """``span`` (ranges under a named order) with the ``indices`` its positions held."""
    return dict(span, indices=sorted({sample_of(span["order"], span["epoch"], p, length)
                                      for item in span["ranges"] for p in range(*item)}))


def seed_of(label: str) -> int:
    """The seed of a simulated order label: ``o<e>`` (the run's first order of each epoch) is
    seed 0, ``x<k>`` (attempt k changed the order) seed k + 1."""
    return 0 if label.startswith("o") else int(label[1:]) + 1


def recreated_name(label: str | None, stratum: str, epoch: int,
                   lengths: dict) -> str | None:
    """The name a DistributedSampler order of ``label`` gets (docs/definitions.md#re-created-
    orders): its ``order_digest``; the label itself when the stratum's length is not declared
    (then it cannot be re-created)."""
    if label is None or stratum not in lengths:
        return label
    return order_digest(seed=seed_of(label), epoch=epoch, dataset_length=lengths[stratum],
                        shuffle=True, dataset_version="ds")


def declared_sampler(lengths: dict, seed: int) -> dict:
    """``attempt_started.sampler`` of a DistributedSampler with ``seed``, as the SDK sends it."""
    return {"algorithm": SAMPLER_ALGORITHM, "seed": seed, "shuffle": True,
            "drop_last": False, "epoch_length": lengths, "ledger": "observed"}


@st.composite
def runs(draw, max_attempts=6, max_updates=8):
    strata = draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3, unique=True))
    id_stratum = draw(st.sampled_from([None, None] + strata[1:])) if len(strata) > 1 else None
    int_ids = draw(st.booleans())  # ids that are dataset indices, or some hashed strings
    lengths = {s: draw(st.integers(6, 40)) for s in strata if draw(st.booleans())}
    ordered = draw(st.sampled_from([True, True, False]))
    # whether the attempts name the samples of their positions (a span's indices), or none
    # and the orders are DistributedSampler orders the server re-creates
    indexing = draw(st.sampled_from(["all", "all", "all", "none", "some", "recreated"]))
    recreate = indexing == "recreated"

    def name(label, stratum, epoch):
        return recreated_name(label, stratum, epoch, lengths) if recreate else label
    attempts, ledger, beats, generations = [], [], [], {}
    t = 1000.0
    saved = []  # (gid, attempt, update, stream copy)
    for k in range(draw(st.integers(1, max_attempts))):
        W = draw(st.integers(1, 4))
        m = draw(st.integers(1, 3))
        B = W * m
        strided = draw(st.booleans())
        indexed = indexing == "all" or (indexing == "some" and draw(st.booleans()))

        def named(span, indexed=indexed):
            if indexed and span.get("order") is not None and "ranges" in span \
                    and not span.get("padding"):
                return with_indices(span, lengths.get(span["stratum"]))
            return span
        stream = {s: [0, 0, "o0" if ordered else None] for s in strata}
        resumed_from, U, seed = None, 0, 0
        how = draw(st.sampled_from(["fresh", "untracked"] if k == 0 or not saved else
                                   ["generation"] * 5 + ["fresh", "untracked"]))
        if how == "generation":
            gid, _w, U, snap = draw(st.sampled_from(saved))
            stream = {s: list(v) for s, v in snap.items()}
            s = draw(st.sampled_from(strata))
            move = draw(st.sampled_from(["same", "same", "back", "ahead", "epoch", "order",
                                         "order"]))
            if move == "back":
                stream[s][1] = max(0, stream[s][1] - draw(st.integers(1, B + 2)))
            elif move == "ahead":
                stream[s][1] += draw(st.integers(1, B + 2))
            elif move == "epoch":
                stream[s][0] += draw(st.integers(1, 2))
                stream[s][1] = 0
            elif move == "order":
                stream[s][2] = f"x{k:d}"
                seed = k + 1
            declared = draw(st.sampled_from([U, U, U, U + 1]))
            cursor = [] if draw(st.integers(0, 4)) == 0 else \
                [{"stratum": s2, "epoch": v[0], "position": v[1]} for s2, v in stream.items()
                 if s2 != id_stratum]
            resumed_from = {"generation_id": gid, "update": declared, "cursor": cursor}
        elif how == "untracked":
            U = draw(st.integers(0, 5))
            for s in strata:
                stream[s][1] = draw(st.integers(0, 12))
            resumed_from = {"generation_id": draw(st.sampled_from([None, "nowhere"])),
                            "update": U, "cursor": [
                                {"stratum": s, "epoch": v[0], "position": v[1]}
                                for s, v in stream.items() if s != id_stratum]}
        attempt = AttemptRecord(attempt=k, started_at=t, world_size=W, dataset_version="ds",
                                global_batch_size=draw(st.sampled_from([B, None])),
                                sampler=declared_sampler(lengths, seed) if recreate
                                else {"epoch_length": lengths}, resumed_from=resumed_from)
        attempts.append(attempt)
        t += 1.0
        last = U
        count = draw(st.integers(0, max_updates))
        # a resumed attempt may number its updates from at or below the update it restored
        # (docs/definitions.md#renumbered-updates, torchtitan #571)
        first = U + 1
        if resumed_from is not None and U >= 1 and draw(st.integers(0, 3)) == 0:
            first = draw(st.integers(max(1, U - 4), U))
        for update in range(first, first + count):
            t += 1.0
            reports = {r: [] for r in range(W)}
            for s in strata:
                if len(strata) > 1 and draw(st.integers(0, 5)) == 0:
                    continue
                e, pos, order = stream[s]
                if s in lengths and pos + B > lengths[s]:
                    e, pos = e + 1, 0
                    order = None if order is None else f"o{e:d}"
                base = {"stratum": s, "epoch": e}
                if order is not None:
                    base["order"] = name(order, s, e)
                for r in range(W):
                    share = range(pos + r, pos + B, W) if strided else \
                        range(pos + r * m, pos + (r + 1) * m)
                    span = dict(base)
                    if s == id_stratum:
                        span["ids"] = list(share) if int_ids else \
                            [f"{s}:{e}:{p}" if p % 2 else p for p in share]
                    else:
                        span["ranges"] = [[share.start, share.stop, share.step]]
                    reports[r].append(named(span))
                stream[s] = [e, pos + B, order]
                if draw(st.integers(0, 6)) == 0:
                    reports[0].append(dict(base, ranges=[[0, 3]], padding=True))
                if draw(st.integers(0, 6)) == 0 and s != id_stratum:
                    victim = draw(st.integers(0, W - 1))
                    reports[victim].append(named(dict(base, ranges=[[pos, pos + 2]])))
            # a rank's part of an attempt's first update, or of its last, that never arrives
            lost = draw(st.integers(0, W - 1)) if W > 1 and (
                update == first or update == first + count - 1) \
                and draw(st.integers(0, 4)) == 0 else None
            for r, spans in reports.items():
                if r == lost:
                    continue
                ledger.append(LedgerRecord(k, update, r, t, spans))
                if draw(st.integers(0, 8)) == 0:
                    ledger.append(LedgerRecord(k, update, r, t + 0.1, list(spans[:1])))
            if draw(st.integers(0, 10)) == 0:
                s = draw(st.sampled_from(strata))
                if s != id_stratum:
                    e = stream[s][0]
                    span = {"stratum": s, "epoch": e, "ranges": [[0, 2]]}
                    if stream[s][2] is not None:
                        span["order"] = name(stream[s][2], s, e)
                    ledger.append(LedgerRecord(k, update, None, t, [named(span)]))
            last = update
            if draw(st.integers(0, 2)) == 0:
                gid = f"g{k}-{update}"
                snap = {s: list(v) for s, v in stream.items()}
                cursor = [{"stratum": s, "epoch": v[0], "position": v[1]}
                          for s, v in snap.items() if s != id_stratum and v[1] > 0]
                # at an epoch boundary with a drop_last remainder, a trainer's sampler may name
                # the next epoch's start instead (restorable when the remainder < global batch)
                cursor = [dict(c, epoch=c["epoch"] + 1, position=0)
                          if c["stratum"] in lengths and c["position"] + B > lengths[c["stratum"]]
                          and draw(st.booleans()) else c for c in cursor]
                if cursor and draw(st.integers(0, 5)) == 0:
                    cursor[0] = dict(cursor[0], position=cursor[0]["position"] + 1)
                gen = GenerationRecord(gid, k, update, started_at=t + 0.2,
                                       required_shards=["rank0"], components=COMPONENTS,
                                       manifests=[manifest_for(gid, update, W, cursor,
                                                               "1970-01-01T00:00:00+00:00")],
                                       committed_at=t + 0.5)
                gen.manifests[0]["committed_at"] = None
                gen.object_checks = {o["uri"]: "ok" for o in gen.manifests[0]["objects"]}
                generations[gid] = gen
                saved.append((gid, k, update, snap))
        fetched = [{"stratum": s, "epoch": v[0], "position": v[1] + draw(st.integers(0, B))}
                   for s, v in stream.items() if s != id_stratum]
        beats.append(HeartbeatRecord(k, 0, t + 0.3, last, fetched))
        t += 2.0
        if draw(st.integers(0, 3)):
            attempt.ended_at = t
            attempt.end_reason = "failed"
            attempt.end_update = last
        attempt.last_event_at = t
        t += 5.0
    return RunInput(run_id="prop", attempts=attempts, ledger=ledger, heartbeats=beats,
                    generations=list(generations.values()), first_event_at=1000.0)
