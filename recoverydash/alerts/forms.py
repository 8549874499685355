"""The webhook URL check every form that saves an endpoint applies (the dashboard's project page
and the admin): the same guard as every delivery (``transports.resolve_endpoint``)."""

from __future__ import annotations

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


class WebhookEndpointAdminForm(forms.ModelForm):
    """The admin's endpoint form: the URL passes the delivery guard."""

    def clean_url(self) -> str:
        url = self.cleaned_data["url"]
        clean_webhook_url(url)
        return url
