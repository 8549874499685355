from django.apps import AppConfig


class AlertsConfig(AppConfig):
    name = "recoverydash.alerts"
    label = "alerts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # the alert rules are evaluated in the transaction that stores an analysis
        from recoverydash.alerts.evaluation import evaluate_stored
        from recoverydash.runs.analysis import analysis_stored

        analysis_stored.connect(evaluate_stored, dispatch_uid="alerts.evaluate_stored")
