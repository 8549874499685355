"""Exact values for docs/definitions.md#restart-findings, #predecessor-comparisons,
#failure-time, #attempts-with-no-start-event and #cursors-without-order.

The runs are small: 2 ranks, 8 positions per update (rank r takes start + r, start + r + 2, ...),
a generation ``g4`` at update 4 (cursor 32) written by attempt 0."""
from __future__ import annotations

import hashlib

import pytest

from recoverydash.recovery import AttemptRecord, GenerationRecord, LedgerRecord, RunInput, analyze

W, PER_UPDATE = 2, 8
SHARDS = ["rank0", "rank1"]
COMPONENTS = ["model", "optimizer", "scheduler", "rng", "data_progress"]  # the default contract


def update(attempt, u, start, time, order=None, ranks=W):
    """Every rank's report of update ``u`` consuming [start, start + 8) of epoch 0."""
    span = {"stratum": "main", "epoch": 0}
    if order is not None:
        span["order"] = order
    return [LedgerRecord(attempt, u, r, time,
                         [{**span, "ranges": [[start + r, start + PER_UPDATE, ranks]]}])
            for r in range(ranks)]


def g4(checks="ok", attempt=0):
    """Generation g4 at update 4, cursor 32, written by ``attempt``; its objects ``checks``."""
    objects = [{"uri": f"file:///c/g4/{s}/{c}", "shard": s, "component": c, "size": 1,
                "sha256": hashlib.sha256(f"g4{s}{c}".encode()).hexdigest()}
               for s in SHARDS for c in COMPONENTS]
    manifest = {"schema_revision": 1, "generation_id": "g4", "update": 4, "world_size": W,
                "required_shards": SHARDS, "components": COMPONENTS, "objects": objects,
                "data_progress": {"cursor": [{"stratum": "main", "epoch": 0, "position": 32}]},
                "dataset_version": "ds", "committed_at": None}
    return GenerationRecord("g4", attempt, 4, started_at=4.5, required_shards=SHARDS,
                            components=COMPONENTS, manifests=[manifest], committed_at=5.0,
                            object_checks={o["uri"]: checks for o in objects})


def attempt(n, **fields):
    base = {"started_at": 100.0 * n, "world_size": W, "dataset_version": "ds",
            "global_batch_size": PER_UPDATE}
    return AttemptRecord(n, **{**base, **fields})


def resumed(update=4, position=32, gid="g4"):
    return {"generation_id": gid, "update": update,
            "cursor": [{"stratum": "main", "epoch": 0, "position": position}]}


def one_restart(first_changes=None, resume=None, checks="ok", order=None, start_at=32):
    """Attempt 0: updates 1-6 (positions 0-47), fails at 10.0; attempt 1 resumes g4 with
    ``first_changes`` to its attempt_started and consumes updates 5-6 from ``start_at``."""
    records = [r for u in range(1, 7) for r in update(0, u, (u - 1) * PER_UPDATE, float(u))]
    records += [r for i, u in enumerate((5, 6))
                for r in update(1, u, start_at + i * PER_UPDATE, 150.0 + i, order)]
    attempts = [attempt(0, ended_at=10.0, end_reason="failed", end_update=6),
                attempt(1, resumed_from=resume or resumed(), **(first_changes or {}))]
    return RunInput("findings", attempts, records, [], [g4(checks)], first_event_at=0.0)


def codes(run) -> list[str]:
    (restart,) = analyze(run, now=200.0).restarts
    return sorted(f.code for f in restart.findings)


def test_a_clean_restart_has_no_finding():
    (restart,) = analyze(one_restart(), now=200.0).restarts
    assert (restart.verdict, restart.findings) == ("exact", [])
    assert (restart.replayed, restart.omitted, restart.recomputed) == (0, 0, 16)
    assert restart.lost_updates == 2  # updates 5 and 6 of attempt 0, rolled back


@pytest.mark.parametrize("changes, code, detail", [
    ({"world_size": 4}, "world_size_changed", "world_size 2 -> 4"),
    ({"dataset_version": "ds2"}, "dataset_version_changed", "dataset_version 'ds' -> 'ds2'"),
    ({"global_batch_size": 16}, "global_batch_changed", "global batch 8 -> 16"),
])
def test_a_restart_names_each_way_its_start_differs_from_its_predecessor(changes, code, detail):
    (restart,) = analyze(one_restart(changes), now=200.0).restarts
    assert [(f.code, f.detail) for f in restart.findings] == [(code, detail)]


def test_a_resume_from_a_rejected_generation_is_resumed_from_unrestorable():
    (restart,) = analyze(one_restart(checks="object_missing"), now=200.0).restarts
    assert [(f.code, f.detail) for f in restart.findings] == [
        ("resumed_from_unrestorable", "generation g4 is rejected")]


def test_a_declared_update_other_than_the_generations_is_an_update_mismatch():
    (restart,) = analyze(one_restart(resume=resumed(update=3)), now=200.0).restarts
    assert [(f.code, f.detail) for f in restart.findings] == [
        ("update_mismatch", "declared update 3, generation 4")]


