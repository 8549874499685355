"""Turning alert flips into webhook deliveries, and sending them at least once.

``process_flips`` claims unprocessed flips (conditional UPDATE, like healthchecks' Flip queue) and
creates one ``Delivery`` per interested endpoint; ``deliver`` sends one delivery, claiming it with
a conditional UPDATE so two workers never send the same attempt at once. Retries use exponential
backoff with jitter; ``webhook-id`` stays the same on every attempt
(docs/ingest-v1.md#6-alert-webhooks).

A test notification ("Send test" on the project page) is asked for in the web process
(:func:`request_test` marks the endpoint ``test_status="pending"`` with a new ``webhook-id``) and
sent by a worker (:func:`send_test`), so a slow or hostile receiver never holds a web process;
the page shows the result once the worker has stored it.
"""

from __future__ import annotations

import logging
import random
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from recoverydash.alerts.models import (
    WEBHOOK_MAX_ATTEMPTS,
    AlertFlip,
    Delivery,
    WebhookEndpoint,
    new_webhook_id,
)
from recoverydash.alerts.transports import StandardWebhookTransport, Transport, TransportError
from recoverydash.alerts.transports_alertmanager import AlertmanagerTransport
from recoverydash.alerts.transports_alertmanager_api import AlertmanagerApiTransport
from recoverydash.alerts.transports_opsgenie import OpsgenieTransport
from recoverydash.alerts.transports_pagerduty import PagerDutyTransport
from recoverydash.alerts.transports_slack import SlackTransport
from recoverydash.alerts.transports_teams import TeamsTransport

log = logging.getLogger(__name__)

BACKOFF_BASE_S = 5.0
BACKOFF_CAP_S = 3600.0
CLAIM_S = 120.0


def backoff_seconds(attempts: int) -> float:
    """Delay before attempt ``attempts + 1``: 5 s doubling per attempt, capped at one hour,
    with up to 20 % jitter so a receiver that comes back is not hit by every retry at once."""
    delay = min(BACKOFF_BASE_S * (2 ** max(attempts - 1, 0)), BACKOFF_CAP_S)
    return delay * (1.0 + random.random() * 0.2)


#: ``WebhookEndpoint.kind`` -> the transport that shapes and sends its bodies.
TRANSPORTS: dict[str, type[Transport]] = {
    "standard": StandardWebhookTransport, "slack": SlackTransport,
    "pagerduty": PagerDutyTransport, "alertmanager": AlertmanagerTransport,
    "opsgenie": OpsgenieTransport, "teams": TeamsTransport,
    "alertmanager_api": AlertmanagerApiTransport,
}


def transport_for(endpoint) -> Transport:
    """The transport of an endpoint's ``kind``; KeyError for an unknown kind."""
    return TRANSPORTS[endpoint.kind](endpoint)


def run_url(run) -> str:
    """The absolute address of ``run``'s dashboard page: SITE_URL and
    /p/<project name>/runs/<run id>/ (the dashboard's ``run`` URL)."""
    from django.urls import reverse

    return settings.SITE_URL + reverse("run", args=[run.project.name, run.run_id])


def flip_payload(flip: AlertFlip, runbook_urls: dict | None = None,
                 change: dict | None | bool = False) -> dict:
    """The body of a flip (docs/ingest-v1.md#6-alert-webhooks): version, status, alert (an
    ``alerts`` item of docs/ingest-v1.md#recovery, plus its ``subject``, ``subjects``, ``url``
    and the project's ``runbook_url`` for the rule or null) as it was at that flip
    (``AlertFlip.snapshot``), run (with its ``project``), the dedup key and ``change``: null for
    a state change, ``{"added": [subject, ...], "removed": [...]}`` when the open alert's
    subjects changed (``status`` is then the state it stays in). ``runbook_urls``: the
    ``RuleRunbook`` urls read beforehand, ``{(project pk, rule): url}`` (default: read here).
    ``change``: the ``change`` a group of flips sent as this one carries (:func:`group_change`;
    False: the flip's own)."""
    from django.urls import reverse

    from recoverydash.alerts.models import RuleRunbook

    alert = flip.alert
    run = alert.run
    health = getattr(getattr(run, "analysis", None), "health", None) or "ok"
    snapshot = dict(flip.snapshot or alert.snapshot())
    snapshot["url"] = settings.SITE_URL + reverse("alert_detail", args=[alert.pk])
    if runbook_urls is None:
        snapshot["runbook_url"] = (RuleRunbook.objects.filter(project=run.project,
                                                              rule=alert.rule)
                                   .values_list("url", flat=True).first())
    else:
        snapshot["runbook_url"] = runbook_urls.get((run.project_id, alert.rule))
    return {
        "version": "1",
        "status": flip.new_state,
        "alert": snapshot,
        "run": {"run_id": run.run_id, "project": run.project.name, "health": health,
                "url": run_url(run)},
        "dedup_key": alert.dedup_key,
        "change": flip.change if change is False else change,
    }


