"""POST /api/v1/events and GET /api/v1/runs: every status code of docs/ingest-v1.md#errors,
idempotency, atomicity, cross-project isolation, gzip, limits, the rate limit (process-local and
Redis)."""

from __future__ import annotations

import gzip
import json
import time
from datetime import UTC

import pytest
import redis
from ingest_support import URL, batch_order, event, post, strided_batch, update

from recoverydash.ingest.actions import stored_body
from recoverydash.runs.models import ApiToken, Event, LedgerRow, Run

pytestmark = pytest.mark.django_db

REDIS_URL = "redis://127.0.0.1:6379/0"


def errors_of(response) -> list[dict]:
    body = response.json()
    assert set(body) >= {"error", "errors"}, body
    return body["errors"]


# --- 202 and idempotency ------------------------------------------------------------------------
def test_it_accepts_a_batch_and_stores_every_event(client, ingest_token):
    r = post(client, ingest_token, [update("a", 1), update("b", 2)])
    assert r.status_code == 202
    assert r.json() == {"accepted": 2, "duplicates": 0}
    assert Event.objects.count() == 2
    run = Run.objects.get(run_id="run-1")
    assert run.event_count == 2 and run.last_received_at is not None
    assert run.ingest_seq == Event.objects.get(event_id="a").batch_seq > 0


def test_it_accepts_an_empty_batch(client, ingest_token):
    r = post(client, ingest_token, [])
    assert r.status_code == 202 and r.json() == {"accepted": 0, "duplicates": 0}


def test_it_counts_a_resent_event_as_a_duplicate(client, ingest_token):
    post(client, ingest_token, [update("a", 1)])
    r = post(client, ingest_token, [update("a", 1), update("b", 2)])
    assert r.status_code == 202 and r.json() == {"accepted": 1, "duplicates": 1}
    assert Event.objects.count() == 2


def test_it_counts_duplicates_within_one_batch(client, ingest_token):
    r = post(client, ingest_token, [update("a", 1), update("a", 1), update("a", 1)])
    assert r.json() == {"accepted": 1, "duplicates": 2}


def test_it_treats_reordered_keys_as_the_same_content(client, ingest_token):
    ev = update("a", 1)
    post(client, ingest_token, [ev])
    reordered = dict(reversed(list(ev.items())))
    r = post(client, ingest_token, [reordered])
    assert r.json() == {"accepted": 0, "duplicates": 1}


def test_it_refuses_a_changed_event_with_409_naming_the_index(client, ingest_token):
    post(client, ingest_token, [update("a", 1)])
    r = post(client, ingest_token, [update("x", 5), update("y", 6), update("a", 1, width=9)])
    assert r.status_code == 409
    body = r.json()
    assert body["error"] == "event_conflict" and body["index"] == 2
    assert body["errors"][0]["index"] == 2 and "'a'" in body["errors"][0]["message"]
    assert Event.objects.count() == 1  # nothing of the batch stored


def test_it_refuses_a_changed_event_within_one_batch(client, ingest_token):
    r = post(client, ingest_token, [update("a", 1), update("b", 2), update("a", 1, width=3)])
    assert r.status_code == 409 and r.json()["index"] == 2
    assert Event.objects.count() == 0


# --- atomicity ----------------------------------------------------------------------------------
def test_it_stores_nothing_when_one_event_of_a_thousand_is_bad(client, ingest_token):
    events = strided_batch("run-1", 1, 1000)
    events[737]["spans"][0]["ranges"][0] = [10, 5]
    r = post(client, ingest_token, events)
    assert r.status_code == 400
    assert errors_of(r) == [{"index": 737, "path": "events[737].spans[0].ranges[0]",
                             "message": "expected start <= stop, got [10, 5]"}]
    assert Event.objects.count() == 0 and LedgerRow.objects.count() == 0
    assert not Run.objects.exists()


def test_it_stores_nothing_when_a_late_conflict_is_found(client, ingest_token):
    post(client, ingest_token, [update("e-5-3", 1)])
    events = strided_batch("run-1", 1, 1000)
    r = post(client, ingest_token, events)
    assert r.status_code == 409 and r.json()["index"] == events.index(
        next(e for e in events if e["event_id"] == "e-5-3"))
    assert Event.objects.count() == 1 and LedgerRow.objects.count() == 1


