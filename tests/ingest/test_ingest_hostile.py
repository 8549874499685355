"""Hostile and unlucky input at ingest: identifiers every URL can carry, times Python cannot
represent, one object URI claimed by two shards, unknown fields nested too deep, and batches
full of errors that must cost a bounded amount of work and count against the rate limit."""

from __future__ import annotations

import json

import pytest
from ingest_support import event, post, update

from recoverydash.ingest import schemas
from recoverydash.runs.models import Event, Generation

pytestmark = pytest.mark.django_db

RULE = ("expected 1-200 characters from A-Z a-z 0-9 _ . - : = @ + ~, not starting with '.' or "
        "'-' (no '/', no spaces)")


def errors_of(response) -> list[dict]:
    assert response.status_code == 400, response.content
    return response.json()["errors"]


def manifest(generation_id="g10", objects=None, **fields):
    return {"schema_revision": 1, "generation_id": generation_id, "update": 10, "world_size": 2,
            "required_shards": ["rank0", "rank1"], "components": ["model"],
            "objects": objects if objects is not None else [
                {"uri": "s3://b/g10/rank0.pt", "shard": "rank0", "component": "model",
                 "size": 55},
                {"uri": "s3://b/g10/rank1.pt", "shard": "rank1", "component": "model",
                 "size": 55}],
            "data_progress": {"cursor": [{"stratum": "main", "epoch": 0, "position": 80}]},
            "dataset_version": "v1", "committed_at": "2026-11-01T00:10:00Z", **fields}


# --- identifiers --------------------------------------------------------------------------------
@pytest.mark.parametrize("generation_id", ["a/b", "/abs", ".", "..", ".hidden", "-flag",
                                           "two words", "q?x", "x#y", "50%", "g" * 201, ""])
def test_a_generation_id_no_url_can_carry_is_refused_naming_the_rule(client, ingest_token,
                                                                      generation_id):
    r = post(client, ingest_token, [event("checkpoint_started", "c", generation_id=generation_id,
                                          update=10)])
    [err] = errors_of(r)
    assert err["index"] == 0 and err["path"] == "events[0].generation_id"
    if generation_id and len(generation_id) <= 200:
        assert err["message"] == f"{RULE}, got {json.dumps(generation_id)}"


@pytest.mark.parametrize("generation_id", ["g10", "u000000010-a0", "epoch=3-step=100",
                                           "step_100.final", "run:7@v2+x~1", "_tmp"])
def test_common_generation_id_spellings_are_accepted(client, ingest_token, generation_id):
    r = post(client, ingest_token, [event("checkpoint_started", "c", generation_id=generation_id,
                                          update=10)])
    assert r.status_code == 202, r.content
    assert Generation.objects.get().generation_id == generation_id


@pytest.mark.parametrize("where, body", [
    ("events[0].manifest.generation_id", event("checkpoint_committed", "m",
                                               manifest=manifest("g/10"))),
    ("events[0].manifest.objects[1].shard", event("checkpoint_committed", "m", manifest=manifest(
        objects=[{"uri": "s3://b/x0", "shard": "rank0", "component": "model", "size": 1},
                 {"uri": "s3://b/x1", "shard": "rank/1", "component": "model", "size": 1}]))),
    ("events[0].manifest.required_shards[1]", event("checkpoint_committed", "m",
                                                    manifest=manifest(required_shards=[
                                                        "rank0", "../rank1"]))),
    ("events[0].shard", event("shard_written", "s", generation_id="g10", shard="rank 0",
                              update=10, objects=[])),
    ("events[0].resumed_from.generation_id", event(
        "attempt_started", "a", world_size=2, dataset_version="v1",
        resumed_from={"generation_id": "ckpt/g10", "update": 10})),
    ("events[0].generation_id", event("restore_completed", "r", generation_id="g/10",
                                      seconds=1.5)),
])
def test_every_generation_id_and_shard_field_follows_the_rule(client, ingest_token, where, body):
    [err] = errors_of(post(client, ingest_token, [body]))
    assert err["path"] == where and err["message"].startswith(RULE)


