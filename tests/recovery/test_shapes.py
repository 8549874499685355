"""The remaining shapes of issue 25 (docs/definitions.md: #volatile-manifest-fields,
#renumbered-updates, #concurrent-attempts, #stale-state-and-stateless-optimizers,
#unknown-lineage-root), each with exact values."""
from __future__ import annotations

import hashlib

from test_definitions import (
    COMPONENTS,
    PER_UPDATE,
    W,
    generation,
    generation_run,
    reasons_of,
    strided,
)

from recoverydash.recovery import (
    AttemptRecord,
    GenerationRecord,
    LedgerRecord,
    RunInput,
    analyze,
    restore_plan,
)
from recoverydash.recovery.concurrency import stored_live_attempt
from recoverydash.recovery.inputs import same_manifest


def test_a_manifest_differing_only_in_committed_at_is_no_conflict():
    run = generation_run()
    gen = run.generations[0]
    first = gen.manifests[0]
    first["committed_at"] = "2026-11-01T00:00:20Z"
    again = dict(first, committed_at="2026-11-01T00:05:20Z")  # published again after a timeout
    assert same_manifest(first, again) and not same_manifest(first, dict(again, update=11))
    gen.manifests.append(again)
    assert gen.conflicting() == 1
    assert reasons_of(run) == ("restorable", set())
    analysis = analyze(run, now=30.0)
    assert analysis.last_restorable.committed_at == 1793491220.0  # the first one's stays
    gen.manifests.append(dict(again, world_size=16))
    assert gen.conflicting() == 2
    assert reasons_of(run) == ("rejected", {"manifest_conflict"})


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def two_shard_saves(optimizers: list) -> dict:
    """Attempt 0 commits updates 1..40 and saves g10, g20, ... at every tenth update, with
    shards rank0 and rank1 each holding a model and an optimizer object; ``optimizers[i]``:
    ``(rank0's, rank1's)`` optimizer sha256 of the i-th save (None: a digest of its own). Every
    model object is new at every save. Returns ``{generation_id: GenerationVerdict}``."""
    records = []
    for u in range(1, 41):
        records += strided(0, u, (u - 1) * PER_UPDATE, float(u))
    gens = []
    for i, pair in enumerate(optimizers, start=1):
        gid, u = f"g{10 * i}", 10 * i
        objects = [{"uri": f"file:///c/{gid}/{shard}/{c}", "shard": shard, "component": c,
                    "size": 1, "sha256": (pair[r] if c == "optimizer" and pair[r] is not None
                                          else sha(f"{gid}{shard}{c}"))}
                   for r, shard in enumerate(("rank0", "rank1")) for c in ("model", "optimizer")]
        gen = generation(gid, 0, u, u * PER_UPDATE, u + 0.5, objects=objects)
        gen.required_shards = ["rank0", "rank1"]
        gen.components = ["model", "optimizer"]
        gen.manifests[0].update(required_shards=["rank0", "rank1"],
                                components=["model", "optimizer"])
        gens.append(gen)
    run = RunInput("opt", [AttemptRecord(0, started_at=0.0, world_size=W, dataset_version="ds")],
                   records, generations=gens, contract={"required_components": ["model"]})
    return {g.generation_id: g for g in analyze(run, now=50.0).generations}


def test_an_optimizer_shard_repeating_while_another_changed_is_stale():
    # physicsnemo #2012: at g20 rank 0's optimizer was saved afresh, rank 1's repeats g10's bytes
    gens = two_shard_saves([(sha("o0-a"), sha("o1-a")), (sha("o0-b"), sha("o1-a"))])
    assert [(g.status, [r.code for r in g.reasons], [n.code for n in g.notes])
            for g in gens.values()] == [("restorable", [], []),
                                        ("rejected", ["stale_state"], [])]
    assert gens["g20"].reasons[0].detail == (
        "optimizer object file:///c/g20/rank1/optimizer repeats the sha256 of generation g10 "
        "(update 10): this save wrote the optimizer state (another optimizer object of this "
        "generation changed since the last save) of update 10 again, not that of update 20")
    # the same after a stateless-looking start: g20 repeats both (the note), g30 changes one
    gens = two_shard_saves([(sha("o0-a"), sha("o1-a")), (sha("o0-a"), sha("o1-a")),
                            (sha("o0-b"), sha("o1-a"))])
    assert [(g.status, [r.code for r in g.reasons], [n.code for n in g.notes])
            for g in gens.values()] == [("restorable", [], []),
                                        ("restorable", [], ["optimizer_stateless"]),
                                        ("rejected", ["stale_state"], [])]


