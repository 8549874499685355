"""``manage.py create_project NAME``: create a project (or say that it exists)."""

from django.core.management.base import BaseCommand

from recoverydash.runs.models import Project


class Command(BaseCommand):
    help = "Create a project; prints its name. Existing projects are left as they are."

    def add_arguments(self, parser):
        parser.add_argument("name", help="project name (unique)")

    def handle(self, *args, name: str, **options):
        name = name.strip()
        if not name or len(name) > 100:
            from django.core.management.base import CommandError

            raise CommandError("the project name must be 1 to 100 characters")
        project, created = Project.objects.get_or_create(name=name)
        self.stdout.write(f"{'created' if created else 'exists'}: project {project.name}")
