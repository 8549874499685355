"""A restart's verdict waits for every rank's part of the resumed attempt's first update
(ranks report separately; a verdict computed from some of them flips as the rest arrives)."""

from __future__ import annotations

from recoverydash.recovery import RunInput, analyze

W = 4


def started(attempt, resumed=None, t=0):
    ev = {"event_id": f"s{attempt}", "type": "attempt_started", "run_id": "r",
          "attempt": attempt, "time": f"2026-11-01T00:00:{t:02d}Z", "world_size": W,
          "dataset_version": "v", "global_batch_size": W * 2}
    if resumed:
        ev["resumed_from"] = resumed
    return ev


def update(attempt, u, rank, t):
    start = (u - 1) * W * 2
    return {"event_id": f"u{attempt}-{u}-{rank}", "type": "update_committed", "run_id": "r",
            "attempt": attempt, "rank": rank, "time": f"2026-11-01T00:00:{t:02d}Z", "update": u,
            "spans": [{"stratum": "m", "epoch": 0, "ranges": [[start + rank, start + W * 2, W]]}]}


def run(ranks_of_first_update):
    events = [started(0)] + [update(0, u, r, u) for u in (1, 2) for r in range(W)]
    cursor = [{"stratum": "m", "epoch": 0, "position": 16}]
    events.append({"event_id": "c2", "type": "checkpoint_committed", "run_id": "r", "attempt": 0,
                   "time": "2026-11-01T00:00:03Z", "manifest": {
                       "schema_revision": 1, "generation_id": "g2", "update": 2, "world_size": W,
                       "required_shards": [], "components": [], "objects": [],
                       "data_progress": {"cursor": cursor}, "dataset_version": "v",
                       "committed_at": "2026-11-01T00:00:03Z"}})
    events.append(started(1, {"generation_id": "g2", "update": 2, "cursor": cursor}, 10))
    events += [update(1, 3, r, 11) for r in ranks_of_first_update]
    return analyze(RunInput.from_events(events), now=60.0 + 1.7e9).restarts[0]


def test_it_keeps_the_verdict_unverified_until_every_rank_reported_the_first_update():
    partial = run([3])  # rank 3 alone: its first position is 19, three past the cursor
    assert partial.verdict == "unverified"
    assert partial.omitted == 3  # the figure as it stands; no verdict (and no alert) rests on it
    complete = run(range(W))
    assert (complete.verdict, complete.omitted, complete.replayed) == ("exact", 0, 0)
