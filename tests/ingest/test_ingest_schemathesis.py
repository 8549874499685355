"""A schemathesis pass over the served OpenAPI document: generated requests (valid and invalid
per the schema) never get a 500, and every answer matches the documented statuses, content
types and shapes."""

from __future__ import annotations

import pytest
import schemathesis
from django.core.wsgi import get_wsgi_application
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

schema = schemathesis.openapi.from_wsgi("/api/v1/openapi.json", get_wsgi_application())

# Not negative_data_rejection: it counts unknown query parameters, which are ignored, as invalid
# data accepted; invalid events are covered by test_ingest_properties.py.
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]


@pytest.fixture
def keep_test_connection():
    """The raw WSGI app closes the database connection after each request, as in production;
    inside a test transaction it must stay open (Django's test client does the same)."""
    from django.core import signals
    from django.db import close_old_connections

    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.mark.django_db
@pytest.mark.usefixtures("keep_test_connection")
@schema.parametrize()
@settings(max_examples=50, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                 HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])
def test_it_answers_every_generated_request_without_a_server_error(case, full_token):
    case.call_and_validate(headers={"Authorization": f"Bearer {full_token}"}, checks=CHECKS)
