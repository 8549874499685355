"""The project's storage locations page: where the server may read its checkpoints, with which
credentials, and which objects of its manifests lie outside every location (never read).

A form, the page's query, and the views. Who may declare what is the rule of
``recoverydash.ingest.permissions``, the same for a member here and an admin token on the API:
any member may declare an S3 prefix with its own keys or role, and change or remove one; a
folder of the server's file system, the server's own (ambient) credentials and a custom S3
endpoint act with the server's identity or network, so they need a staff account (the server's
operator), like ``manage.py add_location``, and a location the operator declared is changed and
removed by the operator only. Secret keys are write-only: never shown again.
"""

from __future__ import annotations

from dataclasses import dataclass

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from recoverydash.dashboard import queries
from recoverydash.ingest.permissions import STAFF_ORIGIN, location_delete_refusal, location_refusals
from recoverydash.runs.models import CheckpointObject
from recoverydash.storage.locations import clean_location, declare_location
from recoverydash.storage.models import KIND_MANIFESTS, StorageLocation

OPERATOR_ONLY = "needs a staff account: it acts with the server's own {what}"
_WHAT = {"url": "file system", "use_ambient_credentials": "identity", "endpoint_url": "network"}


def _staff_words(field: str, errors: list[str]) -> list[str]:
    """The dashboard's words for a refusal of ``permissions.location_refusals``: a field only
    the operator may set needs a staff account; an operator's location is said as it is."""
    return [OPERATOR_ONLY.format(what=_WHAT[field])] if field in _WHAT else errors


