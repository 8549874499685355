"""Two batches that create the same new attempt of one run at the same moment (every rank's
first request of a relaunch): both are stored (202) and the attempt exists once, on the raw
end of a batch (PostgreSQL) and on the ORM end. A one-statement variant of the raw end, the run
UPDATE joined to the attempts' read, read the snapshot of before it waited for the run's lock
and answered 500 (uniq_attempt) to about a quarter of such pairs."""

import json
import threading

import pytest
from django.db import connection
from django.test import Client

from recoverydash.ingest import actions
from recoverydash.runs.models import ApiToken, Attempt, Project

pytestmark = pytest.mark.django_db(transaction=True)

PAIRS = 40


def _first_update(attempt: int, rank: int) -> dict:
    return {"event_id": f"a{attempt}-r{rank}", "type": "update_committed", "run_id": "r",
            "attempt": attempt, "rank": rank, "update": 1, "time": "2026-11-01T00:00:05Z",
            "spans": [{"stratum": "main", "epoch": 0, "ranges": [[rank, rank + 1]]}]}


@pytest.mark.skipif("connection.vendor != 'postgresql'",
                    reason="concurrent writers need PostgreSQL (SQLite serialises them)")
@pytest.mark.parametrize("end", ["raw", "orm"])
def test_two_ranks_creating_one_attempt_at_once_are_both_stored(settings, monkeypatch, end):
    settings.RECOVERYDASH_RATE_LIMIT_PER_SECOND = 10_000.0
    settings.RECOVERYDASH_RATE_LIMIT_BURST = 100_000
    settings.RECOVERYDASH_REDIS_URL = ""
    if end == "orm":
        monkeypatch.setattr(actions, "_HOT_TYPES", frozenset())
    project = Project.objects.create(name="p")
    token = ApiToken.issue(project, ["ingest"])[1]
    actions.ingest_batch(project, [_first_update(1000, 0)])  # the run exists already
    statuses: list[int] = []

    def send(attempt: int, rank: int, barrier: threading.Barrier) -> None:
        client = Client(raise_request_exception=False)
        barrier.wait(5)
        answer = client.post("/api/v1/events",
                             data=json.dumps({"events": [_first_update(attempt, rank)]}),
                             content_type="application/json",
                             headers={"Authorization": f"Bearer {token}"})
        statuses.append(answer.status_code)
        connection.close()

    for attempt in range(PAIRS):
        barrier = threading.Barrier(2)
        threads = [threading.Thread(target=send, args=(attempt, rank, barrier)) for rank in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert {s: statuses.count(s) for s in set(statuses)} == {202: 2 * PAIRS}
    assert Attempt.objects.filter(run__project=project).count() == PAIRS + 1
    assert sorted(Attempt.objects.filter(run__project=project, attempt__lt=PAIRS)
                  .values_list("last_update", flat=True)) == [1] * PAIRS
