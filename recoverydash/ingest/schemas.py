"""Pydantic v2 models of the wire contract (docs/ingest-v1.md, sections 2 to 4) and the batch
validator.

The models check every rule the contract states about one event: types (strict: ``"5"`` is not an
integer, ``true`` is not a number), bounds (integers that reach the database fit its columns:
``attempt``, ``rank``, ``world_size`` and the like below 2**31, updates, sizes and positions below
2**63), RFC 3339 timestamps with an offset, the ``run_id`` pattern, ranges
(``0 <= start <= stop < 2**63``, ``step >= 1``), spans carrying ``ranges`` xor ``ids``, cursors,
sha256 digests, enums and list limits. Rules that need the database (an ``event_id`` already
stored, the kind a stratum already uses in the run) are checked by
:func:`recoverydash.ingest.actions.ingest_batch`.

Where the original contract is silent, these choices are documented in the OpenAPI schema (and
marked as extensions in docs/ingest-v1.md): string fields that land in a database column are bounded
by it (``generation_id``, ``shard``, ``component``: 200 chars; ``dataset_version``,
``config_digest``: 500; ``uri``: 2000); strings may not contain NUL characters or lone surrogates
anywhere in an event (no database can store them); ``sampler.epoch_length`` and ``sampler.units``
are checked when present because the analysis reads them. A ``checkpoint_committed`` manifest is
checked field by field only when its ``schema_revision`` is 1; another revision must still be an
integer and name a ``generation_id``, and is stored for the analysis to reject as
``schema_unsupported``.

Unknown extra fields are ignored by the models but kept: the stored ``Event.body`` is the event's
JSON object as received (docs/ingest-v1.md#2-common-fields).

Entry point: :func:`validate_events` (raw list from the request body -> :class:`ValidEvent` list,
or :class:`~recoverydash.ingest.errors.BadRequest` with at most 100 located errors).
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime, timezone
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, PlainValidator, Strict,
                      TypeAdapter, ValidationError, WithJsonSchema, model_validator)

from .errors import MAX_ERRORS, BadRequest, ErrorItem, _MISSING, short

MAX_U63 = 2**63 - 1
MAX_I31 = 2**31 - 1

# --- scalar types -------------------------------------------------------------------------------
Int63 = Annotated[int, Strict(), Field(ge=0, le=MAX_U63)]   # update, position, size, epoch
Pos63 = Annotated[int, Strict(), Field(ge=1, le=MAX_U63)]
Int31 = Annotated[int, Strict(), Field(ge=0, le=MAX_I31)]   # attempt, rank, accum_slot
Pos31 = Annotated[int, Strict(), Field(ge=1, le=MAX_I31)]   # world_size, batch sizes
Str = Annotated[str, Strict()]
Name200 = Annotated[str, Strict(), Field(min_length=1, max_length=200)]
Text500 = Annotated[str, Strict(), Field(max_length=500)]
Number = Annotated[float, Strict(), Field(allow_inf_nan=False)]
NonNegNumber = Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)]
Sha256 = Annotated[str, Strict(), Field(pattern=r"^[0-9a-fA-F]{64}$")]
SampleId = Union[Annotated[int, Strict()], Str]
StrictBool = Annotated[bool, Strict()]

_RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$")


def parse_rfc3339(value: Any) -> datetime:
    """An RFC 3339 timestamp with offset (``Z`` or ``+hh:mm``) -> aware datetime.

    Raises ValueError naming what was expected and what came (naive times, dates alone, numbers,
    impossible dates and offsets are all refused). Runs once per event: the common spelling goes
    through one regex match and ``datetime.fromisoformat`` (both C)."""
    if type(value) is not str:
        raise ValueError(f"expected an RFC 3339 timestamp string with offset, got {short(value)}")
    if not _RFC3339.match(value):
        raise ValueError("expected an RFC 3339 timestamp with offset such as "
                         f"2026-11-01T00:00:05Z, got {short(value)}")
    try:
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:  # lower-case t/z are RFC 3339 too
            parsed = datetime.fromisoformat(value.upper())
        if parsed.year in (1, 9999):  # must still exist in UTC, where the database keeps it
            parsed.astimezone(timezone.utc)
        return parsed
    except (ValueError, OverflowError):
        raise ValueError(f"expected a real date and time with offset, got {short(value)}") from None


Time = Annotated[datetime, PlainValidator(parse_rfc3339),
                 WithJsonSchema({"type": "string", "format": "date-time",
                                 "description": "RFC 3339 with offset, e.g. 2026-11-01T00:00:05Z"})]


def _max_range_positions() -> int:
    from django.conf import settings

    return settings.RECOVERYDASH_MAX_RANGE_POSITIONS


MAX_RANGE_POSITIONS = _max_range_positions()


def _check_range(r: list[int]) -> list[int]:
    if r[0] > r[1]:
        raise ValueError(f"expected start <= stop, got [{', '.join(map(str, r))}]")
    if len(r) == 3 and r[2] < 1:
        raise ValueError(f"expected step >= 1, got {r[2]}")
    # An implementation limit beyond the original contract, the recovery core's own bound: one range
    # of one report is one rank's share of one update, and a reach (stop - start) of billions is a
    # unit mistake that would cost the analysis memory in proportion; refuse it with a clear
    # message.
    if r[1] - r[0] > MAX_RANGE_POSITIONS:
        raise ValueError(f"expected a range reaching at most {MAX_RANGE_POSITIONS:,} positions "
                         f"(stop - start; RECOVERYDASH_MAX_RANGE_POSITIONS), got "
                         f"{r[1] - r[0]:,}")
    return r


Range = Annotated[list[Int63], Field(min_length=2, max_length=3), AfterValidator(_check_range)]


class _Wire(BaseModel):
    """Base of wire objects: unknown fields are accepted (and kept in the stored body)."""

    model_config = ConfigDict(extra="allow", frozen=False)


# --- docs/ingest-v1.md#3-positions-spans-and-cursors --------------------------------------------
class Span(_Wire):
    """Positions of one ``(stratum, epoch)``: ``ranges`` ([start, stop] or [start, stop, step],
    half-open like Python's range) xor ``ids`` (at most 100,000 sample identities)."""

    stratum: Str
    epoch: Int63
    ranges: Optional[list[Range]] = None
    ids: Optional[Annotated[list[SampleId], Field(max_length=100_000)]] = None
    order: Optional[Str] = None
    padding: Optional[StrictBool] = None

    @model_validator(mode="after")
    def _ranges_xor_ids(self) -> "Span":
        if (self.ranges is None) == (self.ids is None):
            got = "both" if self.ranges is not None else "neither"
            raise ValueError(f"expected exactly one of ranges or ids, got {got}")
        return self

    @property
    def kind(self) -> str:
        return "ranges" if self.ranges is not None else "ids"


class Cursor(_Wire):
    """The next position to be delivered in ``(stratum, epoch)``."""

    stratum: Str
    epoch: Int63
    position: Int63


class Object(_Wire):
    """A checkpoint object (docs/ingest-v1.md#shard_written). URIs ``s3://`` and ``file://`` are
    verified by the server."""

    uri: Annotated[str, Strict(), Field(min_length=1, max_length=2000)]
    shard: Optional[Name200] = None
    component: Name200
    size: Int63
    sha256: Optional[Sha256] = None
    update: Optional[Int63] = None


class ManifestObject(Object):
    shard: Name200


class DataProgress(_Wire):
    cursor: list[Cursor]
    samples_committed: Optional[Int63] = None


class ManifestV1(_Wire):
    """A committed manifest of ``schema_revision`` 1 (docs/ingest-v1.md#checkpoint_committed)."""

    schema_revision: Literal[1]
    generation_id: Name200
    update: Int63
    world_size: Pos31
    required_shards: list[Name200]
    components: list[Name200]
    objects: list[ManifestObject]
    data_progress: DataProgress
    dataset_version: Text500
    config_digest: Optional[Text500] = None
    committed_at: Time


class ManifestHead(_Wire):
    """What every manifest revision must carry; the rest is checked per revision."""

    schema_revision: Annotated[int, Strict()]
    generation_id: Name200


# --- docs/ingest-v1.md#2-common-fields ----------------------------------------------------------
class EventBase(_Wire):
    """Fields of every event (docs/ingest-v1.md#2-common-fields)."""

    event_id: Name200
    run_id: Annotated[str, Strict(), Field(pattern=r"^[A-Za-z0-9._:-]{1,128}$")]
    attempt: Int31
    time: Time
    rank: Optional[Int31] = None


# --- docs/ingest-v1.md#4-event-types ------------------------------------------------------------
class Sampler(_Wire):
    """Free-form; the recommended keys the analysis reads are checked when present."""

    seed: Any = None
    shuffle: Optional[StrictBool] = None
    drop_last: Optional[StrictBool] = None
    epoch_length: Optional[dict[str, Int63]] = None
    units: Optional[dict[str, Literal["samples", "tokens"]]] = None


class ResumedFrom(_Wire):
    generation_id: Optional[Name200] = None
    update: Int63
    cursor: list[Cursor] = []


class Contract(_Wire):
    """Run-level recovery contract; the latest one wins (copied to ``Run.contract``)."""

    max_replay_samples: Int63 = 0
    max_omission_samples: Int63 = 0
    required_components: list[Str] = ["model", "optimizer", "scheduler", "rng", "data_progress"]
    max_checkpoint_age_s: NonNegNumber = 3600


class AttemptStarted(EventBase):
    type: Literal["attempt_started"]
    world_size: Pos31
    dataset_version: Text500
    global_batch_size: Optional[Pos31] = None
    micro_batch_size: Optional[Pos31] = None
    grad_accum_steps: Optional[Pos31] = None
    config_digest: Optional[Text500] = None
    sampler: Optional[Sampler] = None
    resumed_from: Optional[ResumedFrom] = None
    contract: Optional[Contract] = None


class UpdateCommitted(EventBase):
    """The ledger record: positions this reporter contributed to ``update``."""

    type: Literal["update_committed"]
    update: Pos63
    spans: list[Span]
    samples: Optional[Int63] = None
    tokens: Optional[Int63] = None
    ids_digest: Optional[Str] = None


class Heartbeat(EventBase):
    type: Literal["heartbeat"]
    update: Int63
    fetched: Optional[list[Cursor]] = None


class CheckpointStarted(EventBase):
    type: Literal["checkpoint_started"]
    generation_id: Name200
    update: Int63
    required_shards: list[Name200] = []
    components: list[Name200] = []


class ShardWritten(EventBase):
    type: Literal["shard_written"]
    generation_id: Name200
    shard: Name200
    update: Int63
    objects: list[Object]


class CheckpointCommitted(EventBase):
    type: Literal["checkpoint_committed"]
    manifest: ManifestHead


class RestoreCompleted(EventBase):
    type: Literal["restore_completed"]
    generation_id: Name200
    seconds: NonNegNumber


class AttemptEnded(EventBase):
    type: Literal["attempt_ended"]
    reason: Literal["completed", "failed", "preempted", "cancelled"]
    update: Int63
    fetched: Optional[list[Cursor]] = None
    message: Optional[Annotated[str, Strict(), Field(max_length=2000)]] = None


class AuditWindow(EventBase):
    type: Literal["audit_window"]
    update: Int63
    rank: Int31  # required here, unlike the common field
    accum_slot: Int31
    sample_ids: Annotated[list[SampleId], Field(max_length=4096)]


EVENT_MODELS = (AttemptStarted, UpdateCommitted, Heartbeat, CheckpointStarted, ShardWritten,
                CheckpointCommitted, RestoreCompleted, AttemptEnded, AuditWindow)
EVENT_TYPES = tuple(m.model_fields["type"].annotation.__args__[0] for m in EVENT_MODELS)

AnyEvent = Annotated[Union[EVENT_MODELS], Field(discriminator="type")]  # type: ignore[valid-type]


class IngestBody(BaseModel):
    """The request body of ``POST /api/v1/events`` (docs/ingest-v1.md#1-transport)."""

    events: list[AnyEvent]


EventsAdapter = TypeAdapter(list[AnyEvent])
EventAdapter = TypeAdapter(AnyEvent)
ManifestV1Adapter = TypeAdapter(ManifestV1)


class ValidEvent:
    """One event that passed validation: ``index`` in the batch, the typed ``model``, the
    received JSON object ``body``, its canonical JSON text and sha256 ``content_hash``."""

    __slots__ = ("index", "model", "body", "canonical", "content_hash", "manifest")

    def __init__(self, index: int, model: Any, body: dict, canonical: str, content_hash: str,
                 manifest: ManifestV1 | None = None):
        self.index = index
        self.model = model
        self.body = body
        self.canonical = canonical
        self.content_hash = content_hash
        self.manifest = manifest


def canonical_json(body: Any) -> str:
    """Sorted keys, no spaces, non-ASCII kept: the text whose sha256 is an event's content hash.
    Raises ValueError for values JSON cannot carry (NaN, infinities)."""
    return _CANONICAL.encode(body)


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                              allow_nan=False)


