"""The worker's generation verdicts are incremental and exact (inputs format 4: light entries,
chunk rows read only when needed, the state digest comparison continued through
``InputDigest``): random sequences of checkpoints (at random updates, below the judged ones
too, with repeated model and optimizer digests, flaws and conflicting manifests), storage
results, ledger updates (a rank's part of an earlier one late), and restarts, analysed between
them at random times, give exactly the result and generation statuses of a fresh full analysis
of the same rows at the same time; and stored inputs of format 3 load and are continued (no row
read again)."""

from __future__ import annotations

import hashlib
import os
import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recoverydash.checkpoints.objects import ObjectCheck
from recoverydash.ingest.actions import ingest_batch
from recoverydash.runs import analysis as bridge
from recoverydash.runs.models import (
    Analysis,
    CheckpointObject,
    Generation,
    InputChunk,
    InputDigest,
    Project,
    Run,
)
from recoverydash.storage.verification import _store

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 1, tzinfo=UTC)
RUN = "gens"
GBS = 4
EXAMPLES = int(os.environ.get("RECOVERY_EXAMPLES", "12"))
CHECKS = ["ok", "ok", "ok", "object_missing", "digest_mismatch", "storage_unverified"]


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat()


def start(attempt: int, resumed=None) -> dict:
    return {"event_id": f"start{attempt}", "type": "attempt_started", "run_id": RUN,
            "attempt": attempt, "time": at(1000 * attempt), "world_size": 2,
            "dataset_version": "ds", "global_batch_size": GBS, "resumed_from": resumed,
            "contract": {"required_components": ["model", "optimizer", "data_progress"]}}


def updates(attempt: int, lo: int, hi: int, skip_last_rank: bool, ranks=(0, 1)) -> list:
    out = []
    for u in range(lo, hi + 1):
        for rank in ranks:
            if skip_last_rank and u == hi and rank == 1:
                continue
            out.append({"event_id": f"u{attempt}-{u}-{rank}", "type": "update_committed",
                        "run_id": RUN, "attempt": attempt, "rank": rank, "update": u,
                        "time": at(1000 * attempt + 10 * u + rank),
                        "spans": [{"stratum": "main", "epoch": 0,
                                   "ranges": [[GBS * (u - 1) + 2 * rank,
                                               GBS * (u - 1) + 2 * rank + 2]]}]})
    return out


def commit(k: int, attempt: int, update: int, model: int, optim: int, flaw: str,
           variant: int = 0) -> dict:
    gid = f"g{k}"
    objects = [{"uri": f"file:///ckpt/{gid}/{s}-{c}.pt", "shard": s, "component": c,
                "size": 10, "sha256": hashlib.sha256(
                    f"{c}{model if c == 'model' else optim}{s}".encode()).hexdigest()}
               for s in ("rank0", "rank1") for c in ("model", "optimizer")]
    objects.append({"uri": f"file:///ckpt/{gid}/dp.json", "shard": "rank0",
                    "component": "data_progress", "size": 5})
    if flaw == "shard":
        objects = [o for o in objects if o["shard"] != "rank1"]
    manifest = {"schema_revision": 1, "generation_id": gid, "update": update,
                "attempt": attempt, "world_size": 3 if flaw == "world" else 2,
                "required_shards": ["rank0", "rank1"],
                "components": ["model", "optimizer", "data_progress"], "objects": objects,
                "dataset_version": "ds", "committed_at": at(1000 * attempt + 10 * update + 5),
                "data_progress": {"cursor": [{"stratum": "main", "epoch": 0,
                                              "position": GBS * update + (flaw == "cursor")}]}}
    if variant:  # another manifest of the generation: a manifest conflict
        manifest["objects"] = objects[:-1] + [dict(objects[-1], size=5 + variant)]
    return {"event_id": f"c{k}-{variant}", "type": "checkpoint_committed", "run_id": RUN,
            "attempt": attempt, "time": at(1000 * attempt + 10 * update + 5),
            "manifest": manifest}


def rebuilt(run: Run, now: float) -> tuple:
    Analysis.objects.filter(run=run).delete()
    result = bridge.analyze(run, now=now).result
    return result, statuses(run)


def statuses(run: Run) -> dict:
    return dict(Generation.objects.filter(run=run).values_list("generation_id", "status"))


