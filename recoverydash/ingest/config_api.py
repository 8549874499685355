"""The admin API (docs/ingest-v1.md#8-the-admin-api): a project's webhook endpoints, storage
locations, run contracts and alerts, managed by a script or kept in git (``manage.py
apply_config``). Every path needs a token of scope ``admin``; a token reaches only its own
project (another project's run, endpoint, location or alert is a 404).

- ``GET /api/v1/webhooks``, ``POST /api/v1/webhooks`` (create, or set the fields given of the
  endpoint with that ``name``), ``GET`` / ``DELETE /api/v1/webhooks/{name}``;
- ``GET /api/v1/locations``, ``POST /api/v1/locations`` (create, or set the fields given of the
  location with that ``url``), ``DELETE /api/v1/locations/{id}``;
- ``GET`` / ``PUT /api/v1/runs/{run_id}/contract``;
- ``POST /api/v1/runs/{run_id}/pause`` and ``.../resume`` (``{"note": "..."}``): a run's
  monitoring (``recoverydash.runs.monitoring``);
- ``GET /api/v1/alerts``, ``POST /api/v1/alerts/{id}/acknowledge``, ``.../resolve``,
  ``.../silence`` (``{"seconds": N}``, 0 lifts it).

A write answers ``{"change": {...}}`` (``recoverydash.ingest.config.Change``) beside the item as
stored: 201 when created, 200 otherwise. Refusals are 400s in the shape of
docs/ingest-v1.md#errors, each naming the field.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from django.http import HttpRequest
from ninja import Query, Router, Schema, Status
from pydantic import Field

from recoverydash.alerts import actions
from recoverydash.alerts.models import SEVERITIES, Alert, WebhookEndpoint
from recoverydash.recovery.contract import effective_contract
from recoverydash.runs.models import SCOPE_ADMIN
from recoverydash.storage.models import StorageLocation

from . import config
from .auth import TokenAuth, run_for
from .errors import BadRequest, ErrorItem, Forbidden, NotFound

admin_auth = TokenAuth(SCOPE_ADMIN)
router = Router(tags=["admin"], auth=admin_auth)


def _refused(exc: config.ConfigError) -> BadRequest | Forbidden:
    """The 400 of a refused item, or the 403 of one the token may not change
    (``config.NotPermitted``), each error naming its field."""
    items = [ErrorItem(None, path, message)
             for path, messages in exc.errors.items() for message in messages]
    if isinstance(exc, config.NotPermitted):
        return Forbidden("not permitted", items)
    return BadRequest("invalid configuration", items)


def _by(request: HttpRequest) -> str:
    token = request.auth
    return f"token {token.name}" if token.name else f"token #{token.pk}"


class ChangeOut(Schema):
    kind: str
    key: str
    action: Literal["create", "update", "unchanged", "delete"]
    fields: list[str]
    warning: str


# --- webhooks -------------------------------------------------------------------------------------
class WebhookIn(Schema):
    name: str = Field(description="the endpoint's key in its project")
    kind: str | None = Field(None, description=", ".join(k for k, _ in WebhookEndpoint.KINDS))
    url: str | None = None
    routing_key: str | None = Field(None, description="PagerDuty routing key / Opsgenie API "
                                                         "key (write-only)")
    min_severity: Literal[SEVERITIES] | None = None  # type: ignore[valid-type]
    enabled: bool | None = None
    secret: str | None = Field(None, description="Standard Webhooks signing secret "
                                                    "(whsec_...; write-only; generated when a "
                                                    "new endpoint names none)")


class WebhookOut(Schema):
    name: str
    kind: str
    url: str
    routing_key_set: bool
    min_severity: str
    enabled: bool
    disabled_reason: str
    last_error: str
    created_at: datetime


class WebhookChangeOut(Schema):
    change: ChangeOut
    webhook: WebhookOut


@router.get("/webhooks", response={200: list[WebhookOut]}, summary="The project's webhook "
                                                                   "endpoints")
def list_webhooks(request: HttpRequest):
    rows = WebhookEndpoint.objects.filter(project_id=request.auth.project_id).order_by("name",
                                                                                       "pk")
    return Status(200, [config.webhook_out(e) for e in rows])


@router.post("/webhooks", response={200: WebhookChangeOut, 201: WebhookChangeOut},
             summary="Create a webhook endpoint, or change the one with that name")
def put_webhook(request: HttpRequest, body: WebhookIn):
    """Fields left out keep their value (or the default for a new endpoint); the URL passes
    the delivery guard and the key its receiver's check, as in the dashboard."""
    project = request.auth.project
    try:
        change = config.apply_webhook(project, body.model_dump(exclude_none=True))
    except config.ConfigError as exc:
        raise _refused(exc) from None
    endpoint = WebhookEndpoint.objects.get(project=project, name=change.key)
    return Status(201 if change.action == "create" else 200,
                  {"change": change.as_dict(), "webhook": config.webhook_out(endpoint)})


def _endpoint(request: HttpRequest, name: str) -> WebhookEndpoint:
    endpoint = WebhookEndpoint.objects.filter(project_id=request.auth.project_id,
                                              name=name).first()
    if endpoint is None:
        raise NotFound(f"expected the name of a webhook endpoint of this project, got {name!r}")
    return endpoint