#: Analysis columns a flip's body never reads (its ``health`` only): not loaded with its run.
_HEAVY = ("alert__run__analysis__state", "alert__run__analysis__inputs",
          "alert__run__analysis__result")


def group_change(group: list[AlertFlip]) -> dict | None | bool:
    """What one notification of the flips ``group`` of one alert (oldest first, held together:
    :func:`process_flips`) says, sent as its newest flip: False when nothing is to be sent (the
    alert opened and resolved within the group, never told firing; or subjects that joined and
    left again, no net change); None for a state change (an opening: the newest subjects, no
    ``change``); else the net ``{"added", "removed"}`` of the subjects since the last
    notification (the newest flip's own when the group is one flip)."""
    newest = group[-1]
    if len(group) == 1:
        return newest.change
    opened = any(not f.old_state for f in group)
    if opened and newest.new_state == "resolved":
        return False
    if opened or any(f.old_state != f.new_state for f in group):
        return None
    first = group[0]
    after = (first.snapshot or {}).get("subjects") or []
    change = first.change or {}
    before = [x for x in after if x not in set(change.get("added") or [])] + [
        x for x in change.get("removed") or [] if x not in set(after)]
    end = (newest.snapshot or {}).get("subjects") or []
    added = [x for x in end if x not in set(before)]
    removed = [x for x in before if x not in set(end)]
    return {"added": added, "removed": removed} if added or removed else False


def process_flips(limit: int = 500, group_wait_s: float = 0.0, now=None) -> list[int]:
    """Create deliveries for unprocessed flips; returns the new delivery primary keys.

    Grouping, as Alertmanager groups the notifications of an alert group
    (docs/definitions.md#group-wait): the unprocessed flips of an alert are *due* when none of
    its flips was told within the last ``group_wait_s`` seconds before ``now`` (the workers pass
    ``RECOVERYDASH_ALERT_GROUP_WAIT_S``; 0: every flip at once). So an alert's first flip (a
    page) goes at once, never delayed, and the flips that follow a notification within the wait
    are held and go together once it has passed, as one notification of the alert as it is then
    (:func:`group_change`): a burst of evidence makes one page and one update. The due alerts of
    up to ``limit`` flips, oldest first, in one transaction
    (:func:`_process_together`: a few queries whatever their number): each flip is claimed
    (``processed_at`` set on the rows locked ``FOR UPDATE SKIP LOCKED`` still unprocessed, so
    two workers never notify the same flip twice) and the deliveries made in one
    ``bulk_create``. A flip whose body cannot be made (any error) is logged and left unclaimed
    for the next pass; the others are processed all the same. Should the pass fail as a whole
    (a delivery row already there, a database error), it is done again flip by flip, each in
    its own transaction (:func:`_process_flip`, one notification per flip).
    """
    from django.db.models import OuterRef, Subquery

    now = now or timezone.now()
    told = (AlertFlip.objects.filter(alert_id=OuterRef("alert_id"), processed_at__isnull=False)
            .order_by("-processed_at").values("processed_at")[:1])
    pending = list(AlertFlip.objects.filter(processed_at__isnull=True)
                   .annotate(told=Subquery(told))
                   .filter(Q(told__isnull=True)
                           | Q(told__lte=now - timedelta(seconds=group_wait_s)))
                   .order_by("pk").values_list("pk", flat=True)[:limit])
    if not pending:
        return []
    try:
        return _process_together(pending)
    except Exception:
        log.warning("%d alert flips: deliveries not created together; flip by flip",
                    len(pending), exc_info=True)
    created: list[int] = []
    for flip_pk in pending:
        try:  # one flip's failure must not stop the others' notifications
            created.extend(_process_flip(flip_pk))
        except Exception:
            log.exception("alert flip %s: deliveries not created; tried again next pass", flip_pk)
    return created


