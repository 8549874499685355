"""Alert rules from a stored analysis: which conditions hold, and the rows they become."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from recoverydash.alerts.models import Alert, AlertFlip
from recoverydash.alerts.rules import DEFAULT_CONTRACT, conditions, evaluate_run
from recoverydash.runs.models import Analysis, Run

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def result(**overrides):
    base = {
        "health": "ok",
        "last_restorable": {"generation_id": "g78", "update": 78,
                            "committed_at": T0.isoformat()},
        "generations": [
            {"generation_id": "g78", "attempt": 0, "update": 78, "status": "restorable",
             "reasons": []},
        ],
        "restarts": [],
    }
    base.update(overrides)
    return base


def restart(**overrides):
    r = {"attempt": 1, "resumed_from": "g1250", "resumed_update": 1250, "world_size_before": 8,
         "world_size_after": 8, "replayed": 0, "omitted": 0, "recomputed": 48,
         "verdict": "exact", "findings": []}
    r.update(overrides)
    return r


def rules_of(res, now=T0 + timedelta(minutes=5), contract=None, ended=False, received=None):
    found = conditions(res, dict(contract or DEFAULT_CONTRACT), now=now, first_event_at=T0,
                       last_received_at=received or now, ended=ended)
    return [(c.rule, c.subject, c.severity) for c in found]


def test_it_finds_nothing_for_a_healthy_run():
    assert rules_of(result()) == []


def test_it_fires_checkpoint_stale_past_the_contract_age():
    assert rules_of(result(), now=T0 + timedelta(seconds=3600)) == []
    assert rules_of(result(), now=T0 + timedelta(seconds=3601)) == [
        ("checkpoint_stale", "", "warning")]
    assert rules_of(result(), now=T0 + timedelta(seconds=7201)) == [
        ("checkpoint_stale", "", "critical")]
    contract = dict(DEFAULT_CONTRACT, max_checkpoint_age_s=600)
    assert rules_of(result(), now=T0 + timedelta(seconds=601), contract=contract) == [
        ("checkpoint_stale", "", "warning")]


def test_it_measures_staleness_from_the_first_event_when_nothing_is_restorable():
    res = result(last_restorable=None, generations=[])
    assert rules_of(res, now=T0 + timedelta(seconds=3601)) == [
        ("checkpoint_stale", "", "warning")]


def test_it_measures_staleness_with_the_cores_figure_and_the_stored_clock():
    """The age compared is recovery.figures.seconds_since_last_restorable of the stored result:
    its first_event_at wins over the run row's, and a limit of 0 makes any age stale."""
    res = result(last_restorable=None, generations=[],
                 first_event_at=(T0 - timedelta(hours=1)).isoformat())
    assert rules_of(res, now=T0 + timedelta(seconds=60)) == [
        ("checkpoint_stale", "", "warning")]  # 3,660 s from the stored first event
    zero = dict(DEFAULT_CONTRACT, max_checkpoint_age_s=0)
    assert rules_of(result(), now=T0 + timedelta(seconds=1), contract=zero) == [
        ("checkpoint_stale", "", "critical")]
    assert rules_of(result(), now=T0, contract=zero) == []  # 0 s is not above 0


def test_it_fires_replay_and_omission_above_the_contract_bounds():
    res = result(restarts=[restart(replayed=64, verdict="replay",
                                   findings=[{"code": "replay", "detail": ""}])])
    assert rules_of(res) == [("restart_replay", "1", "critical")]
    allowed = dict(DEFAULT_CONTRACT, max_replay_samples=64)
    assert rules_of(res, contract=allowed) == []
    res = result(restarts=[restart(omitted=48, verdict="omission")])
    assert rules_of(res) == [("restart_omission", "1", "critical")]


@pytest.mark.parametrize("units, word", [
    ("tokens", "tokens"), ("samples", "positions"), (None, "positions"),
    ("mixed", "positions (samples and tokens)")])
