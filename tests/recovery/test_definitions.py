"""Exact values from docs/definitions.md and its worked example (#worked-example)."""
from __future__ import annotations

import hashlib

import pytest

from recoverydash.recovery import (
    AttemptRecord,
    GenerationRecord,
    HeartbeatRecord,
    Ledger,
    LedgerRecord,
    RunInput,
    analyze,
    identity_position,
    restore_plan,
)

W, MICRO, ACCUM = 8, 2, 4
PER_UPDATE = W * MICRO * ACCUM  # 64 positions per update (the worked example)
COMPONENTS = ["model", "optimizer", "scheduler", "rng", "data_progress"]
SHARDS = ["rank0", "rank1", "rank2", "rank3"]


def strided(attempt, update, start, time):
    """Rank r of 8 owns start + r, start + r + 8, ... of one 64-position update."""
    return [LedgerRecord(attempt, update, r, time,
                         [{"stratum": "main", "epoch": 0,
                           "ranges": [[start + r, start + PER_UPDATE, W]]}]) for r in range(W)]


def generation(gid, attempt, update, cursor, when, world_size=W, objects=None, checks="ok"):
    objects = objects if objects is not None else [
        {"uri": f"file:///c/{gid}/{s}/{c}", "shard": s, "component": c, "size": 1,
         "sha256": hashlib.sha256(f"{gid}{s}{c}".encode()).hexdigest()}
        for s in SHARDS for c in COMPONENTS]
    manifest = {"schema_revision": 1, "generation_id": gid, "update": update,
                "world_size": world_size, "required_shards": SHARDS,
                "components": COMPONENTS, "objects": objects,
                "data_progress": {"cursor": [{"stratum": "main", "epoch": 0, "position": cursor}]},
                "dataset_version": "ds", "committed_at": None}
    return GenerationRecord(gid, attempt, update, started_at=when - 2,
                            required_shards=SHARDS, components=COMPONENTS,
                            manifests=[manifest], committed_at=when,
                            object_checks={o["uri"]: checks for o in objects})


def worked_example(resume_at, updates_before=1250, after=10):
    """The worked example: generation at update 1,250 (cursor 80,000), read cursor 80,048 at the
    crash."""
    ledger = []
    for u in range(1, updates_before + 1):
        ledger += strided(0, u, (u - 1) * PER_UPDATE, float(u))
    for i in range(after):
        ledger += strided(1, 1251 + i, resume_at + i * PER_UPDATE, 2000.0 + i)
    attempts = [
        AttemptRecord(0, started_at=0.0, world_size=W, dataset_version="ds",
                      micro_batch_size=MICRO, grad_accum_steps=ACCUM, ended_at=1300.0,
                      end_reason="failed", end_update=1250,
                      end_fetched=[{"stratum": "main", "epoch": 0, "position": 80_048}]),
        AttemptRecord(1, started_at=1900.0, world_size=W, dataset_version="ds",
                      micro_batch_size=MICRO, grad_accum_steps=ACCUM,
                      resumed_from={"generation_id": "g1250", "update": 1250, "cursor": [
                          {"stratum": "main", "epoch": 0, "position": resume_at}]}),
    ]
    return RunInput("worked-example", attempts, ledger, [],
                    [generation("g1250", 0, 1250, 80_000, 1255.0)], first_event_at=0.0)


@pytest.mark.parametrize("resume_at, replayed, omitted, recomputed, verdict", [
    (80_000, 0, 0, 48, "exact"),
    (80_048, 0, 48, 0, "omission"),
    (79_936, 64, 0, 48, "replay"),
])
def test_it_reproduces_the_worked_example(resume_at, replayed, omitted, recomputed, verdict):
    analysis = analyze(worked_example(resume_at), now=2100.0)
    restart = analysis.restarts[0]
    assert restart.expected_cursor == [{"stratum": "main", "epoch": 0, "position": 80_000}]
    assert (restart.replayed, restart.omitted, restart.recomputed, restart.verdict) == \
        (replayed, omitted, recomputed, verdict)
    assert restart.lost_updates == 0
    assert restart.lost_seconds == 1300.0 - 1250.0
    assert restart.recovery_seconds == 2000.0 - 1300.0
    main = analysis.strata[0]
    assert (main.duplicates, main.omissions) == (replayed, omitted)
    assert main.consumed == 1260 * PER_UPDATE
    assert analysis.generations[0].status == "restorable"


def test_it_counts_padding_as_no_duplicate():
    spans = [{"stratum": "s", "epoch": 0, "ranges": [[0, 4]]},
             {"stratum": "s", "epoch": 0, "ranges": [[0, 2]], "padding": True}]
    run = RunInput("p", [AttemptRecord(0, started_at=0.0)], [LedgerRecord(0, 1, 0, 1.0, spans)])
    row = analyze(run, now=2.0).strata[0]
    assert (row.consumed, row.duplicates, row.omissions) == (4, 0, 0)


def test_it_unites_reports_of_one_rank_and_counts_two_ranks_twice():
    span = {"stratum": "s", "epoch": 0, "ranges": [[0, 4]]}
    records = [LedgerRecord(0, 1, 0, 1.0, [span]), LedgerRecord(0, 1, 0, 1.5, [span]),
               LedgerRecord(0, 1, 0, 1.6, [{"stratum": "s", "epoch": 0, "ranges": [[2, 6]]}]),
               LedgerRecord(0, 1, 1, 1.0, [span]), LedgerRecord(0, 1, None, 1.0, [span])]
    row = analyze(RunInput("u", [AttemptRecord(0, started_at=0.0)], records), now=2.0).strata[0]
    # rank 0: {0..5} (6), rank 1: {0..3} (4), coordinator: {0..3} (4)
    assert (row.consumed, row.duplicates, row.omissions) == (14, 8, 0)
    assert row.duplicate_rate == 8 / 14