# --- isolation ----------------------------------------------------------------------------------
def test_it_keeps_runs_of_other_projects_apart(client, ingest_token, other_token, project,
                                               other_project, full_token):
    post(client, other_token, [update("a", 1)])
    r = post(client, ingest_token, [update("a", 1, width=3)])  # same ids, other project: no 409
    assert r.status_code == 202 and r.json() == {"accepted": 1, "duplicates": 0}
    mine, theirs = (Run.objects.get(project=p, run_id="run-1") for p in (project, other_project))
    assert mine.pk != theirs.pk and theirs.event_count == 1 and mine.event_count == 1
    runs = client.get("/api/v1/runs", headers={"Authorization": f"Bearer {full_token}"}).json()
    assert [r["run_id"] for r in runs] == ["run-1"] and runs[0]["event_count"] == 1
    assert LedgerRow.objects.filter(run=theirs).get().spans[0]["ranges"] == [[0, 8]]


# --- 401 / 403 ----------------------------------------------------------------------------------
def test_it_answers_401_without_a_token(client):
    r = post(client, None, [update("a", 1)])
    assert r.status_code == 401 and r.json()["error"] == "unauthorized"
    assert r.headers["WWW-Authenticate"].startswith("Bearer")


def test_it_answers_401_for_an_unknown_or_malformed_token(client, ingest_token):
    assert post(client, "rdt_nope", [update("a", 1)]).status_code == 401
    r = client.post(URL, data="{}", content_type="application/json",
                    headers={"Authorization": "Basic abc"})
    assert r.status_code == 401


def test_it_answers_401_for_a_revoked_token(client, project):
    token, raw = ApiToken.issue(project, ["ingest"])
    token.revoke()
    assert post(client, raw, [update("a", 1)]).status_code == 401


def test_it_answers_403_for_a_token_without_the_scope(client, read_token, ingest_token):
    r = post(client, read_token, [update("a", 1)])
    assert r.status_code == 403 and "ingest" in errors_of(r)[0]["message"]
    r = client.get("/api/v1/runs", headers={"Authorization": f"Bearer {ingest_token}"})
    assert r.status_code == 403


def test_it_records_when_a_token_was_last_used(client, project):
    token, raw = ApiToken.issue(project, ["ingest"])
    post(client, raw, [])
    token.refresh_from_db()
    assert token.last_used_at is not None


# --- 400: body and events -----------------------------------------------------------------------
@pytest.mark.parametrize("body", [b"", b"{", b"[1, 2", b"\xff\xfe{}", b'{"events": [NaN]}',
                                  b'{"events": [1e999999]}'])
def test_it_answers_400_for_a_body_that_is_not_json(client, ingest_token, body):
    r = post(client, ingest_token, body=body)
    assert r.status_code == 400
    assert errors_of(r)[0]["index"] is None and "expected" in errors_of(r)[0]["message"]


@pytest.mark.parametrize("body,path", [(b"[]", ""), (b'{"event": []}', "events"),
                                       (b'{"events": {}}', "events"), (b"3", "")])
def test_it_answers_400_for_json_of_the_wrong_shape(client, ingest_token, body, path):
    r = post(client, ingest_token, body=body)
    assert r.status_code == 400 and errors_of(r)[0]["path"] == path


