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
JSON object as received (docs/ingest-v1.md#2-common-fields), for the ledger types without what
their ledger rows hold (``ingest.actions.stored_body``, docs/ingest-v1.md#stored-events). An
unknown field's value may nest at
most :data:`MAX_EXTRA_DEPTH` levels of objects and arrays.

Identifiers that appear in dashboard URLs and storage paths (``generation_id`` everywhere it
occurs, shard names) follow :data:`ID_PATTERN`: 1-200 characters from ``A-Z a-z 0-9 _ . - : = @
+ ~``, not starting with ``.`` or ``-`` (so never a path separator, a ``.``/``..`` segment or
anything a URL must escape). Timestamps must name an instant Python can represent in UTC, also as
POSIX seconds (years 1 to 9999 after the offset is applied). Within one event, an object URI
belongs to one shard: a manifest or shard report listing one URI under two shards is refused,
naming both (docs/ingest-v1.md#objects-and-shards).

Cost of a bad batch: events are validated in chunks, lists and maps stop at their first bad item
(``fail_fast``), and validation stops as soon as :data:`~recoverydash.ingest.errors.MAX_ERRORS`
errors are known, so the work a refused request causes is bounded by those 100 errors, not by the
number of mistakes it carries.

Entry point: :func:`validate_events` (raw list from the request body -> :class:`ValidEvent` list,
or :class:`~recoverydash.ingest.errors.BadRequest` with at most 100 located errors).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal, Union, get_args

import orjson
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    Strict,
    TypeAdapter,
    ValidationError,
    WithJsonSchema,
    model_validator,
)

from recoverydash.recovery.contract import DEFAULT_CONTRACT
from recoverydash.recovery.drills import CRASH_POINTS

from .errors import _MISSING, MAX_ERRORS, BadRequest, ErrorItem, short

MAX_U63 = 2**63 - 1
MAX_I31 = 2**31 - 1
#: Levels of objects and arrays an unknown field's value may nest (the stored body is read back
#: by JSON decoders that recurse; ~1000 levels break them).
MAX_EXTRA_DEPTH = 32
#: Events validated at once before falling back to one at a time (bounds the cost of a chunk
#: that fails).
CHUNK = 256
#: generation_id and shard names: what every URL and storage path can carry unescaped.
ID_PATTERN = r"^[A-Za-z0-9_:=@+~][A-Za-z0-9._:=@+~-]{0,199}$"
#: run_id (and a drill result's control_run_id): 1-128 characters from A-Z a-z 0-9 . _ : -
RUN_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"
#: run ids the pattern admits that no URL can address: a browser (and any WHATWG URL parser)
#: folds the path segments ``.`` and ``..``, so such a run's pages and API routes never match
UNADDRESSABLE_RUN_IDS = frozenset({".", ".."})
ID_RULE = ("1-200 characters from A-Z a-z 0-9 _ . - : = @ + ~, not starting with '.' or '-' "
           "(no '/', no spaces)")
#: stop a list or map at its first bad item: one bad event costs its fields, not its items
FAIL_FAST = Field(fail_fast=True)

# --- scalar types -------------------------------------------------------------------------------
Int63 = Annotated[int, Strict(), Field(ge=0, le=MAX_U63)]   # update, position, size, epoch
Pos63 = Annotated[int, Strict(), Field(ge=1, le=MAX_U63)]
Int31 = Annotated[int, Strict(), Field(ge=0, le=MAX_I31)]   # attempt, rank, accum_slot
Pos31 = Annotated[int, Strict(), Field(ge=1, le=MAX_I31)]   # world_size, batch sizes
Str = Annotated[str, Strict()]
Name200 = Annotated[str, Strict(), Field(min_length=1, max_length=200)]
Ident = Annotated[str, Strict(), Field(min_length=1, max_length=200, pattern=ID_PATTERN,
                                       description=f"an identifier: {ID_RULE}")]
Text500 = Annotated[str, Strict(), Field(max_length=500)]
Number = Annotated[float, Strict(), Field(allow_inf_nan=False)]
NonNegNumber = Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)]
Sha256 = Annotated[str, Strict(), Field(pattern=r"^[0-9a-fA-F]{64}$")]
SampleId = Annotated[int, Strict()] | Str
StrictBool = Annotated[bool, Strict()]

_RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$")


# The largest UTC offset a time may carry: PostgreSQL's timestamptz refuses larger ones.
MAX_UTC_OFFSET = timedelta(hours=15, minutes=59, seconds=59)


def parse_rfc3339(value: Any) -> datetime:
    """An RFC 3339 timestamp with offset (``Z`` or ``+hh:mm``) -> aware datetime.

    Raises ValueError naming what was expected and what came (naive times, dates alone, numbers,
    impossible dates, offsets beyond ``MAX_UTC_OFFSET`` (15:59:59) are all refused). Runs once per
    event: the common spelling goes through one regex match and ``datetime.fromisoformat`` (both
    C)."""
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
    except ValueError:
        raise ValueError(f"expected a real date and time with offset, got {short(value)}") from None
    if abs(parsed.utcoffset()) > MAX_UTC_OFFSET:
        # Python takes any offset under 24 h, PostgreSQL's timestamptz only up to 15:59:59
        # (every zone on Earth lies within -12:00 and +14:00): refused here, not a 500 there.
        raise ValueError("expected a UTC offset between -15:59 and +15:59, got "
                         f"{short(value)}")
    if parsed.year in (1, 9999):
        # It must exist in UTC, where the database keeps it, and come back from the POSIX seconds
        # (a float) the analysis computes with: 9999-12-31T23:59:59.999999Z rounds to year 10000.
        try:
            datetime.fromtimestamp(parsed.astimezone(UTC).timestamp(), UTC)
        except (ValueError, OverflowError, OSError):
            raise ValueError("expected a time between 0001-01-01 and 9999-12-31 in UTC, got "
                             f"{short(value)}") from None
    return parsed


_parse_rfc3339_text = functools.lru_cache(maxsize=4096)(parse_rfc3339)


def _parse_time(value: Any) -> datetime:
    """:func:`parse_rfc3339`, remembered for the last 4,096 distinct strings (a pure function of
    the text, its datetime immutable; the ranks of one update mostly send one time): a refused
    string raises again each time, anything but a ``str`` goes to it directly."""
    if type(value) is str:
        return _parse_rfc3339_text(value)
    return parse_rfc3339(value)