def test_the_stateless_note_comes_once_when_every_optimizer_object_repeats():
    same = (sha("o0"), sha("o1"))
    gens = two_shard_saves([same, same, same, same])
    assert [(g.status, [n.code for n in g.notes]) for g in gens.values()] == [
        ("restorable", []), ("restorable", ["optimizer_stateless"]), ("restorable", []),
        ("restorable", [])]
    assert gens["g20"].notes[0].detail.startswith(
        "optimizer object file:///c/g20/rank0/optimizer has the same bytes (sha256) as in "
        "generation g10 (update 10)")
    # both shards saved afresh every time: no repeat, no note
    gens = two_shard_saves([(None, None)] * 3)
    assert [(g.status, g.notes) for g in gens.values()] == [("restorable", [])] * 3


def renumbered_run(saves_own: bool) -> RunInput:
    """torchtitan #571: attempt 0 commits updates 1..50 (64 positions each) and saves g45
    (cursor 2,880); attempt 1 restores g45 but numbers its updates 27..36, and its data starts
    40 positions early (2,840): those 40 are trained on twice. ``saves_own``: attempt 1 saves
    g30 at its own update 30 (cursor 2,840 + 4 x 64 = 3,096)."""
    records = []
    for u in range(1, 51):
        records += strided(0, u, (u - 1) * PER_UPDATE, float(u))
    for i, u in enumerate(range(27, 37)):
        records += strided(1, u, 2840 + i * PER_UPDATE, 200.0 + i)
    attempts = [
        AttemptRecord(0, started_at=0.0, world_size=W, dataset_version="ds",
                      micro_batch_size=2, grad_accum_steps=4, ended_at=60.0,
                      end_reason="failed", end_update=50),
        AttemptRecord(1, started_at=100.0, world_size=W, dataset_version="ds",
                      micro_batch_size=2, grad_accum_steps=4,
                      resumed_from={"generation_id": "g45", "update": 45}),
    ]
    gens = [generation("g45", 0, 45, 45 * PER_UPDATE, 46.0)]
    if saves_own:
        gens.append(generation("g30", 1, 30, 3096, 205.0))
    return RunInput("renumbered", attempts, records, [], gens, first_event_at=0.0)


def test_updates_renumbered_below_the_restored_update_are_still_the_attempts_own():
    analysis = analyze(renumbered_run(saves_own=False), now=300.0)
    (restart,) = analysis.restarts
    assert (restart.resumed_update, restart.replayed, restart.omitted, restart.verdict) == \
        (45, 40, 0, "replay")
    assert restart.lost_updates == 50 - 45
    assert restart.resume_cursor == [{"stratum": "main", "epoch": 0, "position": 2840}]
    findings = {f.code: f.detail for f in restart.findings}
    assert findings["update_mismatch"] == "first committed update 27, expected 46"
    assert findings["replay"] == "40 positions committed at or below update 45 consumed again"
    (main,) = analysis.strata
    assert (main.consumed, main.duplicates, main.omissions) == (55 * PER_UPDATE, 40, 0)
    assert analysis.last_restorable.generation_id == "g45"
    assert analysis.updates_at_risk == 10  # attempt 1's updates 27..36, all after g45
    assert analysis.health == "failing"  # the replay breaks the default contract (0)


