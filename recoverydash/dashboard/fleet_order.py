"""The fleet's order and filters as SQL: ``recovery.attention`` (the definition,
docs/definitions.md#attention-order) and ``recovery.figures.seconds_since_last_restorable``
(docs/definitions.md#seconds-since-last-restorable, #at-risk-ratio) written as Django
expressions over stored columns and ``now``, so that the database sorts, filters and cuts a page
and Python touches only the page's rows.

The expressions must give exactly the order of ``attention_key`` and the set of
``needs_attention``; tests/dashboard/test_fleet_order.py compares them over varied runs. Stored
inputs: ``Analysis.clock_since_s`` / ``clock_ended_s`` (``runs.models.clock_columns``),
``Run.max_checkpoint_age_s`` (``runs.models.checkpoint_age_limit_of``, None: the default
contract's), ``Analysis.health``, ``Run.is_drill``; open alerts are counted per run by
one grouped join with the alerts.
"""

from __future__ import annotations

from datetime import timedelta

from django.db.models import (
    Case,
    Count,
    Exists,
    ExpressionWrapper,
    F,
    FloatField,
    IntegerField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Value,
    When,
)
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast, Coalesce

from recoverydash.recovery.attention import HEALTH_RANK
from recoverydash.recovery.contract import DEFAULT_CONTRACT
from recoverydash.runs.models import Attempt
from recoverydash.runs.monitoring import not_paused

#: attempt states in the order the ``attempt`` column sorts them (dashboard.queries).
ATTEMPT_STATES = ("running", "silent", "ended")


def _open_alerts(severity: str | None = None):
    """The number of open (not resolved) alerts of the run, of ``severity`` or of any: one
    grouped join with the alerts (cheaper than a subquery per run and severity)."""
    only = ~Q(alerts__state="resolved")
    if severity is not None:
        only &= Q(alerts__severity=severity)
    return Count("alerts", filter=only)


def annotate_attention(runs: QuerySet, now, drill: str | None) -> QuerySet:
    """``runs`` with the attention order's inputs as annotations, computed in SQL at ``now``
    (an aware datetime):

    - ``f_drill``: 1 for a drill run (``drill``: the Run field's name, None when there is none);
    - ``f_critical``, ``f_warning``, ``f_open``: open alerts (not resolved) by severity and all;
    - ``f_seconds``: ``seconds_since_last_restorable`` of the stored clock, seconds, None when
      the run has no analysis or its clock knows no start: ``min(now, end) - since``, never
      below 0;
    - ``f_inf`` and ``f_ratio``: ``at_risk_ratio``, split so that the database needs no
      infinity: ``f_inf`` 1 where the ratio is ``inf`` (a limit of 0 or less and a positive
      age), ``f_ratio`` the finite ratio (0 there, for an ended run and unknown seconds);
    - ``f_health``: ``HEALTH_RANK`` of the health word (not analysed: ``len(HEALTH_RANK)``)."""
    now_s = now.timestamp()
    now_v = Value(now_s, output_field=FloatField())
    default_limit = float(DEFAULT_CONTRACT["max_checkpoint_age_s"])
    runs = runs.annotate(
        f_drill=(Case(When(**{drill: True}, then=Value(1)), default=Value(0),
                      output_field=IntegerField()) if drill else Value(0, IntegerField())),
        f_critical=_open_alerts("critical"), f_warning=_open_alerts("warning"),
        f_open=_open_alerts(),
        f_end=Case(When(analysis__clock_ended_s__lt=now_s, then=F("analysis__clock_ended_s")),
                   default=now_v, output_field=FloatField()),
        f_limit=Coalesce(F("max_checkpoint_age_s"), Value(default_limit),
                         output_field=FloatField()),
    ).annotate(
        f_raw=ExpressionWrapper(F("f_end") - F("analysis__clock_since_s"),
                                output_field=FloatField()),
    ).annotate(
        f_seconds=Case(When(f_raw__lt=0.0, then=Value(0.0)), default=F("f_raw"),
                       output_field=FloatField()),
    )
    zero = Q(f_seconds__isnull=True) | Q(analysis__health="ended")
    return runs.annotate(
        f_inf=Case(When(zero, then=Value(0)), When(f_limit__lte=0.0, f_seconds__gt=0.0,
                                                    then=Value(1)),
                   default=Value(0), output_field=IntegerField()),
        f_ratio=Case(When(zero, then=Value(0.0)), When(f_limit__lte=0.0, then=Value(0.0)),
                     default=ExpressionWrapper(F("f_seconds") / F("f_limit"),
                                               output_field=FloatField()),
                     output_field=FloatField()),
        f_health=Case(*[When(analysis__health=word, then=Value(rank))
                        for word, rank in HEALTH_RANK.items()],
                      default=Value(len(HEALTH_RANK)), output_field=IntegerField()),
    )


