"""The hot path (``ingest.hot.validate_hot``) gives exactly what the general path gives, or
nothing.

For random batches of ``update_committed``, ``update_aggregate`` and ``heartbeat`` events,
well-formed and mutated (a value of every JSON type in every field, bounds and one past them,
unknown fields, missing fields, bad times, NUL characters and lone surrogates, big integers,
floats, other event types, duplicate keys, other spellings of the same JSON): whenever the hot
path accepts a body, the general path (``api.parse_events``: ``json`` and the pydantic models)
accepts it too, with the same events (index, body, canonical JSON, content hash, every typed
field); the hot path never accepts what the general path refuses; and it does take the bodies
the SDK sends (checked through the SDK against the live server).
"""

from __future__ import annotations

import copy
import json
import random

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ingest_support import json_places
from pydantic import BaseModel

from recoverydash.ingest import api, hot
from recoverydash.ingest.errors import BadRequest, PayloadTooLarge

LIMIT = 10_000

#: values put in place of a field's: every JSON type, bounds and one past them
ODD = [None, True, False, 0, -1, 1, 7, 1.5, 2.0, -0.0, 2**31 - 1, 2**31, 2**63 - 1, 2**63,
       2**64 - 1, 2**64, 2**70, -(2**63), -(2**63) - 1, "", "x", "x" * 200, "x" * 201,
       "a\x00b", "\ud800", "é", "run-1\n", "2026-11-01T00:00:05Z", "2026-11-01T00:00:05",
       "2026-11-01T00:00:05+16:00", "2026-13-01T00:00:05Z", [], [1], [1, 2], [2, 1], [1, 2, 3],
       [0, 10, 0], [1, 2, 3, 4], {}, {"a": 1}, [[0, 4]], [{"stratum": "m", "epoch": 0}]]


def _span(rng: random.Random, r: int) -> dict:
    shape = rng.choice(["sdk", "sdk", "ids", "two", "opt", "indices"])
    if shape == "indices":  # the observed recorder's dataset indices beside its positions
        return {"stratum": "k", "epoch": 0, "order": "o2", "ranges": [[r, r + 3]],
                "indices": rng.choice([[7, [10, 12], [30, 61, 3]], [2**63 - 1], []])}
    if shape == "ids":
        return {"stratum": "i", "epoch": 0, "ids": [rng.choice([5, "s5", 2**63 - 1, -3]),
                                                    f"id{r}"]}
    if shape == "two":
        return {"stratum": "m", "epoch": 1, "ranges": [[r, r + 9], [40 + r, 90 + r, 8]]}
    span = {"stratum": "main", "epoch": 0, "ranges": [[512 + r, 1024 + r, 64]]}
    if shape == "opt":
        span.update(order=rng.choice(["o1", None]), padding=rng.choice([True, False, None]))
    return span


def _event(rng: random.Random, i: int) -> dict:
    kind = rng.choice(["update_committed"] * 3 + ["update_aggregate", "heartbeat"])
    ev = {"type": kind, "event_id": f"e{i}", "run_id": rng.choice(["run-1", "r.2:x_y"]),
          "attempt": rng.choice([0, 1]), "time": rng.choice(["2026-11-01T00:00:05.250+00:00",
                                                             "2026-11-01T00:00:05Z",
                                                             "2026-11-01t00:00:05+05:30"]),
          "rank": rng.choice([0, 3, None]), "update": rng.choice([1, 2, 2**63 - 1])}
    if rng.random() < 0.2:
        ev.pop("rank")
    if kind == "update_committed":
        ev["spans"] = [_span(rng, i) for _ in range(rng.choice([0, 1, 1, 2]))]
        for name in ("samples", "tokens", "ids_digest"):
            if rng.random() < 0.4:
                ev[name] = rng.choice([8, 0, None]) if name != "ids_digest" else "abc"
    elif kind == "update_aggregate":
        ev["ranks"] = [{"rank": r, "spans": [_span(rng, r)], "samples": 8}
                       for r in range(rng.choice([1, 2, 4]))]
    else:
        ev["update"] = rng.choice([0, 5])
        if rng.random() < 0.7:
            ev["fetched"] = [{"stratum": "main", "epoch": 0, "position": rng.choice([0, 99])}]
            if rng.random() < 0.5:  # the observed recorder's cursors name their order
                ev["fetched"][0]["order"] = rng.choice(["o1", None])
        if rng.random() < 0.3:
            ev.update(sdk_dropped=3, sdk_quarantined=0, sdk_lost_updates=[2, 4])
    return ev


