"""The periodic alert evaluation reaches every run that has not ended, in chunks of a stable
order, whatever the number of runs; its re-analyses go to the oldest analyses first."""

from __future__ import annotations

from datetime import timedelta
from unittest import mock

import pytest
from django.utils import timezone

from recoverydash.alerts import evaluation
from recoverydash.runs.models import Analysis, Run

pytestmark = pytest.mark.django_db


def fleet(project, count, ended=()):
    runs = Run.objects.bulk_create([Run(project=project, run_id=f"r{i:05d}")
                                    for i in range(count)])
    now = timezone.now()
    Analysis.objects.bulk_create([Analysis(run=r, health="ended" if i in ended else "ok",
                                           computed_at=now - timedelta(minutes=i))
                                  for i, r in enumerate(runs)])
    return runs


def test_it_reaches_every_run_not_ended_chunk_by_chunk(project, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    runs = fleet(project, 2_503, ended={5, 2_000})
    seen = []
    with mock.patch.object(evaluation, "notify", side_effect=lambda run: seen.append(run.pk)), \
            mock.patch.object(evaluation, "analyze") as analyze:
        assert evaluation.evaluate_all(chunk=200, refresh_budget=0) == 2_501
    analyze.assert_not_called()
    assert seen == [r.pk for i, r in enumerate(runs) if i not in (5, 2_000)]  # each once, in order


def test_it_hands_each_chunk_to_a_worker_task(project, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = False
    runs = fleet(project, 450)
    with mock.patch.object(evaluation, "enqueue", return_value=True) as enqueue:
        assert evaluation.evaluate_all(chunk=200, refresh_budget=0) == 450
    chunks = [c.args for c in enqueue.call_args_list]
    assert [name for name, _, _ in chunks] == ["workers.tasks.evaluate_alerts_chunk"] * 3
    assert [pk for _, pks, _ in chunks for pk in pks] == [r.pk for r in runs]
    assert [len(pks) for _, pks, _ in chunks] == [200, 200, 50]


def test_it_analyses_again_the_oldest_analyses_first_within_the_budget(project, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    runs = fleet(project, 30)  # run i analysed i minutes ago
    Run.objects.update(ingest_seq=1)
    again = []
    with mock.patch.object(evaluation, "notify"), \
            mock.patch.object(evaluation, "analyze", side_effect=lambda run: again.append(run.pk)):
        assert evaluation.evaluate_all(chunk=7, refresh_after_s=120, refresh_budget=5) == 30
    assert sorted(again) == sorted(r.pk for r in runs[25:30])  # the five oldest
