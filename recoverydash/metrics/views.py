"""``GET /metrics``: the Prometheus text format, for a token of scope ``metrics`` (its project) or
the operator's basic-auth credentials (every project).

* ``Authorization: Bearer <token>`` with scope ``metrics``: that project's runs, its service
  figures (analysis lag, verification queue, deliveries) and its ingest counters. A token reaches
  only its project (docs/ingest-v1.md#authentication); 401, 403 and 429 as for the API.
* ``Authorization: Basic ...`` with ``RECOVERYDASH_METRICS_USERNAME`` and
  ``RECOVERYDASH_METRICS_PASSWORD`` (both set; off otherwise): every project, and the ingest
  answers that carried no live token (``project=""``).

Everything is read when Prometheus scrapes (:mod:`.collector`, :mod:`.counters`); nothing is
analysed on the way.
"""

from __future__ import annotations

import base64
import binascii
import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from recoverydash.ingest.auth import bearer_value, require_token
from recoverydash.ingest.errors import ApiError, Unauthorized, error_response
from recoverydash.runs.models import SCOPE_METRICS, Project

from .collector import RecoverydashCollector
from .counters import counter_registry

CHALLENGE = 'Bearer realm="recoverydash", Basic realm="recoverydash metrics"'


def basic_auth_ok(request: HttpRequest) -> bool:
    """True when the request carries the operator's basic-auth credentials (compared in
    constant time); False without them, or when no operator credentials are set."""
    user, password = settings.RECOVERYDASH_METRICS_USERNAME, settings.RECOVERYDASH_METRICS_PASSWORD
    scheme, _, value = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    if not (user and password) or scheme.lower() != "basic":
        return False
    try:
        given = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return False
    given_user, _, given_password = given.partition(":")
    return hmac.compare_digest(given_user.encode(), user.encode()) & \
        hmac.compare_digest(given_password.encode(), password.encode())


class _OnlyProject:
    """The samples of ``registry`` whose ``project`` label is ``name`` (a token's scrape)."""

    def __init__(self, registry, name: str):
        self.registry, self.name = registry, name

    def collect(self):
        for family in self.registry.collect():
            family.samples = [s for s in family.samples if s.labels.get("project") == self.name]
            yield family


def scrape(projects, only_project: str | None = None, accept: str | None = None
           ) -> tuple[bytes, str]:
    """``(body, content type)``: the exposition of ``projects`` (a Project queryset) and of the
    ingest counters (only those of ``only_project`` when given), in the format the scraper's
    ``Accept`` asks for (Prometheus text, or OpenMetrics; prometheus_client chooses)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RecoverydashCollector(projects))
    counters = counter_registry()
    registry.register(_OnlyProject(counters, only_project) if only_project is not None
                      else counters)
    encoder, content_type = choose_encoder(accept)
    return encoder(registry), content_type


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Parse the credentials, check access, answer the exposition (module docstring)."""
    accept = request.META.get("HTTP_ACCEPT")
    if basic_auth_ok(request):
        body, content_type = scrape(Project.objects.all(), accept=accept)
    else:
        try:
            if bearer_value(request) is None:
                raise Unauthorized("expected Authorization: Bearer <token> with scope metrics, "
                                   "or the operator's basic-auth credentials")
            token = require_token(request, SCOPE_METRICS)
        except ApiError as exc:
            response = error_response(exc)
            if response.status_code == 401:
                response["WWW-Authenticate"] = CHALLENGE
            return response
        body, content_type = scrape(Project.objects.filter(pk=token.project_id),
                                    token.project.name, accept)
    response = HttpResponse(body, content_type=content_type)
    response["Cache-Control"] = "no-store"
    return response