def _mutate(rng: random.Random, events: list) -> None:
    ev = rng.choice(events)
    places = [p for p, _ in json_places(ev) if p]
    path = rng.choice(places)
    parent = ev
    for part in path[:-1]:
        parent = parent[part]
    what = rng.choice(["value", "value", "value", "drop", "extra", "type"])
    if what == "value":
        parent[path[-1]] = copy.deepcopy(rng.choice(ODD))
    elif what == "drop":
        del parent[path[-1]]
    elif what == "extra":
        target = parent if isinstance(parent, dict) else ev
        target[rng.choice(["x_note", "unknown"])] = copy.deepcopy(
            rng.choice([1, "y", None, [1], {"k": 1}]))
    else:
        ev["type"] = rng.choice(["checkpoint_started", "attempt_ended", "nope", 5])


def _text(rng: random.Random, events: list) -> bytes:
    """The body in one of several spellings of the same JSON, or with a text-level change."""
    doc = {"events": events}
    if rng.random() < 0.1:  # the hot path leaves such a body to the general one
        doc["meta"] = rng.choice([1, 1.5, "x", None])
    text = json.dumps(doc, separators=rng.choice([(",", ":"), (", ", ": ")]),
                      ensure_ascii=rng.choice([True, False]))
    change = rng.random()
    if change < 0.05:
        text = text.replace('"update": ', '"update": 1e0 * 0 + ', 1)  # not JSON
    elif change < 0.1:
        text = text.replace(':1,', ':1.0,', 1).replace(': 1,', ': 1.0,', 1)
    elif change < 0.15:
        text = text.replace('"event_id"', '"event_id": "dup", "event_id"', 1)
    elif change < 0.2:
        text = text.replace('"epoch": 0', '"epoch": 1e400', 1).replace('"epoch":0', '"epoch":-0', 1)
    return text.encode("utf-8", "surrogatepass")


def _fields(value):
    """A typed value as plain data: a pydantic model or a msgspec struct as its fields (and a
    span's kind), lists item by item."""
    if isinstance(value, BaseModel):
        out = {name: _fields(getattr(value, name))
               for name in [*type(value).model_fields, *(value.__pydantic_extra__ or {})]}
    elif hasattr(type(value), "__struct_fields__"):
        out = {name: _fields(getattr(value, name)) for name in type(value).__struct_fields__}
        if isinstance(value, hot.HotCursor) and value.order is msgspec.UNSET:
            del out["order"]  # the model's cursor has it only where sent (an unknown field)
    elif isinstance(value, list):
        return [_fields(v) for v in value]
    else:
        return (type(value).__name__, value)
    if hasattr(value, "kind"):
        out["kind"] = value.kind
    out["type"] = getattr(value, "type", None)
    return out


def _general(body: bytes):
    try:
        return api.parse_events(body)
    except (BadRequest, PayloadTooLarge):
        return None


def assert_same_or_none(body: bytes, limit: int = LIMIT) -> bool:
    """The differential check of the module docstring; True when the hot path took the body."""
    fast = hot.validate_hot(body, limit)
    if fast is None:
        return False
    slow = _general(body)
    assert slow is not None, f"the hot path took a body the general path refuses: {body[:300]!r}"
    assert len(fast) == len(slow)
    for f, s in zip(fast, slow):
        assert (f.index, f.canonical, f.content_hash, f.manifest) == \
            (s.index, s.canonical, s.content_hash, None)
        assert json.dumps(f.body, sort_keys=True) == json.dumps(s.body, sort_keys=True)
        assert {k: _fields(getattr(f.model, k)) for k in type(s.model).model_fields} == \
            {k: _fields(getattr(s.model, k)) for k in type(s.model).model_fields}
    return True


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32), st.integers(0, 3))
def test_the_hot_path_gives_the_general_paths_events_or_nothing(seed, mutations):
    rng = random.Random(seed)
    events = [_event(rng, i) for i in range(rng.choice([1, 1, 2, 5]))]
    for _ in range(mutations):
        _mutate(rng, events)
    assert_same_or_none(_text(rng, events))


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32))
def test_well_formed_batches_of_the_hot_types_take_the_hot_path(seed):
    rng = random.Random(seed)
    events = [_event(rng, i) for i in range(rng.choice([1, 3, 20]))]
    body = json.dumps({"events": events}).encode()
    assert assert_same_or_none(body)


