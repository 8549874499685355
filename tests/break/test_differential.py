"""Differential tests of this session's incremental paths: random runs ingested in random batches
(per-rank ``update_committed``, ``update_aggregate``, heartbeats with cursors, re-sends,
attempts starting and ending, checkpoints), analysed between batches and at later times with
nothing new (the clock-only path), compared with a fresh rebuild (the Analysis row, its state,
clock basis and StateBlock rows deleted) of the same rows at the same time, and the stored run
and attempt counters compared with those of the same events ingested in one batch."""

from __future__ import annotations

import os
import random
import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import close_old_connections

from recoverydash.ingest.actions import ingest_batch
from recoverydash.runs import analysis as bridge
from recoverydash.runs.models import Analysis, Attempt, Project, Run, StateBlock

pytestmark = pytest.mark.django_db(transaction=True)

# more seeds for a longer hunt: BREAK_SEEDS=200 (the suite runs the default few)
_SEEDS = int(os.environ.get("BREAK_SEEDS", "8"))

T0 = datetime(2026, 11, 1, 0, 0, tzinfo=UTC)
WORLD, PER_RANK = 4, 2
GBS = WORLD * PER_RANK
_ATTEMPT_FIELDS = ("attempt", "last_event_at", "last_update", "last_update_at", "heartbeat_at",
                   "fetched", "sdk_losses", "started_at", "world_size", "ended_at")


