"""Django admin for the run data: read-mostly views for operators."""

from django.contrib import admin

from . import models


@admin.register(models.Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ("name", "created_at")
    search_fields = ("name",)


@admin.register(models.Membership)
class MembershipAdmin(admin.ModelAdmin):
    """Who may see and act on a project's runs in the dashboard."""

    list_display = ("user", "project", "created_at")
    list_filter = ("project",)
    search_fields = ("user__username", "project__name")
    autocomplete_fields = ("user", "project")


@admin.register(models.ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("prefix", "name", "project", "scopes", "created_at", "last_used_at",
                    "revoked_at")
    list_filter = ("project",)
    readonly_fields = ("prefix", "token_hash", "created_at", "last_used_at")
    actions = ["revoke"]

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request, queryset):
        for token in queryset:
            token.revoke()


@admin.register(models.Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ("run_id", "project", "event_count", "ingest_seq", "last_event_at",
                    "last_received_at")
    list_filter = ("project",)
    search_fields = ("run_id",)


@admin.register(models.Attempt)
class AttemptAdmin(admin.ModelAdmin):
    list_display = ("run", "attempt", "started_at", "world_size", "last_update", "end_reason")
    search_fields = ("run__run_id",)


@admin.register(models.Generation)
class GenerationAdmin(admin.ModelAdmin):
    list_display = ("run", "generation_id", "attempt", "update", "status", "committed_at",
                    "manifest_conflict")
    list_filter = ("status",)
    search_fields = ("run__run_id", "generation_id")


@admin.register(models.Event)
class EventAdmin(admin.ModelAdmin):
    list_display = ("run", "event_id", "type", "attempt", "rank", "time", "batch_seq")
    list_filter = ("type",)
    search_fields = ("run__run_id", "event_id")
    raw_id_fields = ("run",)
