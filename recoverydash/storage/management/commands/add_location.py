"""``manage.py add_location --project NAME --uri file:///abs/prefix`` (or ``s3://bucket/prefix``).

Declares a storage location of a project (created if needed), the way ``create_token`` issues a
token: the server reads a manifest's objects only under its project's locations, with each
location's own credentials. Declaring the same URI again updates it. Options: ``--trainer-uri``
(the same prefix as the trainers name it, when it differs: ``/mnt/ckpt`` there, ``--uri
file:///data/ckpt`` here), ``--run-id``, ``--endpoint-url``, ``--region``, ``--access-key-id`` with
``--secret-access-key-env VAR`` (read from the environment, so it stays out of the shell history)
or ``--secret-access-key``, ``--role-arn`` / ``--external-id``, ``--ambient-credentials`` (the
server's own: environment, instance profile), ``--kind`` / ``--format``, ``--no-discover``,
``--disable``."""

import os

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from recoverydash.runs.models import Project
from recoverydash.storage.locations import declare_location
from recoverydash.storage.models import KIND_ADOPT, KIND_MANIFESTS


class Command(BaseCommand):
    help = "Declare (or update) a storage location of a project (created if needed)."

    def add_arguments(self, parser):
        parser.add_argument("--project", required=True, help="project name")
        parser.add_argument("--uri", required=True,
                            help="file:///absolute/folder or s3://bucket/prefix, as this server "
                                 "sees it")
        parser.add_argument("--trainer-uri", default="",
                            help="the same prefix as the trainers name it, when it differs")
        parser.add_argument("--run-id", default="", help="run of manifests that name none")
        parser.add_argument("--endpoint-url", default="", help="S3-compatible endpoint")
        parser.add_argument("--region", default="")
        parser.add_argument("--access-key-id", default="")
        parser.add_argument("--secret-access-key", default="",
                            help="prefer --secret-access-key-env")
        parser.add_argument("--secret-access-key-env", default="",
                            help="name of an environment variable holding the secret key")
        parser.add_argument("--role-arn", default="", help="IAM role to assume for this prefix")
        parser.add_argument("--external-id", default="")
        parser.add_argument("--ambient-credentials", action="store_true",
                            help="use the server's own credentials (environment, instance "
                                 "profile) for this location")
        parser.add_argument("--kind", default=KIND_MANIFESTS, choices=[KIND_MANIFESTS, KIND_ADOPT])
        parser.add_argument("--format", default="", help="adopted checkpoints: their format")
        parser.add_argument("--no-discover", action="store_true",
                            help="do not list this location for manifests")
        parser.add_argument("--disable", action="store_true",
                            help="keep it declared but read nothing under it")

    def handle(self, *args, **o):
        name = o["project"].strip()
        if not name or len(name) > 100:
            raise CommandError("--project must be 1 to 100 characters")
        secret = o["secret_access_key"]
        if o["secret_access_key_env"]:
            secret = os.environ.get(o["secret_access_key_env"], "")
            if not secret:
                raise CommandError(f"environment variable {o['secret_access_key_env']} is empty")
        project, created = Project.objects.get_or_create(name=name)
        if created:
            self.stdout.write(f"created project {project.name}")
        try:
            location, new = declare_location(
                project, origin="command", url=o["uri"], trainer_url=o["trainer_uri"],
                run_id=o["run_id"], endpoint_url=o["endpoint_url"], region=o["region"],
                access_key_id=o["access_key_id"], secret_access_key=secret,
                role_arn=o["role_arn"], external_id=o["external_id"],
                use_ambient_credentials=o["ambient_credentials"], kind=o["kind"],
                format=o["format"], discover=not o["no_discover"], enabled=not o["disable"])
        except ValidationError as exc:
            raise CommandError("; ".join(f"{k}: {' '.join(v)}" for k, v in
                                         exc.message_dict.items())) from None
        creds = ("ambient credentials" if location.use_ambient_credentials else
                 f"role {location.role_arn}" if location.role_arn else
                 f"key {location.access_key_id[:4]}..." if location.access_key_id else
                 "no credentials" if location.scheme == "s3" else "server file system")
        mapped = f" (trainers: {location.trainer_url})" if location.trainer_url else ""
        self.stdout.write(f"{'declared' if new else 'updated'} storage location {location.url}"
                          f"{mapped} for project {project.name}: {creds}")
