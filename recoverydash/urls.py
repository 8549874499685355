"""URL map: the v1 API under /api/v1/, the dashboard at the root, Django admin at /admin/,
and /healthz for load balancers and compose health checks."""

from django.contrib import admin
from django.db import connection
from django.http import JsonResponse
from django.urls import include, path

from recoverydash.ingest.api import api


def healthz(request):
    """200 ``{"ok": true}`` when the database answers, 503 otherwise."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:  # any database error means not ready
        return JsonResponse({"ok": False, "error": str(exc)[:200]}, status=503)
    return JsonResponse({"ok": True})


urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    path("", include("recoverydash.dashboard.urls")),
]