@pytest.mark.parametrize("mutate,path,needle", [
    (lambda e: e.update(run_id="bad run!"), "events[0].run_id", "pattern"),
    (lambda e: e.update(run_id="x" * 129), "events[0].run_id", "pattern"),
    (lambda e: e.update(run_id=".."), "events[0].run_id", "cannot be '.' or '..'"),
    (lambda e: e.update(run_id="."), "events[0].run_id", "cannot be '.' or '..'"),
    (lambda e: e.update(time="2026-11-01T00:00:05"), "events[0].time", "offset"),
    (lambda e: e.update(time="2026-11-01"), "events[0].time", "offset"),
    (lambda e: e.update(time=1700000000), "events[0].time", "string"),
    (lambda e: e.update(time="2026-02-30T00:00:00Z"), "events[0].time", "real date"),
    (lambda e: e.update(attempt=-1), "events[0].attempt", "greater than or equal to 0"),
    (lambda e: e.update(attempt="1"), "events[0].attempt", "integer"),
    (lambda e: e.update(attempt=True), "events[0].attempt", "integer"),
    (lambda e: e.update(attempt=2**31), "events[0].attempt", "less than"),
    (lambda e: e.update(rank=-2), "events[0].rank", "greater than"),
    (lambda e: e.update(update=0), "events[0].update", "greater than or equal to 1"),
    (lambda e: e.update(event_id=""), "events[0].event_id", "at least 1"),
    (lambda e: e.update(event_id="x" * 201), "events[0].event_id", "at most 200"),
    (lambda e: e.pop("event_id"), "events[0].event_id", "required"),
    (lambda e: e.update(type="update"), "events[0].type", "update_committed"),
    (lambda e: e.pop("type"), "events[0].type", "got nothing"),
    (lambda e: e.pop("spans"), "events[0].spans", "required"),
    (lambda e: e["spans"][0]["ranges"].append([5, 3]), "events[0].spans[0].ranges[1]",
     "start <= stop"),
    (lambda e: e["spans"][0]["ranges"].append([0, 9, 0]), "events[0].spans[0].ranges[1]",
     "step >= 1"),
    (lambda e: e["spans"][0]["ranges"].append([0, 2**63]), "events[0].spans[0].ranges[1][1]",
     "less than or equal"),
    (lambda e: e["spans"][0]["ranges"].append([1]), "events[0].spans[0].ranges[1]", "at least 2"),
    (lambda e: e["spans"][0]["ranges"].append([-1, 3]), "events[0].spans[0].ranges[1][0]",
     "greater than or equal to 0"),
    (lambda e: e["spans"][0].update(ids=[1]), "events[0].spans[0]", "exactly one of ranges or ids"),
    (lambda e: e["spans"][0].pop("ranges"), "events[0].spans[0]", "got neither"),
    (lambda e: e["spans"].append({"stratum": "m", "epoch": 0, "ids": [1, None]}),
     "events[0].spans[1].ids[1]", "integer or a string"),
    (lambda e: e["spans"].append({"stratum": "m", "epoch": 0, "ids": list(range(100_001))}),
     "events[0].spans[1].ids", "at most 100000"),
    (lambda e: e["spans"].append({"stratum": "m", "epoch": 0, "ids": [1], "indices": [1]}),
     "events[0].spans[1]", "indices only beside ranges"),
    (lambda e: e["spans"][0].update(indices=[[9, 3]]), "events[0].spans[0].indices[0]",
     "start <= stop"),
    (lambda e: e["spans"][0].update(indices=[3, -1]), "events[0].spans[0].indices[1]",
     "dataset index in [0, 2**63)"),
    (lambda e: e["spans"][0].update(indices=[3, "7"]), "events[0].spans[0].indices[1]",
     "a range of them"),
    (lambda e: e["spans"][0].update(indices=[0] * 100_001), "events[0].spans[0].indices",
     "at most 100000"),
    (lambda e: e["spans"][0].update(epoch=-1), "events[0].spans[0].epoch", "greater than"),
    (lambda e: e["spans"][0].update(padding="yes"), "events[0].spans[0].padding", "boolean"),
    (lambda e: e.update(note="a\u0000b"), "events[0].note", "NUL"),
    (lambda e: e.update(note={"x": ["\ud800"]}), "events[0].note.x[0]", "surrogate"),
])
def test_it_answers_400_with_the_path_of_the_bad_field(client, ingest_token, mutate, path, needle):
    ev = update("a", 1)
    mutate(ev)
    r = post(client, ingest_token, [update("ok", 2), ev])
    # events[0] of the mutation is index 1 of the batch
    path = path.replace("events[0]", "events[1]", 1)
    assert r.status_code == 400, r.content
    errs = errors_of(r)
    assert errs[0]["path"] == path and errs[0]["index"] == 1, errs
    assert needle.lower() in errs[0]["message"].lower(), errs[0]["message"]
    assert "got" in errs[0]["message"]
    assert Event.objects.count() == 0


VALID_OTHER_TYPES = [
    event("attempt_started", "s", world_size=8, dataset_version="v1"),
    event("heartbeat", "h", update=3, fetched=[{"stratum": "main", "epoch": 0, "position": 9}]),
    event("checkpoint_started", "c", generation_id="g1", update=3),
    event("shard_written", "w", generation_id="g1", shard="rank0", update=3,
          objects=[{"uri": "s3://b/k", "component": "model", "size": 4}]),
    event("restore_completed", "r", generation_id="g1", seconds=2.5),
    event("attempt_ended", "x", reason="failed", update=3),
    event("audit_window", "aw", update=3, rank=1, accum_slot=0, sample_ids=["a", 1]),
]


