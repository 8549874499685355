"""``no_restorable_generation`` counts every generation of the run (``generations_summary``),
not only the newest ones the stored result lists in full (docs/definitions.md: listed
generations)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from recoverydash.alerts.rules import DEFAULT_CONTRACT, conditions

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def no_restorable(result):
    found = conditions(result, dict(DEFAULT_CONTRACT), now=T0 + timedelta(seconds=60),
                       first_event_at=T0, last_received_at=T0, ended=False, silence=None)
    return [c.summary for c in found if c.rule == "no_restorable_generation"]


def listed(n, status):
    return [{"generation_id": f"g{i}", "update": i, "status": status} for i in range(n)]


def test_it_counts_the_generations_beyond_the_listed_ones():
    result = {"health": "critical", "generations": listed(200, "rejected"), "restarts": [],
              "last_restorable": None,
              "generations_summary": {"total": 260, "shown": 200,
                                      "by_status": {"committed": 10, "rejected": 250}}}
    # a result stored before it listed its undecided generations: nothing to wait for
    assert no_restorable(result) == [
        "None of the 260 committed generation(s) is restorable (250 rejected, 10 not decided): "
        "a failure now would restart from scratch."]


def test_an_older_restorable_generation_of_another_lineage_is_told_when_none_is_listed():
    result = {"health": "critical", "generations": listed(200, "rejected"), "restarts": [],
              "last_restorable": None,
              "generations_summary": {"total": 203, "shown": 200,
                                      "by_status": {"rejected": 200, "restorable": 3}}}
    assert no_restorable(result) == [
        "No restorable generation in the live lineage: 3 older generation(s) restorable in "
        "another attempt's lineage only (the live attempt resumed from a state recoverydash "
        "cannot tie to them)."]


def test_a_result_stored_without_the_summary_counts_its_list():
    result = {"health": "critical", "generations": listed(3, "rejected"), "restarts": [],
              "last_restorable": None}
    assert no_restorable(result) == [
        "None of the 3 committed generation(s) is restorable: a failure now would restart "
        "from scratch."]