def test_it_never_counts_an_epoch_revisit_or_another_order_as_duplicate():
    records = [LedgerRecord(0, 1, 0, 1.0, [{"stratum": "s", "epoch": 0, "ranges": [[0, 10]]}]),
               LedgerRecord(0, 2, 0, 2.0, [{"stratum": "s", "epoch": 1, "ranges": [[0, 10]]}]),
               LedgerRecord(0, 3, 0, 3.0, [{"stratum": "s", "epoch": 1, "order": "b",
                                            "ranges": [[0, 10]]}])]
    row = analyze(RunInput("e", [AttemptRecord(0, started_at=0.0)], records), now=4.0).strata[0]
    assert (row.consumed, row.duplicates, row.omissions) == (30, 0, 0)


@pytest.mark.parametrize("length, batch, omissions", [
    (110, 64, 10 + 0),    # tail of 10 is shorter than one global batch: drop_last, no omission
    (200, 64, 10 + 100),  # tail of 100 counts once the lineage moved on
    (None, 64, 10),       # epoch length unknown: no tail
])
def test_it_applies_the_epoch_tail_rule(length, batch, omissions):
    sampler = {"epoch_length": {"s": length}} if length else {}
    records = [LedgerRecord(0, 1, 0, 1.0, [{"stratum": "s", "epoch": 0, "ranges": [[0, 50]]}]),
               LedgerRecord(0, 2, 0, 2.0, [{"stratum": "s", "epoch": 0, "ranges": [[60, 100]]}]),
               LedgerRecord(0, 3, 0, 3.0, [{"stratum": "s", "epoch": 1, "ranges": [[0, 64]]}])]
    attempt = AttemptRecord(0, started_at=0.0, global_batch_size=batch, sampler=sampler)
    row = analyze(RunInput("t", [attempt], records), now=4.0).strata[0]
    assert row.omissions == omissions
    assert row.omission_rate == omissions / (omissions + 154)


def token_run(resume_at, with_samples_stratum=False):
    """docs/definitions.md#units: a packed stream of 512-token sequences (stratum ``text``, units
    tokens), one update per sequence; a generation at update 2 (cursor 1,024 tokens); attempt 1
    resumes from it with its stream at ``resume_at``; beside it, optionally, a samples stratum
    ``img`` of 4 samples per update."""
    def spans(start, update):
        out = [{"stratum": "text", "epoch": 0, "ranges": [[start, start + 512]]}]
        if with_samples_stratum:
            out.append({"stratum": "img", "epoch": 0, "ranges": [[(update - 1) * 4, update * 4]]})
        return out
    ledger = [LedgerRecord(0, u, 0, float(u), spans((u - 1) * 512, u)) for u in (1, 2, 3)]
    ledger += [LedgerRecord(1, 3 + i, 0, 100.0 + i, spans(resume_at + i * 512, 3 + i))
               for i in range(2)]
    sampler = {"units": {"text": "tokens"}, "epoch_length": {"text": 100_000}}
    cursor = [{"stratum": "text", "epoch": 0, "position": 1024}]
    if with_samples_stratum:
        cursor.append({"stratum": "img", "epoch": 0, "position": 8})
    objects = [{"uri": f"file:///c/g2/rank0/{c}", "shard": "rank0", "component": c, "size": 1,
                "sha256": hashlib.sha256(c.encode()).hexdigest()} for c in COMPONENTS]
    manifest = {"schema_revision": 1, "generation_id": "g2", "update": 2, "world_size": 1,
                "required_shards": ["rank0"], "components": COMPONENTS, "objects": objects,
                "data_progress": {"cursor": cursor}, "dataset_version": "ds",
                "committed_at": None}
    gen = GenerationRecord("g2", 0, 2, started_at=2.0, required_shards=["rank0"],
                           components=COMPONENTS, manifests=[manifest], committed_at=2.5,
                           object_checks={o["uri"]: "ok" for o in objects})
    attempts = [AttemptRecord(0, started_at=0.0, world_size=1, dataset_version="ds",
                              global_batch_size=512, sampler=sampler, ended_at=50.0,
                              end_reason="failed", end_update=3),
                AttemptRecord(1, started_at=90.0, world_size=1, dataset_version="ds",
                              global_batch_size=512, sampler=sampler,
                              resumed_from={"generation_id": "g2", "update": 2})]
    return RunInput("tokens", attempts, ledger, [], [gen], first_event_at=0.0)


@pytest.mark.parametrize("resume_at, replayed, omitted", [
    (1024, 0, 0),    # the checkpoint's cursor: exact
    (512, 512, 0),   # one sequence early: its 512 tokens are trained on twice
    (1236, 0, 212),  # the rest of a document cut at token 300 of a sequence was dropped
])
def test_a_token_stratum_counts_tokens_and_says_so(resume_at, replayed, omitted):
    analysis = analyze(token_run(resume_at), now=200.0)
    restart = analysis.restarts[0]
    assert (restart.replayed, restart.omitted, restart.units) == (replayed, omitted, "tokens")
    assert restart.to_dict()["units"] == "tokens"
    text = analysis.strata[0]
    assert (text.stratum, text.units, text.duplicates, text.omissions) == \
        ("text", "tokens", replayed, omitted)
    assert text.consumed == 4 * 512  # update 3 of attempt 0 was rolled back
    assert text.to_dict()["units"] == "tokens"


@pytest.mark.parametrize("resume_at, finding", [
    (512, ("replay", "512 tokens committed at or below update 2 consumed again")),
    (1236, ("omission", "212 tokens skipped at the resume")),
])
def test_a_token_restarts_findings_count_tokens_in_words(resume_at, finding):
    """docs/definitions.md#units: the findings of a restart over a token stratum say "tokens"."""
    restart = analyze(token_run(resume_at), now=200.0).restarts[0]
    assert [(f.code, f.detail) for f in restart.findings] == [finding]


