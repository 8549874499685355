"""Folding is exact whatever the order: random per-rank events (missing ranks, duplicate
positions, several strata, ids mixed with ranges, negative and overlapping shifts, positions
near 2**62, a global rank, re-sends with another span, time or sample count, aggregates
repeating ranks) in random batches, analysed between batches, give the analysis and the
per-rank reports of the same events sent one per batch with no folding at all (found: a
rank's re-sent report kept the first-arrived time, not the earliest, so a fold changed the
committed cursor's times, useful_seconds and update_interval)."""
from __future__ import annotations

import json
import random
from contextlib import contextmanager
from unittest import mock

import pytest

from recoverydash.ingest import actions
from recoverydash.ingest.actions import _Projection, ingest_batch
from recoverydash.recovery import analyze as core_analyze
from recoverydash.recovery.inputs import RunInput
from recoverydash.runs.analysis import analyze
from recoverydash.runs.models import LedgerRow, Project, Run, rank_reports

W = 8
B = 2
NOW = 1_793_500_000.0


def at(t, ms=0):
    return f"2026-11-01T00:{t // 60:02d}:{t % 60:02d}.{ms:03d}Z"


def base_spans(u, r, stratum="m"):
    base = (u - 1) * B * W
    return [{"stratum": stratum, "epoch": 0, "ranges": [[base + r, base + r + B * W, W]]}]


@contextmanager
def nofold():
    def single(parts, ok=None):
        if ok is not None:
            ok.update((r, False) for r in parts)
        return [(r, 1, 0, parts[r]) for r in sorted(parts)]
    with mock.patch.object(_Projection, "_join_stored", lambda self, pending: pending), \
            mock.patch.object(actions, "fold", single):
        yield


def scenario(seed):
    rng = random.Random(seed)
    events = [{"event_id": "s0", "type": "attempt_started", "run_id": "r", "attempt": 0,
               "time": at(0), "world_size": W, "dataset_version": "v",
               "global_batch_size": W * B}]
    n = 0
    for u in range(1, 4):
        for r in range(W):
            choice = rng.random()
            first = (u - 1) * B * W  # the update's first position
            sp = base_spans(u, r)
            samples = B
            if choice < 0.1:
                continue  # missing
            elif choice < 0.2:
                sp = base_spans(u, max(r - 1, 0))  # duplicate neighbour
            elif choice < 0.3:
                sp = base_spans(u, r) + base_spans(u, r, "x")  # two strata
            elif choice < 0.35:
                sp = [{"stratum": "m", "epoch": 0, "ranges": [[first + r, first + r + 1]]}]
            elif choice < 0.4:
                samples = 3
            elif choice < 0.5:
                # negative shift
                sp = [{"stratum": "m", "epoch": 0,
                       "ranges": [[10_000 - 3 * r, 10_000 - 3 * r + 5]]}]
            elif choice < 0.55:
                # ids mixed with ranges
                sp = [{"stratum": "i", "epoch": 0, "ids": [f"id{u}-{r}"]}] + base_spans(u, r)
            elif choice < 0.6:
                # overlapping blocks
                sp = [{"stratum": "m", "epoch": 0,
                       "ranges": [[first + r * W, first + r * W + 2 * W, 1]]}]
            elif choice < 0.62:
                sp = [{"stratum": "m", "epoch": 0, "ranges": [[2**62 + r, 2**62 + r + 16, W]]}]
            elif choice < 0.65:
                sp = [{"stratum": "m", "epoch": 1,
                       "ranges": [[r, r + 16, W], [100 + r, 116 + r, W]]}]
            elif choice < 0.45:
                sp = [{"stratum": "m", "epoch": 0,
                       "ranges": [[first + 2 * r, first + 2 * r + B * W, W]]}]
            n += 1
            events.append({"event_id": f"u{u}-{r}", "type": "update_committed", "run_id": "r",
                           "attempt": 0, "rank": r, "time": at(u, rng.randrange(9)),
                           "update": u, "samples": samples, "spans": sp})
            if rng.random() < 0.05:  # global rank
                events.append({"event_id": f"g{u}-{r}", "type": "update_committed", "run_id": "r",
                               "attempt": 0, "rank": None, "time": at(u, rng.randrange(9)),
                               "update": u, "samples": B, "spans": sp})
            if rng.random() < 0.15:  # a re-send with another span / same span
                sp2 = sp if rng.random() < 0.5 else base_spans(u, (r + 1) % W)
                events.append({"event_id": f"u{u}-{r}b", "type": "update_committed",
                               "run_id": "r", "attempt": 0, "rank": r,
                               "time": at(u, rng.randrange(9)), "update": u,
                               "samples": rng.choice([B, B + 1]), "spans": sp2})
        if rng.random() < 0.5:  # an aggregate with some ranks again
            rs = sorted(rng.sample(range(W), rng.randrange(2, W)))
            events.append({"event_id": f"agg{u}", "type": "update_aggregate", "run_id": "r",
                           "attempt": 0, "rank": 0, "time": at(u, rng.randrange(9)), "update": u,
                           "ranks": [{"rank": q, "spans": base_spans(u, q), "samples": B}
                                     for q in rs]})
    body = events[1:]
    rng.shuffle(body)
    batches, i = [], 0
    while i < len(body):
        k = rng.randrange(1, 8)
        batches.append(body[i:i + k])
        i += k
    return events[:1], batches