Time = Annotated[datetime, PlainValidator(_parse_time),
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


Range = Annotated[list[Int63], Field(min_length=2, max_length=3, fail_fast=True),
                  AfterValidator(_check_range)]


class _Wire(BaseModel):
    """Base of wire objects: unknown fields are accepted (and kept in the stored body)."""

    model_config = ConfigDict(extra="allow", frozen=False)


# --- docs/ingest-v1.md#3-positions-spans-and-cursors --------------------------------------------
#: At most this many sample ids in a span's ``ids``, and items in its ``indices``.
MAX_SPAN_IDS = 100_000
def _index_item(value: Any) -> Any:
    """One item of a span's ``indices``: a dataset index (an integer in ``[0, 2**63)``) or a
    range of them written like a ``ranges`` item (:func:`_check_range`). Raises ValueError
    saying which was expected."""
    if type(value) is int:
        if not 0 <= value <= MAX_U63:
            raise ValueError(f"expected a dataset index in [0, 2**63), got {short(value)}")
        return value
    if type(value) is list and 2 <= len(value) <= 3 \
            and all(type(x) is int and 0 <= x <= MAX_U63 for x in value):
        return _check_range(value)
    raise ValueError("expected a dataset index (an integer in [0, 2**63)) or a range of them "
                     f"[start, stop] or [start, stop, step], got {short(value)}")


#: One item of a span's ``indices`` (docs/ingest-v1.md#3-positions-spans-and-cursors): a dataset
#: index, or a range of them written like a ``ranges`` item.
IndexItem = Annotated[int | list[int], PlainValidator(_index_item),
                      WithJsonSchema({"oneOf": [
                          {"type": "integer", "minimum": 0, "maximum": MAX_U63},
                          {"type": "array", "items": {"type": "integer", "minimum": 0,
                                                      "maximum": MAX_U63},
                           "minItems": 2, "maxItems": 3}]})]


class Span(_Wire):
    """Positions of one ``(stratum, epoch)``: ``ranges`` ([start, stop] or [start, stop, step],
    half-open like Python's range) xor ``ids`` (at most 100,000 sample identities). **Extension**
    ``indices``, beside ``ranges`` only: the set of dataset indices (sample identities) the
    span's positions held, each item an index or a range of indices (at most 100,000 items)."""

    stratum: Str
    epoch: Int63
    ranges: Annotated[list[Range], FAIL_FAST] | None = None
    ids: Annotated[list[SampleId], Field(max_length=MAX_SPAN_IDS, fail_fast=True)] | None = None
    order: Str | None = None
    padding: StrictBool | None = None
    indices: Annotated[list[IndexItem], Field(max_length=MAX_SPAN_IDS,
                                              fail_fast=True)] | None = None

    @model_validator(mode="after")
    def _ranges_xor_ids(self) -> Span:
        if (self.ranges is None) == (self.ids is None):
            got = "both" if self.ranges is not None else "neither"
            raise ValueError(f"expected exactly one of ranges or ids, got {got}")
        if self.indices is not None and self.ranges is None:
            raise ValueError("expected indices only beside ranges (the dataset indices of the "
                             "span's positions), got indices beside ids")
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
    shard: Ident | None = None
    component: Name200
    size: Int63
    sha256: Sha256 | None = None
    update: Int63 | None = None


class ManifestObject(Object):
    shard: Ident


class DataProgress(_Wire):
    cursor: Annotated[list[Cursor], FAIL_FAST]
    samples_committed: Int63 | None = None


Text2000 = Annotated[str, Strict(), Field(max_length=2000)]


class AdoptedReason(_Wire):
    """One finding of a format adapter (docs/ingest-v1.md#adopted): a reason ``code`` of
    docs/ingest-v1.md#statuses-and-codes and what was found."""

    code: Name200
    detail: Text2000 = ""


class Adopted(_Wire):
    """Extension (docs/ingest-v1.md#adopted): the manifest was built by the server's discovery
    from another tool's folder, not written by a trainer. ``reasons`` replace the shard and
    component rules for the generation; ``progress`` is what the format records of training
    progress (its own names)."""

    format: Name200
    rule: Text2000 = ""
    folder: Text2000 = ""
    commit_marker: Text2000 | None = None
    progress: dict[str, Any] | None = None
    reasons: Annotated[list[AdoptedReason], Field(max_length=1000), FAIL_FAST] = []


class ManifestV1(_Wire):
    """A committed manifest of ``schema_revision`` 1 (docs/ingest-v1.md#checkpoint_committed)."""

    schema_revision: Literal[1]
    generation_id: Ident
    update: Int63
    world_size: Pos31
    required_shards: Annotated[list[Ident], FAIL_FAST]
    components: Annotated[list[Name200], FAIL_FAST]
    objects: Annotated[list[ManifestObject], FAIL_FAST]
    data_progress: DataProgress
    dataset_version: Text500
    config_digest: Text500 | None = None
    committed_at: Time
    adopted: Adopted | None = None  # Extension: docs/ingest-v1.md#adopted


class ManifestHead(_Wire):
    """What every manifest revision must carry; the rest is checked per revision."""

    schema_revision: Annotated[int, Strict()]
    generation_id: Ident


def _addressable(run_id: str) -> str:
    """``run_id`` unchanged; ValueError for ``.`` and ``..`` (:data:`UNADDRESSABLE_RUN_IDS`)."""
    if run_id in UNADDRESSABLE_RUN_IDS:
        raise ValueError(f"a run id cannot be '.' or '..' (URLs fold those path segments, so "
                         f"the run could never be read), got {run_id!r}")
    return run_id


#: a run id: the pattern, and addressable in a URL
RunId = Annotated[str, Strict(), Field(pattern=RUN_ID_PATTERN), AfterValidator(_addressable)]


# --- docs/ingest-v1.md#2-common-fields ----------------------------------------------------------
class EventBase(_Wire):
    """Fields of every event (docs/ingest-v1.md#2-common-fields)."""

    event_id: Name200
    run_id: RunId
    attempt: Int31
    time: Time
    rank: Int31 | None = None


# --- docs/ingest-v1.md#4-event-types ------------------------------------------------------------
class Sampler(_Wire):
    """Free-form; the recommended keys the analysis reads are checked when present."""

    seed: Any = None
    shuffle: StrictBool | None = None
    drop_last: StrictBool | None = None
    epoch_length: Annotated[dict[str, Int63], FAIL_FAST] | None = None
    units: Annotated[dict[str, Literal["samples", "tokens"]], FAIL_FAST] | None = None


class ResumedFrom(_Wire):
    generation_id: Ident | None = None
    update: Int63
    cursor: Annotated[list[Cursor], FAIL_FAST] = []


class Contract(_Wire):
    """Run-level recovery contract; the latest one wins (copied to ``Run.contract`` as sent).
    The defaults shown are the core's ``recovery.contract.DEFAULT_CONTRACT``, which the analysis
    applies to a field left out."""

    max_replay_samples: Int63 = DEFAULT_CONTRACT["max_replay_samples"]
    max_omission_samples: Int63 = DEFAULT_CONTRACT["max_omission_samples"]
    required_components: Annotated[list[Str], FAIL_FAST] = list(
        DEFAULT_CONTRACT["required_components"])
    max_checkpoint_age_s: NonNegNumber = DEFAULT_CONTRACT["max_checkpoint_age_s"]


class DrillMark(_Wire):
    """Extension (docs/ingest-v1.md#drill_result): the attempt is a launch of a failure drill;
    the run is marked as a drill (``Run.drill_id``), so the fleet can leave it out."""

    drill_id: Ident
    role: Annotated[str, Strict(), Field(max_length=64)] = ""


class AttemptStarted(EventBase):
    type: Literal["attempt_started"]
    world_size: Pos31
    dataset_version: Text500
    global_batch_size: Pos31 | None = None
    micro_batch_size: Pos31 | None = None
    grad_accum_steps: Pos31 | None = None
    config_digest: Text500 | None = None
    sampler: Sampler | None = None
    resumed_from: ResumedFrom | None = None
    contract: Contract | None = None
    drill: DrillMark | None = None  # extension: a drill's launch


class UpdateCommitted(EventBase):
    """The ledger record: positions this reporter contributed to ``update``."""

    type: Literal["update_committed"]
    update: Pos63
    spans: Annotated[list[Span], FAIL_FAST]
    samples: Int63 | None = None
    tokens: Int63 | None = None
    ids_digest: Str | None = None


class RankPart(_Wire):
    """One rank's part of an ``update_aggregate``: what that rank's ``update_committed`` would
    carry (docs/ingest-v1.md#update_aggregate)."""

    rank: Int31
    spans: Annotated[list[Span], FAIL_FAST]
    samples: Int63 | None = None
    tokens: Int63 | None = None
    ids_digest: Str | None = None


#: Most rank parts one update_aggregate carries (a node's or a job's data-parallel ranks).
MAX_AGGREGATE_RANKS = 16_384


def _distinct_ranks(parts: list[RankPart]) -> list[RankPart]:
    seen: dict[int, int] = {}
    for k, part in enumerate(parts):
        if part.rank in seen:
            raise ValueError(f"expected each rank once, got rank {part.rank} at "
                             f"ranks[{seen[part.rank]}] and ranks[{k}]")
        seen[part.rank] = k
    return parts


class UpdateAggregate(EventBase):
    """Extension (docs/ingest-v1.md#update_aggregate): the ``update_committed`` reports of
    several ranks for one ``update`` in one event, sent by a coordinator or a node leader
    (``rank``: the reporter, optional). Each part is stored exactly as that rank's own
    ``update_committed``; a rank absent from every report is a missing part, as before."""

    type: Literal["update_aggregate"]
    update: Pos63
    ranks: Annotated[list[RankPart], Field(min_length=1, max_length=MAX_AGGREGATE_RANKS,
                                           fail_fast=True), AfterValidator(_distinct_ranks)]


def _update_range(r: list[int]) -> list[int]:
    if r[0] > r[1]:
        raise ValueError(f"expected [first, last] with first <= last, got {r}")
    return r


class Heartbeat(EventBase):
    type: Literal["heartbeat"]
    update: Int63
    fetched: Annotated[list[Cursor], FAIL_FAST] | None = None
    # Extension (docs/ingest-v1.md#heartbeat): what the reporter's SDK could not deliver so far.
    sdk_dropped: Int63 | None = None
    sdk_quarantined: Int63 | None = None
    sdk_lost_updates: (Annotated[list[Int63], Field(min_length=2, max_length=2),
                                 AfterValidator(_update_range)] | None) = None


class CheckpointStarted(EventBase):
    type: Literal["checkpoint_started"]
    generation_id: Ident
    update: Int63
    required_shards: Annotated[list[Ident], FAIL_FAST] = []
    components: Annotated[list[Name200], FAIL_FAST] = []


class ShardWritten(EventBase):
    type: Literal["shard_written"]
    generation_id: Ident
    shard: Ident
    update: Int63
    objects: Annotated[list[Object], FAIL_FAST]


class CheckpointCommitted(EventBase):
    type: Literal["checkpoint_committed"]
    manifest: ManifestHead


class RestoreCompleted(EventBase):
    type: Literal["restore_completed"]
    generation_id: Ident
    seconds: NonNegNumber


# Extension (docs/ingest-v1.md#restore_failed): a restore that did not complete.
RESTORE_FAILURE_REASONS = ("object_damaged", "load_error", "nothing_restorable")


class RestoreFailed(EventBase):
    type: Literal["restore_failed"]
    generation_id: Ident
    reason: Literal["object_damaged", "load_error", "nothing_restorable"]
    message: Annotated[str, Strict(), Field(max_length=2000)] | None = None


class AttemptEnded(EventBase):
    type: Literal["attempt_ended"]
    reason: Literal["completed", "failed", "preempted", "cancelled"]
    update: Int63
    fetched: Annotated[list[Cursor], FAIL_FAST] | None = None
    message: Annotated[str, Strict(), Field(max_length=2000)] | None = None


class AuditWindow(EventBase):
    type: Literal["audit_window"]
    update: Int63
    rank: Int31  # required here, unlike the common field
    accum_slot: Int31
    sample_ids: Annotated[list[SampleId], Field(max_length=4096, fail_fast=True)]


class DrillDivergence(_Wire):
    """docs/definitions.md#drill: the first (update, rank, index) where the positions differ."""

    update: Int63
    rank: Int31
    index: Int63
    control: Annotated[list[Any], Field(max_length=3)] | None = None
    drill: Annotated[list[Any], Field(max_length=3)] | None = None


class DrillState(_Wire):
    match: StrictBool
    first_mismatch: Int63 | None = None
    updates_compared: Int63 = 0
    compare: Text500 = ""


class DrillCost(_Wire):
    lost_updates: Int63 | None = None
    lost_seconds: NonNegNumber | None = None
    restore_seconds: NonNegNumber | None = None
    fast_forward_seconds: NonNegNumber | None = None


class DrillResult(EventBase):
    """Extension (docs/ingest-v1.md#drill_result): one crash point of a failure drill, sent by
    the drill runner on the drill run (``attempt``: its resumed launch)."""

    type: Literal["drill_result"]
    drill_id: Ident
    config_digest: Name200
    point: Literal[CRASH_POINTS]  # type: ignore[valid-type]
    passed: StrictBool
    expected_generation: Ident | None = None
    restored_generation: Ident | None = None
    verdict: Literal["exact", "replay", "omission", "replay_and_omission",
                     "unverified"] | None = None
    replayed: Int63 | None = None
    omitted: Int63 | None = None
    recomputed: Int63 | None = None
    first_divergence: DrillDivergence | None = None
    state: DrillState
    cost: DrillCost = DrillCost()
    failures: Annotated[list[Text500], Field(max_length=20)] = []
    control_run_id: RunId | None = None


EVENT_MODELS = (AttemptStarted, UpdateCommitted, UpdateAggregate, Heartbeat, CheckpointStarted,
                ShardWritten, CheckpointCommitted, RestoreCompleted, RestoreFailed, AttemptEnded,
                AuditWindow, DrillResult)
EVENT_TYPES = tuple(m.model_fields["type"].annotation.__args__[0] for m in EVENT_MODELS)

# A Union over the tuple itself: ``|`` cannot take a tuple (ruff's UP007 fix drops the Union).
AnyEvent = Annotated[Union[EVENT_MODELS],  # type: ignore[valid-type]  # noqa: UP007
                     Field(discriminator="type")]


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

    @classmethod
    def of(cls, index: int, model: Any, body: dict, encoded: bytes,
           manifest: ManifestV1 | None = None) -> ValidEvent:
        """The accepted event ``index`` from its canonical JSON ``encoded`` (UTF-8 bytes of
        :func:`canonical_bytes`): ``content_hash`` is their sha256, in hex."""
        return cls(index, model, body, encoded.decode("utf-8"),
                   hashlib.sha256(encoded).hexdigest(), manifest)


def canonical_json(body: Any, floats: bool = True) -> str:
    """Sorted keys, no spaces, non-ASCII kept: the text whose sha256 is an event's content hash.
    Raises ValueError for values JSON cannot carry (NaN, infinities). ``floats=False``: the
    caller knows ``body`` holds no float (see :func:`canonical_bytes`)."""
    return canonical_bytes(body, floats).decode("utf-8")


def canonical_bytes(body: Any, floats: bool = True) -> bytes:
    """:func:`canonical_json` as UTF-8 bytes (what the content hash is taken of). Raises
    ValueError for NaN and infinities, UnicodeEncodeError for lone surrogates (as encoding the
    standard library's text does).

    The text is the standard library's (``json`` with ``sort_keys``, ``(",", ":")``
    separators, ``ensure_ascii=False``), the one every stored hash was made of. orjson writes
    the same text about ten times faster for every JSON value but floats (it spells them its
    own way: ``1e16`` for ``1e+16``, ``0.00001`` for ``1e-05``, NaN as ``null``), integers
    beyond 64 bits, strings holding lone surrogates and nesting past 255 levels, which it
    refuses. So with ``floats=False`` (the caller read ``body`` from JSON text holding no
    number with a fraction or an exponent: :func:`recoverydash.ingest.api.loads_body`) orjson
    writes it, and the standard library whenever orjson refuses the value; otherwise the
    standard library (tests/ingest/test_canonical.py: equal texts and refusals on arbitrary
    values)."""
    if not floats:
        try:
            return orjson.dumps(body, option=_ORJSON_OPTIONS)
        except TypeError:  # beyond 64 bits, a lone surrogate, nested too deep
            pass
    return _CANONICAL.encode(body).encode("utf-8")


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                              allow_nan=False)
#: orjson hands datetimes, dataclasses and subclasses of str, int, dict and list to its
#: (absent) default, which refuses them: the standard library then writes or refuses them.
_ORJSON_OPTIONS = (orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_DATETIME
                   | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_SUBCLASS)


