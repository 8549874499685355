"""What a person or a script does to an alert: acknowledge, resolve, silence. One function per
action, the only writer of what it changes; the dashboard's buttons and the admin API
(``recoverydash.ingest.config_api``) call these, passing who acted so the alert's history says it
(``AlertFlip.reason``)."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from recoverydash.alerts.models import Alert, AlertFlip

#: Silence lengths offered by the dashboard, in seconds.
SILENCE_CHOICES = [(1800, "30 minutes"), (3600, "1 hour"), (4 * 3600, "4 hours"),
                   (24 * 3600, "24 hours")]
#: The longest silence the admin API accepts, in seconds (30 days).
MAX_SILENCE_S = 30 * 24 * 3600


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


#: The longest note kept, in characters.
MAX_NOTE = 4000


def add_note(alert: Alert, author: str, text: str):
    """A note of ``author`` on ``alert`` (``AlertNote``: the alert's timeline and the change log
    show it); returns the row. ValueError for an empty note or one longer than ``MAX_NOTE``."""
    from recoverydash.alerts.models import AlertNote

    text = (text or "").strip()
    if not text or len(text) > MAX_NOTE:
        raise ValueError(f"a note holds 1 to {MAX_NOTE} characters, got {len(text)}")
    return AlertNote.objects.create(alert=alert, kind="note", author=author, text=text)


def assign(alert: Alert, by: str, owner: str):
    """Make ``owner`` (a user name; "" for nobody) the alert's owner (``Alert.assigned_to``),
    recorded as an ``AlertNote`` of kind ``assigned`` by ``by``; returns it, or None when the
    owner is already that one. The owner changes no state and sends nothing."""
    from django.db import transaction

    from recoverydash.alerts.models import AlertNote

    with transaction.atomic():
        locked = Alert.objects.select_for_update().get(pk=alert.pk)
        if locked.assigned_to == owner:
            return None
        Alert.objects.filter(pk=alert.pk).update(assigned_to=owner)
        note = AlertNote.objects.create(alert=alert, kind="assigned", author=by, text=owner)
    alert.assigned_to = owner
    return note
