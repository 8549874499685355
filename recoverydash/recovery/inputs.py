"""Input dataclasses of the recovery core, close to the wire contract (docs/ingest-v1.md,
section 4).

Times inside the core are float POSIX seconds (UTC). Spans and cursors stay wire dicts
(``{"stratum", "epoch", "ranges" | "ids", "order"?, "padding"?}`` and
``{"stratum", "epoch", "position"}``) so that a database row maps onto a record without translation.
``RunInput.from_events`` builds every record from a list of wire events, which is what the tests
and the scenarios use; the server maps its typed tables onto the same dataclasses.
"""
from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import overload

from .contract import DEFAULT_CONTRACT, effective_contract

__all__ = ["DEFAULT_CONTRACT", "AttemptRecord", "GenerationRecord", "HeartbeatRecord",
           "LedgerRecord", "RestoreRecord", "RunInput", "ShardRecord", "format_time",
           "parse_time"]


@overload
def parse_time(value: None) -> None: ...
@overload
def parse_time(value: str | float | int | _dt.datetime) -> float: ...
@overload
def parse_time(value: str | float | int | _dt.datetime | None) -> float | None: ...
def parse_time(value: str | float | int | _dt.datetime | None) -> float | None:
    """RFC 3339 timestamp (``2026-11-01T00:00:05Z`` or with an offset) -> POSIX seconds (UTC).

    Numbers pass through as floats, None stays None, an aware datetime gives its timestamp.
    Raises ValueError on a string that is not RFC 3339 or that carries no offset, and on a naive
    datetime (a naive time has no defined instant).
    """
    if value is None or isinstance(value, (int, float)):
        return None if value is None else float(value)
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            raise ValueError(f"datetime without offset: {value!r}")
        return value.timestamp()
    moment = _dt.datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    if moment.tzinfo is None:
        raise ValueError(f"timestamp without offset: {value!r}")
    return moment.timestamp()


@overload
def format_time(seconds: None) -> None: ...
@overload
def format_time(seconds: float) -> str: ...
@overload
def format_time(seconds: float | None) -> str | None: ...
def format_time(seconds: float | None) -> str | None:
    """POSIX seconds -> RFC 3339 string with offset, UTC (``2026-11-01T00:21:01+00:00``)."""
    if seconds is None:
        return None
    return _dt.datetime.fromtimestamp(seconds, tz=_dt.UTC).isoformat()


@dataclass
class AttemptRecord:
    """One launch of the run (`attempt_started`, closed by `attempt_ended`).

    ``resumed_from`` is the wire object ``{"generation_id": str|None, "update": int,
    "cursor": [Cursor]}`` or None for a fresh start at update 0. ``end_fetched`` is the read
    cursor list of `attempt_ended`. ``last_event_at`` is the time of the newest event of this
    attempt (any type); it stands in for the failure time when no `attempt_ended` arrived.
    """

    attempt: int
    started_at: float | None = None
    world_size: int | None = None
    dataset_version: str | None = None
    global_batch_size: int | None = None
    micro_batch_size: int | None = None
    grad_accum_steps: int | None = None
    config_digest: str | None = None
    sampler: dict = field(default_factory=dict)
    resumed_from: dict | None = None
    contract: dict | None = None
    ended_at: float | None = None
    end_reason: str | None = None
    end_update: int | None = None
    end_fetched: list = field(default_factory=list)
    last_event_at: float | None = None

    def global_batch(self) -> int | None:
        """Samples per optimizer update: ``global_batch_size``, else micro x accum x world size."""
        if self.global_batch_size:
            return self.global_batch_size
        if self.micro_batch_size and self.grad_accum_steps and self.world_size:
            return self.micro_batch_size * self.grad_accum_steps * self.world_size
        return None

    def failure_time(self) -> float | None:
        """docs/definitions.md#lost-seconds: the failure time is `attempt_ended` time, else the last
        event."""
        return self.ended_at if self.ended_at is not None else self.last_event_at


@dataclass
class LedgerRecord:
    """One `update_committed` report: ``spans`` are wire span dicts; ``rank`` None is a
    coordinator's global view and counts as one data-parallel reporter of its own."""

    attempt: int
    update: int
    rank: int | None
    time: float
    spans: list


@dataclass
class HeartbeatRecord:
    """One `heartbeat`: ``fetched`` is the read cursor list (everything below was read)."""

    attempt: int
    rank: int | None
    time: float
    update: int
    fetched: list = field(default_factory=list)


@dataclass
class ShardRecord:
    """One `shard_written`: the update this shard's state belongs to, and its wire objects."""

    update: int | None
    objects: list = field(default_factory=list)
    time: float | None = None