# Union members and wrappers pydantic adds to error locations; they are not wire names.
_LOC_NOISE = {"int", "str", "float", "bool", "list", "dict", "function-after", "constrained-int"}


def wire_path(loc: tuple) -> str:
    """``('events', 3, 'update_committed', 'spans', 0, 'ranges', 1)`` ->
    ``events[3].spans[0].ranges[1]``: the wire's names and indexes, pydantic's labels dropped."""
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif (part in _LOC_NOISE or part.startswith(("function-", "tagged-union["))
              or (i == 2 and loc[0] == "events" and part in EVENT_TYPES)):
            continue
        else:
            out += f".{part}" if out else part
    return out


def _message(err: dict) -> str:
    kind = err["type"]
    received = err.get("input", _MISSING)
    if kind == "missing":
        return "expected this required field, got nothing"
    if kind == "union_tag_invalid":
        return (f"expected type to be one of {', '.join(EVENT_TYPES)}, "
                f"got {short(err.get('ctx', {}).get('tag'))}")
    if kind == "union_tag_not_found":
        return f"expected a type field naming one of {', '.join(EVENT_TYPES)}, got nothing"
    if kind == "value_error":
        return str(err.get("ctx", {}).get("error", err["msg"]))
    if kind == "extra_forbidden":
        return "expected no such field"
    msg = err["msg"]
    if msg.startswith("Input should be "):
        msg = "expected " + msg[len("Input should be "):]
    elif msg.startswith("Value error, "):
        return msg[len("Value error, "):]
    else:
        msg = "expected: " + msg[0].lower() + msg[1:]
    return f"{msg}, got {short(received)}"


