"""Turning alert flips into webhook deliveries, and sending them at least once.

``process_flips`` claims unprocessed flips (conditional UPDATE, like healthchecks' Flip queue) and
creates one ``Delivery`` per interested endpoint; ``deliver`` sends one delivery, claiming it with
a conditional UPDATE so two workers never send the same attempt at once. Retries use exponential
backoff with jitter; ``webhook-id`` stays the same on every attempt (spec 6).
"""

from __future__ import annotations

import logging
import random
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from recoverydash.alerts.models import (WEBHOOK_MAX_ATTEMPTS, AlertFlip, Delivery,
                                        WebhookEndpoint)
from recoverydash.alerts.transports import TransportError, transport_for

log = logging.getLogger(__name__)

BACKOFF_BASE_S = 5.0
BACKOFF_CAP_S = 3600.0
CLAIM_S = 120.0


def backoff_seconds(attempts: int) -> float:
    """Delay before attempt ``attempts + 1``: 5 s doubling per attempt, capped at one hour,
    with up to 20 % jitter so a receiver that comes back is not hit by every retry at once."""
    delay = min(BACKOFF_BASE_S * (2 ** max(attempts - 1, 0)), BACKOFF_CAP_S)
    return delay * (1.0 + random.random() * 0.2)


def run_url(run) -> str:
    return f"{settings.SITE_URL}/runs/{run.pk}/"


def flip_payload(flip: AlertFlip) -> dict:
    """The spec 6 body of a flip: version, status, alert (spec 5 item) and run."""
    alert = flip.alert
    run = alert.run
    health = getattr(getattr(run, "analysis", None), "health", None) or "ok"
    return {
        "version": "1",
        "status": flip.new_state,
        "alert": alert.to_dict(),
        "run": {"run_id": run.run_id, "health": health, "url": run_url(run)},
        "dedup_key": alert.dedup_key,
    }


def process_flips(limit: int = 500) -> list[int]:
    """Create deliveries for unprocessed flips; returns the new delivery primary keys.

    Each flip is claimed with ``UPDATE ... WHERE processed_at IS NULL``: only the worker whose
    update changed one row goes on, so two workers never notify the same flip twice.
    """
    created: list[int] = []
    pending = list(AlertFlip.objects.filter(processed_at__isnull=True)
                   .order_by("pk").values_list("pk", flat=True)[:limit])
    for flip_pk in pending:
        with transaction.atomic():
            claimed = AlertFlip.objects.filter(pk=flip_pk, processed_at__isnull=True).update(
                processed_at=timezone.now())
            if not claimed:
                continue
            flip = AlertFlip.objects.select_related("alert__run__project",
                                                    "alert__run__analysis").get(pk=flip_pk)
            if not flip.notify:
                continue
            payload = flip_payload(flip)
            endpoints = WebhookEndpoint.objects.filter(project=flip.alert.run.project,
                                                       enabled=True)
            for endpoint in endpoints:
                if not endpoint.wants(flip.alert.severity):
                    continue
                delivery, made = Delivery.objects.get_or_create(
                    flip=flip, endpoint=endpoint, defaults={"payload": payload})
                if made:
                    created.append(delivery.pk)
    return created


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
        return Delivery.objects.filter(pk=delivery_pk).values_list("status", flat=True).first() or ""
    delivery = Delivery.objects.select_related("endpoint").get(pk=delivery_pk)
    endpoint = delivery.endpoint
    delivery.attempts += 1
    delivery.claimed_until = None
    try:
        if not endpoint.enabled:
            raise TransportError(f"endpoint disabled: {endpoint.disabled_reason}", permanent=True)
        code = transport_for(endpoint).send(delivery.payload, delivery.webhook_id)
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


def due_deliveries(limit: int = 200) -> list[int]:
    """Primary keys of pending deliveries whose next attempt is due and that nobody holds."""
    now = timezone.now()
    return list(Delivery.objects.filter(status="pending", next_attempt_at__lte=now)
                .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
                .order_by("next_attempt_at").values_list("pk", flat=True)[:limit])