def test_a_generation_of_the_renumbered_attempt_is_newer_than_the_one_it_restored():
    analysis = analyze(renumbered_run(saves_own=True), now=300.0)
    status = {g.generation_id: (g.status, [r.code for r in g.reasons])
              for g in analysis.generations}
    assert status == {"g30": ("restorable", []), "g45": ("restorable", [])}
    assert analysis.last_restorable.generation_id == "g30"  # later by commit, lower by number
    assert analysis.updates_at_risk == 6  # attempt 1's updates 31..36


def test_stale_state_compares_a_renumbered_attempts_save_in_the_order_of_commit():
    """attempt 1's g30 (its own update 30, after it restored g45) writes g45's model bytes
    again: g30 wrote old state; g45, saved before it, is not stale though its update is higher."""
    run = renumbered_run(saves_own=True)
    g45, g30 = run.generations
    objects = [dict(o, uri=o["uri"].replace("g45", "g30"), sha256=o["sha256"]
                    if o["component"] == "model" else hashlib.sha256(
                        o["uri"].replace("g45", "g30").encode()).hexdigest())
               for o in g45.manifests[0]["objects"]]
    run.generations[1] = generation("g30", 1, 30, 3096, 205.0, objects=objects)
    analysis = analyze(run, now=300.0)
    status = {g.generation_id: (g.status, [r.code for r in g.reasons])
              for g in analysis.generations}
    assert status == {"g30": ("rejected", ["stale_state"]), "g45": ("restorable", [])}
    (stale,) = [g for g in analysis.generations if g.generation_id == "g30"][0].reasons
    assert stale.detail.startswith(
        "model object file:///c/g30/rank0/model repeats the sha256 of generation g45 "
        "(update 45): this save wrote the model state of update 45 again, not that of "
        "update 30")
    assert analysis.last_restorable.generation_id == "g45"


def two_alive(zombie: bool) -> RunInput:
    """Attempt 0 commits updates 1..60 at 10 s each (update u at u x 10 s) and saves at 20, 40
    and 60. ``zombie`` False: a requeued duplicate, attempt 1, starts at 250 s from g20 and
    cancels itself at 251 s while attempt 0 goes on. True: attempt 1 is a real restart from g40
    at 410 s that commits updates 41..50 from 420 s, while attempt 0, a zombie, goes on too."""
    records = []
    for u in range(1, 61):
        records += strided(0, u, (u - 1) * PER_UPDATE, u * 10.0)
    gens = [generation(f"g{u}", 0, u, u * PER_UPDATE, u * 10.0 + 5) for u in (20, 40, 60)]
    first = AttemptRecord(0, started_at=0.0, world_size=W, dataset_version="ds",
                          last_event_at=600.0)
    if zombie:
        for i, u in enumerate(range(41, 51)):
            records += strided(1, u, (u - 1) * PER_UPDATE, 420.0 + 10 * i)
        second = AttemptRecord(1, started_at=410.0, world_size=W, dataset_version="ds",
                               resumed_from={"generation_id": "g40", "update": 40},
                               last_event_at=510.0)
    else:
        second = AttemptRecord(1, started_at=250.0, world_size=W, dataset_version="ds",
                               resumed_from={"generation_id": "g20", "update": 20},
                               ended_at=251.0, end_reason="cancelled", last_event_at=251.0)
    return RunInput("two-alive", [first, second], records, [], gens, first_event_at=0.0)


