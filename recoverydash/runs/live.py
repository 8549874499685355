"""The live attempt of runs read from stored state (docs/definitions.md#concurrent-attempts).

The core decides which attempt is live (``recovery.concurrency.live_attempt``: the one still
committing; a requeued duplicate that cancelled itself is not) and stores it in the analysis
result (``live_attempt``, with ``newest_attempt``, the newest attempt it saw). Readers of stored
state (the silence rules, the fleet's attempt state, the run page) take it from there through
``recovery.concurrency.stored_live_attempt``, never "the newest attempt by number".
"""
from __future__ import annotations

from django.db.models.fields.json import KeyTransform

from recoverydash.recovery.concurrency import stored_live_attempt


def pick_live(rows: list, stored) -> tuple | None:
    """The live attempt among ``rows``, ``[(attempt pk, attempt, ended_at)]`` of one run in
    attempt order, given its stored result or clock ``stored`` (None: no analysis); returns its
    row, None without attempts (``recovery.concurrency.stored_live_attempt``)."""
    if not rows:
        return None
    newest = rows[-1]
    live = stored_live_attempt(stored, newest[1], newest[2] is not None)
    return next((r for r in rows if r[1] == live), newest)


def live_attempts(run_pks) -> dict:
    """``{run pk: (attempt pk, attempt, ended_at)}``: the live attempt of each run of
    ``run_pks`` that has an attempt (:func:`pick_live` over its stored analysis). Two queries
    whatever the number of runs: the runs' attempts, and two small keys of their stored results."""
    from recoverydash.runs.models import Analysis, Attempt

    pks = list(run_pks)
    rows: dict[int, list] = {}
    for run_id, pk, number, ended_at in (Attempt.objects.filter(run_id__in=pks)
                                         .order_by("run_id", "attempt")
                                         .values_list("run_id", "pk", "attempt", "ended_at")):
        rows.setdefault(run_id, []).append((pk, number, ended_at))
    stored = {run_id: {"live_attempt": live, "newest_attempt": newest}
              for run_id, live, newest in (
                  Analysis.objects.filter(run_id__in=list(rows))
                  .annotate(r_live=KeyTransform("live_attempt", "result"),
                            r_newest=KeyTransform("newest_attempt", "result"))
                  .values_list("run_id", "r_live", "r_newest"))}
    out = {}
    for run_id, mine in rows.items():
        row = pick_live(mine, stored.get(run_id))
        if row is not None:
            out[run_id] = row
    return out