def test_an_epoch_consumed_again_under_another_order_without_sample_ids_is_unverified():
    """docs/definitions.md#verdict: positions under another order are not comparable, and no
    report named its samples: neither replay nor omission is proven, nor their absence."""
    (restart,) = analyze(one_restart(order="b"), now=200.0).restarts
    assert [(f.code, f.detail) for f in restart.findings] == [
        ("order_changed", "main epoch 0 under order 'b'"),
        ("samples_unknown", "order changed and sample ids were not recorded: replay and "
                            "omission unknown (main epoch 0)")]
    assert (restart.replayed, restart.omitted, restart.verdict) == (0, 0, "unverified")


def test_replay_and_omission_findings_carry_the_counts():
    assert codes(one_restart(start_at=24)) == ["replay"]       # one update behind: 8 again
    assert codes(one_restart(start_at=40)) == ["omission"]     # one update ahead: 8 skipped
    (restart,) = analyze(one_restart(start_at=24), now=200.0).restarts
    assert restart.findings[0].detail == "8 positions committed at or below update 4 consumed again"


def test_predecessor_comparisons_are_with_the_failed_attempt_not_the_writer():
    """Attempt 0 (2 ranks) writes g4; attempt 1 (4 ranks) resumes it and fails; attempt 2 (4
    ranks) resumes g4 too: its world size did not change, although g4's writer had 2."""
    records = [r for u in range(1, 7) for r in update(0, u, (u - 1) * PER_UPDATE, float(u))]
    records += update(1, 5, 32, 150.0, ranks=4)
    records += [r for u in (5, 6)
                for r in update(2, u, 32 + (u - 5) * PER_UPDATE, 250.0 + u, ranks=4)]
    attempts = [attempt(0, ended_at=10.0, end_reason="failed", end_update=6),
                attempt(1, world_size=4, resumed_from=resumed(), ended_at=160.0,
                        end_reason="failed", end_update=5),
                attempt(2, world_size=4, resumed_from=resumed())]
    first, second = analyze(RunInput("p", attempts, records, [], [g4()], first_event_at=0.0),
                            now=300.0).restarts
    assert (first.world_size_before, first.world_size_after) == (2, 4)
    assert [f.code for f in first.findings] == ["world_size_changed"]
    assert (second.world_size_before, second.world_size_after) == (4, 4)
    assert second.findings == []


def test_the_failure_time_is_attempt_ended_else_the_last_event():
    """Lost seconds run from update 4's commit (4.0) to the failure; recovery seconds from the
    failure to attempt 1's first commit (150.0)."""
    (ended,) = analyze(one_restart(), now=200.0).restarts
    assert (ended.lost_seconds, ended.recovery_seconds) == (10.0 - 4.0, 150.0 - 10.0)
    run = one_restart()
    run.attempts[0] = attempt(0, last_event_at=6.5)  # killed: no attempt_ended
    (killed,) = analyze(run, now=200.0).restarts
    assert (killed.lost_seconds, killed.recovery_seconds) == (6.5 - 4.0, 150.0 - 6.5)


def test_a_first_attempt_without_a_start_event_is_fresh():
    records = [r for u in range(1, 4) for r in update(0, u, (u - 1) * PER_UPDATE, float(u))]
    analysis = analyze(RunInput("fresh", [], records), now=10.0)
    assert analysis.restarts == []
    (main,) = analysis.strata
    assert (main.consumed, main.duplicates, main.omissions) == (24, 0, 0)


@pytest.mark.parametrize("read_order, recomputed", [
    (None, 24),   # no order: it applies to order "a", so 48-55 were read, and are recomputed
    ("b", 16),    # another order: it says nothing of order "a"; only 32-47 (rolled back)
])
def test_a_read_cursor_without_order_applies_to_every_order_of_its_epoch(read_order, recomputed):
    """Attempt 0 consumed updates 1-6 under order "a" and had read to 56 when it failed;
    attempt 1 resumes g4 (cursor 32) and consumes 32-55 under order "a"."""
    records = [r for u in range(1, 7)
               for r in update(0, u, (u - 1) * PER_UPDATE, float(u), order="a")]
    records += [r for i, u in enumerate((5, 6, 7))
                for r in update(1, u, 32 + 8 * i, 150.0 + i, order="a")]
    fetched = {"stratum": "main", "epoch": 0, "position": 56}
    if read_order:
        fetched["order"] = read_order
    attempts = [attempt(0, ended_at=10.0, end_reason="failed", end_update=6,
                        end_fetched=[fetched]),
                attempt(1, resumed_from=resumed())]
    (restart,) = analyze(RunInput("o", attempts, records, [], [g4()], first_event_at=0.0),
                         now=200.0).restarts
    assert (restart.verdict, restart.replayed, restart.omitted) == ("exact", 0, 0)
    assert restart.recomputed == recomputed
