"""Fixtures of the ingest tests: a generous rate limit (the rate-limit tests set their own),
the process-local limiter unless a test asks for Redis."""

import pytest


@pytest.fixture(autouse=True)
def _generous_rate_limit(settings):
    settings.RECOVERYDASH_RATE_LIMIT_PER_SECOND = 10_000.0
    settings.RECOVERYDASH_RATE_LIMIT_BURST = 100_000
    settings.RECOVERYDASH_REDIS_URL = ""