@pytest.mark.parametrize("ev,mutate,path", [
    (VALID_OTHER_TYPES[0], lambda e: e.update(world_size=0), "world_size"),
    (VALID_OTHER_TYPES[0], lambda e: e.pop("dataset_version"), "dataset_version"),
    (VALID_OTHER_TYPES[0], lambda e: e.update(resumed_from={"update": 1, "cursor": [{}]}),
     "resumed_from.cursor[0].stratum"),
    (VALID_OTHER_TYPES[0], lambda e: e.update(contract={"max_replay_samples": -1}),
     "contract.max_replay_samples"),
    (VALID_OTHER_TYPES[0], lambda e: e.update(sampler={"units": {"main": "bytes"}}),
     "sampler.units.main"),
    (VALID_OTHER_TYPES[1], lambda e: e["fetched"][0].update(position=-1), "fetched[0].position"),
    (VALID_OTHER_TYPES[2], lambda e: e.update(generation_id=7), "generation_id"),
    (VALID_OTHER_TYPES[3], lambda e: e["objects"][0].update(sha256="abc"), "objects[0].sha256"),
    (VALID_OTHER_TYPES[3], lambda e: e["objects"][0].update(size=-1), "objects[0].size"),
    (VALID_OTHER_TYPES[3], lambda e: e.pop("shard"), "shard"),
    (VALID_OTHER_TYPES[4], lambda e: e.update(seconds="2"), "seconds"),
    (VALID_OTHER_TYPES[4], lambda e: e.update(seconds=True), "seconds"),
    (VALID_OTHER_TYPES[5], lambda e: e.update(reason="crashed"), "reason"),
    (VALID_OTHER_TYPES[5], lambda e: e.update(message="m" * 2001), "message"),
    (VALID_OTHER_TYPES[6], lambda e: e.update(sample_ids=list(range(4097))), "sample_ids"),
    (VALID_OTHER_TYPES[6], lambda e: e.pop("rank"), "rank"),
])
def test_it_validates_every_event_type(client, ingest_token, ev, mutate, path):
    ev = json.loads(json.dumps(ev))
    assert post(client, ingest_token, [ev]).status_code == 202
    ev["event_id"] += "-bad"
    mutate(ev)
    r = post(client, ingest_token, [ev])
    assert r.status_code == 400, r.content
    assert errors_of(r)[0]["path"] == f"events[0].{path}", errors_of(r)


def manifest(**over) -> dict:
    doc = {"schema_revision": 1, "generation_id": "g1", "update": 3, "world_size": 1,
           "required_shards": ["rank0"], "components": ["model"],
           "objects": [{"uri": "file:///tmp/x", "shard": "rank0", "component": "model",
                        "size": 4, "sha256": "a" * 64}],
           "data_progress": {"cursor": [{"stratum": "main", "epoch": 0, "position": 24}]},
           "dataset_version": "v1", "committed_at": "2026-11-01T00:01:00+02:00"}
    doc.update(over)
    return doc


@pytest.mark.parametrize("over,path", [
    ({"schema_revision": "1"}, "manifest.schema_revision"),
    ({"world_size": 0}, "manifest.world_size"),
    ({"committed_at": "yesterday"}, "manifest.committed_at"),
    ({"objects": [{"uri": "s3://b/k", "component": "model", "size": 1}]},
     "manifest.objects[0].shard"),
    ({"data_progress": {"cursor": [{"stratum": "m", "epoch": 0}]}},
     "manifest.data_progress.cursor[0].position"),
    ({"adopted": {"rule": "by hand"}}, "manifest.adopted.format"),
    ({"adopted": {"format": "dcp", "reasons": [{"detail": "no code"}]}},
     "manifest.adopted.reasons[0].code"),
])
def test_it_validates_a_revision_1_manifest(client, ingest_token, over, path):
    ev = event("checkpoint_committed", "m", manifest=manifest(**over))
    r = post(client, ingest_token, [ev])
    assert r.status_code == 400 and errors_of(r)[0]["path"] == f"events[0].{path}", errors_of(r)


def test_it_refuses_a_trainers_manifest_claiming_to_be_adopted_and_documents_the_field(
        client, ingest_token):
    # adopted reasons replace the shard and component rules: only the server's adoption of a
    # folder may set them, never a token holder
    adopted = {"format": "dcp", "rule": "committed by .metadata", "folder": "step-10",
               "commit_marker": "step-10/.metadata", "progress": {"global_step": 10},
               "reasons": []}
    ev = event("checkpoint_committed", "m", manifest=manifest(adopted=adopted))
    r = post(client, ingest_token, [ev])
    assert r.status_code == 400
    assert errors_of(r)[0]["path"] == "events[0].manifest.adopted"
    assert "only the server's own adoption" in errors_of(r)[0]["message"]
    assert not Event.objects.exists()
    schemas = client.get("/api/v1/openapi.json").json()["components"]["schemas"]
    assert "adopted" in schemas["ManifestV1"]["properties"]
    assert schemas["Adopted"]["required"] == ["format"]
    assert schemas["AdoptedReason"]["required"] == ["code"]


def test_it_accepts_the_adopted_field_from_the_servers_adoption_only(project):
    from recoverydash.ingest.actions import ingest_batch

    adopted = {"format": "dcp", "reasons": [{"code": "size_mismatch", "detail": "short"}]}
    ev = event("checkpoint_committed", "m", manifest=manifest(adopted=adopted))
    assert ingest_batch(project, [ev], adopted=True).accepted == 1
    assert Event.objects.get().body["manifest"]["adopted"] == adopted


