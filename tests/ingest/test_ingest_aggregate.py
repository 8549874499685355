"""update_aggregate (docs/ingest-v1.md#update_aggregate): every rank's report of one update in
one event gives the rows and the analysis of the per-rank update_committed events it replaces,
field by field; a rank missing from it is a missing part, as a missing per-rank event is."""

from __future__ import annotations

import pytest
from ingest_support import post

from recoverydash.ingest.actions import ingest_batch
from recoverydash.runs.analysis import analyze
from recoverydash.runs.models import Attempt, LedgerRow, Project, Run, rank_reports

pytestmark = pytest.mark.django_db

W = 4
NOW = 1_793_500_000.0


def at(t: int) -> str:
    return f"2026-11-01T00:{t // 60:02d}:{t % 60:02d}Z"


def started(attempt, resumed=None, t=0):
    ev = {"event_id": f"s{attempt}", "type": "attempt_started", "run_id": "r",
          "attempt": attempt, "time": at(t), "world_size": W, "dataset_version": "v",
          "global_batch_size": W * 2}
    if resumed:
        ev["resumed_from"] = resumed
    return ev


def update(attempt, u, rank, t):
    start = (u - 1) * W * 2
    return {"event_id": f"u{attempt}-{u}-{rank}", "type": "update_committed", "run_id": "r",
            "attempt": attempt, "rank": rank, "time": at(t), "update": u, "samples": 2,
            "spans": [{"stratum": "m", "epoch": 0, "ranges": [[start + rank, start + W * 2, W]]}]}


def aggregated(events: list[dict]) -> list[dict]:
    """``events`` with the update_committed of each (attempt, update) replaced by one
    update_aggregate from rank 0 carrying every rank's part (at the first report's place)."""
    out, groups = [], {}
    for ev in events:
        if ev["type"] != "update_committed":
            out.append(ev)
            continue
        key = (ev["attempt"], ev["update"])
        if key not in groups:
            groups[key] = {"event_id": f"agg{key[0]}-{key[1]}", "type": "update_aggregate",
                           "run_id": ev["run_id"], "attempt": ev["attempt"], "rank": 0,
                           "time": ev["time"], "update": ev["update"], "ranks": []}
            out.append(groups[key])
        groups[key]["ranks"].append({"rank": ev["rank"], "spans": ev["spans"],
                                     "samples": ev["samples"]})
    return out


def restart_with_first_update_of(ranks: list[int]) -> list[dict]:
    """Attempt 0 commits updates 1..4; attempt 1 resumes at update 2 (cursor 16): only
    ``ranks`` report its first update 3, then updates 4 and 5 are complete."""
    events = [started(0)] + [update(0, u, r, u) for u in range(1, 5) for r in range(W)]
    cursor = [{"stratum": "m", "epoch": 0, "position": 16}]
    events.append(started(1, {"update": 2, "cursor": cursor}, 10))
    events += [update(1, 3, r, 11) for r in ranks]
    events += [update(1, u, r, 11 + u) for u in (4, 5) for r in range(W)]
    return events


def analysed(name: str, events: list[dict]) -> tuple[Run, dict]:
    project = Project.objects.create(name=name)
    for start in range(0, len(events), 7):  # several batches
        ingest_batch(project, events[start:start + 7])
    run = Run.objects.get(project=project)
    return run, analyze(run, now=NOW).result


def rows(run: Run) -> dict:
    return {"ledger": rank_reports(LedgerRow.objects.filter(run=run).order_by("pk")),
        "attempts": list(Attempt.objects.filter(run=run).order_by("attempt").values(
            "attempt", "last_update", "last_update_at", "last_event_at", "world_size")),
        "strata": run.strata}


def test_it_gives_an_aggregate_the_analysis_of_the_per_rank_events_it_replaces():
    events = restart_with_first_update_of(list(range(W)))
    per_rank, want = analysed("per-rank", events)
    agg, got = analysed("aggregate", aggregated(events))
    assert got == want
    assert rows(agg) == rows(per_rank)
    assert LedgerRow.objects.filter(run=agg).count() == 7 * W  # updates 1-4, then 3-5
    assert agg.event_count == 2 + 7  # two starts, one aggregate per update


def test_it_counts_a_rank_missing_from_an_aggregate_as_a_missing_part():
    events = restart_with_first_update_of([1, 2, 3])
    per_rank, want = analysed("per-rank", events)
    agg, got = analysed("aggregate", aggregated(events))
    assert got == want
    assert rows(agg) == rows(per_rank)
    assert not LedgerRow.objects.filter(run=agg, attempt=1, update=3, rank=0).exists()
    (restart,) = got["restarts"]
    (finding,) = [f for f in restart["findings"] if f["code"] == "incomplete_first_update"]
    assert finding["detail"].startswith("rank 0 of 4 never reported update 3")


def test_it_refuses_an_aggregate_naming_a_rank_twice(client, ingest_token):
    part = {"rank": 1, "spans": [{"stratum": "m", "epoch": 0, "ranges": [[0, 8]]}]}
    r = post(client, ingest_token, [{"event_id": "a", "type": "update_aggregate",
                                     "run_id": "r", "attempt": 0, "time": at(1), "update": 1,
                                     "ranks": [part, dict(part)]}])
    assert r.status_code == 400
    (error,) = r.json()["errors"]
    assert error["path"].startswith("events[0].ranks")
    assert "expected each rank once, got rank 1 at ranks[0] and ranks[1]" in error["message"]
    assert not Run.objects.exists()


def test_it_names_the_span_of_an_aggregate_that_changes_a_strata_kind(client, ingest_token):
    ranges = {"stratum": "m", "epoch": 0, "ranges": [[0, 8]]}
    ids = {"stratum": "m", "epoch": 0, "ids": [1, 2]}
    r = post(client, ingest_token, [{"event_id": "a", "type": "update_aggregate",
                                     "run_id": "r", "attempt": 0, "time": at(1), "update": 1,
                                     "ranks": [{"rank": 0, "spans": [ranges]},
                                               {"rank": 1, "spans": [ids]}]}])
    assert r.status_code == 400
    (error,) = r.json()["errors"]
    assert error["path"] == "events[0].ranks[1].spans[0].ids"
