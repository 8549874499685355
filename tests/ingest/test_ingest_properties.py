"""Hypothesis-generated batches: valid ones round-trip into Event.body, invalid ones get a 400
naming the index and path of the broken field, and nothing at all gets a 500."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from ingest_support import post

from recoverydash.ingest.actions import stored_body
from recoverydash.runs.models import Event

pytestmark = pytest.mark.django_db

SETTINGS = settings(max_examples=60, deadline=None, derandomize=False,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow, HealthCheck.data_too_large])
_runs = itertools.count()

# --- valid events -------------------------------------------------------------------------------
safe_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                    max_size=12)
name = st.text("abcdefghij0123456789_-.", min_size=1, max_size=12)
# generation ids and shard names follow the identifier rule (schemas.ID_PATTERN)
ident = st.from_regex(r"[A-Za-z0-9_:=@+~][A-Za-z0-9._:=@+~-]{0,11}", fullmatch=True)
u63 = st.integers(0, 2**63 - 1)
u31 = st.integers(0, 2**31 - 1)
# jsonb keeps a number's value, not its spelling: stay where floats print without exponents
json_scalar = (st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | safe_text
               | st.floats(-1e15, 1e15, allow_nan=False).filter(lambda f: abs(f) > 1e-4 or f == 0))
json_value = st.recursive(json_scalar, lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(safe_text, inner, max_size=3), max_leaves=6)
extras = st.dictionaries(safe_text.map(lambda s: "x_" + s), json_value, max_size=2)
offsets = st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)),
                           timezone(timedelta(hours=-8))])
times = st.builds(lambda dt, tz: dt.replace(tzinfo=tz).isoformat(),
                  st.datetimes(datetime(2001, 1, 1), datetime(2099, 1, 1)), offsets)


@st.composite
def ranges(draw):
    start = draw(st.integers(0, 2**62))
    stop = start + draw(st.integers(0, 2**30))  # RECOVERYDASH_MAX_RANGE_POSITIONS
    return [start, stop, draw(st.integers(1, 64))] if draw(st.booleans()) else [start, stop]


def span(kind: str):
    body = {"stratum": st.just("main" if kind == "ranges" else "ids"), "epoch": u63,
            kind: st.lists(ranges(), max_size=3) if kind == "ranges"
            else st.lists(st.integers(0, 10**6) | name, max_size=5)}
    return st.fixed_dictionaries(body, optional={"order": name, "padding": st.booleans()})


cursor = st.fixed_dictionaries({"stratum": name, "epoch": u63, "position": u63})
obj = st.fixed_dictionaries(
    {"uri": name.map(lambda s: "s3://bucket/" + s), "component": name, "size": u63},
    optional={"shard": ident, "sha256": st.text("0123456789abcdef", min_size=64, max_size=64),
              "update": u63})
manifest = st.fixed_dictionaries({
    "schema_revision": st.just(1), "generation_id": ident, "update": u63,
    "world_size": st.integers(1, 2**31 - 1), "required_shards": st.lists(ident, max_size=3),
    "components": st.lists(name, max_size=3),
    "objects": st.lists(obj.map(lambda o: {"shard": "rank0", **o}), max_size=3,
                        unique_by=lambda o: o["uri"]),
    "data_progress": st.fixed_dictionaries({"cursor": st.lists(cursor, max_size=2)}),
    "dataset_version": name, "committed_at": times})

TYPE_FIELDS = {
    "attempt_started": ({"world_size": st.integers(1, 2**31 - 1), "dataset_version": safe_text},
                        {"global_batch_size": st.integers(1, 4096), "config_digest": name,
                         "sampler": st.fixed_dictionaries({}, optional={
                             "seed": st.integers(), "epoch_length": st.dictionaries(name, u63)}),
                         "resumed_from": st.none() | st.fixed_dictionaries(
                             {"generation_id": st.none() | ident, "update": u63,
                              "cursor": st.lists(cursor, max_size=2)}),
                         "contract": st.fixed_dictionaries({}, optional={
                             "max_replay_samples": u63,
                             "max_checkpoint_age_s": st.integers(0, 10**6)})}),
    "update_committed": ({"update": st.integers(1, 2**63 - 1),
                          "spans": st.lists(span("ranges"), max_size=2)
                          | st.lists(span("ids"), max_size=2)},
                         {"samples": u63, "tokens": u63, "ids_digest": name}),
    "heartbeat": ({"update": u63}, {"fetched": st.lists(cursor, max_size=2)}),
    "checkpoint_started": ({"generation_id": ident, "update": u63},
                           {"required_shards": st.lists(ident, max_size=3),
                            "components": st.lists(name, max_size=3)}),
    "shard_written": ({"generation_id": ident, "shard": ident, "update": u63,
                       "objects": st.lists(obj, max_size=3, unique_by=lambda o: o["uri"])}, {}),
    "checkpoint_committed": ({"manifest": manifest}, {}),
    "restore_completed": ({"generation_id": ident,
                           "seconds": st.floats(0, 1e6) | st.integers(0, 10**6)}, {}),
    "restore_failed": ({"generation_id": ident,
                        "reason": st.sampled_from(["object_damaged", "load_error",
                                                   "nothing_restorable"])}, {}),
    "attempt_ended": ({"reason": st.sampled_from(["completed", "failed", "preempted",
                                                  "cancelled"]), "update": u63},
                      {"fetched": st.lists(cursor, max_size=2),
                       "message": st.text(max_size=50).filter(lambda s: "\x00" not in s)
                       .map(lambda s: s.encode("utf-8", "ignore").decode("utf-8", "ignore"))}),
    "audit_window": ({"update": u63, "rank": u31, "accum_slot": u31,
                      "sample_ids": st.lists(st.integers(0, 99) | name, max_size=5)}, {}),
}


@st.composite
def valid_event(draw, run_id: str, event_id: str):
    kind = draw(st.sampled_from(sorted(TYPE_FIELDS)))
    required, optional = TYPE_FIELDS[kind]
    body = {"event_id": event_id, "type": kind, "run_id": run_id,
            "attempt": draw(st.integers(0, 3)), "time": draw(times)}
    if kind != "audit_window" and draw(st.booleans()):
        body["rank"] = draw(st.none() | st.integers(0, 7))
    body.update(draw(st.fixed_dictionaries(required, optional=optional)))
    body.update(draw(extras))
    return body


@st.composite
def valid_batch(draw):
    run_id = f"prop-{next(_runs)}"
    n = draw(st.integers(1, 8))
    batch = [draw(valid_event(run_id, f"ev-{i}")) for i in range(n)]
    for i, ev in enumerate(batch):
        if ev["type"] == "attempt_started":  # two different starts of one attempt are a 409
            ev["attempt"] = 100 + i
    return batch


@SETTINGS
@given(batch=valid_batch())
def test_it_stores_every_valid_batch_exactly_as_sent(client, ingest_token, batch):
    r = post(client, ingest_token, batch, gz=len(batch) % 2 == 0)
    assert r.status_code == 202, r.content
    assert r.json() == {"accepted": len(batch), "duplicates": 0}
    stored = {e.event_id: e.body for e in Event.objects.filter(run__run_id=batch[0]["run_id"])}
    for ev in batch:
        assert stored[ev["event_id"]] == stored_body(ev["type"], json.loads(json.dumps(ev)))
    again = post(client, ingest_token, batch)
    assert again.json() == {"accepted": 0, "duplicates": len(batch)}


# --- invalid events: a valid batch with one field broken ----------------------------------------
def _first(ev: dict, *types: str) -> bool:
    return ev["type"] in types


MUTATIONS = [
    # (applies to, mutate, path relative to the event)
    (lambda e: True, lambda e: e.update(attempt=-1), "attempt"),
    (lambda e: True, lambda e: e.update(attempt=1.5), "attempt"),
    (lambda e: True, lambda e: e.update(rank="0"), "rank"),
    (lambda e: True, lambda e: e.update(run_id="no spaces"), "run_id"),
    (lambda e: True, lambda e: e.update(time="2026-11-01T00:00:00"), "time"),
    (lambda e: True, lambda e: e.update(time="2026-13-01T00:00:00Z"), "time"),
    (lambda e: True, lambda e: e.pop("time"), "time"),
    (lambda e: True, lambda e: e.update(event_id=""), "event_id"),
    (lambda e: True, lambda e: e.update(type="exploded"), "type"),
    (lambda e: _first(e, "update_committed"), lambda e: e.update(update=0), "update"),
    (lambda e: _first(e, "update_committed") and e["spans"] and "ranges" in e["spans"][0],
     lambda e: e["spans"][0]["ranges"].append([3, 2]),
     lambda e: f"spans[0].ranges[{len(e['spans'][0]['ranges']) - 1}]"),
    (lambda e: _first(e, "update_committed") and e["spans"] and "ids" in e["spans"][0],
     lambda e: e["spans"][0]["ids"].append(2.5),
     lambda e: f"spans[0].ids[{len(e['spans'][0]['ids']) - 1}]"),
    (lambda e: _first(e, "update_committed") and e["spans"],
     lambda e: e["spans"][0].update(epoch=-3), "spans[0].epoch"),
    (lambda e: _first(e, "heartbeat", "attempt_ended"),
     lambda e: e.update(fetched=[{"stratum": "s", "epoch": 0, "position": "9"}]),
     "fetched[0].position"),
    (lambda e: _first(e, "attempt_ended"), lambda e: e.update(reason="exploded"), "reason"),
    (lambda e: _first(e, "shard_written") and e["objects"],
     lambda e: e["objects"][0].update(sha256="xyz"), "objects[0].sha256"),
    (lambda e: _first(e, "checkpoint_committed"),
     lambda e: e["manifest"].update(world_size=0), "manifest.world_size"),
    (lambda e: _first(e, "checkpoint_committed"),
     lambda e: e["manifest"].update(schema_revision="one"), "manifest.schema_revision"),
    (lambda e: _first(e, "attempt_started"), lambda e: e.update(world_size=0), "world_size"),
    (lambda e: _first(e, "audit_window"), lambda e: e.update(sample_ids=[None]),
     "sample_ids[0]"),
    (lambda e: _first(e, "restore_completed"), lambda e: e.update(seconds=-1), "seconds"),
]


@SETTINGS
@given(batch=valid_batch(), data=st.data())
def test_it_names_the_index_and_path_of_a_broken_field(client, ingest_token, batch, data):
    index = data.draw(st.integers(0, len(batch) - 1))
    ev = batch[index]
    usable = [m for m in MUTATIONS if m[0](ev)]
    applies, mutate, path = data.draw(st.sampled_from(usable))
    mutate(ev)  # a path may name the item the mutation appended: read it afterwards
    expected = f"events[{index}].{path(ev) if callable(path) else path}"
    r = post(client, ingest_token, batch)
    assert r.status_code == 400, r.content
    errors = r.json()["errors"]
    assert {"index": index, "path": expected} in [
        {"index": e["index"], "path": e["path"]} for e in errors], (expected, errors)
    assert all(e["message"] for e in errors)
    assert not Event.objects.filter(run__run_id=batch[0]["run_id"]).exists()


# --- anything at all: never a 500 ---------------------------------------------------------------
any_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                        lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
event_like = st.fixed_dictionaries({}, optional={
    "event_id": any_json | name, "type": st.sampled_from(sorted(TYPE_FIELDS)) | any_json,
    "run_id": name | any_json, "attempt": st.integers() | any_json, "time": times | any_json,
    "rank": any_json, "update": st.integers() | any_json, "spans": any_json,
    "manifest": any_json | manifest, "objects": any_json, "seconds": any_json})


@SETTINGS
@given(body=st.one_of(any_json.map(lambda v: {"events": v}), any_json,
                      st.lists(event_like, max_size=5).map(lambda v: {"events": v})))
def test_it_never_answers_500_to_any_json(client, ingest_token, body):
    try:
        data = json.dumps(body).encode("utf-8", "surrogatepass")
    except (ValueError, RecursionError):
        assume(False)
    r = post(client, ingest_token, body=data)
    assert r.status_code in (202, 400, 409, 413), r.content
    assert "errors" in r.json() or r.status_code == 202


@SETTINGS
@given(data=st.binary(max_size=200), ctype=st.sampled_from(["application/json", "text/plain"]),
       encoding=st.sampled_from([None, "gzip", "deflate"]))
def test_it_never_answers_500_to_any_bytes(client, ingest_token, data, ctype, encoding):
    r = post(client, ingest_token, body=data, content_type=ctype, encoding=encoding)
    assert r.status_code in (202, 400, 413, 415), r.content