def test_the_replay_and_omission_alerts_say_the_restarts_unit(units, word):
    """docs/definitions.md#units: a restart over a token stratum counts tokens, and its alerts
    say so."""
    extra = {"units": units} if units else {}
    res = result(restarts=[restart(replayed=512, omitted=212, verdict="replay", **extra)])
    strict = dict(DEFAULT_CONTRACT, max_replay_samples=0, max_omission_samples=0)
    found = conditions(res, strict, now=T0 + timedelta(minutes=5),
                       first_event_at=T0, last_received_at=T0 + timedelta(minutes=5),
                       ended=False)
    assert {c.rule: c.summary for c in found} == {
        "restart_replay": f"Attempt 1 replayed 512 committed {word} (contract allows 0).",
        "restart_omission": f"Attempt 1 skipped 212 {word} that were never trained on "
                            "(contract allows 0)."}


def test_it_ignores_unverified_restarts_for_replay_and_omission():
    res = result(restarts=[restart(replayed=64, verdict="unverified")])
    assert rules_of(res) == []


def test_it_fires_generation_rejected_until_a_newer_generation_is_restorable():
    rejected = {"generation_id": "g1100", "attempt": 0, "update": 1100, "status": "rejected",
                "reasons": [{"code": "shard_missing", "detail": "rank3"}]}
    res = result(generations=[result()["generations"][0], rejected])
    assert rules_of(res) == [("generation_rejected", "g1100", "warning")]
    newer = {"generation_id": "g1200", "attempt": 1, "update": 1200, "status": "restorable",
             "reasons": []}
    res = result(generations=[result()["generations"][0], rejected, newer])
    assert rules_of(res) == []


def test_it_fires_no_restorable_generation_when_every_committed_one_is_rejected():
    rejected = {"generation_id": "g1", "attempt": 0, "update": 10, "status": "rejected",
                "reasons": [{"code": "digest_mismatch", "detail": ""}]}
    res = result(last_restorable=None, generations=[rejected])
    assert ("no_restorable_generation", "", "critical") in rules_of(res)


def test_it_fires_restart_findings():
    findings = [{"code": c, "detail": ""} for c in
                ("resumed_from_unrestorable", "dataset_version_changed", "world_size_changed")]
    res = result(restarts=[restart(findings=findings, world_size_after=4)])
    assert rules_of(res) == [("dataset_version_changed", "1", "warning"),
                             ("resumed_from_unrestorable", "1", "critical"),
                             ("world_size_changed", "1", "info")]


def test_a_restart_whose_samples_are_unknown_fires_restart_unverified_not_replay():
    """docs/definitions.md#alert-rules: an unverified restart fires no replay or omission rule;
    when an order changed and its sample ids were not recorded, restart_unverified (warning)."""
    why = ("order changed and sample ids were not recorded: replay and omission unknown "
           "(main epoch 0)")
    res = result(restarts=[restart(verdict="unverified", replayed=0, omitted=0, findings=[
        {"code": "order_changed", "detail": "main epoch 0 under order 'b'"},
        {"code": "samples_unknown", "detail": why}])])
    found = conditions(res, DEFAULT_CONTRACT, now=T0, first_event_at=T0, last_received_at=T0,
                       ended=False)
    assert [(c.rule, c.subject, c.severity, c.settled) for c in found] == [
        ("restart_unverified", "1", "warning", True)]
    assert found[0].summary == (
        f"Attempt 1's restart is unverified: {why}. Record the samples of every order (a "
        "span's indices) to know what it replayed or skipped.")
    # an unverified restart still waiting for its first update says nothing yet
    assert rules_of(result(restarts=[restart(verdict="unverified", findings=[
        {"code": "order_changed", "detail": ""}])])) == []


