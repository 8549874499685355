"""A project's configuration as data: webhook endpoints, storage locations and run contracts,
read and changed by the admin API (``recoverydash.ingest.config_api``, scope ``admin``) and by
``manage.py apply_config FILE`` (a YAML file kept in git). Both go through these functions, which
apply the same checks as the dashboard's forms (``alerts.forms.clean_endpoint``,
``storage.locations.clean_location``, the wire contract's ``Contract`` schema) and change
nothing when a value is already what was asked: applying the same configuration twice reports
every item ``unchanged`` the second time.

Each item has a natural key: a webhook endpoint its ``name`` (unique in its project), a storage
location its ``url`` (as the server sees it, in canonical form), a contract its run's
``run_id``. ``apply_*`` creates the item when the key is new and otherwise sets only the fields
given (a field left out keeps its value). Secrets (an endpoint's signing ``secret``, a location's
``secret_access_key``) are write-only: they are compared and stored, never returned; a change
names the field, never the value.

Errors: :class:`ConfigError` with ``{field: [messages]}``, each message saying what was expected
and what came. Nothing is written when an item is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from pydantic import ValidationError as PydanticValidationError

from recoverydash.alerts.forms import clean_endpoint
from recoverydash.alerts.models import WebhookEndpoint
from recoverydash.runs.contracts import CONTRACT_FIELDS, save_contract
from recoverydash.runs.models import Project, Run
from recoverydash.storage.locations import clean_location
from recoverydash.storage.models import StorageLocation

from .permissions import OPERATOR_ONLY, location_delete_refusal, location_refusals
from .schemas import Contract

#: Fields of an endpoint that a configuration sets (``secret`` write-only).
WEBHOOK_FIELDS = ("name", "kind", "url", "routing_key", "min_severity", "enabled", "secret")
#: Fields of a storage location that a configuration sets (``secret_access_key`` write-only).
LOCATION_FIELDS = ("url", "trainer_url", "kind", "format", "run_id", "endpoint_url", "region",
                   "access_key_id", "secret_access_key", "role_arn", "external_id",
                   "use_ambient_credentials", "enabled", "discover")
SECRET_FIELDS = {"secret", "secret_access_key"}
_BOOL_FIELDS = {"enabled", "use_ambient_credentials", "discover"}


class ConfigError(ValueError):
    """An item refused: ``errors`` maps a field (``""`` for the item as a whole) to messages."""

    def __init__(self, errors: dict[str, list[str]]):
        self.errors = errors
        super().__init__("; ".join(f"{k or 'item'}: {' '.join(v)}" for k, v in errors.items()))


class NotPermitted(ConfigError):
    """An item refused as a whole because the actor may not change it
    (``recoverydash.ingest.permissions``: an operator's storage location), not because a value
    is malformed: the admin API answers 403."""


@dataclass
class Change:
    """What applying one item did (or, in a dry run, would do). ``action``: ``create``,
    ``update``, ``unchanged`` or ``delete``; ``fields``: the names of the fields that change
    (secrets by name only); ``warning``: a note that did not refuse the item (a webhook host
    that does not resolve now)."""

    kind: str  # "webhook" | "location" | "contract"
    key: str
    action: str
    fields: list[str] = field(default_factory=list)
    warning: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "key": self.key, "action": self.action,
                "fields": list(self.fields), "warning": self.warning}

    def line(self) -> str:
        """One line for a person: ``update webhook 'oncall': url, min_severity``."""
        text = f"{self.action} {self.kind} {self.key!r}"
        if self.fields and self.action == "update":
            text += ": " + ", ".join(self.fields)
        if self.warning:
            text += f" (warning: {self.warning})"
        return text


def _unknown(data: dict, allowed: tuple[str, ...]) -> dict[str, list[str]]:
    return {k: [f"expected one of {list(allowed)}, got unknown field {k!r}"]
            for k in data if k not in allowed}


def _django_errors(exc: ValidationError) -> dict[str, list[str]]:
    if hasattr(exc, "error_dict"):
        return {k: [m for e in v for m in e.messages] for k, v in exc.error_dict.items()}
    return {"": list(exc.messages)}


def _check_bools(data: dict) -> dict[str, list[str]]:
    return {k: [f"expected true or false, got {data[k]!r}"]
            for k in _BOOL_FIELDS if k in data and not isinstance(data[k], bool)}


def _unstorable(value: str) -> bool:
    """A NUL character (PostgreSQL's text cannot hold it) or a lone surrogate."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return "\x00" in value


def _check_strings(data: dict) -> dict[str, list[str]]:
    out = {k: [f"expected a string, got {type(v).__name__}"]
           for k, v in data.items() if k not in _BOOL_FIELDS and not isinstance(v, str)}
    out.update({k: ["expected text without NUL characters or lone surrogates"]
                for k, v in data.items() if isinstance(v, str) and _unstorable(v)})
    return out


# --- webhook endpoints ----------------------------------------------------------------------------
def webhook_out(endpoint: WebhookEndpoint) -> dict[str, Any]:
    """An endpoint as the API shows it: every configured field but the secret, and its state
    (``disabled_reason``, ``last_error``)."""
    return {"name": endpoint.name, "kind": endpoint.kind, "url": endpoint.url,
            "routing_key_set": bool(endpoint.routing_key), "min_severity": endpoint.min_severity,
            "enabled": endpoint.enabled, "disabled_reason": endpoint.disabled_reason,
            "last_error": endpoint.last_error, "created_at": endpoint.created_at}


def apply_webhook(project: Project, data: dict, *, dry_run: bool = False) -> Change:
    """Create the endpoint ``data["name"]`` of ``project`` or set the fields given of the one
    that has that name. Raises ConfigError (nothing written)."""
    errors = _unknown(data, WEBHOOK_FIELDS)
    errors.update(_check_bools(data) | _check_strings(data))
    name = data.get("name")
    if not errors and (not isinstance(name, str) or not name.strip()):
        errors["name"] = ["expected a non-empty name (the endpoint's key in its project)"]
    if errors:
        raise ConfigError(errors)
    name = name.strip()
    with transaction.atomic():
        instance = (WebhookEndpoint.objects.select_for_update()
                    .filter(project=project, name=name).first())
        try:
            values, warning = clean_endpoint(project, {**data, "name": name}, instance)
        except ValidationError as exc:
            raise ConfigError(_django_errors(exc)) from None
        if instance is None:
            if not dry_run:
                WebhookEndpoint.objects.create(project=project, **values)
            return Change("webhook", name, "create",
                          sorted(k for k in values if k in data), warning)
        changed = [k for k, v in values.items() if getattr(instance, k) != v]
        if changed and not dry_run:
            for k in changed:
                setattr(instance, k, values[k])
            if "enabled" in changed and instance.enabled:
                instance.disabled_reason = ""
            instance.save()
        return Change("webhook", name, "update" if changed else "unchanged", sorted(changed),
                      warning)


def delete_webhook(project: Project, name: str, *, dry_run: bool = False) -> Change | None:
    """Delete the endpoint ``name`` of ``project`` (and its delivery history); None when there
    is none."""
    found = WebhookEndpoint.objects.filter(project=project, name=name)
    if not found.exists():
        return None
    if not dry_run:
        found.delete()
    return Change("webhook", name, "delete")


# --- storage locations ----------------------------------------------------------------------------
def location_out(location: StorageLocation) -> dict[str, Any]:
    """A location as the API shows it: every configured field but the secret key."""
    out = {k: getattr(location, k) for k in LOCATION_FIELDS if k != "secret_access_key"}
    out.update({"id": location.pk, "secret_access_key_set": bool(location.secret_access_key),
                "origin": location.origin, "last_listed_at": location.last_listed_at,
                "last_error": location.last_error})
    return out


def apply_location(project: Project, data: dict, *, origin: str,
                   dry_run: bool = False, operator: bool = True) -> Change:
    """Create the location ``data["url"]`` of ``project`` or set the fields given of the one
    with that URL (in canonical form). ``operator``: False for a project's token (the admin
    API), which may do what a member may on the dashboard and no more
    (``permissions.location_refusals``: nothing of an operator's location, nothing that uses
    what ``permissions.OPERATOR_ONLY`` names, a 400 naming the field). Raises ConfigError,
    NotPermitted for a change of an operator's location (nothing written)."""
    errors = _unknown(data, LOCATION_FIELDS)
    errors.update(_check_bools(data) | _check_strings(data))
    if not errors and not data.get("url"):
        errors["url"] = ["expected file:///absolute/folder or s3://bucket/prefix, got nothing"]
    if errors:
        raise ConfigError(errors)
    probe = StorageLocation(project=project, **data)
    try:
        clean_location(probe)
        probe.full_clean(exclude=["project", "origin", "created_at"], validate_unique=False)
    except ValidationError as exc:
        raise ConfigError(_django_errors(exc)) from None
    given = {k: getattr(probe, k) for k in data}
    with transaction.atomic():
        instance = (StorageLocation.objects.select_for_update()
                    .filter(project=project, url=probe.url).first())
        if not operator and (refused := location_refusals(instance, probe.url, given)):
            raise (NotPermitted if "" in refused else ConfigError)(refused)
        if instance is None:
            if not dry_run:
                probe.origin = origin
                probe.save()
            return Change("location", probe.url, "create", sorted(given))
        changed = sorted(k for k, v in given.items() if getattr(instance, k) != v)
        if changed and not dry_run:
            for k in changed:
                setattr(instance, k, given[k])
            instance.save()
        return Change("location", probe.url, "update" if changed else "unchanged", changed)


def delete_location(project: Project, url: str, *, dry_run: bool = False,
                    operator: bool = True) -> Change | None:
    """Delete the location of ``project`` whose URL is ``url`` (canonical form); None when
    there is none. Objects under it are then outside the project's locations and are no longer
    read (``object_outside_locations`` at their next check). ``operator``: False for a
    project's token, which may not delete an operator's location (NotPermitted,
    ``permissions.location_delete_refusal``)."""
    found = StorageLocation.objects.filter(project=project, url=url)
    location = found.first()
    if location is None:
        return None
    if not operator and (why := location_delete_refusal(location)):
        raise NotPermitted({"": [why]})
    if not dry_run:
        found.delete()
    return Change("location", url, "delete")


# --- run contracts --------------------------------------------------------------------------------
def contract_values(data: dict) -> dict[str, Any]:
    """The contract fields given in ``data``, checked by the wire contract's ``Contract``
    schema (docs/ingest-v1.md#attempt_started); raises ConfigError naming each refused field.
    Fields left out are not returned (they keep the run's value)."""
    errors = _unknown(data, CONTRACT_FIELDS)
    if errors:
        raise ConfigError(errors)
    try:
        contract = Contract.model_validate(data)
    except PydanticValidationError as exc:
        raise ConfigError({".".join(str(p) for p in err["loc"]): [err["msg"]]
                           for err in exc.errors()}) from None
    values = contract.model_dump(include=set(data))
    if "required_components" in values:
        names = list(dict.fromkeys(c.strip() for c in values["required_components"]))
        if any(_unstorable(c) for c in names):
            raise ConfigError({"required_components": [
                "expected component names without NUL characters or lone surrogates"]})
        if not names or not all(names):
            raise ConfigError({"required_components": [
                "expected at least one non-empty component name"]})
        values["required_components"] = names
    return values


def apply_contract(run: Run, data: dict, *, dry_run: bool = False) -> Change:
    """Set the contract fields given of ``run`` (``runs.contracts.save_contract``: kept until a
    later ``attempt_started`` declares a contract). Raises ConfigError."""
    values = contract_values(data)
    current = run.contract or {}
    changed = sorted(k for k, v in values.items() if current.get(k) != v)
    if changed and not dry_run:
        save_contract(run, {k: values[k] for k in changed})
    return Change("contract", run.run_id, "update" if changed else "unchanged", changed)


__all__ = [
    "LOCATION_FIELDS",
    "OPERATOR_ONLY",
    "SECRET_FIELDS",
    "WEBHOOK_FIELDS",
    "Change",
    "ConfigError",
    "NotPermitted",
    "apply_contract",
    "apply_location",
    "apply_webhook",
    "contract_values",
    "delete_location",
    "delete_webhook",
    "location_out",
    "webhook_out",
]
