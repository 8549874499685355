"""The SDK's update_aggregate (docs/ingest-v1.md#update_aggregate): every rank's
CountingRecorder.commit_part handed to one reporter's Client.update_aggregate gives the server
the analysis of each rank sending its own update_committed."""

from __future__ import annotations

import pytest

pytest.importorskip("django")

from recoverydash.sdk.client import Client  # noqa: E402
from recoverydash.sdk.ledger import CountingRecorder  # noqa: E402

pytestmark = pytest.mark.django_db

W, N, PER_RANK_BATCH = 4, 64, 2
NOW = 1_793_500_000.0


def _client(ingest, spool, rank):
    return Client(ingest.url, "tok", "run-a", attempt=0, rank=rank, spool_dir=spool, sync=True,
                  flush_interval=0.05)


def _recorders(ingest, spool):
    return [CountingRecorder(_client(ingest, f"{spool}-{r}", r), rank=r, world_size=W,
                             dataset_length=N, shuffle=False, heartbeat_interval=0)
            for r in range(W)]


def _train(recorders, updates, commit):
    for u in range(1, updates + 1):
        for rec in recorders:
            rec.consumed(PER_RANK_BATCH)
        commit(u)


def test_it_sends_every_ranks_part_of_an_update_in_one_event(ingest, spool):
    per_rank = _recorders(ingest, spool + "-a")
    _train(per_rank, 5, lambda u: [rec.commit(u) for rec in per_rank])
    own = [e for e in ingest.stored.values() if e["type"] == "update_committed"]
    ingest.stored.clear()

    ranks = _recorders(ingest, spool + "-b")
    leader = _client(ingest, spool + "-leader", 0)
    missing_at = 3  # rank 2's part of update 3 never reaches the leader

    def gather(u):
        parts = [rec.commit_part(u) for rec in ranks]
        leader.update_aggregate(u, [p for p in parts if not (u == missing_at and p["rank"] == 2)])

    _train(ranks, 5, gather)
    aggregates = sorted((e for e in ingest.stored.values()), key=lambda e: e["update"])
    assert [e["type"] for e in aggregates] == ["update_aggregate"] * 5
    assert aggregates[0]["event_id"] == "run-a:0:0:a1" and aggregates[0]["rank"] == 0
    # each part is the update_committed that rank would have sent
    by_key = {(e["update"], e["rank"]): e for e in own}
    for ev in aggregates:
        for part in ev["ranks"]:
            mine = by_key[(ev["update"], part["rank"])]
            assert (part["spans"], part["samples"]) == (mine["spans"], mine["samples"])
    assert [p["rank"] for p in aggregates[missing_at - 1]["ranks"]] == [0, 1, 3]

    # on the server: the same ledger and analysis as the per-rank events without rank 2 of u3
    from recoverydash.ingest.actions import ingest_batch
    from recoverydash.runs.analysis import analyze
    from recoverydash.runs.models import LedgerRow, Project, Run, rank_reports

    start = {"event_id": "s", "type": "attempt_started", "run_id": "run-a", "attempt": 0,
             "time": aggregates[0]["time"], "world_size": W, "dataset_version": "v",
             "global_batch_size": W * PER_RANK_BATCH}
    a, b = Project.objects.create(name="per-rank"), Project.objects.create(name="aggregate")
    ingest_batch(a, [start] + [e for e in own if (e["update"], e["rank"]) != (missing_at, 2)])
    ingest_batch(b, [start] + aggregates)
    run_a, run_b = Run.objects.get(project=a), Run.objects.get(project=b)

    def ledger(run):
        return sorted((*key, report["spans"], report["samples"]) for key, report in
                      rank_reports(LedgerRow.objects.filter(run=run)).items())

    assert ledger(run_a) == ledger(run_b) and len(ledger(run_b)) == 5 * W - 1
    # stored folded (runs.folding): one row per full update; update 3 without rank 2 holds
    # ranks 0-1 in one row and rank 3 in another
    assert sorted(LedgerRow.objects.filter(run=run_b).values_list("update", "rank", "ranks")) \
        == [(1, 0, 4), (2, 0, 4), (3, 0, 2), (3, 3, 1), (4, 0, 4), (5, 0, 4)]
    # the event times differ (each event is stamped when it was made): compare without them
    got, want = analyze(run_b, now=NOW).result, analyze(run_a, now=NOW).result
    for key in ("strata", "restarts", "generations", "last_restorable", "updates_at_risk",
                "health"):
        assert got[key] == want[key], key
    assert got["strata"]  # the stratum's counts are there to compare
