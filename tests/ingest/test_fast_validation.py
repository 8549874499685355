"""The validation shortcuts of the hot types (schemas._extras_flat: the depth walk of unknown
fields skipped when none of an update_committed's, update_aggregate's or heartbeat's wire
models holds an object or an array in one) give exactly the answers of the full path: the same
accepted events (models, canonical text, content hash) or the same refusals (index, path,
message), on well-formed and on mutated bodies."""

from __future__ import annotations

import json
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ingest_support import json_places

from recoverydash.ingest import schemas
from recoverydash.ingest.errors import BadRequest
from recoverydash.ingest.schemas import MAX_EXTRA_DEPTH, validate_events

SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow, HealthCheck.data_too_large])
T = "2026-11-01T00:00:05.250+00:00"

_scalars = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.text(max_size=6) \
    | st.floats(allow_nan=False, allow_infinity=False)


def _nested(depth: int, leaf):
    """A value holding ``depth`` levels of objects/arrays around ``leaf``."""
    value = leaf
    for k in range(depth):
        value = [value] if k % 2 else {"k": value}
    return value


_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=8)
#: an unknown field's value: a scalar, small JSON, or a value nested around MAX_EXTRA_DEPTH
_extra_value = st.one_of(_scalars, _json,
                         st.integers(MAX_EXTRA_DEPTH - 2, MAX_EXTRA_DEPTH + 2).map(
                             lambda d: _nested(d, 1)))
_extras = st.dictionaries(st.sampled_from(["x", "note", "world_size", "meta"]), _extra_value,
                          max_size=2)


@st.composite
def _span(draw):
    a = draw(st.integers(0, 10**6))
    r = [a, a + draw(st.integers(0, 600))]
    if draw(st.booleans()):
        r.append(draw(st.integers(1, 64)))
    return {"stratum": draw(st.sampled_from(["main", "aux"])), "epoch": draw(st.integers(0, 3)),
            "ranges": [r], **draw(_extras)}


@st.composite
def _hot_event(draw, n: int):
    kind = draw(st.sampled_from(["update_committed", "update_aggregate", "heartbeat"]))
    body = {"event_id": f"e{n}", "type": kind, "run_id": "r1", "attempt": 0, "time": T,
            "update": draw(st.integers(1, 10**6))}
    if kind == "update_committed":
        body.update(rank=draw(st.integers(0, 7)), samples=8,
                    spans=draw(st.lists(_span(), min_size=1, max_size=2)))
    elif kind == "update_aggregate":
        ranks = draw(st.lists(st.integers(0, 15), min_size=1, max_size=4, unique=True))
        body["ranks"] = [{"rank": r, "samples": 8, "spans": draw(st.lists(_span(), min_size=1,
                                                                           max_size=2)),
                          **draw(_extras)} for r in ranks]
    else:
        body["rank"] = draw(st.integers(0, 7))
        if draw(st.booleans()):
            body["fetched"] = [{"stratum": "main", "epoch": 0, "position": 5, **draw(_extras)}]
    body.update(draw(_extras))
    return body


@st.composite
def _mutated(draw, body):
    """``body`` with one place replaced by another JSON value, or one key deleted."""
    body = json.loads(json.dumps(body))
    places = list(json_places(body))[1:]
    path, _ = draw(st.sampled_from(places))
    parent = body
    for part in path[:-1]:
        parent = parent[part]
    if isinstance(parent, dict) and draw(st.booleans()):
        del parent[path[-1]]
    else:
        parent[path[-1]] = draw(_extra_value | st.sampled_from(
            ["", "\x00", 2**63, -1, [], {}, [1, 0], [0, 1, 0], "2026-13-01T00:00:00Z"]))
    return body


@st.composite
def _batch(draw):
    events = [draw(_hot_event(n)) for n in range(draw(st.integers(1, 4)))]
    for k in draw(st.sets(st.integers(0, len(events) - 1), max_size=2)):
        events[k] = draw(_mutated(events[k]))
    return events


def _answer(events, floats):
    try:
        return [(v.index, v.model, v.model.__pydantic_fields_set__, v.model.__pydantic_extra__,
                 v.canonical, v.content_hash, v.body is events[v.index])
                for v in validate_events(events, floats)]
    except BadRequest as exc:
        return ("refused", exc.message, [(i.index, i.path, i.message) for i in exc.items])


@SETTINGS
@given(events=_batch())
def test_the_shortcut_gives_the_full_paths_answer(events):
    floats = "." in json.dumps(events) or "e" in json.dumps(events)
    fast = _answer(events, floats)
    with mock.patch.object(schemas, "_extras_flat", lambda model: False):
        full = _answer(events, floats)
    assert fast == full


@SETTINGS
@given(events=_batch())
def test_a_flat_hot_event_has_no_deep_unknown_field(events):
    for body in events:
        try:
            model = schemas.EventAdapter.validate_python(body)
        except Exception:
            continue
        if schemas._extras_flat(model):
            assert schemas._too_deep_extra(model, "events[0]") is None


def test_a_deep_unknown_field_of_a_span_in_an_aggregate_is_still_refused():
    deep = _nested(MAX_EXTRA_DEPTH + 1, 1)
    event = {"event_id": "a", "type": "update_aggregate", "run_id": "r1", "attempt": 0,
             "time": T, "update": 1,
             "ranks": [{"rank": 0, "spans": [{"stratum": "main", "epoch": 0,
                                              "ranges": [[0, 8]], "meta": deep}]}]}
    try:
        validate_events([event], False)
    except BadRequest as exc:
        assert [(i.index, i.path, i.message) for i in exc.items] == [
            (0, "events[0].ranks[0].spans[0].meta",
             f"expected a value nested at most {MAX_EXTRA_DEPTH} levels (objects and arrays), "
             "got one nested deeper")]
    else:
        raise AssertionError("accepted")


def test_the_shortcut_is_taken_for_the_bench_shapes():
    event = {"event_id": "a", "type": "update_aggregate", "run_id": "r1", "attempt": 0,
             "time": T, "update": 1, "world_size": 64,
             "ranks": [{"rank": r, "samples": 8, "spans": [{"stratum": "main", "epoch": 0,
                                                            "ranges": [[r, 512, 64]]}]}
                       for r in range(64)]}
    [valid] = validate_events([event], False)
    assert schemas._extras_flat(valid.model) is True
    with mock.patch.object(schemas, "_too_deep_extra", side_effect=AssertionError("walked")):
        [again] = validate_events([event], False)
    assert (again.canonical, again.content_hash) == (valid.canonical, valid.content_hash)
