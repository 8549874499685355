"""Every change a person makes from the dashboard: one function per action, each the only writer
of what it changes. Views check access (``queries.*_for``) before calling these, and pass the
acting user's name so alert history says who did what.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from recoverydash.alerts.models import Alert, AlertFlip, WebhookEndpoint
from recoverydash.runs.models import ApiToken

SILENCE_CHOICES = [(1800, "30 minutes"), (3600, "1 hour"), (4 * 3600, "4 hours"),
                   (24 * 3600, "24 hours")]


def acknowledge(alert: Alert, username: str) -> AlertFlip | None:
    """Firing -> acknowledged (``Alert.change_state``); None when already acknowledged or
    resolved. Acknowledging tells the webhooks, unless the alert is silenced."""
    return alert.change_state("acknowledged", by=username, reason=f"acknowledged by {username}")


def resolve(alert: Alert, username: str) -> AlertFlip | None:
    """Firing or acknowledged -> resolved by a person (``Alert.change_state``)."""
    return alert.change_state("resolved", by=username, reason=f"resolved by {username}")


def silence(alert: Alert, username: str, seconds: int) -> Alert:
    """Mute the alert's notifications for ``seconds`` from now (its state does not change: it is
    still shown as firing or acknowledged). ``seconds`` <= 0 lifts the silence."""
    until = timezone.now() + timedelta(seconds=seconds) if seconds > 0 else None
    Alert.objects.filter(pk=alert.pk).update(silenced_until=until)
    alert.silenced_until = until
    return alert


def create_token(project, name: str, scopes: list[str]) -> tuple[ApiToken, str]:
    """Issue an API token of ``project``; returns the row and the raw token, which is shown once
    and never stored (``ApiToken.issue``)."""
    return ApiToken.issue(project, scopes, name=name)


def revoke_token(project, token_pk: int) -> bool:
    """Revoke one live token of ``project``; False when there is no such live token."""
    return bool(ApiToken.objects.filter(project=project, pk=token_pk, revoked_at__isnull=True)
                .update(revoked_at=timezone.now()))


def create_webhook(project, *, name: str, url: str, kind: str, min_severity: str,
                   routing_key: str = "") -> WebhookEndpoint:
    """A new enabled endpoint of ``project`` with a fresh signing secret."""
    return WebhookEndpoint.objects.create(project=project, name=name, url=url, kind=kind,
                                          min_severity=min_severity, routing_key=routing_key)


def delete_webhook(project, endpoint_pk: int) -> bool:
    """Delete an endpoint of ``project`` (and its delivery history)."""
    deleted, _ = WebhookEndpoint.objects.filter(project=project, pk=endpoint_pk).delete()
    return bool(deleted)


def send_test_notification(project, endpoint_pk: int) -> str:
    """Ask a worker to send a signed test notification to one endpoint of ``project``; returns
    its ``webhook-id``. The endpoint's ``test_status`` is ``pending`` until the worker stores
    the receiver's answer (or ``failed`` at once when the task cannot be queued); the web
    process never waits for the receiver."""
    from recoverydash.alerts.delivery import finish_test, request_test
    from recoverydash.runs import queue

    endpoint = WebhookEndpoint.objects.get(project=project, pk=endpoint_pk)
    webhook_id = request_test(endpoint)
    if not queue.enqueue(queue.SEND_TEST_WEBHOOK, endpoint.pk, webhook_id):
        finish_test(endpoint.pk, webhook_id, False,
                    "the test could not be queued: the task broker does not answer")
    return webhook_id


CONTRACT_FIELDS = ("max_replay_samples", "max_omission_samples", "max_checkpoint_age_s",
                   "required_components")


def save_contract(run, values: dict) -> dict:
    """Replace the run's recovery contract (docs/ingest-v1.md#attempt_started ``contract``) with
    ``values``; keys outside the contract's four are kept as they were. A later ``attempt_started``
    carrying a contract replaces this one again (the latest one wins)."""
    with transaction.atomic():
        locked = type(run).objects.select_for_update().get(pk=run.pk)
        contract = dict(locked.contract or {})
        for key in CONTRACT_FIELDS:
            if key in values:
                contract[key] = values[key]
        locked.contract = contract
        locked.save(update_fields=["contract"])
    run.contract = contract
    return contract
