"""Forms of the dashboard: they parse and validate; ``actions`` does the writing."""

from __future__ import annotations

from django import forms

from recoverydash.alerts.forms import (
    RoutingKeyCheck,
    check_name,
    check_name_free,
    clean_webhook_url,
)
from recoverydash.alerts.models import SEVERITIES, WebhookEndpoint
from recoverydash.dashboard.actions import SILENCE_CHOICES
from recoverydash.runs.models import DEFAULT_SCOPES, SCOPES

HEALTH_CHOICES = [("", "any health"), ("failing", "failing"), ("at_risk", "at risk"),
                  ("ok", "ok"), ("ended", "ended"), ("unknown", "not analysed yet")]


class FleetFilterForm(forms.Form):
    """The fleet's filters, view, sort and page, all in the URL's query string (a link or a
    reload shows the same list)."""

    project = forms.TypedChoiceField(required=False, coerce=int, empty_value=None)
    health = forms.ChoiceField(required=False, choices=HEALTH_CHOICES)
    q = forms.CharField(required=False, max_length=128, label="run_id contains")
    view = forms.ChoiceField(required=False, choices=[("attention", "needs attention"),
                                                      ("all", "all runs")])
    sort = forms.CharField(required=False, max_length=20)
    page = forms.IntegerField(required=False, min_value=1, max_value=10**6)

    #: what narrows the list (a "clear filters" link is shown when any is set)
    NARROWING = ("project", "health", "q")

    def __init__(self, *args, projects=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["project"].choices = [("", "all projects")] + [(p.pk, p.name)
                                                                    for p in projects]

    def filters(self) -> dict:
        """Cleaned filters; invalid input counts as no filter (a bad link still shows runs)."""
        if not self.is_valid():
            return {}
        return {k: v for k, v in self.cleaned_data.items() if v not in (None, "")}


class AlertFilterForm(forms.Form):
    """The alert list's filters, in the URL's query string: run (part of its id), rule,
    severity and owner (``me``, ``none`` for alerts nobody owns, or a user name)."""

    state = forms.ChoiceField(required=False, choices=[(s, s) for s in
                                                       ("open", "firing", "acknowledged",
                                                        "resolved")])
    run = forms.CharField(required=False, max_length=128, label="Run")
    rule = forms.ChoiceField(required=False, label="Rule")
    severity = forms.ChoiceField(required=False, label="Severity",
                                 choices=[("", "any severity")] + [(s, s) for s in SEVERITIES])
    owner = forms.CharField(required=False, max_length=150, label="Owner")

    #: the filters that narrow the list (the tabs and the live region keep them)
    NARROWING = ("run", "rule", "severity", "owner")

    def __init__(self, *args, **kwargs):
        from recoverydash.alerts.rules import RULES

        super().__init__(*args, **kwargs)
        self.fields["rule"].choices = [("", "any rule")] + [(r, r) for r in RULES]

    def filters(self, username: str) -> dict:
        """Cleaned filters as ``queries.alert_list`` takes them (``owner`` ``me`` is
        ``username``, ``none`` is ""); invalid input counts as no filter."""
        if not self.is_valid():
            return {}
        data = {k: v for k, v in self.cleaned_data.items() if k in self.NARROWING and v}
        if "owner" in data:
            data["owner"] = {"me": username, "none": ""}.get(data["owner"], data["owner"])
        return data


class AlertNoteForm(forms.Form):
    text = forms.CharField(max_length=4000, widget=forms.Textarea(attrs={"rows": 3}),
                           label="Note")


class SilenceForm(forms.Form):
    seconds = forms.TypedChoiceField(choices=SILENCE_CHOICES, coerce=int, label="Silence for")


class BulkAlertForm(forms.Form):
    """Several alerts and one action (``actions.BULK_ACTIONS``); ``seconds`` only for silence."""

    ids = forms.TypedMultipleChoiceField(coerce=int, choices=[], label="Alerts")
    action = forms.ChoiceField(choices=[("acknowledge", "Acknowledge"), ("resolve", "Resolve"),
                                        ("silence", "Silence")])
    seconds = forms.TypedChoiceField(choices=SILENCE_CHOICES, coerce=int, required=False,
                                     empty_value=None, label="Silence for")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # any integer is accepted here; access is checked per alert (queries.alerts_for)
        self.fields["ids"].valid_value = lambda value: str(value).isdigit()

    def clean(self):
        data = super().clean()
        if data.get("action") == "silence" and not data.get("seconds"):
            self.add_error("seconds", "Choose how long to silence the alerts for.")
        return data


class RunbookForm(forms.Form):
    """The runbook URL of one alert rule (empty: remove it)."""

    rule = forms.ChoiceField(choices=[])
    url = forms.URLField(max_length=2000, required=False, assume_scheme="https",
                         label="Runbook URL")

    def __init__(self, *args, **kwargs):
        from recoverydash.alerts.rules import RULES

        super().__init__(*args, **kwargs)
        self.fields["rule"].choices = [(r, r) for r in RULES]


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100, required=False,
                           widget=forms.TextInput(attrs={"placeholder": "e.g. trainer llama-70b"}))
    scopes = forms.MultipleChoiceField(choices=[(s, s) for s in SCOPES],
                                       initial=list(DEFAULT_SCOPES),
                                       widget=forms.CheckboxSelectMultiple)