def test_it_stores_a_manifest_of_an_unsupported_revision_for_the_analysis(client, ingest_token):
    doc = {"schema_revision": 2, "generation_id": "g9", "anything": {"new": True}}
    r = post(client, ingest_token, [event("checkpoint_committed", "m", manifest=doc)])
    assert r.status_code == 202
    from recoverydash.runs.models import Generation

    gen = Generation.objects.get(generation_id="g9")
    assert gen.manifest == doc and gen.status == "committed" and gen.committed_at is None


def test_it_lists_at_most_100_errors(client, ingest_token):
    events = [update(f"e{i}", 1, attempt=-1) for i in range(300)]
    r = post(client, ingest_token, events)
    assert r.status_code == 400 and len(errors_of(r)) == 100
    assert errors_of(r)[99]["index"] == 99


def test_it_keeps_unknown_fields_verbatim(client, ingest_token):
    ev = update("a", 1, future={"nested": [1, "two", None, 3.5]}, ünïcode="✓")
    ev["spans"][0]["order"] = "seed=1"
    ev["spans"][0]["future_span_field"] = 1
    assert post(client, ingest_token, [ev]).status_code == 202
    # an update_committed's Event row keeps what its ledger row does not hold (unknown fields
    # included); the ledger row keeps the spans as sent, unknown span fields included
    assert Event.objects.get().body == {"update": 1, "future": ev["future"], "ünïcode": "✓"}
    assert Event.objects.get().body == stored_body("update_committed", ev)
    row = LedgerRow.objects.get()
    assert (row.rank, row.update, row.spans) == (ev["rank"], 1, ev["spans"])
    # any other type's body is kept whole, as received
    other = {"event_id": "hb", "type": "heartbeat", "run_id": ev["run_id"], "attempt": 0,
             "rank": 0, "time": ev["time"], "update": 1, "future": [1]}
    assert post(client, ingest_token, [other]).status_code == 202
    assert Event.objects.get(event_id="hb").body == other
    # the same event again is a duplicate, other content under its id a 409 naming it
    assert post(client, ingest_token, [ev]).json() == {"accepted": 0, "duplicates": 1}
    changed = dict(ev, samples=3)
    r = post(client, ingest_token, [changed])
    assert r.status_code == 409 and "'a'" in r.content.decode()


def test_it_refuses_a_stratum_that_switches_from_ranges_to_ids(client, ingest_token):
    assert post(client, ingest_token, [update("a", 1)]).status_code == 202
    ids_span = [{"stratum": "main", "epoch": 0, "ids": ["s1", "s2"]}]
    r = post(client, ingest_token, [update("b", 2, spans=[{"stratum": "other", "epoch": 0,
                                                            "ids": [1]}] + ids_span)])
    assert r.status_code == 400
    assert errors_of(r)[0]["path"] == "events[0].spans[1].ids"
    assert "ranges" in errors_of(r)[0]["message"]
    # within one batch too
    r = post(client, ingest_token, [update("c", 3, run_id="run-2", spans=ids_span),
                                    update("d", 4, run_id="run-2")])
    assert r.status_code == 400 and errors_of(r)[0]["path"] == "events[1].spans[0].ranges"


# --- gzip, 413, 415 -----------------------------------------------------------------------------
def test_it_accepts_a_gzip_body(client, ingest_token):
    r = post(client, ingest_token, strided_batch("run-1", 1, 100), gz=True)
    assert r.status_code == 202 and r.json()["accepted"] == 100


@pytest.mark.parametrize("data", [b"not gzip at all",
                                  gzip.compress(b'{"events": []}', mtime=0)[:-6],
                                  gzip.compress(b'{"events": []}', mtime=0) + b"junk"],
                         ids=["not gzip", "truncated", "trailing junk"])
def test_it_answers_400_for_gzip_that_does_not_inflate(client, ingest_token, data):
    r = post(client, ingest_token, body=data, encoding="gzip")
    assert r.status_code == 400 and "gzip" in errors_of(r)[0]["message"]


def test_it_answers_413_over_the_events_limit(client, ingest_token, settings):
    settings.RECOVERYDASH_MAX_EVENTS_PER_REQUEST = 10
    assert post(client, ingest_token, strided_batch("r", 1, 10)).status_code == 202
    r = post(client, ingest_token, strided_batch("r", 1, 11))
    assert r.status_code == 413 and r.json()["error"] == "too_large"


def test_it_answers_413_for_10001_events_by_default(client, ingest_token):
    r = post(client, ingest_token, [{}] * 10_001)
    assert r.status_code == 413