@dataclass
class GenerationRecord:
    """Everything known about one checkpoint generation.

    ``update``/``started_at``/``required_shards``/``components`` come from `checkpoint_started`
    (None/empty when it never arrived, e.g. a manifest found in storage). ``shards`` maps a shard
    name to its `shard_written`. ``manifests`` lists the committed manifests received (distinct
    documents; two or more different ones is a ``manifest_conflict``); ``committed_at`` is the
    receive-side commit time used when the manifest carries none. ``object_checks`` maps an object
    uri to the storage verifier's result: ``ok``, ``object_missing``, ``size_mismatch``,
    ``digest_mismatch``, ``storage_unverified`` or ``object_outside_locations`` (under none of
    the project's storage locations: never read, and rejects the generation like a missing
    object); a uri absent from the map is not checked yet,
    which keeps the generation ``committed``.
    """

    generation_id: str
    attempt: int
    update: int | None = None
    started_at: float | None = None
    required_shards: list = field(default_factory=list)
    components: list = field(default_factory=list)
    shards: dict = field(default_factory=dict)
    manifests: list = field(default_factory=list)
    committed_at: float | None = None
    object_checks: dict = field(default_factory=dict)

    def manifest(self) -> dict | None:
        """The committed manifest the generation is judged by, or None: the first one, except
        that a trainer's own manifest wins over one a format adapter built from the folder
        (``adopted``, docs/formats.md#adopted-folders-on-the-server): the trainer's record says
        what was written, the adapter's only what a listing could see."""
        own = [m for m in self.manifests if not is_adopted(m)]
        if own:
            return own[0]
        return self.manifests[0] if self.manifests else None

    def conflicting(self) -> int:
        """How many different committed manifests disagree about this generation (2 or more is
        a ``manifest_conflict``): the trainer's own ones when there are any, else the adopted
        ones. An adopted manifest beside one trainer's manifest is no conflict, nor are two that
        differ only in a volatile field (``committed_at``,
        docs/definitions.md#volatile-manifest-fields)."""
        own = [m for m in self.manifests if not is_adopted(m)]
        found = own or self.manifests
        if len(found) < 2:
            return len(found)
        distinct: list = []  # docs/definitions.md#volatile-manifest-fields: committed_at aside
        for m in found:
            if not any(same_manifest(m, d) for d in distinct):
                distinct.append(m)
        return len(distinct)

    def manifest_head(self) -> dict | None:
        """The judged manifest (:meth:`manifest`) for reading its scalar keys (``update``,
        ``attempt``, ``world_size``, ``dataset_version``, ``committed_at``, ``config_digest``,
        ``schema_revision``, ``data_progress``, ``adopted``) only: a caller holding a summary
        of the record (the worker's stored inputs) may answer it without the ``objects``,
        ``required_shards`` and ``components`` lists. None when no manifest is in."""
        return self.manifest()

    def has_shards(self) -> bool:
        """Whether any ``shard_written`` was reported for the generation."""
        return bool(self.shards)

    def state_update(self) -> int | None:
        """The update the generation's state represents: the manifest's, else the started one."""
        manifest = self.manifest_head()
        if manifest is not None and isinstance(manifest.get("update"), int):
            return manifest["update"]
        return self.update

    def commit_time(self) -> float | None:
        """``committed_at`` of the manifest, else the time its commit event arrived."""
        manifest = self.manifest_head()
        if manifest is not None and manifest.get("committed_at") is not None:
            try:
                return parse_time(manifest["committed_at"])
            except (TypeError, ValueError):
                pass
        return self.committed_at


#: Manifest fields that a publication of the same state may change
#: (docs/definitions.md#volatile-manifest-fields): a manifest published again after a timeout
#: carries a new ``committed_at``.
VOLATILE_MANIFEST_FIELDS = ("committed_at",)


def manifest_identity(manifest):
    """What identifies a manifest (docs/definitions.md#volatile-manifest-fields): the manifest
    without its :data:`VOLATILE_MANIFEST_FIELDS` (a new dict; the manifest is not changed).
    Anything that is not a dict is its own identity."""
    if not isinstance(manifest, dict):
        return manifest
    return {k: v for k, v in manifest.items() if k not in VOLATILE_MANIFEST_FIELDS}


def same_manifest(a, b) -> bool:
    """Whether two manifests (decoded JSON) are the same manifest: equal but for their
    :data:`VOLATILE_MANIFEST_FIELDS` (docs/definitions.md#volatile-manifest-fields). Two that
    differ anywhere else (an object, the update, the cursor) are a ``manifest_conflict``."""
    return bool(manifest_identity(a) == manifest_identity(b))


def is_adopted(manifest) -> bool:
    """True for a manifest a format adapter built from another tool's checkpoint folder (its
    ``adopted`` extension, docs/formats.md#adopted-folders-on-the-server)."""
    return isinstance(manifest, dict) and isinstance(manifest.get("adopted"), dict)


@dataclass
class RestoreRecord:
    """One `restore_completed`: ``seconds`` the load took."""

    attempt: int
    generation_id: str | None
    seconds: float
    time: float