class LocationForm(forms.ModelForm):
    """Declare (or update, by the same URI) one storage location."""

    url = forms.CharField(max_length=2000, label="URI (as this server sees it)",
                          widget=forms.TextInput(attrs={"placeholder": "s3://bucket/prefix"}))
    secret_access_key = forms.CharField(
        required=False, strip=True, label="Secret access key",
        widget=forms.PasswordInput(render_value=False),
        help_text="write-only; empty keeps the stored one when updating")

    class Meta:
        model = StorageLocation
        fields = ["url", "trainer_url", "run_id", "kind", "format", "endpoint_url", "region",
                  "access_key_id", "secret_access_key", "role_arn", "external_id",
                  "use_ambient_credentials", "discover", "enabled"]
        labels = {"trainer_url": "Trainers' prefix (when it differs)",
                  "run_id": "Run of manifests naming none", "role_arn": "IAM role to assume",
                  "endpoint_url": "Endpoint URL (S3-compatible stores)",
                  "access_key_id": "Access key ID", "external_id": "External ID",
                  "use_ambient_credentials": "Use the server's own credentials",
                  "discover": "List for manifests", "enabled": "Enabled",
                  "format": "Format of adopted checkpoints"}
        help_texts = {"format": "kind adopt: auto (detected), dcp, hf, lightning, deepspeed, "
                                "megatron or orbax; empty for recoverydash manifests",
                      "run_id": "kind adopt: the run its generations join (default: adopted- "
                                "and the folder's name)"}

    def __init__(self, *args, user=None, project=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.user, self.project = user, project

    def clean(self):
        data = super().clean()
        if self.errors:
            return data
        probe = StorageLocation(project=self.project,
                                kind=data.get("kind") or KIND_MANIFESTS,
                                **{f: data.get(f) or "" for f in
                                   ("url", "trainer_url", "endpoint_url", "access_key_id",
                                    "secret_access_key", "role_arn", "format")})
        if not data.get("secret_access_key") and data.get("access_key_id"):
            probe.secret_access_key = self._stored_secret(probe)
        clean_location(probe)  # ValidationError naming the field
        data["url"], data["trainer_url"] = probe.url, probe.trainer_url
        data["format"] = probe.format
        data["secret_access_key"] = probe.secret_access_key
        if not getattr(self.user, "is_staff", False):
            # the rule the admin API applies to a token (recoverydash.ingest.permissions)
            stored = StorageLocation.objects.filter(project=self.project, url=probe.url).first()
            for name, errors in location_refusals(stored, probe.url, data).items():
                self.add_error(name or None, _staff_words(name, errors))
        return data

    def _stored_secret(self, probe: StorageLocation) -> str:
        try:
            from recoverydash.storage.locations import normal_location

            url = normal_location(probe.url)
        except ValueError:
            return ""
        row = StorageLocation.objects.filter(project=self.project, url=url).first()
        return row.secret_access_key if row and row.access_key_id == probe.access_key_id else ""


@dataclass
class LocationsPage:
    """The page: the project's locations and what of its manifests lies outside them."""

    project: object
    locations: list
    outside: int            # objects stored as object_outside_locations
    outside_examples: list  # a few of their URIs, as the manifests name them
    adopted: dict = None    # location pk -> (run id, Run or None) of adopt locations


def locations_page(project) -> LocationsPage:
    """The project's storage locations (most specific first) and up to 5 URIs of objects
    found outside all of them."""
    outside = CheckpointObject.objects.filter(generation__run__project=project,
                                              check_status="object_outside_locations")
    return LocationsPage(
        project=project,
        locations=sorted(StorageLocation.objects.filter(project=project),
                         key=lambda loc: (-len(loc.url), loc.url)),
        outside=outside.count(),
        outside_examples=list(outside.order_by("-pk").values_list("uri", flat=True)[:5]),
        adopted=adopted_runs(project))


def adopted_runs(project) -> dict:
    """``{location pk: (run id, Run or None)}`` for the project's adopt locations: the run their
    generations join (``recoverydash.ingest.adoption.adopted_run_id``), None until the first
    listing made it."""
    from recoverydash.ingest.adoption import adopted_run_id
    from recoverydash.runs.models import Run
    from recoverydash.storage.models import KIND_ADOPT

    ids = {loc.pk: adopted_run_id(loc)
           for loc in StorageLocation.objects.filter(project=project, kind=KIND_ADOPT)}
    runs = {r.run_id: r for r in Run.objects.select_related("project")
            .filter(project=project, run_id__in=ids.values())}
    return {pk: (rid, runs.get(rid)) for pk, rid in ids.items()}


def _render(request, project, form=None, status=200):
    return render(request, "dashboard/locations.html",
                  {"page": locations_page(project), "form": form or LocationForm(),
                   "operator": request.user.is_staff}, status=status)


@login_required
def locations(request, pk: int):
    """GET the page; POST declares or updates a location."""
    project = queries.project_for(request.user, pk)
    if request.method != "POST":
        return _render(request, project)
    form = LocationForm(request.POST, user=request.user, project=project)
    if not form.is_valid():
        return _render(request, project, form, status=400)
    fields = {k: v for k, v in form.cleaned_data.items()}
    origin = STAFF_ORIGIN if request.user.is_staff else "dashboard"
    try:
        location, created = declare_location(project, origin=origin, **fields)
    except ValidationError as exc:
        for name, errors in exc.message_dict.items():
            form.add_error(name if name in form.fields else None, errors)
        return _render(request, project, form, status=400)
    messages.success(request, f"Storage location {location.url} "
                              f"{'declared' if created else 'updated'}: objects of this "
                              "project found outside the locations are being verified again.")
    return redirect("locations", pk=project.pk)


@login_required
@require_POST
def location_delete(request, pk: int, location_pk: int):
    """Remove a location: nothing under it is read any more (its objects become
    ``object_outside_locations`` at their next check)."""
    project = queries.project_for(request.user, pk)
    location = StorageLocation.objects.filter(project=project, pk=location_pk).first()
    if location is None:
        messages.error(request, "No such storage location.")
    elif not request.user.is_staff and (why := location_delete_refusal(location)):
        messages.error(request, f"Not removed: {why}.")
    else:
        location.delete()
        messages.success(request, f"Storage location {location.url} removed.")
    return redirect("locations", pk=project.pk)
