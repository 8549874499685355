"""What follows an analysis: evaluate the run's alert rules and hand new flips to delivery.

The alerts sit above the runs: this module calls ``recoverydash.runs.analysis`` and nothing
below calls back, so the analysis knows nothing of alerts. The Celery tasks ``analyze_run`` and
``evaluate_all_alerts`` (``workers.tasks``) are two lines around :func:`analyze_and_alert` and
:func:`evaluate_all`; tests call these directly.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from recoverydash.alerts.delivery import process_flips
from recoverydash.alerts.rules import evaluate_run, evaluate_runs
from recoverydash.runs.analysis import analyze_queued
from recoverydash.runs.models import Analysis, Run
from recoverydash.runs.queue import (
    DELIVER_WEBHOOK,
    EVALUATE_ALERTS_CHUNK,
    NOTIFY_FLIPS,
    enqueue,
)

log = logging.getLogger(__name__)


def analyze_and_alert(run_pk: int) -> Analysis | None:
    """The ``analyze_run`` task: the run's queued analysis (``runs.analysis.analyze_queued``),
    whose alert rules are evaluated in the transaction that stores it (:func:`evaluate_stored`),
    and the delivery of what flipped once that commits. Returns the Analysis row, or None (run
    gone, or inputs refused: nothing is evaluated then)."""
    return analyze_queued(run_pk)


def evaluate_stored(sender, run: Run, analysis: Analysis, now=None, **kwargs) -> None:
    """Receiver of ``runs.analysis.analysis_stored``: evaluate the run's alert rules inside the
    transaction that stores ``analysis`` (so ``pending_analysis`` turns false only together
    with the alerts of that analysis, docs/ingest-v1.md#recovery), and enqueue the deliveries
    of the new flips once it commits. ``now``: the analysis' own time (an aware datetime; the
    clock when not given), so the clock-driven rules are judged at the moment analysed."""
    fresh = Run.objects.select_related("project").get(pk=run.pk)
    fresh.analysis = analysis
    if evaluate_run(fresh, now=now):
        transaction.on_commit(_deliver)


def _deliver() -> None:
    """After an evaluation that stored flips commits: the deliveries of those that are due
    (``delivery.process_flips`` with ``RECOVERYDASH_ALERT_GROUP_WAIT_S``: an alert's first flip
    at once, so a page is never delayed; flips that follow a notification of the same alert
    within the wait are held), each sent by its own task. When some are held, the
    ``notify_flips`` task is sent with the wait as countdown to send them together (eagerly,
    with no countdown: tests, embedded use, they are processed here now); the periodic
    ``deliver_due`` is the safety net."""
    from recoverydash.alerts.models import AlertFlip

    wait = float(settings.RECOVERYDASH_ALERT_GROUP_WAIT_S)
    if settings.CELERY_TASK_ALWAYS_EAGER:
        wait = 0.0
    for pk in process_flips(group_wait_s=wait):
        enqueue(DELIVER_WEBHOOK, pk)
    if wait > 0 and AlertFlip.objects.filter(processed_at__isnull=True).exists():
        enqueue(NOTIFY_FLIPS, countdown=wait)


def refresh_stale(now=None, refresh_after_s: float | None = None,
                  budget: int | None = None) -> int:
    """Request a new analysis (``runs.analysis.request_analysis``: debounced, one ``analyze_run``
    task each) of at most ``budget`` runs whose stored analysis is older than
    ``refresh_after_s`` seconds, oldest first: runs not ended, and ended runs with an update not
    settled yet (``clock_basis.earliest_unsettled``: a rank's last part that never came counts
    once the settle delay passed, docs/definitions.md#updates-counted-once-complete, and the
    generations and restart waiting for it are decided then). What it is for: the parts of a
    stored result that follow the clock without new events (its ``health``, updates that count
    once settled) as the fleet, the API, the run page and the alert rules read them (the
    clock-driven rules are computed from the stored figures at each cycle,
    :func:`evaluate_chunk`). The analyses run in the
    workers, not in the beat, so a cycle costs ``budget`` small updates and sends whatever the
    number of runs. Every run gets its turn: an analysis moves its run to the back (its
    ``computed_at``), runs already queued (``Run.analysis_queued_at`` within the debounce mark's
    minute) and runs whose inputs were refused since their last events
    (``Analysis.error_seq``) are skipped and cost nothing of the budget.

    Defaults: ``RECOVERYDASH_BEAT_REFRESH_AFTER_S`` and ``RECOVERYDASH_BEAT_REFRESH_BUDGET``.
    Returns how many analyses were requested."""
    from recoverydash.runs.analysis import request_analysis

    now = now or timezone.now()
    after = (settings.RECOVERYDASH_BEAT_REFRESH_AFTER_S if refresh_after_s is None
             else refresh_after_s)
    budget = settings.RECOVERYDASH_BEAT_REFRESH_BUDGET if budget is None else budget
    if budget <= 0:
        return 0
    # the key present and not JSON null (a number: the first report of an unsettled update)
    unsettled = (Q(clock_basis__earliest_unsettled__isnull=False)
                 & ~Q(clock_basis__earliest_unsettled=None))
    due = list(Analysis.objects.filter(~Q(health="ended") | unsettled)
               .filter(computed_at__lt=now - timedelta(seconds=after))
               .exclude(error_seq__gte=F("run__ingest_seq"))
               .filter(Q(run__analysis_queued_at__isnull=True)
                       | Q(run__analysis_queued_at__lt=now - timedelta(seconds=60)))
               .order_by("computed_at", "run_id").values_list("run_id", flat=True)[:budget])
    return sum(1 for pk in due if request_analysis(pk))


def evaluate_all(chunk: int = 200, refresh_after_s: float | None = None,
                 refresh_budget: int | None = None, now=None) -> int:
    """Periodic: evaluate the alert rules of every run that has not ended (the clock-driven
    ones, ``rules.CLOCK_RULES``, change without new events), fanned out in chunks of ``chunk``
    runs in primary-key order (keyset, one ``evaluate_alerts_chunk`` task each), so every run is
    reached every cycle whatever the number of runs; nothing is sliced off. Then requests the
    re-analysis of at most ``refresh_budget`` stale analyses (:func:`refresh_stale`, run by the
    workers).

    Returns the number of runs evaluated here (``CELERY_TASK_ALWAYS_EAGER``: the chunks run in
    this process; ``now`` their clock, default each chunk's) or handed to the workers."""
    live = Analysis.objects.exclude(health="ended")
    count, after = 0, 0
    while True:
        pks = list(live.filter(run_id__gt=after).order_by("run_id")
                   .values_list("run_id", flat=True)[:chunk])
        if not pks:
            break
        after = pks[-1]
        if settings.CELERY_TASK_ALWAYS_EAGER:
            count += evaluate_chunk(pks, now=now)
        elif enqueue(EVALUATE_ALERTS_CHUNK, pks, []):
            count += len(pks)
    refresh_stale(refresh_after_s=refresh_after_s, budget=refresh_budget)
    return count


def clock_changes(pks: list[int], now) -> tuple[list[int], list[tuple], int]:
    """Which of runs ``pks`` (not ended) the clock-driven rules (``rules.CLOCK_RULES``) would
    change now, from a few bulk reads of stored columns: per run its open alerts (read first),
    its ``Analysis.clock`` (``runs.models.clock_of``), contract, first and last event times, its
    live attempt's ``ended_at`` (``runs.live.pick_live``: docs/definitions.md#concurrent-attempts)
    and its reporters' RankSeen rows in aggregate
    (``rules.silences_of``: per attempt a count, the newest and oldest time, and the rows of
    silent ranks only). For each run the same ``rules.clock_conditions`` as the full evaluation
    gives the (rule, subject, severity) that hold now; the run changes when that set differs
    from what its open alerts of those rules list (a rule newly holding, cleared, a subject
    added or removed, a severity changed), or when it has an open alert stored before alerts
    grouped their subjects. Every other rule changes only with a stored analysis, which
    evaluates them itself (:func:`evaluate_stored`).

    An open alert that still holds gets the words the full evaluation would give it now (its
    subjects' summaries and ``rules.group_summary``: the durations move with the clock);
    ``checkpoint_stale`` names the last restorable generation, which the clock does not carry,
    so for the runs where it holds the stored result's ``last_restorable`` (a few bytes of the
    jsonb) is read and the conditions computed with it, as the full evaluation does.

    Returns ``(changed run pks, holding, runs read)``; ``holding`` lists per open alert that
    still holds ``(pk, last_seen_at, subjects, summary)`` as read and ``(subjects, summary)``
    it should have now (the same when unchanged)."""
    from typing import cast

    from recoverydash.alerts.models import Alert
    from recoverydash.alerts.rules import (
        CLOCK_RULES,
        clock_conditions,
        group_summary,
        natural_key,
        rule_info,
        settled_holding,
        silences_of,
    )
    from recoverydash.recovery.contract import effective_contract
    from recoverydash.runs.live import pick_live
    from recoverydash.runs.models import Attempt

    alerts: dict[int, list] = {}  # read before the clocks (see _keep_holding)
    for row in (Alert.objects.filter(run_id__in=pks).exclude(state="resolved")
                .values_list("pk", "run_id", "rule", "dedup_key", "subjects", "summary",
                             "last_seen_at")):
        alerts.setdefault(row[1], []).append(row)
    from recoverydash.runs.monitoring import not_paused

    rows = list(Analysis.objects.filter(run_id__in=pks).exclude(health="ended")
                .filter(not_paused("run__"))  # a paused run pages nobody (runs.monitoring)
                .values_list("run_id", "clock", "run__run_id", "run__contract",
                             "run__first_event_at", "run__last_received_at"))
    clocks = {row[0]: row[1] or {} for row in rows}
    rows_of: dict[int, list] = {}
    for run_id, pk, attempt, ended_at in (Attempt.objects.filter(run_id__in=list(clocks))
                                          .order_by("run_id", "attempt")
                                          .values_list("run_id", "pk", "attempt", "ended_at")):
        rows_of.setdefault(run_id, []).append((pk, attempt, ended_at))
    # the live attempt (docs/definitions.md#concurrent-attempts), from the stored clock
    attempts = {run_id: cast(tuple, pick_live(mine, clocks.get(run_id)))
                for run_id, mine in rows_of.items()}
    silences = silences_of({r: a for r, a in attempts.items() if r in clocks}, clocks, now)

    def judge(run_id, clock, name, contract, first_event_at, last_received_at):
        have, keep, legacy = set(), [], False
        for row in alerts.get(run_id, ()):
            _, _, rule, dedup_key, subjects, _, _ = row
            if dedup_key != f"{name}:{rule}:":  # rules.group_key
                legacy = True
            elif rule in CLOCK_RULES:
                if not subjects:
                    legacy = True  # stored before alerts listed subjects
                have.update((rule, i["subject"], i["severity"]) for i in subjects or [])
                keep.append(row)
        found = clock_conditions(clock, effective_contract(contract), now=now,
                                 first_event_at=first_event_at,
                                 last_received_at=last_received_at,
                                 silence=silences.get(run_id))
        # as the full evaluation: a condition not settled keeps a subject, never adds one
        found = settled_holding(found, {(r, s) for r, s, _ in have})
        want = {(c.rule, c.subject, c.severity) for c in found}
        return found, keep, legacy or want != have

    changed, judged, named = [], [], []
    for run_id, clock, name, contract, first_event_at, last_received_at in rows:
        found, keep, changes = judge(run_id, clock or {}, name, contract, first_event_at,
                                     last_received_at)
        if changes:
            changed.append(run_id)
        elif keep:
            judged.append([run_id, found, keep])
            if any(c.rule == "checkpoint_stale" for c in found):
                named.append(run_id)
    if named:  # the generation the summary names: the full evaluation reads it from the result
        last = dict(Analysis.objects.filter(run_id__in=named)
                    .values_list("run_id", "result__last_restorable"))
        by_run = {row[0]: row for row in rows}
        for entry in judged:
            if entry[0] in last:
                run_id, clock, *rest = by_run[entry[0]]
                found, keep, changes = judge(run_id, dict(clock or {},
                                                          last_restorable=last[run_id]), *rest)
                if changes:  # the result's own time disagrees with its clock: in full
                    changed.append(run_id)
                    entry[2] = []
                else:
                    entry[1] = found
    holding = []
    for _run_id, found, keep in judged:
        for pk, _, rule, _, subjects, summary, seen_at in keep:
            info = rule_info(rule)
            since = {i["subject"]: i.get("since") for i in subjects or []}
            items = sorted(({"subject": c.subject, "kind": info.subject, "severity": c.severity,
                             "summary": c.summary, "detail": c.detail,
                             "since": since.get(c.subject)}
                            for c in found if c.rule == rule),
                           key=lambda i: natural_key(i["subject"]))
            holding.append((pk, seen_at, subjects, summary, items, group_summary(rule, items)))
    return sorted(changed), holding, len(rows)


#: The Analysis columns the evaluation never reads from the run it is given (``rules.evaluate_runs``
#: reads the result itself, under the row's lock): not loaded with the runs of a chunk.
_HEAVY = ("analysis__state", "analysis__inputs", "analysis__result")


def evaluate_chunk(pks: list[int], refresh: list[int] = (), now=None) -> int:
    """The ``evaluate_alerts_chunk`` task: evaluate the alert rules of runs ``pks`` (run primary
    keys) not ended. The clock-driven conditions of every run are computed from stored columns
    (:func:`clock_changes`, a few hundred microseconds a run); only runs whose alerts would
    change go through the full evaluation, all of them in one transaction
    (``rules.evaluate_runs``: bulk reads and writes, exactly what ``rules.evaluate_run`` makes
    of each run; should it fail, run by run, so one run's failure never stops the others), and
    their flips become deliveries in one pass once it commits; the open alerts that still hold
    get their ``last_seen_at`` and the words the full evaluation would give them now
    (:func:`_keep_holding`). ``refresh`` (messages of an older beat): analyses requested first.
    Idempotent. ``now``: the clock (default: read once for the chunk). Returns how many runs
    were evaluated."""
    from recoverydash.runs.analysis import request_analysis

    for pk in refresh:
        request_analysis(pk)
    now = now or timezone.now()
    changed, holding, count = clock_changes(pks, now)
    if holding:
        _keep_holding(holding, now)
    if not changed:
        return count
    runs = list(Run.objects.select_related("analysis").defer(*_HEAVY).filter(pk__in=changed)
                .order_by("pk"))
    try:
        flipped = bool(evaluate_runs(runs, now=now))
    except Exception:  # one run's failure must not stop the others' alerts
        log.warning("alert evaluation of %d runs together failed; run by run", len(runs),
                    exc_info=True)
        flipped = False
        for run in runs:
            try:
                flipped = bool(evaluate_runs([run], now=now)) or flipped
            except Exception:
                count -= 1
                log.exception("run %s: alert evaluation failed", run.pk)
    if flipped:
        _deliver()
    return count


def _keep_holding(holding: list[tuple], now) -> int:
    """Store on the open alerts that still hold (``clock_changes``' ``holding``) what the full
    evaluation would store: ``last_seen_at`` ``now`` and, where the words moved with the clock,
    their subjects' summaries and summary, in one transaction: the alerts locked in the order
    ``rules.evaluate_runs`` locks them, and only those as they were read (``last_seen_at`` and
    summary unchanged, still open) written: an alert another evaluation wrote since (an
    analysis stored in between) is left as it wrote it. The alerts were read before the clocks,
    so an analysis stored between the two reads is seen here too (it moved the alert's
    ``last_seen_at``), and words computed from an older clock never overwrite it. No flip (the
    subjects and severity are the same). One UPDATE for ``last_seen_at`` alone, one for the
    words (``rules.write_words``). Returns how many alerts were written."""
    from recoverydash.alerts.models import Alert
    from recoverydash.alerts.rules import worst_severity, write_words

    read = {pk: (seen_at, subjects, summary, items, words)
            for pk, seen_at, subjects, summary, items, words in holding}
    with transaction.atomic():
        now_read = (Alert.objects.select_for_update(no_key=True).filter(pk__in=read)
                    .exclude(state="resolved").order_by("run_id", "opened_at", "pk")
                    .values_list("pk", "last_seen_at", "summary"))
        same, moved = [], []
        for pk, seen_at, summary in now_read:
            was_seen, subjects, was_summary, items, words = read[pk]
            if (seen_at, summary) != (was_seen, was_summary):
                continue  # written since it was read (every evaluation moves last_seen_at)
            if (items, words) == (subjects, summary):
                same.append(pk)
            else:  # the severity is the same (the alert holds unchanged)
                moved.append(Alert(pk=pk, subjects=items, summary=words,
                                   severity=worst_severity(items)))
        if same:
            Alert.objects.filter(pk__in=same).update(last_seen_at=now)
        write_words(moved, now)
    return len(same) + len(moved)
