"""Alert rules fire on settled evidence only (docs/definitions.md#settled-evidence): a generation
committed and not decided yet is a *maybe* for the rules that would read it as absent, up to
RECOVERYDASH_UNDECIDED_BOUND_S after its commit; a condition that waits for one never opens an
alert nor adds a subject, and never clears one either. An alert subject that clears on a fact
that was already there when it joined is a flap (docs/definitions.md#flaps), counted on the
alert."""

from __future__ import annotations

from datetime import timedelta

import pytest

from recoverydash.alerts import evaluation
from recoverydash.alerts.models import Alert, AlertFlip
from recoverydash.alerts.rules import DEFAULT_CONTRACT, conditions, evaluate_run
from recoverydash.runs.models import Analysis, Run, clock_of
from tests.alerts.test_grouping import NOW, make_run, set_result

pytestmark = pytest.mark.django_db

BOUND = 600.0


@pytest.fixture(autouse=True)
def bound(settings):
    settings.RECOVERYDASH_UNDECIDED_BOUND_S = BOUND
    settings.RECOVERYDASH_FLAP_WINDOW_S = 900.0


def gen(u, status, code=None):
    return {"generation_id": f"u{u}", "attempt": 0, "update": u, "status": status,
            "reasons": [{"code": code, "detail": "x"}] if code else []}


def undecided(*updates, ago=18.0, live=True, reasons=()):
    return [{"generation_id": f"u{u}", "update": u, "live": live, "reasons": list(reasons),
             "committed_at": (NOW - timedelta(seconds=ago)).isoformat()} for u in updates]


def res(generations, undecided=(), last=None):
    by_status: dict = {}
    for g in generations:
        by_status[g["status"]] = by_status.get(g["status"], 0) + 1
    return {"health": "at_risk", "generations": generations, "restarts": [],
            "last_restorable": last, "undecided": list(undecided),
            "generations_summary": {"total": len(generations), "shown": len(generations),
                                    "by_status": by_status}}


def restorable(u, at):
    return {"generation_id": f"u{u}", "update": u, "committed_at": at.isoformat()}


def found(result, now=NOW, contract=None):
    return {(c.rule, c.subject): c for c in conditions(
        result, dict(contract or DEFAULT_CONTRACT), now=now, first_event_at=NOW - timedelta(
            minutes=5), last_received_at=now, ended=False)}


def rules(run):
    return sorted(Alert.objects.filter(run=run).values_list("rule", "state"))


# --- no_restorable_generation --------------------------------------------------------------------

def test_two_generations_not_verified_yet_hold_back_no_restorable_generation():
    # issue 26: a normal restart; u2 and u4 committed 18 s ago, not verified yet; u6 rejected
    holding = found(res([gen(2, "committed"), gen(4, "committed"),
                         gen(6, "rejected", "data_cursor_mismatch")], undecided(4, 2)))
    c = holding[("no_restorable_generation", "")]
    assert c.settled is False
    assert c.summary == ("None of the 3 committed generation(s) is restorable (1 rejected, 2 not "
                         "decided): a failure now would restart from scratch; u4, u2 not "
                         "decided yet.")
    # u6 is rejected and nothing newer may supersede it: that one is settled
    assert holding[("generation_rejected", "u6")].settled is True


def test_it_pages_no_restorable_generation_once_an_undecided_one_outlives_the_bound():
    holding = found(res([gen(2, "committed"), gen(4, "committed")],
                        undecided(4, ago=30) + undecided(2, ago=BOUND + 61,
                                                        reasons=["storage_unverified"])))
    c = holding[("no_restorable_generation", "")]
    assert c.settled is True and c.severity == "critical"
    assert c.summary == ("None of the 2 committed generation(s) is restorable (0 rejected, 2 not "
                         "decided): a failure now would restart from scratch; u2 committed "
                         "11m 01s ago and still undecided (storage_unverified), past the "
                         "10m 00s the rules wait.")


def test_an_undecided_generation_off_the_live_lineage_is_no_maybe():
    holding = found(res([gen(6, "rejected", "stale_state"), gen(8, "committed")],
                        undecided(8, live=False)))
    assert holding[("no_restorable_generation", "")].settled is True
    # but it may still supersede u6
    assert holding[("generation_rejected", "u6")].settled is False


