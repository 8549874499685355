"""Django admin for alerts and their delivery: webhook endpoints (the URL passes the delivery
guard), alerts with their state changes, and the deliveries of each change."""

from django.contrib import admin

from .forms import WebhookEndpointAdminForm
from .models import Alert, AlertFlip, Delivery, WebhookEndpoint


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    form = WebhookEndpointAdminForm
    list_display = ("project", "name", "url", "kind", "min_severity", "enabled", "last_error_at",
                    "test_status")
    list_filter = ("project", "kind", "enabled")
    search_fields = ("name", "url")
    fields = ("project", "name", "url", "kind", "min_severity", "routing_key", "enabled",
              "disabled_reason", "secret", "last_error", "last_error_at", "test_webhook_id",
              "test_status", "test_message", "test_requested_at", "test_finished_at",
              "created_at")
    readonly_fields = ("secret", "last_error", "last_error_at", "test_webhook_id", "test_status",
                       "test_message", "test_requested_at", "test_finished_at", "created_at")


class AlertFlipInline(admin.TabularInline):
    model = AlertFlip
    extra = 0
    can_delete = False
    fields = ("created_at", "old_state", "new_state", "reason", "notify", "processed_at")
    readonly_fields = fields


@admin.register(Alert)
class AlertAdmin(admin.ModelAdmin):
    list_display = ("rule", "run", "severity", "state", "opened_at", "resolved_at",
                    "silenced_until")
    list_filter = ("state", "severity", "rule", "run__project")
    search_fields = ("run__run_id", "rule", "summary", "dedup_key")
    raw_id_fields = ("run",)
    readonly_fields = ("dedup_key", "opened_at", "last_seen_at")
    inlines = [AlertFlipInline]


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    list_display = ("webhook_id", "endpoint", "status", "attempts", "last_status_code",
                    "created_at", "delivered_at")
    list_filter = ("status", "endpoint__project")
    search_fields = ("webhook_id", "endpoint__url")
    raw_id_fields = ("flip", "endpoint")
    readonly_fields = ("webhook_id", "payload", "created_at", "delivered_at", "last_error",
                       "last_status_code")
