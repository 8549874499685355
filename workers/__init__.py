"""Celery workers: the app, the tasks (thin wrappers) and the beat schedule."""