def test_a_cancelled_duplicate_launch_leaves_the_original_attempt_live():
    analysis = analyze(two_alive(zombie=False), now=610.0)
    assert (analysis.live_attempt, analysis.health, analysis.ended_at) == (0, "ok", None)
    assert analysis.last_restorable.generation_id == "g60"
    assert analysis.updates_at_risk == 0
    assert restore_plan(analysis).body["generation_id"] == "g60"
    (restart,) = analysis.restarts
    codes = [f.code for f in restart.findings]
    assert "concurrent_attempts" in codes and "clock_skew" not in codes
    assert (restart.lost_seconds, restart.recovery_seconds, restart.lost_updates,
            restart.verdict) == (None, None, 0, "unverified")
    assert dict((f.code, f.detail) for f in restart.findings)["concurrent_attempts"] == (
        "attempt 0 was still committing after attempt 1 started at 1970-01-01T00:04:10+00:00: "
        "35 updates (up to update 60), the last at 1970-01-01T00:10:00+00:00 (trainers' "
        "clocks). Two attempts were alive at once (a duplicate launch, or a zombie); "
        "attempt 0 had not failed, so no lost or recovery seconds are measured")
    (main,) = analysis.strata
    assert (main.consumed, main.duplicates, main.omissions) == (60 * PER_UPDATE, 0, 0)


def test_a_zombie_beside_its_restart_is_concurrent_not_clock_skew():
    analysis = analyze(two_alive(zombie=True), now=610.0)
    assert analysis.live_attempt == 1 and analysis.health == "ok"
    assert analysis.last_restorable.generation_id == "g40"
    assert analysis.updates_at_risk == 10
    (restart,) = analysis.restarts
    codes = [f.code for f in restart.findings]
    assert "concurrent_attempts" in codes and "clock_skew" not in codes
    assert (restart.lost_seconds, restart.recovery_seconds, restart.lost_updates) == \
        (None, None, 60 - 40)  # the zombie's updates 41..60 are not in the live lineage
    assert (restart.replayed, restart.omitted, restart.verdict) == (0, 0, "exact")


def resumed_unknown(cursor: list, first_epoch: int) -> RunInput:
    """The only attempt the server heard of, attempt 1 (attempt 0 was killed within a second,
    nothing of it arrived), resumes from generation gX, which the server never saw, at update 3
    with ``cursor``; it commits updates 4..6 of 20 positions each from ``first_epoch``, position
    0, of a 120-position epoch."""
    records = [LedgerRecord(1, u, None, 100.0 + u, [{"stratum": "main", "epoch": first_epoch,
                                                     "ranges": [[(u - 4) * 20, (u - 3) * 20]]}])
               for u in range(4, 7)]
    attempt = AttemptRecord(1, started_at=50.0, world_size=1, global_batch_size=20,
                            sampler={"epoch_length": {"main": 120}},
                            resumed_from={"generation_id": "gX", "update": 3, "cursor": cursor})
    return RunInput("unknown-root", [attempt], records, [], [], first_event_at=50.0)


def test_positions_before_the_resume_of_an_unknown_root_are_never_omissions():
    # the cursor names epoch 0 at 60; tracking starts at epoch 1: epoch 0's tail came before the
    # resume, unknown (it was 60 omissions); positions behind the cursor count as consumed
    (main,) = analyze(resumed_unknown([{"stratum": "main", "epoch": 0, "position": 60}], 1),
                      now=200.0).strata
    assert (main.consumed, main.duplicates, main.omissions) == (60 + 60, 0, 0)
    # nor is an epoch between the cursor's and the first tracked one skipped whole
    (main,) = analyze(resumed_unknown([{"stratum": "main", "epoch": 0, "position": 60}], 2),
                      now=200.0).strata
    assert (main.consumed, main.omissions) == (60 + 60, 0)
    # once tracked, an epoch left early still owes its tail: epoch 1 at 60 of 120, then epoch 2
    run = resumed_unknown([{"stratum": "main", "epoch": 0, "position": 60}], 1)
    run.ledger.append(LedgerRecord(1, 7, None, 107.0, [{"stratum": "main", "epoch": 2,
                                                        "ranges": [[0, 20]]}]))
    (main,) = analyze(run, now=200.0).strata
    assert main.omissions == 120 - 60