def test_a_mixed_restarts_findings_name_both_units():
    restart = analyze(token_run(512, with_samples_stratum=True), now=200.0).restarts[0]
    assert [(f.code, f.detail) for f in restart.findings] == [
        ("replay", "512 positions (samples and tokens) committed at or below update 2 consumed "
                   "again")]


def test_the_words_of_each_unit():
    from recoverydash.recovery.counting import unit_word

    assert [unit_word(u) for u in ("tokens", "samples", "mixed", None)] == [
        "tokens", "positions", "positions (samples and tokens)", "positions"]


def test_a_restart_over_strata_of_both_units_says_mixed():
    analysis = analyze(token_run(512, with_samples_stratum=True), now=200.0)
    assert (analysis.restarts[0].replayed, analysis.restarts[0].units) == (512, "mixed")
    units = {s.stratum: s.units for s in analysis.strata}
    assert units == {"img": "samples", "text": "tokens"}


def test_it_counts_positions_behind_an_untracked_cursor_as_consumed():
    attempt = AttemptRecord(0, started_at=0.0, resumed_from={
        "generation_id": None, "update": 100, "cursor": [{"stratum": "s", "epoch": 0,
                                                          "position": 500}]})
    records = [LedgerRecord(0, 101, 0, 1.0, [{"stratum": "s", "epoch": 0,
                                              "ranges": [[490, 520]]}])]
    row = analyze(RunInput("r", [attempt], records), now=2.0).strata[0]
    assert (row.consumed, row.duplicates, row.omissions) == (530, 10, 0)


def test_it_hashes_string_ids_with_blake2b_and_keeps_small_ints():
    assert identity_position(7) == 7
    assert identity_position("doc-1") == int.from_bytes(
        hashlib.blake2b(b"doc-1", digest_size=8).digest(), "big")
    assert identity_position(-1) == int.from_bytes(
        hashlib.blake2b(b"int:-1", digest_size=8).digest(), "big")
    records = [LedgerRecord(0, 1, 0, 1.0, [{"stratum": "i", "epoch": 0, "ids": ["x", "y"]}]),
               LedgerRecord(0, 2, 1, 2.0, [{"stratum": "i", "epoch": 0, "ids": ["y", 3]}])]
    row = analyze(RunInput("i", [AttemptRecord(0, started_at=0.0)], records), now=3.0).strata[0]
    assert (row.consumed, row.duplicates, row.omissions) == (4, 1, 0)


def test_it_rolls_back_updates_after_the_restored_generation():
    """Positions of rolled-back updates may be consumed again without replay
    (docs/definitions.md#lineage)."""
    records = [LedgerRecord(0, u, 0, float(u), [{"stratum": "s", "epoch": 0,
                                                 "ranges": [[(u - 1) * 4, u * 4]]}])
               for u in range(1, 8)]
    records += [LedgerRecord(1, u, 0, 100.0 + u, [{"stratum": "s", "epoch": 0,
                                                   "ranges": [[(u - 1) * 4, u * 4]]}])
                for u in range(5, 9)]
    attempts = [AttemptRecord(0, started_at=0.0, ended_at=8.0, end_reason="preempted"),
                AttemptRecord(1, started_at=90.0, resumed_from={"generation_id": "g4",
                                                                 "update": 4, "cursor": []})]
    gen = GenerationRecord("g4", 0, 4, started_at=4.1, manifests=[{
        "schema_revision": 1, "generation_id": "g4", "update": 4, "world_size": 1,
        "required_shards": [], "components": [], "objects": [],
        "data_progress": {"cursor": [{"stratum": "s", "epoch": 0, "position": 16}]},
        "dataset_version": None}], committed_at=4.5)
    run = RunInput("rb", attempts, records, generations=[gen], contract={"required_components": []})
    analysis = analyze(run, now=120.0)
    restart = analysis.restarts[0]
    assert (restart.replayed, restart.omitted, restart.recomputed, restart.lost_updates) == \
        (0, 0, 12, 3)
    assert analysis.strata[0].duplicates == 0
    assert analysis.updates_at_risk == 4
    assert analysis.last_restorable.generation_id == "g4"  # no object, nothing to verify


def test_it_serialises_the_ledger_state():
    ledger = Ledger.from_records(worked_example(80_000, updates_before=20, after=3).ledger)
    again = Ledger.from_bytes(ledger.to_bytes())
    assert again.segment(0, 0, None)[("main", 0, None)].consumed == 20 * PER_UPDATE
    assert len(again.attempt(0).runs) == W  # one run per rank for the whole attempt


def generation_run(**changes):
    gen = generation("g10", 0, 10, 640, 20.0, **changes.pop("gen", {}))
    records = []
    for u in range(1, 11):
        records += strided(0, u, (u - 1) * PER_UPDATE, float(u))
    attempt = AttemptRecord(0, started_at=0.0, world_size=W, dataset_version="ds")
    return RunInput("g", [attempt], records, generations=[gen], **changes)


def reasons_of(run):
    analysis = analyze(run, now=30.0)
    return analysis.generations[0].status, {r.code for r in analysis.generations[0].reasons}


def test_it_marks_a_complete_verified_generation_restorable():
    assert reasons_of(generation_run()) == ("restorable", set())


@pytest.mark.parametrize("check, status, code", [
    ("object_missing", "rejected", "object_missing"),
    ("size_mismatch", "rejected", "size_mismatch"),
    ("digest_mismatch", "rejected", "digest_mismatch"),
    ("storage_unverified", "committed", "storage_unverified"),
])
def test_it_takes_storage_results_as_inputs(check, status, code):
    run = generation_run(gen={"checks": check})
    assert reasons_of(run) == (status, {code})


