"""Alert rules (docs/definitions.md#alert-rules) evaluated against a run's stored analysis.

``conditions`` is pure: from the analysis result, the run's contract and the clock to the set of
conditions that hold now. ``evaluate_run`` turns that set into alert rows and flips inside one
transaction: a condition that appears opens an alert (firing); one that clears resolves it.
Two kinds of rule:

- *state* rules (``checkpoint_stale``, ``no_restorable_generation``, ``generation_rejected``,
  ``run_silent``) describe the run now: they resolve themselves when the condition clears, and a
  later episode opens a new alert under the same dedup key;
- *event* rules (``restart_replay``, ``restart_omission``, ``resumed_from_unrestorable``,
  ``dataset_version_changed``, ``world_size_changed``) describe something that happened at a
  restart: the fact never clears, so the alert stays until a person resolves it, and is never
  opened twice for the same restart.

A condition that holds on consecutive evaluations does not flip anything (no flapping, no
repeated notifications).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from recoverydash.alerts.models import Alert, AlertFlip
# The contract defaults and every figure a rule compares are defined once, in the core.
from recoverydash.recovery.contract import DEFAULT_CONTRACT, effective_contract
from recoverydash.recovery.figures import checkpoint_stale, seconds_since_last_restorable

__all__ = ["DEFAULT_CONTRACT", "EVENT_RULES", "Condition", "conditions", "contract_of",
           "duration", "evaluate_run"]

EVENT_RULES = ("restart_replay", "restart_omission", "resumed_from_unrestorable",
               "dataset_version_changed", "world_size_changed")


@dataclass(frozen=True)
class Condition:
    """A rule that holds for a subject (a generation id, an attempt number, or "" for the run)."""

    rule: str
    subject: str
    severity: str
    summary: str

    @property
    def sticky(self) -> bool:
        return self.rule in EVENT_RULES


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


def conditions(result: dict, contract: dict, *, now: datetime, first_event_at: datetime | None,
               last_received_at: datetime | None, ended: bool) -> list[Condition]:
    """Every alert condition that holds for a run now (rule names of
    docs/definitions.md#alert-rules).

    ``result``: the recovery core's ``to_dict()``; ``contract``: see ``contract_of``; times are
    aware datetimes (``first_event_at`` is used only for a stored result that predates the core's
    ``first_event_at``). The age compared is the core's ``seconds_since_last_restorable`` and the
    comparison its ``checkpoint_stale``. Returns conditions sorted by rule and subject.
    """
    found: list[Condition] = []
    max_age = float(contract["max_checkpoint_age_s"])
    generations = result.get("generations", [])
    restorable_updates = [g["update"] for g in generations if g["status"] == "restorable"]
    last = result.get("last_restorable")
    if not ended:
        age = seconds_since_last_restorable(result, now, first_event_at)
        if checkpoint_stale(age, max_age):
            where = (f"last restorable {last['generation_id']} at update {last['update']:,}"
                     if last else "no restorable checkpoint yet")
            found.append(Condition(
                "checkpoint_stale", "", "critical" if age > 2 * max_age else "warning",
                f"No restorable checkpoint for {duration(age)} (limit {duration(max_age)}); "
                f"{where}."))
        silent_after = settings.RECOVERYDASH_RUN_SILENT_S
        if last_received_at and (now - last_received_at).total_seconds() > silent_after:
            found.append(Condition(
                "run_silent", "", "warning",
                f"No event received for {duration((now - last_received_at).total_seconds())} "
                f"(limit {duration(silent_after)}) while the run has not ended."))
    finished = [g for g in generations if g["status"] in ("restorable", "rejected")]
    if finished and not last:
        elsewhere = [g["generation_id"] for g in generations if g["status"] == "restorable"]
        if elsewhere:
            summary = (f"No restorable generation in the live lineage: {', '.join(elsewhere[:5])} "
                       "restorable in another attempt's lineage only (the live attempt resumed "
                       "from a state recoverydash cannot tie to them).")
        else:
            summary = (f"None of the {len(finished)} committed generation(s) is restorable: a "
                       "failure now would restart from scratch.")
        found.append(Condition("no_restorable_generation", "", "critical", summary))
    for g in generations:
        if g["status"] != "rejected":
            continue
        if any(u > g["update"] for u in restorable_updates):
            continue  # superseded by a newer restorable generation
        codes = ", ".join(sorted({r["code"] for r in g.get("reasons", [])})) or "no reason given"
        found.append(Condition("generation_rejected", g["generation_id"], "warning",
                               f"Generation {g['generation_id']} (update {g['update']:,}) is "
                               f"rejected: {codes}."))
    for r in result.get("restarts", []):
        attempt = str(r["attempt"])
        codes = {f["code"] for f in r.get("findings", [])}
        if r.get("verdict") != "unverified":
            if r["replayed"] > int(contract["max_replay_samples"]):
                found.append(Condition(
                    "restart_replay", attempt, "critical",
                    f"Attempt {attempt} replayed {r['replayed']:,} committed positions "
                    f"(contract allows {int(contract['max_replay_samples']):,})."))
            if r["omitted"] > int(contract["max_omission_samples"]):
                found.append(Condition(
                    "restart_omission", attempt, "critical",
                    f"Attempt {attempt} skipped {r['omitted']:,} positions that were never "
                    f"trained on (contract allows {int(contract['max_omission_samples']):,})."))
        if "resumed_from_unrestorable" in codes:
            found.append(Condition(
                "resumed_from_unrestorable", attempt, "critical",
                f"Attempt {attempt} resumed from {r.get('resumed_from') or 'an unknown state'}, "
                "which is not a restorable generation."))
        if "dataset_version_changed" in codes:
            found.append(Condition("dataset_version_changed", attempt, "warning",
                                   f"Attempt {attempt} runs on another dataset version than the "
                                   "lineage it resumed."))
        if "world_size_changed" in codes:
            found.append(Condition(
                "world_size_changed", attempt, "info",
                f"Attempt {attempt} resumed on {r['world_size_after']} ranks instead of "
                f"{r['world_size_before']}: check the data partitioning and effective batch."))
    return sorted(found, key=lambda c: (c.rule, c.subject))


def evaluate_run(run, now: datetime | None = None) -> list[AlertFlip]:
    """Open, keep or resolve the run's alerts from its stored analysis; returns the new flips.

    One transaction with the run's open alerts locked (``select_for_update``), so two evaluators
    of the same run cannot open the same alert twice.
    """
    now = now or timezone.now()
    analysis = getattr(run, "analysis", None)
    if analysis is None:
        return []
    ended = analysis.result.get("health") == "ended"
    holding = conditions(analysis.result, contract_of(run), now=now,
                         first_event_at=run.first_event_at, last_received_at=run.last_received_at,
                         ended=ended)
    flips: list[AlertFlip] = []
    with transaction.atomic():
        open_alerts = {a.dedup_key: a for a in
                       Alert.objects.select_for_update().filter(run=run).exclude(state="resolved")}
        sticky_seen = set(Alert.objects.filter(run=run, rule__in=EVENT_RULES)
                          .values_list("dedup_key", flat=True))
        wanted = {}
        for c in holding:
            wanted[f"{run.run_id}:{c.rule}:{c.subject}"] = c
        for key, c in wanted.items():
            alert = open_alerts.get(key)
            if alert is not None:
                if alert.summary != c.summary or alert.severity != c.severity:
                    alert.summary, alert.severity = c.summary, c.severity
                alert.last_seen_at = now
                alert.save(update_fields=["summary", "severity", "last_seen_at"])
                continue
            if c.sticky and key in sticky_seen:
                continue  # already told; a person resolved it
            alert = Alert.objects.create(run=run, rule=c.rule, subject=c.subject, dedup_key=key,
                                         severity=c.severity, summary=c.summary, opened_at=now,
                                         last_seen_at=now)
            flips.append(AlertFlip.objects.create(alert=alert, old_state="", new_state="firing",
                                                  reason=c.summary, created_at=now))
        for key, alert in open_alerts.items():
            if key in wanted:
                continue
            if alert.rule in EVENT_RULES and not ended:
                continue  # facts of the past stay until a person resolves them
            flip = alert.change_state("resolved", reason="the condition cleared")
            if flip:
                flips.append(flip)
    return flips
