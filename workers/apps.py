"""The workers as a Django app: loading it creates the Celery app (``workers.celery``) when
Django starts, in every process (web, worker, beat, management commands, tests), and makes it
the default app, so ``recoverydash.runs.queue.enqueue`` sends by task name through
``celery.current_app`` without importing ``workers``."""

from django.apps import AppConfig


class WorkersConfig(AppConfig):
    name = "workers"
    label = "workers"
    verbose_name = "Celery workers"

    def ready(self) -> None:
        from workers import celery  # noqa: F401  (creates, configures and sets the app)