def test_it_answers_413_over_the_body_limit(client, ingest_token, settings):
    settings.RECOVERYDASH_MAX_BODY_BYTES = 4096
    body = json.dumps({"events": [update("a", 1, pad="x" * 5000)]}).encode()
    assert post(client, ingest_token, body=body).status_code == 413


def test_it_stops_inflating_at_the_limit(client, ingest_token, settings):
    settings.RECOVERYDASH_MAX_BODY_BYTES = 1024 * 1024
    bomb = gzip.compress(b'{"events": [], "pad": "' + b" " * (64 * 1024 * 1024) + b'"}')
    assert len(bomb) < 200_000
    started = time.monotonic()
    r = post(client, ingest_token, body=bomb, encoding="gzip")
    assert r.status_code == 413
    assert time.monotonic() - started < 2


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded",
                                   "multipart/form-data; boundary=x", ""])
def test_it_answers_415_for_other_content_types(client, ingest_token, ctype):
    r = post(client, ingest_token, [update("a", 1)], content_type=ctype)
    assert r.status_code == 415 and r.json()["error"] == "unsupported_media_type"


def test_it_answers_415_for_an_unknown_content_encoding(client, ingest_token):
    assert post(client, ingest_token, [], encoding="br").status_code == 415


def test_it_accepts_json_with_a_charset(client, ingest_token):
    r = post(client, ingest_token, [], content_type="application/json; charset=utf-8")
    assert r.status_code == 202


# --- 429 ----------------------------------------------------------------------------------------
def test_it_answers_429_with_retry_after_when_the_bucket_is_empty(client, ingest_token,
                                                                  settings):
    settings.RECOVERYDASH_RATE_LIMIT_PER_SECOND = 0.2
    settings.RECOVERYDASH_RATE_LIMIT_BURST = 2
    assert [post(client, ingest_token, []).status_code for _ in range(3)] == [202, 202, 429]
    r = post(client, ingest_token, [])
    assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
    assert r.json()["error"] == "rate_limited"


def test_it_limits_the_rate_through_redis(client, project, settings):
    settings.RECOVERYDASH_RATE_LIMIT_PER_SECOND = 0.1
    settings.RECOVERYDASH_RATE_LIMIT_BURST = 3
    settings.RECOVERYDASH_REDIS_URL = REDIS_URL
    from recoverydash.ingest.auth import limiter

    token, raw = ApiToken.issue(project, ["ingest"])
    key = limiter().key(token)
    r = redis.Redis.from_url(REDIS_URL)
    r.delete(key)
    try:
        codes = [post(client, raw, []).status_code for _ in range(4)]
        assert codes == [202, 202, 202, 429]
        assert r.exists(key)  # the bucket lives in Redis
        r.hset(key, "tokens", "3")  # another process refilled it: seen here too
        assert post(client, raw, []).status_code == 202
        r.hset(key, "tokens", "0")
        resp = post(client, raw, [])
        assert resp.status_code == 429 and int(resp.headers["Retry-After"]) == 10
    finally:
        r.delete(key)


def test_it_lets_requests_through_when_redis_does_not_answer(client, ingest_token, settings):
    settings.RECOVERYDASH_RATE_LIMIT_PER_SECOND = 0.1
    settings.RECOVERYDASH_RATE_LIMIT_BURST = 1
    settings.RECOVERYDASH_REDIS_URL = "redis://127.0.0.1:1/0"
    assert [post(client, ingest_token, []).status_code for _ in range(3)] == [202] * 3


# --- dispatch after commit ----------------------------------------------------------------------
def test_it_hands_runs_and_committed_generations_to_the_workers_after_commit(
        client, ingest_token, django_capture_on_commit_callbacks, monkeypatch):
    calls = []
    monkeypatch.setattr("recoverydash.ingest.actions.after_ingest",
                        lambda r, g: calls.append((r, g)))
    with django_capture_on_commit_callbacks(execute=True):
        r = post(client, ingest_token, [update("a", 1), event(
            "checkpoint_committed", "m", manifest=manifest())])
    assert r.status_code == 202
    from recoverydash.runs.models import Generation

    assert calls == [([Run.objects.get().pk], [Generation.objects.get().pk])]


def test_it_answers_202_even_when_dispatch_fails(client, ingest_token,
                                                 django_capture_on_commit_callbacks, monkeypatch):
    def boom(*args):
        raise RuntimeError("broker down")

    monkeypatch.setattr("recoverydash.ingest.actions.after_ingest", boom)
    with django_capture_on_commit_callbacks(execute=True):
        r = post(client, ingest_token, [update("a", 1)])
    assert r.status_code == 202 and Event.objects.count() == 1