def test_it_keeps_a_generation_committed_until_its_objects_are_checked():
    run = generation_run()
    run.generations[0].object_checks.popitem()
    assert reasons_of(run) == ("committed", set())


def test_it_rejects_wrong_world_size_and_a_data_cursor_the_ledger_disagrees_with():
    run = generation_run(gen={"world_size": 4})
    run.generations[0].manifests[0]["data_progress"]["cursor"][0]["position"] = 600
    assert reasons_of(run) == ("rejected", {"world_size_mismatch", "data_cursor_mismatch"})


def test_it_rejects_a_missing_optimizer_shard_and_a_missing_shard():
    run = generation_run()
    manifest = run.generations[0].manifests[0]
    manifest["objects"] = [o for o in manifest["objects"]
                           if not (o["shard"] == "rank1" and o["component"] == "optimizer")]
    assert reasons_of(run) == ("rejected", {"component_missing"})
    manifest["objects"] = [o for o in manifest["objects"] if o["shard"] == "rank0"]
    assert reasons_of(run) == ("rejected", {"shard_missing"})


def test_it_counts_every_component_of_an_object_that_holds_several():
    # one file per shard holding all five components (a Lightning .ckpt): said once
    objects = [{"uri": f"file:///c/g10/{s}.ckpt", "shard": s, "component": COMPONENTS[0],
                "components": list(COMPONENTS), "size": 1,
                "sha256": hashlib.sha256(s.encode()).hexdigest()} for s in SHARDS]
    run = generation_run(gen={"objects": objects})
    assert reasons_of(run) == ("restorable", set())
    for obj in objects:
        obj["components"] = [c for c in COMPONENTS if c != "rng"]
    assert reasons_of(run) == ("rejected", {"component_missing"})


def test_it_rejects_conflicting_manifests_schema_and_stale_state():
    run = generation_run()
    gen = run.generations[0]
    other = dict(gen.manifests[0], world_size=16)
    gen.manifests.append(other)
    assert reasons_of(run) == ("rejected", {"manifest_conflict"})
    gen.manifests.pop()
    gen.manifests[0]["schema_revision"] = 2
    assert reasons_of(run) == ("rejected", {"schema_unsupported"})
    gen.manifests[0]["schema_revision"] = 1
    older = generation("g5", 0, 5, 320, 8.0)
    for obj in older.manifests[0]["objects"]:
        obj["sha256"] = gen.manifests[0]["objects"][0]["sha256"]
    run.generations.append(older)
    status = {g.generation_id: (g.status, {r.code for r in g.reasons})
              for g in analyze(run, now=30.0).generations}
    assert status["g10"] == ("rejected", {"stale_state"})


def test_it_abandons_an_uncommitted_generation_once_superseded():
    run = generation_run()
    run.generations.insert(0, GenerationRecord("g9", 0, 9, started_at=9.5))
    status = {g.generation_id: g.status for g in analyze(run, now=30.0).generations}
    assert status == {"g9": "abandoned", "g10": "restorable"}
    run.generations = [GenerationRecord("g9", 0, 9, started_at=9.5)]
    assert analyze(run, now=30.0).generations[0].status == "pending"


def test_it_plans_the_restore_or_answers_409():
    analysis = analyze(generation_run(), now=30.0)
    plan = restore_plan(analysis, world_size=16, dataset_version="ds")
    assert plan.status_code == 200
    assert plan.body["generation_id"] == "g10"
    assert plan.body["cursor"] == [{"stratum": "main", "epoch": 0, "position": 640}]
    assert [w["code"] for w in plan.body["warnings"]] == ["world_size_changed"]
    refused = restore_plan(analyze(generation_run(gen={"checks": "object_missing"}), now=30.0))
    assert refused.status_code == 409
    assert refused.body["error"] == "no_restorable_generation"
    assert refused.body["rejected"][0]["generation_id"] == "g10"


def test_it_reports_health_and_costs():
    run = worked_example(80_000)
    analysis = analyze(run, now=2100.0)
    assert analysis.health == "ok"
    assert analysis.seconds_since_last_restorable == 2100.0 - 1255.0
    assert analysis.updates_at_risk == 10
    costs = analysis.costs
    assert costs.failures == 1
    assert costs.mtbf_seconds == 2100.0
    assert costs.median_save_seconds == 2.0
    assert costs.young_interval_seconds == pytest.approx((2 * 2.0 * 2100.0) ** 0.5)
    # surviving updates: 1..1250 over 1249 s of attempt 0, 1251..1260 over 9 s of attempt 1
    assert costs.useful_seconds == pytest.approx(1249 * 1250 / 1249 + 9 * 10 / 9)
    assert analysis.to_dict()["last_restorable"]["committed_at"] == "1970-01-01T00:20:55+00:00"
    assert analyze(run, now=2100.0 + 3601).health == "at_risk"
    run.attempts[1].end_reason = "completed"
    assert analyze(run, now=2100.0).health == "ended"
    assert analyze(worked_example(79_936), now=2100.0).health == "failing"


def test_it_reports_a_restart_from_an_unknown_generation_as_unverified():
    run = worked_example(80_000, updates_before=30, after=2)
    run.attempts[1].resumed_from["generation_id"] = "elsewhere"
    restart = analyze(run, now=3000.0).restarts[0]
    assert restart.verdict == "unverified"
    assert "resumed_from_unknown" in {f.code for f in restart.findings}


def test_it_absorbs_a_heartbeat_free_attempt_with_no_updates():
    run = worked_example(80_000, updates_before=30, after=0)
    restart = analyze(run, now=3000.0).restarts[0]
    assert restart.verdict == "unverified"
    assert restart.recovery_seconds is None
    assert HeartbeatRecord  # imported for the API surface


