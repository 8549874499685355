"""URL map: the v1 API under /api/v1/, the dashboard at the root, Django admin at /admin/,
/healthz for load balancers and compose health checks (recoverydash.dashboard.health), and
/metrics for Prometheus (recoverydash.metrics.views)."""

from django.contrib import admin
from django.urls import include, path

from recoverydash.dashboard.health import healthz
from recoverydash.ingest.api import api
from recoverydash.metrics.views import metrics

# A database that does not answer is a 503 with Retry-After, anything else unexpected a 500.
handler500 = "recoverydash.dashboard.health.server_error"
# Under /api/ a path no route matches is a JSON 404 like the API's own errors.
handler404 = "recoverydash.dashboard.health.not_found"

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics, name="metrics"),
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    path("", include("recoverydash.dashboard.urls")),
]