def test_it_dispatches_nothing_for_a_batch_of_duplicates(
        client, ingest_token, django_capture_on_commit_callbacks):
    post(client, ingest_token, [update("a", 1)])
    with django_capture_on_commit_callbacks() as callbacks:
        post(client, ingest_token, [update("a", 1)])
    assert callbacks == [] and Run.objects.get().ingest_seq == Event.objects.get().batch_seq


# --- GET /runs, OpenAPI, docs -------------------------------------------------------------------
def test_it_lists_the_projects_runs_with_attempts_and_counts(client, full_token, project):
    post(client, full_token, [update("a", 1), update("b", 1, attempt=2, run_id="run-2"),
                              update("c", 2, attempt=1, run_id="run-2")])
    runs = client.get("/api/v1/runs", headers={"Authorization": f"Bearer {full_token}"}).json()
    by_id = {r["run_id"]: r for r in runs}
    assert by_id["run-2"]["attempts"] == 2 and by_id["run-2"]["latest_attempt"] == 2
    assert by_id["run-2"]["event_count"] == 2 and by_id["run-1"]["event_count"] == 1
    assert by_id["run-1"]["health"] is None
    assert by_id["run-1"]["seconds_since_last_restorable"] is None
    assert by_id["run-1"]["last_event_at"] == "2026-11-01T00:00:05Z"


def test_it_reads_health_and_time_since_last_restorable_from_the_analysis(client, full_token):
    from datetime import timedelta

    from django.utils import timezone

    from recoverydash.runs.models import Analysis

    post(client, full_token, [update("a", 1)])
    committed = timezone.now() - timedelta(seconds=120)
    Analysis.objects.create(run=Run.objects.get(), health="at_risk", result={
        "last_restorable": {"generation_id": "g1", "update": 1,
                            "committed_at": committed.isoformat()}})
    run = client.get("/api/v1/runs", headers={"Authorization": f"Bearer {full_token}"}).json()[0]
    assert run["health"] == "at_risk"
    assert 119 <= run["seconds_since_last_restorable"] < 180


def test_it_serves_the_openapi_document_and_local_docs(client):
    doc = client.get("/api/v1/openapi.json").json()
    assert "/api/v1/events" in doc["paths"] and "/api/v1/runs" in doc["paths"]
    body = doc["paths"]["/api/v1/events"]["post"]["requestBody"]
    assert body["content"]["application/json"]["schema"]["$ref"].endswith("/IngestBody")
    assert "UpdateCommitted" in doc["components"]["schemas"]
    # extension docs/ingest-v1.md#update_aggregate: every rank's part of one update in one event
    assert {"UpdateAggregate", "RankPart"} <= set(doc["components"]["schemas"])
    html = client.get("/api/v1/docs").content.decode()
    assert "/static/ninja/swagger-ui-bundle.js" in html
    assert "cdn" not in html.lower() and "https://" not in html
    static = client.get("/static/ninja/swagger-ui-bundle.js")
    assert static.status_code == 200


def test_it_never_lets_two_runs_share_seq_ordering(client, ingest_token):
    for i in range(3):
        post(client, ingest_token, [update(f"a{i}", i + 1), update(f"b{i}", i + 1, run_id="z")])
    for run in Run.objects.all():
        seqs = list(Event.objects.filter(run=run).order_by("pk").values_list("batch_seq",
                                                                             flat=True))
        assert batch_order(seqs) == [1, 2, 3] and seqs == sorted(seqs)
        assert run.ingest_seq == seqs[-1]



def test_it_refuses_a_range_reaching_further_than_the_limit(client, ingest_token):
    """A range reaching to 2**63 - 1 is legal in the original contract, but one rank's share of one
    update spanning billions of positions is a unit mistake that would cost the analysis its
    memory."""
    for i, rng in enumerate(([0, 2**63 - 1], [0, 2**63 - 1, 2**32], [5, 5 + 2**30 + 1])):
        spans = [{"stratum": "m", "epoch": 0, "ranges": [rng]}]
        r = post(client, ingest_token, [update(f"huge{i}", 1, spans=spans)])
        assert r.status_code == 400, rng
        [item] = r.json()["errors"]
        assert item["index"] == 0 and item["path"] == "events[0].spans[0].ranges[0]"
        assert "expected a range reaching at most 1,073,741,824 positions" in item["message"]
    assert Event.objects.count() == 0
    at_limit = [{"stratum": "m", "epoch": 0, "ranges": [[2**62, 2**62 + 2**30, 64]]}]
    assert post(client, ingest_token, [update("ok", 1, spans=at_limit)]).status_code == 202


