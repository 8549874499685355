"""The end of a batch of updates, heartbeats and audit windows in raw statements
(``ingest.actions._finish_hot``, PostgreSQL) writes the run and attempt rows the ORM path
(``_finish_runs``' general branch) writes for the same batches: field by field, on randomised
batches with cursors, SDK losses, ties of the last update, out-of-order times, several
attempts, strata first seen in later batches, and a stratum changing its kind (the same 400,
nothing stored)."""

from __future__ import annotations

import random

import pytest
from ingest_support import event, update

from recoverydash.ingest import actions
from recoverydash.ingest.errors import BadRequest
from recoverydash.runs.models import Attempt, Project, RankSeen, Run

pytestmark = pytest.mark.django_db(transaction=True)

_ATTEMPT_FIELDS = ("attempt", "last_event_at", "last_update", "last_update_at", "heartbeat_at",
                   "fetched", "sdk_losses", "started_at", "world_size", "ended_at")
_RUN_FIELDS = ("run_id", "event_count", "first_event_at", "last_event_at", "ingest_seq",
               "strata", "contract")


def _postgres_only() -> None:
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("the raw end of a batch is PostgreSQL's (SQLite takes the ORM path)")


def _time(rng: random.Random) -> str:
    minute, second, ms = rng.randrange(60), rng.randrange(60), rng.randrange(1000)
    return f"2026-11-01T00:{minute:02d}:{second:02d}.{ms:03d}Z"


def _batches(seed: int) -> list[list[dict]]:
    rng = random.Random(seed)
    events: list[dict] = []
    for i in range(160):
        attempt = rng.choice([0, 0, 0, 1])
        rank = rng.randrange(4)
        kind = rng.random()
        if kind < 0.55:
            u = rng.randrange(1, 12)  # repeats: ties of the highest update within a batch
            stratum = rng.choice(["main", "main", "aux"])
            events.append(update(f"u{i}", u, rank=rank, attempt=attempt, time=_time(rng),
                                 spans=[{"stratum": stratum, "epoch": 0,
                                         "ranges": [[8 * u + rank, 8 * u + rank + 1]]}]))
        elif kind < 0.85:
            extra = {}
            if rng.random() < 0.7:
                extra["fetched"] = [{"stratum": rng.choice(["main", "aux", "zeta"]),
                                     "epoch": rng.randrange(2), "position": rng.randrange(500)}
                                    for _ in range(rng.randrange(1, 3))]
            if rng.random() < 0.3:
                lo = rng.randrange(50)
                extra.update(sdk_dropped=rng.randrange(9), sdk_quarantined=rng.randrange(3),
                             sdk_lost_updates=[lo, lo + rng.randrange(5)])
            events.append(event("heartbeat", f"h{i}", attempt=attempt, time=_time(rng),
                                rank=rng.choice([rank, None]) if "sdk_dropped" not in extra
                                else rank, update=rng.randrange(12), **extra))
        else:
            events.append(event("audit_window", f"a{i}", attempt=attempt, time=_time(rng),
                                update=rng.randrange(1, 12), rank=rank, accum_slot=0,
                                sample_ids=[i]))
    batches, i = [], 0
    while i < len(events):
        n = rng.choice([1, 2, 5, 17, 40])
        batches.append(events[i:i + n])
        i += n
    return batches


def _state(project: Project) -> dict:
    run = Run.objects.get(project=project)
    attempts = list(Attempt.objects.filter(run=run).order_by("attempt").values(*_ATTEMPT_FIELDS))
    seen = sorted(RankSeen.objects.filter(attempt__run=run).values_list("attempt__attempt",
                                                                        "reporter"))
    return {"run": {f: getattr(run, f) for f in _RUN_FIELDS if f != "ingest_seq"},
            "attempts": attempts, "seen": seen}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_it_writes_what_the_orm_path_writes(monkeypatch, seed):
    _postgres_only()
    hot, orm = Project.objects.create(name="hot"), Project.objects.create(name="orm")
    batches = _batches(seed)
    for batch in batches:
        actions.ingest_batch(hot, batch)
    with monkeypatch.context() as m:
        m.setattr(actions, "_HOT_TYPES", frozenset())  # every batch takes the ORM's end
        for batch in batches:
            actions.ingest_batch(orm, batch)
    got, want = _state(hot), _state(orm)
    assert got == want
    assert got["run"]["event_count"] == sum(len(b) for b in batches)
    assert got["run"]["strata"] == {"main": "ranges", "aux": "ranges"}


def test_a_stratum_changing_kind_is_refused_at_the_end_and_nothing_is_stored(monkeypatch):
    """The check against the run's record at the start passes (the stratum is new then); a
    batch committed meanwhile records it with the other kind: the raw end refuses the batch
    with the span named, as the ORM end does."""
    _postgres_only()
    project = Project.objects.create(name="kinds")
    actions.ingest_batch(project, [update("first", 1, rank=0)])
    run = Run.objects.get(project=project)
    ids = {"stratum": "late", "epoch": 0, "ids": ["a", "b"]}
    ranges = {"stratum": "late", "epoch": 0, "ranges": [[0, 4]]}
    real = actions._read_runs

    def stale_read(project_, run_ids):  # the run as read before the other batch committed
        out = real(project_, run_ids)
        for r in out.values():
            r.strata = {k: v for k, v in r.strata.items() if k != "late"}
        return out

    actions.ingest_batch(project, [update("other", 2, rank=1, spans=[ids])])
    monkeypatch.setattr(actions, "_read_runs", stale_read)
    with pytest.raises(BadRequest) as refused:
        actions.ingest_batch(project, [update("mine", 3, rank=2, spans=[ranges])])
    item = refused.value.items[0]
    assert (item.index, item.path) == (0, "events[0].spans[0].ranges")
    assert item.message == ("expected ids for stratum 'late', which uses ids in run 'run-1', "
                            "got ranges")
    run.refresh_from_db()
    assert run.event_count == 2 and run.strata == {"main": "ranges", "late": "ids"}
    assert not run.events.filter(event_id="mine").exists()
