"""A generation's data cursor is judged only on settled evidence, also at an attempt's end
(docs/definitions.md#updates-counted-once-complete): the lead reporter's ``attempt_ended`` is
sent at once (the SDK's prompt events) while the other ranks' last updates come with their exit,
up to about a second later (observed in ``make demo`` on a loaded machine: 0.02-0.99 s). Judged
in that window, a generation at the attempt's last update was rejected with
``data_cursor_mismatch`` and became restorable a second later: a status going
committed -> rejected -> restorable on evidence that was going to arrive anyway, which paged
``generation_rejected`` and ``no_restorable_generation`` and resolved them again."""
from __future__ import annotations

import hashlib

from recoverydash.recovery import DEFAULT_CONTRACT, RunInput, analyze, parse_time

W = 4  # ranks
B = 2  # positions per rank and update
T0 = parse_time("2026-11-01T00:00:00Z")


def at(t: float) -> str:
    return f"2026-11-01T00:{int(t) // 60:02d}:{int(t) % 60:02d}Z"


def ev(kind: str, attempt: int, t: float, **fields) -> dict:
    key = "-".join(str(v) for v in (kind, attempt, fields.get("update"), fields.get("rank"),
                                    fields.get("generation_id")))
    return {"event_id": key, "type": kind, "run_id": "r", "attempt": attempt, "time": at(t),
            **fields}


def started(attempt: int, t: float, resumed: dict | None = None) -> dict:
    extra = {"resumed_from": resumed} if resumed else {}
    return ev("attempt_started", attempt, t, world_size=W, dataset_version="v",
              global_batch_size=W * B, **extra)


def update(attempt: int, u: int, rank: int, t: float) -> dict:
    """Rank ``rank``'s part of update ``u``: positions strided over the update's W * B."""
    start = (u - 1) * W * B
    return ev("update_committed", attempt, t, update=u, rank=rank,
              spans=[{"stratum": "m", "epoch": 0, "ranges": [[start + rank, start + W * B, W]]}])


def committed(gid: str, attempt: int, u: int, t: float) -> dict:
    objects = [{"uri": f"file:///c/{gid}/{c}", "shard": "s0", "component": c, "size": 1,
                "sha256": hashlib.sha256((gid + c).encode()).hexdigest()}
               for c in DEFAULT_CONTRACT["required_components"]]
    return ev("checkpoint_committed", attempt, t, manifest={
        "schema_revision": 1, "generation_id": gid, "update": u, "world_size": W,
        "required_shards": ["s0"], "components": [], "objects": objects,
        "data_progress": {"cursor": [{"stratum": "m", "epoch": 0, "position": u * W * B}]},
        "dataset_version": "v", "committed_at": at(t)})


def ended(attempt: int, rank: int, t: float, u: int) -> dict:
    return ev("attempt_ended", attempt, t, rank=rank, reason="completed", update=u)


def statuses(events: list[dict], now: float) -> dict:
    """``{generation_id: status}`` and the restarts' verdicts of ``events`` analysed at ``now``
    (every object verified ``ok``)."""
    checks = {o["uri"]: "ok" for e in events if e["type"] == "checkpoint_committed"
              for o in e["manifest"]["objects"]}
    analysis = analyze(RunInput.from_events(events, object_checks=checks), now=T0 + now)
    out = {g.generation_id: g.status for g in analysis.generations}
    out.update({f"restart {r.attempt}": r.verdict for r in analysis.restarts})
    return out


def test_the_leads_attempt_ended_does_not_settle_the_other_ranks_last_update():
    # the arrival order seen in the demo: rank 0 commits update 4, saves g4, ends (prompt),
    # and ranks 1-3 send their part of update 4 and their own attempt_ended as they exit
    head = [started(0, 0)] + [update(0, u, r, u) for u in (1, 2, 3) for r in range(W)]
    head += [update(0, 4, 0, 4), committed("g4", 0, 4, 5), ended(0, 0, 6, 4)]
    tail = [e for r in (1, 2, 3) for e in (update(0, 4, r, 4), ended(0, r, 7, 4))]
    seen = [statuses(head + tail[:i], now=8)["g4"] for i in range(len(tail) + 1)]
    # committed while a rank's part of update 4 may still come; restorable once all are in:
    # never rejected on the way (before the fix: rejected, data_cursor_mismatch, until the last)
    # (tail: rank 1's part, its end, rank 2's part, its end, rank 3's part, its end)
    assert seen == ["committed"] * 5 + ["restorable"] * 2


def test_a_resumed_attempts_generations_never_flip_through_rejected_at_its_end():
    # the demo's shape: attempt 0 dies after g2, attempt 1 resumes g2, saves g4 and g6 and ends;
    # its events arrive rank by rank in the order observed, each arrival analysed
    events = [started(0, 0)] + [update(0, u, r, u) for u in (1, 2, 3) for r in range(W)]
    events += [committed("g2", 0, 2, 3)]
    cursor = [{"stratum": "m", "epoch": 0, "position": 2 * W * B}]
    events += [started(1, 10, {"generation_id": "g2", "update": 2, "cursor": cursor})]
    lead = [update(1, u, 0, 10 + u) for u in (3, 4, 5, 6)]
    lead += [committed("g4", 1, 4, 15), committed("g6", 1, 6, 17), ended(1, 0, 18, 6)]
    others = [update(1, u, r, 10 + u) for r in (1, 2, 3) for u in (3, 4, 5, 6)]
    others += [ended(1, r, 19, 6) for r in (1, 2, 3)]
    arrivals = events + lead + others
    history = [statuses(arrivals[:i], now=20) for i in range(len(events), len(arrivals) + 1)]
    for gid in ("g2", "g4", "g6"):
        seen = [h[gid] for h in history if gid in h]
        assert "rejected" not in seen, (gid, seen)
        assert seen[-1] == "restorable"
    # g6 waits for the last part of update 6 (rank 3's), then is restorable
    last = arrivals.index(update(1, 6, 3, 16)) - len(events) + 1
    assert [h["g6"] for h in history[last - 1:last + 1]] == ["committed", "restorable"]
    verdicts = [h.get("restart 1") for h in history]
    assert "replay" not in verdicts and "omission" not in verdicts and verdicts[-1] == "exact"


def test_an_ended_attempt_whose_missing_part_never_comes_settles_by_age():
    # rank 3 died before reporting update 4; the others ended: update 4 counts once its first
    # report is the settle delay (300 s) old, and g4 is judged then
    events = [started(0, 0)] + [update(0, u, r, u) for u in (1, 2, 3) for r in range(W)]
    events += [update(0, 4, r, 4) for r in (0, 1, 2)]
    events += [committed("g4", 0, 4, 5)] + [ended(0, r, 6, 4) for r in (0, 1, 2)]
    assert statuses(events, now=4 + 299)["g4"] == "committed"
    # then judged on what was reported: rank 3's positions 27 and 31 never came, the ledger's
    # frontier is 31 (rank 2's last position 30, + 1), the manifest says 32
    assert statuses(events, now=4 + 300)["g4"] == "rejected"