def _iso(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat()


def _run_events(seed: int, run_id: str = "diff") -> list[dict]:
    """A run of 1-3 attempts of ``WORLD`` ranks, each resuming at a random earlier update
    (replays and skips), with a random rank missing now and then, aggregates, heartbeats,
    checkpoints every few updates and a short checkpoint age in the contract."""
    rng = random.Random(seed)
    out: list[dict] = []
    clock = 0.0
    committed_gen: list[tuple[str, int]] = []
    resume_at = 0
    for attempt in range(rng.randint(1, 3)):
        clock += rng.uniform(1, 30)
        resumed = None
        if attempt and committed_gen and rng.random() < 0.8:
            gid, gu = rng.choice(committed_gen)
            resumed = {"generation_id": gid, "update": gu,
                       "cursor": [{"stratum": "main", "epoch": 0,
                                   "position": gu * GBS + rng.choice([0, 0, -2, 3])}]}
            resume_at = gu
        else:
            resume_at = 0
        start = {"event_id": f"{run_id}-a{attempt}-start", "type": "attempt_started",
                 "run_id": run_id, "attempt": attempt, "time": _iso(clock),
                 "world_size": WORLD, "dataset_version": "ds", "global_batch_size": GBS,
                 "resumed_from": resumed,
                 "contract": {"max_checkpoint_age_s": rng.choice([120, 600, 3600])}}
        out.append(start)
        n_updates = rng.randint(3, 14)
        for u in range(resume_at + 1, resume_at + n_updates + 1):
            clock += rng.uniform(2, 20)
            base = (u - 1) * GBS
            if rng.random() < 0.3:
                parts = [{"rank": r, "samples": PER_RANK,
                          "spans": [{"stratum": "main", "epoch": 0,
                                     "ranges": [[base + r, base + GBS, WORLD]]}]}
                         for r in range(WORLD) if rng.random() > 0.05]
                if parts:
                    out.append({"event_id": f"{run_id}-a{attempt}-agg{u}",
                                "type": "update_aggregate", "run_id": run_id,
                                "attempt": attempt, "rank": 0, "time": _iso(clock),
                                "update": u, "ranks": parts})
            else:
                for r in range(WORLD):
                    if rng.random() < 0.05:
                        continue  # a rank's report lost
                    skew = rng.uniform(0, 0.5)
                    shift = rng.choice([0] * 12 + [1])  # now and then a rank off its share
                    out.append({"event_id": f"{run_id}-a{attempt}-u{u}-r{r}",
                                "type": "update_committed", "run_id": run_id,
                                "attempt": attempt, "rank": r, "update": u,
                                "time": _iso(clock + skew), "samples": PER_RANK,
                                "spans": [{"stratum": "main", "epoch": 0,
                                           "ranges": [[base + r + shift, base + GBS, WORLD]]}]})
            if rng.random() < 0.5:
                r = rng.randrange(WORLD)
                out.append({"event_id": f"{run_id}-a{attempt}-hb{u}-{r}", "type": "heartbeat",
                            "run_id": run_id, "attempt": attempt, "rank": r,
                            "time": _iso(clock + 1), "update": u,
                            "fetched": [{"stratum": "main", "epoch": 0,
                                         "position": u * GBS + rng.randrange(GBS)}]})
            if u % rng.choice([3, 4, 5]) == 0:
                gid = f"g-{attempt}-{u}"
                out.append({"event_id": f"{run_id}-{gid}", "type": "checkpoint_committed",
                            "run_id": run_id, "attempt": attempt, "rank": 0,
                            "time": _iso(clock + 2),
                            "manifest": {"schema_revision": 1, "generation_id": gid,
                                         "update": u, "world_size": WORLD,
                                         "required_shards": ["rank0"], "components": ["model"],
                                         "objects": [{"uri": f"mem://b/{gid}/m", "shard": "rank0",
                                                      "component": "model", "size": 10}],
                                         "data_progress": {"cursor": [
                                             {"stratum": "main", "epoch": 0,
                                              "position": u * GBS}]},
                                         "dataset_version": "ds",
                                         "committed_at": _iso(clock + 2)}})
                committed_gen.append((gid, u))
        if rng.random() < 0.6:
            clock += 3
            out.append({"event_id": f"{run_id}-a{attempt}-end", "type": "attempt_ended",
                        "run_id": run_id, "attempt": attempt, "time": _iso(clock),
                        "reason": rng.choice(["failed", "preempted", "completed"]),
                        "update": resume_at + n_updates})
    return out


def _batches(rng: random.Random, events: list[dict]) -> list[list[dict]]:
    """``events`` in random batches, in a locally shuffled order, with re-sends of random
    earlier events (the same content) mixed in."""
    shuffled = list(events)
    for i in range(len(shuffled) - 1):
        if rng.random() < 0.3:
            j = min(len(shuffled) - 1, i + rng.randint(1, 6))
            shuffled[i], shuffled[j] = shuffled[j], shuffled[i]
    batches, i = [], 0
    while i < len(shuffled):
        n = rng.choice([1, 3, 7, 20, 60])
        batch = shuffled[i:i + n]
        if i and rng.random() < 0.3:
            batch = batch + rng.sample(shuffled[:i], min(i, rng.randint(1, 4)))
        batches.append(batch)
        i += n
    return batches


def _without_duplicate_ids(batch: list[dict]) -> list[dict]:
    seen, out = set(), []
    for e in batch:
        if e["event_id"] not in seen:
            seen.add(e["event_id"])
            out.append(e)
    return out


def _counters(run: Run, skip: tuple = ()) -> dict:
    run.refresh_from_db()
    fields = [f for f in _ATTEMPT_FIELDS if f not in skip]
    attempts = list(Attempt.objects.filter(run=run).order_by("attempt").values(*fields))
    return {"event_count": run.event_count, "first_event_at": run.first_event_at,
            "last_event_at": run.last_event_at, "strata": run.strata, "contract": run.contract,
            "attempts": attempts}


def _rebuilt_result(run: Run, now: float) -> dict:
    """A fresh full analysis of every row at ``now``: the row, with its state, clock basis and
    blocks, deleted first (restored afterwards is not needed: callers rebuild a twin run)."""
    Analysis.objects.filter(run=run).delete()
    assert not StateBlock.objects.filter(analysis__run=run).exists()
    return bridge.analyze(run, now=now).result


def _end(events: list[dict]) -> float:
    return max(datetime.fromisoformat(e["time"]).timestamp() for e in events)


@pytest.mark.parametrize("seed", range(_SEEDS))
def test_incremental_and_clock_only_analyses_equal_a_rebuild(seed, settings):
    settings.RECOVERYDASH_SETTLE_S = 30.0
    rng = random.Random(1000 + seed)
    events = _run_events(seed)
    inc, ref = Project.objects.create(name="inc"), Project.objects.create(name="ref")
    batches = _batches(rng, events)
    end = _end(events)
    now = datetime.fromisoformat(events[0]["time"]).timestamp()
    for k, batch in enumerate(batches):
        batch = _without_duplicate_ids(batch)
        ingest_batch(inc, batch)
        ingest_batch(ref, batch)
        if rng.random() < 0.5 or k == len(batches) - 1:
            now = max(now, datetime.fromisoformat(max(e["time"] for e in batch)).timestamp())
            now += rng.choice([0.0, 5.0, 29.0, 31.0, 200.0])
            run_inc = Run.objects.get(project=inc)
            got = bridge.analyze(run_inc, now=now).result
            want = _rebuilt_result(Run.objects.get(project=ref), now)
            assert got == want, (k, now)
    # nothing new, later and later: the clock-only path (or a full one when an update settles
    # by age / a generation ages past the contract) equals a rebuild at each time
    run_inc, run_ref = Run.objects.get(project=inc), Run.objects.get(project=ref)
    for later in (1.0, 29.0, 30.0, 31.0, 119.0, 121.0, 599.0, 601.0, 3599.0, 3601.0, 86400.0,
                  40 * 86400.0):
        at = max(now, end) + later
        got = bridge.analyze(run_inc, now=at)
        assert got.result == _rebuilt_result(run_ref, at), later
        assert got.health == Analysis.objects.get(run=run_ref).health


@pytest.mark.parametrize("seed", range(max(1, _SEEDS // 2)))
def test_counters_of_random_batches_equal_one_batch(seed):
    """The run and attempt rows written batch by batch through the raw end (re-sends included)
    equal those of the same events, in the same order of arrival, in one batch."""
    rng = random.Random(2000 + seed)
    events = _run_events(seed + 50)
    many, one = Project.objects.create(name="many"), Project.objects.create(name="one")
    batches = _batches(rng, events)
    for batch in batches:
        ingest_batch(many, _without_duplicate_ids(batch))
    ingest_batch(one, _without_duplicate_ids([e for b in batches for e in b]))
    assert _counters(Run.objects.get(project=many)) == _counters(Run.objects.get(project=one))


@pytest.mark.parametrize("seed", range(max(1, _SEEDS // 3)))
def test_two_threads_into_one_run_equal_one_batch(seed, settings):
    """Two threads post the run's updates and heartbeats (each its own connection) at once,
    analyses running beside them: counters and the analysis equal one batch's and a rebuild."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("concurrent batches need PostgreSQL")
    settings.RECOVERYDASH_SETTLE_S = 30.0
    random.Random(3000 + seed)
    events = _run_events(seed + 100)
    starts = [e for e in events if e["type"] in ("attempt_started", "checkpoint_committed")]
    rest = [e for e in events if e not in starts]
    conc, one = Project.objects.create(name="conc"), Project.objects.create(name="one")
    ingest_batch(conc, starts)
    halves = [rest[0::2], rest[1::2]]
    errors: list = []
    run_pk = Run.objects.get(project=conc).pk

    def post(part):
        try:
            for batch in _batches(random.Random(len(part)), part):
                ingest_batch(conc, _without_duplicate_ids(batch))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            close_old_connections()
            connection.close()

    def analyse():
        try:
            for _ in range(5):
                bridge.analyze(Run.objects.get(pk=run_pk), now=_end(events) + 10)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=post, args=(h,)) for h in halves]
    threads.append(threading.Thread(target=analyse))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    ingest_batch(one, events)
    # last_update_at is the earliest report of the highest update: the same in any order
    assert _counters(Run.objects.get(project=conc)) == _counters(Run.objects.get(project=one))
    at = _end(events) + 45
    got = bridge.analyze(Run.objects.get(project=conc), now=at).result
    assert got == _rebuilt_result(Run.objects.get(project=one), at)


def test_one_event_id_with_two_contents_at_once_stores_one(settings):
    """Two threads send the same event_id with different content at the same moment, many
    times: one is stored and the other refused (409), never both, and the run's counters count
    what is stored."""
    from django.db import connection

    from recoverydash.ingest.errors import Conflict
    from recoverydash.runs.models import Event

    if connection.vendor != "postgresql":
        pytest.skip("concurrent batches need PostgreSQL")
    project = Project.objects.create(name="race")
    ingest_batch(project, [_run_events(0)[0]])
    outcomes: list = []

    def send(i, rank, barrier):
        try:
            barrier.wait(5)
            ingest_batch(project, [{"event_id": f"race-{i}", "type": "update_committed",
                                    "run_id": "diff", "attempt": 0, "rank": rank,
                                    "update": i + 1, "time": _iso(10 + i),
                                    "spans": [{"stratum": "main", "epoch": 0,
                                               "ranges": [[rank, rank + 1]]}]}])
            outcomes.append((i, rank, "stored"))
        except Conflict:
            outcomes.append((i, rank, "409"))
        except Exception as exc:  # noqa: BLE001
            outcomes.append((i, rank, repr(exc)))
        finally:
            connection.close()

    for i in range(15):
        barrier = threading.Barrier(2)
        threads = [threading.Thread(target=send, args=(i, r, barrier)) for r in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    by_event: dict = {}
    for i, _rank, what in outcomes:
        by_event.setdefault(i, []).append(what)
    assert all(sorted(v) == ["409", "stored"] for v in by_event.values()), by_event
    run = Run.objects.get(project=project)
    assert Event.objects.filter(run=run).count() == 16 == run.event_count


def _hostile_ledger(seed: int, run_id: str = "fold") -> list[dict]:
    """A run whose ledger reports take every shape the fold sees: per-rank strided spans
    (``[base + r, base + gbs, world]``), aggregates of some ranks, the same rank of an update
    reported per rank and in an aggregate, a report sent again under another event_id,
    shares moved by one (overlapping a neighbour) or cut short (a gap), two strata and another
    epoch, random times within an update."""
    rng = random.Random(seed)
    world = rng.choice([2, 3, 4, 8])
    per = rng.choice([1, 2, 3])
    gbs = world * per
    out: list[dict] = [{"event_id": f"{run_id}-start", "type": "attempt_started",
                        "run_id": run_id, "attempt": 0, "time": _iso(0), "world_size": world,
                        "dataset_version": "ds", "global_batch_size": gbs}]
    n = 0

    def span(u: int, r: int, stratum: str = "main") -> dict:
        base = (u - 1) * gbs
        start = base + r + rng.choice([0] * 10 + [world, -1 if r else 0, 1])
        stop = base + gbs - rng.choice([0] * 10 + [world])
        return {"stratum": stratum, "epoch": rng.choice([0] * 9 + [1]),
                "ranges": [[max(start, 0), max(stop, start + 1), world]]}

    for u in range(1, rng.randint(4, 12)):
        clock = u * 10.0
        ranks = [r for r in range(world) if rng.random() > 0.1]
        strata = ["main"] if rng.random() < 0.8 else ["main", "aux"]
        reports = {r: [span(u, r, s) for s in strata] for r in ranks}
        in_agg = {r for r in ranks if rng.random() < 0.4}
        if in_agg:
            n += 1
            out.append({"event_id": f"{run_id}-agg{n}", "type": "update_aggregate",
                        "run_id": run_id, "attempt": 0, "rank": 0,
                        "time": _iso(clock + rng.choice([0, 0.5])), "update": u,
                        "ranks": [{"rank": r, "samples": per, "spans": reports[r]}
                                  for r in sorted(in_agg)]})
        for r in ranks:
            if r in in_agg and rng.random() < 0.7:
                continue
            for _ in range(rng.choice([1, 1, 1, 2])):  # now and then sent twice, two ids
                n += 1
                out.append({"event_id": f"{run_id}-u{n}", "type": "update_committed",
                            "run_id": run_id, "attempt": 0, "rank": r, "update": u,
                            "time": _iso(clock + rng.choice([0, 0, 0.25])), "samples": per,
                            "spans": reports[r]})
    return out


def _rank_reports(run: Run) -> dict:
    from recoverydash.runs.models import LedgerRow

    out: dict = {}
    for row in LedgerRow.objects.filter(run=run):
        for rank, spans in row.parts():
            key = (row.attempt, row.update, rank)
            for sp in spans:
                if sp not in out.setdefault(key, []):
                    out[key].append(sp)
    return {k: sorted(v, key=repr) for k, v in out.items()}


@pytest.mark.parametrize("seed", range(_SEEDS))
def test_ledger_of_random_batches_equals_one_event_at_a_time(seed):
    """The ledger's fold (within a batch, across batches, uniting re-sent and doubly reported
    ranks): a run's events in random batches, shuffled, with re-sends, give back every rank's
    reports and the analysis of the same events ingested one at a time, in order."""
    rng = random.Random(1000 + seed)
    events = _hostile_ledger(seed)
    one = Project.objects.create(name=f"one-{seed}")
    many = Project.objects.create(name=f"many-{seed}")
    for ev in events:
        ingest_batch(one, [ev])
    for batch in _batches(rng, events):
        ingest_batch(many, _without_duplicate_ids(batch))
    run_one = Run.objects.get(project=one)
    run_many = Run.objects.get(project=many)
    assert _rank_reports(run_many) == _rank_reports(run_one)
    now = _end(events) + 30
    got = bridge.analyze(run_many, now=now).result
    want = bridge.analyze(run_one, now=now).result
    assert got == want
    assert _rebuilt_result(run_many, now) == want


def _generation_events(seed: int, run_id: str = "gens") -> list[dict]:
    """One attempt's updates and many checkpoints: object digests drawn from a small pool (model
    and optimizer states repeating an older generation's), generation ids committed twice (the
    same manifest, or a conflicting one), generations committed out of update order, shards
    reported before and after the manifest."""
    rng = random.Random(seed)
    out: list[dict] = [{"event_id": f"{run_id}-start", "type": "attempt_started",
                        "run_id": run_id, "attempt": 0, "time": _iso(0), "world_size": WORLD,
                        "dataset_version": "ds", "global_batch_size": GBS,
                        "contract": {"max_checkpoint_age_s": 3600}}]
    n_updates = rng.randint(4, 16)
    for u in range(1, n_updates + 1):
        base = (u - 1) * GBS
        out.append({"event_id": f"{run_id}-agg{u}", "type": "update_aggregate",
                    "run_id": run_id, "attempt": 0, "rank": 0, "time": _iso(u * 10),
                    "update": u, "ranks": [{"rank": r, "samples": PER_RANK,
                                            "spans": [{"stratum": "main", "epoch": 0,
                                                       "ranges": [[base + r, base + GBS,
                                                                   WORLD]]}]}
                                           for r in range(WORLD)]})
    pool = [f"{i:064x}" for i in range(1, 5)]
    gens = []
    for k in range(rng.randint(2, 8)):
        u = rng.randint(1, n_updates)
        gid = rng.choice([f"g{k}", f"g{k}", f"g{max(0, k - 1)}"])  # now and then an id again
        objects = [{"uri": f"mem://b/{gid}/{c}", "shard": "rank0", "component": c, "size": 10,
                    "sha256": rng.choice(pool)} for c in ("model", "optimizer")]
        manifest = {"schema_revision": 1, "generation_id": gid, "update": u,
                    "world_size": WORLD, "required_shards": ["rank0"],
                    "components": ["model", "optimizer"], "objects": objects,
                    "data_progress": {"cursor": [{"stratum": "main", "epoch": 0,
                                                  "position": u * GBS}]},
                    "dataset_version": "ds", "committed_at": _iso(u * 10 + 5)}
        if rng.random() < 0.3:
            out.append({"event_id": f"{run_id}-sw{k}", "type": "shard_written",
                        "run_id": run_id, "attempt": 0, "rank": 0, "time": _iso(u * 10 + 4),
                        "generation_id": gid, "shard": "rank0", "update": u,
                        "objects": objects})
        gens.append({"event_id": f"{run_id}-c{k}", "type": "checkpoint_committed",
                     "run_id": run_id, "attempt": 0, "rank": 0, "time": _iso(u * 10 + 5),
                     "manifest": manifest})
    rng.shuffle(gens)  # committed out of update order
    for g in gens:
        out.insert(rng.randint(1, len(out)), g)
    return out


@pytest.mark.parametrize("seed", range(_SEEDS))
def test_generations_judged_incrementally_equal_a_rebuild(seed, settings):
    """Analysis inputs format 4 (a light entry per generation, InputChunk/InputDigest rows, the
    state-digest comparison continued): random generations (repeated digests, ids committed
    again with the same or another manifest, out of update order) analysed after random
    batches equal a fresh full analysis of the same rows at the same time."""
    settings.RECOVERYDASH_SETTLE_S = 30.0
    rng = random.Random(2000 + seed)
    events = _generation_events(seed)
    inc, ref = Project.objects.create(name="ginc"), Project.objects.create(name="gref")
    now = 0.0
    for k, batch in enumerate(_batches(rng, events)):
        batch = _without_duplicate_ids(batch)
        try:
            ingest_batch(inc, batch)
        except Exception as exc:  # noqa: BLE001 - a conflicting manifest refused: both alike
            with pytest.raises(type(exc)):
                ingest_batch(ref, batch)
            continue
        ingest_batch(ref, batch)
        now = max(now, max(datetime.fromisoformat(e["time"]).timestamp() for e in batch)) + 1
        got = bridge.analyze(Run.objects.get(project=inc), now=now).result
        assert got == _rebuilt_result(Run.objects.get(project=ref), now), k