def test_the_identifier_rule_is_in_the_openapi_schema(client):
    schema = client.get("/api/v1/openapi.json").json()["components"]["schemas"]
    for model, field in (("CheckpointStarted", "generation_id"), ("ShardWritten", "shard"),
                         ("ManifestV1", "generation_id"), ("ManifestObject", "shard")):
        prop = schema[model]["properties"][field]
        assert prop["pattern"] == schemas.ID_PATTERN, (model, prop)


# --- times --------------------------------------------------------------------------------------
@pytest.mark.parametrize("time", ["9999-12-31T23:59:59-01:00", "9999-12-31T23:59:59.999999Z",
                                  "0001-01-01T00:00:00+00:01"])
def test_a_time_outside_what_python_represents_is_refused_naming_the_field(client, ingest_token,
                                                                           time):
    [err] = errors_of(post(client, ingest_token, [update("a", 1, time=time)]))
    assert err == {"index": 0, "path": "events[0].time",
                   "message": "expected a time between 0001-01-01 and 9999-12-31 in UTC, got "
                              f"{json.dumps(time)}"}


def test_year_0_is_refused_as_no_real_date(client, ingest_token):
    [err] = errors_of(post(client, ingest_token, [update("a", 1, time="0000-06-01T00:00:00Z")]))
    assert err["path"] == "events[0].time"
    assert err["message"] == 'expected a real date and time with offset, got "0000-06-01T00:00:00Z"'


def test_a_committed_at_outside_the_range_is_refused_naming_the_manifest_field(client,
                                                                               ingest_token):
    body = event("checkpoint_committed", "m",
                 manifest=manifest(committed_at="9999-12-31T23:30:00-02:00"))
    [err] = errors_of(post(client, ingest_token, [body]))
    assert err["path"] == "events[0].manifest.committed_at"


def test_the_edges_python_represents_are_accepted(client, ingest_token):
    r = post(client, ingest_token, [update("a", 1, time="9999-12-31T23:59:58Z"),
                                    update("b", 2, time="0001-01-01T00:00:00Z")])
    assert r.status_code == 202, r.content


@pytest.mark.parametrize("time", ["2026-11-01T00:00:00+20:40", "2026-11-01T00:00:00-16:00",
                                  "2026-11-01T00:00:00+23:59"])
def test_an_offset_postgresql_cannot_store_is_refused_naming_the_field(client, ingest_token,
                                                                       time):
    [err] = errors_of(post(client, ingest_token, [update("a", 1, time=time)]))
    assert err == {"index": 0, "path": "events[0].time",
                   "message": "expected a UTC offset between -15:59 and +15:59, got "
                              f"{json.dumps(time)}"}


def test_a_committed_at_with_such_an_offset_is_refused_naming_the_manifest_field(client,
                                                                                 ingest_token):
    body = event("checkpoint_committed", "m",
                 manifest=manifest(committed_at="2026-11-01T00:10:00+16:00"))
    [err] = errors_of(post(client, ingest_token, [body]))
    assert err["path"] == "events[0].manifest.committed_at"
    assert not Generation.objects.exists()


def test_the_widest_offsets_postgresql_stores_are_accepted_and_kept(client, ingest_token):
    r = post(client, ingest_token, [update("a", 1, time="2026-11-01T00:00:00+15:59"),
                                    update("b", 2, time="2026-11-01T00:00:00-15:59")])
    assert r.status_code == 202, r.content
    stored = {e.event_id: e.time.isoformat() for e in Event.objects.all()}
    assert stored == {"a": "2026-10-31T08:01:00+00:00", "b": "2026-11-01T15:59:00+00:00"}


# --- one URI, two shards ------------------------------------------------------------------------
def test_a_manifest_listing_one_uri_under_two_shards_is_refused_naming_both(client,
                                                                           ingest_token):
    objects = [{"uri": "s3://b/g10/model.pt", "shard": "rank0", "component": "model",
                "size": 55},
               {"uri": "s3://b/g10/model.pt", "shard": "rank1", "component": "model",
                "size": 55}]
    [err] = errors_of(post(client, ingest_token, [
        event("checkpoint_committed", "m", manifest=manifest(objects=objects))]))
    assert err["path"] == "events[0].manifest.objects[1].uri"
    assert err["message"] == (
        "expected each object URI in one shard, got \"s3://b/g10/model.pt\" in shard 'rank1' "
        "and in shard 'rank0' (events[0].manifest.objects[0]): two shards writing one object "
        "overwrite each other")
    assert not Generation.objects.exists()