def verify(run: Run, rng: random.Random) -> None:
    gens = list(Generation.objects.filter(run=run).order_by("generation_id"))
    if not gens:
        return
    gen = rng.choice(gens)
    objects = list(CheckpointObject.objects.filter(generation=gen, in_manifest=True)
                   .order_by("uri"))
    for obj in objects if rng.random() < 0.6 else objects[:1]:
        status = rng.choice(CHECKS)
        _store(obj, ObjectCheck(status, status, obj.size if status == "ok" else None,
                                obj.sha256 if status == "ok" else None))


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.integers(0, 2**32 - 1))
def test_incremental_generation_verdicts_equal_a_fresh_analysis(seed):
    rng = random.Random(seed)
    inc = Project.objects.create(name=f"inc-{uuid.uuid4().hex[:8]}")
    ref = Project.objects.create(name=f"ref-{uuid.uuid4().hex[:8]}")
    attempt, top, k, variants = 0, 0, 0, 0
    committed: list = []
    missing: list = []

    def both(events: list) -> None:
        assert ingest_batch(inc, events).accepted
        ingest_batch(ref, events)

    def twin_verify(seed_: int) -> None:
        for project in (inc, ref):
            verify(Run.objects.get(project=project), random.Random(seed_))

    both([start(0)])
    for _step in range(rng.randint(4, 14)):
        op = rng.choice(["commit", "commit", "commit", "verify", "verify", "updates",
                         "updates", "restart", "conflict", "late"])
        if op == "commit":
            update = rng.randint(1, max(1, top + 3))  # below the judged ones too
            flaw = rng.choice(["", "", "", "", "shard", "world", "cursor"])
            both([commit(k, attempt, update, rng.randint(0, 3), rng.choice([0, 0, 1]), flaw)])
            committed.append((k, update))
            k += 1
        elif op == "conflict" and committed:
            gk, gu = rng.choice(committed)
            variants += 1
            both([commit(gk, attempt, gu, 9, 9, "", variant=variants)])
        elif op == "verify":
            twin_verify(rng.randrange(2**32))
        elif op == "updates":
            hi = top + rng.randint(1, 6)
            skip = rng.random() < 0.3
            both(updates(attempt, top + 1, hi, skip))
            if skip:
                missing.append((attempt, hi))
            top = hi
        elif op == "late" and missing:  # a rank's part of an earlier update arrives late
            late_attempt, late_update = missing.pop(rng.randrange(len(missing)))
            both(updates(late_attempt, late_update, late_update, False, ranks=(1,)))
        elif op == "restart" and committed:
            gk, gu = rng.choice(committed)
            attempt += 1
            both([{"event_id": f"end{attempt - 1}", "type": "attempt_ended", "run_id": RUN,
                   "attempt": attempt - 1, "time": at(1000 * attempt - 1), "reason": "failed",
                   "update": top},
                  start(attempt, {"generation_id": f"g{gk}", "update": gu, "cursor": []})])
            top = gu
        if rng.random() < 0.6:
            now = T0.timestamp() + rng.uniform(0, 1000 * (attempt + 1) + 400)
            got = bridge.analyze(Run.objects.get(project=inc), now=now).result
            want, want_statuses = rebuilt(Run.objects.get(project=ref), now)
            assert got == want
            assert statuses(Run.objects.get(project=inc)) == want_statuses
    now = T0.timestamp() + 1000 * (attempt + 2)
    got = bridge.analyze(Run.objects.get(project=inc), now=now).result
    assert got == rebuilt(Run.objects.get(project=ref), now)[0]


def test_stored_inputs_of_format_3_load_and_are_continued(project):
    """A run analysed, its inputs then written as format 3 held them (one blob: head and
    chunks); the next analysis after a new checkpoint reads only the new generation's row,
    equals a fresh analysis, and writes format 4 (chunk and digest rows)."""
    from tests.pipeline.test_incremental_inputs import RowsRead
    from tests.state_formats import inputs_format_3

    events = [start(0)] + updates(0, 1, 40, False)
    events += [commit(i, 0, 4 * i + 4, i, 0, "") for i in range(9)]
    assert ingest_batch(project, events).accepted
    run = Run.objects.get(project=project)
    now = T0.timestamp() + 900
    bridge.analyze(run, now=now)
    analysis = Analysis.objects.get(run=run)
    stored = bridge.StoredInputs.from_bytes(analysis.inputs, analysis.pk)
    entries = {pk: stored.entry(pk) for pk in stored.light}
    blob = inputs_format_3(stored.attempts, entries, stored.statuses, stored.judged,
                           stored.judged_for)
    Analysis.objects.filter(pk=analysis.pk).update(inputs=blob)
    InputChunk.objects.filter(analysis=analysis).delete()
    InputDigest.objects.filter(analysis=analysis).delete()
    loaded = bridge.StoredInputs.from_bytes(blob, analysis.pk)
    assert loaded.light == stored.light and loaded.judged == stored.judged
    assert loaded.entries == entries

    from django.db import connection
    ingest_batch(project, [commit(9, 0, 40, 2, 0, "")])  # repeats g2's model state
    counter = RowsRead()
    with connection.execute_wrapper(counter):
        got = bridge.analyze(run, now=now + 10).result
    assert counter.rows["runs_generation"] == 1
    assert counter.rows["runs_checkpointobject"] == 0
    latest = {g["generation_id"]: g for g in got["generations"]}["g9"]
    assert latest["status"] == "rejected"
    assert [r["code"] for r in latest["reasons"]] == ["stale_state"]
    assert bytes(Analysis.objects.get(run=run).inputs).startswith(b"RDI4")
    chunks = {pk // bridge.GENERATION_CHUNK for pk in Generation.objects.filter(run=run)
              .values_list("pk", flat=True)}
    assert set(InputChunk.objects.filter(analysis=analysis).values_list("chunk", flat=True)) \
        == chunks
    # the first occurrences: two model digests (one per shard) of each of g0..g8, g9's repeat
    # g2's; two optimizer digests, the same in every generation
    assert InputDigest.objects.filter(analysis=analysis).count() == 2 * 9 + 2
    ref = Project.objects.create(name="ref")
    ingest_batch(ref, events + [commit(9, 0, 40, 2, 0, "")])
    assert got == rebuilt(Run.objects.get(project=ref), now + 10)[0]
