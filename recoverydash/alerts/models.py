"""Alerts as rows, their state changes as rows, and the webhook endpoints and deliveries.

Following healthchecks' ``Flip``: every state change of an alert is an ``AlertFlip`` row; that
table is both the history the dashboard draws and the queue of notifications to send. Each flip
becomes one ``Delivery`` per enabled endpoint of the project; a delivery keeps a stable
``webhook_id`` across retries so receivers can deduplicate
(docs/ingest-v1.md#6-alert-webhooks).
"""

from __future__ import annotations

import secrets
import uuid

from django.conf import settings
from django.db import models, transaction
from django.utils import timezone

from recoverydash.runs.models import Project, Run

SEVERITIES = ("info", "warning", "critical")
STATES = ("firing", "acknowledged", "resolved")


class Alert(models.Model):
    """One episode of an alert rule on a run (docs/definitions.md#alert-rules), grouping every
    subject the rule holds for.

    ``dedup_key`` is ``run:rule:`` (``rules.group_key``; ``run:rule:subject`` for alerts stored
    before alerts grouped their subjects) and stable across episodes and while subjects are
    added: at most one alert per run and key is open (firing or acknowledged) at a time,
    enforced by a
    partial unique constraint. The run is part of the constraint because two projects may use
    the same ``run_id`` (docs/ingest-v1.md#authentication).
    ``subjects``: what the rule holds for, in natural order, each
    ``{"subject", "kind", "severity", "summary"}`` (``kind`` ``generation``, ``restart`` or
    ``run``; the subject of a restart is its attempt number); ``subject`` is the first one,
    fixed when the alert opened (receivers' labels stay the same as subjects are added).
    ``silenced_until`` mutes notifications (not the state) until that time.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="alerts")
    rule = models.CharField(max_length=48)
    subject = models.CharField(max_length=300, blank=True, default="")
    subjects = models.JSONField(default=list, blank=True)
    dedup_key = models.CharField(max_length=600)
    severity = models.CharField(max_length=16, choices=[(s, s) for s in SEVERITIES])
    state = models.CharField(max_length=16, choices=[(s, s) for s in STATES], default="firing")
    summary = models.TextField()
    opened_at = models.DateTimeField(default=timezone.now)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.CharField(max_length=150, blank=True, default="")
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.CharField(max_length=150, blank=True, default="")  # "" = condition cleared
    silenced_until = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField(default=timezone.now)
    # who owns the alert now (a user name; "" nobody), set with a note (``AlertNote`` of kind
    # ``assigned``), PagerDuty's "assigned to"
    assigned_to = models.CharField(max_length=150, blank=True, default="", db_default="")
    #: subjects that cleared as flaps (docs/definitions.md#flaps; ``AlertFlip.cleared``)
    flaps = models.IntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "dedup_key"],
                                    condition=~models.Q(state="resolved"),
                                    name="uniq_open_alert_per_run"),
        ]
        indexes = [models.Index(fields=["run", "state"], name="alert_run_state")]

    @property
    def public_id(self) -> str:
        return f"al_{self.pk}"

    def to_dict(self) -> dict:
        """The ``alerts`` item of docs/ingest-v1.md#recovery."""
        return {
            "id": self.public_id,
            "rule": self.rule,
            "severity": self.severity,
            "state": self.state,
            "opened_at": self.opened_at.isoformat(),
            "resolved_at": self.resolved_at.isoformat() if self.resolved_at else None,
            "summary": self.summary,
        }

    def snapshot(self) -> dict:
        """The alert as it is now, as a webhook body carries it: ``to_dict()`` plus ``subject``
        and ``subjects`` (the subject strings). Stored on each flip (``AlertFlip.snapshot``) so a
        delivery sent later says what was true at that flip."""
        return {**self.to_dict(), "subject": self.subject,
                "subjects": [s["subject"] for s in self.subjects or []]}

    def is_silenced(self, now=None) -> bool:
        return bool(self.silenced_until and self.silenced_until > (now or timezone.now()))

    def change_state(self, new_state: str, *, by: str = "", reason: str = "") -> AlertFlip | None:
        """Move to ``new_state`` and record the flip; returns it, or None if nothing changed.

        Takes the row with ``select_for_update`` so a person acknowledging and the evaluator
        resolving at the same moment cannot both flip from the same old state.
        Raises ValueError for an unknown state.
        """
        if new_state not in STATES:
            raise ValueError(f"state must be one of {STATES}, got {new_state!r}")
        with transaction.atomic():
            alert = Alert.objects.select_for_update().get(pk=self.pk)
            if alert.state == new_state or alert.state == "resolved":
                return None
            now = timezone.now()
            old_state = alert.state
            alert.state = new_state
            if new_state == "acknowledged":
                alert.acknowledged_at, alert.acknowledged_by = now, by
            elif new_state == "resolved":
                alert.resolved_at, alert.resolved_by = now, by
            alert.save()
            flip = AlertFlip.objects.create(alert=alert, old_state=old_state,
                                            new_state=new_state, reason=reason, created_at=now,
                                            notify=not alert.is_silenced(now),
                                            snapshot=alert.snapshot())
            self.__dict__.update({k: getattr(alert, k) for k in
                                  ("state", "acknowledged_at", "acknowledged_by",
                                   "resolved_at", "resolved_by")})
            return flip

    def record_subjects_change(self, before: list[str], *, now=None) -> AlertFlip | None:
        """Record that the subjects of this open alert changed from ``before`` (subject
        strings) to its current ``subjects``: one flip with ``old_state == new_state`` (the
        alert's state, unchanged), ``change`` ``{"added": [...], "removed": [...]}`` (subject
        strings, natural order) and a reason naming them, notified like any flip (``notify``
        False while silenced), carrying the alert as it is now (``snapshot``). Returns None
        when the set of subjects is the same (a refined summary is no change) or the alert is
        resolved. The caller holds the alert's row (``select_for_update``) and has saved it."""
        flip = self.subjects_change_flip(before, now=now)
        if flip is not None:
            flip.save()
        return flip

    def subjects_change_flip(self, before: list[str], *, now=None) -> AlertFlip | None:
        """The flip :meth:`record_subjects_change` stores, unsaved (``alerts.rules.evaluate_runs``
        creates those of many alerts in one ``bulk_create``); None when nothing is to be told."""
        if self.state == "resolved":
            return None
        after = [s["subject"] for s in self.subjects or []]
        added = [s for s in after if s not in set(before)]
        removed = [s for s in before if s not in set(after)]
        if not added and not removed:
            return None
        now = now or timezone.now()
        words = []
        if added:
            words.append(f"added {', '.join(s or '(run)' for s in added)}")
        if removed:
            words.append(f"removed {', '.join(s or '(run)' for s in removed)}")
        reason = (f"subjects changed: {'; '.join(words)} "
                  f"({len(after)} subject{'s' if len(after) != 1 else ''} now)")
        return AlertFlip(alert=self, old_state=self.state, new_state=self.state, reason=reason,
                         created_at=now, notify=not self.is_silenced(now),
                         snapshot=self.snapshot(), change={"added": added, "removed": removed})


