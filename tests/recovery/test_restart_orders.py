"""Restarts that change the global batch or the order of an epoch, with exact values
(docs/definitions.md#drop-last-threshold, #replayed, #omitted, #verdict; issue 25)."""
from __future__ import annotations

from recoverydash.recovery import AttemptRecord, GenerationRecord, LedgerRecord, RunInput, analyze

COMPONENTS = ["model", "optimizer", "scheduler", "rng", "data_progress"]


def generation(gid, attempt, update, cursor, when):
    objects = [{"uri": f"file:///c/{gid}/{c}", "shard": "rank0", "component": c, "size": 1,
                "sha256": f"{abs(hash((gid, c))):064x}"[:64]} for c in COMPONENTS]
    manifest = {"schema_revision": 1, "generation_id": gid, "update": update, "world_size": 1,
                "required_shards": ["rank0"], "components": COMPONENTS, "objects": objects,
                "data_progress": {"cursor": [dict(stratum="main", **cursor)]},
                "dataset_version": "ds", "committed_at": None}
    return GenerationRecord(gid, attempt, update, started_at=when - 0.5,
                            required_shards=["rank0"], components=COMPONENTS,
                            manifests=[manifest], committed_at=when,
                            object_checks={o["uri"]: "ok" for o in objects})


def span(epoch, lo, hi, **extra):
    return {"stratum": "main", "epoch": epoch, "ranges": [[lo, hi]], **extra}


def batch_change_run(length, before, after, saved_at, next_epoch=False):
    """Attempt 0 (global batch ``before``) consumes epoch 0 of ``length`` positions in order
    and saves at update ``saved_at``; attempt 1 (global batch ``after``) resumes there, goes on
    in epoch 0 while a whole batch is left (none when ``next_epoch``: its loader starts the next
    epoch), then consumes two batches of epoch 1."""
    ledger, t = [], 0.0
    for u in range(1, saved_at + 2):  # one update past the save, rolled back
        t += 1.0
        ledger.append(LedgerRecord(0, u, 0, t, [span(0, (u - 1) * before, u * before)]))
    cursor = saved_at * before
    attempts = [
        AttemptRecord(0, started_at=0.0, world_size=1, dataset_version="ds",
                      global_batch_size=before, sampler={"epoch_length": {"main": length}},
                      ended_at=t + 1, end_reason="failed", end_update=saved_at + 1),
        AttemptRecord(1, started_at=t + 10, world_size=1, dataset_version="ds",
                      global_batch_size=after, sampler={"epoch_length": {"main": length}},
                      resumed_from={"generation_id": "g", "update": saved_at}),
    ]
    u, t, pos = saved_at, t + 20, cursor
    while not next_epoch and pos + after <= length:
        u, t = u + 1, t + 1
        ledger.append(LedgerRecord(1, u, 0, t, [span(0, pos, pos + after)]))
        pos += after
    for i in range(2):
        u, t = u + 1, t + 1
        ledger.append(LedgerRecord(1, u, 0, t, [span(1, i * after, (i + 1) * after)]))
    return RunInput("batch-change", attempts, ledger, [],
                    [generation("g", 0, saved_at, {"epoch": 0, "position": cursor}, 9.5)],
                    first_event_at=0.0)


def test_a_larger_batch_after_the_restart_leaves_a_remainder_it_drops_by_design():
    """Batch 4 -> 16, epoch of 55: attempt 1 resumes at 32, consumes 32-47 and leaves the epoch
    with 7 < 16 positions: the drop_last remainder of the attempt that left the epoch, no
    omission (the threshold is not the batch of 4 before the restart)."""
    analysis = analyze(batch_change_run(55, 4, 16, 8), now=100.0)
    restart = analysis.restarts[0]
    assert (restart.replayed, restart.omitted, restart.verdict) == (0, 0, "exact")
    assert (analysis.strata[0].duplicates, analysis.strata[0].omissions) == (0, 0)


def test_a_smaller_batch_after_the_restart_owes_the_remainder_it_skipped():
    """Batch 16 -> 4, epoch of 53: attempt 0 saved at 48 (a remainder of 5 < 16); attempt 1,
    batch 4, starts the next epoch at once: 5 >= 4 positions skipped, omitted by the restart and
    by the strata alike."""
    analysis = analyze(batch_change_run(53, 16, 4, 3, next_epoch=True), now=100.0)
    restart = analysis.restarts[0]
    assert (restart.replayed, restart.omitted, restart.verdict) == (0, 5, "omission")
    assert (analysis.strata[0].duplicates, analysis.strata[0].omissions) == (0, 5)
