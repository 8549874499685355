"""Dashboard views: parse the request, check access, call one function of ``queries``,
``charts`` or ``actions``, and answer. Pages that change while someone watches them answer
``?fragment=live`` with just their live region, which static/dashboard/live.js polls."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse, HttpResponsePermanentRedirect, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from recoverydash.dashboard import actions, charts, queries
from recoverydash.dashboard.forms import (
    AlertFilterForm,
    AlertNoteForm,
    BulkAlertForm,
    ContractForm,
    FleetFilterForm,
    RunbookForm,
    SilenceForm,
    TokenForm,
    WebhookForm,
)
from recoverydash.storage.confirm import confirm_last_restorable

LIVE = "live"


def _page(request, template: str, context: dict):
    """Render the whole page, or only its live region for the poller."""
    if request.GET.get("fragment") == LIVE:
        name = template.replace("dashboard/", "dashboard/live/")
        return render(request, name, context)
    return render(request, template, context)


def _back(request, fallback: str) -> HttpResponseRedirect:
    target = request.POST.get("next") or request.GET.get("next") or ""
    if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()},
                                           require_https=request.is_secure()):
        target = fallback
    return HttpResponseRedirect(target)


@login_required
def fleet(request):
    projects = list(queries.visible_projects(request.user).order_by("name"))
    form = FleetFilterForm(request.GET or None, projects=projects)
    filters = form.filters()
    fleet_page = queries.fleet(request.user, **filters)
    narrowed = {k: v for k, v in filters.items() if k in FleetFilterForm.NARROWING}
    return _page(request, "dashboard/fleet.html",
                 {"f": fleet_page, "rows": fleet_page.rows, "form": form, "projects": projects,
                  "now": timezone.now(), "filtered": bool(narrowed),
                  "query": {**narrowed, "view": fleet_page.view, "sort": fleet_page.sort},
                  "sorts": queries.FLEET_SORTS})


@login_required
def run_detail(request, project: str, run_id: str):
    run = queries.run_named(request.user, project, run_id)
    confirm_last_restorable(run)  # the first card names what is in storage now
    summary = queries.run_summary(run)
    context = {"s": summary, "run": run, "silence_form": SilenceForm(), "now": timezone.now()}
    if request.GET.get("fragment") != LIVE:
        context["charts"] = charts.run_figures(run)
    return _page(request, "dashboard/run.html", context)


@login_required
def run_charts(request, project: str, run_id: str):
    run = queries.run_named(request.user, project, run_id)
    return HttpResponse(charts.run_figures(run)["json"], content_type="application/json")


@login_required
def generation_detail(request, project: str, run_id: str, generation_id: str):
    run = queries.run_named(request.user, project, run_id)
    detail = queries.generation_detail(run, generation_id)
    return _page(request, "dashboard/generation.html", {"run": run, "d": detail})


@login_required
def restart_detail(request, project: str, run_id: str, attempt: int):
    run = queries.run_named(request.user, project, run_id)
    detail = queries.restart_detail(run, attempt)
    return render(request, "dashboard/restart.html", {"run": run, "d": detail})


@login_required
def run_contract(request, project: str, run_id: str):
    run = queries.run_named(request.user, project, run_id)
    current = queries.contract_of(run)
    if request.method == "POST":
        form = ContractForm(request.POST)
        if form.is_valid():
            actions.save_contract(run, form.cleaned_data)
            messages.success(request, "Contract saved. Alerts use it from the next evaluation.")
            return redirect(run_url(run))
    else:
        form = ContractForm(initial=ContractForm.initial_for(current))
    return render(request, "dashboard/contract.html",
                  {"run": run, "form": form, "current": current})


@login_required
@require_POST
def run_pause(request, project: str, run_id: str, action: str):
    """Pause or resume the run's monitoring (``runs.monitoring``), as the signed-in user."""
    from recoverydash.runs import monitoring

    run = queries.run_named(request.user, project, run_id)
    if action not in ("pause", "resume"):
        raise Http404("no such action")
    note = (request.POST.get("note") or "").strip()[:2000]
    name = request.user.get_username()
    if action == "pause":
        if monitoring.pause(run, name, note):
            messages.success(request, "Monitoring paused: no alert of this run opens, changes or "
                                      "pages until its next event, which resumes it.")
        else:
            messages.info(request, "Monitoring was already paused.")
    elif monitoring.resume(run, name, note):
        messages.success(request, "Monitoring resumed: the alert rules judge this run again "
                                  "from its next evaluation.")
    else:
        messages.info(request, "Monitoring was not paused.")
    return redirect(run_url(run))


