"""Projection of accepted events into the typed tables (docs/ingest-v1.md#4-event-types), including
the worked scenarios of tests/scenarios/ posted through the API."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime

import pytest
from ingest_support import batch_order, event, post, update
from scenarios import NAMES as SCENARIOS

from recoverydash.ingest.actions import stored_body
from recoverydash.runs.models import (
    GLOBAL_RANK,
    Attempt,
    AuditWindow,
    CheckpointObject,
    Event,
    Generation,
    Heartbeat,
    LedgerRow,
    Run,
    ShardReport,
)

pytestmark = pytest.mark.django_db



def expected_counts(events: list[dict]) -> dict:
    types = Counter(e["type"] for e in events)
    ledger_keys = {(e["attempt"], e["update"], e.get("rank")) for e in events
                   if e["type"] == "update_committed"}
    generations = {e.get("generation_id") or e["manifest"]["generation_id"] for e in events
                   if e["type"] in ("checkpoint_started", "shard_written", "checkpoint_committed")}
    uris = {(e.get("generation_id") or e["manifest"]["generation_id"], o["uri"]) for e in events
            if e["type"] in ("shard_written", "checkpoint_committed")
            for o in (e["objects"] if e["type"] == "shard_written" else e["manifest"]["objects"])}
    return {"events": len(events), "ledger": len(ledger_keys), "generations": len(generations),
            "objects": len(uris), "shards": types["shard_written"],
            "heartbeats": types["heartbeat"], "attempts": len({e["attempt"] for e in events}),
            "committed": types["checkpoint_committed"]}


@pytest.mark.parametrize("name", SCENARIOS)
def test_it_projects_each_scenario_into_the_typed_tables(client, ingest_token, scenario_loader,
                                                         tmp_path, name):
    events, expect = scenario_loader(name, str(tmp_path))
    want = expected_counts(events)
    # as an SDK would: several batches
    for start in range(0, len(events), 500):
        r = post(client, ingest_token, events[start:start + 500], gz=start % 1000 == 0)
        assert r.status_code == 202, r.content
    run = Run.objects.get()
    assert run.event_count == want["events"] == Event.objects.count()
    assert LedgerRow.objects.count() == want["ledger"]
    assert Generation.objects.count() == want["generations"]
    assert CheckpointObject.objects.count() == want["objects"]
    assert ShardReport.objects.count() == want["shards"]
    assert Heartbeat.objects.count() == want["heartbeats"]
    assert Attempt.objects.count() == want["attempts"]
    assert Generation.objects.exclude(manifest=None).count() == want["committed"]
    assert not Generation.objects.filter(manifest_conflict=True).exists()
    seqs = list(Event.objects.values_list("batch_seq", flat=True))
    assert max(batch_order(seqs)) == (len(events) + 499) // 500 and run.ingest_seq == max(seqs)
    # every manifest object is marked, with the manifest's digest
    for gen in Generation.objects.exclude(manifest=None):
        uris = {o["uri"] for o in gen.manifest["objects"]}
        assert set(gen.checkpoint_objects.filter(in_manifest=True)
                   .values_list("uri", flat=True)) == uris
        assert gen.committed_at is not None and gen.status == "committed"
    # restarts: the second attempt carries what it resumed from
    resumed = Attempt.objects.get(attempt=1)
    started = next(e for e in events if e["type"] == "attempt_started" and e["attempt"] == 1)
    assert resumed.resumed_from == started.get("resumed_from")
    assert resumed.world_size == started["world_size"]
    ended = next(e for e in events if e["type"] == "attempt_ended")
    first = Attempt.objects.get(attempt=ended["attempt"])
    assert first.end_reason == ended["reason"] and first.end_update == ended["update"]
    if ended.get("fetched"):
        assert first.fetched == ended["fetched"]
    # resending the whole scenario changes nothing
    r = post(client, ingest_token, events, gz=True)
    assert r.json() == {"accepted": 0, "duplicates": len(events)}


def test_it_unites_reports_of_one_rank_and_keeps_first_seq(client, ingest_token):
    span_a = {"stratum": "main", "epoch": 0, "ranges": [[0, 8]]}
    span_b = {"stratum": "main", "epoch": 0, "ranges": [[8, 16]]}
    post(client, ingest_token, [update("a", 1, rank=3, spans=[span_a], samples=8)])
    # a tensor-parallel peer repeats span_a; another piece adds span_b
    post(client, ingest_token, [update("b", 1, rank=3, spans=[span_a], samples=8)])
    post(client, ingest_token, [update("c", 1, rank=3, spans=[span_b], samples=8),
                                update("d", 1, rank=3, spans=[span_a, span_b])])
    row = LedgerRow.objects.get()
    assert row.spans == [span_a, span_b]
    seqs = sorted(set(Event.objects.values_list("batch_seq", flat=True)))
    assert len(seqs) == 3 and (row.first_seq, row.last_seq) == (seqs[0], seqs[2])
    assert row.samples == 8
    assert Run.objects.get().ingest_seq == seqs[2]


def test_it_stores_a_null_rank_as_the_global_rank(client, ingest_token):
    post(client, ingest_token, [update("a", 1, rank=None), update("b", 1, rank=0)])
    assert sorted(LedgerRow.objects.values_list("rank", flat=True)) == [GLOBAL_RANK, 0]


def test_it_creates_an_attempt_before_its_start_event_arrives(client, ingest_token):
    post(client, ingest_token, [update("a", 5, attempt=2)])
    att = Attempt.objects.get()
    assert att.attempt == 2 and att.started_at is None and att.last_update == 5
    post(client, ingest_token, [event("attempt_started", "s", attempt=2, world_size=4,
                                      dataset_version="v1", time="2026-11-01T00:00:00Z",
                                      contract={"max_replay_samples": 10})])
    att.refresh_from_db()
    assert att.started_at == datetime(2026, 11, 1, tzinfo=UTC)
    assert att.world_size == 4 and att.last_update == 5


def test_it_copies_the_latest_attempts_contract_to_the_run(client, ingest_token):
    start = dict(world_size=1, dataset_version="v")
    post(client, ingest_token, [
        event("attempt_started", "s1", attempt=1, contract={"max_replay_samples": 1}, **start),
        event("attempt_started", "s0", attempt=0, contract={"max_replay_samples": 0}, **start)])
    assert Run.objects.get().contract == {"max_replay_samples": 1}
    post(client, ingest_token, [event("attempt_started", "s2", attempt=2,
                                      contract={"max_omission_samples": 5}, **start)])
    assert Run.objects.get().contract == {"max_omission_samples": 5}


def test_it_keeps_a_contract_edited_in_the_dashboard_until_a_later_attempt_declares_one(
        client, ingest_token):
    from recoverydash.runs.contracts import save_contract
    start = dict(world_size=2, dataset_version="v")
    post(client, ingest_token, [event("attempt_started", "s1r0", attempt=1, rank=0,
                                      contract={"max_replay_samples": 1}, **start)])
    save_contract(Run.objects.get(), {"max_replay_samples": 64})
    # more events of attempt 1, among them rank 1's copy of its attempt_started
    post(client, ingest_token, [update("u", 1, attempt=1),
                                event("attempt_started", "s1r1", attempt=1, rank=1,
                                      contract={"max_replay_samples": 1}, **start),
                                event("attempt_started", "s0", attempt=0,
                                      contract={"max_replay_samples": 0}, **start)])
    assert Run.objects.get().contract == {"max_replay_samples": 64}
    post(client, ingest_token, [event("attempt_started", "s2", attempt=2,
                                      contract={"max_omission_samples": 5}, **start)])
    assert Run.objects.get().contract == {"max_omission_samples": 5}


def test_it_starts_an_attempt_at_the_earliest_of_its_ranks_attempt_started(client, ingest_token):
    start = dict(attempt=1, world_size=2, dataset_version="v")
    post(client, ingest_token, [event("attempt_started", "r1", rank=1,
                                      time="2026-11-01T00:00:09Z", **start)])
    post(client, ingest_token, [event("attempt_started", "r0", rank=0,
                                      time="2026-11-01T00:00:04Z", **start)])
    post(client, ingest_token, [event("attempt_started", "r2", rank=2,
                                      time="2026-11-01T00:00:07Z", **start)])
    assert Attempt.objects.get().started_at == datetime(2026, 11, 1, 0, 0, 4, tzinfo=UTC)


def test_it_keeps_the_furthest_fetched_cursor_per_stratum_and_epoch(client, ingest_token):
    def hb(eid, *cursors):
        return event("heartbeat", eid, update=1, rank=0, fetched=[
            {"stratum": s, "epoch": e, "position": p} for s, e, p in cursors])

    post(client, ingest_token, [hb("h1", ("main", 0, 100), ("aux", 0, 5)),
                                hb("h2", ("main", 0, 80), ("main", 1, 3))])
    post(client, ingest_token, [hb("h3", ("aux", 0, 9))])
    att = Attempt.objects.get()
    assert att.fetched == [{"stratum": "aux", "epoch": 0, "position": 9},
                           {"stratum": "main", "epoch": 0, "position": 100},
                           {"stratum": "main", "epoch": 1, "position": 3}]
    assert Heartbeat.objects.count() == 3 and att.heartbeat_at is not None


def manifest(**over) -> dict:
    doc = {"schema_revision": 1, "generation_id": "g1", "update": 3, "world_size": 1,
           "required_shards": ["rank0"], "components": ["model"],
           "objects": [{"uri": "s3://b/g1/model", "shard": "rank0", "component": "model",
                        "size": 4, "sha256": "A" * 64}],
           "data_progress": {"cursor": [{"stratum": "main", "epoch": 0, "position": 24}]},
           "dataset_version": "v1", "committed_at": "2026-11-01T02:01:00+02:00"}
    doc.update(over)
    return doc


def test_it_projects_a_checkpoint_from_start_to_commit(client, ingest_token):
    obj = {"uri": "s3://b/g1/model", "component": "model", "size": 3}
    post(client, ingest_token, [
        event("checkpoint_started", "c", generation_id="g1", update=3, required_shards=["rank0"],
              components=["model"]),
        event("shard_written", "w", rank=0, generation_id="g1", shard="rank0", update=3,
              objects=[obj, {"uri": "s3://b/g1/extra", "component": "rng", "size": 1}])])
    gen = Generation.objects.get()
    assert gen.status == "pending" and gen.update == 3 and gen.required_shards == ["rank0"]
    assert ShardReport.objects.get().object_list[0] == obj
    o = CheckpointObject.objects.get(uri=obj["uri"])
    assert (o.shard, o.in_manifest, o.size) == ("rank0", False, 3)
    o.check_status = "size_mismatch"
    o.save()
    post(client, ingest_token, [event("checkpoint_committed", "m", manifest=manifest())])
    gen.refresh_from_db()
    assert gen.status == "committed" and gen.manifest == manifest()
    assert gen.committed_at == datetime(2026, 11, 1, 0, 1, tzinfo=UTC)
    o.refresh_from_db()
    assert (o.in_manifest, o.size, o.sha256, o.check_status) == (True, 4, "a" * 64, "pending")
    assert not CheckpointObject.objects.get(uri="s3://b/g1/extra").in_manifest


def test_it_flags_a_second_different_manifest_as_a_conflict(client, ingest_token):
    post(client, ingest_token, [event("checkpoint_committed", "m1", manifest=manifest())])
    post(client, ingest_token, [event("checkpoint_committed", "m2", manifest=manifest())])
    assert not Generation.objects.get().manifest_conflict
    post(client, ingest_token, [event("checkpoint_committed", "m3", manifest=manifest(update=4))])
    gen = Generation.objects.get()
    assert gen.manifest_conflict and gen.manifest["update"] == 3


def test_a_manifest_published_again_with_a_new_committed_at_is_the_same(client, ingest_token):
    """docs/definitions.md#volatile-manifest-fields: a re-publication after a timeout differs
    only in committed_at; it changes nothing (the first commit time stays), no conflict."""
    post(client, ingest_token, [event("checkpoint_committed", "m1", manifest=manifest())])
    gen = Generation.objects.get()
    seq = gen.seq
    again = manifest(committed_at="2026-11-01T02:06:00+02:00")
    r = post(client, ingest_token, [event("checkpoint_committed", "m2", manifest=again)])
    assert r.status_code == 202, r.content
    gen.refresh_from_db()
    assert (gen.manifest_conflict, gen.conflicting_manifest, gen.seq) == (False, None, seq)
    assert gen.committed_at == datetime(2026, 11, 1, 0, 1, tzinfo=UTC)
    assert gen.manifest["committed_at"] == "2026-11-01T02:01:00+02:00"
    post(client, ingest_token, [event("checkpoint_committed", "m3",
                                      manifest=manifest(committed_at="2026-11-01T02:07:00+02:00",
                                                        update=4))])
    gen.refresh_from_db()
    assert gen.manifest_conflict and gen.conflicting_manifest["update"] == 4


def test_it_records_restore_and_end_of_an_attempt(client, ingest_token):
    post(client, ingest_token, [
        event("restore_completed", "r", attempt=1, generation_id="g1", seconds=12),
        event("attempt_ended", "x", attempt=1, reason="preempted", update=9, message="bye",
              fetched=[{"stratum": "main", "epoch": 0, "position": 72}])])
    att = Attempt.objects.get()
    assert (att.restore_generation_id, att.restore_seconds) == ("g1", 12.0)
    assert (att.end_reason, att.end_update, att.end_message) == ("preempted", 9, "bye")
    assert att.fetched == [{"stratum": "main", "epoch": 0, "position": 72}]


def test_it_records_a_failed_restore_before_the_attempt_started(client, ingest_token):
    post(client, ingest_token, [
        event("restore_failed", "f1", attempt=2, generation_id="g60", reason="object_damaged",
              message="model/__0_0.distcp: 512 bytes, manifest says 1024",
              time="2026-11-01T00:00:05Z"),
        event("restore_failed", "f1b", attempt=2, generation_id="g60", reason="object_damaged",
              message="resent", time="2026-11-01T00:00:06Z")])
    att = Attempt.objects.get()
    assert att.started_at is None and att.restore_failed
    assert att.restore_failures == [{
        "generation_id": "g60", "reason": "object_damaged",
        "message": "model/__0_0.distcp: 512 bytes, manifest says 1024",
        "time": "2026-11-01T00:00:05+00:00", "rank": None}]
    post(client, ingest_token, [event("restore_completed", "r", attempt=2, generation_id="g40",
                                      seconds=3, time="2026-11-01T00:00:09Z")])
    att.refresh_from_db()
    assert att.restore_generation_id == "g40" and not att.restore_failed


def test_it_refuses_a_restore_failed_without_a_known_reason(client, ingest_token):
    r = post(client, ingest_token, [event("restore_failed", "f", generation_id="g1",
                                          reason="oops")])
    assert r.status_code == 400
    assert "events[0].reason" in r.content.decode()
    assert not Attempt.objects.exists()


def test_it_stores_audit_windows(client, ingest_token):
    post(client, ingest_token, [event("audit_window", "aw", update=3, rank=1, accum_slot=2,
                                      sample_ids=["x", 7])])
    aw = AuditWindow.objects.get()
    assert (aw.update, aw.rank, aw.accum_slot, aw.sample_ids) == (3, 1, 2, ["x", 7])


def test_it_updates_run_times_and_counts(client, ingest_token):
    post(client, ingest_token, [update("a", 1, time="2026-11-01T00:00:10Z"),
                                update("b", 2, time="2026-11-01T01:00:00+01:00")])
    post(client, ingest_token, [update("c", 3, time="2026-11-01T00:00:20Z")])
    run = Run.objects.get()
    assert run.first_event_at == datetime(2026, 11, 1, 0, 0, 0, tzinfo=UTC)
    assert run.last_event_at == datetime(2026, 11, 1, 0, 0, 20, tzinfo=UTC)
    seqs = list(Event.objects.order_by("pk").values_list("batch_seq", flat=True))
    assert run.event_count == 3 and run.ingest_seq == seqs[2] and run.strata == {"main": "ranges"}
    assert batch_order(seqs) == [1, 1, 2]


def test_it_stores_the_body_as_received(client, ingest_token, scenario_loader, tmp_path):
    events, _ = scenario_loader("s4_rank_dies_during_save", str(tmp_path))
    post(client, ingest_token, events)
    stored = {e.event_id: e.body for e in Event.objects.all()}
    assert all(stored[e["event_id"]] == stored_body(e["type"], json.loads(json.dumps(e)))
               for e in events)