def json_text(value: Any) -> str:
    """JSON text of a validated JSON value for a jsonb column (PostgreSQL keeps the value, not
    the spelling): orjson's, or the standard library's for what orjson refuses (integers beyond
    64 bits). Never for a hash (that is :func:`canonical_json`); never given NaN (validation
    refuses it before)."""
    try:
        return orjson.dumps(value).decode("utf-8")
    except TypeError:
        return json.dumps(value)


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
    if kind == "string_pattern_mismatch" and err.get("ctx", {}).get("pattern") == ID_PATTERN:
        return f"expected {ID_RULE}, got {short(received)}"
    msg = err["msg"]
    if msg.startswith("Input should be "):
        msg = "expected " + msg[len("Input should be "):]
    elif msg.startswith("Value error, "):
        return msg[len("Value error, "):]
    else:
        msg = "expected: " + msg[0].lower() + msg[1:]
    return f"{msg}, got {short(received)}"


def _items_from(exc: ValidationError, prefix: tuple = (), limit: int = MAX_ERRORS) -> \
        list[ErrorItem]:
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
        if len(items) >= limit:
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


def _container_fields(model_cls) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(fields that may hold wire models, fields typed ``Any``) of a model class."""
    nested, free = [], []
    for name, info in model_cls.model_fields.items():
        if info.annotation is Any:
            free.append(name)
            continue
        todo, found = [info.annotation], False
        while todo and not found:
            t = todo.pop()
            found = isinstance(t, type) and issubclass(t, _Wire)
            todo.extend(get_args(t))
        if found:
            nested.append(name)
    return tuple(nested), tuple(free)


_CONTAINER_FIELDS: dict[type, tuple[tuple[str, ...], tuple[str, ...]]] = {}


def _nests_deeper(value: Any, limit: int) -> bool:
    """Whether ``value`` nests objects/arrays more than ``limit`` levels (iterative)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if type(node) is dict else node
        for child in children:
            if type(child) is dict or type(child) is list:
                stack.append((child, depth + 1))
    return False