def run_url(run, page: str = "run", *args) -> str:
    """The path of one of ``run``'s pages (``run``, ``run_charts``, ``run_contract``,
    ``generation`` with a generation id, ``restart`` with an attempt): /p/<project>/runs/<run_id>/
    and below. ``run.project`` should be loaded (select_related) by the caller."""
    return reverse(page, args=[run.project.name, run.run_id, *args])


@login_required
def old_run_url(request, pk: int, page: str, **rest):
    """A page's address of before (/runs/<pk>/...): a member gets a permanent redirect to the
    page's address by project and run id, the query string kept; anyone else the 404 of an
    unknown run."""
    run = queries.run_for(request.user, pk)
    target = run_url(run, page, *rest.values())
    query = request.META.get("QUERY_STRING", "")
    return HttpResponsePermanentRedirect(target + ("?" + query if query else ""))


@login_required
def alerts(request):
    which = request.GET.get("state", "open")
    if which not in queries.ALERT_LISTS:
        which = "open"
    form = AlertFilterForm(request.GET or None)
    filters = form.filters(request.user.get_username())
    rows, counts = queries.alert_list(request.user, which, **filters)
    shown = {k: v for k, v in (form.cleaned_data if form.is_bound and form.is_valid()
                               else {}).items() if k in AlertFilterForm.NARROWING and v}
    return _page(request, "dashboard/alerts.html",
                 {"alerts": rows, "counts": counts, "which": which, "form": form,
                  "filtered": bool(shown), "query": {**shown, "state": which},
                  "silence_form": SilenceForm(), "now": timezone.now()})


@login_required
def alert_detail(request, pk: int):
    alert = queries.alert_for(request.user, pk)
    return render(request, "dashboard/alert.html",
                  {"d": queries.alert_detail(alert), "a": alert, "silence_form": SilenceForm(),
                   "note_form": AlertNoteForm(), "now": timezone.now()})


@login_required
@require_POST
def alert_note(request, pk: int):
    """Add the signed-in user's note to an alert (``alerts.actions.add_note``)."""
    from recoverydash.alerts.actions import add_note

    alert = queries.alert_for(request.user, pk)
    form = AlertNoteForm(request.POST)
    if form.is_valid():
        add_note(alert, request.user.get_username(), form.cleaned_data["text"])
        messages.success(request, "Note added.")
    else:
        messages.error(request, "Write a note of at most 4,000 characters.")
    return redirect(reverse("alert_detail", args=[alert.pk]) + "#timeline")


@login_required
@require_POST
def alert_assign(request, pk: int):
    """Make a member of the run's project (or nobody) the alert's owner
    (``alerts.actions.assign``), as the signed-in user."""
    from recoverydash.alerts.actions import assign

    alert = queries.alert_for(request.user, pk)
    name = request.user.get_username()
    owner = (request.POST.get("owner") or "").strip()
    owner = name if owner == "me" else owner
    if owner and owner not in queries.project_members(alert.run.project_id) \
            and owner != name:
        messages.error(request, f"{owner} is not a member of {alert.run.project.name}.")
    elif assign(alert, name, owner) is None:
        messages.info(request, "The owner is unchanged.")
    else:
        messages.success(request, f"Assigned to {owner}." if owner else "Nobody owns it now.")
    return _back(request, reverse("alert_detail", args=[alert.pk]))


@login_required
@require_POST
def alert_bulk(request):
    form = BulkAlertForm(request.POST)
    if not form.is_valid():
        for errors in form.errors.values():
            messages.error(request, " ".join(errors))
        return _back(request, reverse("alerts"))
    data = form.cleaned_data
    chosen = queries.alerts_for(request.user, data["ids"])
    changed = actions.bulk(chosen, data["action"], request.user.get_username(),
                           data.get("seconds") or 0)
    verb = {"acknowledge": "acknowledged", "resolve": "resolved", "silence": "silenced"}
    messages.success(request, f"{changed} of {len(chosen)} alert(s) {verb[data['action']]}.")
    return _back(request, reverse("alerts"))


@login_required
@require_POST
def alert_action(request, pk: int, action: str):
    alert = queries.alert_for(request.user, pk)
    name = request.user.get_username()
    if action == "acknowledge":
        flip = actions.acknowledge(alert, name)
        messages.success(request, f"Alert {alert.rule} acknowledged." if flip else
                         f"Alert {alert.rule} was already {alert.state}.")
    elif action == "resolve":
        flip = actions.resolve(alert, name)
        messages.success(request, f"Alert {alert.rule} resolved." if flip else
                         f"Alert {alert.rule} was already resolved.")
    elif action == "silence":
        form = SilenceForm(request.POST)
        if form.is_valid():
            actions.silence(alert, name, form.cleaned_data["seconds"])
            messages.success(request, f"Notifications of {alert.rule} silenced until "
                                      f"{alert.silenced_until:%Y-%m-%d %H:%M} UTC.")
        else:
            messages.error(request, "Choose how long to silence the alert for.")
    else:
        messages.error(request, f"Unknown action {action!r}.")
    return _back(request, reverse("alerts"))


