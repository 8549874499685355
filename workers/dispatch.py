"""What ingest calls after a batch commits: enqueue the work it makes necessary.

Called from ``transaction.on_commit`` so a task never sees uncommitted rows. It never raises: a
broker that is down must not fail an ingest whose events are already stored; the periodic sweep
picks those runs up later (issue 4).
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def after_ingest(run_pks: list[int], committed_generation_pks: list[int]) -> None:
    """Enqueue analysis for ``run_pks`` and verification for ``committed_generation_pks``.

    Being wired to Celery by the workers issue; until then it only logs.
    """
    log.debug("after_ingest runs=%s generations=%s", run_pks, committed_generation_pks)
