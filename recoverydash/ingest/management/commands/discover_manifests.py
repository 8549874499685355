"""``manage.py discover_manifests``: list every enabled storage location now and ingest the
manifests whose commit event never arrived (what beat's ``discover_manifests`` does every 60 s)."""

from django.core.management.base import BaseCommand

from recoverydash.ingest.discovery import discover_all


class Command(BaseCommand):
    help = "Ingest committed manifests found in storage that the server has not seen."

    def handle(self, *args, **options):
        n = discover_all()
        self.stdout.write(f"ingested {n} manifest(s) found in storage")
