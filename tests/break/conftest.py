"""Fixtures of the break tests: a generous rate limit, the process-local limiter, and the
ingest tests' builders on the import path."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "ingest"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


@pytest.fixture(autouse=True)
def _generous_rate_limit(settings):
    settings.RECOVERYDASH_RATE_LIMIT_PER_SECOND = 10_000.0
    settings.RECOVERYDASH_RATE_LIMIT_BURST = 100_000
    settings.RECOVERYDASH_REDIS_URL = ""
