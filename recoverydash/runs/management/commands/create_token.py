"""``manage.py create_token --project NAME --scopes ingest,read [--name N]``.

Creates the project if needed and an API token with the scopes; prints the raw token alone on
the last line (it is shown once: only its hash is stored)."""

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from recoverydash.runs.models import SCOPES, ApiToken, Project


class Command(BaseCommand):
    help = "Create an API token for a project (created if needed); the token is the last line."

    def add_arguments(self, parser):
        parser.add_argument("--project", required=True, help="project name")
        parser.add_argument("--scopes", default="ingest,read",
                            help=f"comma-separated subset of {','.join(SCOPES)}")
        parser.add_argument("--name", default="", help="a label to tell tokens apart")

    def handle(self, *args, project: str, scopes: str, name: str, **options):
        wanted = [s.strip() for s in scopes.split(",") if s.strip()]
        project = project.strip()
        if not project or len(project) > 100:
            raise CommandError("--project must be 1 to 100 characters")
        with transaction.atomic():
            proj, created = Project.objects.get_or_create(name=project)
            try:
                token, raw = ApiToken.issue(proj, wanted, name=name[:100])
            except ValueError as exc:
                raise CommandError(str(exc)) from None
        if created:
            self.stdout.write(f"created project {proj.name}")
        self.stdout.write(f"token {token.prefix}... for project {proj.name}, "
                          f"scopes {','.join(token.scopes)} (shown once, store it now):")
        self.stdout.write(raw)