def _items_from(exc: ValidationError, prefix: tuple = ()) -> list[ErrorItem]:
    items: list[ErrorItem] = []
    seen: set[str] = set()
    for err in exc.errors(include_url=False):
        loc = prefix + tuple(err["loc"])
        path = wire_path(loc)
        if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
            path += ".type"
        # A value that fits no member of a small union yields one error per member: say it once.
        if path in seen and loc and isinstance(loc[-1], str) and loc[-1] in _LOC_NOISE:
            continue
        message = _message(err)
        if loc and isinstance(loc[-1], str) and loc[-1] in ("int", "str") and err["type"] in (
                "int_type", "string_type"):
            message = f"expected an integer or a string, got {short(err.get('input'))}"
        seen.add(path)
        index = loc[1] if len(loc) > 1 and loc[0] == "events" and isinstance(loc[1], int) else None
        items.append(ErrorItem(index, path, message))
        if len(items) >= MAX_ERRORS:
            break
    return items


def _find_unstorable(value: Any, path: str) -> tuple[str, str] | None:
    """Locate a NUL character or lone surrogate in keys or strings: (path, message) or None."""
    if isinstance(value, str):
        if "\x00" in value:
            return path, "expected text without NUL characters, got a string containing \\u0000"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path, "expected valid Unicode text, got a string with a lone surrogate"
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            found = _find_unstorable(key, path) if isinstance(key, str) else None
            if found:
                return path, "expected field names of valid Unicode text without NUL characters"
            found = _find_unstorable(item, f"{path}.{key}")
            if found:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = _find_unstorable(item, f"{path}[{i}]")
            if found:
                return found
    return None