class AlertFlip(models.Model):
    """A state change of an alert (``old_state`` empty when it opened), or a change of an open
    alert's subjects (``old_state == new_state``, the state it stays in, and ``change``
    ``{"added": [subject, ...], "removed": [...]}``; None for a state change): the timeline
    entry and the queue entry of each notification. ``processed_at`` is set once its deliveries
    have been created; ``notify`` is False when the alert was silenced.
    ``snapshot`` is the alert as it was at this flip (``Alert.snapshot``): its deliveries carry
    it, whatever happened to the alert before they were created (None for flips stored before
    snapshots: those are sent as the alert is). ``cleared``: why each subject that left with
    this flip left, and whether it was a flap (docs/definitions.md#flaps)."""

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="flips")
    old_state = models.CharField(max_length=16, blank=True, default="")
    new_state = models.CharField(max_length=16)
    reason = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    notify = models.BooleanField(default=True)
    processed_at = models.DateTimeField(null=True, blank=True)
    snapshot = models.JSONField(null=True, blank=True)
    change = models.JSONField(null=True, blank=True)
    #: per subject that left the alert with this flip (a resolution, or subjects removed):
    #: ``alerts.settle.departure``, ``{"subject", "held_s", "cause", "detail", "flap"}``; None
    #: when none left
    cleared = models.JSONField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["processed_at"], name="flip_processed")]

    @property
    def is_subjects_change(self) -> bool:
        """True for a change of subjects (the state stayed), False for a state change."""
        return self.change is not None


class AlertNote(models.Model):
    """A person's note on an alert, or a change of its owner (``kind`` ``assigned``: ``text``
    is the new owner, "" when unassigned): the alert's page lists them with its flips, oldest
    first, and the change log across runs shows them."""

    KINDS = [("note", "note"), ("assigned", "assigned")]

    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="notes")
    kind = models.CharField(max_length=16, choices=KINDS, default="note")
    author = models.CharField(max_length=150)
    text = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["alert", "created_at"], name="alert_note_time"),
                   models.Index(fields=["-created_at"], name="alert_note_recent")]


