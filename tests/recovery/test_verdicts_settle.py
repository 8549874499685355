"""Verdicts that settle (docs/definitions.md#writer-of-a-generation,
#lost-updates-from-an-untracked-state, #incomplete-first-update, #updates-counted-once-complete,
#stale-state-and-stateless-optimizers): a restart is decided once the evidence is complete, by
the attempt that really wrote what it resumed, and nothing incomplete is counted."""
from __future__ import annotations

import hashlib

from recoverydash.recovery import DEFAULT_CONTRACT, RunInput, analyze, parse_time

W = 4
T0 = parse_time("2026-11-01T00:00:00Z")  # the events' clock starts here


def at(t: int) -> str:
    return f"2026-11-01T00:{t // 60:02d}:{t % 60:02d}Z"


def started(attempt, resumed=None, t=0, contract=None):
    ev = {"event_id": f"s{attempt}", "type": "attempt_started", "run_id": "r",
          "attempt": attempt, "time": at(t), "world_size": W,
          "dataset_version": "v", "global_batch_size": W * 2}
    if resumed:
        ev["resumed_from"] = resumed
    return ev


def update(attempt, u, rank, t, shift=0):
    """Rank ``rank``'s share of update ``u``: strided over the 8 positions of the update."""
    start = (u - 1) * W * 2 + shift
    return {"event_id": f"u{attempt}-{u}-{rank}", "type": "update_committed", "run_id": "r",
            "attempt": attempt, "rank": rank, "time": at(t), "update": u,
            "spans": [{"stratum": "m", "epoch": 0, "ranges": [[start + rank, start + W * 2, W]]}]}


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def committed(gid, attempt, u, t, manifest_attempt=None, digests=None):
    """A manifest of generation ``gid`` at update ``u``, one object per required component on
    shard s0; ``digests`` overrides a component's sha256 (else one of its own)."""
    digests = digests or {}
    objects = [{"uri": f"file:///c/{gid}/{c}", "shard": "s0", "component": c, "size": 1,
                "sha256": digests.get(c, digest(gid + c))}
               for c in DEFAULT_CONTRACT["required_components"]]
    manifest = {"schema_revision": 1, "generation_id": gid, "update": u, "world_size": W,
                "required_shards": ["s0"], "components": [], "objects": objects,
                "data_progress": {"cursor": [{"stratum": "m", "epoch": 0, "position": u * 8}]},
                "dataset_version": "v", "committed_at": at(t)}
    if manifest_attempt is not None:
        manifest["attempt"] = manifest_attempt
    return {"event_id": f"c{gid}-{attempt}", "type": "checkpoint_committed", "run_id": "r",
            "attempt": attempt, "time": at(t), "manifest": manifest}


def two_attempts(commit_by, manifest_attempt=None):
    """Attempt 0 commits updates 1..3 and saves g2; attempt 1 resumes g2 and commits 3, 4
    (exact). The commit of g2 is reported by attempt ``commit_by``."""
    events = [started(0)] + [update(0, u, r, u) for u in (1, 2, 3) for r in range(W)]
    events.append(committed("g2", commit_by, 2, 12, manifest_attempt))
    cursor = [{"stratum": "m", "epoch": 0, "position": 16}]
    events.append(started(1, {"generation_id": "g2", "update": 2, "cursor": cursor}, 10))
    events += [update(1, u, r, 10 + u) for u in (3, 4) for r in range(W)]
    return analyse(events)


def analyse(events, now=T0 + 1e8):
    """The analysis of ``events`` with every object of every manifest verified ``ok``."""
    checks = {o["uri"]: "ok" for ev in events if ev["type"] == "checkpoint_committed"
              for o in ev["manifest"]["objects"]}
    return analyze(RunInput.from_events(events, object_checks=checks), now=now)