@login_required
def projects(request):
    rows = list(queries.visible_projects(request.user).order_by("name"))
    if len(rows) == 1:
        return redirect("project", pk=rows[0].pk)
    return render(request, "dashboard/projects.html", {"projects": rows})


def _project_page(request, project, **extra):
    settings_ = queries.project_settings(project)
    context = {"p": settings_, "token_form": TokenForm(), "webhook_form": WebhookForm(),
               "runbook_form": RunbookForm(),
               "api_url": request.build_absolute_uri("/api/v1/"),
               # the endpoint list refreshes itself while a test notification is on its way
               "testing": any(w.test_status == "pending" for w in settings_.webhooks)}
    context.update(extra)
    return _page(request, "dashboard/project.html", context)


NEW_TOKEN_KEY = "new_token"


@login_required
def project_detail(request, pk: int):
    project = queries.project_for(request.user, pk)
    # The token created just before the redirect: shown on this one answer, then gone from the
    # session (a reload shows the list, never a second token nor the first one again).
    created = request.session.pop(NEW_TOKEN_KEY, None)
    if created and created.get("project") == project.pk:
        row = project.tokens.filter(pk=created["pk"]).first()
        response = _project_page(request, project, new_token=created["raw"], new_token_row=row)
        response["Cache-Control"] = "no-store"
        return response
    return _project_page(request, project)


@login_required
@require_POST
def token_create(request, pk: int):
    project = queries.project_for(request.user, pk)
    form = TokenForm(request.POST)
    if not form.is_valid():
        return _project_page(request, project, token_form=form)
    row, raw = actions.create_token(project, form.cleaned_data["name"],
                                    form.cleaned_data["scopes"])
    # POST-redirect-GET: the raw token waits in the server-side session for the next page view
    # only (project_detail pops it), so reloading that page creates nothing.
    request.session[NEW_TOKEN_KEY] = {"project": project.pk, "pk": row.pk, "raw": raw}
    return redirect(reverse("project", args=[project.pk]) + "#new-token")


@login_required
@require_POST
def runbook_save(request, pk: int):
    project = queries.project_for(request.user, pk)
    form = RunbookForm(request.POST)
    if not form.is_valid():
        return _project_page(request, project, runbook_form=form)
    actions.save_runbook(project, form.cleaned_data["rule"], form.cleaned_data["url"])
    messages.success(request, f"Runbook of {form.cleaned_data['rule']} "
                              f"{'saved' if form.cleaned_data['url'] else 'removed'}.")
    return redirect(reverse("project", args=[project.pk]) + "#runbooks")


@login_required
@require_POST
def token_revoke(request, pk: int, token_pk: int):
    project = queries.project_for(request.user, pk)
    if actions.revoke_token(project, token_pk):
        messages.success(request, "Token revoked: requests carrying it now get 401.")
    else:
        messages.error(request, "No such live token.")
    return redirect("project", pk=project.pk)


@login_required
@require_POST
def webhook_create(request, pk: int):
    project = queries.project_for(request.user, pk)
    form = WebhookForm(request.POST, project=project)
    if not form.is_valid():
        return _project_page(request, project, webhook_form=form)
    endpoint = actions.create_webhook(project, **form.cleaned_data)
    messages.success(request, f"Endpoint {endpoint.name or endpoint.url} added. Send a test to "
                              "check that it answers.")
    if form.resolve_warning:
        messages.warning(request, f"{form.resolve_warning}.")
    return redirect("project", pk=project.pk)


@login_required
@require_POST
def webhook_delete(request, pk: int, endpoint_pk: int):
    project = queries.project_for(request.user, pk)
    if actions.delete_webhook(project, endpoint_pk):
        messages.success(request, "Endpoint deleted.")
    return redirect("project", pk=project.pk)


@login_required
@require_POST
def webhook_test(request, pk: int, endpoint_pk: int):
    project = queries.project_for(request.user, pk)
    queries.webhook_for(project, endpoint_pk)
    webhook_id = actions.send_test_notification(project, endpoint_pk)
    messages.info(request, f"Test notification {webhook_id} queued: its result appears with the "
                           "endpoint once a worker has sent it.")
    return redirect(reverse("project", args=[project.pk]) + "#webhooks")