def _too_deep_extra(model: Any, path: str) -> str | None:
    """The wire path of the first unknown field (or ``Any`` field) of ``model`` or of the wire
    models inside it whose value nests deeper than MAX_EXTRA_DEPTH, else None. Visits the wire
    models (a few per event), never the items of known lists of scalars."""
    for name, value in (model.__pydantic_extra__ or {}).items():
        if (type(value) is dict or type(value) is list) and \
                _nests_deeper(value, MAX_EXTRA_DEPTH):
            return f"{path}.{name}"
    cls = type(model)
    fields = _CONTAINER_FIELDS.get(cls)
    if fields is None:
        fields = _CONTAINER_FIELDS[cls] = _container_fields(cls)
    nested, free = fields
    for name in free:
        value = getattr(model, name)
        if (type(value) is dict or type(value) is list) and \
                _nests_deeper(value, MAX_EXTRA_DEPTH):
            return f"{path}.{name}"
    for name in nested:
        value = getattr(model, name)
        if value is None:
            continue
        if isinstance(value, list):
            for j, item in enumerate(value):
                if isinstance(item, BaseModel):
                    found = _too_deep_extra(item, f"{path}.{name}[{j}]")
                    if found:
                        return found
        elif isinstance(value, BaseModel):
            found = _too_deep_extra(value, f"{path}.{name}")
            if found:
                return found
    return None