# ``path``: a name is one segment since names are checked (``alerts.forms.WEBHOOK_NAME``); one
# stored before that may hold ``/`` or be ``..``, and its percent-encoded form still reaches it.
@router.get("/webhooks/{path:name}", response={200: WebhookOut}, summary="One webhook endpoint")
def get_webhook(request: HttpRequest, name: str):
    return Status(200, config.webhook_out(_endpoint(request, name)))


@router.delete("/webhooks/{path:name}", response={200: ChangeOut}, summary="Delete a webhook "
                                                                      "endpoint")
def remove_webhook(request: HttpRequest, name: str):
    _endpoint(request, name)
    return Status(200, config.delete_webhook(request.auth.project, name).as_dict())


# --- storage locations ----------------------------------------------------------------------------
class LocationIn(Schema):
    url: str = Field(description="file:///absolute/folder or s3://bucket/prefix as the server "
                                 "sees it; the location's key")
    trainer_url: str | None = Field(None, description="the same prefix as the trainers name "
                                                         "it, when it differs")
    kind: Literal["manifests", "adopt"] | None = None
    format: str | None = None
    run_id: str | None = None
    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = Field(None, description="write-only")
    role_arn: str | None = None
    external_id: str | None = None
    use_ambient_credentials: bool | None = None
    enabled: bool | None = None
    discover: bool | None = None


class LocationOut(Schema):
    id: int
    url: str
    trainer_url: str
    kind: str
    format: str
    run_id: str
    endpoint_url: str
    region: str
    access_key_id: str
    secret_access_key_set: bool
    role_arn: str
    external_id: str
    use_ambient_credentials: bool
    enabled: bool
    discover: bool
    origin: str
    last_listed_at: datetime | None
    last_error: str


class LocationChangeOut(Schema):
    change: ChangeOut
    location: LocationOut


@router.get("/locations", response={200: list[LocationOut]},
            summary="The project's storage locations")
def list_locations(request: HttpRequest):
    rows = StorageLocation.objects.filter(project_id=request.auth.project_id).order_by("url")
    return Status(200, [config.location_out(loc) for loc in rows])


@router.post("/locations", response={200: LocationChangeOut, 201: LocationChangeOut},
             summary="Declare a storage location, or change the one with that URL")
def put_location(request: HttpRequest, body: LocationIn):
    """The server reads a manifest's objects only under its project's locations, with each
    location's own credentials (docs/ingest-v1.md#7-checkpoints-in-storage). A token may do
    what a member may on the dashboard (``permissions``): it declares no server folder,
    ambient credentials or custom endpoint (400 naming the field) and changes nothing of an
    operator's location (403): any member can issue an admin token."""
    project = request.auth.project
    try:
        change = config.apply_location(project, body.model_dump(exclude_none=True),
                                       origin="api", operator=False)
    except config.ConfigError as exc:
        raise _refused(exc) from None
    location = StorageLocation.objects.get(project=project, url=change.key)
    return Status(201 if change.action == "create" else 200,
                  {"change": change.as_dict(), "location": config.location_out(location)})


@router.delete("/locations/{location_id}", response={200: ChangeOut},
               summary="Delete a storage location")
def remove_location(request: HttpRequest, location_id: int):
    location = StorageLocation.objects.filter(project_id=request.auth.project_id,
                                              pk=location_id).first()
    if location is None:
        raise NotFound(f"expected the id of a storage location of this project, "
                       f"got {location_id}")
    try:
        change = config.delete_location(request.auth.project, location.url, operator=False)
    except config.ConfigError as exc:
        raise _refused(exc) from None
    return Status(200, change.as_dict())


# --- run contracts --------------------------------------------------------------------------------
class ContractIn(Schema):
    max_replay_samples: int | None = Field(None, ge=0)
    max_omission_samples: int | None = Field(None, ge=0)
    required_components: list[str] | None = None
    max_checkpoint_age_s: float | None = Field(None, ge=0)


class ContractOut(Schema):
    run_id: str
    stored: dict = Field(description="the contract stored for the run (the latest "
                                     "attempt_started's or an edit since)")
    effective: dict = Field(description="with the defaults of fields left out")


class ContractChangeOut(Schema):
    change: ChangeOut
    contract: ContractOut


def _contract_out(run) -> dict:
    return {"run_id": run.run_id, "stored": run.contract or {},
            "effective": effective_contract(run.contract)}


@router.get("/runs/{run_id}/contract", response={200: ContractOut},
            summary="A run's recovery contract")
def get_contract(request: HttpRequest, run_id: str):
    return Status(200, _contract_out(run_for(request.auth, run_id)))


@router.put("/runs/{run_id}/contract", response={200: ContractChangeOut},
            summary="Set fields of a run's recovery contract")
