"""The events' and the ledger rows' COPYs roll back to their own raw savepoints (taken in the
seq's round trip when the batch locks no run, never released) when they meet a stored key: a
batch re-sending stored events beside new ones, and new events re-reporting stored ledger keys,
store exactly what the same events store sent without the collisions (the events, each rank's
report in the ledger rows, the runs' counts), the events' COPY survives the ledger's rollback, a
batch holding a generation event (its runs locked first, its savepoint a statement of its own)
too, and a conflicting re-send is still the 409 with nothing stored."""

from __future__ import annotations

import pytest
from django.db import connection
from ingest_support import event, update

from recoverydash.ingest import actions
from recoverydash.ingest.actions import ingest_batch
from recoverydash.ingest.errors import Conflict
from recoverydash.runs.models import Event, LedgerRow, Project, Run, rank_reports

pytestmark = pytest.mark.django_db(transaction=True)


def _stored(project) -> tuple[list, list, list]:
    events = sorted((e.event_id, e.type, e.attempt, e.rank, e.time, e.content_hash,
                     repr(e.body)) for e in Event.objects.filter(run__project=project))
    # each rank's report, whatever the folding (a fold across batches depends on their order)
    reports = rank_reports(LedgerRow.objects.filter(run__project=project))
    ledger = sorted((key, report["time"], sorted(map(repr, report["spans"])), report["samples"],
                     report["tokens"]) for key, report in reports.items())
    runs = sorted((r.run_id, r.event_count, r.first_event_at, r.last_event_at, r.strata)
                  for r in Run.objects.filter(project=project))
    return events, ledger, runs


def _batches():
    first = [update(f"u{u}-{r}", u, rank=r, start=(u - 1) * 32 + r * 8) for u in (1, 2)
             for r in range(4)]
    again = first[::3] + [update(f"u3-{r}", 3, rank=r, start=64 + r * 8) for r in range(4)]
    # new event_ids re-reporting update 1's stored ledger key (ranks 0-3 folded) with other spans
    rekey = [update(f"re-{r}", 1, rank=r, start=900 + r * 8) for r in range(4)] \
        + [update("u4-0", 4, rank=0, start=96)]
    started = [event("checkpoint_started", "g1", generation_id="g-1", update=2,
                     required_shards=["s0"], components=["model"])]
    locked = started + first[1:3] + [update("u5-0", 5, rank=0, start=128)]
    return [first, again, rekey, locked]


def test_collisions_store_what_the_same_events_store_without_them(monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("the raw savepoints are PostgreSQL's COPY path")
    batches = _batches()
    colliding = Project.objects.create(name="colliding")
    rolled: list[str] = []
    real = actions._rollback_to
    monkeypatch.setattr(actions, "_rollback_to", lambda sp: (rolled.append(sp), real(sp)))
    answers = [ingest_batch(colliding, b).as_response() for b in batches]
    monkeypatch.setattr(actions, "_rollback_to", real)
    # both COPYs met stored keys, in the batch that locks no run and in the one that does
    assert rolled == [actions._EVENTS_SAVEPOINT, actions._LEDGER_SAVEPOINT,
                      actions._EVENTS_SAVEPOINT]
    assert answers == [{"accepted": 8, "duplicates": 0}, {"accepted": 4, "duplicates": 3},
                       {"accepted": 5, "duplicates": 0}, {"accepted": 2, "duplicates": 2}]
    # the same events, each once, one per batch: no stored key is ever met
    seen, plain = set(), Project.objects.create(name="plain")
    for b in batches:
        for ev in b:
            if ev["event_id"] not in seen:
                seen.add(ev["event_id"])
                ingest_batch(plain, [ev])
    assert _stored(colliding) == _stored(plain)
    events, ledger, _ = _stored(colliding)
    assert {"re-0", "re-3", "u4-0", "g1", "u5-0"} <= {e[0] for e in events}
    row = [(r.rank, r.ranks, r.rank_shift, r.spans) for r in
           LedgerRow.objects.filter(run__project=colliding, update=1)]
    assert row == [(0, 4, 8, [{"stratum": "main", "epoch": 0, "ranges": [[0, 8]]},
                              {"stratum": "main", "epoch": 0, "ranges": [[900, 908]]}])]


def test_a_conflicting_resend_is_the_409_and_stores_nothing():
    if connection.vendor != "postgresql":
        pytest.skip("the raw savepoints are PostgreSQL's COPY path")
    project = Project.objects.create(name="p")
    ingest_batch(project, [update("a", 1, rank=0)])
    before = _stored(project)
    with pytest.raises(Conflict):
        ingest_batch(project, [update("b", 2, rank=0), update("a", 1, rank=0, start=500)])
    assert _stored(project) == before
