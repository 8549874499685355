"""The v1 HTTP API (django-ninja), mounted at ``/api/v1/``.

Views only parse the request, check access, call one action and answer; every refusal is an
:mod:`~recoverydash.ingest.errors` exception turned into JSON in one place.

- ``POST /events`` (scope ``ingest``): docs/ingest-v1.md, sections 1-4, see :func:`post_events`.
- ``GET /runs`` (scope ``read``): the project's runs, see :func:`list_runs`.
- ``GET /openapi.json`` and ``GET /docs`` (Swagger UI served from django-ninja's bundled static
  files through WhiteNoise: nothing is fetched from the internet).

Other issues add their endpoints to ``api`` with ``auth=read_auth`` (see
:mod:`recoverydash.ingest.auth`).
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import threading
import time
import zlib
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import Count, Max
from django.http import HttpRequest
from ninja import NinjaAPI, Query, Schema, Status
from ninja.openapi.docs import Swagger
from pydantic import Field

from recoverydash.runs.models import Run

from . import config_api, errors, read_api
from .actions import ingest_batch
from .auth import ingest_auth, read_auth
from .errors import BadRequest, ErrorItem, PayloadTooLarge, UnsupportedMediaType, short
from .hot import validate_hot
from .schemas import IngestBody, ManifestV1, ValidEvent, validate_events


class RecoveryDashAPI(NinjaAPI):
    """NinjaAPI whose OpenAPI document also describes the hand-parsed ingest body."""

    def get_openapi_schema(self, **kwargs: Any):
        schema = super().get_openapi_schema(**kwargs)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.update(_BODY_DEFS)
        components.setdefault("ErrorOut", ErrorOut.model_json_schema(
            ref_template="#/components/schemas/{model}"))
        components["ErrorOut"].pop("$defs", None)
        components.setdefault("ErrorItemOut", ErrorItemOut.model_json_schema())
        # Errors are made in one place (errors.py), so they are documented in one place too:
        # every operation may answer 400 (bad parameters), a secured one 401/403/429, one with
        # path parameters 404. Codes an operation documents itself are left as they are.
        ref = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}}
        for path, operations in schema.get("paths", {}).items():
            for operation in operations.values():
                if not isinstance(operation, dict) or "responses" not in operation:
                    continue
                codes = {400: "invalid request"}
                if operation.get("security"):
                    codes.update({401: "no, unknown or revoked token",
                                  403: "token without the scope", 429: "rate limit"})
                if "{" in path:
                    codes[404] = "not found in this project"
                if path.endswith("/restore-plan"):
                    codes[503] = "the run's events cannot be analysed (analysis_failed)"
                for code, text in codes.items():
                    operation["responses"].setdefault(code, {"description": text,
                                                             "content": ref})
        return schema


_body_schema = IngestBody.model_json_schema(ref_template="#/components/schemas/{model}")
# A checkpoint_committed carries a ManifestHead on the wire (any revision); revision 1 is checked
# field by field against ManifestV1, documented beside it.
_manifest_schema = ManifestV1.model_json_schema(ref_template="#/components/schemas/{model}")
_BODY_DEFS = {**_body_schema.pop("$defs", {}), **_manifest_schema.pop("$defs", {}),
              "IngestBody": _body_schema, "ManifestV1": _manifest_schema}

api = RecoveryDashAPI(
    title="recoverydash API", version="1", urls_namespace="api-v1",
    docs=Swagger(),
    description="Wire contract v1: trainers push events; on-call tools read runs and analyses. "
                "Auth: `Authorization: Bearer <token>` with scope `ingest` or `read`. "
                "Errors: `{\"error\": code, \"errors\": [{\"index\", \"path\", \"message\"}]}`. "
                "The contract in words, with every extension: "
                "[/docs/ingest-v1/](/docs/ingest-v1/) (docs/ingest-v1.md); what each number "
                "means: [/docs/definitions/](/docs/definitions/).")
errors.install(api)


# --- response shapes ----------------------------------------------------------------------------
class Accepted(Schema):
    accepted: int = Field(description="events stored by this request")
    duplicates: int = Field(description="events already stored (or repeated in the batch) "
                                        "with the same content: counted, not stored again")


class ErrorItemOut(Schema):
    index: int | None = Field(description="position of the event in the batch, or null")
    path: str = Field(description="wire path of the offending field, "
                                  "e.g. events[3].spans[0].ranges[1]")
    message: str = Field(description="what was expected and what came")


class ErrorOut(Schema):
    error: str = Field(description="machine code: invalid, unauthorized, forbidden, not_found, "
                                   "event_conflict, attempt_conflict, too_large, "
                                   "unsupported_media_type, rate_limited")
    errors: list[ErrorItemOut] = Field(description="at most 100")
    index: int | None = Field(None, description="409 only: the conflicting event's index")


ERROR_RESPONSES = {code: ErrorOut for code in (400, 401, 403, 409, 413, 415, 429)}


# --- POST /events -------------------------------------------------------------------------------
def _reject_constant(name: str) -> Any:
    raise ValueError(f"expected standard JSON numbers, got {name}")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"expected numbers a double can hold, got {text[:40]}")
    return value


def read_body(request: HttpRequest) -> bytes:
    """The decoded request body (docs/ingest-v1.md#1-transport): JSON content type only (415), gzip
    or identity content encoding (415 otherwise), at most ``RECOVERYDASH_MAX_BODY_BYTES`` once
    decoded (413; gzip is inflated in bounded steps, never further than the limit), gzip that does
    not inflate: 400."""
    limit = settings.RECOVERYDASH_MAX_BODY_BYTES
    media = request.META.get("CONTENT_TYPE", "").split(";")[0].strip().lower()
    if media != "application/json":
        raise UnsupportedMediaType(f"expected Content-Type application/json, got "
                                   f"{short(media or None)}")
    encoding = request.META.get("HTTP_CONTENT_ENCODING", "").strip().lower()
    if encoding not in ("", "identity", "gzip", "x-gzip"):
        raise UnsupportedMediaType(f"expected Content-Encoding gzip or none, got {short(encoding)}")
    gzipped = encoding in ("gzip", "x-gzip")
    # A compressed body is never much larger than what it inflates to.
    wire_limit = limit + 64 * 1024 if gzipped else limit
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > wire_limit:
        raise PayloadTooLarge(f"expected a body of at most {limit} bytes, got {declared}")
    raw = request.read(wire_limit + 1)
    if len(raw) > wire_limit:
        raise PayloadTooLarge(f"expected a body of at most {limit} bytes, got more")
    if not gzipped:
        return raw
    # Members one after another (RFC 1952 allows several), each inflated no further than the
    # room left under the limit.
    body, rest = b"", raw
    while True:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            body += inflater.decompress(rest, limit + 1 - len(body))
        except zlib.error as exc:
            raise BadRequest("bad gzip", [ErrorItem(None, "", f"expected a gzip body that "
                                                              f"inflates, got a broken stream "
                                                              f"({exc})")]) from exc
        if len(body) > limit or inflater.unconsumed_tail:
            raise PayloadTooLarge(f"expected a body of at most {limit} bytes once inflated, "
                                  "got more")
        if not inflater.eof:
            raise BadRequest("bad gzip", [ErrorItem(None, "", "expected a complete gzip stream, "
                                                              "got a truncated one")])
        rest = inflater.unused_data
        if not rest:
            break
    return body


def loads_body(body: bytes) -> tuple[Any, bool]:
    """``(document, floats)``: the JSON document of a request body (``json.loads``; NaN,
    infinities and numbers a double cannot hold refused with ValueError; RecursionError for
    nesting past the parser's reach), and whether its text held any number with a fraction or
    an exponent (the float hook was called): without one, the events' canonical JSON is
    orjson's (``schemas.canonical_bytes``)."""
    floats = []

    def finite_float(text: str) -> float:
        floats.append(True)
        return _finite_float(text)

    doc = json.loads(body, parse_constant=_reject_constant, parse_float=finite_float)
    return doc, bool(floats)


def parse_batch(request: HttpRequest) -> list[ValidEvent]:
    """Decode the body and validate ``{"events": [...]}``: 413 over the events limit, 400 for JSON
    that does not parse or events that break docs/ingest-v1.md, sections 2-4. A body of the hot
    types only goes through :func:`.hot.validate_hot` (the same answer for about half the CPU),
    any other, or one it does not take, through :func:`parse_events`."""
    body = read_body(request)
    hot = validate_hot(body, settings.RECOVERYDASH_MAX_EVENTS_PER_REQUEST)
    return hot if hot is not None else parse_events(body)


def parse_events(body: bytes) -> list[ValidEvent]:
    """The general path of :func:`parse_batch` for a decoded body: ``json`` (:func:`loads_body`)
    and the models of :mod:`.schemas` (:func:`~.schemas.validate_events`). Raises
    PayloadTooLarge (413) over ``RECOVERYDASH_MAX_EVENTS_PER_REQUEST`` events, BadRequest (400,
    located errors) for JSON that does not parse, a body that is not ``{"events": [...]}`` or
    events that break the contract."""
    try:
        doc, floats = loads_body(body)
    except RecursionError:
        raise BadRequest("JSON nested too deep", [ErrorItem(
            None, "", "expected JSON whose objects and arrays nest at most a few hundred levels "
                      "(an unknown field's value: 32), got a body nested deeper than the "
                      "server's parser follows")]) from None
    except ValueError as exc:
        raise BadRequest("bad JSON", [ErrorItem(
            None, "", f"expected a JSON object {{\"events\": [...]}}, got a body that is not "
                      f"JSON ({str(exc)[:200]})")]) from exc
    if not isinstance(doc, dict) or "events" not in doc:
        raise BadRequest("bad body", [ErrorItem(
            None, "events" if isinstance(doc, dict) else "",
            f"expected a JSON object with an events list, got {short(doc)}")])
    raw_events = doc["events"]
    limit = settings.RECOVERYDASH_MAX_EVENTS_PER_REQUEST
    if isinstance(raw_events, list) and len(raw_events) > limit:
        raise PayloadTooLarge(f"expected at most {limit} events per request, "
                              f"got {len(raw_events)}")
    return validate_events(raw_events, floats)


_gc_lock = threading.Lock()
_gc_holders = 0
_gc_was_enabled = False
_gc_paused_since = 0.0
#: Longest the collector stays paused (seconds) while requests keep overlapping (a threaded
#: gunicorn worker under steady load may never see zero holders): a thread leaving after it runs
#: one full collection and the bound starts again.
MAX_PAUSE_S = 5.0
_clock = time.monotonic


@contextlib.contextmanager
def no_cycle_collection():
    """Python's cyclic garbage collector paused while the block runs (re-enabled after the last
    of the threads inside leaves, if it was enabled when the first entered).

    An ingest request builds tens of thousands of containers that stay alive to its end (the
    decoded body: about 5 per rank part, the models, the rows), so the collector's passes,
    which scan every tracked object of the process (Django's included), find nothing to free
    and cost a quarter of parsing and validating (bench/ingest_one_run.py aggregate bodies:
    json.loads 4.3 us per rank part with the collector, 1.1 without). The caller frees what it
    built before the block ends (:func:`post_events`): the collector counts allocations less
    deallocations, so a request's objects still alive when it comes back would be scanned by
    the very next allocation's collection (about 2 ms per 1,000-event request). What a request
    leaves in cycles is collected at the next pass once the collector runs again; reference
    counting frees the rest. When requests overlap without a gap for longer than
    :data:`MAX_PAUSE_S` seconds, the thread that leaves then runs ``gc.collect()`` (if the
    collector was enabled), so cycles never pile up for longer than that."""
    global _gc_holders, _gc_was_enabled, _gc_paused_since
    with _gc_lock:
        if _gc_holders == 0:
            _gc_was_enabled = gc.isenabled()
            _gc_paused_since = _clock()
            gc.disable()
        _gc_holders += 1
    try:
        yield
    finally:
        collect = False
        with _gc_lock:
            _gc_holders -= 1
            if _gc_holders == 0 and _gc_was_enabled:
                gc.enable()
            elif _gc_holders and _gc_was_enabled and _clock() - _gc_paused_since > MAX_PAUSE_S:
                _gc_paused_since = _clock()
                collect = True
        if collect:
            gc.collect()


@api.post(
    "/events", auth=ingest_auth, response={202: Accepted, **ERROR_RESPONSES},
    summary="Push a batch of events",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/IngestBody"}}},
            "description": "Optionally gzip-compressed (Content-Encoding: gzip). At most 10,000 "
                           "events and 8 MiB decoded (settings). Unknown fields are kept.",
        },
    },
)
def post_events(request: HttpRequest):
    """Store a batch atomically: 202 ``{"accepted", "duplicates"}``; 400 invalid (located
    errors); 401/403 token; 409 an event_id stored with other content, or an attempt_started
    for an attempt that started with other values (names the index);
    413 too large; 415 not JSON or unknown encoding; 429 rate limit with ``Retry-After``."""
    with no_cycle_collection():
        events = parse_batch(request)
        result = ingest_batch(request.auth, events)
        del events  # freed inside the pause (no_cycle_collection)
    return Status(202, result.as_response())