def _process_together(pks: list[int]) -> list[int]:
    """Claim the flips ``pks`` not processed and not held by another worker, and create their
    deliveries, in one transaction of a fixed number of queries; returns the new deliveries'
    primary keys (alert by alert, endpoints in primary-key order). The flips of one alert are
    one notification, carried by the newest (:func:`group_change`); a single flip gets what
    :func:`_process_flip` gives it."""
    from recoverydash.alerts.models import RuleRunbook

    created: list[int] = []
    with transaction.atomic():
        flips = list(AlertFlip.objects.select_for_update(skip_locked=True, of=("self",))
                     .filter(pk__in=pks, processed_at__isnull=True)
                     .select_related("alert__run__project", "alert__run__analysis")
                     .defer(*_HEAVY).order_by("pk"))
        if not flips:
            return created
        projects = {f.alert.run.project_id for f in flips if f.notify}
        runbooks = {(p, rule): url for p, rule, url in
                    RuleRunbook.objects.filter(project_id__in=projects)
                    .values_list("project_id", "rule", "url")}
        endpoints: dict[int, list[WebhookEndpoint]] = {}
        for endpoint in (WebhookEndpoint.objects.filter(project_id__in=projects, enabled=True)
                         .order_by("pk")):
            endpoints.setdefault(endpoint.project_id, []).append(endpoint)
        groups: dict[int, list[AlertFlip]] = {}
        for flip in flips:
            groups.setdefault(flip.alert_id, []).append(flip)
        claimed, deliveries = [], []
        for group in groups.values():
            flip, change = group[-1], group_change(group)
            if flip.notify and change is not False:
                try:
                    payload = flip_payload(flip, runbooks, change)
                except Exception:  # this group is left for the next pass, the others go on
                    log.exception("alert flip %s: deliveries not created; tried again next pass",
                                  flip.pk)
                    continue
                deliveries += [Delivery(flip=flip, endpoint=e, payload=payload)
                               for e in endpoints.get(flip.alert.run.project_id, ())
                               if e.wants(payload["alert"]["severity"])]
            claimed += [f.pk for f in group]
        AlertFlip.objects.filter(pk__in=claimed).update(processed_at=timezone.now())
        if deliveries:
            created = [d.pk for d in Delivery.objects.bulk_create(deliveries)]
    return created


def _process_flip(flip_pk: int) -> list[int]:
    """Claim flip ``flip_pk`` and create its deliveries, in one transaction; returns their
    primary keys (none when another worker claimed it or it notifies nobody)."""
    created: list[int] = []
    with transaction.atomic():
        claimed = AlertFlip.objects.filter(pk=flip_pk, processed_at__isnull=True).update(
            processed_at=timezone.now())
        if not claimed:
            return created
        flip = AlertFlip.objects.select_related("alert__run__project",
                                                "alert__run__analysis").defer(*_HEAVY) \
            .get(pk=flip_pk)
        if not flip.notify:
            return created
        payload = flip_payload(flip)
        endpoints = WebhookEndpoint.objects.filter(project=flip.alert.run.project,
                                                   enabled=True).order_by("pk")
        for endpoint in endpoints:
            if not endpoint.wants(payload["alert"]["severity"]):
                continue
            delivery, made = Delivery.objects.get_or_create(
                flip=flip, endpoint=endpoint, defaults={"payload": payload})
            if made:
                created.append(delivery.pk)
    return created


def _send(endpoint: WebhookEndpoint, payload: dict, webhook_id: str) -> int:
    """The endpoint's transport sends ``payload``; an unexpected error (a bug, a receiver that
    breaks the HTTP client in a way it does not classify) is logged and becomes a retryable
    TransportError, so the delivery counts an attempt and ends instead of staying pending."""
    try:
        return transport_for(endpoint).send(payload, webhook_id)
    except TransportError:
        raise
    except Exception as exc:  # noqa: BLE001 - one endpoint must not stop the delivery loop
        log.exception("webhook %s to %s: unexpected error", webhook_id, endpoint.url)
        raise TransportError(f"unexpected error: {type(exc).__name__}: {exc}") from None


def deliver(delivery_pk: int) -> str:
    """Send one delivery now if it is due; returns its status afterwards.

    Claims the row (``claimed_until``) with a conditional UPDATE; a worker killed mid-send leaves
    a claim that expires after two minutes, and the periodic sweep sends it again (at least once).
    """
    now = timezone.now()
    claimed = (Delivery.objects.filter(pk=delivery_pk, status="pending", next_attempt_at__lte=now)
               .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
               .update(claimed_until=now + timedelta(seconds=CLAIM_S)))
    if not claimed:
        return (Delivery.objects.filter(pk=delivery_pk).values_list("status", flat=True).first()
                or "")
    delivery = Delivery.objects.select_related("endpoint").get(pk=delivery_pk)
    endpoint = delivery.endpoint
    delivery.attempts += 1
    delivery.claimed_until = None
    try:
        if not endpoint.enabled:
            raise TransportError(f"endpoint disabled: {endpoint.disabled_reason}", permanent=True)
        code = _send(endpoint, delivery.payload, delivery.webhook_id)
    except TransportError as exc:
        delivery.last_status_code = exc.status_code
        delivery.last_error = exc.message[:2000]
        endpoint.last_error, endpoint.last_error_at = exc.message[:2000], timezone.now()
        if exc.permanent or delivery.attempts >= WEBHOOK_MAX_ATTEMPTS:
            delivery.status = "failed"
            if exc.status_code == 410:
                endpoint.enabled = False
                endpoint.disabled_reason = f"the receiver answered 410 Gone: {exc.message[:500]}"
        else:
            delivery.next_attempt_at = timezone.now() + timedelta(
                seconds=backoff_seconds(delivery.attempts))
        endpoint.save(update_fields=["last_error", "last_error_at", "enabled", "disabled_reason"])
        log.warning("webhook delivery %s to %s failed (attempt %d): %s", delivery.webhook_id,
                    endpoint.url, delivery.attempts, exc.message)
    else:
        delivery.status, delivery.last_status_code = "delivered", code
        delivery.delivered_at, delivery.last_error = timezone.now(), ""
    delivery.save()
    return delivery.status


