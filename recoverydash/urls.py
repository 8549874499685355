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

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics, name="metrics"),
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    path("", include("recoverydash.dashboard.urls")),
]
