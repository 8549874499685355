"""Every Celery task is time-limited: a soft limit raises inside the task, a hard one ends the
pool process (RECOVERYDASH_TASK_SOFT_TIME_LIMIT_S / RECOVERYDASH_TASK_TIME_LIMIT_S), and the
periodic work includes the sweep that re-runs what a dead worker left."""

from django.conf import settings

from workers.celery import BEAT_SCHEDULE, app


def test_every_task_has_a_soft_and_a_hard_time_limit():
    assert (app.conf.task_soft_time_limit, app.conf.task_time_limit) == (
        settings.RECOVERYDASH_TASK_SOFT_TIME_LIMIT_S, settings.RECOVERYDASH_TASK_TIME_LIMIT_S)
    assert (settings.RECOVERYDASH_TASK_SOFT_TIME_LIMIT_S,
            settings.RECOVERYDASH_TASK_TIME_LIMIT_S) == (300, 360)
    ours = {name: task for name, task in app.tasks.items() if name.startswith("workers.")}
    assert len(ours) >= 9
    for name, task in ours.items():  # a task may set tighter limits of its own, never none
        soft = task.soft_time_limit or app.conf.task_soft_time_limit
        hard = task.time_limit or app.conf.task_time_limit
        assert 0 < soft < hard <= 360, name


def test_the_sweeps_of_storage_run_every_minute():
    assert BEAT_SCHEDULE["sweep-verifications"]["task"] == "workers.tasks.sweep_verifications"
    assert BEAT_SCHEDULE["sweep-verifications"]["schedule"] == 60.0
    assert BEAT_SCHEDULE["recheck-storage"]["schedule"] == 60.0
