"""What ingest calls after a batch commits: enqueue the work it makes necessary.

Called from ``transaction.on_commit`` so a task never sees uncommitted rows. It never raises: a
broker that is down must not fail an ingest whose events are already stored; the periodic sweep
(``workers.tasks.sweep_runs``) and storage re-check pick that work up later.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def after_ingest(run_pks: list[int], committed_generation_pks: list[int]) -> None:
    """Enqueue verification of ``committed_generation_pks`` (whose manifests just arrived) and a
    debounced analysis of each run in ``run_pks``."""
    from recoverydash.runs.analysis import enqueue, request_analysis

    try:
        for pk in committed_generation_pks:
            enqueue("workers.tasks.verify_generation", pk)
        for pk in run_pks:
            request_analysis(pk)
    except Exception:  # the database or broker hiccuped: the sweeps will catch up
        log.exception("after_ingest could not enqueue work for runs %s", run_pks)