def test_readers_of_stored_state_take_the_live_attempt_from_the_analysis():
    stored = analyze(two_alive(zombie=False), now=610.0).to_dict()
    assert (stored["live_attempt"], stored["newest_attempt"]) == (0, 1)
    # the duplicate (newest) ended: the stored live attempt, seen by that analysis
    assert stored_live_attempt(stored, 1, True) == 0
    # the newest attempt has not ended: it is live, whatever was stored
    assert stored_live_attempt(stored, 1, False) == 1
    # an attempt 2 the analysis never saw ended: nothing says an older one is live
    assert stored_live_attempt(stored, 2, True) == 2
    # no analysis, or one stored before the figure
    assert stored_live_attempt(None, 1, True) == 1
    assert stored_live_attempt({"health": "ok"}, 1, True) == 1
    assert stored_live_attempt(None, None, False) is None
    zombie = analyze(two_alive(zombie=True), now=610.0).to_dict()
    assert (zombie["live_attempt"], zombie["newest_attempt"]) == (1, 1)


CURSOR_60 = [{"stratum": "main", "epoch": 0, "position": 60}]


def unseen_writer(found: bool, start: int = 60, cursor=CURSOR_60) -> RunInput:
    """docs/definitions.md#resume-from-a-generation-the-server-had-not-seen. Attempt 0 was
    killed within a second of its first event: nothing of it arrived. Attempt 1 resumes gX (its
    update 3, data cursor epoch 0 at 60 of a 120-position epoch) and commits updates 4..6 of 20
    positions each from ``start``. ``found``: gX's manifest (attempt 0's, ``cursor``) was found
    in the run's storage location and reported (a ``checkpoint_committed`` under attempt 0, as
    discovery reports it); else the server never saw gX."""
    records = [LedgerRecord(1, u, None, 100.0 + u, [{"stratum": "main", "epoch": 0, "ranges": [
        [start + (u - 4) * 20, start + (u - 3) * 20]]}]) for u in range(4, 7)]
    attempt = AttemptRecord(1, started_at=50.0, world_size=1, global_batch_size=20,
                            sampler={"epoch_length": {"main": 120}},
                            resumed_from={"generation_id": "gX", "update": 3,
                                          "cursor": CURSOR_60})
    gens = []
    if found:
        objects = [{"uri": f"file:///c/gX/{c}", "shard": "rank0", "component": c, "size": 1,
                    "sha256": hashlib.sha256(c.encode()).hexdigest()} for c in COMPONENTS]
        manifest = {"schema_revision": 1, "generation_id": "gX", "update": 3, "world_size": 1,
                    "required_shards": ["rank0"], "components": COMPONENTS, "objects": objects,
                    "attempt": 0, "data_progress": {"cursor": cursor}, "committed_at": None}
        gens.append(GenerationRecord("gX", 0, None, manifests=[manifest], committed_at=40.0,
                                     object_checks={o["uri"]: "ok" for o in objects}))
    return RunInput("unseen", [attempt], records, [], gens, first_event_at=50.0)


def test_the_first_attempt_heard_of_resuming_an_unknown_generation_has_a_restart_row():
    analysis = analyze(unseen_writer(found=False), now=200.0)
    (restart,) = analysis.restarts
    assert (restart.attempt, restart.resumed_from, restart.resumed_update, restart.verdict,
            restart.replayed, restart.omitted, restart.lost_updates, restart.lost_seconds,
            restart.recovery_seconds) == (1, "gX", 3, "unverified", 0, 0, 0, None, None)
    assert restart.resume_cursor == CURSOR_60 and restart.expected_cursor == []
    assert [(f.code, f.detail) for f in restart.findings] == [
        ("predecessor_unknown",
         "attempt 1 is the first attempt the server heard of, and it resumed from 'gX' at "
         "update 3: nothing of the attempts before it arrived, so what they consumed is "
         "unknown: replay and omission unknown; positions before the resume are not counted "
         "as omissions"),
        ("resumed_from_unknown", "generation 'gX' is not known")]
    (main,) = analysis.strata  # truth: 0 omitted; [0, 60) behind the cursor, then [60, 120)
    assert (main.consumed, main.duplicates, main.omissions) == (120, 0, 0)
    assert analysis.generations == []


