"""Every change a person makes from the dashboard: one function per action, each the only writer
of what it changes. Views check access (``queries.*_for``) before calling these, and pass the
acting user's name so alert history says who did what. The alert actions and the contract
edit live below the dashboard (``recoverydash.alerts.actions``, ``recoverydash.runs.contracts``)
because the admin API makes the same changes.
"""

from __future__ import annotations

from django.utils import timezone

from recoverydash.alerts.actions import SILENCE_CHOICES, acknowledge, resolve, silence
from recoverydash.alerts.models import WebhookEndpoint
from recoverydash.runs.contracts import CONTRACT_FIELDS, save_contract
from recoverydash.runs.models import ApiToken

BULK_ACTIONS = ("acknowledge", "resolve", "silence")


def bulk(alerts: list, action: str, username: str, seconds: int = 0) -> int:
    """Apply one of ``BULK_ACTIONS`` to each of ``alerts`` (``acknowledge``, ``resolve``, or
    ``silence`` for ``seconds``); returns how many changed (an alert already in that state, or
    resolved, does not count). Each alert flips in its own transaction, as if done one by one.
    ValueError for another action."""
    if action not in BULK_ACTIONS:
        raise ValueError(f"action must be one of {BULK_ACTIONS}, got {action!r}")
    changed = 0
    for alert in alerts:
        if action == "acknowledge":
            changed += acknowledge(alert, username) is not None
        elif action == "resolve":
            changed += resolve(alert, username) is not None
        elif alert.state != "resolved":
            silence(alert, username, seconds)
            changed += 1
    return changed


def save_runbook(project, rule: str, url: str) -> None:
    """Set (or with ``url`` "" remove) ``project``'s runbook URL of alert rule ``rule``."""
    from recoverydash.alerts.models import RuleRunbook

    if url:
        RuleRunbook.objects.update_or_create(project=project, rule=rule, defaults={"url": url})
    else:
        RuleRunbook.objects.filter(project=project, rule=rule).delete()


def create_token(project, name: str, scopes: list[str]) -> tuple[ApiToken, str]:
    """Issue an API token of ``project``; returns the row and the raw token, which is shown once
    and never stored (``ApiToken.issue``)."""
    return ApiToken.issue(project, scopes, name=name)


def revoke_token(project, token_pk: int) -> bool:
    """Revoke one live token of ``project``; False when there is no such live token. This
    process's token cache is emptied (a queryset update sends no post_save): the token is
    refused here at once, elsewhere within ``RECOVERYDASH_TOKEN_CACHE_S``."""
    from recoverydash.ingest.auth import forget_tokens

    done = bool(ApiToken.objects.filter(project=project, pk=token_pk, revoked_at__isnull=True)
                .update(revoked_at=timezone.now()))
    forget_tokens()
    return done


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


__all__ = [
    "CONTRACT_FIELDS",
    "SILENCE_CHOICES",
    "acknowledge",
    "create_token",
    "create_webhook",
    "delete_webhook",
    "resolve",
    "revoke_token",
    "save_contract",
    "send_test_notification",
    "silence",
]