def unknown_start_run(resumed_from=None, started=False):
    """Attempt 0 consumes [0, 40) over 10 updates and fails; attempt 1 starts from an unknown
    state at position 40 (no attempt_started, or a generation nobody knows) for 5 updates."""
    records = [LedgerRecord(0, u, 0, float(u), [{"stratum": "s", "epoch": 0,
                                                 "ranges": [[4 * (u - 1), 4 * u]]}])
               for u in range(1, 11)]
    records += [LedgerRecord(1, u, 0, 100.0 + u, [{"stratum": "s", "epoch": 0,
                                                   "ranges": [[40 + 4 * (u - 1), 40 + 4 * u]]}])
                for u in range(1, 6)]
    attempts = [AttemptRecord(0, started_at=0.0, ended_at=11.0, end_reason="failed",
                              end_update=10)]
    if started:
        attempts.append(AttemptRecord(1, started_at=90.0, resumed_from=resumed_from))
    return RunInput("unknown", attempts, records)


@pytest.mark.parametrize("resumed_from, started", [
    (None, False),                                                   # no attempt_started
    ({"generation_id": "gNOPE", "update": 0, "cursor": []}, True),   # unknown generation
    ({"generation_id": None, "update": 0, "cursor": []}, True),      # untracked, no cursor
])
def test_an_unknown_lineage_root_is_charged_with_no_omission(resumed_from, started):
    """docs/definitions.md#unknown-lineage-root: behind where an unknown root starts, nothing is
    known: attempt 1 starting at 40 is unverified, with no omission (restart nor strata); its lost
    updates are attempt 0's last update (10) minus the U it declares (0), none without an
    attempt_started (docs/definitions.md#lost-updates-from-an-untracked-state)."""
    analysis = analyze(unknown_start_run(resumed_from, started), now=200.0)
    restart = analysis.restarts[0]
    codes = {f.code for f in restart.findings}
    assert restart.verdict == "unverified"
    assert "resumed_from_unknown" in codes and not codes & {"omission", "replay"}
    assert (restart.omitted, restart.replayed) == (0, 0)
    assert restart.lost_updates == (10 if started else 0)
    assert restart.lost_seconds is None
    row = analysis.strata[0]
    assert (row.consumed, row.duplicates, row.omissions) == (20, 0, 0)


def test_an_unknown_root_still_owes_what_it_skips_once_tracked():
    """Tracking starts at 40: a later hole in the same key, and a descendant's jump past the
    lineage's frontier, are omissions; a descendant consuming below 40 replays nothing."""
    run = unknown_start_run()
    run.ledger += [LedgerRecord(1, 6, 0, 106.0, [{"stratum": "s", "epoch": 0,
                                                  "ranges": [[64, 68]]}])]   # skips [60, 64)
    assert analyze(run, now=200.0).strata[0].omissions == 4
    gen = GenerationRecord("g6", 1, 6, started_at=107.0, committed_at=108.0, manifests=[{
        "schema_revision": 1, "generation_id": "g6", "update": 6, "world_size": None,
        "required_shards": [], "components": [], "objects": [],
        "data_progress": {"cursor": [{"stratum": "s", "epoch": 0, "position": 68}]},
        "dataset_version": None}])
    run.generations = [gen]
    run.contract = {"required_components": []}
    run.attempts.append(AttemptRecord(1, started_at=90.0, ended_at=109.0, end_reason="failed",
                                      end_update=6, resumed_from={
                                          "generation_id": "gNOPE", "update": 0, "cursor": []}))
    run.attempts.append(AttemptRecord(2, started_at=110.0, resumed_from={
        "generation_id": "g6", "update": 6, "cursor": []}))
    run.ledger += [LedgerRecord(2, 7, 0, 111.0, [{"stratum": "s", "epoch": 0,
                                                  "ranges": [[72, 76]]}]),
                   LedgerRecord(2, 8, 0, 112.0, [{"stratum": "s", "epoch": 0,
                                                  "ranges": [[30, 34]]}])]
    analysis = analyze(run, now=200.0)
    restart = analysis.restarts[1]
    # [30, 34) lies below where tracking began: neither replay nor duplicate; [68, 72) is skipped
    assert (restart.replayed, restart.omitted, restart.verdict) == (0, 4, "omission")
    assert restart.lost_updates == 0
    row = analysis.strata[0]
    assert (row.duplicates, row.omissions) == (0, 8)


def epoch_span(epoch, lo, hi, **extra):
    return dict({"stratum": "s", "epoch": epoch, "ranges": [[lo, hi]]}, **extra)


def test_a_whole_skipped_epoch_counts_epoch_length_omissions():
    """Epochs 0, 1, 3 of a 64-position epoch: epoch 2 was skipped whole (64 omissions, no
    drop_last exemption); epoch 0's tail of 14 is shorter than a global batch of 16: dropped."""
    sampler = {"epoch_length": {"s": 64}}
    records = [LedgerRecord(0, 1, 0, 1.0, [epoch_span(0, 0, 50)]),
               LedgerRecord(0, 2, 0, 2.0, [epoch_span(1, 0, 64)]),
               LedgerRecord(0, 3, 0, 3.0, [epoch_span(3, 0, 64, order="o3")]),
               LedgerRecord(0, 4, 0, 4.0, [epoch_span(5, 0, 8), epoch_span(7, 0, 8)])]
    attempt = AttemptRecord(0, started_at=0.0, global_batch_size=16, sampler=sampler)
    row = analyze(RunInput("skip", [attempt], records), now=5.0).strata[0]
    # skipped whole: 2, 4, 6; tails: epoch 5 (56); epoch 0 (14 < 16) and 1, 3 complete
    assert row.omissions == 3 * 64 + 56
    attempt.sampler = {}
    assert analyze(RunInput("skip", [attempt], records), now=5.0).strata[0].omissions == 0