#: ``needs_attention`` over the annotations of :func:`annotate_attention`; a run whose monitoring
#: is paused (``runs.monitoring``) needs none.
NEEDS_ATTENTION = Q(f_drill=0) & not_paused() & (Q(f_critical__gt=0) | Q(f_warning__gt=0)
                                                 | Q(f_inf=1)
                                                 | Q(f_ratio__gt=1.0)
                                                 | Q(analysis__health__in=["failing", "at_risk"]))


def annotate_attempt_state(runs: QuerySet, now, silent_s: float) -> QuerySet:
    """``runs`` with ``f_attempt``: the index in ``ATTEMPT_STATES`` of the live attempt's
    state (``dashboard.queries._attempt_state``): ended when it sent attempt_ended, silent when
    nothing was received for more than ``silent_s`` seconds or the run has no attempt, else
    running. The live attempt is the core's (``recovery.concurrency.stored_live_attempt`` of the
    stored result, here in SQL): the newest attempt, unless it ended and the stored analysis,
    which saw it, names an older attempt (still not ended) live: a cancelled duplicate never
    makes a running run ``ended`` (docs/definitions.md#concurrent-attempts)."""
    attempts = Attempt.objects.filter(run=OuterRef("pk"))
    newest = attempts.order_by("-attempt")
    return runs.annotate(
        f_has_attempt=Exists(attempts), f_newest_end=Subquery(newest.values("ended_at")[:1]),
        f_newest_no=Subquery(newest.values("attempt")[:1]),
        f_stored_live=Cast(KeyTextTransform("live_attempt", "analysis__result"),
                           IntegerField()),
        f_stored_newest=Cast(KeyTextTransform("newest_attempt", "analysis__result"),
                             IntegerField()),
    ).annotate(
        f_live_open=Exists(Attempt.objects.filter(run=OuterRef("pk"),
                                                  attempt=OuterRef("f_stored_live"),
                                                  ended_at__isnull=True)),
    ).annotate(f_older_live=Case(  # recovery.concurrency.stored_live_attempt names an older one
        When(Q(f_stored_newest=F("f_newest_no")) & Q(f_stored_live__gte=0)
             & Q(f_stored_live__lt=F("f_newest_no")) & Q(f_live_open=True), then=Value(1)),
        default=Value(0), output_field=IntegerField()),
    ).annotate(f_attempt=Case(
        When(f_has_attempt=False, then=Value(1)),
        When(Q(f_newest_end__isnull=False) & Q(f_older_live=0), then=Value(2)),
        When(last_received_at__isnull=True, then=Value(1)),
        When(last_received_at__lt=now - timedelta(seconds=silent_s), then=Value(1)),
        default=Value(0), output_field=IntegerField()))


def fleet_ordering(key: str, desc: bool) -> list:
    """ORDER BY of the fleet's ``sort`` column ``key`` (dashboard.queries.FLEET_SORTS), every
    part reversed when ``desc``; ties end at run_id, then the row's pk.

    ``attention``: ``attention_key`` then run_id (drill last, more open critical, more open
    warnings, larger at-risk ratio, health rank); ``run``; ``health`` (rank, run_id); ``age``
    (larger ratio, run_id); ``alerts`` (more open, more critical, run_id); ``last_event`` (most
    recent first, never heard from last); ``attempt`` (``ATTEMPT_STATES`` order)."""
    parts = {
        "attention": [("f_drill", True), ("f_critical", False), ("f_warning", False),
                      ("f_inf", False), ("f_ratio", False), ("f_health", True)],
        "run": [],
        "health": [("f_health", True)],
        "age": [("f_inf", False), ("f_ratio", False)],
        "alerts": [("f_open", False), ("f_critical", False)],
        "last_event": [("f_never", True), ("last_received_at", False)],
        "attempt": [("f_attempt", True)],
    }[key] + [("run_id", True), ("pk", True)]
    return [F(name).asc() if ascending != desc else F(name).desc()
            for name, ascending in parts]


def never_heard(runs: QuerySet) -> QuerySet:
    """``runs`` with ``f_never``: 1 when nothing was ever received from the run."""
    return runs.annotate(f_never=Case(When(last_received_at__isnull=True, then=Value(1)),
                                      default=Value(0), output_field=IntegerField()))