def test_it_takes_the_writer_of_a_generation_reported_by_a_later_attempt_from_the_ledger():
    analysis = two_attempts(commit_by=1)
    (gen,) = analysis.generations
    assert (gen.generation_id, gen.attempt, gen.status) == ("g2", 0, "restorable")
    restart = analysis.restarts[0]
    assert (restart.verdict, restart.resumed_from, restart.lost_updates) == ("exact", "g2", 1)
    assert "resumed_from_unknown" not in {f.code for f in restart.findings}
    assert analysis.last_restorable.generation_id == "g2"


def test_it_takes_the_writer_of_a_generation_from_the_manifests_own_attempt():
    analysis = two_attempts(commit_by=1, manifest_attempt=0)
    assert analysis.generations[0].attempt == 0
    assert analysis.restarts[0].verdict == "exact"


def test_it_counts_lost_updates_of_a_restart_from_an_untracked_state():
    events = [started(0)] + [update(0, u, r, u) for u in range(1, 7) for r in range(W)]
    events.append(started(1, {"generation_id": "gNOPE", "update": 4,
                              "cursor": [{"stratum": "m", "epoch": 0, "position": 32}]}, 20))
    events += [update(1, u, r, 20 + u) for u in (5, 6) for r in range(W)]
    restart = analyse(events).restarts[0]
    # last committed update of attempt 0 (6) minus U (4)
    assert (restart.verdict, restart.lost_updates, restart.lost_seconds) == ("unverified", 2, None)
    assert "resumed_from_unknown" in {f.code for f in restart.findings}


def first_update_missing(ranks_of_first_update, later_updates, now=T0 + 60, settle=300.0):
    """Attempt 0 commits 1, 2 (g2, cursor 16); attempt 1 resumes g2 at ``shift`` 0 (exact):
    only ``ranks_of_first_update`` report its update 3; ``later_updates`` complete updates
    follow."""
    events = [started(0)] + [update(0, u, r, u) for u in (1, 2) for r in range(W)]
    events.append(committed("g2", 0, 2, 3))
    cursor = [{"stratum": "m", "epoch": 0, "position": 16}]
    events.append(started(1, {"generation_id": "g2", "update": 2, "cursor": cursor}, 10))
    events += [update(1, 3, r, 11) for r in ranks_of_first_update]
    events += [update(1, u, r, 11 + u) for u in range(4, 4 + later_updates) for r in range(W)]
    checks = {o["uri"]: "ok" for ev in events if ev["type"] == "checkpoint_committed"
              for o in ev["manifest"]["objects"]}
    return analyze(RunInput.from_events(events, object_checks=checks), now=now,
                   settle_seconds=settle)


def test_it_decides_a_restart_whose_first_update_stays_incomplete_once_later_updates_are_complete():
    waiting = first_update_missing([1, 2, 3], 0).restarts[0]
    assert waiting.verdict == "unverified"
    assert "incomplete_first_update" not in {f.code for f in waiting.findings}
    settled = first_update_missing([1, 2, 3], 2).restarts[0]
    # rank 0's position 16 never arrived: the gap [16, 17) fits the 2 positions its part holds
    assert (settled.verdict, settled.replayed, settled.omitted) == ("exact", 0, 0)
    (finding,) = [f for f in settled.findings if f.code == "incomplete_first_update"]
    assert finding.detail.startswith("rank 0 of 4 never reported update 3")
    assert "up to 2 positions" in finding.detail


def test_it_decides_an_incomplete_first_update_after_the_settle_delay():
    # first reports at 2026-11-01T00:00:11Z; the analysis 301 s later, no later update
    young = first_update_missing([1, 2, 3], 0, now=T0 + 11 + 299).restarts[0]
    old = first_update_missing([1, 2, 3], 0, now=T0 + 11 + 301).restarts[0]
    assert (young.verdict, old.verdict) == ("unverified", "exact")