def test_a_restart_that_skips_a_whole_epoch_omits_it():
    sampler = {"epoch_length": {"s": 64}}
    records = [LedgerRecord(0, u, 0, float(u), [epoch_span(0, 16 * (u - 1), 16 * u)])
               for u in range(1, 5)]
    records += [LedgerRecord(1, 5, 0, 105.0, [epoch_span(2, 8, 24)])]
    gen = GenerationRecord("g4", 0, 4, started_at=4.1, committed_at=4.5, manifests=[{
        "schema_revision": 1, "generation_id": "g4", "update": 4, "world_size": None,
        "required_shards": [], "components": [], "objects": [],
        "data_progress": {"cursor": [{"stratum": "s", "epoch": 1, "position": 0}]},
        "dataset_version": None}])
    attempts = [AttemptRecord(0, started_at=0.0, ended_at=8.0, end_reason="failed",
                              global_batch_size=16, sampler=sampler),
                AttemptRecord(1, started_at=90.0, global_batch_size=16, sampler=sampler,
                              resumed_from={"generation_id": "g4", "update": 4, "cursor": []})]
    analysis = analyze(RunInput("skip", attempts, records, generations=[gen],
                                contract={"required_components": []}), now=120.0)
    assert analysis.generations[0].status == "restorable"
    restart = analysis.restarts[0]
    # epoch 0 complete, epoch 1 skipped whole (64), epoch 2 starts at 8 (8)
    assert (restart.omitted, restart.verdict) == (64 + 8, "omission")
    assert analysis.strata[0].omissions == 64 + 8


def test_a_restart_that_feeds_its_epoch_again_and_ends_it_early_replays_and_omits():
    """Lightning with a plain DataLoader: 64-position epoch, 4 per update, g5 at cursor 20. The
    resumed attempt feeds the epoch from 0 again (20 replayed) and ends it after the 11 batches
    it believes are left (positions 44..63 never fed: 20 omitted), then moves on to epoch 1."""
    sampler = {"epoch_length": {"s": 64}}
    records = [LedgerRecord(0, u, 0, float(u), [epoch_span(0, 4 * (u - 1), 4 * u)])
               for u in range(1, 8)]
    records += [LedgerRecord(1, u, 0, 100.0 + u, [epoch_span(0, 4 * (u - 6), 4 * (u - 5))])
                for u in range(6, 17)]
    records += [LedgerRecord(1, u, 0, 100.0 + u, [epoch_span(1, 4 * (u - 17), 4 * (u - 16))])
                for u in range(17, 21)]
    gen = GenerationRecord("g5", 0, 5, started_at=5.1, committed_at=5.5, manifests=[{
        "schema_revision": 1, "generation_id": "g5", "update": 5, "world_size": None,
        "required_shards": [], "components": [], "objects": [],
        "data_progress": {"cursor": [{"stratum": "s", "epoch": 0, "position": 20}]},
        "dataset_version": None}])
    attempts = [AttemptRecord(0, started_at=0.0, ended_at=8.0, end_reason="failed",
                              global_batch_size=4, sampler=sampler),
                AttemptRecord(1, started_at=90.0, global_batch_size=4, sampler=sampler,
                              resumed_from={"generation_id": "g5", "update": 5, "cursor": []})]
    run = RunInput("early", attempts, records, generations=[gen],
                   contract={"required_components": []})
    analysis = analyze(run, now=130.0)
    restart = analysis.restarts[0]
    assert (restart.replayed, restart.omitted, restart.verdict) == \
        (20, 20, "replay_and_omission")
    assert (analysis.strata[0].duplicates, analysis.strata[0].omissions) == (20, 20)
    # while the attempt is still in epoch 0, nothing is omitted yet
    run.ledger = [r for r in records if r.update < 17 or r.attempt == 0]
    restart = analyze(run, now=130.0).restarts[0]
    assert (restart.replayed, restart.omitted, restart.verdict) == (20, 0, "replay")


def test_the_409_names_generations_restorable_outside_an_unknown_live_lineage():
    """Attempt 0 committed a restorable g5; attempt 1 resumed from gNOPE, which nobody knows:
    its lineage is unknown, so nothing is restorable in it (honest), but the 409 says that g5 is
    restorable elsewhere, and the analysis lists it in ``restorable_elsewhere``."""
    records = []
    for u in range(1, 6):
        records += strided(0, u, (u - 1) * PER_UPDATE, float(u))
    for u in range(6, 9):
        records += strided(1, u, (u - 1) * PER_UPDATE, 100.0 + u)
    attempts = [AttemptRecord(0, started_at=0.0, world_size=W, dataset_version="ds",
                              ended_at=10.0, end_reason="failed", end_update=5),
                AttemptRecord(1, started_at=90.0, world_size=W, dataset_version="ds",
                              resumed_from={"generation_id": "gNOPE", "update": 5, "cursor": []})]
    rejected = generation("g3", 0, 3, 3 * PER_UPDATE, 3.5, checks="object_missing")
    run = RunInput("elsewhere", attempts, records, generations=[
        rejected, generation("g5", 0, 5, 5 * PER_UPDATE, 5.5)], first_event_at=0.0)
    analysis = analyze(run, now=200.0)
    assert analysis.last_restorable is None
    assert {g.generation_id: g.status for g in analysis.generations} == \
        {"g3": "rejected", "g5": "restorable"}
    assert analysis.to_dict()["restorable_elsewhere"] == ["g5"]
    plan = restore_plan(analysis)
    assert plan.status_code == 409
    listed = {g["generation_id"]: g for g in plan.body["rejected"]}
    assert listed["g3"]["status"] == "rejected"
    assert listed["g5"]["status"] == "restorable"
    assert listed["g5"]["reasons"] == [{
        "code": "not_in_live_lineage",
        "detail": "attempt 1 resumed from unknown generation gNOPE; g5 (attempt 0) is "
                  "restorable in attempt 0's lineage"}]
    # a known live lineage holding g5: nothing elsewhere, and the plan answers 200
    run.attempts[1].resumed_from["generation_id"] = "g5"
    analysis = analyze(run, now=200.0)
    assert analysis.to_dict()["restorable_elsewhere"] == []
    assert restore_plan(analysis).status_code == 200


