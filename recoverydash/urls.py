"""URL map: the v1 API under /api/v1/, the dashboard at the root, Django admin at /admin/."""

from django.contrib import admin
from django.urls import include, path

from recoverydash.ingest.api import api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    path("", include("recoverydash.dashboard.urls")),
]
