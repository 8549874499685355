"""Where a project's checkpoints live: storage locations that the workers list for committed
manifests (a manifest in storage is the durable authority even when its commit event never arrived:
docs/ingest-v1.md#7-checkpoints-in-storage) and whose credentials verify the objects under them."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from recoverydash.runs.models import Project

KIND_MANIFESTS = "manifests"
KIND_ADOPT = "adopt"
ORIGINS = ("dashboard", "staff", "command", "admin", "migration", "demo", "api", "config")


class StorageLocation(models.Model):
    """A folder (``file:///abs/path``) or an S3 prefix (``s3://bucket/prefix``) of a project: the
    only places the server reads for it. An object of a manifest is opened or requested only when
    it lies under an enabled location of its run's project (``recoverydash.storage.locations``),
    with that location's credentials; anything else is ``object_outside_locations``.

    ``url`` is the prefix as the server sees it; ``trainer_url``, when set, is the same prefix as
    the trainers name it (``file:///mnt/ckpt`` on the trainers, ``file:///data/ckpt`` here): object
    URIs under it are rewritten to ``url`` before anything else. ``kind``: ``manifests`` (the SDK's
    layout, ``<url>/<generation_id>/recoverydash-manifest.json``, listed by discovery when
    ``discover``) or ``adopt`` (checkpoints of another tool, ``format`` saying which).
    ``run_id`` names the run of manifests that do not name one. S3: ``endpoint_url``,
    ``region``, the keys and ``role_arn`` (+ ``external_id``) are this location's own; the
    server's ambient credentials (environment, instance profile) are used only with
    ``use_ambient_credentials``. ``origin`` says where it was declared; the last listing's
    error is kept for the dashboard. What may be declared is checked by
    ``recoverydash.storage.locations.clean_location`` (the dashboard form, ``manage.py
    add_location`` and the admin call it).
    """

    KIND_CHOICES = [(KIND_MANIFESTS, "recoverydash manifests"),
                    (KIND_ADOPT, "checkpoints of another tool (adopted)")]

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="locations")
    url = models.CharField(max_length=2000)
    trainer_url = models.CharField(max_length=2000, blank=True, default="")
    kind = models.CharField(max_length=16, choices=KIND_CHOICES, default=KIND_MANIFESTS)
    format = models.CharField(max_length=64, blank=True, default="")
    run_id = models.CharField(max_length=128, blank=True, default="")
    endpoint_url = models.CharField(max_length=500, blank=True, default="")
    region = models.CharField(max_length=64, blank=True, default="")
    access_key_id = models.CharField(max_length=200, blank=True, default="")
    secret_access_key = models.CharField(max_length=200, blank=True, default="")
    role_arn = models.CharField(max_length=300, blank=True, default="")
    external_id = models.CharField(max_length=200, blank=True, default="")
    use_ambient_credentials = models.BooleanField(default=False)
    enabled = models.BooleanField(default=True)
    discover = models.BooleanField(default=True)
    origin = models.CharField(max_length=16, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    last_listed_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "url"], name="uniq_location")]

    def __str__(self) -> str:
        return self.url

    @property
    def scheme(self) -> str:
        return "s3" if self.url.startswith("s3://") else "file"


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
