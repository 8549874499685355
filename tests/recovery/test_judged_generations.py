"""Generations judged once (docs/definitions.md#generation-status): the part of a verdict that is
a function of the generation's own record and the contract's required components
(:func:`recovery.generations.local_judgement`) is kept by the caller between analyses, and an
analysis given the kept judgements (JSON round trip, as the worker stores them) is equal to one
judging every generation afresh, over random sequences of commits, storage results, restarts,
late ledger rows and contract edits; a changed record's judgement is dropped, as the worker's
``StoredInputs.read_changes`` drops it. The data cursor comparisons are kept the same way
(``checks``), with the lowest update the ledger absorbed per attempt since (``absorbed``)."""
from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recoverydash.recovery import (
    AttemptRecord,
    GenerationRecord,
    Ledger,
    LedgerRecord,
    RunInput,
    analyze,
)
from recoverydash.recovery.generations import local_judgement

NOW = 50_000.0
GBS = 4
SETTINGS = settings(max_examples=int(__import__("os").environ.get("RECOVERY_EXAMPLES", "200")),
                    deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
CHECKS = ("ok", "ok", "ok", "object_missing", "size_mismatch", "digest_mismatch",
          "storage_unverified", "object_outside_locations", None)


def manifest(gid: str, attempt: int, update: int, flaw: str, sha_of: int) -> dict:
    """A manifest of two shards, with one ``flaw`` (or none) and state digests named by
    ``sha_of`` (two generations with equal ``sha_of`` repeat each other's state)."""
    objects = [{"uri": f"file:///{gid}/{s}-{c}.pt", "shard": s, "component": c,
                "update": update, "sha256": f"{c}-{sha_of}-{s}"}
               for s in ("rank0", "rank1") for c in ("model", "optimizer")]
    objects.append({"uri": f"file:///{gid}/dp.json", "shard": "rank0",
                    "component": "data_progress", "sha256": f"dp-{gid}"})
    doc = {"schema_revision": 1, "generation_id": gid, "update": update, "attempt": attempt,
           "world_size": 2, "required_shards": ["rank0", "rank1"],
           "components": ["model", "optimizer", "data_progress"], "objects": objects,
           "dataset_version": "ds", "committed_at": 10.0 * update + 1,
           "data_progress": {"cursor": [{"stratum": "main", "epoch": 0,
                                         "position": GBS * update}]}}
    if flaw == "shard":
        doc["objects"] = [o for o in objects if o["shard"] != "rank1"]
    elif flaw == "component":
        doc["objects"] = [o for o in objects if o["component"] != "data_progress"]
    elif flaw == "update":
        doc["objects"][0]["update"] = update + 1
    elif flaw == "schema":
        doc["schema_revision"] = 2
    elif flaw == "cursor":
        doc["data_progress"]["cursor"][0]["position"] += 1
    elif flaw == "world":
        doc["world_size"] = 3
    elif flaw == "adopted":
        doc["adopted"] = {"format": "dcp", "reasons": [{"code": "shard_missing",
                                                        "detail": "rank1"}]}
        del doc["data_progress"]
    return doc


operations = st.lists(st.one_of(
    st.tuples(st.just("commit"), st.integers(1, 30),
              st.sampled_from(["", "", "", "", "", "", "", "", "shard", "component", "update",
                               "schema", "cursor", "world", "adopted", "conflict"]),
              st.integers(0, 3),
              st.booleans()),
    st.tuples(st.just("check"), st.integers(0, 40), st.integers(0, 4),
              st.sampled_from(CHECKS)),
    st.tuples(st.just("verify"), st.integers(0, 40), st.just(0), st.just(0)),
    st.tuples(st.just("verify"), st.integers(0, 40), st.just(0), st.just(0)),
    st.tuples(st.just("restart"), st.integers(0, 40), st.integers(1, 30)),
    st.tuples(st.just("updates"), st.integers(1, 30), st.integers(0, 1), st.integers(1, 30)),
    st.tuples(st.just("components"), st.sampled_from([
        ["model", "optimizer", "data_progress"], ["model", "optimizer"],
        ["model", "optimizer", "data_progress", "rng"]]), st.just(0)),
), min_size=1, max_size=25)


def run_input(attempts: dict, generations: dict, components: list) -> RunInput:
    return RunInput(run_id="r", attempts=[attempts[k] for k in sorted(attempts)], ledger=[],
                    heartbeats=[], generations=[generations[k] for k in sorted(generations)],
                    restores=[], contract={"required_components": components},
                    first_event_at=0.0)


@SETTINGS
@given(operations)
def test_kept_judgements_give_the_same_analysis_as_judging_afresh(ops):
    attempts = {0: AttemptRecord(attempt=0, started_at=0.0, world_size=2, dataset_version="ds",
                                 global_batch_size=GBS)}
    generations: dict = {}   # key (the worker's pk) -> GenerationRecord
    ledger_rows: list = []
    components = ["model", "optimizer", "data_progress"]
    kept: dict = {}          # key -> local judgement (JSON round trip)
    kept_for = None
    checked: dict = {}       # key -> data cursor comparison (JSON round trip)
    absorbed: dict = {}      # attempt -> lowest update absorbed since the last analysis
    key = 0
    for op in ops:
        kind = op[0]
        if kind == "commit":
            _, update, flaw, sha_of, verified = op
            attempt = max(attempts)
            gid = f"g{key}"
            doc = manifest(gid, attempt, update, flaw, sha_of)
            docs = [doc]
            if flaw == "conflict":
                other = json.loads(json.dumps(doc))
                other["objects"][0]["sha256"] = "other"
                docs.append(other)
            generations[key] = GenerationRecord(
                gid, attempt, manifests=docs, committed_at=10.0 * update + 2,
                object_checks={o["uri"]: "ok" for o in doc["objects"]} if verified else {})
            key += 1
        elif kind in ("check", "verify") and generations:
            _, which, obj, result = op
            k = sorted(generations)[which % len(generations)]
            gen = generations[k]
            m = gen.manifest()
            if m is None or not m["objects"]:
                continue
            uri = m["objects"][obj % len(m["objects"])]["uri"]
            checks = dict(gen.object_checks)
            if kind == "verify":
                checks = {o["uri"]: "ok" for o in m["objects"]}
            elif result is None:
                checks.pop(uri, None)
            else:
                checks[uri] = result
            generations[k] = GenerationRecord(gen.generation_id, gen.attempt,
                                              manifests=gen.manifests,
                                              committed_at=gen.committed_at,
                                              object_checks=checks)
            kept.pop(k, None)  # the row was written: read again, judgement dropped
            checked.pop(k, None)
        elif kind == "restart":
            _, which, declared = op
            number = max(attempts) + 1
            source = None
            if generations:
                gen = generations[sorted(generations)[which % len(generations)]]
                source = {"generation_id": gen.generation_id,
                          "update": (gen.manifest() or {}).get("update", declared),
                          "cursor": []}
            prev = attempts[max(attempts)]
            attempts[prev.attempt] = AttemptRecord(**{**prev.__dict__, "ended_at": 100.0 * number})
            attempts[number] = AttemptRecord(attempt=number, started_at=100.0 * number + 1,
                                             world_size=2, dataset_version="ds",
                                             global_batch_size=GBS, resumed_from=source)
        elif kind == "updates":
            _, upto, late, lo = op
            attempt = max(attempts)
            for u in range(min(lo, upto), upto + 1):
                absorbed[attempt] = min(absorbed.get(attempt, u), u)
                for rank in range(2):
                    if late and rank == 1 and u == upto:
                        continue   # this rank's part arrives with a later operation
                    ledger_rows.append(LedgerRecord(
                        attempt, u, rank, 10.0 * u, [{"stratum": "main", "epoch": 0,
                                                      "ranges": [[GBS * (u - 1) + 2 * rank,
                                                                  GBS * (u - 1) + 2 * rank + 2]]}],
                        ))
        elif kind == "components":
            components = op[1]

        run = run_input(attempts, generations, components)
        afresh = analyze(run, NOW, ledger=Ledger.from_records(ledger_rows)).to_dict()
        # the worker's bookkeeping: judgements kept per key, dropped when the components change
        if kept_for != components:
            kept, kept_for = {}, list(components)
        ids = {generations[k].generation_id: k for k in sorted(generations)}
        judged = {gid: kept[k] for gid, k in ids.items() if k in kept}
        fresh: dict = {}
        checks = {gid: checked[k] for gid, k in ids.items() if k in checked}
        checks_fresh: dict = {}
        again = analyze(run, NOW, ledger=Ledger.from_records(ledger_rows), judged=judged,
                        fill=fresh, checks=checks, checks_fill=checks_fresh,
                        absorbed=absorbed).to_dict()
        assert again == afresh
        absorbed = {}
        for gid, check in checks_fresh.items():
            checked[ids[gid]] = json.loads(json.dumps(check))
        for gid, judgement in fresh.items():
            assert gid not in judged
            kept[ids[gid]] = json.loads(json.dumps(judgement))
        for k in ids.values():
            gen = generations[k]
            if k in kept:
                assert kept[k] == json.loads(json.dumps(local_judgement(gen, components)))


def test_a_kept_judgement_is_what_the_rules_found():
    """The judgement of a generation with one missing shard and an object not checked: the
    reasons in spec order, storage results apart."""
    doc = manifest("g1", 0, 3, "shard", 0)
    gen = GenerationRecord("g1", 0, manifests=[doc], object_checks={
        doc["objects"][0]["uri"]: "digest_mismatch",
        doc["objects"][1]["uri"]: "storage_unverified"})
    assert local_judgement(gen, ["model", "optimizer", "data_progress"]) == {
        "notes": [],
        "before": [{"code": "shard_missing", "detail": "no object for required shard rank1"}],
        "storage": [{"code": "digest_mismatch", "detail": "file:///g1/rank0-model.pt"}],
        "soft": [{"code": "storage_unverified", "detail": "file:///g1/rank0-optimizer.pt"}],
        "unchecked": True}