def validate_events(raw_events: Any) -> list[ValidEvent]:
    """Validate the ``events`` list of a request body (docs/ingest-v1.md, sections 2-4, one event at
    a time).

    Returns one :class:`ValidEvent` per event, in order. Raises
    :class:`~recoverydash.ingest.errors.BadRequest` listing at most 100 errors, each with the
    event's index and the wire path (``events[3].spans[0].ranges[1]``).
    """
    if not isinstance(raw_events, list):
        raise BadRequest("invalid batch", [ErrorItem(
            None, "events", f"expected a list of events, got {short(raw_events)}")])
    items: list[ErrorItem] = []
    try:
        models = EventsAdapter.validate_python(raw_events)
    except ValidationError as exc:
        # Slow path, only for bad batches: keep the located errors, and run the checks below on
        # the events that passed so that one answer lists every problem it can.
        items = _items_from(exc, ("events",))
        failed = {item.index for item in items}
        models = []
        for i, body in enumerate(raw_events):
            if i not in failed:
                try:
                    models.append(EventAdapter.validate_python(body))
                    continue
                except ValidationError:
                    pass
            models.append(None)
    out: list[ValidEvent] = []
    if len(items) < MAX_ERRORS:
        for i, (model, body) in enumerate(zip(models, raw_events)):
            if model is None:
                continue
            manifest = None
            if model.type == "checkpoint_committed" and model.manifest.schema_revision == 1:
                try:
                    manifest = ManifestV1Adapter.validate_python(body["manifest"])
                except ValidationError as exc:
                    items.extend(_items_from(exc, ("events", i, "manifest")))
                    continue
            try:
                text = canonical_json(body)
                encoded = text.encode("utf-8")
                found = _find_unstorable(body, f"events[{i}]") if b"\\u0000" in encoded else None
            except (ValueError, UnicodeEncodeError, RecursionError):
                found = _find_unstorable(body, f"events[{i}]") or (
                    f"events[{i}]", "expected JSON that can be stored, got numbers out of range")
            if found:
                items.append(ErrorItem(i, *found))
                continue
            digest = hashlib.sha256(encoded).hexdigest()
            out.append(ValidEvent(i, model, body, text, digest, manifest))
            if len(items) >= MAX_ERRORS:
                break
    if items:
        items.sort(key=lambda item: item.index if item.index is not None else -1)
        raise BadRequest(f"{len(items)} invalid field(s) in the batch", items[:MAX_ERRORS])
    return out


def manifest_committed_at(manifest: dict) -> datetime | None:
    """``committed_at`` of any manifest revision, parsed when it is RFC 3339, else None."""
    try:
        return parse_rfc3339(manifest.get("committed_at"))
    except ValueError:
        return None
