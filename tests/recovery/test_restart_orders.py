"""Restarts that change the global batch or the order of an epoch, with exact values
(docs/definitions.md#drop-last-threshold, #replayed, #omitted, #verdict; issue 25)."""
from __future__ import annotations

from recoverydash.recovery import AttemptRecord, GenerationRecord, LedgerRecord, RunInput, analyze

COMPONENTS = ["model", "optimizer", "scheduler", "rng", "data_progress"]


def generation(gid, attempt, update, cursor, when, world_size=1):
    objects = [{"uri": f"file:///c/{gid}/{c}", "shard": "rank0", "component": c, "size": 1,
                "sha256": f"{abs(hash((gid, c))):064x}"[:64]} for c in COMPONENTS]
    manifest = {"schema_revision": 1, "generation_id": gid, "update": update,
                "world_size": world_size,
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


def permuted(order, epoch, lo, hi, perm, step=1, rank=0, indices=True):
    """One span of positions ``lo + rank, ..., < hi`` (every ``step``) under ``order``, with the
    dataset indices ``perm`` puts there when ``indices``."""
    out = {"stratum": "main", "epoch": epoch, "order": order,
           "ranges": [[lo + rank, hi, step]]}
    if indices:
        out["indices"] = sorted(perm(p) for p in range(lo + rank, hi, step))
    return out


def seed_change_run(consumed_after, indices=True, length=100, batch=5):
    """An HF Trainer relaunched with another seed. Attempt 0 (order A: sample p at position p)
    consumes 6 updates of 5 and saves at update 5 (cursor 25); attempt 1 (order B: sample
    99 - p at position p) skips the first 25 positions of its order, as the Trainer skips the
    batches already trained, and consumes ``consumed_after`` positions from 25, then (when it
    reached the end) one update of epoch 1. The samples that reached the model: 0-24 before
    the save, 74-0 after it; truth: samples 0-24 fed twice once B reaches them, 75-99 never."""
    ledger, t = [], 0.0
    for u in range(1, 7):
        t += 1.0
        ledger.append(LedgerRecord(0, u, 0, t, [permuted("A", 0, (u - 1) * batch, u * batch,
                                                         lambda p: p, indices=indices)]))
    sampler = {"epoch_length": {"main": length}}
    attempts = [
        AttemptRecord(0, started_at=0.0, world_size=1, dataset_version="ds",
                      global_batch_size=batch, sampler=sampler, ended_at=t + 1,
                      end_reason="failed", end_update=6),
        AttemptRecord(1, started_at=t + 10, world_size=1, dataset_version="ds",
                      global_batch_size=batch, sampler=sampler,
                      resumed_from={"generation_id": "g", "update": 5}),
    ]
    u, t = 5, t + 20
    for lo in range(25, 25 + consumed_after, batch):
        u, t = u + 1, t + 1
        ledger.append(LedgerRecord(1, u, 0, t, [permuted("B", 0, lo, lo + batch,
                                                         lambda p: length - 1 - p)]))
    if 25 + consumed_after >= length:
        ledger.append(LedgerRecord(1, u + 1, 0, t + 1, [permuted("C", 1, 0, batch,
                                                                 lambda p: p)]))
    return RunInput("seed-change", attempts, ledger, [],
                    [generation("g", 0, 5, {"epoch": 0, "position": 25}, 5.5)],
                    first_event_at=0.0)


def codes(restart):
    return [f.code for f in restart.findings]


def test_a_restart_under_another_seed_replays_and_omits_by_sample_identity():
    """docs/definitions.md#epochs-under-several-orders. Seed change, epoch finished: the 25
    samples trained before the save were fed again (replayed 25) and the 25 samples the new
    order put in its first 25 positions were never fed (omitted 25): on the restart and in the
    strata alike."""
    analysis = analyze(seed_change_run(75), now=100.0)
    restart = analysis.restarts[0]
    assert (restart.replayed, restart.omitted, restart.verdict) == \
        (25, 25, "replay_and_omission")
    assert codes(restart) == ["replay", "omission", "order_changed"]
    assert (analysis.strata[0].duplicates, analysis.strata[0].omissions) == (25, 25)


def test_a_restart_under_another_seed_counts_what_is_proven_while_the_epoch_runs():
    """The same, 55 positions after the resume (samples 74-20): 5 of them (20-24) were trained
    before, so 5 replayed; of the 25 positions skipped under the new order at most 20 hold
    samples trained before (0-19, not yet seen again), so 5 are proven omitted and 20
    undetermined until the epoch is left."""
    analysis = analyze(seed_change_run(55), now=100.0)
    restart = analysis.restarts[0]
    assert (restart.replayed, restart.omitted, restart.verdict) == \
        (5, 5, "replay_and_omission")
    assert [(f.code, f.detail) for f in restart.findings][-1] == (
        "samples_undetermined", "order changed: the samples at 20 positions of main epoch 0 "
        "skipped under the new order may have been trained on under the old one; decided once "
        "the epoch is left")
    assert (analysis.strata[0].duplicates, analysis.strata[0].omissions) == (5, 5)


def test_a_restart_under_another_seed_without_sample_ids_is_unverified_never_exact():
    """docs/definitions.md#verdict: no report named its samples; the positions of two orders
    cannot be compared, so neither replay nor omission is proven, and neither is their
    absence: unverified, with the reason, and the strata owe only what is proven (the epoch
    of 100 had 100 distinct positions consumed: nothing)."""
    analysis = analyze(seed_change_run(75, indices=False), now=100.0)
    restart = analysis.restarts[0]
    assert (restart.replayed, restart.omitted, restart.verdict) == (0, 0, "unverified")
    assert [(f.code, f.detail) for f in restart.findings][-1] == (
        "samples_unknown", "order changed and sample ids were not recorded: replay and "
        "omission unknown (main epoch 0)")
    assert (analysis.strata[0].duplicates, analysis.strata[0].omissions) == (0, 0)


def ddp_to_one_run(length=40):
    """Lightning DDP on 2 processes (order D, DistributedSampler-like: rank r takes positions
    r, r + 2, ...; sample p at position p) saves at update 3 after 18 positions; resumed on 1
    process with a plain DataLoader (order R: sample 39 - p at position p), the epoch starts
    again at position 0 and runs to its last full batch of 6 (36 positions), then epoch 1."""
    ledger, t = [], 0.0
    for u in range(1, 5):
        t += 1.0
        ledger += [LedgerRecord(0, u, r, t, [permuted("D", 0, (u - 1) * 6, u * 6, lambda p: p,
                                                      step=2, rank=r)]) for r in range(2)]
    sampler = {"epoch_length": {"main": length}}
    attempts = [
        AttemptRecord(0, started_at=0.0, world_size=2, dataset_version="ds", micro_batch_size=3,
                      grad_accum_steps=1, sampler=sampler, ended_at=t + 1, end_reason="failed",
                      end_update=4),
        AttemptRecord(1, started_at=t + 10, world_size=1, dataset_version="ds",
                      micro_batch_size=6, grad_accum_steps=1, sampler=sampler,
                      resumed_from={"generation_id": "g", "update": 3}),
    ]
    u, t = 3, t + 20
    for lo in range(0, 36, 6):
        u, t = u + 1, t + 1
        ledger.append(LedgerRecord(1, u, 0, t, [permuted("R", 0, lo, lo + 6,
                                                         lambda p: length - 1 - p)]))
    ledger.append(LedgerRecord(1, u + 1, 0, t + 1, [permuted("R1", 1, 0, 6, lambda p: p)]))
    return RunInput("ddp-to-one", attempts, ledger, [],
                    [generation("g", 0, 3, {"epoch": 0, "position": 18}, 3.5, world_size=2)],
                    first_event_at=0.0)


def test_ddp_on_two_processes_resumed_on_one_replays_the_samples_it_feeds_again():
    """Samples 0-17 were trained before the save; the new order feeds 39-4: 4-17 again
    (replayed 14). Samples 0-3 sit in the new order's last 4 positions, the drop_last remainder
    of a batch of 6, and were trained before anyway: nothing omitted."""
    analysis = analyze(ddp_to_one_run(), now=100.0)
    restart = analysis.restarts[0]
    assert (restart.replayed, restart.omitted, restart.verdict) == (14, 0, "replay")
    assert codes(restart) == ["replay", "world_size_changed", "order_changed"]
    assert (analysis.strata[0].duplicates, analysis.strata[0].omissions) == (14, 0)
