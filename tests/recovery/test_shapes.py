"""The remaining shapes of issue 25 (docs/definitions.md: #volatile-manifest-fields,
#renumbered-updates, #concurrent-attempts, #stale-state-and-stateless-optimizers,
#unknown-lineage-root), each with exact values."""
from __future__ import annotations

from recoverydash.recovery import analyze
from recoverydash.recovery.inputs import same_manifest

from test_definitions import generation_run, reasons_of


def test_a_manifest_differing_only_in_committed_at_is_no_conflict():
    run = generation_run()
    gen = run.generations[0]
    first = gen.manifests[0]
    first["committed_at"] = "2026-11-01T00:00:20Z"
    again = dict(first, committed_at="2026-11-01T00:05:20Z")  # published again after a timeout
    assert same_manifest(first, again) and not same_manifest(first, dict(again, update=11))
    gen.manifests.append(again)
    assert gen.conflicting() == 1
    assert reasons_of(run) == ("restorable", set())
    analysis = analyze(run, now=30.0)
    assert analysis.last_restorable.committed_at == 1793491220.0  # the first one's stays
    gen.manifests.append(dict(again, world_size=16))
    assert gen.conflicting() == 2
    assert reasons_of(run) == ("rejected", {"manifest_conflict"})
