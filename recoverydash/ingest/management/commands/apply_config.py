"""``manage.py apply_config FILE [--dry-run] [--prune]``: make projects' webhook endpoints,
storage locations and run contracts what a YAML file says (configuration kept in git).

The file (docs/operator-guide.md "Configuration as code" shows a whole one)::

    projects:
      - name: vision                 # created if it does not exist
        webhooks:                    # keyed by name
          - name: oncall
            kind: pagerduty
            url: https://events.pagerduty.com/v2/enqueue
            routing_key: ${PAGERDUTY_ROUTING_KEY}
            min_severity: critical
        locations:                   # keyed by url
          - url: s3://ckpt-bucket/vision
            region: eu-west-1
            access_key_id: ${VISION_AWS_KEY_ID}
            secret_access_key: ${VISION_AWS_SECRET}
        contracts:                   # keyed by run_id; runs not seen yet are skipped (said)
          llama-7b-run-12:
            max_checkpoint_age_s: 1800

``${NAME}`` in a string is the environment variable NAME (an unset one is an error), so
secrets stay out of the file. Items are checked as the admin API checks them
(``recoverydash.ingest.config``); each prints one line (create / update with the fields /
unchanged); applying the same file again changes nothing. ``--dry-run`` prints the lines and
writes nothing. ``--prune`` also deletes the listed projects' endpoints and locations the file
does not name. One refused item stops the command before anything is written (exit 1)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from recoverydash.alerts.models import WebhookEndpoint
from recoverydash.ingest import config
from recoverydash.runs.models import Project, Run
from recoverydash.storage.models import StorageLocation

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_TOP = ("projects",)
_PROJECT = ("name", "webhooks", "locations", "contracts")
_WRITES = ("create", "update", "delete")


class _DryRun(Exception):
    """Raised inside the transaction of a dry run so that nothing it did stays."""


def expand(value, where: str):
    """``value`` with every ``${NAME}`` in its strings replaced by the environment variable;
    CommandError naming ``where`` for an unset variable."""
    if isinstance(value, str):
        def sub(match):
            name = match.group(1)
            if name not in os.environ:
                raise CommandError(f"{where}: environment variable {name} is not set")
            return os.environ[name]
        return _ENV.sub(sub, value)
    if isinstance(value, list):
        return [expand(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: expand(v, f"{where}.{k}") for k, v in value.items()}
    return value


def load(path: str) -> list[dict]:
    """The ``projects`` list of the YAML file at ``path``, environment expanded; CommandError
    saying what was expected where."""
    import yaml

    try:
        doc = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise CommandError(f"cannot read {path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise CommandError(f"{path} is not YAML: {exc}") from None
    if not isinstance(doc, dict) or set(doc) - set(_TOP) or not isinstance(
            doc.get("projects"), list):
        raise CommandError(f"{path}: expected a mapping with one key 'projects' holding a list")
    projects = []
    for i, item in enumerate(doc["projects"]):
        where = f"projects[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) \
                or not item["name"].strip():
            raise CommandError(f"{where}: expected a mapping with a non-empty 'name'")
        unknown = set(item) - set(_PROJECT)
        if unknown:
            raise CommandError(f"{where}: expected keys among {list(_PROJECT)}, got "
                               f"{sorted(unknown)}")
        for key, kind in (("webhooks", list), ("locations", list), ("contracts", dict)):
            if not isinstance(item.get(key, kind()), kind):
                raise CommandError(f"{where}.{key}: expected a {kind.__name__}")
        for key in ("webhooks", "locations"):
            for j, entry in enumerate(item.get(key, [])):
                if not isinstance(entry, dict):
                    raise CommandError(f"{where}.{key}[{j}]: expected a mapping")
        for run_id, entry in item.get("contracts", {}).items():
            if not isinstance(entry, dict):
                raise CommandError(f"{where}.contracts.{run_id}: expected a mapping")
        projects.append(expand(item, where))
    return projects


class Command(BaseCommand):
    help = "Make projects' webhooks, storage locations and run contracts what a YAML file says."

    def add_arguments(self, parser):
        parser.add_argument("file",
                            help="YAML file (see docs/operator-guide.md: Configuration as code)")
        parser.add_argument("--dry-run", action="store_true",
                            help="print what would change, write nothing")
        parser.add_argument("--prune", action="store_true",
                            help="delete the listed projects' endpoints and locations the file "
                                 "does not name")

    def handle(self, *args, **o):
        projects = load(o["file"])
        changes: list[config.Change] = []
        try:
            with transaction.atomic():
                for item in projects:
                    changes += self.apply_project(item, prune=o["prune"])
                if o["dry_run"]:
                    raise _DryRun
        except _DryRun:
            pass
        changed = [c for c in changes if c.action in _WRITES]
        for change in changes:
            self.stdout.write(("would " if o["dry_run"] and change.action in _WRITES
                               else "") + change.line())
        verb = "would change" if o["dry_run"] else "changed"
        self.stdout.write(f"{len(changes)} items, {verb} {len(changed)}")

    def apply_project(self, item: dict, *, prune: bool) -> list[config.Change]:
        name = item["name"].strip()
        project, created = Project.objects.get_or_create(name=name)
        out = [config.Change("project", name, "create")] if created else []

        def run(where: str, fn, *a, **kw):
            try:
                return fn(*a, **kw)
            except config.ConfigError as exc:
                raise CommandError(f"project {name!r}, {where}: {exc}") from None

        named = set()
        for j, entry in enumerate(item.get("webhooks", [])):
            change = run(f"webhooks[{j}]", config.apply_webhook, project, entry)
            named.add(change.key)
            out.append(change)
        urls = set()
        for j, entry in enumerate(item.get("locations", [])):
            change = run(f"locations[{j}]", config.apply_location, project, entry,
                         origin="config")
            urls.add(change.key)
            out.append(change)
        for run_id, entry in item.get("contracts", {}).items():
            row = Run.objects.filter(project=project, run_id=str(run_id)).first()
            if row is None:
                out.append(config.Change("contract", str(run_id), "skipped",
                                         warning="no such run yet: applied once it exists"))
                continue
            out.append(run(f"contracts.{run_id}", config.apply_contract, row, entry))
        if prune:
            for endpoint in WebhookEndpoint.objects.filter(project=project).exclude(
                    name__in=named).order_by("name"):
                if endpoint.name:
                    out.append(config.delete_webhook(project, endpoint.name))
                else:  # an unnamed endpoint has no key a file can name
                    endpoint.delete()
                    out.append(config.Change("webhook", endpoint.url, "delete"))
            for location in StorageLocation.objects.filter(project=project).exclude(
                    url__in=urls).order_by("url"):
                out.append(config.delete_location(project, location.url))
        return out
