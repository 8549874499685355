"""The clock-driven figures recomputed from a stored clock basis (``recovery.clock_driven_at``)
equal a full analysis of the same inputs at the same time, exact values, and the rest of that
full analysis equals the analysis the basis came from
(docs/definitions.md#seconds-since-last-restorable, docs/definitions.md#health,
docs/definitions.md#goodput, docs/definitions.md#updates-counted-once-complete)."""
from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from recovery_runs import runs

from recoverydash.recovery import (
    AttemptRecord,
    GenerationRecord,
    LedgerRecord,
    RunInput,
    analyze,
    clock_basis,
    clock_driven_at,
    split_clock_driven,
)
from recoverydash.recovery.analysis import CLOCK_BASIS_FORMAT

SETTINGS = settings(max_examples=int(__import__("os").environ.get("RECOVERY_EXAMPLES", "300")),
                    deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def stored(basis):
    """The basis as the worker stores it (a JSON column)."""
    return json.loads(json.dumps(basis, allow_nan=False))


@SETTINGS
@given(runs(), st.sampled_from([300.0, 1e9]), st.floats(0, 5000), st.lists(
    st.floats(0, 1e6), min_size=1, max_size=4))
def test_clock_driven_at_equals_a_full_analysis_at_that_time(run, settle, offset, laters):
    times = [r.time for r in run.ledger] + [a.started_at for a in run.attempts
                                            if a.started_at is not None]
    first = min(times, default=1000.0) + offset
    full = analyze(run, first, settle_seconds=settle)
    basis = clock_basis(full)
    assert basis is not None
    basis = stored(basis)
    rest, _ = split_clock_driven(full.to_dict())
    for later in [0.0] + laters:
        now = first + later
        got = clock_driven_at(basis, now, settle)
        again = analyze(run, now, settle_seconds=settle).to_dict()
        other, timed = split_clock_driven(again)
        if got is None:
            # only an update settling by age in between (or the clock going back) refuses it
            assert basis["earliest_unsettled"] is not None
            assert not now - settle < basis["earliest_unsettled"]
            continue
        assert json.dumps(got, sort_keys=True) == json.dumps(timed, sort_keys=True)
        assert json.dumps(other, sort_keys=True) == json.dumps(rest, sort_keys=True)


def simple_run(ended=None):
    attempt = AttemptRecord(attempt=0, started_at=100.0, world_size=2, global_batch_size=4,
                            dataset_version="ds", end_reason=ended,
                            ended_at=None if ended is None else 150.0)
    ledger = [LedgerRecord(0, u, r, 100.0 + 10 * u,
                           [{"stratum": "s", "epoch": 0, "ranges": [[4 * u + 2 * r,
                                                                     4 * u + 2 * r + 2]]}])
              for u in range(1, 4) for r in range(2)]
    # update 4: rank 1's part has not arrived (unsettled until 300 s after its first report)
    ledger.append(LedgerRecord(0, 4, 0, 140.0, [{"stratum": "s", "epoch": 0,
                                                 "ranges": [[16, 18]]}]))
    manifest = {"schema_revision": 1, "generation_id": "g1", "update": 2, "world_size": 2,
                "required_shards": ["rank0"], "components": ["model"],
                "objects": [{"uri": "file:///g1/model", "shard": "rank0", "component": "model",
                             "size": 1, "sha256": "0" * 64}],
                "data_progress": {"cursor": [{"stratum": "s", "epoch": 0, "position": 12}]},
                "dataset_version": "ds", "committed_at": 125.0}
    gen = GenerationRecord(generation_id="g1", attempt=0, update=2, started_at=121.0,
                           required_shards=["rank0"], components=["model"],
                           manifests=[manifest], committed_at=125.0,
                           object_checks={"file:///g1/model": "ok"})
    return RunInput(run_id="r", attempts=[attempt], ledger=ledger, heartbeats=[],
                    generations=[gen], first_event_at=100.0,
                    contract={"required_components": ["model"]})


def test_the_basis_figures_and_where_it_stops():
    run = simple_run()
    full = analyze(run, 200.0, settle_seconds=300.0)
    basis = stored(clock_basis(full))
    assert basis["format"] == CLOCK_BASIS_FORMAT
    assert basis["earliest_unsettled"] == 140.0  # update 4, first reported at 140 s
    assert basis["last_committed_at"] == 125.0 and basis["first_event_at"] == 100.0
    got = clock_driven_at(basis, 400.0, 300.0)
    assert got["seconds_since_last_restorable"] == 275.0  # 400 - 125
    assert got["costs"]["wall_seconds"] == 300.0  # 400 - 100
    assert got["charts"]["tslrc"]["seconds"][-1] == 275.0
    assert got == split_clock_driven(analyze(run, 400.0, settle_seconds=300.0).to_dict())[1]
    # at 440 s update 4 settles by age (140 + 300): the figures may change, no shortcut
    assert clock_driven_at(basis, 439.0, 300.0) is not None
    assert clock_driven_at(basis, 440.0, 300.0) is None
    # the clock going back, another settle delay, another format: none either
    assert clock_driven_at(basis, 199.0, 300.0) is None
    assert clock_driven_at(basis, 300.0, 60.0) is None
    assert clock_driven_at({**basis, "format": CLOCK_BASIS_FORMAT + 1}, 300.0, 300.0) is None


def test_an_ended_run_stops_its_clock():
    run = simple_run(ended="completed")
    # rank 1's part of update 4 may still come with its exit: attempt_ended settles nothing
    # (docs/definitions.md#updates-counted-once-complete), the age does (140 + 300)
    assert stored(clock_basis(analyze(run, 200.0)))["earliest_unsettled"] == 140.0
    assert clock_driven_at(stored(clock_basis(analyze(run, 200.0))), 440.0, 300.0) is None
    basis = stored(clock_basis(analyze(run, 440.0)))
    assert basis["earliest_unsettled"] is None
    got = clock_driven_at(basis, 10_000.0, 300.0)
    assert got["health"] == "ended"
    assert got["seconds_since_last_restorable"] == 25.0  # 150 (end) - 125
    assert got == split_clock_driven(analyze(run, 10_000.0).to_dict())[1]