def test_a_restart_whose_predecessor_is_unknown_fires_restart_unverified_with_the_reason():
    """docs/definitions.md#alert-rules: a restart unverified because nothing of the attempts
    before it reached the server (finding predecessor_unknown: the first attempt heard of
    resumed) pages restart_unverified (warning) with the reason in words; not while its first
    update is incomplete, and no replay or omission rule for it."""
    why = ("attempt 1 is the first attempt the server heard of, and it resumed from 'gX' at "
           "update 3: nothing of the attempts before it arrived, so what they consumed is "
           "unknown: replay and omission unknown; positions before the resume are not counted "
           "as omissions")
    findings = [{"code": "predecessor_unknown", "detail": why},
                {"code": "resumed_from_unknown", "detail": "generation 'gX' is not known"}]
    res = result(restarts=[restart(verdict="unverified", replayed=0, omitted=0,
                                   findings=findings)])
    found = conditions(res, DEFAULT_CONTRACT, now=T0, first_event_at=T0, last_received_at=T0,
                       ended=False)
    assert [(c.rule, c.subject, c.severity, c.settled, c.detail) for c in found] == [
        ("restart_unverified", "1", "warning", True, "predecessor unknown")]
    assert found[0].summary == (
        f"Attempt 1's restart is unverified: {why}. Report every attempt from its start and a "
        "data cursor for every stratum in the manifest to know what a restart replayed or "
        "skipped.")
    # k's first update not fully in yet: nothing is told
    assert rules_of(result(restarts=[restart(verdict="unverified", findings=findings + [
        {"code": "incomplete_first_update", "detail": ""}])])) == []


def test_the_cores_predecessor_unknown_restarts_page_restart_unverified():
    """End to end from the core: the first attempt heard of resumed an unknown generation
    (restarts.first_restart), and an unseen writer's manifest found without a data cursor
    (restarts.unseen_writer): each restart_unverified (warning), no replay or omission rule."""
    import hashlib

    from recoverydash.recovery import (
        AttemptRecord,
        GenerationRecord,
        LedgerRecord,
        RunInput,
        analyze,
    )

    def unseen_writer(found: bool) -> RunInput:
        """tests/recovery/test_shapes.py::unseen_writer: attempt 1, the first heard of, resumes
        gX (update 3) and commits updates 4..6; ``found``: gX's manifest (attempt 0's, no data
        cursor) was found in storage."""
        records = [LedgerRecord(1, u, None, 100.0 + u, [{"stratum": "main", "epoch": 0,
                                                         "ranges": [[u * 20 - 20, u * 20]]}])
                   for u in range(4, 7)]
        attempt = AttemptRecord(1, started_at=50.0, world_size=1, global_batch_size=20,
                                sampler={"epoch_length": {"main": 120}},
                                resumed_from={"generation_id": "gX", "update": 3,
                                              "cursor": [{"stratum": "main", "epoch": 0,
                                                          "position": 60}]})
        parts = ["model", "optimizer", "scheduler", "rng", "data_progress"]
        objects = [{"uri": f"file:///c/gX/{c}", "shard": "rank0", "component": c, "size": 1,
                    "sha256": hashlib.sha256(c.encode()).hexdigest()} for c in parts]
        manifest = {"schema_revision": 1, "generation_id": "gX", "update": 3, "world_size": 1,
                    "required_shards": ["rank0"], "components": parts, "objects": objects,
                    "attempt": 0, "data_progress": {"cursor": []}, "committed_at": None}
        gens = [GenerationRecord("gX", 0, None, manifests=[manifest], committed_at=40.0,
                                 object_checks={o["uri"]: "ok" for o in objects})] if found else []
        return RunInput("unseen", [attempt], records, [], gens, first_event_at=50.0)

    for run in (unseen_writer(found=False), unseen_writer(found=True)):
        res = analyze(run, now=200.0).to_dict()
        found = [c for c in conditions(res, DEFAULT_CONTRACT, now=T0, first_event_at=T0,
                                       last_received_at=T0, ended=True)
                 if c.rule.startswith("restart")]
        assert [(c.rule, c.subject, c.severity, c.settled) for c in found] == [
            ("restart_unverified", "1", "warning", True)]
        assert found[0].summary.startswith("Attempt 1's restart is unverified: ")


def test_restart_unverified_groups_restarts_unverified_for_any_reason():
    from recoverydash.alerts.rules import group_summary
    items = [{"subject": "1", "summary": "", "detail": "predecessor unknown"},
             {"subject": "3", "summary": "", "detail": "predecessor unknown"}]
    assert group_summary("restart_unverified", items) == (
        "2 restarts are unverified: replay and omission unknown (attempts 1, 3)")