def test_a_found_manifest_of_an_unseen_writer_is_listed_and_its_cursor_decides():
    analysis = analyze(unseen_writer(found=True), now=200.0)
    (gen,) = analysis.generations
    assert (gen.generation_id, gen.status, [(n.code, n.detail) for n in gen.notes]) == (
        "gX", "restorable", [("data_cursor_unchecked",
                              "nothing of attempt 0, which wrote it, reached the server: its "
                              "data cursor could not be compared with what the model received")])
    assert analysis.last_restorable.generation_id == "gX"
    (restart,) = analysis.restarts
    assert (restart.attempt, restart.resumed_from, restart.verdict, restart.replayed,
            restart.omitted, restart.lost_updates, restart.lost_seconds) == \
        (1, "gX", "exact", 0, 0, 0, None)
    assert restart.expected_cursor == CURSOR_60 == restart.resume_cursor
    assert {f.code for f in restart.findings} == set()
    (main,) = analysis.strata
    assert (main.consumed, main.duplicates, main.omissions) == (120, 0, 0)
    # attempt 1 starting at 40: 20 positions below the manifest's cursor fed again
    (restart,) = analyze(unseen_writer(found=True, start=40), now=200.0).restarts
    assert (restart.verdict, restart.replayed, restart.omitted) == ("replay", 20, 0)


def test_a_found_manifest_without_a_data_cursor_proves_nothing():
    (restart,) = analyze(unseen_writer(found=True, cursor=[]), now=200.0).restarts
    assert (restart.verdict, restart.replayed, restart.omitted) == ("unverified", 0, 0)
    assert [(f.code, f.detail) for f in restart.findings] == [(
        "predecessor_unknown",
        "nothing of attempt 0, which wrote gX, reached the server, and the generation's data "
        "cursor names no position of main: what was consumed before update 3 is unknown, so "
        "replay and omission are unknown")]


def test_a_resumed_generation_the_server_has_not_seen_is_undecided_on_the_live_lineage():
    # docs/definitions.md#undecided-generations: gX may still arrive (or be found in storage):
    # until then the live lineage's root is unknown, and rules wait for it as for any generation
    # not decided yet, from the attempt's start (50 s)
    analysis = analyze(unseen_writer(found=False), now=200.0)
    assert analysis.undecided == [{"generation_id": "gX", "update": 3, "committed_at": 50.0,
                                   "live": True, "reasons": ["resumed_from_not_seen"]}]
    # once its manifest is in, it is an ordinary generation (here restorable): no entry
    assert analyze(unseen_writer(found=True), now=200.0).undecided == []


def test_a_later_attempts_save_of_the_same_update_with_the_same_bytes_is_not_stale():
    """HF Trainer resumed from update 5 re-runs updates 6..10 deterministically and rewrites
    checkpoint-10 with the bytes attempt 0 wrote there: the same state of the same update, not
    old state. A save at update 15 repeating update 10's model bytes is stale."""
    from recoverydash.recovery.generations import state_repeats

    def same_as(gid, source):
        return [dict(o, uri=o["uri"].replace(source.generation_id, gid))
                for o in source.manifests[0]["objects"]]

    g5 = generation("u5-a0", 0, 5, 40, 50.0)
    g10 = generation("u10-a0", 0, 10, 80, 100.0)
    again = generation("u10-a1", 1, 10, 80, 200.0, objects=same_as("u10-a1", g10))
    late = generation("u15-a1", 1, 15, 120, 250.0, objects=same_as("u15-a1", g10))
    got = state_repeats([g5, g10, again, late])
    assert {gid: bool(stale) for gid, (stale, _) in got.items()} == {
        "u5-a0": False, "u10-a0": False, "u10-a1": False, "u15-a1": True}
    assert got["u15-a1"][0][0] == (
        "model object file:///c/u15-a1/rank0/model repeats the sha256 of generation u10-a0 "
        "(update 10): this save wrote the model state of update 10 again, not that of "
        "update 15")
