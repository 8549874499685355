"""Shared fixtures: a project with an owner, a teammate and an outsider; tokens; the shared
scenarios. Tests run against the database named by DATABASE_URL (the Makefile points it at the
machine's PostgreSQL) or the embedded SQLite."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("RECOVERYDASH_SHARED", REPO.parent / "shared")).resolve()
SCENARIOS = SHARED / "scenarios"


@pytest.fixture(scope="session")
def scenario_loader():
    """``load(name, objects_dir) -> (events, expect)`` from ../shared/scenarios/scenario.py."""
    if not (SCENARIOS / "scenario.py").exists():
        pytest.fail(f"shared scenarios not found at {SCENARIOS} (set RECOVERYDASH_SHARED)")
    sys.path.insert(0, str(SCENARIOS))
    import scenario  # type: ignore

    return scenario.load


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
