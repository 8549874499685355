"""Editing a run's recovery contract from outside the trainer (the dashboard's contract form, the
admin API, ``manage.py apply_config``). The contract's fields and defaults are the core's
(``recoverydash.recovery.contract``)."""

from __future__ import annotations

from django.db import transaction

from recoverydash.recovery.contract import DEFAULT_CONTRACT
from recoverydash.runs.seq import mark_changed

#: The fields of a contract (docs/ingest-v1.md#attempt_started ``contract``).
CONTRACT_FIELDS: tuple[str, ...] = tuple(DEFAULT_CONTRACT)


def save_contract(run, values: dict) -> dict:
    """Replace the run's recovery contract (docs/ingest-v1.md#attempt_started ``contract``) with
    ``values``; keys outside the contract's four are kept as they were. A later ``attempt_started``
    carrying a contract replaces this one again (the latest one wins). Returns the stored
    contract. The caller has checked the values (types and ranges)."""
    with transaction.atomic():
        mark_changed(run.pk)  # an input of the analysis changes without an ingest batch
        locked = type(run).objects.select_for_update().get(pk=run.pk)
        contract = dict(locked.contract or {})
        for key in CONTRACT_FIELDS:
            if key in values:
                contract[key] = values[key]
        locked.contract = contract
        locked.save(update_fields=["contract"])
    run.ingest_seq = locked.ingest_seq
    run.contract = contract
    return contract