class RuleRunbook(models.Model):
    """A project's runbook for one alert rule: the page an on-call person opens next. Shown
    with every alert of the rule and carried in its webhook bodies (``runbook_url``)."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="runbooks")
    rule = models.CharField(max_length=48)
    url = models.URLField(max_length=2000)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "rule"],
                                               name="uniq_runbook_rule")]


def new_webhook_secret() -> str:
    """A Standard Webhooks secret: ``whsec_`` + base64 of 32 random bytes."""
    import base64

    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


class WebhookEndpoint(models.Model):
    """Where a project's alert notifications go. ``kind`` picks the body (one transport module
    each, ``recoverydash.alerts.transports*``): ``standard`` (the body of
    docs/ingest-v1.md#6-alert-webhooks, signed per Standard Webhooks), ``slack`` (incoming
    webhook), ``pagerduty`` (Events v2), ``alertmanager`` (the body of Alertmanager's
    ``webhook_config``, signed like ``standard``), ``alertmanager_api`` (pushed into an
    Alertmanager, ``POST /api/v2/alerts``), ``opsgenie`` (Alert API v2) or ``teams``
    (Microsoft Teams Workflows, an Adaptive Card). ``routing_key`` is the receiver's key where it
    needs one: PagerDuty's routing key, Opsgenie's API key; it is checked by the transport when
    the endpoint is saved (``alerts.forms.clean_endpoint``). ``name`` is unique within the
    project when set (configuration files address endpoints by it). A 410 disables the endpoint
    with the reason stored."""

    KINDS = [("standard", "Signed JSON (Standard Webhooks)"), ("slack", "Slack incoming webhook"),
             ("pagerduty", "PagerDuty Events v2"),
             ("alertmanager", "Alertmanager-compatible webhook (version 4)"),
             ("opsgenie", "Opsgenie Alert API v2"),
             ("teams", "Microsoft Teams (Workflows, Adaptive Card)"),
             ("alertmanager_api", "Alertmanager API v2 (push to POST /api/v2/alerts)")]

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="webhooks")
    name = models.CharField(max_length=100, blank=True, default="")
    url = models.URLField(max_length=2000)
    kind = models.CharField(max_length=16, choices=KINDS, default="standard")
    secret = models.CharField(max_length=100, default=new_webhook_secret)
    routing_key = models.CharField(max_length=100, blank=True, default="")
    min_severity = models.CharField(max_length=16, choices=[(s, s) for s in SEVERITIES],
                                    default="info")
    enabled = models.BooleanField(default=True)
    disabled_reason = models.TextField(blank=True, default="")
    last_error = models.TextField(blank=True, default="")
    last_error_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    # The last "Send test": asked for in the web process, sent by a worker, shown when done.
    test_webhook_id = models.CharField(max_length=64, blank=True, default="")
    test_status = models.CharField(max_length=16, blank=True, default="",
                                   choices=[(s, s) for s in ("", "pending", "delivered",
                                                             "failed")])
    test_message = models.TextField(blank=True, default="")
    test_requested_at = models.DateTimeField(null=True, blank=True)
    test_finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "name"],
                                               condition=~models.Q(name=""),
                                               name="uniq_endpoint_name")]

    def wants(self, severity: str) -> bool:
        return SEVERITIES.index(severity) >= SEVERITIES.index(self.min_severity)


def new_webhook_id() -> str:
    return "msg_" + uuid.uuid4().hex


class Delivery(models.Model):
    """One notification of one flip to one endpoint, retried with exponential backoff until it
    is delivered, refused for good (a permanent 4xx), or out of attempts."""

    STATUSES = [(s, s) for s in ("pending", "delivered", "failed")]

    flip = models.ForeignKey(AlertFlip, on_delete=models.CASCADE, related_name="deliveries")
    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE,
                                 related_name="deliveries")
    webhook_id = models.CharField(max_length=64, default=new_webhook_id, unique=True)
    payload = models.JSONField()
    status = models.CharField(max_length=16, choices=STATUSES, default="pending")
    attempts = models.IntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    claimed_until = models.DateTimeField(null=True, blank=True)
    last_status_code = models.IntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["flip", "endpoint"], name="uniq_delivery")]
        indexes = [models.Index(fields=["status", "next_attempt_at"], name="delivery_due")]


WEBHOOK_MAX_ATTEMPTS = getattr(settings, "RECOVERYDASH_WEBHOOK_MAX_ATTEMPTS", 12)
