"""The hot path of ``POST /events``: a request body of the types trainers send all the time
(``update_committed``, ``update_aggregate``, ``heartbeat``), decoded and checked in one pass by
msgspec instead of ``json.loads`` and the pydantic models of :mod:`.schemas`.

It decides nothing of its own. :func:`validate_hot` accepts a *subset* of what
:func:`.schemas.validate_events` accepts, and for what it accepts it returns what that function
returns (the same typed values, the same bodies, canonical JSON and content hashes); anything
else it answers ``None`` and the request goes the general way, which accepts it or refuses it
with its located errors. So the wire contract is still the models of :mod:`.schemas`: these
structs take every bound from there, and ``tests/ingest/test_hot_path.py`` pins the two paths
against each other on random and mutated batches.

What sends a body the general way: another event type anywhere in it, a field the models do
not name (the general path keeps unknown fields; a read cursor's ``order`` is taken), a
top-level field besides ``events``, a value of another JSON type, a bound broken, a time that
is not RFC 3339 with an offset, a span with both or neither of ``ranges`` and ``ids`` (or
``indices`` beside ``ids``), a range with start > stop, a step < 1 or a reach over
``RECOVERYDASH_MAX_RANGE_POSITIONS``, a rank twice in one aggregate, a NUL character or a
lone surrogate in any string, more events than a request may carry, or JSON msgspec or orjson
will not read. Without unknown fields every number
of these types is an integer of at most 64 bits, so the canonical JSON is orjson's
(:func:`.schemas.canonical_bytes` with ``floats=False``).

Cost (bench/ingest.py's body of 1,000 per-rank ``update_committed``, in-process): decoding and
checking about 3 us per event against about 6.5 us for ``json.loads``, the models and
``_event_checks``.
"""

from __future__ import annotations

import re
from typing import Annotated, ClassVar

import msgspec
import orjson

from .schemas import (
    MAX_AGGREGATE_RANKS,
    MAX_I31,
    MAX_SPAN_IDS,
    MAX_U63,
    RUN_ID_PATTERN,
    UNADDRESSABLE_RUN_IDS,
    ValidEvent,
    _check_range,
    _parse_time,
    _update_range,
    canonical_bytes,
)

_Int63 = Annotated[int, msgspec.Meta(ge=0, le=MAX_U63)]
_Pos63 = Annotated[int, msgspec.Meta(ge=1, le=MAX_U63)]
_Int31 = Annotated[int, msgspec.Meta(ge=0, le=MAX_I31)]
_Range = Annotated[list[_Int63], msgspec.Meta(min_length=2, max_length=3)]
#: A sample id: a string, or a signed 64-bit integer (orjson reads a larger one as a float;
#: the models take any integer, so one beyond goes the general way, where ``json`` reads it)
_SampleId = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)] | str
_SampleIds = Annotated[list[_SampleId], msgspec.Meta(max_length=MAX_SPAN_IDS)]
#: a span's ``indices``: dataset indices, each an index or a range of them
_Indices = Annotated[list[_Int63 | _Range], msgspec.Meta(max_length=MAX_SPAN_IDS)]
#: ``run_id`` as the models check it (their pattern, anchored at both ends of the text: Python's
#: ``$`` would also match before a final newline)
_RUN_ID = re.compile(RUN_ID_PATTERN.removeprefix("^").removesuffix("$"))


class HotSpan(msgspec.Struct, forbid_unknown_fields=True):
    """:class:`.schemas.Span` without unknown fields."""

    stratum: str
    epoch: _Int63
    ranges: list[_Range] | None = None
    ids: _SampleIds | None = None
    order: str | None = None
    padding: bool | None = None
    indices: _Indices | None = None

    @property
    def kind(self) -> str:
        return "ranges" if self.ranges is not None else "ids"


class HotCursor(msgspec.Struct, forbid_unknown_fields=True):
    """:class:`.schemas.Cursor` without unknown fields but ``order`` (docs/ingest-v1.md: "an
    optional order is kept"; the model keeps it as an unknown field, of any value), here a
    string or null (UNSET when not sent, as the model has it only where sent): the observed
    recorder's read cursors name their order."""

    stratum: str
    epoch: _Int63
    position: _Int63
    order: str | None | msgspec.UnsetType = msgspec.UNSET


class _HotEvent(msgspec.Struct, tag_field="type", forbid_unknown_fields=True, kw_only=True):
    """:class:`.schemas.EventBase`'s fields (``time`` is the wire text until checked, then its
    datetime, as the models give it)."""

    event_id: Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
    run_id: str
    attempt: _Int31
    time: str
    rank: _Int31 | None = None


class HotUpdateCommitted(_HotEvent, tag="update_committed"):
    """:class:`.schemas.UpdateCommitted` without unknown fields."""

    type: ClassVar[str] = "update_committed"
    update: _Pos63
    spans: list[HotSpan]
    samples: _Int63 | None = None
    tokens: _Int63 | None = None
    ids_digest: str | None = None