def timeless(run):
    out, earliest = {}, {}
    for key, report in rank_reports(LedgerRow.objects.filter(run=run).order_by("pk")).items():
        out[key] = {k: (sorted(map(repr, v)) if k == "spans" else v)
                    for k, v in report.items() if k != "time"}
        earliest[key[:2]] = min(earliest.get(key[:2], report["time"]), report["time"])
    return out, earliest


def ingest_analysing(project, starts, batches, rng):
    """Ingest ``starts`` then each batch into ``project``, folded and joined, analysing the run
    after about 30 % of the batches (``rng``): the incremental path. Returns the run."""
    ingest_batch(project, starts)
    for batch in batches:
        ingest_batch(project, batch)
        if rng.random() < 0.3:
            analyze(Run.objects.get(project=project), now=NOW)
    return Run.objects.get(project=project)


@pytest.mark.django_db
@pytest.mark.parametrize("seed", range(16))
def test_folded_ingest_in_any_order_equals_unfolded_one_event_per_batch(seed):
    starts, batches = scenario(seed)
    got_run = ingest_analysing(Project.objects.create(name=f"g{seed}"), starts, batches,
                               random.Random(seed + 1000))
    mid_p = Project.objects.create(name=f"m{seed}")
    with nofold():
        ingest_batch(mid_p, starts)
        for b in batches:
            ingest_batch(mid_p, b)
    mid = analyze(Run.objects.get(project=mid_p), now=NOW).result
    want_p = Project.objects.create(name=f"w{seed}")
    with nofold():
        ingest_batch(want_p, starts)
        for b in batches:
            for ev in b:
                ingest_batch(want_p, [ev])
    want_run = Run.objects.get(project=want_p)
    want = analyze(want_run, now=NOW).result
    got = analyze(got_run, now=NOW).result
    bad = [k for k in want if got[k] != want[k]]
    badmid = [k for k in want if mid[k] != want[k]]
    assert not bad and not badmid, (bad, badmid)
    g, w = timeless(got_run), timeless(want_run)
    diff = {k: (g[0].get(k), w[0].get(k))
            for k in set(g[0]) | set(w[0]) if g[0].get(k) != w[0].get(k)}
    assert not diff
    assert g[1] == w[1]


@pytest.mark.django_db
def test_a_united_report_keeps_the_earliest_time_whichever_arrives_first():
    """A rank's re-send with an earlier clock (after the later one) moves the row's time back,
    as rank_reports and a joined row keep it: the stored time does not depend on arrival."""
    starts, _ = scenario(0)
    project = Project.objects.create(name="t")
    with nofold():
        ingest_batch(project, starts)
        first = {"event_id": "a", "type": "update_committed", "run_id": "r", "attempt": 0,
                 "rank": 3, "time": at(1, 9), "update": 1, "samples": B,
                 "spans": base_spans(1, 3)}
        ingest_batch(project, [first])
        ingest_batch(project, [dict(first, event_id="b", time=at(1, 2))])
        ingest_batch(project, [dict(first, event_id="c", time=at(1, 5), rank=4,
                                    spans=base_spans(1, 4)),
                               dict(first, event_id="d", time=at(1, 1), rank=4,
                                    spans=base_spans(1, 4))])
    rows = LedgerRow.objects.filter(run__project=project).order_by("rank")
    assert [(r.rank, r.time.microsecond) for r in rows] == [(3, 2000), (4, 1000)]


def as_wire(events):
    """``events`` with each update_aggregate as its parts' own update_committed events (each
    part is exactly that rank's report, docs/ingest-v1.md#update_aggregate): what the core's
    ``RunInput.from_events`` reads."""
    out = []
    for e in events:
        if e["type"] != "update_aggregate":
            out.append(e)
            continue
        out += [{"event_id": f"{e['event_id']}-{q['rank']}", "type": "update_committed",
                 "run_id": e["run_id"], "attempt": e["attempt"], "rank": q["rank"],
                 "time": e["time"], "update": e["update"], "samples": q["samples"],
                 "spans": q["spans"]} for q in e["ranks"]]
    return out


@pytest.mark.django_db
@pytest.mark.parametrize("seed", range(16, 32))
def test_folded_ingest_in_any_order_equals_the_core_fed_the_wire_events(seed):
    """The stored analysis of the fuzzed batches (folded, joined, analysed incrementally)
    equals the core's analysis of the same events read directly, field by field."""
    starts, batches = scenario(seed)
    run = ingest_analysing(Project.objects.create(name=f"c{seed}"), starts, batches,
                           random.Random(seed + 7))
    got = json.loads(json.dumps(analyze(run, now=NOW).result))
    wire = as_wire(starts + [e for b in batches for e in b])
    want = json.loads(json.dumps(core_analyze(RunInput.from_events(wire, {}), NOW).to_dict()))
    assert [k for k in want if got.get(k) != want[k]] == []