def test_it_still_finds_a_replay_when_the_first_update_stays_incomplete():
    events = [started(0)] + [update(0, u, r, u) for u in (1, 2, 3) for r in range(W)]
    events.append(committed("g2", 0, 2, 3))
    cursor = [{"stratum": "m", "epoch": 0, "position": 8}]  # the trainer's loader went back 8
    events.append(started(1, {"generation_id": "g2", "update": 2, "cursor": cursor}, 10))
    events += [update(1, 3, r, 11, shift=-8) for r in (1, 2, 3)]
    events += [update(1, u, r, 11 + u, shift=-8) for u in (4, 5) for r in range(W)]
    restart = analyse(events).restarts[0]
    assert (restart.verdict, restart.replayed, restart.omitted) == ("replay", 6, 0)
    assert "incomplete_first_update" in {f.code for f in restart.findings}


def test_it_counts_an_update_only_once_every_rank_reported_it():
    events = [started(0)] + [update(0, u, r, u) for u in (1, 2) for r in range(W)]
    events += [update(0, 3, r, 3) for r in (1, 2, 3)]  # rank 0's part of update 3 on its way
    t = T0
    (stratum,) = analyse(events, now=t + 10).strata
    assert (stratum.consumed, stratum.omissions) == (16, 0)
    events.append(update(0, 3, 0, 4))
    (stratum,) = analyse(events, now=t + 10).strata
    assert (stratum.consumed, stratum.omissions) == (24, 0)
    # never arriving, but a later update complete: counted as it stands (16, 20 never reported)
    events = events[:-1] + [update(0, 4, r, 5) for r in range(W)]
    (stratum,) = analyse(events, now=t + 10).strata
    assert (stratum.consumed, stratum.omissions) == (30, 2)


def saves(model_digests, optimizer_digests):
    """Attempt 0 commits updates 1..6 and saves g1..g6 (update = index), with the given model
    and optimizer sha256 per generation (None: a digest of its own)."""
    events = [started(0)] + [update(0, u, r, u) for u in range(1, 7) for r in range(W)]
    for u, (m, o) in enumerate(zip(model_digests, optimizer_digests), start=1):
        fixed = {c: d for c, d in (("model", m), ("optimizer", o)) if d is not None}
        events.append(committed(f"g{u}", 0, u, 10 + u, digests=fixed))
    return {g.generation_id: g for g in analyse(events).generations}


def test_it_reports_an_optimizer_that_never_changed_once_as_stateless_not_stale():
    gens = saves([None] * 6, [digest("sgd")] * 6)
    assert {g.status for g in gens.values()} == {"restorable"}
    found = [(gid, f.code) for gid, g in gens.items() for f in g.notes]
    assert found == [("g2", "optimizer_stateless")]
    assert "generation g1 (update 1)" in gens["g2"].notes[0].detail


def test_it_rejects_an_optimizer_repeating_old_bytes_after_it_had_changed():
    # the optimizer changed between g1 and g2, then g3 wrote g2's bytes again
    gens = saves([None] * 3, [digest("a"), digest("b"), digest("b")])
    assert [gens[g].status for g in ("g1", "g2", "g3")] == ["restorable", "restorable",
                                                            "rejected"]
    (reason,) = gens["g3"].reasons
    assert reason.code == "stale_state"
    assert reason.detail == ("optimizer object file:///c/g3/optimizer repeats the sha256 of "
                             "generation g2 (update 2): this save wrote the optimizer state (it "
                             "had changed between earlier generations) of update 2 again, not "
                             "that of update 3")


def test_it_rejects_a_model_object_repeating_an_earlier_generations_digest():
    gens = saves([None, digest("m1"), digest("m1")], [None] * 3)
    assert [gens[g].status for g in ("g1", "g2", "g3")] == ["restorable", "restorable",
                                                            "rejected"]
    assert gens["g3"].reasons[0].detail.startswith(
        "model object file:///c/g3/model repeats the sha256 of generation g2 (update 2): this "
        "save wrote the model state of update 2 again")