# --- GET /runs ----------------------------------------------------------------------------------
class RunOut(Schema):
    run_id: str
    created_at: datetime
    first_event_at: datetime | None = Field(description="trainer clock")
    last_event_at: datetime | None = Field(description="trainer clock")
    last_received_at: datetime | None = Field(description="server clock")
    event_count: int
    attempts: int = Field(description="number of attempts (launches) seen")
    latest_attempt: int | None = Field(description="highest attempt number, null if none")
    health: str | None = Field(description="ok | at_risk | failing | ended from the stored "
                                              "analysis; null until the run is analysed")
    seconds_since_last_restorable: float | None = Field(
        description="now minus committed_at of the last restorable generation; null when "
                    "unknown")
    drill_id: str | None = Field(
        None, description="the failure drill this run belongs to (docs/ingest-v1.md#"
                          "drill_result); null for an ordinary run")


class RunsQuery(Schema):
    limit: int = Field(500, ge=1, le=5000, description="at most this many runs, newest first")


@api.get("/runs", auth=read_auth, response={200: list[RunOut]},
         summary="The project's runs")
def list_runs(request: HttpRequest, query: Query[RunsQuery]):
    """The token's project's runs, most recently heard from first."""
    runs = (Run.objects.filter(project_id=request.auth.project_id)
            .select_related("analysis")
            .annotate(n_attempts=Count("attempts"), max_attempt=Max("attempts__attempt"))
            .order_by("-last_received_at", "-pk")[: query.limit])
    out = []
    for run in runs:
        health, seconds = run.analysis_summary()
        out.append({"run_id": run.run_id, "created_at": run.created_at,
                    "first_event_at": run.first_event_at, "last_event_at": run.last_event_at,
                    "last_received_at": run.last_received_at, "event_count": run.event_count,
                    "attempts": run.n_attempts, "latest_attempt": run.max_attempt,
                    "health": health, "seconds_since_last_restorable": seconds,
                    "drill_id": run.drill_id or None})
    return Status(200, out)


# The read API (docs/ingest-v1.md#5-reading-the-analysis: recovery, restore-plan), beside the
# token checks it uses.
api.add_router("/runs", read_api.router)
# The admin API (docs/ingest-v1.md#8-the-admin-api): webhooks, locations, contracts, alerts.
api.add_router("/", config_api.router)