def test_a_shard_report_listing_one_uri_twice_with_other_sizes_is_refused(client, ingest_token):
    objects = [{"uri": "file:///ck/g10/a.pt", "component": "model", "size": 55},
               {"uri": "file:///ck/g10/a.pt", "component": "model", "size": 110}]
    [err] = errors_of(post(client, ingest_token, [
        event("shard_written", "s", generation_id="g10", shard="rank0", update=10,
              objects=objects)]))
    assert err["path"] == "events[0].objects[1].uri"
    assert "twice in shard 'rank0' with different size" in err["message"]


# --- depth of unknown fields --------------------------------------------------------------------
def nested(depth: int):
    value = "x"
    for _ in range(depth):
        value = {"a": value}
    return value


def test_an_unknown_field_nested_at_the_limit_is_kept(client, ingest_token):
    body = update("a", 1, x_note=nested(schemas.MAX_EXTRA_DEPTH))
    assert post(client, ingest_token, [body]).status_code == 202
    assert Event.objects.get().body["x_note"] == nested(schemas.MAX_EXTRA_DEPTH)


@pytest.mark.parametrize("depth", [schemas.MAX_EXTRA_DEPTH + 1, 200, 700])
def test_an_unknown_field_nested_deeper_is_refused_naming_it(client, ingest_token, depth):
    body = update("a", 1, spans=[{"stratum": "main", "epoch": 0, "ranges": [[0, 8]],
                                  "x_deep": nested(depth)}])
    [err] = errors_of(post(client, ingest_token, [body]))
    assert err == {"index": 0, "path": "events[0].spans[0].x_deep",
                   "message": "expected a value nested at most 32 levels (objects and arrays), "
                              "got one nested deeper"}
    assert not Event.objects.exists()


def test_a_body_nested_beyond_what_the_parser_follows_is_a_400(client, ingest_token):
    depth = 944
    data = ('{"events": [{"x": ' + '{"a": ' * depth + '1' + '}' * depth + '}]}').encode()
    r = post(client, ingest_token, body=data)
    assert r.status_code == 400


def test_a_free_form_sampler_seed_nested_too_deep_is_refused(client, ingest_token):
    body = event("attempt_started", "a", world_size=2, dataset_version="v1",
                 sampler={"seed": nested(40)})
    [err] = errors_of(post(client, ingest_token, [body]))
    assert err["path"] == "events[0].sampler.seed"


# --- bounded work for bad batches ---------------------------------------------------------------
def bad_event(i: int) -> dict:
    """An update_committed with 31 mistakes: 30 backwards ranges and a string count."""
    return {"event_id": f"e{i}", "type": "update_committed", "run_id": "r", "attempt": 0,
            "time": "2026-11-01T00:00:05Z", "update": 1, "samples": "x",
            "spans": [{"stratum": "s", "epoch": 0, "ranges": [[5, 1]]} for _ in range(30)]}


def test_a_batch_of_3000_events_with_31_errors_each_stops_after_100_errors(client, ingest_token,
                                                                           monkeypatch):
    """Before: every one of the 93,000 errors was built (5 s of CPU per request). Now each list
    stops at its first bad item and the batch at its 100th error: 50 events are looked at."""
    looked_at = []
    real = schemas.EventAdapter.validate_python

    class Counting:
        def validate_python(self, value, *args, **kwargs):
            looked_at.append(value["event_id"])
            return real(value, *args, **kwargs)

    monkeypatch.setattr(schemas, "EventAdapter", Counting())
    r = post(client, ingest_token, [bad_event(i) for i in range(3000)])
    errors = errors_of(r)
    assert len(errors) == 100
    assert errors[:2] == [
        {"index": 0, "path": "events[0].spans[0].ranges[0]",
         "message": "expected start <= stop, got [5, 1]"},
        {"index": 0, "path": "events[0].samples",
         "message": "expected a valid integer, got \"x\""}]
    assert looked_at == [f"e{i}" for i in range(50)]