class HotRankPart(msgspec.Struct, forbid_unknown_fields=True):
    """:class:`.schemas.RankPart` without unknown fields."""

    rank: _Int31
    spans: list[HotSpan]
    samples: _Int63 | None = None
    tokens: _Int63 | None = None
    ids_digest: str | None = None


class HotUpdateAggregate(_HotEvent, tag="update_aggregate"):
    """:class:`.schemas.UpdateAggregate` without unknown fields (distinct ranks checked
    after)."""

    type: ClassVar[str] = "update_aggregate"
    update: _Pos63
    ranks: Annotated[list[HotRankPart], msgspec.Meta(min_length=1,
                                                     max_length=MAX_AGGREGATE_RANKS)]


class HotHeartbeat(_HotEvent, tag="heartbeat"):
    """:class:`.schemas.Heartbeat` without unknown fields (the order of ``sdk_lost_updates``
    checked after)."""

    type: ClassVar[str] = "heartbeat"
    update: _Int63
    fetched: list[HotCursor] | None = None
    sdk_dropped: _Int63 | None = None
    sdk_quarantined: _Int63 | None = None
    sdk_lost_updates: (Annotated[list[_Int63], msgspec.Meta(min_length=2, max_length=2)]
                       | None) = None


class _Body(msgspec.Struct, forbid_unknown_fields=True):
    """``{"events": [...]}`` and nothing else. The general path ignores other top-level fields,
    but msgspec would skip them to a depth of its own: a value nested about 990 levels there
    passed here where ``json`` gives up (400 "JSON nested too deep"). With the structs above,
    what is taken nests at most 7 levels."""

    events: list[HotUpdateCommitted | HotUpdateAggregate | HotHeartbeat]


_DECODER = msgspec.json.Decoder(_Body)


def _spans_ok(spans: list[HotSpan]) -> bool:
    """The models' span rules beyond types and bounds: exactly one of ``ranges`` and ``ids``,
    ``indices`` only beside ``ranges``; each range (of ``ranges`` and of ``indices``) as
    :func:`.schemas._check_range` takes it (start <= stop, step >= 1, a reach of at most
    ``RECOVERYDASH_MAX_RANGE_POSITIONS``)."""
    for span in spans:
        ranges = span.ranges
        if ranges is None:
            if span.ids is None or span.indices is not None:
                return False
            continue
        if span.ids is not None:
            return False
        try:
            for r in ranges:
                _check_range(r)
            if span.indices is not None:
                for item in span.indices:
                    if type(item) is list:
                        _check_range(item)
        except ValueError:
            return False
    return True


def validate_hot(body: bytes, max_events: int) -> list[ValidEvent] | None:
    """The request body ``body`` (bytes, decoded from its transport encoding) as
    :func:`.schemas.validate_events` would return it, when every event is an
    ``update_committed``, ``update_aggregate`` or ``heartbeat`` that passes the models'
    checks, has no unknown field and holds only storable text, and there are 1 to
    ``max_events`` events; otherwise ``None`` (nothing is refused here: the general path
    decides). Never raises."""
    try:
        events = _DECODER.decode(body).events
    except (msgspec.DecodeError, RecursionError):  # msgspec.ValidationError is a DecodeError
        return None
    if not events or len(events) > max_events:
        return None
    try:
        # The wire objects as the general path keeps them (key order, explicit nulls): the
        # same values msgspec checked, integers of at most 64 bits, so orjson reads them alike.
        raw = orjson.loads(body)["events"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return None
    if type(raw) is not list or len(raw) != len(events):
        return None
    out: list[ValidEvent] = []
    run_ids: set[str] = set()
    for i, (model, wire) in enumerate(zip(events, raw)):
        if model.run_id not in run_ids:
            if not _RUN_ID.fullmatch(model.run_id) or model.run_id in UNADDRESSABLE_RUN_IDS:
                return None
            run_ids.add(model.run_id)
        try:
            model.time = _parse_time(model.time)
        except ValueError:
            return None
        kind = model.type
        if kind == "update_committed":
            if not _spans_ok(model.spans):
                return None
        elif kind == "update_aggregate":
            seen: set[int] = set()
            for part in model.ranks:
                if part.rank in seen or not _spans_ok(part.spans):
                    return None
                seen.add(part.rank)
        elif model.sdk_lost_updates is not None:
            try:
                _update_range(model.sdk_lost_updates)
            except ValueError:
                return None
        try:
            encoded = canonical_bytes(wire, False)
        except (ValueError, RecursionError):  # a lone surrogate (UnicodeEncodeError)
            return None
        if b"\\u0000" in encoded:  # a NUL character: the general path says where
            return None
        out.append(ValidEvent.of(i, model, wire, encoded))
    return out