def test_the_false_page_of_a_normal_restart_never_opens(project):
    run = make_run(project, res([gen(2, "committed"), gen(4, "committed")], undecided(4, 2)))
    assert evaluate_run(run, now=NOW) == []
    later = NOW + timedelta(seconds=15)
    run = set_result(run, res([gen(2, "restorable"), gen(4, "restorable")],
                              last=restorable(4, NOW - timedelta(seconds=18))))
    assert evaluate_run(run, now=later) == []
    assert rules(run) == []


def test_evidence_on_its_way_keeps_an_open_alert_as_it_is(project):
    # opened on settled evidence (u2 rejected, nothing undecided); u4 is committed after it
    run = make_run(project, res([gen(2, "rejected", "shard_missing")]))
    [opened] = [f for f in evaluate_run(run, now=NOW)
                if f.alert.rule == "no_restorable_generation"]
    later = NOW + timedelta(seconds=30)
    run = set_result(run, res([gen(2, "rejected", "shard_missing"), gen(4, "committed")],
                              undecided(4, ago=-20)))
    # u4 may still be restorable: the alert neither resolves nor changes state
    assert [f for f in evaluate_run(run, now=later)
            if f.alert.rule == "no_restorable_generation"] == []
    assert Alert.objects.get(pk=opened.alert_id).state == "firing"
    # u4 restorable: committed after the alert opened, a new fact, not a flap
    run = set_result(run, res([gen(2, "rejected", "shard_missing"), gen(4, "restorable")],
                              last=restorable(4, NOW + timedelta(seconds=20))))
    [resolved] = [f for f in evaluate_run(run, now=later + timedelta(seconds=5))
                  if f.alert.rule == "no_restorable_generation"]
    assert resolved.new_state == "resolved"
    assert resolved.cleared == [{
        "subject": "", "held_s": 35.0, "cause": "changed", "flap": False,
        "detail": "u4 restorable, committed at 2026-11-01T00:05:20+00:00"}]
    assert resolved.reason == ("the condition cleared: the run: u4 restorable, committed at "
                               "2026-11-01T00:05:20+00:00")
    assert Alert.objects.get(pk=opened.alert_id).flaps == 0


def test_an_alert_cleared_by_a_fact_older_than_itself_is_counted_as_a_flap(project):
    # a result stored before results listed their undecided generations: u4 was committed
    # (18 s before) but nothing said so; the rule fired, and u4 proved restorable 10 s later
    run = make_run(project, {**res([gen(2, "rejected", "shard_missing"), gen(4, "committed")]),
                             "undecided": None})
    [opened] = [f for f in evaluate_run(run, now=NOW)
                if f.alert.rule == "no_restorable_generation"]
    run = set_result(run, res([gen(2, "rejected", "shard_missing"), gen(4, "restorable")],
                              last=restorable(4, NOW - timedelta(seconds=18))))
    [resolved] = [f for f in evaluate_run(run, now=NOW + timedelta(seconds=10))
                  if f.alert.rule == "no_restorable_generation"]
    [cleared] = resolved.cleared
    assert (cleared["cause"], cleared["flap"], cleared["held_s"]) == ("unchanged", True, 10.0)
    assert resolved.reason == (
        "the condition cleared: the run: u4 restorable, committed at 2026-11-01T00:04:42+00:00, "
        "before this was told: the evidence was not settled (a flap)")
    assert Alert.objects.get(pk=opened.alert_id).flaps == 1
    assert AlertFlip.objects.get(pk=resolved.pk).cleared == resolved.cleared


# --- generation_rejected -----------------------------------------------------------------------

def test_a_rejected_generation_waits_for_a_newer_one_not_decided_yet(project):
    # make demo, fault (i): u6 rejected (data_cursor_mismatch, rightly) while u8 and u10 were
    # committed and not verified yet; u8 proved restorable 16 s later. Before: opened and
    # resolved within 16 s (a flap); now: nothing opens
    run = make_run(project, res([gen(4, "restorable"), gen(6, "rejected", "data_cursor_mismatch"),
                                 gen(8, "committed"), gen(10, "committed")], undecided(10, 8),
                                last=restorable(4, NOW - timedelta(seconds=60))))
    assert evaluate_run(run, now=NOW) == []
    run = set_result(run, res([gen(4, "restorable"), gen(6, "rejected", "data_cursor_mismatch"),
                               gen(8, "restorable"), gen(10, "restorable")],
                              last=restorable(10, NOW - timedelta(seconds=18))))
    assert evaluate_run(run, now=NOW + timedelta(seconds=16)) == []
    assert rules(run) == []


