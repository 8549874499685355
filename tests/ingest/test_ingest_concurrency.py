"""Batches into one run from several connections at once (recoverydash.runs.seq): no run-row
lock for the whole transaction, yet no row is lost or absorbed out of order, and the analysis of
the run equals that of the same events ingested one batch after another."""

from __future__ import annotations

import random
import threading
import time
from datetime import UTC

import pytest
from django.db import connection, connections
from ingest_support import event, strided_batch

from recoverydash.ingest.actions import ingest_batch
from recoverydash.runs import seq as seq_of
from recoverydash.runs.analysis import analyze
from recoverydash.runs.models import Attempt, Event, Heartbeat, LedgerRow, Project, Run

pytestmark = [pytest.mark.django_db(transaction=True)]

NOW = 1_793_500_000.0  # a fixed clock for both analyses (2026-11)
WORLD = 8


def _postgres_only():
    if connection.vendor != "postgresql":
        pytest.skip("concurrent batches into one run need PostgreSQL (SQLite has one writer)")


def _events(run_id: str, updates: int) -> list[dict]:
    """An attempt of WORLD ranks: its start, ``updates`` updates of strided spans per rank, a
    heartbeat per rank every 5 updates and a checkpoint's start at update 10."""
    out = [event("attempt_started", "start", run_id, world_size=WORLD, global_batch_size=WORLD * 8,
                 micro_batch_size=8, grad_accum_steps=1, dataset_version="d1")]
    out += strided_batch(run_id, 1, updates * WORLD, world=WORLD)
    for u in range(5, updates + 1, 5):
        for r in range(WORLD):
            out.append(event("heartbeat", f"hb-{u}-{r}", run_id, rank=r, update=u,
                             time=f"2026-11-01T00:{u // 60:02d}:{u % 60:02d}Z",
                             fetched=[{"stratum": "main", "epoch": 0, "position": u * WORLD * 8}]))
    out.append(event("checkpoint_started", "cs-10", run_id, generation_id="g10", update=10,
                     required_shards=["0"], components=["model"]))
    return out