def _flat(model: Any) -> bool:
    """Whether no unknown field of ``model`` (itself only) holds an object or an array."""
    for value in (model.__pydantic_extra__ or {}).values():
        if type(value) is dict or type(value) is list:
            return False
    return True


def _extras_flat(model: Any) -> bool:
    """True when ``model`` is an ``update_committed``, ``update_aggregate`` or ``heartbeat``
    none of whose wire models (the event, its rank parts, spans, cursors) holds an unknown field
    whose value is an object or an array: :func:`_too_deep_extra` would then find nothing
    (those models have no ``Any`` fields and no other wire models inside), and is skipped.
    False otherwise (the walk decides)."""
    kind = model.type
    if not _flat(model):
        return False
    if kind == "update_committed":
        parts = (model,)
    elif kind == "update_aggregate":
        parts = model.ranks
        for part in parts:
            if not _flat(part):
                return False
    elif kind == "heartbeat":
        return all(_flat(cursor) for cursor in model.fetched or ())
    else:
        return False
    for part in parts:
        for span in part.spans:
            if not _flat(span):
                return False
    return True


def _shared_uri(objects: list, default_shard: str, path: str) -> tuple[str, str] | None:
    """docs/ingest-v1.md#objects-and-shards: one URI belongs to one shard. The first object of
    ``objects`` whose URI an earlier object lists under another shard (or with another size,
    digest or component): (its wire path, message naming both), else None."""
    seen: dict[str, tuple[int, Any]] = {}
    for j, obj in enumerate(objects):
        first = seen.setdefault(obj.uri, (j, obj))
        if first[0] == j:
            continue
        k, other = first
        shard, other_shard = obj.shard or default_shard, other.shard or default_shard
        if shard != other_shard:
            return (f"{path}[{j}].uri", f"expected each object URI in one shard, got "
                    f"{short(obj.uri)} in shard {shard!r} and in shard {other_shard!r} "
                    f"({path}[{k}]): two shards writing one object overwrite each other")
        if (obj.size, (obj.sha256 or "").lower(), obj.component) != \
                (other.size, (other.sha256 or "").lower(), other.component):
            return (f"{path}[{j}].uri", f"expected one description per object URI, got "
                    f"{short(obj.uri)} twice in shard {shard!r} with different size, sha256 "
                    f"or component ({path}[{k}])")
    return None


