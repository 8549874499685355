"""Fixtures of the whole suite: a project with an owner, a teammate and an outsider; tokens; the
worked scenarios of ``tests/scenarios/``. Tests run against the database named by DATABASE_URL
(the Makefile points it at the machine's PostgreSQL) or the embedded SQLite."""

from __future__ import annotations

import pytest
from scenarios import load as load_scenario


@pytest.fixture(scope="session", autouse=True)
def _static_root_of_the_tests(tmp_path_factory):
    """An empty STATIC_ROOT for the whole session: pages name static files by their own names,
    whether or not a demo or `make serve` collected hashed ones into this checkout's var/
    (recoverydash.dashboard.staticfiles). Tests of the collected files set their own."""
    from django.conf import settings
    from django.contrib.staticfiles.storage import staticfiles_storage
    from django.core.files.storage import storages
    from django.utils.functional import empty

    settings.STATIC_ROOT = tmp_path_factory.mktemp("static-root")
    # the storage made before this (a module that loads the WSGI app at collection) is cached in
    # Django's storages as well as in the lazy object
    storages._storages.pop("staticfiles", None)
    staticfiles_storage._wrapped = empty


@pytest.fixture(scope="session")
def scenario_loader():
    """``load(name, objects_dir) -> (events, expect)``: a scenario of ``tests/scenarios/`` with
    its checkpoint objects written under ``objects_dir`` (see tests/scenarios/README.md)."""
    return load_scenario


@pytest.fixture
def project(db):
    from recoverydash.runs.models import Project

    return Project.objects.create(name="alpha")


@pytest.fixture
def other_project(db):
    from recoverydash.runs.models import Project

    return Project.objects.create(name="beta")


def _issue(project, scopes):
    from recoverydash.runs.models import ApiToken

    return ApiToken.issue(project, scopes)[1]


@pytest.fixture
def ingest_token(project):
    """A raw token of ``project`` with scope ingest only."""
    return _issue(project, ["ingest"])


@pytest.fixture
def read_token(project):
    """A raw token of ``project`` with scope read only."""
    return _issue(project, ["read"])


@pytest.fixture
def full_token(project):
    """A raw token of ``project`` with scopes ingest and read."""
    return _issue(project, ["ingest", "read"])


@pytest.fixture
def other_token(other_project):
    """A raw ingest+read token of another project (for isolation tests)."""
    return _issue(other_project, ["ingest", "read"])


@pytest.fixture
def declare_location():
    """``declare(project, folder_or_uri, **fields) -> StorageLocation``: declare where a
    project's checkpoints live. The server reads a manifest's objects only under its project's
    storage locations, so a test whose objects must be verified declares their folder."""

    def declare(project, where, **fields):
        from pathlib import Path

        from recoverydash.storage.models import StorageLocation

        url = str(where) if "://" in str(where) else Path(where).resolve().as_uri()
        return StorageLocation.objects.get_or_create(project=project, url=url,
                                                     defaults=fields)[0]

    return declare
