"""The beat's bulk read of the silence rules' input (alerts.rules.silences_of: an aggregate per
newest attempt, the rows of silent ranks only) gives exactly the conditions of the full read
(silence_of: every reporter's row)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from seen_rows import set_ranks_seen

from recoverydash.alerts.rules import DEFAULT_CONTRACT, clock_conditions, silence_of, silences_of
from recoverydash.runs.models import Analysis, Attempt, Run

T0 = datetime(2026, 11, 1, tzinfo=UTC)
NOW = T0 + timedelta(hours=1)
CLOCK = {"update_interval": {"attempt": 0, "median_s": 10.0}}  # rank limit 120 s, run 900 s


def conds(silence):
    return [(c.rule, c.subject, c.severity, c.summary)
            for c in clock_conditions({}, dict(DEFAULT_CONTRACT), now=NOW, first_event_at=NOW,
                                      last_received_at=NOW, silence=silence)]


CASES = {  # reporter -> seconds of silence at NOW
    "all-fresh": {"0": 1, "1": 2, "c": 3},
    "one-gone": {str(r): 5 for r in range(16)} | {"9": 400, "11": 121.5},
    "at-the-limit": {"0": 1, "1": 120, "2": 120.000001},  # 120 s is not above 120 s
    "all-over-rank-limit": {"0": 130, "1": 500},           # every rank: nobody keeps reporting
    "run-silent": {"0": 901, "1": 5000},
    "one-reporter": {"c": 300},
    "ended": {"0": 1, "1": 400},
}


@pytest.mark.django_db
def test_the_bulk_read_gives_exactly_the_full_reads_conditions(project):
    runs = {}
    for name, ages in CASES.items():
        run = Run.objects.create(project=project, run_id=name, first_event_at=T0,
                                 last_received_at=NOW)
        Analysis.objects.create(run=run, result=CLOCK, clock=CLOCK, health="ok")
        Attempt.objects.create(run=run, attempt=0, ended_at=T0)  # an older attempt's rows
        set_ranks_seen(Attempt.objects.get(run=run, attempt=0), {"0": T0})
        att = Attempt.objects.create(run=run, attempt=1 if name != "ended" else 2,
                                     ended_at=NOW if name == "ended" else None)
        set_ranks_seen(att, {k: NOW - timedelta(seconds=a) for k, a in ages.items()})
        runs[name] = (run, att)
    Run.objects.create(project=project, run_id="no-attempt")
    clock = {"update_interval": {"attempt": 1, "median_s": 10.0}}
    newest = {run.pk: (att.pk, att.attempt, att.ended_at) for run, att in runs.values()}
    with CaptureQueriesContext(connection) as queries:
        bulk = silences_of(newest, {pk: clock for pk in newest}, NOW)
    assert len(queries.captured_queries) == 2  # the aggregate, the silent ranks' rows
    for name, (run, _att) in runs.items():
        full = silence_of(run, NOW, clock)
        assert conds(bulk[run.pk]) == conds(full), name
        assert bulk[run.pk]["reporters"] == len(CASES[name])
    assert [c[:2] for c in conds(bulk[runs["one-gone"][0].pk])] == [
        ("rank_silent", "9"), ("rank_silent", "11")]
    assert [c[:2] for c in conds(bulk[runs["at-the-limit"][0].pk])] == [("rank_silent", "2")]
    assert conds(bulk[runs["all-over-rank-limit"][0].pk]) == []
    assert [c[0] for c in conds(bulk[runs["run-silent"][0].pk])] == ["run_silent"]
    assert conds(bulk[runs["one-reporter"][0].pk]) == conds(bulk[runs["all-fresh"][0].pk]) == []
    # only the rows of the attempts with a rank past the limit while another is not are read
    assert bulk[runs["one-gone"][0].pk]["ages"] == {"9": 400.0, "11": 121.5}
    with CaptureQueriesContext(connection) as queries:
        quiet = silences_of({k: v for k, v in newest.items()
                             if k in (runs["all-fresh"][0].pk, runs["run-silent"][0].pk)},
                            {pk: clock for pk in newest}, NOW)
    assert len(queries.captured_queries) == 1 and len(quiet) == 2
    assert silences_of({}, {}, NOW) == {}
