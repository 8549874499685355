"""recoverydash recovery core: which checkpoint can be resumed, how much work is at risk, and
whether a restart replayed or skipped data. Pure Python (pyroaring), no Django or Celery.

Every figure implements a definition of ``docs/definitions.md`` and the wire contract
``docs/ingest-v1.md`` (sections 3-5), and is computed by one function named after it: run-level
figures and chart series in ``figures.py``, costs in ``costs.py``, restart figures in
``restarts.py``, counting in ``counting.py``, generation statuses in ``generations.py``; the
contract defaults are ``contract.py``'s ``DEFAULT_CONTRACT``. Pages, alerts and APIs import them.

Calling it
----------
::

    from recoverydash.recovery import RunInput, analyze, restore_plan

    run = RunInput.from_events(events, object_checks={uri: "ok", ...})   # or build the records
    analysis = analyze(run, now=time.time())          # the caller passes `now`, in POSIX seconds
    analysis.to_dict()   # run_id, health, last_restorable, seconds_since_last_restorable,
                         # updates_at_risk, generations, restarts, strata (spec 5) + costs, charts
                         # (committed_cursor, fetched, tslrc), restorable_elsewhere (ids
                         # restorable outside the live lineage), first_event_at, ended_at:
                         # typed as result.AnalysisResult (TypedDicts, the one definition of
                         # the shape every reader annotates its value with)
    seconds_since_last_restorable(stored_dict, later)  # figures.py: the same figure at a later
                                                       # time, from the stored dict
    plan = restore_plan(analysis, world_size=64)      # plan.status_code 200 or 409, plan.body

Incrementally (a worker keeping the ledger state in the database)::

    ledger = Ledger.from_bytes(blob) if blob else Ledger()
    ledger.absorb(new_ledger_records)                 # O(1) amortised per record; groups in
                                                      # the DistributedSampler shape are checked
                                                      # against a template in one C-level pass
    analysis = analyze(run_without_ledger_rows, now, ledger=ledger)
    blob = ledger.to_bytes()

Inputs (``inputs.py``; times are float POSIX seconds, UTC)
-----------------------------------------------------------
* ``AttemptRecord(attempt, started_at, world_size, dataset_version, global_batch_size,
  micro_batch_size, grad_accum_steps, config_digest, sampler: dict, resumed_from: dict|None
  {"generation_id", "update", "cursor": [Cursor]}, contract: dict|None, ended_at, end_reason,
  end_update, end_fetched: [Cursor], last_event_at)``
* ``LedgerRecord(attempt, update, rank: int|None, time, spans: [wire Span])``
* ``HeartbeatRecord(attempt, rank, time, update, fetched: [Cursor])``
* ``GenerationRecord(generation_id, attempt, update, started_at, required_shards, components,
  shards: {shard: ShardRecord(update, objects, time)}, manifests: [manifest dict],
  committed_at, object_checks: {uri: "ok"|"object_missing"|"size_mismatch"|
  "digest_mismatch"|"storage_unverified"|"object_outside_locations"})``: a uri missing from
  ``object_checks`` is not checked yet.
* ``RestoreRecord(attempt, generation_id, seconds, time)``
* ``RunInput(run_id, attempts, ledger, heartbeats, generations, restores, contract,
  first_event_at)``

Positions
---------
Positions are compared per ``(stratum, epoch, order)``; padding spans never count; reports of
one data-parallel rank for one ``(attempt, update)`` are united, while two ranks reporting a
position count it twice; a null rank is one reporter of its own. Sample ids map to positions by
:func:`identity_position`: an int in ``[0, 2**63)`` is its own position, a str is the first 8
bytes (big-endian) of ``blake2b(utf8, digest_size=8)``, other ints hash ``"int:<decimal>"``.
Strata of sample ids count consumed and duplicates but have no cursor; when every id is an int
(dataset indices) and ``epoch_length`` is known, the ids of ``[0, epoch_length)`` an epoch the
lineage moved on from never consumed are omissions (tail rule), in the strata and in a
restart's ``omitted`` (docs/definitions.md#sample-id-strata).

Limits (memory is bounded by the reports, not by the numeric reach of their values)
-----------------------------------------------------------------------------------
* One wire range may reach at most ``MAX_RANGE_LENGTH`` = 2**30 positions (``stop - start``); a
  longer one raises ``ValueError`` naming the range (at ``Ledger.absorb``, hence ``analyze``).
  Counting builds roaring bitmaps, one container per 2**16 positions of reach: a legal span
  ``[0, 2**63 - 1]`` would need 2**47 of them. Within the bound a range costs at most 16,385.
* Updates of ledger records must lie in ``[0, 2**63)`` (64-bit bitmaps; else ``ValueError``).
  Report times are kept per chunk of 64 consecutive updates, so far-apart updates (1 and 10**8)
  cost one chunk each, not the gap.
* Cursors (an untracked root's pre-tracking cursor, read cursors) are intervals ``[0, position)``
  and are never built as bitmaps: any position below 2**63 is fine.

Choices where the documents are silent
--------------------------------------
* A cursor without ``order`` used as pre-tracking state applies to order None; a read cursor
  (``fetched``) without ``order`` applies to every order of its (stratum, epoch).
* The drop_last threshold of an epoch tail is the global batch of the newest lineage attempt that
  consumed that key (the root's for pre-tracking positions); an unknown batch drops no tail.
  ``epoch_length`` comes from the newest attempt's sampler that names the stratum.
* Refinement of the epoch tail rule (docs/definitions.md#refinements): an epoch of a stratum that
  the lineage skipped entirely (nothing of that (stratum, epoch) under any order, while an earlier
  and a later epoch were consumed) counts ``epoch_length`` omissions when the length is known, in
  the strata and, when the skip happens at a restart (between L_U's epoch and k's first epoch), in
  ``omitted``. The drop_last exemption is for a tail shorter than a global batch, not for a whole
  epoch. Epochs below the lineage's lowest consumed epoch are not counted (numbering may start
  at 1).
* ``storage_unverified`` keeps a generation ``committed`` (not proven, not disproven).
* An attempt with no ``attempt_started`` is fresh if it is the first, else resumed from unknown.
* A lineage whose root is unknown (resumed from unknown, from a generation the core does not
  know, or untracked) is tracked only from where it starts: positions behind an explicit cursor
  count as consumed (docs/definitions.md#lineage); without a cursor for the stratum, positions below
  the lineage's first position in each key (stratum, epoch, order) consumed at its first update of
  the stratum are unknown, neither consumed nor omitted, so no omission and no replay rests on them
  (``lineage.lineage_floors``). What the lineage skips once tracked still counts. Such a restart is
  ``unverified``, and its ``lost_updates`` is 0 (``lost_seconds`` None): it cannot be tied to its
  predecessor's updates, and the finding ``resumed_from_unknown`` says so.
* ``world_size_before``, ``global_batch`` and ``dataset_version`` changes compare attempt k with
  its predecessor k-1.

Incremental contract
--------------------
``Ledger.absorb`` accepts any new ledger records, in any order, including re-sent or extra
reports of an ``(attempt, update, rank)`` already absorbed (united, as the spec says). Heartbeats
fold into the same state: ``Ledger.beats.absorb`` (``heartbeats.HeartbeatFold``) keeps only what
the figures read (the furthest read cursor per attempt, stratum, epoch and order, the last
heartbeat per attempt and rank, the fetched chart's points), so absorbing them in batches equals
absorbing them at once. Heartbeats given in ``RunInput.heartbeats`` are folded on top of the
ledger's fold by :func:`analyze`. Everything else (attempts, generations, restores, object checks)
is passed whole to :func:`analyze` each time. A state loaded from a format before
``ledger.CONTINUED_FORMAT`` (``Ledger.state_format``) holds no heartbeats: a caller folding them
incrementally rebuilds it from its rows. ``Ledger.to_parts`` / ``from_parts`` store the state as a
head and blocks of per-update times, giving only the blocks written since the load: what a caller
writes per analysis does not grow with the run's history.

With no new input at all, the clock-driven figures (``split_clock_driven``) at a later time come
from the small ``clock_basis`` of the last analysis (``clock_driven_at``), equal to a full
analysis at that time, or None when an update would settle by age meanwhile.
"""
from __future__ import annotations

