"""orjson in the ingest path changes no text and no answer: the canonical JSON (whose sha256 is
every stored event's content hash) is the standard library's text, and a request body reads
as ``json.loads`` with ingest's hooks reads it, on arbitrary values and texts
(docs/ingest-v1.md#2-common-fields: content hash)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from recoverydash.ingest.api import _finite_float, _reject_constant, loads_body
from recoverydash.ingest.schemas import canonical_bytes, canonical_json, json_text

_LIBRARY = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                            allow_nan=False)

_text = st.text(alphabet=st.characters(exclude_categories=[]), max_size=12)
_ints = (st.integers(min_value=-2**70, max_value=2**70)
         | st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -2**63, -2**63 - 1]))
_floats = (st.floats(allow_nan=True, allow_infinity=True)
           | st.sampled_from([1e16, 1e15, 1e-5, 1e-4, 1e22, 1.5e300, 5e-324, -0.0, 100.0]))


def _json(scalars):
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(_text, inner, max_size=4), max_leaves=20)


_no_floats = _json(st.none() | st.booleans() | _ints | _text)
_any = _json(st.none() | st.booleans() | _ints | _floats | _text)


def _outcome(write, value):
    try:
        return ("text", write(value))
    except (ValueError, TypeError, RecursionError) as exc:
        return ("refused", type(exc))


def _library(value):
    return _outcome(lambda v: _LIBRARY.encode(v).encode("utf-8"), value)


@settings(max_examples=500, deadline=None)
@given(_no_floats)
def test_without_floats_orjson_writes_the_standard_librarys_text(value):
    assert _outcome(lambda v: canonical_bytes(v, floats=False), value) == _library(value)


@settings(max_examples=300, deadline=None)
@given(_any)
def test_with_floats_the_standard_library_writes_it(value):
    assert _outcome(canonical_bytes, value) == _library(value)
    assert _outcome(lambda v: canonical_json(v).encode("utf-8"), value) == _library(value)


def test_values_orjson_refuses_are_written_by_the_standard_library():
    for value in [[2**64], [-2**63 - 1], {"b": "\ud800"}, {"\ud800": 1},
                  {"deep": json.loads("[" * 300 + "]" * 300)},
                  {"é": 1, "z": 2, "\U0001F600": 3, "A": [None, True, "\b\f\n\r\t\x00\x7f"]}]:
        assert _outcome(lambda v: canonical_bytes(v, floats=False), value) == _library(value)
    assert canonical_json({"b": 1e16, "a": "é"}) == '{"a":"é","b":1e+16}'
    assert json.loads(json_text({"a": [2**64, 1, "x"]})) == {"a": [2**64, 1, "x"]}


def _library_loads(body: bytes):
    try:
        return ("value", json.loads(body, parse_constant=_reject_constant,
                                    parse_float=_finite_float))
    except (ValueError, RecursionError) as exc:
        return ("refused", type(exc), str(exc))


@settings(max_examples=300, deadline=None)
@given(_json(st.none() | st.booleans() | _ints | st.floats(allow_nan=False,
                                                            allow_infinity=False)
             | st.text(max_size=8)), st.data())
def test_a_body_reads_as_before_and_says_whether_it_held_a_float(value, data):
    body = json.dumps({"events": value}).encode()
    if data.draw(st.booleans()):  # a stray byte: both refuse alike, or both read
        at = data.draw(st.integers(min_value=0, max_value=len(body)))
        body = body[:at] + data.draw(st.sampled_from([b"\x00", b"]", b"NaN", b"1e999",
                                                      b"2.5", b"7"])) + body[at:]
    theirs = _library_loads(body)
    try:
        doc, floats = loads_body(body)
        mine = ("value", doc)
    except (ValueError, RecursionError) as exc:
        mine = ("refused", type(exc), str(exc))
    assert mine == theirs
    if mine[0] == "value":
        held = []
        json.loads(body, parse_float=lambda t: held.append(t) or float(t))
        assert floats == bool(held)
        assert floats or not _has_float(doc)  # what canonical_bytes(floats=False) relies on


def _has_float(value) -> bool:
    if isinstance(value, float):
        return True
    if isinstance(value, dict):
        return any(_has_float(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_float(v) for v in value)
    return False