def test_a_rejected_generation_pages_once_the_newer_one_outlives_the_bound():
    holding = found(res([gen(6, "rejected", "data_cursor_mismatch"), gen(8, "committed")],
                        undecided(8, ago=BOUND + 1)))
    assert holding[("generation_rejected", "u6")].settled is True
    # an undecided one below it supersedes nothing: no wait
    holding = found(res([gen(4, "committed"), gen(6, "rejected", "data_cursor_mismatch")],
                        undecided(4)))
    assert holding[("generation_rejected", "u6")].settled is True


# --- checkpoint_stale -----------------------------------------------------------------------------

LIMIT = 3600.0


def stale_result(committed_ago, undecided_entries):
    last = restorable(2, NOW - timedelta(seconds=committed_ago))
    return res([gen(2, "restorable"), gen(4, "committed")], undecided_entries, last=last)


def test_checkpoint_stale_waits_for_a_generation_committed_before_the_limit_was_crossed():
    # u2 restorable 3,610 s ago; u4 committed 30 s ago (3,580 s after u2: before the crossing)
    c = found(stale_result(3610, undecided(4, ago=30)))[("checkpoint_stale", "")]
    assert c.settled is False
    # committed 5 s ago, after the limit was crossed (3,605 s after u2): no wait
    c = found(stale_result(3610, undecided(4, ago=5)))[("checkpoint_stale", "")]
    assert c.settled is True
    # committed before the crossing but over the bound ago: no wait, and said
    c = found(stale_result(3610 + BOUND, undecided(4, ago=BOUND + 30)))[("checkpoint_stale", "")]
    assert c.settled is True
    assert c.summary == (
        "No restorable checkpoint for 1h 10m (limit 1h 00m); last restorable u2 at update 2; u4 "
        "committed 10m 30s ago and still undecided (not verified, or the ledger not settled at "
        "its update), past the 10m 00s the rules wait.")


def test_the_periodic_evaluation_waits_as_the_full_one_does(project, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    result = stale_result(3610, undecided(4, ago=30))
    run = Run.objects.create(project=project, run_id="beat", first_event_at=NOW - timedelta(
        hours=2), last_received_at=NOW)
    Analysis.objects.create(run=run, result=result, health="at_risk", clock=clock_of(result))
    assert Analysis.objects.get(run=run).clock["undecided"][0]["committed_at"] == (
        NOW - timedelta(seconds=30)).timestamp()
    assert evaluation.evaluate_chunk([run.pk], now=NOW) == 1
    assert rules(run) == []
    # the bound passes with u4 still undecided: the beat alone opens it
    assert evaluation.evaluate_chunk([run.pk], now=NOW + timedelta(seconds=BOUND)) == 1
    assert rules(run) == [("checkpoint_stale", "firing")]


def test_a_live_attempt_resumed_from_a_generation_not_seen_yet_holds_no_restorable_back():
    # the demo's run c under load: attempt 1 resumed from u4, whose manifest is still on its way
    # (commit event lost: discovery finds it); u2 is restorable in attempt 0's lineage only
    elsewhere = [gen(2, "restorable")]
    unseen = [{"generation_id": "u4", "update": 4, "live": True,
               "reasons": ["resumed_from_not_seen"],
               "committed_at": (NOW - timedelta(seconds=2)).isoformat()}]
    c = found(res(elsewhere, unseen))[("no_restorable_generation", "")]
    assert c.settled is False
    assert c.summary == ("No restorable generation in the live lineage: u2 restorable in another "
                         "attempt's lineage only (the live attempt resumed from a state "
                         "recoverydash cannot tie to them); u4 not decided yet.")
    # never found within the bound: the page goes out, saying what it waited for
    unseen[0]["committed_at"] = (NOW - timedelta(seconds=BOUND + 1)).isoformat()
    c = found(res(elsewhere, unseen))[("no_restorable_generation", "")]
    assert c.settled is True
    assert c.summary.endswith("; u4, which the live attempt resumed from 10m 01s ago, never "
                              "reached the server nor was found in storage within the 10m 00s "
                              "the rules wait.")