@dataclass
class RunInput:
    """All inputs of one run. ``contract`` overrides the attempts' contracts when given; otherwise
    the contract of the newest attempt that declares one wins over DEFAULT_CONTRACT.
    ``first_event_at`` is the time of the run's first event (defaults to the earliest time seen)."""

    run_id: str = ""
    attempts: list = field(default_factory=list)
    ledger: list = field(default_factory=list)
    heartbeats: list = field(default_factory=list)
    generations: list = field(default_factory=list)
    restores: list = field(default_factory=list)
    contract: dict | None = None
    first_event_at: float | None = None

    def effective_contract(self) -> dict:
        """DEFAULT_CONTRACT updated by the newest attempt's contract, then by ``contract``
        (:func:`.contract.effective_contract`)."""
        declared = [a for a in sorted(self.attempts, key=lambda a: a.attempt) if a.contract]
        return effective_contract(declared[-1].contract if declared else None, self.contract)

    @classmethod
    def from_events(cls, events: Iterable[dict], object_checks: dict | None = None,
                    run_id: str | None = None) -> RunInput:
        """Build a RunInput from wire events (docs/ingest-v1.md#4-event-types), in any order.

        ``object_checks`` ({uri: status}) is attached to every generation whose objects it names.
        Events of unknown types are ignored. Raises KeyError/ValueError on an event lacking a
        required field (the ingest API validates before this is called).
        """
        run = cls(run_id=run_id or "")
        attempts: dict[int, AttemptRecord] = {}
        generations: dict[str, GenerationRecord] = {}
        times: list[float] = []
        checks = object_checks or {}

        def attempt_of(number: int) -> AttemptRecord:
            if number not in attempts:
                attempts[number] = AttemptRecord(attempt=number)
            return attempts[number]

        def generation_of(gid: str, number: int) -> GenerationRecord:
            if gid not in generations:
                generations[gid] = GenerationRecord(generation_id=gid, attempt=number)
            return generations[gid]

        for event in events:
            kind = event["type"]
            number = int(event["attempt"])
            when = parse_time(event["time"])
            times.append(when)
            if not run.run_id:
                run.run_id = event.get("run_id", "")
            record = attempt_of(number)
            if record.last_event_at is None or when > record.last_event_at:
                record.last_event_at = when
            if kind in GENERATION_EVENTS:
                _apply_generation_event(kind, event, number, when, generation_of)
            else:
                _apply_attempt_event(run, record, kind, event, number, when)
        for gen in generations.values():
            uris = {o.get("uri") for m in gen.manifests for o in m.get("objects") or []}
            gen.object_checks = {uri: checks[uri] for uri in uris if uri in checks}
        run.attempts = sorted(attempts.values(), key=lambda a: a.attempt)
        run.generations = list(generations.values())
        run.first_event_at = min(times) if times else None
        return run


#: The event types :func:`_apply_generation_event` applies (the others are an attempt's).
GENERATION_EVENTS = ("checkpoint_started", "shard_written", "checkpoint_committed")


def _apply_attempt_event(run: RunInput, record: AttemptRecord, kind: str, event: dict,
                         number: int, when: float) -> None:
    """:meth:`RunInput.from_events` of one event of attempt ``number`` (its ``record``) that
    is not a generation's, at ``when`` (POSIX seconds); an unknown type is ignored."""
    if kind == "attempt_started":
        record.started_at = when
        for name in ("world_size", "dataset_version", "global_batch_size",
                     "micro_batch_size", "grad_accum_steps", "config_digest"):
            setattr(record, name, event.get(name))
        record.sampler = dict(event.get("sampler") or {})
        record.resumed_from = event.get("resumed_from")
        record.contract = event.get("contract")
    elif kind == "update_committed":
        run.ledger.append(LedgerRecord(number, int(event["update"]), event.get("rank"),
                                       when, list(event.get("spans") or [])))
    elif kind == "heartbeat":
        run.heartbeats.append(HeartbeatRecord(number, event.get("rank"), when,
                                              int(event["update"]),
                                              list(event.get("fetched") or [])))
    elif kind == "restore_completed":
        run.restores.append(RestoreRecord(number, event.get("generation_id"),
                                          float(event.get("seconds") or 0.0), when))
    elif kind == "attempt_ended":
        record.ended_at = when
        record.end_reason = event.get("reason")
        record.end_update = event.get("update")
        record.end_fetched = list(event.get("fetched") or [])


def _apply_generation_event(kind: str, event: dict, number: int, when: float,
                            generation_of) -> None:
    """:meth:`RunInput.from_events` of one event of :data:`GENERATION_EVENTS` sent by attempt
    ``number`` at ``when``; ``generation_of(generation_id, attempt)`` gives the record."""
    if kind == "checkpoint_started":
        gen = generation_of(event["generation_id"], number)
        gen.attempt = number
        gen.update = event.get("update")
        gen.started_at = when
        gen.required_shards = list(event.get("required_shards") or [])
        gen.components = list(event.get("components") or [])
    elif kind == "shard_written":
        gen = generation_of(event["generation_id"], number)
        gen.shards[event["shard"]] = ShardRecord(event.get("update"),
                                                 list(event.get("objects") or []), when)
    elif kind == "checkpoint_committed":
        manifest = event["manifest"]
        gen = generation_of(manifest["generation_id"], number)
        if manifest not in gen.manifests:
            gen.manifests.append(manifest)
        if gen.committed_at is None or when < gen.committed_at:
            gen.committed_at = when
