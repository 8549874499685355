"""Where a project's checkpoints live: storage locations that the workers list for committed
manifests (a manifest in storage is the durable authority even when its commit event never arrived:
docs/ingest-v1.md#7-checkpoints-in-storage) and whose credentials verify the objects under them."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from recoverydash.runs.models import Project


class StorageLocation(models.Model):
    """An S3 prefix (``s3://bucket/prefix``) or a folder (``file:///abs/path``) of a project.

    ``run_id`` names the run that manifests found here belong to when the manifest itself does
    not say (the SDK writes ``run_id`` into every manifest). ``endpoint_url`` and the keys are for
    S3-compatible stores; empty keys use boto3's default credential chain (environment, instance
    profile). Errors of the last listing are kept for the dashboard.
    """

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="locations")
    url = models.CharField(max_length=2000)
    run_id = models.CharField(max_length=128, blank=True, default="")
    endpoint_url = models.CharField(max_length=500, blank=True, default="")
    region = models.CharField(max_length=64, blank=True, default="")
    access_key_id = models.CharField(max_length=200, blank=True, default="")
    secret_access_key = models.CharField(max_length=200, blank=True, default="")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_listed_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "url"], name="uniq_location")]

    def __str__(self) -> str:
        return self.url

    def covers(self, uri: str) -> bool:
        """True when ``uri`` lies under this location (its credentials apply)."""
        base = self.url.rstrip("/") + "/"
        return uri.startswith(base)


class SeenManifest(models.Model):
    """A manifest URI that discovery has already read and ingested, so a listing every minute
    does not read every manifest again. ``generation_id`` and ``run_id`` are what it held."""

    location = models.ForeignKey(StorageLocation, on_delete=models.CASCADE,
                                 related_name="seen_manifests")
    uri = models.CharField(max_length=2000)
    run_id = models.CharField(max_length=128)
    generation_id = models.CharField(max_length=200)
    seen_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["location", "uri"], name="uniq_seen")]