class WebhookForm(RoutingKeyCheck, forms.ModelForm):
    url = forms.URLField(max_length=2000, assume_scheme="https", label="URL")

    class Meta:
        model = WebhookEndpoint
        fields = ["name", "url", "kind", "min_severity", "routing_key"]
        labels = {"url": "URL", "min_severity": "Minimum severity",
                  "routing_key": "Routing / API key"}
        help_texts = {"routing_key": "PagerDuty: the integration's routing key (32 characters); "
                                     "Opsgenie: the API integration's key. Other kinds take "
                                     "none."}

    #: set by clean_url when the name does not resolve now (saved anyway: DNS may recover)
    resolve_warning = ""

    def __init__(self, *args, project=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.project = project

    def clean_name(self) -> str:
        """A name no other endpoint of the project has (``alerts.forms.check_name_free``), of
        the characters an API path carries (``alerts.forms.check_name``)."""
        name = check_name(self.cleaned_data["name"])
        if self.project is not None:
            check_name_free(self.project, name)
        return name

    def clean_url(self) -> str:
        """The guard of every delivery, applied when the URL is saved
        (``alerts.forms.clean_webhook_url``)."""
        url = self.cleaned_data["url"]
        self.resolve_warning = clean_webhook_url(url)
        return url



class ContractForm(forms.Form):
    """The run's recovery contract (docs/ingest-v1.md#attempt_started ``contract``);
    :meth:`initial_for` shows the contract in force (``alerts.rules.contract_of``: the run's
    values over the core's ``recovery.contract.DEFAULT_CONTRACT``). Bounds are the wire
    contract's: a limit of 0 is legal."""

    max_replay_samples = forms.IntegerField(
        min_value=0, help_text="Positions a restart may replay before restart_replay fires.")
    max_omission_samples = forms.IntegerField(
        min_value=0, help_text="Positions a restart may omit before restart_omission fires.")
    max_checkpoint_age_s = forms.FloatField(
        min_value=0, help_text="Seconds without a restorable checkpoint before checkpoint_stale "
                               "fires.")
    required_components = forms.CharField(
        max_length=1000, help_text="Comma-separated components every generation must hold.")

    def clean_required_components(self) -> list[str]:
        names = [c.strip() for c in self.cleaned_data["required_components"].split(",")]
        names = [c for c in names if c]
        if not names:
            raise forms.ValidationError("Name at least one component.")
        return list(dict.fromkeys(names))

    @classmethod
    def initial_for(cls, contract: dict) -> dict:
        """Initial values from the contract in force (``alerts.rules.contract_of``: every field
        present, defaults included)."""
        return {
            "max_replay_samples": contract["max_replay_samples"],
            "max_omission_samples": contract["max_omission_samples"],
            "max_checkpoint_age_s": contract["max_checkpoint_age_s"],
            "required_components": ", ".join(contract["required_components"]),
        }


__all__ = ["FleetFilterForm", "SilenceForm", "TokenForm", "WebhookForm", "ContractForm",
           "SEVERITIES"]
