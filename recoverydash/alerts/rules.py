"""Alert rules (docs/definitions.md#alert-rules) evaluated against a run's stored analysis.

``conditions`` is pure: from the analysis result, the run's contract and the clock to the set of
conditions that hold now. ``evaluate_run`` turns that set into alert rows and flips inside one
transaction: a condition that appears opens an alert (firing); one that clears resolves it.
Two kinds of rule:

- *state* rules (``checkpoint_stale``, ``no_restorable_generation``, ``generation_rejected``,
  ``run_silent``) describe the run now: they resolve themselves when the condition clears, and a
  later episode opens a new alert under the same dedup key;
- *event* rules (``restart_replay``, ``restart_omission``, ``restart_unverified``,
  ``resumed_from_unrestorable``, ``dataset_version_changed``, ``world_size_changed``,
  ``restore_failed``) describe something
  that happened at a restart: the fact never clears, so the alert stays until a person
  resolves it, and is never opened twice for the same restart.

Conditions hold per subject (a generation, a restart); the alerts group them: one open alert per
(run, rule) lists every subject (``Alert.subjects``), so five rejected generations are one alert
"5 generations rejected: stale_state", under one dedup key ``run:rule:`` (``group_key``) that
receivers keep as subjects are added. A state rule's alert resolves when no subject holds any
more; an event rule's alert takes new subjects (a later restart) while open, and a later
episode opens with the new subjects only.

Rules fire on settled evidence only (docs/definitions.md#settled-evidence, ``alerts.settle``): a
condition that holds only because a generation not decided yet is read as absent or bad is not
settled (``Condition.settled``) and neither opens an alert, adds a subject, nor clears one
(:func:`settled_holding`); a subject that leaves records why (``AlertFlip.cleared``) and counts
as a flap (``Alert.flaps``) when the fact that cleared it was already there when it was told.

A condition that holds on consecutive evaluations does not flip anything (no flapping, no
repeated notifications). A subject joining an open alert (a sixth generation rejected, a second
restart replaying), or leaving it while others still hold, is one flip that keeps the state
(``old_state == new_state``, ``AlertFlip.change`` naming the subjects added and removed): a
timeline entry and a notification of the alert as it is then, under the same dedup key, as
Alertmanager re-sends a group when an alert joins it. An acknowledged alert stays acknowledged.

A new rule is one ``conditions`` branch and one ``RULES`` entry (a rule missing from ``RULES`` is
a state rule about the run, its subjects listed generically).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from recoverydash.alerts import settle
from recoverydash.alerts.models import Alert, AlertFlip

# The contract defaults and every figure a rule compares are defined once, in the core.
from recoverydash.recovery.contract import DEFAULT_CONTRACT, effective_contract
from recoverydash.recovery.counting import unit_word
from recoverydash.recovery.figures import (
    RANK_SILENT_INTERVALS,
    RUN_SILENT_INTERVALS,
    attempt_silent,
    checkpoint_stale,
    reporter_ages,
    seconds_since_last_restorable,
    silence_limit,
    silent_reporters,
    youngest_silent,
)
from recoverydash.recovery.result import AnalysisResult, ClockFields, GenerationEntry, RestartEntry
from recoverydash.runs.models import Analysis

__all__ = ["CLOCK_RULES", "DEFAULT_CONTRACT", "EVENT_RULES", "RULES", "Condition", "Rule",
           "clock_conditions", "conditions", "contract_of", "duration", "evaluate_run",
           "group_summary", "rule_info", "settled_holding"]


@dataclass(frozen=True)
class Rule:
    """What the alerts need to know of a rule besides its condition.

    ``sticky``: an event rule (the fact never clears; resolved by a person); ``subject``: what
    its subjects are, ``generation`` (a generation id), ``restart`` (an attempt number), ``rank``
    or ``run`` (the subject is ""); ``many``: the grouped summary when several subjects hold,
    formatted with ``n`` (how many), ``details`` (``: `` + the conditions' details, or "") and
    ``subjects`` (the first few subjects)."""

    sticky: bool = False
    subject: str = "run"
    many: str = "{n} subjects hold{details} ({subjects})"


#: Every rule of docs/definitions.md#alert-rules. Adding a rule: an entry here and a branch in
#: ``conditions``.
RULES: dict[str, Rule] = {
    "checkpoint_stale": Rule(),
    "run_silent": Rule(),
    "no_restorable_generation": Rule(),
    "generation_rejected": Rule(subject="generation",
                                many="{n} generations rejected{details} ({subjects})"),
    "restart_replay": Rule(True, "restart",
                           "{n} restarts replayed more than the contract allows "
                           "(attempts {subjects})"),
    "restart_omission": Rule(True, "restart",
                             "{n} restarts skipped more than the contract allows "
                             "(attempts {subjects})"),
    "restart_unverified": Rule(True, "restart",
                               "{n} restarts are unverified: replay and omission unknown "
                               "(attempts {subjects})"),
    "resumed_from_unrestorable": Rule(True, "restart",
                                      "{n} restarts resumed from a state that is not restorable "
                                      "(attempts {subjects})"),
    "dataset_version_changed": Rule(True, "restart",
                                    "{n} restarts changed the dataset version"
                                    "{details} (attempts {subjects})"),
    "world_size_changed": Rule(True, "restart",
                               "{n} restarts changed the world size (attempts {subjects})"),
    # subjects "attempt:generation" (docs/ingest-v1.md#restore_failed)
    "restore_failed": Rule(True, "restore", "{n} restores failed{details} ({subjects})"),
    # subjects the reporters ("<rank>", "c") of the live attempt (docs/definitions.md#silence)
    "rank_silent": Rule(subject="rank",
                        many="{n} ranks stopped reporting while the others keep going "
                             "(ranks {subjects})"),
}

EVENT_RULES = tuple(name for name, r in RULES.items() if r.sticky)


def rule_info(rule: str) -> Rule:
    """The ``RULES`` entry of ``rule``; a state rule about the run for a rule not listed."""
    return RULES.get(rule) or Rule()


@dataclass(frozen=True)
class Condition:
    """A rule that holds for a subject (a generation id, an attempt number, or "" for the run).
    ``detail``: the short words a grouped summary lists (a generation's reason codes).
    ``settled``: False when it holds only because evidence that is on its way is not in yet
    (docs/definitions.md#settled-evidence: an undecided generation read as absent or bad): such
    a condition never opens an alert nor adds a subject; it keeps a subject an open alert
    already lists (nothing is told that the evidence may still overturn, either way)."""

    rule: str
    subject: str
    severity: str
    summary: str
    detail: str = ""
    settled: bool = True

    @property
    def sticky(self) -> bool:
        return rule_info(self.rule).sticky


def natural_key(subject: str) -> tuple:
    """Sort key of a subject with its digits compared as numbers: g20 before g100, attempt 3
    before attempt 12."""
    import re

    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part)
                 for part in re.split(r"(\d+)", subject) if part)


def group_summary(rule: str, items: list[dict]) -> str:
    """The summary of an alert grouping ``items`` (``Alert.subjects`` entries, natural order):
    the condition's own summary for one subject, else the rule's ``many`` text, e.g.
    "5 generations rejected: stale_state (g20, g30, g40, g50, g60)"."""
    if len(items) == 1:
        return items[0]["summary"]
    details = sorted({d.strip() for i in items for d in (i.get("detail") or "").split(",")
                      if d.strip()})
    shown = [i["subject"] for i in items[:8]] + (["…"] if len(items) > 8 else [])
    return rule_info(rule).many.format(n=len(items),
                                       details=": " + ", ".join(details) if details else "",
                                       subjects=", ".join(shown))


def contract_of(run) -> dict:
    """The run's recovery contract (docs/ingest-v1.md#attempt_started ``contract``, the latest
    wins) over the core's defaults (``recovery.contract.effective_contract``)."""
    return effective_contract(run.contract)


def duration(seconds: float) -> str:
    """``3h 05m`` / ``12m 30s`` / ``45s`` / ``0.7s``: how long, for people reading a page at
    night (tenths below ten seconds, so a sub-second figure does not read as zero)."""
    if 0 < seconds < 10 and not float(seconds).is_integer():
        return f"{seconds:.1f}s"
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def restore_failed_conditions(failures: list[dict]) -> list[Condition]:
    """One ``restore_failed`` condition per attempt and generation that failed to restore
    (docs/ingest-v1.md#restore_failed). ``failures``: ``{"attempt", "generation_id", "reason",
    "message", "restored"}`` per reported failure, ``restored`` the generation the attempt restored
    after it ("" when none: critical, the attempt did not resume what it meant to; else a warning,
    it fell back to an older generation)."""
    out: dict[str, Condition] = {}
    for f in failures:
        subject = f"{f['attempt']}:{f['generation_id']}"
        restored = f.get("restored") or ""
        if restored and restored != f["generation_id"]:
            severity, then = "warning", f"it restored {restored} instead"
        else:
            severity, then = "critical", "it restored nothing"
        message = (f.get("message") or "")[:300]
        out.setdefault(subject, Condition(
            "restore_failed", subject, severity,
            f"Attempt {f['attempt']} could not restore {f['generation_id']} ({f['reason']}"
            + (f": {message}" if message else "") + f"); {then}.", detail=f["reason"]))
    return list(out.values())


def silence_conditions(silence: dict | None) -> list[Condition]:
    """``run_silent`` and ``rank_silent`` of the live attempt (docs/definitions.md#silence).

    ``silence``: ``{"attempt": int | None, "ended": bool (the attempt sent attempt_ended),
    "median": the core's median_update_interval of the attempt (seconds) or None, "ages": the
    core's reporter_ages {reporter: seconds}}``, or None (nothing to say); read in bulk
    (:func:`silences_of`) it also holds ``"reporters"`` (how many) and ``"youngest"`` (the
    youngest reporter's age) and ``ages`` only the reporters above the ``rank_silent`` limit
    while some reporter is not (the core's ``silent_reporters``). The limits are the
    core's ``silence_limit`` with the floors RECOVERYDASH_RUN_SILENT_S and
    RECOVERYDASH_RANK_SILENT_FLOOR_S. ``rank_silent`` only while the attempt has not ended."""
    if not silence:
        return []
    ages, median = silence.get("ages") or {}, silence.get("median")
    reporters = silence.get("reporters", len(ages))
    if not reporters:
        return []
    out = []
    run_floor = float(settings.RECOVERYDASH_RUN_SILENT_S)
    quiet = (youngest_silent(silence["youngest"], median, run_floor) if "youngest" in silence
             else attempt_silent(ages, median, run_floor))
    who = f"attempt {silence['attempt']}" if silence.get("attempt") is not None else "the run"
    if quiet is not None:
        limit = silence_limit(median, RUN_SILENT_INTERVALS, run_floor)
        basis = (f"{RUN_SILENT_INTERVALS} × its median update interval of {duration(median)}, "
                 f"at least {duration(run_floor)}" if median is not None else "no update "
                 "interval known yet")
        found = Condition("run_silent", "", "warning",
                          f"No event from {who} for {duration(quiet)} (limit {duration(limit)}: "
                          f"{basis}) while the run has not ended.")
        out.append(found)
    elif not silence.get("ended"):
        rank_floor = float(settings.RECOVERYDASH_RANK_SILENT_FLOOR_S)
        stopped = silent_reporters(ages, median, rank_floor, reporters)
        limit = silence_limit(median, RANK_SILENT_INTERVALS, rank_floor)
        for k in sorted(stopped, key=natural_key):
            name = f"Rank {k}" if k.isdigit() else "The reporter without a rank"
            out.append(Condition(
                "rank_silent", k, "warning",
                f"{name} of {who} sent nothing for {duration(stopped[k])} while "
                f"{reporters - len(stopped)} other reporter(s) keep reporting (limit "
                f"{duration(limit)}: {RANK_SILENT_INTERVALS} × the median update interval, at "
                f"least {duration(rank_floor)}). A dead rank usually hangs the job.",
                detail=who))
    return out


#: The rules whose conditions change with the clock alone, without a new analysis
#: (:func:`clock_conditions`); every other rule changes only when an analysis is stored.
CLOCK_RULES = ("checkpoint_stale", "rank_silent", "run_silent")


def clock_conditions(result: AnalysisResult | ClockFields, contract: dict, *, now: datetime,
                     first_event_at: datetime | None, last_received_at: datetime | None,
                     silence: dict | None = None) -> list[Condition]:
    """The conditions of ``CLOCK_RULES`` that hold now for a run that has not ended:
    ``checkpoint_stale`` (the core's ``seconds_since_last_restorable`` compared by its
    ``checkpoint_stale`` with the contract's ``max_checkpoint_age_s``; critical above twice the
    limit), ``run_silent`` and ``rank_silent`` (``silence_conditions``; with ``silence`` None,
    the run's ``last_received_at`` alone). ``result``: the stored analysis result, or its
    ``Analysis.clock`` (``runs.models.clock_of``: the same figure; a summary then names no
    generation); times aware datetimes. Part of ``conditions``, and what the periodic evaluation
    computes for every run from stored columns (``alerts.evaluation.evaluate_chunk``)."""
    found: list[Condition] = []
    max_age = float(contract["max_checkpoint_age_s"])
    # a stored clock keeps only the commit time of the last restorable generation
    last: Mapping[str, Any] | None = result.get("last_restorable")
    age = seconds_since_last_restorable(result, now, first_event_at)
    if age is not None and checkpoint_stale(age, max_age):
        where = (f"last restorable {last['generation_id']} at update {last['update']:,}"
                 if last and "generation_id" in last else
                 "last restorable" if last else "no restorable checkpoint yet")
        settled, overdue = settle.stale_wait(result.get("undecided") or [], now, age, max_age)
        where += f"; {settle.overdue_words(overdue, now, duration)}" if overdue else ""
        found.append(Condition(
            "checkpoint_stale", "", "critical" if age > 2 * max_age else "warning",
            f"No restorable checkpoint for {duration(age)} (limit {duration(max_age)}); "
            f"{where}.", settled=settled))
    if silence is None and last_received_at:  # no attempt row: the run's last event
        silence = {"attempt": None, "ended": False, "median": None,
                   "ages": {"run": max(0.0, (now - last_received_at).total_seconds())}}
    return found + silence_conditions(silence)


def conditions(result: AnalysisResult, contract: dict, *, now: datetime,
               first_event_at: datetime | None,
               last_received_at: datetime | None, ended: bool,
               restore_failures: list[dict] | None = None,
               silence: dict | None = None) -> list[Condition]:
    """Every alert condition that holds for a run now (rule names of
    docs/definitions.md#alert-rules).

    ``result``: the recovery core's ``to_dict()``; ``contract``: see ``contract_of``; times are
    aware datetimes (``first_event_at`` is used only for a stored result that predates the core's
    ``first_event_at``). The age compared is the core's ``seconds_since_last_restorable`` and the
    comparison its ``checkpoint_stale``. ``restore_failures``: see ``restore_failed_conditions``;
    ``silence``: see ``silence_conditions`` (None: the run's ``last_received_at`` alone).
    Returns conditions sorted by rule and subject.
    """
    found: list[Condition] = restore_failed_conditions(restore_failures or [])
    generations = result.get("generations", [])
    last = result.get("last_restorable")
    if not ended:
        found += clock_conditions(result, contract, now=now, first_event_at=first_event_at,
                                  last_received_at=last_received_at, silence=silence)
    # every generation counted (the result lists only the newest ones in full)
    summary = result.get("generations_summary")
    by_status = summary.get("by_status") if summary else None
    if by_status is None:
        by_status = {}
        for g in generations:
            by_status[g["status"]] = by_status.get(g["status"], 0) + 1
    undecided = result.get("undecided") or []
    committed = sum(by_status.get(s, 0) for s in ("restorable", "rejected", "committed"))
    if committed and not last:
        found.append(no_restorable_condition(generations, by_status, undecided, now))
    found += rejected_conditions(generations, undecided, now)
    for r in result.get("restarts", []):
        found += restart_conditions(r, contract)
    return sorted(found, key=lambda c: (c.rule, c.subject))


def rejected_conditions(generations: list[GenerationEntry], undecided: Sequence[Mapping[str, Any]],
                        now: datetime) -> list[Condition]:
    """``generation_rejected`` of each rejected generation of ``generations`` (a result's) not
    superseded by a newer restorable one, settled unless an undecided generation may still
    supersede it (``settle.rejected_wait``)."""
    found: list[Condition] = []
    restorable = [g["update"] for g in generations if g["status"] == "restorable"
                  and g["update"] is not None]
    for g in generations:
        update = g["update"]
        if g["status"] != "rejected" or update is None:  # no update: never a checkpoint_started
            continue
        if any(u is not None and u > update for u in restorable):
            continue  # superseded by a newer restorable generation
        codes = ", ".join(sorted({r["code"] for r in g.get("reasons", [])})) or "no reason given"
        found.append(Condition("generation_rejected", g["generation_id"], "warning",
                               f"Generation {g['generation_id']} (update {update:,}) is "
                               f"rejected: {codes}.", detail=codes,
                               settled=settle.rejected_wait(undecided, update, now)))
    return found


def restart_conditions(r: RestartEntry, contract: dict) -> list[Condition]:
    """The conditions one restart ``r`` (a result's) raises: ``restart_replay`` and
    ``restart_omission`` over the contract's limits (not for an ``unverified`` verdict),
    ``restart_unverified`` (a ``samples_unknown`` finding, or ``predecessor_unknown`` unless the
    restart's first update is incomplete), ``resumed_from_unrestorable``,
    ``dataset_version_changed``, ``world_size_changed``."""
    found: list[Condition] = []
    attempt = str(r["attempt"])
    codes = {f["code"] for f in r.get("findings", [])}
    if r.get("verdict") != "unverified":
        unit = unit_word(r.get("units"))  # docs/definitions.md#units
        if r["replayed"] > int(contract["max_replay_samples"]):
            found.append(Condition(
                "restart_replay", attempt, "critical",
                f"Attempt {attempt} replayed {r['replayed']:,} committed {unit} "
                f"(contract allows {int(contract['max_replay_samples']):,})."))
        if r["omitted"] > int(contract["max_omission_samples"]):
            found.append(Condition(
                "restart_omission", attempt, "critical",
                f"Attempt {attempt} skipped {r['omitted']:,} {unit} that were never "
                f"trained on (contract allows {int(contract['max_omission_samples']):,})."))
    if "samples_unknown" in codes:
        # the core adds the finding once k's first update is settled (its verdict decided
        # on what is in): settled evidence, docs/definitions.md#settled-evidence
        why = next(f.get("detail") or "" for f in r["findings"]
                   if f["code"] == "samples_unknown")
        found.append(Condition(
            "restart_unverified", attempt, "warning",
            f"Attempt {attempt}'s restart is unverified: {why}. Record the samples of "
            "every order (a span's indices) to know what it replayed or skipped.",
            detail=why))
    elif "predecessor_unknown" in codes and "incomplete_first_update" not in codes:
        # docs/definitions.md#resume-from-a-generation-the-server-had-not-seen: nothing of the
        # attempts before k (or of the writer of what k resumed) reached the server, so the
        # restart can never be compared; held back while k's first update is incomplete
        why = next(f.get("detail") or "" for f in r["findings"]
                   if f["code"] == "predecessor_unknown")
        found.append(Condition(
            "restart_unverified", attempt, "warning",
            f"Attempt {attempt}'s restart is unverified: {why}. Report every attempt from its "
            "start and a data cursor for every stratum in the manifest to know what a restart "
            "replayed or skipped.", detail="predecessor unknown"))
    if "resumed_from_unrestorable" in codes:
        found.append(Condition(
            "resumed_from_unrestorable", attempt, "critical",
            f"Attempt {attempt} resumed from {r.get('resumed_from') or 'an unknown state'}, "
            "which is not a restorable generation."))
    if "dataset_version_changed" in codes:
        # the finding's detail names both versions (recovery.restarts: "dataset_version
        # 'v1' -> 'v2'")
        change = next(f.get("detail") or "" for f in r["findings"]
                      if f["code"] == "dataset_version_changed")
        found.append(Condition("dataset_version_changed", attempt, "warning",
                               f"Attempt {attempt} runs on another dataset version than the "
                               f"lineage it resumed" + (f": {change}." if change else "."),
                               detail=change))
    if "world_size_changed" in codes:
        found.append(Condition(
            "world_size_changed", attempt, "info",
            f"Attempt {attempt} resumed on {r['world_size_after']} ranks instead of "
            f"{r['world_size_before']}: check the data partitioning and effective batch."))
    return found


def no_restorable_condition(generations: list[GenerationEntry], by_status: dict,
                            undecided: Sequence[Mapping[str, Any]], now: datetime) -> Condition:
    """``no_restorable_generation`` of a run with committed generations and no restorable one
    on the live lineage: restorable only in another attempt's lineage, or none restorable at
    all; settled unless undecided generations of the live lineage may still be restorable
    (``settle.no_restorable_wait``), the summary naming them."""
    settled, words = settle.no_restorable_wait(undecided, now, duration)
    restorable = by_status.get("restorable", 0)
    if restorable:
        elsewhere = [g["generation_id"] for g in generations if g["status"] == "restorable"]
        named = ", ".join(elsewhere[:5]) or f"{restorable} older generation(s)"
        summary = (f"No restorable generation in the live lineage: {named} restorable in "
                   "another attempt's lineage only (the live attempt resumed from a state "
                   f"recoverydash cannot tie to them){words}.")
    else:
        rejected, open_ = by_status.get("rejected", 0), by_status.get("committed", 0)
        split = f" ({rejected} rejected, {open_} not decided)" if open_ else ""
        summary = (f"None of the {rejected + open_} committed generation(s) is restorable"
                   f"{split}: a failure now would restart from scratch{words}.")
    return Condition("no_restorable_generation", "", "critical", summary, settled=settled)


def group_key(run, rule: str) -> str:
    """The dedup key of the run's alert of ``rule``: ``run_id:rule:`` (the form a run-level rule
    always had, so those keys did not change when alerts grouped their subjects), the same for
    every episode and however many subjects it lists."""
    return f"{run.run_id}:{rule}:"


def worst_severity(items: list[dict]) -> str:
    """The highest ``severity`` of ``items`` (``Alert.subjects`` entries) in the order of
    ``models.SEVERITIES``: an alert's severity."""
    from recoverydash.alerts.models import SEVERITIES

    return max((i["severity"] for i in items), key=SEVERITIES.index)


def restore_failures_of(run) -> list[dict]:
    """The run's reported restore failures (``Attempt.restore_failures``) in the shape
    ``restore_failed_conditions`` takes."""
    out = []
    for a in run.attempts.only("attempt", "restore_failures", "restore_generation_id") \
            .order_by("attempt"):
        out += failures_of_attempt(a.attempt, a.restore_failures, a.restore_generation_id)
    return out


def failures_of_attempt(attempt: int, restore_failures: list | None,
                        restored: str) -> list[dict]:
    """One attempt's ``Attempt.restore_failures`` (and its ``restore_generation_id``
    ``restored``) in the shape ``restore_failed_conditions`` takes."""
    return [{"attempt": attempt, "generation_id": f["generation_id"], "reason": f["reason"],
             "message": f.get("message") or "", "restored": restored}
            for f in restore_failures or []]


def stored_median(result: AnalysisResult | ClockFields | None, attempt: int) -> float | None:
    """The median update interval (seconds) of attempt ``attempt`` as the stored analysis
    observed it: ``update_interval`` of the result (or of its ``Analysis.clock``), written by the
    core (``recovery.figures.update_interval``) from the ledger state. None when the analysis
    is of another attempt (it has not absorbed this one yet), knows fewer than two updates, or
    was stored before the core wrote the figure: the silence limits are then their floors."""
    interval = (result or {}).get("update_interval")
    if not isinstance(interval, dict) or interval.get("attempt") != attempt:
        return None
    median = interval.get("median_s")
    return float(median) if isinstance(median, (int, float)) else None


def silence_from(attempt: int, ended_at, seen_at: dict,
                 result: AnalysisResult | ClockFields | None,
                 now: datetime) -> dict | None:
    """``silence_conditions``' input for the live attempt ``attempt`` (its ``ended_at`` and
    ``seen_at``, ``{reporter: time}`` of its RankSeen rows, ``Attempt.ranks_seen``) and the
    stored analysis ``result`` (or clock): the reporters' ages (the core's ``reporter_ages`` at
    ``now``) and :func:`stored_median`. None when no reporter of the attempt reported."""
    if not seen_at:
        return None
    return {"attempt": attempt, "ended": ended_at is not None,
            "median": stored_median(result, attempt),
            "ages": reporter_ages(seen_at, now)}


def silence_of(run, now: datetime,
              result: AnalysisResult | None = None) -> dict | None:
    """What ``silence_conditions`` needs of the run's live attempt (docs/definitions.md#silence;
    the newest attempt unless it ended while an older one keeps committing:
    ``runs.live.live_attempts``, docs/definitions.md#concurrent-attempts), read from stored
    state only: its RankSeen rows (when the server last received an event of
    each reporter) and the median update interval the stored analysis ``result`` (default: the
    run's) observed (:func:`silence_from`). No raw row is read, so a run whose raw rows were
    compacted is watched as before. None without an attempt that reported. A few queries (the
    attempts, the stored result's two keys, the live attempt's rows)."""
    from recoverydash.runs.live import live_attempts, pick_live
    from recoverydash.runs.models import RankSeen, seen_map

    if result is None:
        live = live_attempts([run.pk]).get(run.pk)
    else:
        live = pick_live(list(run.attempts.order_by("attempt")
                              .values_list("pk", "attempt", "ended_at")), result)
    if live is None:
        return None
    rows = list(RankSeen.objects.filter(attempt_id=live[0]).values_list("reporter", "seen_at"))
    if not rows:  # its reporters never reported: silence_from's None
        return None
    if result is None:
        analysis = getattr(run, "analysis", None)
        result = analysis.result if analysis is not None else None
    return silence_from(live[1], live[2], seen_map(rows), result, now)


#: Seconds below the ``rank_silent`` limit from which :func:`silences_of` reads a reporter's row
#: (the limit is then compared exactly, in Python, on the core's ``reporter_ages``).
_CUTOFF_MARGIN = timedelta(milliseconds=1)


def silences_of(newest: dict, clocks: dict, now: datetime) -> dict:
    """:func:`silence_of` for many runs in at most two queries (the beat's bulk path,
    ``alerts.evaluation.clock_changes``). ``newest``: ``{run pk: (attempt pk, attempt,
    ended_at)}`` of each run's live attempt; ``clocks``: ``{run pk: Analysis.clock}``.

    One aggregate over the attempts' RankSeen rows gives per attempt how many reporters it has
    and its newest and oldest time; only an attempt not ended whose oldest reporter is past the
    ``rank_silent`` limit while its youngest is not has its rows past that limit read (one query
    for all of them). Returns ``{run pk: silence}`` in ``silence_conditions``' bulk form
    (``"reporters"``, ``"youngest"``, ``ages`` the silent reporters); a run whose newest
    attempt has no reporter is left out (None: its ``last_received_at`` alone). The conditions
    are exactly those of :func:`silence_of`'s full map."""
    from django.db.models import Count, Max, Min, Q

    from recoverydash.runs.models import RankSeen

    by_attempt = {pk: run_id for run_id, (pk, _, _) in newest.items()}
    if not by_attempt:
        return {}
    rank_floor = float(settings.RECOVERYDASH_RANK_SILENT_FLOOR_S)
    out, wanted = {}, {}
    for attempt_pk, n, youngest_at, oldest_at in (
            RankSeen.objects.filter(attempt_id__in=by_attempt).values("attempt_id")
            .annotate(n=Count("id"), newest=Max("seen_at"), oldest=Min("seen_at"))
            .values_list("attempt_id", "n", "newest", "oldest")):
        run_id = by_attempt[attempt_pk]
        _, attempt, ended_at = newest[run_id]
        median = stored_median(clocks.get(run_id), attempt)
        ages = reporter_ages({"youngest": youngest_at, "oldest": oldest_at}, now)
        out[run_id] = {"attempt": attempt, "ended": ended_at is not None, "median": median,
                       "reporters": n, "youngest": ages["youngest"], "ages": {}}
        limit = silence_limit(median, RANK_SILENT_INTERVALS, rank_floor)
        if ended_at is None and ages["oldest"] > limit >= ages["youngest"]:
            wanted[attempt_pk] = (now - timedelta(seconds=limit)) + _CUTOFF_MARGIN
    if wanted:
        rows: dict = {}
        query = Q()
        for attempt_pk, cutoff in wanted.items():
            query |= Q(attempt_id=attempt_pk, seen_at__lte=cutoff)
        for attempt_pk, reporter, seen_at in (RankSeen.objects.filter(query)
                                              .values_list("attempt_id", "reporter", "seen_at")):
            rows.setdefault(attempt_pk, {})[reporter] = seen_at
        for attempt_pk, seen in rows.items():
            silence = out[by_attempt[attempt_pk]]
            silence["ages"] = silent_reporters(reporter_ages(seen, now), silence["median"],
                                               rank_floor, silence["reporters"])
    return out


def evaluate_run(run, now: datetime | None = None) -> list[AlertFlip]:
    """Open, keep or resolve the run's alerts from its stored analysis; returns the new flips.

    The conditions (``conditions``) are grouped per rule into one alert of key ``group_key``
    listing its subjects (``Alert.subjects``, natural order; severity the worst of them,
    summary ``group_summary``). An open alert follows its rule's subjects: a state rule's list
    is what holds now and the alert resolves when nothing holds (a subject added or removed
    while it stays open is a flip of ``Alert.record_subjects_change``); an event rule's list
    only grows (each restart is told once: a subject of an earlier alert of the rule never
    opens another)
    and its alert stays open until a person resolves it, also after the run ended and when a
    later analysis no longer finds the fact (state rules of an ended run resolve).
    One transaction that first locks the run's Analysis row (``select_for_update``) and reads
    the stored result under that lock: evaluations of one run are serialised (two evaluators
    raced on the open-alert constraint when the run had no open alert to lock), and each
    evaluates the newest stored analysis. The analysis itself stores its result under the same
    lock and evaluates in that transaction (``alerts.evaluation.evaluate_stored``).
    :func:`evaluate_runs` of the one run: the same code for one run and for a chunk.
    """
    return evaluate_runs([run], now=now)


def evaluate_runs(runs, now: datetime | None = None) -> list[AlertFlip]:
    """:func:`evaluate_run` of every run of ``runs`` (Run objects, their ``analysis`` loaded or
    None: a run without one is skipped) at one clock ``now`` (aware datetime, default the
    clock), in one transaction with a fixed number of queries whatever the number of runs:
    the runs' Analysis rows locked in run order (``select_for_update``: concurrent
    evaluations and analyses of a run are serialised as with one run, and two chunks lock in
    the same order), then in bulk their stored results, attempts (restore failures and the
    live attempt, ``runs.live.pick_live``: docs/definitions.md#concurrent-attempts), the live
    attempts' RankSeen rows in aggregate (:func:`silences_of`: the conditions
    :func:`silence_of`'s every reporter gives), their open alerts (locked) and event-rule
    alerts; the writes are an UPDATE of ``last_seen_at`` and a ``bulk_update`` of the alerts
    kept (those whose words moved), a ``bulk_create`` of the alerts opened, one UPDATE of those
    resolved and a ``bulk_create`` of the flips, in the order the
    run-by-run evaluation makes them (run by run, rule by rule, then resolutions). Each run's
    alerts and flips are exactly what :func:`evaluate_run` alone makes of it. Returns the new
    flips (saved, ``alert`` set). Raises whatever a run's evaluation raises (nothing is then
    written: the caller evaluates run by run to isolate it, ``alerts.evaluation``)."""
    from recoverydash.runs.live import pick_live
    from recoverydash.runs.models import Attempt
    from recoverydash.runs.monitoring import resume_on_events

    now = now or timezone.now()
    runs = resume_on_events(list(runs))  # a paused run pages nobody (runs.monitoring)
    by_pk = {r.pk: r for r in runs if getattr(r, "analysis", None) is not None}
    if not by_pk:
        return []
    pks = sorted(by_pk)
    with transaction.atomic():
        results = dict(Analysis.objects.select_for_update().filter(run_id__in=pks)
                       .order_by("run_id").values_list("run_id", "result"))
        if not results:
            return []
        failures: dict[int, list[dict]] = {}
        rows_of: dict[int, list] = {}  # run pk -> [(attempt pk, attempt, ended_at)]
        for run_id, attempt_pk, attempt, ended_at, restore_failures, restored in (
                Attempt.objects.filter(run_id__in=results).order_by("run_id", "attempt")
                .values_list("run_id", "pk", "attempt", "ended_at", "restore_failures",
                             "restore_generation_id")):
            rows_of.setdefault(run_id, []).append((attempt_pk, attempt, ended_at))
            if restore_failures:  # restore_failures_of, in bulk
                failures.setdefault(run_id, []).extend(
                    failures_of_attempt(attempt, restore_failures, restored))
        # the live attempt (runs.live.pick_live: not a cancelled duplicate) is the one watched
        newest: dict[int, tuple] = {r: cast(tuple, pick_live(rows, results[r]))
                                    for r, rows in rows_of.items()}
        # its reporters in aggregate, only those past the rank_silent limit read (silences_of:
        # the conditions of every reporter's row, in at most two queries)
        silences = silences_of(newest, results, now)
        open_of: dict[int, list[Alert]] = {}
        for a in (Alert.objects.select_for_update().filter(run_id__in=results)
                  .exclude(state="resolved").order_by("run_id", "opened_at", "pk")):
            open_of.setdefault(a.run_id, []).append(a)
        told_of: dict[int, set] = {}  # (rule, subject) of every event-rule alert so far
        for run_id, rule, subject, subjects in (
                Alert.objects.filter(run_id__in=results, rule__in=EVENT_RULES)
                .values_list("run_id", "rule", "subject", "subjects")):
            told = told_of.setdefault(run_id, set())
            told.add((rule, subject))
            told.update((rule, s["subject"]) for s in subjects or [])
        kept: list = []
        opened: list = []
        resolved: list = []
        steps: list = []
        for run_id in sorted(results):
            run = by_pk[run_id]
            result: AnalysisResult = results[run_id]
            silence = silences.get(run_id)
            holding = conditions(result, contract_of(run), now=now,
                                 first_event_at=run.first_event_at,
                                 last_received_at=run.last_received_at,
                                 ended=result.get("health") == "ended",
                                 restore_failures=failures.get(run_id, []), silence=silence)
            _plan_run(run, holding, open_of.get(run_id, []), told_of.get(run_id, set()), now,
                      kept, opened, resolved, steps, result, result.get("health") == "ended")
        # the alerts kept: those whose words, severity and subjects are as stored get their
        # last_seen_at in one UPDATE, the others one bulk_update (the rows end as
        # evaluate_run's save of the four fields leaves them)
        same = [a.pk for a, was in kept if was == (a.summary, a.severity, a.subjects)]
        if same:
            Alert.objects.filter(pk__in=same).update(last_seen_at=now)
        moved = [a for a, was in kept if was != (a.summary, a.severity, a.subjects)]
        if moved:
            write_words(moved, now)
        if opened:
            Alert.objects.bulk_create(opened)
        wall = timezone.now()  # Alert.change_state's clock
        was: dict[int, tuple[str, str]] = {}  # id(alert) -> (state before, reason)
        for alert, reason in resolved:  # Alert.change_state("resolved"), in bulk
            was[id(alert)] = (alert.state, reason)
            alert.state, alert.resolved_at, alert.resolved_by = "resolved", wall, ""
        if resolved:
            Alert.objects.filter(pk__in=[a.pk for a, _ in resolved]).update(
                state="resolved", resolved_at=wall, resolved_by="")
        flips = _flips(steps, now, wall, was)
        if flips:
            AlertFlip.objects.bulk_create(flips)
        count_flaps(flips)
    return flips


def _flips(steps: list, now: datetime, wall: datetime, was: dict) -> list[AlertFlip]:
    """The flips of :func:`_plan_run`'s ``steps`` (unsaved), each with the subjects that left
    (``AlertFlip.cleared``); ``was``: ``{id(alert): (state before, reason)}`` of those
    resolved, at ``wall``."""
    flips: list[AlertFlip] = []
    for kind, alert, extra, cleared in steps:
        if kind == "opened":
            flips.append(AlertFlip(alert=alert, old_state="", new_state="firing",
                                   reason=alert.summary, created_at=now,
                                   snapshot=alert.snapshot()))
        elif kind == "subjects":
            flip = alert.subjects_change_flip(extra, now=now)
            if flip is not None:
                flip.cleared = cleared or None
                if cleared:
                    flip.reason = cleared_reason(flip.reason, cleared)
                flips.append(flip)
        else:
            old_state, reason = was[id(alert)]
            flips.append(AlertFlip(alert=alert, old_state=old_state, new_state="resolved",
                                   reason=reason, created_at=wall,
                                   notify=not alert.is_silenced(wall),
                                   snapshot=alert.snapshot(), cleared=cleared or None))
    return flips


def count_flaps(flips: list[AlertFlip]) -> None:
    """Add to each alert's ``flaps`` the subjects its new ``flips`` cleared as flaps
    (docs/definitions.md#flaps): one UPDATE per alert that flapped (normally none)."""
    from django.db.models import F

    per_alert: dict[int, int] = {}
    for flip in flips:
        n = sum(1 for c in flip.cleared or [] if c.get("flap"))
        if n:
            per_alert[flip.alert.pk] = per_alert.get(flip.alert.pk, 0) + n
            flip.alert.flaps = (flip.alert.flaps or 0) + n
    for pk, n in per_alert.items():
        Alert.objects.filter(pk=pk).update(flaps=F("flaps") + n)


def write_words(alerts: list[Alert], now: datetime) -> None:
    """Store the ``summary``, ``severity`` and ``subjects`` of ``alerts`` (saved Alert objects,
    their fields set) and ``last_seen_at`` ``now`` on each, in one statement. On PostgreSQL one
    ``UPDATE ... FROM unnest(...)`` of four arrays (Django's ``bulk_update`` writes a CASE per
    field listing every row, which cost PostgreSQL about 1 ms per alert in bench/beat.py:
    20,000 alerts' words a minute); elsewhere ``bulk_update``. The caller holds the rows
    (``select_for_update``)."""
    import json

    from django.db import connection

    if not alerts:
        return
    if connection.vendor != "postgresql":
        for alert in alerts:
            alert.last_seen_at = now
        Alert.objects.bulk_update(alerts, ["summary", "severity", "subjects", "last_seen_at"])
        return
    meta = Alert._meta
    column = {name: connection.ops.quote_name(meta.get_field(name).column)
              for name in ("id", "summary", "severity", "subjects", "last_seen_at")}
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {connection.ops.quote_name(meta.db_table)} AS a SET "
            f"{column['summary']} = v.summary, {column['severity']} = v.severity, "
            f"{column['subjects']} = v.subjects::jsonb, {column['last_seen_at']} = %s "
            "FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::text[]) "
            f"AS v(id, summary, severity, subjects) WHERE a.{column['id']} = v.id",
            [now, [a.pk for a in alerts], [a.summary for a in alerts],
             [a.severity for a in alerts], [json.dumps(a.subjects) for a in alerts]])


def held_subjects(open_alerts: list) -> set:
    """``(rule, subject)`` of every subject the open alerts ``open_alerts`` list (an alert
    stored before alerts listed subjects: its own subject)."""
    held: set[tuple[str, str]] = set()
    for a in open_alerts:
        held.update((a.rule, i["subject"]) for i in a.subjects or [])
        if not a.subjects:
            held.add((a.rule, a.subject))
    return held


def settled_holding(holding: list[Condition], held: set) -> list[Condition]:
    """The conditions of ``holding`` an evaluation acts on: the settled ones, and those not
    settled that an open alert already lists (``held``: ``(rule, subject)``, see
    :func:`held_subjects`). docs/definitions.md#settled-evidence: evidence still on its way
    neither opens an alert nor adds a subject, and does not clear one either."""
    return [c for c in holding if c.settled or (c.rule, c.subject) in held]


def _items(rule: str, found: list[Condition], alert, now: datetime) -> list[dict]:
    """The ``Alert.subjects`` entries of ``found``: ``since`` (when the subject joined the
    alert, RFC 3339) kept from ``alert``'s entry of the same subject (None for one stored
    before subjects kept it: the alert's ``opened_at`` stands for it), else ``now``."""
    info = rule_info(rule)
    before = {i["subject"]: i for i in (alert.subjects or [])} if alert is not None else {}
    return [{"subject": c.subject, "kind": info.subject, "severity": c.severity,
             "summary": c.summary, "detail": c.detail,
             "since": before[c.subject].get("since") if c.subject in before
             else now.isoformat()} for c in found]


def _plan_run(run, holding: list[Condition], open_alerts: list, told: set, now: datetime,
              kept: list, opened: list, resolved: list, steps: list,
              result: AnalysisResult | None = None,
              ended: bool = False) -> None:
    """What :func:`evaluate_runs` writes for one run: its conditions ``holding``
    (:func:`settled_holding` of them) grouped per rule against its open alerts (locked,
    opened_at order) and the (rule, subject) pairs its event-rule alerts ever ``told``. Appends
    to ``kept`` ``(alert, (summary, severity, subjects) as stored)`` of the open alerts updated,
    to ``opened`` the new alerts (unsaved), to ``resolved`` ``(alert, reason)`` and to
    ``steps`` ``(kind, alert, extra, cleared)`` in the order their flips are made (``opened``;
    ``subjects`` with the subjects before; ``resolved``); ``cleared``: the ``settle.departure``
    of each subject that left (judged on the stored ``result``; ``ended``: the run ended)."""
    groups: dict[str, list[Condition]] = {}
    for c in settled_holding(holding, held_subjects(open_alerts)):
        groups.setdefault(c.rule, []).append(c)
    by_rule, legacy = {}, []
    for a in open_alerts:
        if a.dedup_key == group_key(run, a.rule):
            by_rule[a.rule] = a
        else:
            legacy.append(a)  # one alert per subject, stored before alerts grouped
    for rule, found in groups.items():
        _plan_rule(run, rule, found, by_rule.get(rule), told, now, kept, opened, steps,
                   result or {}, ended)
    for rule, alert in by_rule.items():
        if rule in groups or rule_info(rule).sticky:
            continue  # facts of the past stay until a person resolves them, ended or not
        cleared = [settle.departure(rule, i, alert, result or {}, now, ended)
                   for i in alert.subjects or []]
        resolved.append((alert, cleared_reason("the condition cleared", cleared)))
        steps.append(("resolved", alert, None, cleared))
    for alert in legacy:
        if rule_info(alert.rule).sticky:
            continue  # its subject is told; a person resolves it, ended or not
        resolved.append((alert, "the condition cleared" if alert.rule not in groups
                         else "grouped into one alert per rule"))
        steps.append(("resolved", alert, None, []))


def _plan_rule(run, rule: str, found: list[Condition], alert, told: set, now: datetime,
               kept: list, opened: list, steps: list, result: AnalysisResult,
               ended: bool) -> None:
    """:func:`_plan_run` for the conditions ``found`` of one rule and its open alert (or None)."""
    info = rule_info(rule)
    items = _items(rule, found, alert, now)
    if info.sticky:
        keep = list(alert.subjects or []) if alert is not None else []
        have = {i["subject"] for i in keep}
        fresh = [i for i in items if i["subject"] not in have
                 and (rule, i["subject"]) not in told]
        current = {i["subject"]: i for i in items}
        # an event's words may be refined by a later analysis; its subject stays
        items = [current.get(i["subject"], i) for i in keep] + fresh
        if alert is None and not fresh:
            return  # already told; a person resolved it
    items.sort(key=lambda i: natural_key(i["subject"]))
    summary, severity = group_summary(rule, items), worst_severity(items)
    if alert is not None:
        before = [s["subject"] for s in alert.subjects or []]
        now_listed = {i["subject"] for i in items}
        cleared = [settle.departure(rule, i, alert, result, now, ended)
                   for i in alert.subjects or [] if i["subject"] not in now_listed]
        stored = (alert.summary, alert.severity, alert.subjects)
        alert.summary, alert.severity, alert.subjects = summary, severity, items
        alert.last_seen_at = now
        kept.append((alert, stored))
        # a subject joining (or leaving) the open alert is told, the state unchanged
        # (an alert stored before it listed subjects has no list to compare with)
        if before:
            steps.append(("subjects", alert, before, cleared))
        return
    alert = Alert(run=run, rule=rule, subject=items[0]["subject"], subjects=items,
                  dedup_key=group_key(run, rule), severity=severity, summary=summary,
                  opened_at=now, last_seen_at=now)
    opened.append(alert)
    steps.append(("opened", alert, None, []))


def cleared_reason(words: str, cleared: list[dict]) -> str:
    """A resolution's reason: ``words`` and, per subject that left, why (``settle.departure``),
    a flap said as such."""
    parts = [f"{c['subject'] or 'the run'}: {c['detail']}" + (" (a flap)" if c["flap"] else "")
             for c in cleared if c.get("detail") and c.get("cause") != "unknown"]
    return words + (": " + "; ".join(parts) if parts else "")
