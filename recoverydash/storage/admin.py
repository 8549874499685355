"""Django admin for storage locations: where the server may read each project's checkpoints,
with which credentials (the secret key is write-only here)."""

from django import forms
from django.contrib import admin

from .locations import clean_location
from .models import StorageLocation

PROBED = ("url", "trainer_url", "endpoint_url", "access_key_id", "secret_access_key", "role_arn")


class StorageLocationForm(forms.ModelForm):
    secret_access_key = forms.CharField(
        required=False, strip=True, widget=forms.PasswordInput(render_value=False),
        help_text="write-only: leave empty to keep the stored one")

    class Meta:
        model = StorageLocation
        exclude = ("last_listed_at", "last_error", "created_at")

    def clean(self):
        data = super().clean()
        if not self.errors:
            probe = StorageLocation(**{f: data.get(f, "") for f in PROBED})
            clean_location(probe)  # ValidationError naming the field
            data["url"], data["trainer_url"] = probe.url, probe.trainer_url
        return data

    def clean_secret_access_key(self):
        value = self.cleaned_data.get("secret_access_key", "")
        if not value and self.instance.pk:
            return self.instance.secret_access_key
        return value


@admin.register(StorageLocation)
class StorageLocationAdmin(admin.ModelAdmin):
    form = StorageLocationForm
    list_display = ("url", "project", "kind", "trainer_url", "enabled", "discover",
                    "use_ambient_credentials", "origin", "last_listed_at")
    list_filter = ("project", "kind", "enabled", "origin")
    search_fields = ("url", "trainer_url", "run_id")
    readonly_fields = ("last_listed_at", "last_error")

    def save_model(self, request, obj, form, change):
        if not change and not obj.origin:
            obj.origin = "admin"
        super().save_model(request, obj, form, change)
