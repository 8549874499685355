"""docs/definitions.md#undecided-generations: the generations committed and not decided yet, each
with its commit time and whether it lies on the live lineage above the last restorable one."""
from __future__ import annotations

from recoverydash.recovery import RunInput, analyze, parse_time
from tests.recovery.test_settled_at_the_end import (
    T0,
    W,
    committed,
    ended,
    started,
    statuses,
    update,
)


def analysis(events, verified: set, now: float):
    checks = {o["uri"]: "ok" for e in events if e["type"] == "checkpoint_committed"
              for o in e["manifest"]["objects"] if e["manifest"]["generation_id"] in verified}
    return analyze(RunInput.from_events(events, object_checks=checks), now=T0 + now)


def test_it_lists_the_committed_generations_not_verified_yet_newest_first():
    # attempt 0 saves g2 (verified) and g4, g6 (not verified yet); attempt 1 resumes g2, so g4
    # and g6 are off the live lineage; it saves g4b (not verified yet)
    events = [started(0, 0)] + [update(0, u, r, u) for u in range(1, 7) for r in range(W)]
    events += [committed("g2", 0, 2, 3), committed("g4", 0, 4, 5), committed("g6", 0, 6, 7)]
    cursor = [{"stratum": "m", "epoch": 0, "position": 16}]
    events += [started(1, 10, {"generation_id": "g2", "update": 2, "cursor": cursor})]
    events += [update(1, u, r, 10 + u) for u in (3, 4, 5) for r in range(W)]
    events += [committed("g4b", 1, 4, 16)]
    result = analysis(events, {"g2"}, now=20).to_dict()
    assert result["last_restorable"]["generation_id"] == "g2"
    assert result["undecided"] == [
        {"generation_id": "g6", "update": 6, "live": False, "reasons": [],
         "committed_at": "2026-11-01T00:00:07+00:00"},
        {"generation_id": "g4b", "update": 4, "live": True, "reasons": [],
         "committed_at": "2026-11-01T00:00:16+00:00"},
        {"generation_id": "g4", "update": 4, "live": False, "reasons": [],
         "committed_at": "2026-11-01T00:00:05+00:00"}]
    assert parse_time(result["undecided"][1]["committed_at"]) == T0 + 16
    # verified: decided, no longer listed
    assert analysis(events, {"g2", "g4", "g6", "g4b"}, now=20).to_dict()["undecided"] == []


def test_a_generation_waiting_for_its_ledger_is_undecided_until_it_settles():
    head = [started(0, 0)] + [update(0, u, r, u) for u in (1, 2, 3) for r in range(W)]
    head += [update(0, 4, 0, 4), committed("g4", 0, 4, 5), ended(0, 0, 6, 4)]
    a = analysis(head, {"g4"}, now=8)
    assert [(g["generation_id"], g["live"]) for g in a.to_dict()["undecided"]] == [("g4", True)]
    rest = [update(0, 4, r, 4) for r in (1, 2, 3)]
    assert statuses(head + rest, now=8)["g4"] == "restorable"
    assert analysis(head + rest, {"g4"}, now=8).to_dict()["undecided"] == []