def test_a_fresh_live_attempt_names_the_older_restorable_generation():
    run = generation_run()
    run.attempts.append(AttemptRecord(1, started_at=40.0, world_size=W, dataset_version="ds"))
    run.ledger += strided(1, 1, 0, 41.0)
    analysis = analyze(run, now=50.0)
    assert analysis.restorable_elsewhere == ["g10"]
    plan = restore_plan(analysis)
    assert plan.status_code == 409
    assert plan.body["rejected"][0]["reasons"][0]["detail"] == \
        "the live attempt 1 started fresh; g10 (attempt 0) is restorable in attempt 0's lineage"


def boundary_run(epoch_length, micro_batch_size=MICRO, resume=False):
    """Seed 003's 8 ranks x 64 positions per update with an epoch of ``epoch_length``: update 1
    consumes epoch 0's [0, 64), the loader drops the rest (drop_last) and update 2 starts epoch 1;
    generation g1 at update 1 declares the next epoch's start (1, 0), as a sampler does at an
    epoch boundary. With ``resume``, attempt 1 resumes g1 and consumes epoch 1's [0, 64)."""
    def update(attempt, u, epoch, time):
        return [LedgerRecord(attempt, u, r, time, [{"stratum": "main", "epoch": epoch,
                                                    "ranges": [[r, PER_UPDATE, W]]}])
                for r in range(W)]

    sampler = {"epoch_length": {"main": epoch_length}}
    g1 = generation("g1", 0, 1, 0, 1.5)
    g1.manifests[0]["data_progress"]["cursor"] = [{"stratum": "main", "epoch": 1, "position": 0}]
    attempts = [AttemptRecord(0, started_at=0.0, world_size=W, dataset_version="ds",
                              micro_batch_size=micro_batch_size, grad_accum_steps=ACCUM,
                              sampler=sampler)]
    ledger = update(0, 1, 0, 1.0)
    if resume:
        attempts[0].ended_at, attempts[0].end_reason = 1.8, "failed"
        attempts.append(AttemptRecord(1, started_at=2.0, world_size=W, dataset_version="ds",
                                      micro_batch_size=micro_batch_size, grad_accum_steps=ACCUM,
                                      sampler=sampler, resumed_from={
                                          "generation_id": "g1", "update": 1, "cursor": [
                                              {"stratum": "main", "epoch": 1, "position": 0}]}))
        ledger += update(1, 2, 1, 3.0)
    else:
        ledger += update(0, 2, 1, 2.0)
    return RunInput("boundary", attempts, ledger, generations=[g1], first_event_at=0.0)


@pytest.mark.parametrize("epoch_length, micro, status, omissions", [
    (100, MICRO, "restorable", 0),    # remainder 36 < global batch 64: drop_last, epoch complete
    (128, MICRO, "rejected", 64),     # remainder 64 is not shorter than a global batch
    (100, None, "rejected", 36),      # global batch unknown: no tail is exempt
])
def test_a_generation_saved_at_an_epoch_boundary_with_a_drop_last_remainder_is_restorable(
        epoch_length, micro, status, omissions):
    analysis = analyze(boundary_run(epoch_length, micro), now=5.0)
    [g1] = analysis.generations
    assert g1.status == status
    assert [r.code for r in g1.reasons] == ([] if status == "restorable"
                                            else ["data_cursor_mismatch"])
    assert analysis.strata[0].omissions == omissions


def test_a_restart_from_an_epoch_boundary_with_a_drop_last_remainder_is_exact():
    analysis = analyze(boundary_run(100, resume=True), now=5.0)
    assert analysis.generations[0].status == "restorable"
    [restart] = analysis.restarts
    assert (restart.verdict, restart.replayed, restart.omitted) == ("exact", 0, 0)
    assert restart.expected_cursor == [{"stratum": "main", "epoch": 0, "position": 64}]
    assert restart.resume_cursor == [{"stratum": "main", "epoch": 1, "position": 0}]
    assert analysis.last_restorable.generation_id == "g1"


def ids_run(length, epochs, ids=None, batch=4):
    """One rank reporting sample ids of stratum "i": ``epochs`` lists per update (epoch, ids)."""
    records = [LedgerRecord(0, u, 0, float(u), [{"stratum": "i", "epoch": e, "ids": list(i)}])
               for u, (e, i) in enumerate(epochs, start=1)]
    sampler = {"epoch_length": {"i": length}} if length else {}
    attempt = AttemptRecord(0, started_at=0.0, global_batch_size=batch, sampler=sampler)
    return RunInput("ids", [attempt], records)


EPOCH_0 = [(0, [3, 1, 4, 0]), (0, [7, 5, 9, 2])]   # ids 6 and 8 of [0, 10) never consumed