def test_a_good_batch_after_a_bad_chunk_is_still_validated_whole(client, ingest_token):
    batch = [update(f"u{i}", i + 1) for i in range(600)]
    batch[300]["attempt"] = -1
    [err] = errors_of(post(client, ingest_token, batch))
    assert err["path"] == "events[300].attempt"
    del batch[300]["attempt"]
    batch[300]["attempt"] = 0
    assert post(client, ingest_token, batch).status_code == 202


def test_a_million_bad_items_in_one_list_cost_one_error(client, ingest_token):
    body = update("a", 1, spans=[{"stratum": "s", "epoch": 0, "ids": [None] * 1_000_000}])
    [err] = errors_of(post(client, ingest_token, [body]))
    assert err["path"] == "events[0].spans[0].ids[0]"


@pytest.mark.parametrize("bad", [
    {"body": b"{not json"},
    {"body": json.dumps({"events": [{"type": "nope"}]}).encode()},
    {"body": b"{}", "content_type": "text/plain"},
])
def test_the_rate_limit_counts_refused_requests_too(client, ingest_token, settings, bad):
    settings.RECOVERYDASH_RATE_LIMIT_PER_SECOND = 0.001
    settings.RECOVERYDASH_RATE_LIMIT_BURST = 3
    codes = [post(client, ingest_token, **bad).status_code for _ in range(3)]
    assert codes[0] in (400, 415) and len(set(codes)) == 1
    assert post(client, ingest_token, [update("a", 1)]).status_code == 429


def test_a_second_shard_claiming_an_object_uri_is_refused_naming_both(client, ingest_token):
    obj = {"uri": "s3://b/g10/model.pt", "component": "model", "size": 55}
    first = event("shard_written", "s0", generation_id="g10", shard="rank0", update=10,
                  objects=[obj])
    assert post(client, ingest_token, [first]).status_code == 202
    second = event("shard_written", "s1", generation_id="g10", shard="rank1", update=10,
                   objects=[{"uri": "s3://b/g10/other.pt", "component": "model", "size": 55},
                            obj])
    [err] = errors_of(post(client, ingest_token, [second]))
    assert err == {"index": 0, "path": "events[0].objects[1].uri",
                   "message": "expected each object URI in one shard, got "
                              "'s3://b/g10/model.pt' in shard 'rank1' while a shard report of "
                              "generation 'g10' lists it in shard 'rank0': two shards writing "
                              "one object overwrite each other"}
    assert not Event.objects.filter(event_id="s1").exists()


def test_a_manifest_giving_a_reported_object_to_another_shard_is_refused(client, ingest_token):
    post(client, ingest_token, [event("shard_written", "s0", generation_id="g10", shard="rank0",
                                      update=10, objects=[{"uri": "s3://b/g10/rank1.pt",
                                                           "component": "model", "size": 55}])])
    [err] = errors_of(post(client, ingest_token, [
        event("checkpoint_committed", "m", manifest=manifest())]))
    assert err["path"] == "events[0].manifest.objects[1].uri"
    assert "in shard 'rank1' while a shard report of generation 'g10' lists it in shard " \
           "'rank0'" in err["message"]


def test_matching_shard_reports_and_manifest_are_accepted(client, ingest_token):
    m = manifest()
    reports = [event("shard_written", f"s{j}", generation_id="g10", shard=o["shard"], update=10,
                     objects=[o]) for j, o in enumerate(m["objects"])]
    assert post(client, ingest_token, reports).status_code == 202
    assert post(client, ingest_token, [event("checkpoint_committed", "m", manifest=m)]) \
        .status_code == 202


# --- a reused attempt over plain HTTP -----------------------------------------------------------
def started(event_id, rank=0, **fields):
    values = {"world_size": 8, "dataset_version": "ds-v1", "global_batch_size": 64,
              "resumed_from": {"generation_id": "g10", "update": 10,
                               "cursor": [{"stratum": "main", "epoch": 0, "position": 640}]}}
    values.update(fields)
    return event("attempt_started", event_id, attempt=1, rank=rank, **values)


