"""When each reporter of an attempt was last heard from (runs.models.RankSeen): a row per
(attempt, reporter), written by ingest for the batch's reporters only, keeping the later time;
and the migration that carried the old ``Attempt.rank_seen_at`` map into rows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from ingest_support import event, post, update

from recoverydash.runs.models import Attempt, RankSeen, Run

T1 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def seen_times(attempt) -> dict:
    return dict(RankSeen.objects.filter(attempt=attempt).values_list("reporter", "seen_at"))


def rank_seen_statements(queries) -> list[str]:
    return [q["sql"] for q in queries if "runs_rankseen" in q["sql"]]


@pytest.mark.django_db
def test_a_request_writes_one_row_per_reporter_it_carries_not_one_per_rank_of_the_world(
        client, ingest_token, monkeypatch):
    monkeypatch.setattr(timezone, "now", lambda: T1)
    post(client, ingest_token, [update("a", 1, rank=0)])
    att = Attempt.objects.get()
    RankSeen.objects.bulk_create(RankSeen(attempt=att, reporter=str(r), seen_at=T1)
                                 for r in range(1, 4096))  # a 4,096-rank world heard at T1
    t2 = T1 + timedelta(seconds=60)
    monkeypatch.setattr(timezone, "now", lambda: t2)
    noted = []
    real = RankSeen.note.__func__
    monkeypatch.setattr(RankSeen, "note", classmethod(
        lambda cls, reporters, at: noted.append(real(cls, reporters, at)) or noted[-1]))
    with CaptureQueriesContext(connection) as queries:
        assert post(client, ingest_token, [update("b", 2, rank=7), update("c", 3, rank=7)]) \
            .status_code == 202
    [statement] = rank_seen_statements(queries.captured_queries)
    assert statement.startswith('INSERT INTO "runs_rankseen"') and "ON CONFLICT" in statement
    assert noted == [1]  # one row: rank 7, whatever the world size
    times = seen_times(att)
    assert len(times) == 4096
    assert times["7"] == t2 and {k for k, v in times.items() if v == t2} == {"7"}
    assert not [q for q in queries.captured_queries if "rank_seen_at" in q["sql"]]


@pytest.mark.django_db
def test_an_aggregate_notes_each_of_its_ranks_and_its_reporter(client, ingest_token,
                                                               monkeypatch):
    monkeypatch.setattr(timezone, "now", lambda: T1)
    post(client, ingest_token, [event(
        "update_aggregate", "agg", update=1, ranks=[
            {"rank": r, "spans": [{"stratum": "main", "epoch": 0, "ranges": [[r, r + 1]]}]}
            for r in range(5)])])
    assert seen_times(Attempt.objects.get()) == {"0": T1, "1": T1, "2": T1, "3": T1, "4": T1,
                                                 "c": T1}


@pytest.mark.django_db
def test_note_writes_16384_reporters_in_one_statement_and_never_moves_a_time_back(project):
    att = Attempt.objects.create(run=Run.objects.create(project=project, run_id="big"),
                                 attempt=0)
    t2 = T1 + timedelta(seconds=30)
    world = [str(r) for r in range(16384)]
    with CaptureQueriesContext(connection) as queries:
        assert RankSeen.note({att.pk: world}, t2) == 16384
    assert len(rank_seen_statements(queries.captured_queries)) == 1
    assert RankSeen.objects.filter(attempt=att, seen_at=t2).count() == 16384
    # an earlier-clocked batch committed later: ranks 0-9 keep t2; a new reporter takes T1
    assert RankSeen.note({att.pk: world[:10] + ["c"]}, T1) == 11
    assert RankSeen.objects.filter(attempt=att, seen_at=t2).count() == 16384
    assert RankSeen.objects.get(attempt=att, reporter="c").seen_at == T1
    # a later one moves them forward; the same reporter twice is one row
    t3 = t2 + timedelta(microseconds=1)
    assert RankSeen.note({att.pk: ["3", "3", "c"]}, t3) == 2
    assert {k: v for k, v in seen_times(att).items() if v == t3} == {"3": t3, "c": t3}
    assert RankSeen.note({}, t3) == 0
    assert att.ranks_seen() == {**{k: t2 for k in world}, "3": t3, "c": t3}
    assert list(att.ranks_seen())[:3] == ["0", "1", "2"] and list(att.ranks_seen())[-1] == "c"


@pytest.mark.django_db(transaction=True)
def test_the_migration_carries_each_attempts_map_into_rows():
    from django.db.migrations.executor import MigrationExecutor

    before = [("runs", "0013_input_seq")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    executor.loader.build_graph()
    apps = executor.loader.project_state(before).apps
    P, R, A = (apps.get_model("runs", m) for m in ("Project", "Run", "Attempt"))
    run = R.objects.create(project=P.objects.create(name="old"), run_id="r")
    t2 = T1 + timedelta(seconds=1, microseconds=250)
    first = A.objects.create(run=run, attempt=0, rank_seen_at={
        "0": T1.isoformat(), "1": t2.isoformat(), "c": t2.isoformat()})
    second = A.objects.create(run=run, attempt=1, rank_seen_at={
        "0": t2.isoformat(), "1": "not a time"})
    silent = A.objects.create(run=run, attempt=2)
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
    assert Attempt.objects.get(pk=first.pk).ranks_seen() == {"0": T1, "1": t2, "c": t2}
    assert Attempt.objects.get(pk=second.pk).ranks_seen() == {"0": t2}
    assert Attempt.objects.get(pk=silent.pk).ranks_seen() == {}
    assert RankSeen.objects.count() == 4