import importlib

# Lazy exports (PEP 562): ``import recoverydash.recovery.contract`` (the trainer SDK does) loads
# that module alone, not the analysis and pyroaring; ``from recoverydash.recovery import analyze``
# loads what it names on first use.
_EXPORTS = {
    "RestorePlan": "analysis", "RunAnalysis": "analysis", "analyze": "analysis",
    "restore_plan": "analysis", "split_clock_driven": "analysis",
    "clock_basis": "analysis", "clock_driven_at": "analysis",
    "GENERATIONS_SHOWN": "analysis", "generations_summary": "analysis",
    "shown_generations": "analysis",
    "Costs": "costs",
    "DEFAULT_CONTRACT": "contract", "effective_contract": "contract",
    "GenerationVerdict": "generations", "Reason": "generations",
    "local_judgement": "generations", "continue_repeats": "generations",
    "repeat_row": "generations",
    "AttemptRecord": "inputs", "GenerationRecord": "inputs", "HeartbeatRecord": "inputs",
    "LedgerRecord": "inputs", "RestoreRecord": "inputs", "RunInput": "inputs",
    "ShardRecord": "inputs", "format_time": "inputs", "parse_time": "inputs",
    "Ledger": "ledger", "HeartbeatFold": "heartbeats", "Lineage": "lineage", "Segment": "lineage",
    "StratumCount": "counting",
    "RunView": "view",
    "identity_position": "positions",
    "Restart": "restarts",
    "AnalysisResult": "result",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