def _event_checks(i: int, model: Any, body: dict, items: list[ErrorItem],
                  floats: bool = True) -> ValidEvent | None:
    """The checks beyond one model's fields for event ``i``: the manifest of revision 1, object
    URIs shared by shards, the depth of unknown fields, storable text; appends what fails to
    ``items`` and returns the ValidEvent otherwise."""
    manifest = None
    if model.type == "checkpoint_committed" and model.manifest.schema_revision == 1:
        try:
            manifest = ManifestV1Adapter.validate_python(body["manifest"])
        except ValidationError as exc:
            items.extend(_items_from(exc, ("events", i, "manifest"), MAX_ERRORS - len(items)))
            return None
        shared = _shared_uri(manifest.objects, "", f"events[{i}].manifest.objects")
    elif model.type == "shard_written":
        shared = _shared_uri(model.objects, model.shard, f"events[{i}].objects")
    else:
        shared = None
    if shared:
        items.append(ErrorItem(i, *shared))
        return None
    try:
        encoded = canonical_bytes(body, floats)
    except (ValueError, RecursionError):  # UnicodeEncodeError is a ValueError
        encoded = None
    # A value nested d levels holds d objects/arrays, each one "{" or "[" of the text (strings
    # may add more): an event with at most MAX_EXTRA_DEPTH of them cannot nest deeper, and the
    # walk over its wire models is skipped (the common per-rank event holds about 5), and so it
    # is for a hot event none of whose unknown fields holds one (an update_aggregate holds 5
    # per rank part).
    if encoded is None or (encoded.count(b"{") + encoded.count(b"[") > MAX_EXTRA_DEPTH
                        and (manifest is not None or not _extras_flat(model))):
        deep = _too_deep_extra(manifest if manifest is not None else model, f"events[{i}]")
        if deep is None and manifest is not None:
            deep = _too_deep_extra(model, f"events[{i}]")
        if deep:
            items.append(ErrorItem(i, deep, f"expected a value nested at most "
                                            f"{MAX_EXTRA_DEPTH} levels (objects and arrays), "
                                            "got one nested deeper"))
            return None
    try:
        if encoded is None:
            raise ValueError("not encodable")
        found = _find_unstorable(body, f"events[{i}]") if b"\\u0000" in encoded else None
    except (ValueError, UnicodeEncodeError):
        found = _find_unstorable(body, f"events[{i}]") or (
            f"events[{i}]", "expected JSON that can be stored, got numbers out of range")
    if found:
        items.append(ErrorItem(i, *found))
        return None
    return ValidEvent.of(i, model, body, encoded, manifest)


