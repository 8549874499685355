"""Dashboard URLs (server-rendered pages for on-call people), sign-in included."""

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.urls import path, register_converter

from recoverydash.dashboard import changes, compare, docs, drills, locations, views
from recoverydash.dashboard.converters import SegmentConverter

register_converter(SegmentConverter, "seg")


urlpatterns = [
    path("login/", auth_views.LoginView.as_view(
        redirect_authenticated_user=True,
        extra_context={"failure_limit": settings.AXES_FAILURE_LIMIT}), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", views.fleet, name="fleet"),
    # A run's pages are addressed by its project's name and its run id (converters.py says what
    # a segment may hold); the numeric /runs/<pk>/ addresses of before answer a member with a
    # permanent redirect to them and anyone else with the same 404 as an unknown run.
    path("p/<seg:project>/runs/<seg:run_id>/", views.run_detail, name="run"),
    path("p/<seg:project>/runs/<seg:run_id>/charts.json", views.run_charts, name="run_charts"),
    path("p/<seg:project>/runs/<seg:run_id>/contract/", views.run_contract,
         name="run_contract"),
    path("p/<seg:project>/runs/<seg:run_id>/generations/<seg:generation_id>/",
         views.generation_detail, name="generation"),
    path("p/<seg:project>/runs/<seg:run_id>/restarts/<int:attempt>/", views.restart_detail,
         name="restart"),
    path("p/<seg:project>/runs/<seg:run_id>/monitoring/<str:action>/", views.run_pause,
         name="run_pause"),
    path("runs/<int:pk>/", views.old_run_url, {"page": "run"}, name="old_run"),
    path("runs/<int:pk>/charts.json", views.old_run_url, {"page": "run_charts"}),
    path("runs/<int:pk>/contract/", views.old_run_url, {"page": "run_contract"}),
    path("runs/<int:pk>/generations/<path:generation_id>/", views.old_run_url,
         {"page": "generation"}),
    path("runs/<int:pk>/restarts/<int:attempt>/", views.old_run_url, {"page": "restart"}),
    path("alerts/", views.alerts, name="alerts"),
    path("changes/", changes.changes, name="changes"),
    path("compare/", compare.compare, name="compare"),
    path("drills/", drills.drills, name="drills_all"),
    path("projects/<int:pk>/drills/", drills.drills, name="drills"),
    path("docs/", docs.page, name="docs_index"),
    path("docs/<path:name>/", docs.page, name="docs_page"),
    path("docs-files/<path:path>", docs.asset, name="docs_asset"),
    path("alerts/bulk/", views.alert_bulk, name="alert_bulk"),
    path("alerts/<int:pk>/", views.alert_detail, name="alert_detail"),
    path("alerts/<int:pk>/note/", views.alert_note, name="alert_note"),
    path("alerts/<int:pk>/assign/", views.alert_assign, name="alert_assign"),
    path("alerts/<int:pk>/<str:action>/", views.alert_action, name="alert_action"),
    path("projects/", views.projects, name="projects"),
    path("projects/<int:pk>/", views.project_detail, name="project"),
    path("projects/<int:pk>/tokens/", views.token_create, name="token_create"),
    path("projects/<int:pk>/runbooks/", views.runbook_save, name="runbook_save"),
    path("projects/<int:pk>/tokens/<int:token_pk>/revoke/", views.token_revoke,
         name="token_revoke"),
    path("projects/<int:pk>/locations/", locations.locations, name="locations"),
    path("projects/<int:pk>/locations/<int:location_pk>/delete/", locations.location_delete,
         name="location_delete"),
    path("projects/<int:pk>/webhooks/", views.webhook_create, name="webhook_create"),
    path("projects/<int:pk>/webhooks/<int:endpoint_pk>/delete/", views.webhook_delete,
         name="webhook_delete"),
    path("projects/<int:pk>/webhooks/<int:endpoint_pk>/test/", views.webhook_test,
         name="webhook_test"),
]