@pytest.mark.parametrize("length, epochs, omissions", [
    (10, EPOCH_0 + [(1, [0, 1, 2, 3])], 0),    # 2 missing < global batch 4: drop_last remainder
    (16, EPOCH_0 + [(1, [0, 1, 2, 3])], 8),    # 6, 8, 10..15 never consumed once epoch 1 began
    (16, EPOCH_0, 0),                          # epoch 0 still in progress: nothing owed yet
    (None, EPOCH_0 + [(1, [0, 1, 2, 3])], 0),  # no epoch length: nothing owed
    (10, EPOCH_0 + [(2, [0, 1, 2, 3])], 10),   # epoch 1 skipped whole: all 10 of its ids
])
def test_integer_sample_ids_never_consumed_in_an_epoch_moved_on_from_are_omitted(
        length, epochs, omissions):
    row = analyze(ids_run(length, epochs), now=10.0).strata[0]
    consumed = 4 * len(epochs)  # every id once per (stratum, epoch): distinct = consumed
    assert (row.consumed, row.duplicates, row.omissions) == (consumed, 0, omissions)
    assert row.omission_rate == omissions / (omissions + consumed)


def test_sample_ids_of_which_some_are_strings_owe_no_omission():
    epochs = [(0, [3, "x", 4, 0]), (0, [7, 5, 9, 2]), (1, [0, 1, 2, 3])]
    assert analyze(ids_run(16, epochs), now=10.0).strata[0].omissions == 0
    # the kind survives the stored state, and a state written before it was kept is rebuilt
    ledger = Ledger.from_records(ids_run(16, epochs).ledger)
    assert Ledger.from_bytes(ledger.to_bytes()).hashed_strata == {"i"}
    assert Ledger.from_bytes(Ledger.from_records(ids_run(16, EPOCH_0).ledger).to_bytes()) \
        .integer_id_strata() == {"i"}


def test_a_stored_state_older_than_the_id_kind_with_id_strata_is_refused_for_a_rebuild():
    import json
    import zlib

    from state_formats import format_4

    def as_format_2(ledger):
        doc = json.loads(zlib.decompress(format_4(ledger)))
        doc["format"] = 2
        doc.pop("hashed_strata")
        return zlib.compress(json.dumps(doc).encode())

    with pytest.raises(ValueError, match="rebuild it from the ledger rows"):
        Ledger.from_bytes(as_format_2(Ledger.from_records(ids_run(16, EPOCH_0).ledger)))
    positions = Ledger.from_records(worked_example(80_000, updates_before=3, after=1).ledger)
    assert Ledger.from_bytes(as_format_2(positions)).to_bytes() == positions.to_bytes()


def ids_restart(after):
    """Attempt 0 consumes ids [0, 8) of epoch 0 (length 16, global batch 4) in updates 1-2 and
    saves g2; attempt 1 resumes g2 and reports ``after``: per update (epoch, ids)."""
    def rec(attempt, u, epoch, ids):
        return LedgerRecord(attempt, u, 0, float(u) + 10 * attempt,
                            [{"stratum": "i", "epoch": epoch, "ids": ids}])

    sampler = {"epoch_length": {"i": 16}}
    ledger = [rec(0, 1, 0, [0, 1, 2, 3]), rec(0, 2, 0, [4, 5, 6, 7])]
    ledger += [rec(1, 3 + n, e, ids) for n, (e, ids) in enumerate(after)]
    attempts = [AttemptRecord(0, started_at=0.0, global_batch_size=4, sampler=sampler,
                              ended_at=3.0, end_reason="failed"),
                AttemptRecord(1, started_at=10.0, global_batch_size=4, sampler=sampler,
                              resumed_from={"generation_id": "g2", "update": 2, "cursor": []})]
    return RunInput("ids-restart", attempts, ledger,
                    generations=[generation("g2", 0, 2, 0, 2.5)], first_event_at=0.0)


@pytest.mark.parametrize("after, replayed, omitted, verdict, duplicates, omissions", [
    # the loader restarts epoch 0 (ids 0-3 again), then ids 8-11, and the trainer ends the epoch
    # by a batch count: 12-15 never consumed, known once epoch 1 begins
    ([(0, [0, 1, 2, 3]), (0, [8, 9, 10, 11]), (1, [0, 1, 2, 3])], 4, 4, "replay_and_omission",
     4, 4),
    ([(0, [0, 1, 2, 3]), (0, [8, 9, 10, 11])], 4, 0, "replay", 4, 0),  # still in epoch 0
    ([(0, [8, 9, 10, 11]), (0, [12, 13, 14, 15]), (1, [0, 1, 2, 3])], 0, 0, "exact", 0, 0),
    ([(1, [0, 1, 2, 3])], 0, 8, "omission", 0, 8),      # jumps to epoch 1: 8-15 of epoch 0 owed
    ([(2, [0, 1, 2, 3])], 0, 8 + 16, "omission", 0, 8 + 16),  # and epoch 1 skipped whole
])
def test_a_restart_over_integer_sample_ids_owes_the_ids_its_lineage_never_consumed(
        after, replayed, omitted, verdict, duplicates, omissions):
    analysis = analyze(ids_restart(after), now=100.0)
    [restart] = analysis.restarts
    assert (restart.replayed, restart.omitted, restart.verdict) == (replayed, omitted, verdict)
    assert (analysis.strata[0].duplicates, analysis.strata[0].omissions) == \
        (duplicates, omissions)


def test_integer_ids_before_an_unknown_root_started_tracking_are_not_owed():
    """An attempt resumed from a generation the server does not know joins epoch 0 mid-way: the
    ids it did not see there may have been consumed before tracking; epoch 1 is tracked whole."""
    run = ids_run(16, [(0, [8, 9, 10, 11]), (1, [0, 1, 2, 3]), (1, [4, 5, 6, 7]),
                       (2, [0, 1, 2, 3])])
    run.attempts[0].resumed_from = {"generation_id": "elsewhere", "update": 40, "cursor": []}
    run.ledger = [LedgerRecord(0, 40 + r.update, r.rank, r.time, r.spans) for r in run.ledger]
    row = analyze(run, now=100.0).strata[0]
    assert row.omissions == 8  # epoch 1's ids 8-15; nothing of epoch 0
