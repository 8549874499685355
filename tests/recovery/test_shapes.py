"""The remaining shapes of issue 25 (docs/definitions.md: #volatile-manifest-fields,
#renumbered-updates, #concurrent-attempts, #stale-state-and-stateless-optimizers,
#unknown-lineage-root), each with exact values."""
from __future__ import annotations

import hashlib

from test_definitions import PER_UPDATE, W, generation, generation_run, reasons_of, strided

from recoverydash.recovery import AttemptRecord, RunInput, analyze
from recoverydash.recovery.inputs import same_manifest


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


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def two_shard_saves(optimizers: list) -> dict:
    """Attempt 0 commits updates 1..40 and saves g10, g20, ... at every tenth update, with
    shards rank0 and rank1 each holding a model and an optimizer object; ``optimizers[i]``:
    ``(rank0's, rank1's)`` optimizer sha256 of the i-th save (None: a digest of its own). Every
    model object is new at every save. Returns ``{generation_id: GenerationVerdict}``."""
    records = []
    for u in range(1, 41):
        records += strided(0, u, (u - 1) * PER_UPDATE, float(u))
    gens = []
    for i, pair in enumerate(optimizers, start=1):
        gid, u = f"g{10 * i}", 10 * i
        objects = [{"uri": f"file:///c/{gid}/{shard}/{c}", "shard": shard, "component": c,
                    "size": 1, "sha256": (pair[r] if c == "optimizer" and pair[r] is not None
                                          else sha(f"{gid}{shard}{c}"))}
                   for r, shard in enumerate(("rank0", "rank1")) for c in ("model", "optimizer")]
        gen = generation(gid, 0, u, u * PER_UPDATE, u + 0.5, objects=objects)
        gen.required_shards = ["rank0", "rank1"]
        gen.components = ["model", "optimizer"]
        gen.manifests[0].update(required_shards=["rank0", "rank1"],
                                components=["model", "optimizer"])
        gens.append(gen)
    run = RunInput("opt", [AttemptRecord(0, started_at=0.0, world_size=W, dataset_version="ds")],
                   records, generations=gens, contract={"required_components": ["model"]})
    return {g.generation_id: g for g in analyze(run, now=50.0).generations}


def test_an_optimizer_shard_repeating_while_another_changed_is_stale():
    # physicsnemo #2012: at g20 rank 0's optimizer was saved afresh, rank 1's repeats g10's bytes
    gens = two_shard_saves([(sha("o0-a"), sha("o1-a")), (sha("o0-b"), sha("o1-a"))])
    assert [(g.status, [r.code for r in g.reasons], [n.code for n in g.notes])
            for g in gens.values()] == [("restorable", [], []),
                                        ("rejected", ["stale_state"], [])]
    assert gens["g20"].reasons[0].detail == (
        "optimizer object file:///c/g20/rank1/optimizer repeats the sha256 of generation g10 "
        "(update 10): this save wrote the optimizer state (another optimizer object of this "
        "generation changed since the last save) of update 10 again, not that of update 20")
    # the same after a stateless-looking start: g20 repeats both (the note), g30 changes one
    gens = two_shard_saves([(sha("o0-a"), sha("o1-a")), (sha("o0-a"), sha("o1-a")),
                            (sha("o0-b"), sha("o1-a"))])
    assert [(g.status, [r.code for r in g.reasons], [n.code for n in g.notes])
            for g in gens.values()] == [("restorable", [], []),
                                        ("restorable", [], ["optimizer_stateless"]),
                                        ("rejected", ["stale_state"], [])]


def test_the_stateless_note_comes_once_when_every_optimizer_object_repeats():
    same = (sha("o0"), sha("o1"))
    gens = two_shard_saves([same, same, same, same])
    assert [(g.status, [n.code for n in g.notes]) for g in gens.values()] == [
        ("restorable", []), ("restorable", ["optimizer_stateless"]), ("restorable", []),
        ("restorable", [])]
    assert gens["g20"].notes[0].detail.startswith(
        "optimizer object file:///c/g20/rank0/optimizer has the same bytes (sha256) as in "
        "generation g10 (update 10)")
    # both shards saved afresh every time: no repeat, no note
    gens = two_shard_saves([(None, None)] * 3)
    assert [(g.status, g.notes) for g in gens.values()] == [("restorable", [])] * 3