def validate_events(raw_events: Any, floats: bool = True) -> list[ValidEvent]:
    """Validate the ``events`` list of a request body (docs/ingest-v1.md, sections 2-4).

    Returns one :class:`ValidEvent` per event, in order. Raises
    :class:`~recoverydash.ingest.errors.BadRequest` listing at most 100 errors, each with the
    event's index and the wire path (``events[3].spans[0].ranges[1]``).

    Events are validated :data:`CHUNK` at a time (one pydantic call for a chunk of good
    events); a chunk that fails is validated again one event at a time to locate its errors.
    Work stops once 100 errors are known: the rest of the batch is not looked at.
    ``floats=False``: the events were read from JSON text holding no float (their canonical
    JSON is then orjson's: :func:`canonical_bytes`).
    """
    if not isinstance(raw_events, list):
        raise BadRequest("invalid batch", [ErrorItem(
            None, "events", f"expected a list of events, got {short(raw_events)}")])
    items: list[ErrorItem] = []
    out: list[ValidEvent] = []
    for start in range(0, len(raw_events), CHUNK):
        chunk = raw_events[start:start + CHUNK]
        try:
            models = EventsAdapter.validate_python(chunk)
        except ValidationError:
            models = []
            for i, body in enumerate(chunk, start):
                if len(items) >= MAX_ERRORS:
                    break
                try:
                    models.append(EventAdapter.validate_python(body))
                except ValidationError as exc:
                    items.extend(_items_from(exc, ("events", i), MAX_ERRORS - len(items)))
                    models.append(None)
        for i, (model, body) in enumerate(zip(models, chunk), start):
            if len(items) >= MAX_ERRORS:
                break
            if model is not None:
                valid = _event_checks(i, model, body, items, floats)
                if valid is not None:
                    out.append(valid)
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