def test_a_relaunch_reusing_an_attempt_is_a_409_and_overwrites_nothing(client, ingest_token):
    from recoverydash.runs.models import Attempt

    assert post(client, ingest_token, [started("launch-a")]).status_code == 202
    r = post(client, ingest_token, [update("x", 11, attempt=1),
                                    started("launch-b", world_size=16, dataset_version="ds-v2",
                                            time="2026-11-01T02:00:00Z")])
    assert r.status_code == 409
    body = r.json()
    assert body["error"] == "attempt_conflict" and body["index"] == 1
    assert body["errors"] == [{
        "index": 1, "path": "events[1]",
        "message": "attempt 1 of run 'run-1' already started with other values (world_size 8 "
                   "-> 16, dataset_version 'ds-v1' -> 'ds-v2'); expected a new attempt number "
                   "for a relaunch (another rank of the same launch reports the same values)"}]
    att = Attempt.objects.get(attempt=1)
    assert (att.world_size, att.dataset_version) == (8, "ds-v1")
    assert not Event.objects.filter(event_id__in=["x", "launch-b"]).exists()


def test_a_relaunch_resuming_another_generation_under_the_same_attempt_is_a_409(client,
                                                                               ingest_token):
    assert post(client, ingest_token, [started("launch-a")]).status_code == 202
    r = post(client, ingest_token, [started("launch-b", resumed_from={
        "generation_id": "g20", "update": 20})])
    assert r.status_code == 409
    assert "resumed_from ('g10', 10) -> ('g20', 20)" in r.json()["errors"][0]["message"]


def test_every_rank_may_report_the_start_of_its_attempt(client, ingest_token):
    batch = [started(f"start-r{rank}", rank=rank, resumed_from={
        "generation_id": "g10", "update": 10,
        "cursor": [{"stratum": f"part{rank}", "epoch": 0, "position": 80}]}) for rank in range(8)]
    r = post(client, ingest_token, batch)
    assert r.status_code == 202 and r.json()["accepted"] == 8


def test_two_different_starts_of_one_attempt_in_one_batch_are_a_409(client, ingest_token):
    r = post(client, ingest_token, [started("a"), started("b", world_size=4)])
    assert r.status_code == 409 and r.json()["index"] == 1


# --- what the trainer could not deliver ---------------------------------------------------------
def test_the_sdk_losses_a_heartbeat_reports_reach_the_run_page(client, ingest_token, project):
    from django.contrib.auth import get_user_model

    from recoverydash.runs.models import Attempt, Membership, Run

    beats = [event("heartbeat", "h1", rank=3, update=1210, sdk_dropped=100,
                   sdk_lost_updates=[1200, 1210]),
             event("heartbeat", "h2", rank=3, update=1250, sdk_dropped=120,
                   sdk_lost_updates=[1200, 1250], time="2026-11-01T00:05:00Z"),
             event("heartbeat", "h3", rank=5, update=1250, sdk_quarantined=2,
                   sdk_lost_updates=[1230, 1231])]
    assert post(client, ingest_token, beats).status_code == 202
    att = Attempt.objects.get()
    assert att.sdk_losses == {"3": {"dropped": 120, "quarantined": 0, "updates": [1200, 1250]},
                              "5": {"dropped": 0, "quarantined": 2, "updates": [1230, 1231]}}
    assert att.sdk_loss_summary == {"dropped": 120, "quarantined": 2, "updates": [1200, 1250],
                                    "ranks": ["3", "5"]}
    user = get_user_model().objects.create_user("oncall", password="x" * 12)
    Membership.objects.create(project=project, user=user)
    client.force_login(user)
    page = client.get(f"/runs/{Run.objects.get().pk}/", follow=True).content.decode()
    assert ("The trainer (attempt 0, ranks 3, 5) dropped 120 events and set aside 2 the server "
            "would not take") in page
    assert "omissions near updates 1,200–1,250 may be unexplained" in page


def test_sdk_loss_fields_of_the_wrong_shape_are_refused(client, ingest_token):
    [err] = errors_of(post(client, ingest_token, [
        event("heartbeat", "h", update=1, sdk_lost_updates=[9, 3])]))
    assert err["path"] == "events[0].sdk_lost_updates"