def test_it_inflates_a_gzip_body_of_several_members(client, ingest_token):
    """RFC 1952 allows members one after another (what `cat a.gz b.gz` makes)."""
    body = json.dumps({"events": [update("m1", 1), update("m2", 2)]}).encode()
    half = len(body) // 2
    data = gzip.compress(body[:half]) + gzip.compress(body[half:])
    r = client.post(URL, data=data, content_type="application/json",
                    HTTP_CONTENT_ENCODING="gzip", HTTP_AUTHORIZATION=f"Bearer {ingest_token}")
    assert r.status_code == 202 and r.json() == {"accepted": 2, "duplicates": 0}
    broken = gzip.compress(body) + b"\x1f\x8b trailing garbage"
    r = client.post(URL, data=broken, content_type="application/json",
                    HTTP_CONTENT_ENCODING="gzip", HTTP_AUTHORIZATION=f"Bearer {ingest_token}")
    assert r.status_code == 400


def test_it_names_the_received_value_of_a_bad_query_parameter(client, read_token):
    r = client.get("/api/v1/runs?limit=abc", HTTP_AUTHORIZATION=f"Bearer {read_token}")
    assert r.status_code == 400
    [item] = r.json()["errors"]
    assert item["path"] == "limit" and item["message"].endswith('got "abc"'), item


@pytest.mark.parametrize("mark_age_s, requested", [(None, True), (0, False), (49, False),
                                                   (51, True), (3600, True)])
def test_a_batch_requests_no_analysis_while_one_is_queued(
        client, ingest_token, django_capture_on_commit_callbacks, monkeypatch, mark_age_s,
        requested):
    from datetime import timedelta

    from django.utils import timezone

    post(client, ingest_token, [update("a", 1)])
    mark = None if mark_age_s is None else timezone.now() - timedelta(seconds=mark_age_s)
    Run.objects.update(analysis_queued_at=mark)
    calls = []
    monkeypatch.setattr("recoverydash.ingest.actions.after_ingest",
                        lambda r, g: calls.append((r, g)))
    with django_capture_on_commit_callbacks(execute=True):
        assert post(client, ingest_token, [update("b", 2)]).status_code == 202
    assert calls == ([([Run.objects.get().pk], [])] if requested else [])


def test_the_ranks_heard_from_are_merged_into_the_attempt_without_losing_a_later_time(
        client, ingest_token, monkeypatch):
    from datetime import datetime, timedelta

    from django.utils import timezone

    from recoverydash.runs.models import Attempt

    t1 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
    monkeypatch.setattr(timezone, "now", lambda: t1)
    post(client, ingest_token, [update("a", 1, rank=0), update("b", 1, rank=1),
                                update("g", 1, rank=None)])
    assert Attempt.objects.get().ranks_seen() == {"0": t1, "1": t1, "c": t1}
    # a later batch of rank 1 and an aggregate of ranks 2-3 (its reporter has no rank: "c")
    t2 = t1 + timedelta(seconds=30)
    monkeypatch.setattr(timezone, "now", lambda: t2)
    post(client, ingest_token, [update("c", 2, rank=1), event(
        "update_aggregate", "agg", update=2, ranks=[
            {"rank": r, "spans": [{"stratum": "main", "epoch": 0, "ranges": [[8 + r, 9 + r]]}]}
            for r in (2, 3)])])
    # a batch that began earlier (its clock before t2) and committed later keeps t2
    monkeypatch.setattr(timezone, "now", lambda: t1 + timedelta(seconds=10))
    post(client, ingest_token, [update("d", 3, rank=1)])
    assert Attempt.objects.get().ranks_seen() == {"0": t1, "1": t2, "2": t2, "3": t2, "c": t2}


def test_the_stored_body_of_an_aggregate_keeps_what_its_ledger_rows_do_not_hold():
    parts = [{"rank": 0, "spans": [], "samples": 2},
             {"rank": 1, "spans": [], "samples": 2, "ids_digest": "d" * 32, "x_part": [1]}]
    agg = {"event_id": "g", "type": "update_aggregate", "run_id": "r", "attempt": 0, "rank": 0,
           "time": "2026-11-01T00:00:00Z", "update": 4, "ranks": parts, "x_note": "kept"}
    assert stored_body("update_aggregate", agg) == {
        "update": 4, "x_note": "kept", "ranks": [{"rank": 1, "ids_digest": "d" * 32,
                                                  "x_part": [1]}]}
    assert stored_body("update_aggregate", dict(agg, ranks=parts[:1])) == {
        "update": 4, "x_note": "kept"}
    assert agg["ranks"] == parts  # the wire body is unchanged