def test_payload(project) -> dict:
    """A body of docs/ingest-v1.md#6-alert-webhooks for a test notification: a made-up ``info``
    alert named ``test``."""
    now = timezone.now().isoformat()
    return {
        "version": "1", "status": "firing",
        "alert": {"id": "al_test", "rule": "test", "severity": "info", "state": "firing",
                  "opened_at": now, "resolved_at": None, "subject": "",
                  "summary": f"Test notification from recoverydash for project {project.name}."},
        "run": {"run_id": "test", "project": project.name, "health": "ok",
                "url": f"{settings.SITE_URL}/"},
        "dedup_key": f"test:{project.pk}", "change": None,
    }


def request_test(endpoint: WebhookEndpoint) -> str:
    """Mark a test notification of ``endpoint`` pending under a new ``webhook-id`` (returned);
    the caller enqueues :func:`send_test` with it. A newer request supersedes an older one."""
    webhook_id = new_webhook_id()
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(
        test_webhook_id=webhook_id, test_status="pending", test_message="",
        test_requested_at=timezone.now(), test_finished_at=None)
    return webhook_id


def finish_test(endpoint_pk: int, webhook_id: str, ok: bool, message: str) -> bool:
    """Store the outcome of test ``webhook_id`` unless a newer test replaced it; returns whether
    it was stored. A failure is also the endpoint's ``last_error`` (it does not disable it)."""
    now = timezone.now()
    values = {"test_status": "delivered" if ok else "failed", "test_message": message[:2000],
              "test_finished_at": now}
    if not ok:
        values.update(last_error=message[:2000], last_error_at=now)
    return bool(WebhookEndpoint.objects.filter(pk=endpoint_pk, test_webhook_id=webhook_id,
                                               test_status="pending").update(**values))


def send_test(endpoint_pk: int, webhook_id: str) -> str:
    """Send test notification ``webhook_id`` to one endpoint (in a worker), within the delivery
    time budget, and store what the receiver answered; returns the test status afterwards
    (``""`` when the endpoint is gone, the stored status when a newer test replaced this
    one)."""
    endpoint = WebhookEndpoint.objects.select_related("project").filter(pk=endpoint_pk).first()
    if endpoint is None:
        return ""
    if endpoint.test_webhook_id != webhook_id or endpoint.test_status != "pending":
        return endpoint.test_status
    try:
        code = _send(endpoint, test_payload(endpoint.project), webhook_id)
    except TransportError as exc:
        ok, message = False, exc.message
    else:
        ok, message = True, f"the receiver answered HTTP {code}"
    finish_test(endpoint_pk, webhook_id, ok, message)
    return "delivered" if ok else "failed"


def notify_flips() -> list[int]:
    """The ``notify_flips`` task, sent ``RECOVERYDASH_ALERT_GROUP_WAIT_S`` after an evaluation
    whose flips were held (:func:`process_flips`): the deliveries of the alerts whose wait is
    over; returns their primary keys, for the caller to send."""
    return process_flips(group_wait_s=settings.RECOVERYDASH_ALERT_GROUP_WAIT_S)


def deliver_due() -> int:
    """Periodic: create the deliveries of new flips that are due (:func:`process_flips`), then
    send every
    delivery that is due. One delivery that fails unexpectedly (its claim expires and a later
    pass sends it) is logged and the others are sent; returns how many were tried."""
    process_flips(group_wait_s=settings.RECOVERYDASH_ALERT_GROUP_WAIT_S)
    due = due_deliveries()
    for pk in due:
        try:
            deliver(pk)
        except Exception:
            log.exception("webhook delivery %s: not sent; tried again when its claim expires", pk)
    return len(due)


def due_deliveries(limit: int = 200) -> list[int]:
    """Primary keys of pending deliveries whose next attempt is due and that nobody holds."""
    now = timezone.now()
    return list(Delivery.objects.filter(status="pending", next_attempt_at__lte=now)
                .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
                .order_by("next_attempt_at").values_list("pk", flat=True)[:limit])
