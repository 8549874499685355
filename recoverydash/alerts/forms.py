"""The checks every form that saves an endpoint applies (the dashboard's project page, the admin,
the admin API and ``manage.py apply_config``): the URL passes the same guard as every delivery
(``transports.resolve_endpoint``), and the receiver's key is one the receiver accepts (the
transport's ``check_key``)."""

from __future__ import annotations

import re

from django import forms

from recoverydash.alerts.transports import TransportError, check_address


def clean_webhook_url(url: str) -> str:
    """Check ``url`` when it is saved; returns a warning ("" when none).

    Raises ``forms.ValidationError`` with the guard's reason for a URL no delivery would be
    allowed to reach: a scheme other than http(s), a port outside 1-65535, an address that is
    not public (naming it and the setting that allows it). A name that does not resolve now is
    saved with a warning: DNS may recover, deliveries fail until it does."""
    try:
        check_address(url)
    except TransportError as exc:
        if exc.permanent:
            raise forms.ValidationError(exc.message) from None
        return f"{exc.message}: deliveries fail until it resolves"
    return ""


class RoutingKeyCheck:
    """For a Django form with ``kind`` and ``routing_key``: ``clean`` stores the key its
    receiver accepts (:func:`clean_routing_key`) or names the refusal on ``routing_key``.
    Shared by the admin's and the dashboard's endpoint forms."""

    def clean(self):
        data = super().clean()
        if "kind" in data:
            try:
                data["routing_key"] = clean_routing_key(data["kind"],
                                                        data.get("routing_key", ""))
            except forms.ValidationError as exc:
                self.add_error("routing_key", exc)
        return data


class WebhookEndpointAdminForm(RoutingKeyCheck, forms.ModelForm):
    """The admin's endpoint form: the URL passes the delivery guard, the key its receiver's
    check."""

    def clean_url(self) -> str:
        url = self.cleaned_data["url"]
        clean_webhook_url(url)
        return url


def clean_routing_key(kind: str, key: str) -> str:
    """The key to store for an endpoint of ``kind`` (``WebhookEndpoint.routing_key``), stripped.

    Raises ``forms.ValidationError`` for an unknown kind, or a key its receiver would refuse: a
    PagerDuty routing key of other than 32 letters and digits (or none), an Opsgenie API key that
    is not a UUID (or none), any key for a kind that uses none."""
    from recoverydash.alerts.delivery import TRANSPORTS
    from recoverydash.alerts.models import WebhookEndpoint

    transport = TRANSPORTS.get(kind)
    if transport is None:
        raise forms.ValidationError(f"expected a kind among "
                                    f"{[k for k, _ in WebhookEndpoint.KINDS]}, got {kind!r}")
    try:
        return transport.check_key(key)
    except ValueError as exc:
        raise forms.ValidationError(str(exc)) from None


#: An endpoint's name, its key in the admin API's paths (``/api/v1/webhooks/{name}``): the
#: characters of a run id (docs/ingest-v1.md#identifiers), at most 100, not starting with ``.``
#: or ``-``, so it is one URL path segment as it is (no ``/``, never ``.`` or ``..``).
WEBHOOK_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._:-]{0,99}")


def check_name(name: str) -> str:
    """``name`` when it is a valid endpoint name (:data:`WEBHOOK_NAME`) or empty (no name);
    ``forms.ValidationError`` saying what was expected otherwise."""
    if name and not WEBHOOK_NAME.fullmatch(name):
        raise forms.ValidationError(
            f"expected a name of 1-100 characters from A-Z a-z 0-9 _ . - :, not starting with "
            f"'.' or '-' (it is part of the API's URLs), got {name[:120]!r}")
    return name


def check_name_free(project, name: str, exclude_pk: int | None = None) -> None:
    """Raise ``forms.ValidationError`` when another endpoint of ``project`` is named ``name``
    (an empty name is never taken)."""
    from recoverydash.alerts.models import WebhookEndpoint

    if not name:
        return
    taken = WebhookEndpoint.objects.filter(project=project, name=name)
    if exclude_pk is not None:
        taken = taken.exclude(pk=exclude_pk)
    if taken.exists():
        raise forms.ValidationError(f"expected a name no other endpoint of project "
                                    f"{project.name!r} has, got {name!r}")


def clean_secret(secret: str) -> str:
    """A Standard Webhooks signing secret as given (``whsec_`` + base64 of at least 24 bytes);
    ``forms.ValidationError`` otherwise."""
    import base64
    import binascii

    body = secret.removeprefix("whsec_") if isinstance(secret, str) else ""
    try:
        raw = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if not secret.startswith("whsec_") or len(raw) < 24:
        raise forms.ValidationError("expected a Standard Webhooks secret: whsec_ followed by the "
                                    "base64 of at least 24 random bytes")
    return secret


def clean_endpoint(project, data: dict, instance=None) -> tuple[dict, str]:
    """Check the fields of an endpoint of ``project`` about to be created (``instance`` None) or
    changed: ``name`` (free in the project), ``kind``, ``url`` (the delivery guard), ``routing_key``
    (the kind's check), ``min_severity``, ``enabled``, ``secret``. Fields missing from ``data``
    keep the instance's values (or the defaults); the result holds every field to store.

    Returns ``(values, warning)``: ``warning`` is "" or why the URL's name does not resolve now
    (saved anyway). Raises ``forms.ValidationError`` with a dict ``{field: [messages]}`` naming
    every field that is refused."""
    from recoverydash.alerts.models import SEVERITIES, WebhookEndpoint

    current = {"name": "", "kind": "standard", "url": "", "routing_key": "",
               "min_severity": "info", "enabled": True}
    if instance is not None:
        current = {k: getattr(instance, k) for k in current}
    values = {**current, **{k: v for k, v in data.items() if k in current or k == "secret"}}
    errors: dict[str, list[str]] = {}
    warning = ""

    def check(field, fn):
        try:
            fn()
        except forms.ValidationError as exc:
            errors.setdefault(field, []).extend(exc.messages)

    def kind():
        if values["kind"] not in dict(WebhookEndpoint.KINDS):
            raise forms.ValidationError(f"expected one of {[k for k, _ in WebhookEndpoint.KINDS]},"
                                        f" got {values['kind']!r}")

    def url():
        nonlocal warning
        if not values["url"] or len(values["url"]) > 2000:
            raise forms.ValidationError("expected an http(s) URL of at most 2000 characters")
        warning = clean_webhook_url(values["url"])

    def key():
        values["routing_key"] = clean_routing_key(values["kind"], values["routing_key"])

    def severity():
        if values["min_severity"] not in SEVERITIES:
            raise forms.ValidationError(f"expected one of {list(SEVERITIES)}, "
                                        f"got {values['min_severity']!r}")

    def name():
        check_name(values["name"])
        check_name_free(project, values["name"], instance.pk if instance is not None else None)

    check("kind", kind)
    check("url", url)
    if "kind" not in errors:
        check("routing_key", key)
    check("min_severity", severity)
    check("name", name)
    if values.get("secret") is not None:
        check("secret", lambda: clean_secret(values["secret"]))
    else:
        values.pop("secret", None)
    if errors:
        raise forms.ValidationError(errors)
    return values, warning