def _post_all(project: Project, batches: list[list[dict]], threads: int,
              monkeypatch) -> tuple[list[BaseException], dict[int, int]]:
    """Ingest ``batches`` from ``threads`` threads (one database connection each), interleaved:
    thread i takes batches i, i + threads, ... Returns the errors raised and the seq each batch
    that stored something was stored at (by index into ``batches``)."""
    errors: list[BaseException] = []
    start = threading.Barrier(threads)
    taken = threading.local()
    seqs: dict[int, int] = {}
    take = seq_of.take_seq

    def recording_take(run_pks, then=None):
        taken.seq = take(run_pks, then=then)
        return taken.seq

    monkeypatch.setattr(seq_of, "take_seq", recording_take)

    def work(mine: list[int]) -> None:
        try:
            start.wait()
            for index in mine:
                if ingest_batch(project, batches[index]).accepted:
                    seqs[index] = taken.seq
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.append(exc)
        finally:
            connections.close_all()

    workers = [threading.Thread(target=work, args=(list(range(i, len(batches), threads)),))
               for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    return errors, seqs


def _comparable(run: Run) -> dict:
    """What the analysis says about the run and the rows it was built from, without the
    database's own identities (pks, seqs, times of receipt)."""
    result = analyze(run, now=NOW).result
    ledger = sorted(LedgerRow.objects.filter(run=run).values_list(
        "attempt", "update", "rank", "spans", "samples"))
    beats = sorted(Heartbeat.objects.filter(run=run).values_list("attempt", "rank", "update"))
    attempts = list(Attempt.objects.filter(run=run).order_by("attempt").values(
        "attempt", "last_update", "last_update_at", "heartbeat_at", "fetched", "world_size",
        "last_event_at"))
    run.refresh_from_db()
    return {"result": result, "ledger": ledger, "beats": beats, "attempts": attempts,
            "events": run.event_count, "first": run.first_event_at, "last": run.last_event_at,
            "strata": run.strata}


def test_it_gives_concurrent_batches_the_analysis_of_serial_ones(monkeypatch):
    """4 threads post interleaved batches into one run while an analysis runs over and over;
    the final analysis (incremental: it continued the state of those taken during ingest) and
    every row equal those of the same batches posted one by one into another project's run."""
    _postgres_only()
    concurrent = Project.objects.create(name="concurrent")
    serial = Project.objects.create(name="serial")
    events = _events("run-c", 60)
    rng = random.Random(7)
    rng.shuffle(events)
    sizes, batches, i = [1, 3, 40, 7, 120, 2], [], 0
    while i < len(events):
        n = sizes[len(batches) % len(sizes)]
        batches.append(events[i:i + n])
        i += n
    # a few batches repeat events of others (an SDK resending after a timeout): duplicates
    batches += [events[10:30], events[200:205]]

    stop = threading.Event()
    analyses: list[int] = []

    def analyse_meanwhile() -> None:
        try:
            while not stop.is_set():
                run = Run.objects.filter(project=concurrent).first()
                if run is not None:
                    analyze(run, now=NOW)
                    analyses.append(run.pk)
                time.sleep(0.01)
        finally:
            connections.close_all()

    watcher = threading.Thread(target=analyse_meanwhile)
    watcher.start()
    try:
        errors, seqs = _post_all(concurrent, batches, 4, monkeypatch)
    finally:
        stop.set()
        watcher.join(60)
    assert errors == []
    assert analyses, "the analysis ran during ingest"
    # the serial replay: the batches that stored something, one by one, in the order of their
    # seqs (the order in which the concurrent run received them: heartbeats fold in that order)
    assert len(set(seqs.values())) == len(seqs)
    for index in sorted(seqs, key=seqs.get):
        ingest_batch(serial, batches[index])

    a = Run.objects.get(project=concurrent)
    b = Run.objects.get(project=serial)
    assert Event.objects.filter(run=a).count() == len(events) == a.event_count
    got, want = _comparable(a), _comparable(b)
    for key in want:
        assert got[key] == want[key], key
    # no row lost: every rank of every update is in the ledger
    assert LedgerRow.objects.filter(run=a).count() == 60 * WORLD


class _HalfwayBatch:
    """Batch A of ``project`` in a thread of its own, stopped half-way through its transaction
    (seq taken, events written, ledger rows not yet) until :meth:`finish`."""

    def __init__(self, project: Project, events: list[dict], monkeypatch):
        from recoverydash.ingest import actions

        self.halfway, self.release = threading.Event(), threading.Event()
        self.errors: list[BaseException] = []
        flush = actions._Projection.flush
        me = self

        def pausing_flush(projection):
            if threading.current_thread().name == "batch-a":
                me.halfway.set()
                me.release.wait(30)
            flush(projection)

        monkeypatch.setattr(actions._Projection, "flush", pausing_flush)

        def run() -> None:
            try:
                ingest_batch(project, events)
            except BaseException as exc:  # noqa: BLE001 - reported to the test
                self.errors.append(exc)
            finally:
                connections.close_all()

        self.thread = threading.Thread(target=run, name="batch-a")
        self.thread.start()
        assert self.halfway.wait(30)

    def finish(self) -> None:
        self.release.set()
        self.thread.join(30)
        assert self.errors == []


def test_it_never_counts_a_batch_in_flight_as_committed(monkeypatch):
    """Batch A takes its seq and is still writing; batch B of the same run takes a higher seq
    and commits. committed_seq waits for A (answering B's seq alone would let the worker skip
    A's rows forever), then answers a seq covering both."""
    _postgres_only()
    project = Project.objects.create(name="p")
    ingest_batch(project, strided_batch("run-1", 1, 1, world=1, prefix="first"))
    run = Run.objects.get()
    before = seq_of.committed_seq(run.pk)
    a = _HalfwayBatch(project, strided_batch("run-1", 2, 1, world=1, prefix="a"), monkeypatch)
    answers: dict[str, int] = {}

    def ask() -> None:
        try:
            answers["committed"] = seq_of.committed_seq(run.pk)
        finally:
            connections.close_all()

    try:
        ingest_batch(project, strided_batch("run-1", 3, 1, world=1, prefix="b"))
        b_seq = Event.objects.get(event_id="b-3-0").batch_seq
        assert Event.objects.filter(event_id="a-2-0").count() == 0  # A: not committed
        assert Run.objects.get().ingest_seq == b_seq > before
        asker = threading.Thread(target=ask)
        asker.start()
        asker.join(0.5)
        assert asker.is_alive(), "committed_seq answered while batch A was in flight"
    finally:
        a.finish()
    asker.join(30)
    a_seq = Event.objects.get(event_id="a-2-0").batch_seq
    assert before < a_seq < b_seq
    assert answers["committed"] == b_seq == Run.objects.get().ingest_seq
    # A's rows are at or below the answer: the worker absorbs them
    assert LedgerRow.objects.filter(run=run, last_seq__gt=answers["committed"]).count() == 0
    assert LedgerRow.objects.filter(run=run).count() == 3


def test_it_lets_batches_of_one_run_overlap(monkeypatch):
    """Batch A stops half-way (its events written, its ledger rows not yet): batch B of the same
    run is stored and committed meanwhile, as the run row is locked only for the last few
    statements of a batch; then A finishes and both are there."""
    _postgres_only()
    project = Project.objects.create(name="p")
    ingest_batch(project, strided_batch("run-1", 1, 1, world=1, prefix="first"))
    a = _HalfwayBatch(project, strided_batch("run-1", 2, 4, world=4, prefix="a"), monkeypatch)
    try:
        started = time.monotonic()
        ingest_batch(project, strided_batch("run-1", 3, 4, world=4, prefix="b"))
        took = time.monotonic() - started
        assert LedgerRow.objects.filter(update=3).count() == 4  # B committed while A is open
        assert LedgerRow.objects.filter(update=2).count() == 0
    finally:
        a.finish()
    assert took < 5
    assert LedgerRow.objects.count() == 9 and Run.objects.get().event_count == 9


def test_per_rank_batches_folding_across_batches_concurrently_keep_every_report(monkeypatch):
    """Ranks' own batches of one update fold into stored rows while 4 threads post them
    (rows another batch holds are skipped, never waited for): every rank's report, the earliest
    time per update and the analysis equal those of the same batches stored unfolded, one row
    per rank-update."""
    from unittest import mock

    from recoverydash.ingest.actions import _Projection
    from recoverydash.runs.models import rank_reports

    _postgres_only()
    world, per, updates = 16, 2, 30
    start = event("attempt_started", "start", "run-f", world_size=world,
                  global_batch_size=world * per, dataset_version="d1")

    def own(u, r):
        base = (u - 1) * world * per
        return {"event_id": f"f-{u}-{r}", "type": "update_committed", "run_id": "run-f",
                "attempt": 0, "rank": r, "update": u, "samples": per,
                "time": f"2026-11-01T00:00:{u:02d}.{1 + r % 9:03d}Z",
                "spans": [{"stratum": "main", "epoch": 0,
                           "ranges": [[base + r, base + r + world * per, world]]}]}

    batches = [[own(u, r) for u in range(lo, lo + 10)] for r in range(world)
               for lo in (1, 11, 21)]
    random.Random(3).shuffle(batches)
    folded, plain = Project.objects.create(name="folded"), Project.objects.create(name="plain")
    ingest_batch(folded, [start])
    errors, _ = _post_all(folded, batches, 4, monkeypatch)
    assert errors == []
    with mock.patch.object(_Projection, "_join_stored", lambda self, pending: pending):
        ingest_batch(plain, [start])
        for batch in batches:
            ingest_batch(plain, batch)

    def reports(run):
        out, earliest = {}, {}
        for key, report in rank_reports(LedgerRow.objects.filter(run=run)).items():
            out[key] = (report["spans"], report["samples"], report["tokens"])
            earliest[key[:2]] = min(earliest.get(key[:2], report["time"]), report["time"])
        return out, earliest

    a, b = Run.objects.get(project=folded), Run.objects.get(project=plain)
    assert LedgerRow.objects.filter(run=b).count() == world * updates
    assert LedgerRow.objects.filter(run=a).count() < world * updates
    assert reports(a) == reports(b)
    assert len(reports(a)[0]) == world * updates
    assert analyze(a, now=NOW).result == analyze(b, now=NOW).result


def test_an_attempts_last_update_time_is_its_earliest_report_in_any_order():
    """Two ranks report the attempt's highest update at 00:00:01 and 00:00:09: the attempt's
    ``last_update_at`` is 00:00:01 (docs/definitions.md: the commit time of an update is the
    earliest time reported for it) whichever report arrives first; a higher update moves it."""
    from datetime import datetime

    def report(eid, rank, update, time):
        return {"event_id": eid, "type": "update_committed", "run_id": "r", "attempt": 0,
                "rank": rank, "update": update, "time": time,
                "spans": [{"stratum": "main", "epoch": 0, "ranges": [[rank, rank + 1]]}]}

    early = report("a", 0, 1, "2026-11-01T00:00:01Z")
    late = report("b", 1, 1, "2026-11-01T00:00:09Z")
    first, second = Project.objects.create(name="p1"), Project.objects.create(name="p2")
    for project, order in ((first, (early, late)), (second, (late, early))):
        for ev in order:
            ingest_batch(project, [ev])
    t1 = datetime(2026, 11, 1, 0, 0, 1, tzinfo=UTC)
    assert [Attempt.objects.get(run__project=p).last_update_at for p in (first, second)] \
        == [t1, t1]
    ingest_batch(first, [report("c", 0, 2, "2026-11-01T00:00:05Z")])
    got = Attempt.objects.get(run__project=first)
    assert (got.last_update, got.last_update_at) == (2, datetime(2026, 11, 1, 0, 0, 5,
                                                                 tzinfo=UTC))
