"""The recovery core on adopted generations (docs/definitions.md#data-position-unknown): the
adapter's reasons replace the shard and component rules, a missing data cursor is said, not
compared, and a trainer's own manifest wins over the adopted one."""

from __future__ import annotations

from recoverydash.recovery import RunInput, analyze

URI = "file:///ckpt/step-2/__0_0.distcp"


def adopted(reasons=(), cursor=()):
    """What ``recoverydash.checkpoints.formats.base.Generation.manifest`` builds for a DCP
    step-2."""
    return {"schema_revision": 1, "generation_id": "step-2", "update": 2, "world_size": 1,
            "required_shards": ["rank0"], "components": ["model", "optimizer"],
            "objects": [{"uri": URI, "shard": "rank0", "component": "model", "size": 64,
                         "update": 2}],
            "data_progress": {"cursor": list(cursor)}, "dataset_version": "unknown",
            "committed_at": "2026-11-01T00:00:03Z", "required_components": ["model", "optimizer"],
            "adopted": {"format": "dcp", "rule": "...", "folder": "step-2",
                        "commit_marker": "step-2/.metadata", "progress": {},
                        "reasons": list(reasons)}}


def events(manifests, with_ledger=True):
    out = []
    if with_ledger:
        out.append({"event_id": "s0", "type": "attempt_started", "run_id": "r", "attempt": 0,
                    "time": "2026-11-01T00:00:00Z", "world_size": 1, "dataset_version": "ds-v1",
                    "global_batch_size": 4})
        out += [{"event_id": f"u{u}", "type": "update_committed", "run_id": "r", "attempt": 0,
                 "rank": 0, "time": f"2026-11-01T00:00:0{u}Z", "update": u,
                 "spans": [{"stratum": "m", "epoch": 0, "ranges": [[4 * u - 4, 4 * u]]}]}
                for u in (1, 2, 3)]
    out += [{"event_id": f"c{i}", "type": "checkpoint_committed", "run_id": "r", "attempt": 0,
             "time": "2026-11-01T00:00:03Z", "manifest": m} for i, m in enumerate(manifests)]
    return out


def verdict(evs):
    result = analyze(RunInput.from_events(evs, {URI: "ok"}), now=1.8e9)
    return next(g for g in result.generations if g.generation_id == "step-2")


def test_it_says_data_position_unknown_instead_of_comparing_an_absent_cursor():
    g = verdict(events([adopted()]))
    assert (g.status, g.reasons) == ("restorable", [])
    assert [n.code for n in g.notes] == ["data_position_unknown", "dataset_version_unknown"]
    assert g.to_dict()["notes"][0]["detail"] == (
        "data position unknown: the dcp checkpoint records no data cursor, so whether a "
        "restart from it continues the data stream is not known from the checkpoint")


def test_an_adopted_generation_of_a_run_with_no_events_is_restorable_once_verified():
    g = verdict(events([adopted()], with_ledger=False))
    assert (g.status, g.reasons) == ("restorable", [])


def test_it_applies_the_adapters_reasons_instead_of_the_shard_and_component_rules():
    found = {"code": "size_mismatch",
             "detail": "step-2/__0_0.distcp: 10 bytes, its structure declares 64 (truncated)"}
    g = verdict(events([adopted([found])]))
    assert g.status == "rejected"
    assert [r.to_dict() for r in g.reasons] == [found]
    # the contract's data_progress component is not asked of another tool's layout
    assert "component_missing" not in [r.code for r in verdict(events([adopted()])).reasons]


def test_a_trainers_own_manifest_wins_over_the_adopted_one_without_a_conflict():
    own = {**adopted(cursor=[{"stratum": "m", "epoch": 0, "position": 12}]),
           "dataset_version": "ds-v1"}
    del own["adopted"]
    g = verdict(events([adopted(), own]))
    # judged by our own rules: the contract's components and the cursor (12 is not update 2's 8)
    assert [r.code for r in g.reasons] == ["component_missing", "data_cursor_mismatch"]
    assert g.status == "rejected" and g.notes == []
    right = {**own, "data_progress": {"cursor": [{"stratum": "m", "epoch": 0, "position": 8}]}}
    g = verdict(events([adopted(), right]))
    assert [r.code for r in g.reasons] == ["component_missing"]
    assert "manifest_conflict" not in [r.code for r in g.reasons]