@pytest.mark.parametrize("events, why", [
    ([{"type": "update_committed", "event_id": "a", "run_id": "r", "attempt": 0,
       "time": "2026-11-01T00:00:05Z", "update": 1, "spans": [], "note": "kept"}],
     "an unknown field (the general path keeps it in the stored body)"),
    ([{"type": "update_committed", "event_id": "a", "run_id": "r", "attempt": 0,
       "time": "2026-11-01T00:00:05Z", "update": 1, "spans": []},
      {"type": "checkpoint_started", "event_id": "b", "run_id": "r", "attempt": 0,
       "time": "2026-11-01T00:00:05Z", "generation_id": "g1", "update": 1}],
     "another event type in the batch"),
    ([{"type": "update_committed", "event_id": "a", "run_id": "r\n", "attempt": 0,
       "time": "2026-11-01T00:00:05Z", "update": 1, "spans": []}],
     "a run_id ending in a newline (Python's $ would take it)"),
    ([{"type": "update_committed", "event_id": "a", "run_id": "r", "attempt": 0,
       "time": "2026-11-01T00:00:05Z", "update": 1,
       "spans": [{"stratum": "i", "epoch": 0, "ids": [2**63]}]}],
     "a sample id orjson would read as a float"),
    ([{"type": "heartbeat", "event_id": "a", "run_id": "r", "attempt": 0,
       "time": "2026-11-01T00:00:05Z", "update": 1, "sdk_lost_updates": [5, 2]}],
     "lost updates out of order"),
])
def test_bodies_it_leaves_to_the_general_path(events, why):
    body = json.dumps({"events": events}).encode()
    assert hot.validate_hot(body, LIMIT) is None, why


def test_it_leaves_a_deeply_nested_top_level_field_to_the_general_path():
    """Found by attack: msgspec skipped an unknown top-level field nested about 990 levels,
    a depth ``json`` refuses (400); every top-level field but events now goes the general
    way."""
    heartbeat = (b'{"type":"heartbeat","event_id":"a","run_id":"r","attempt":0,'
                 b'"time":"2026-11-01T00:00:05Z","update":1}')
    for depth in (5, 993, 995):
        body = b'{"x":' + b"[" * depth + b"]" * depth + b',"events":[' + heartbeat + b"]}"
        assert hot.validate_hot(body, LIMIT) is None
    assert hot.validate_hot(b'{"events":[' + heartbeat + b"]}", LIMIT) is not None


def test_it_leaves_a_body_over_the_events_limit_and_an_empty_one_to_the_general_path():
    event = {"type": "heartbeat", "event_id": "a", "run_id": "r", "attempt": 0,
             "time": "2026-11-01T00:00:05Z", "update": 1}
    body = json.dumps({"events": [dict(event, event_id=str(i)) for i in range(3)]}).encode()
    assert hot.validate_hot(body, 2) is None
    assert hot.validate_hot(body, 3) is not None
    assert hot.validate_hot(b'{"events": []}', LIMIT) is None


@pytest.mark.django_db(transaction=True)
def test_the_sdks_events_take_the_hot_path(live_server, full_token, tmp_path, monkeypatch):
    """A CountingRecorder's run through the real server: every request of update_committed
    and heartbeat events (the recorder's start and end go the general way) is read by the
    hot path, and the events are stored."""
    from recoverydash.runs.models import Event
    from recoverydash.sdk.client import Client
    from recoverydash.sdk.ledger import CountingRecorder

    taken = []
    real = api.validate_hot

    def spy(body, limit):
        out = real(body, limit)
        kinds = {e["type"] for e in json.loads(body)["events"]}
        taken.append((kinds, out is not None))
        return out

    monkeypatch.setattr(api, "validate_hot", spy)
    client = Client(live_server.url, full_token, "hot-sdk", attempt=0, rank=0,
                    spool_dir=str(tmp_path / "spool"), flush_interval=0.05, request_timeout=10)
    rec = CountingRecorder(client, rank=0, world_size=2, dataset_length=64, seed=1,
                           dataset_version="ds-1", heartbeat_interval=0)
    rec.start(global_batch_size=8)
    assert client.flush(10)
    for update in range(1, 5):
        rec.consumed(4)
        rec.commit(update)
        rec.heartbeat()
        # the observed recorder's read cursors name their order
        client.heartbeat(update, fetched=[{"stratum": "main", "epoch": 0,
                                           "position": 8 * update, "order": "o1"}])
    assert client.flush(10)
    rec.end("completed")
    assert client.flush(10)
    client.close(1)
    hot_kinds = {"update_committed", "heartbeat"}
    assert [took for kinds, took in taken if kinds <= hot_kinds] and \
        all(took for kinds, took in taken if kinds <= hot_kinds)
    assert not any(took for kinds, took in taken if not kinds <= hot_kinds)
    stored = set(Event.objects.filter(run__run_id="hot-sdk").values_list("type", flat=True))
    assert stored == {"attempt_started", "update_committed", "heartbeat", "attempt_ended"}