def put_contract(request: HttpRequest, run_id: str, body: ContractIn):
    """The fields given replace the run's; a later ``attempt_started`` that declares a contract
    replaces it again."""
    run = run_for(request.auth, run_id)
    try:
        change = config.apply_contract(run, body.model_dump(exclude_none=True))
    except config.ConfigError as exc:
        raise _refused(exc) from None
    return Status(200, {"change": change.as_dict(), "contract": _contract_out(run)})


# --- monitoring pause -----------------------------------------------------------------------------
class PauseIn(Schema):
    note: str = Field("", max_length=2000, description="why (kept in the change log)")


class PauseOut(Schema):
    changed: bool = Field(description="false when the run was already paused (or not paused)")
    run_id: str
    paused: bool
    paused_at: datetime | None
    paused_by: str


def _pause_out(run, changed: bool) -> dict:
    return {"changed": changed, "run_id": run.run_id, "paused": run.is_paused,
            "paused_at": run.paused_at if run.is_paused else None,
            "paused_by": run.paused_by if run.is_paused else ""}


@router.post("/runs/{run_id}/pause", response={200: PauseOut},
             summary="Pause a run's monitoring until its next event")
def pause_run(request: HttpRequest, run_id: str, body: PauseIn):
    """No alert of the run opens, changes or pages while paused; the first event received
    after the pause resumes it (``recoverydash.runs.monitoring``). Audited."""
    from recoverydash.runs import monitoring

    run = run_for(request.auth, run_id)
    return Status(200, _pause_out(run, monitoring.pause(run, _by(request), body.note)))


@router.post("/runs/{run_id}/resume", response={200: PauseOut},
             summary="Resume a run's paused monitoring")
def resume_run(request: HttpRequest, run_id: str, body: PauseIn):
    from recoverydash.runs import monitoring

    run = run_for(request.auth, run_id)
    return Status(200, _pause_out(run, monitoring.resume(run, _by(request), body.note)))


# --- alerts ---------------------------------------------------------------------------------------
class AlertOut(Schema):
    id: int
    run_id: str
    rule: str
    subject: str
    severity: str
    state: str
    summary: str
    opened_at: datetime
    acknowledged_at: datetime | None
    acknowledged_by: str
    resolved_at: datetime | None
    resolved_by: str
    silenced_until: datetime | None


class AlertsQuery(Schema):
    state: Literal["open", "firing", "acknowledged", "resolved", "all"] = Field(
        "open", description="open = firing or acknowledged")
    run_id: str | None = None
    limit: int = Field(500, ge=1, le=5000)


class SilenceIn(Schema):
    seconds: int = Field(ge=0, le=actions.MAX_SILENCE_S,
                         description="mute notifications this long from now; 0 lifts it")


class AlertActionOut(Schema):
    changed: bool = Field(description="false when the alert was already in that state")
    alert: AlertOut


def _alert_out(alert: Alert) -> dict:
    out = {k: getattr(alert, k) for k in AlertOut.model_fields if k not in ("id", "run_id")}
    return {**out, "id": alert.pk, "run_id": alert.run.run_id}


@router.get("/alerts", response={200: list[AlertOut]}, summary="The project's alerts")
def list_alerts(request: HttpRequest, query: Query[AlertsQuery]):
    rows = Alert.objects.filter(run__project_id=request.auth.project_id).select_related("run")
    if query.state == "open":
        rows = rows.filter(state__in=("firing", "acknowledged"))
    elif query.state != "all":
        rows = rows.filter(state=query.state)
    if query.run_id is not None:
        rows = rows.filter(run__run_id=query.run_id)
    return Status(200, [_alert_out(a) for a in rows.order_by("-opened_at", "-pk")[:query.limit]])


def _alert(request: HttpRequest, alert_id: int) -> Alert:
    alert = (Alert.objects.filter(run__project_id=request.auth.project_id, pk=alert_id)
             .select_related("run").first())
    if alert is None:
        raise NotFound(f"expected the id of an alert of this project, got {alert_id}")
    return alert


def _change_state(request: HttpRequest, alert_id: int, change) -> Status:
    """Apply ``change`` (``actions.acknowledge`` or ``actions.resolve``) as the token."""
    alert = _alert(request, alert_id)
    flip = change(alert, _by(request))
    return Status(200, {"changed": flip is not None, "alert": _alert_out(alert)})


@router.post("/alerts/{alert_id}/acknowledge", response={200: AlertActionOut},
             summary="Acknowledge an alert")
def acknowledge_alert(request: HttpRequest, alert_id: int):
    return _change_state(request, alert_id, actions.acknowledge)


@router.post("/alerts/{alert_id}/resolve", response={200: AlertActionOut},
             summary="Resolve an alert")
def resolve_alert(request: HttpRequest, alert_id: int):
    return _change_state(request, alert_id, actions.resolve)


@router.post("/alerts/{alert_id}/silence", response={200: AlertActionOut},
             summary="Silence an alert's notifications")
def silence_alert(request: HttpRequest, alert_id: int, body: SilenceIn):
    alert = _alert(request, alert_id)
    before = alert.silenced_until
    actions.silence(alert, _by(request), body.seconds)
    return Status(200, {"changed": before != alert.silenced_until, "alert": _alert_out(alert)})


__all__ = ["admin_auth", "router"]
