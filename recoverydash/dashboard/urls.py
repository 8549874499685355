"""Dashboard URLs (server-rendered pages for on-call people), sign-in included."""

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.urls import path

from recoverydash.dashboard import docs, drills, locations, views


urlpatterns = [
    path("login/", auth_views.LoginView.as_view(
        redirect_authenticated_user=True,
        extra_context={"failure_limit": settings.AXES_FAILURE_LIMIT}), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", views.fleet, name="fleet"),
    path("runs/<int:pk>/", views.run_detail, name="run"),
    path("runs/<int:pk>/charts.json", views.run_charts, name="run_charts"),
    path("runs/<int:pk>/contract/", views.run_contract, name="run_contract"),
    # <path:>, not <str:>: a generation id stored before the identifier rule (or found in
    # storage) may hold a "/", and every page that links it must still render.
    path("runs/<int:pk>/generations/<path:generation_id>/", views.generation_detail,
         name="generation"),
    path("runs/<int:pk>/restarts/<int:attempt>/", views.restart_detail, name="restart"),
    path("alerts/", views.alerts, name="alerts"),
    path("drills/", drills.drills, name="drills_all"),
    path("projects/<int:pk>/drills/", drills.drills, name="drills"),
    path("docs/<slug:name>/", docs.page, name="docs_page"),
    path("alerts/bulk/", views.alert_bulk, name="alert_bulk"),
    path("alerts/<int:pk>/", views.alert_detail, name="alert_detail"),
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