def test_dataset_version_changed_says_which_version_the_restart_changed_to():
    from recoverydash.alerts.rules import group_summary

    findings = [{"code": "dataset_version_changed", "detail": "dataset_version 'v1' -> 'v2'"}]
    res = result(restarts=[restart(findings=findings)])
    found = [c for c in conditions(res, DEFAULT_CONTRACT, now=T0, first_event_at=T0,
                                   last_received_at=T0, ended=False)
             if c.rule == "dataset_version_changed"]
    assert [c.summary for c in found] == [
        "Attempt 1 runs on another dataset version than the lineage it resumed: "
        "dataset_version 'v1' -> 'v2'."]
    items = [{"subject": s, "severity": "warning", "summary": "", "detail": d} for s, d in
             (("1", "dataset_version 'v1' -> 'v2'"), ("2", "dataset_version 'v2' -> 'v3'"))]
    assert group_summary("dataset_version_changed", items) == (
        "2 restarts changed the dataset version: dataset_version 'v1' -> 'v2', "
        "dataset_version 'v2' -> 'v3' (attempts 1, 2)")


def test_it_fires_run_silent_and_not_for_an_ended_run(settings):
    settings.RECOVERYDASH_RUN_SILENT_S = 60
    now = T0 + timedelta(minutes=5)
    assert rules_of(result(), now=now, received=now - timedelta(seconds=61)) == [
        ("run_silent", "", "warning")]
    assert rules_of(result(), now=now, received=now - timedelta(seconds=61), ended=True) == []


@pytest.mark.django_db
def test_it_opens_keeps_and_resolves_alert_rows_without_flapping(project):
    run = Run.objects.create(project=project, run_id="r1", first_event_at=T0,
                             last_received_at=T0)
    Analysis.objects.create(run=run, result=result(), health="ok")
    late = T0 + timedelta(hours=2)
    Run.objects.filter(pk=run.pk).update(last_received_at=late)
    run.refresh_from_db()
    flips = evaluate_run(run, now=late)
    assert [(f.alert.rule, f.new_state) for f in flips] == [("checkpoint_stale", "firing")]
    assert evaluate_run(run, now=late + timedelta(seconds=30)) == []  # still holds: no flip
    alert = Alert.objects.get(rule="checkpoint_stale")
    assert alert.dedup_key == "r1:checkpoint_stale:" and alert.state == "firing"
    # a new restorable generation clears it
    fresh = result(last_restorable={"generation_id": "g99", "update": 99,
                                    "committed_at": late.isoformat()})
    Analysis.objects.filter(run=run).update(result=fresh)
    run.refresh_from_db()
    flips = evaluate_run(run, now=late + timedelta(seconds=60))
    assert [(f.alert.rule, f.old_state, f.new_state) for f in flips] == [
        ("checkpoint_stale", "firing", "resolved")]
    assert AlertFlip.objects.count() == 2


@pytest.mark.django_db
def test_it_keeps_a_restart_alert_until_a_person_resolves_it_and_never_reopens_it(project):
    run = Run.objects.create(project=project, run_id="r2", first_event_at=T0,
                             last_received_at=T0)
    res = result(restarts=[restart(omitted=48, verdict="omission")])
    Analysis.objects.create(run=run, result=res, health="failing")
    now = T0 + timedelta(minutes=1)
    [flip] = evaluate_run(run, now=now)
    alert = flip.alert
    assert alert.rule == "restart_omission" and alert.subject == "1"
    alert.change_state("acknowledged", by="oncall")
    assert evaluate_run(run, now=now) == []
    alert.refresh_from_db()
    assert alert.state == "acknowledged"
    alert.change_state("resolved", by="oncall")
    assert evaluate_run(run, now=now) == []
    assert Alert.objects.filter(run=run).count() == 1


def test_it_says_when_restorable_generations_lie_outside_the_live_lineage():
    res = result(last_restorable=None)  # g78 restorable, but the live lineage is unknown
    [c] = conditions(res, dict(DEFAULT_CONTRACT), now=T0 + timedelta(minutes=5),
                     first_event_at=T0, last_received_at=T0 + timedelta(minutes=5), ended=False)
    assert c.rule == "no_restorable_generation"
    assert c.summary.startswith("No restorable generation in the live lineage: g78 restorable")
