"""The recovery contract (wire contract, ``attempt_started.contract``) and its defaults, defined
once for the whole project: the core's analysis, the ingest schema, the alert rules, the
dashboard's forms and pages, and the trainer SDK read them from here.

This module imports nothing but the standard library, so the SDK can import it in a training
process (``import recoverydash.recovery.contract`` loads no other module of the core: the package
``__init__`` is lazy).

Fields (docs/definitions.md#health, #seconds-since-last-restorable):

* ``max_replay_samples`` (positions): a restart that replays more is ``failing`` and opens
  ``restart_replay``;
* ``max_omission_samples`` (positions): the same for omissions and ``restart_omission``;
* ``required_components``: components every generation must hold to be restorable;
* ``max_checkpoint_age_s`` (seconds): seconds since the last restorable generation above it make
  the run ``at_risk`` and open ``checkpoint_stale``. 0 is a legal limit (every second counts).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Components every generation must hold when the contract names none.
DEFAULT_REQUIRED_COMPONENTS: tuple[str, ...] = ("model", "optimizer", "scheduler", "rng",
                                                "data_progress")

#: Contract defaults (wire contract section 4). Read-only: use :func:`effective_contract` for a
#: copy with a run's values.
DEFAULT_CONTRACT: Mapping[str, Any] = {
    "max_replay_samples": 0,
    "max_omission_samples": 0,
    "required_components": list(DEFAULT_REQUIRED_COMPONENTS),
    "max_checkpoint_age_s": 3600,
}


def effective_contract(*contracts: Mapping[str, Any] | None) -> dict[str, Any]:
    """The contract in force: :data:`DEFAULT_CONTRACT` updated by each of ``contracts`` in order
    (the later wins), skipping ``None`` contracts and ``None`` values (a field the trainer left
    out keeps its default; a 0 stays 0). Returns a new dict whose ``required_components`` is a
    new list."""
    merged = dict(DEFAULT_CONTRACT)
    for contract in contracts:
        if contract:
            merged.update({k: v for k, v in contract.items() if v is not None})
    merged["required_components"] = list(merged["required_components"] or ())
    return merged
