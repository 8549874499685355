"""The analysis reads only the attempts and generations written since the stored analysis
(``Attempt.seq``, ``Generation.seq``, kept in ``Analysis.inputs``): after one new event of a run
with 500 committed and verified generations it reads O(1) generation, shard report and object
rows, and what it stores equals a rebuild from every row; a storage result or a contract edit
moves the run's ingest seq (``runs.seq.mark_changed``), so with the seq unchanged the analysis
reads no row of the run's tables at all."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from recoverydash import recovery
from recoverydash.checkpoints.objects import ObjectCheck
from recoverydash.ingest.actions import ingest_batch
from recoverydash.runs import analysis as bridge
from recoverydash.runs.contracts import save_contract
from recoverydash.runs.models import Analysis, CheckpointObject, Generation, Run
from recoverydash.storage.verification import _store

pytestmark = pytest.mark.django_db

RUN = "long-run"
T0 = datetime(2026, 11, 1, tzinfo=UTC)
COMPONENTS = ["model", "optimizer", "data_progress"]
INPUT_TABLES = ("runs_generation", "runs_shardreport", "runs_checkpointobject", "runs_attempt")


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat()


def update(u: int) -> dict:
    return {"event_id": f"u{u}", "type": "update_committed", "run_id": RUN, "attempt": 0,
            "time": at(10 * u), "update": u, "rank": 0,
            "spans": [{"stratum": "main", "epoch": 0, "ranges": [[4 * u - 4, 4 * u]]}]}


def commit(u: int) -> dict:
    gid = f"g{u:04d}"
    objects = [{"uri": f"file:///ckpt/{gid}/{c}.pt", "shard": "rank0", "component": c,
                "size": 100 + u, "sha256": hashlib.sha256(f"{gid}/{c}".encode()).hexdigest()}
               for c in COMPONENTS]
    manifest = {"schema_revision": 1, "generation_id": gid, "update": u, "world_size": 1,
                "required_shards": ["rank0"], "components": COMPONENTS, "objects": objects,
                "dataset_version": "ds-v1", "committed_at": at(10 * u + 5),
                "data_progress": {"cursor": [{"stratum": "main", "epoch": 0,
                                              "position": 4 * u}]}}
    return {"event_id": f"c{u}", "type": "checkpoint_committed", "run_id": RUN, "attempt": 0,
            "time": at(10 * u + 5), "manifest": manifest}


def start() -> dict:
    return {"event_id": "start", "type": "attempt_started", "run_id": RUN, "attempt": 0,
            "time": at(0), "world_size": 1, "dataset_version": "ds-v1", "global_batch_size": 4,
            "contract": {"required_components": COMPONENTS}}


def verify(generations) -> None:
    """Every manifest object of ``generations`` found ``ok``, through the verifier's writer."""
    for obj in CheckpointObject.objects.filter(generation__in=generations, in_manifest=True):
        _store(obj, ObjectCheck("ok", "verified", obj.size, obj.sha256))


class RowsRead:
    """Rows returned by SELECTs of the analysis input tables while active (the cursor's
    rowcount; SQLite reports none for a SELECT, so there the statement's rows are counted by a
    ``SELECT COUNT(*)`` of it, outside this count)."""

    def __init__(self):
        self.rows = {t: 0 for t in INPUT_TABLES}
        self.queries = []
        self._counting = False

    def __call__(self, execute, sql, params, many, context):
        out = execute(sql, params, many, context)
        if self._counting:
            return out
        self.queries.append(sql)
        if sql.startswith("SELECT"):
            head = sql.split(" WHERE ")[0]
            for table in INPUT_TABLES:
                if f'FROM "{table}"' in head:
                    self.rows[table] += self._rows_of(sql, params, context)
        return out

    def _rows_of(self, sql, params, context) -> int:
        n = context["cursor"].rowcount
        if n >= 0:
            return n
        self._counting = True
        try:
            with context["connection"].cursor() as cursor:
                cursor.execute(f"SELECT COUNT(*) FROM ({sql}) AS counted", params)
                return cursor.fetchone()[0]
        finally:
            self._counting = False


def rebuilt(run: Run, now: float) -> dict:
    """The analysis rebuilt from every row (no stored state nor inputs)."""
    Analysis.objects.filter(run=run).delete()
    return bridge.analyze(run, now=now).result


N = 500


@pytest.fixture
def long_run(project):
    events = [start()]
    for u in range(1, N + 1):
        events += [update(u), commit(u)]
    for lo in range(0, len(events), 400):
        assert ingest_batch(project, events[lo:lo + 400]).accepted
    run = Run.objects.get(run_id=RUN)
    verify(Generation.objects.filter(run=run))
    return run


def test_one_new_event_reads_o1_generation_rows_and_equals_a_rebuild(project, long_run):
    run, now = long_run, T0.timestamp() + 10 * N + 60
    first = bridge.analyze(run, now=now)
    assert first.result["generations_summary"] == {
        "total": N, "shown": recovery.GENERATIONS_SHOWN, "by_status": {"restorable": N}}
    assert set(Generation.objects.filter(run=run).values_list("status", flat=True)) == \
        {"restorable"}
    assert first.result["last_restorable"]["generation_id"] == f"g{N:04d}"

    # one new update, one new generation (its objects then verified: a storage result)
    ingest_batch(project, [update(N + 1), commit(N + 1)])
    counter = RowsRead()
    with connection.execute_wrapper(counter):
        bridge.analyze(run, now=now + 20)
    attempts = counter.rows.pop("runs_attempt")
    assert 1 <= attempts <= 5  # the changed attempt, and the alert rules' reads of the newest
    assert counter.rows == {"runs_generation": 1, "runs_shardreport": 0,
                            "runs_checkpointobject": 0}, counter.rows
    verify(Generation.objects.filter(run=run, generation_id=f"g{N + 1:04d}"))
    counter = RowsRead()
    with connection.execute_wrapper(counter):
        stored = bridge.analyze(run, now=now + 30)
    assert counter.rows.pop("runs_attempt") <= 4  # the alert rules' reads of the newest
    assert counter.rows == {"runs_generation": 1, "runs_shardreport": 0,
                            "runs_checkpointobject": 3}, counter.rows
    assert stored.result["last_restorable"]["generation_id"] == f"g{N + 1:04d}"
    assert stored.result == rebuilt(run, now + 30)


def test_a_storage_result_moves_the_seq_and_is_read_again(project, long_run):
    run, now = long_run, T0.timestamp() + 10 * N + 60
    bridge.analyze(run, now=now)
    seq = Run.objects.get(pk=run.pk).ingest_seq
    victim = CheckpointObject.objects.get(generation__run=run, uri=f"file:///ckpt/g{N:04d}/model.pt")
    _store(victim, ObjectCheck("object_missing", "gone"))
    assert Run.objects.get(pk=run.pk).ingest_seq > seq
    assert Generation.objects.get(pk=victim.generation_id).seq == \
        Run.objects.get(pk=run.pk).ingest_seq
    # the same result again moves nothing
    seq = Run.objects.get(pk=run.pk).ingest_seq
    _store(victim, ObjectCheck("object_missing", "gone"))
    assert Run.objects.get(pk=run.pk).ingest_seq == seq
    stored = bridge.analyze(run, now=now)
    assert stored.result["last_restorable"]["generation_id"] == f"g{N - 1:04d}"
    assert stored.result["generations"][-1]["status"] == "rejected"
    assert Generation.objects.get(pk=victim.generation_id).status == "rejected"
    assert stored.result == rebuilt(run, now)


def test_a_contract_edit_moves_the_seq(project, long_run):
    run, now = long_run, T0.timestamp() + 10 * N + 60
    before = bridge.analyze(run, now=now).ingest_seq
    save_contract(run, {"max_checkpoint_age_s": 5})
    assert Run.objects.get(pk=run.pk).ingest_seq > before
    stored = bridge.analyze(run, now=now)
    assert stored.ingest_seq > before
    assert stored.result == rebuilt(run, now)


def test_nothing_changed_reads_no_row_of_the_runs_tables(project, long_run):
    """The analysis's own queries (the alert rules' receiver disconnected: those are the alerts
    app's) with nothing changed: the Analysis row, the committed seq, then the write of the
    clock-driven figures; no row of the input, ledger or heartbeat tables."""
    from recoverydash.alerts.evaluation import evaluate_stored

    run, now = long_run, T0.timestamp() + 10 * N + 60
    bridge.analyze(run, now=now)
    counter = RowsRead()
    bridge.analysis_stored.disconnect(dispatch_uid="alerts.evaluate_stored")
    try:
        with connection.execute_wrapper(counter):
            stored = bridge.analyze(run, now=now + 3600)
    finally:
        bridge.analysis_stored.connect(evaluate_stored, dispatch_uid="alerts.evaluate_stored")
    assert counter.rows == {t: 0 for t in INPUT_TABLES}, counter.rows
    touched = [sql for sql in counter.queries if any(
        f'"{t}"' in sql for t in INPUT_TABLES + ("runs_ledgerrow", "runs_heartbeat"))]
    assert touched == []
    statements = [q.split(" ")[0] for q in counter.queries
                  if not q.startswith(("SAVEPOINT", "RELEASE", "SET LOCAL"))]
    # the Analysis row (without state and inputs); the advisory lock (PostgreSQL) and
    # Run.ingest_seq (runs.seq.committed_seq); the locked Analysis row (without state, result,
    # inputs); the two writes (the clock-only path: runs.analysis._clock_only)
    selects = 4 if connection.vendor == "postgresql" else 3
    assert statements == ["SELECT"] * selects + ["UPDATE"] * 2, counter.queries
    assert stored.result == rebuilt(run, now + 3600)


def test_inputs_of_another_format_or_unreadable_are_read_again_from_every_row(project,
                                                                               long_run):
    run, now = long_run, T0.timestamp() + 10 * N + 60
    first = bridge.analyze(run, now=now).result
    for blob in (b"not zlib", bridge.zlib.compress(b'{"format": 0}')):
        Analysis.objects.filter(run=run).update(inputs=blob)
        ingest_batch(project, [update(N + 1 + len(blob) % 7)])
        counter = RowsRead()
        with connection.execute_wrapper(counter):
            again = bridge.analyze(run, now=now).result
        assert counter.rows["runs_generation"] == N
        assert again["generations"] == first["generations"]
    assert bridge.StoredInputs.from_bytes(Analysis.objects.get(run=run).inputs).generations
    assert bridge.load_state(*Analysis.objects.filter(run=run).values_list("pk", "state").get())


def test_generations_are_judged_once_and_again_when_the_components_change(project, long_run):
    """The generations' local judgements (recovery.local_judgement) are kept in
    ``Analysis.inputs``: after the first analysis one per committed generation; a new storage
    result drops (and re-judges) that generation's only; a contract edit of the required
    components re-judges every one (here: a component no generation carries rejects them all),
    and each stored result equals a rebuild from every row."""
    run, now = long_run, T0.timestamp() + 10 * N + 60
    bridge.analyze(run, now=now)
    inputs = bridge.StoredInputs.from_bytes(Analysis.objects.get(run=run).inputs)
    assert len(inputs.judged) == N and inputs.judged_for == COMPONENTS
    pks = sorted(inputs.judged)
    before = {pk: inputs.judged[pk] for pk in pks}
    victim = CheckpointObject.objects.get(generation__run=run, uri=f"file:///ckpt/g{N:04d}/model.pt")
    _store(victim, ObjectCheck("digest_mismatch", "bytes differ"))
    stored = bridge.analyze(run, now=now)
    inputs = bridge.StoredInputs.from_bytes(Analysis.objects.get(run=run).inputs)
    assert {pk: j for pk, j in inputs.judged.items() if pk != victim.generation_id} == \
        {pk: j for pk, j in before.items() if pk != victim.generation_id}
    assert inputs.judged[victim.generation_id]["storage"] == [
        {"code": "digest_mismatch", "detail": f"file:///ckpt/g{N:04d}/model.pt"}]
    assert stored.result == rebuilt(run, now)

    save_contract(run, {"required_components": COMPONENTS + ["rng"]})
    stored = bridge.analyze(run, now=now)
    inputs = bridge.StoredInputs.from_bytes(Analysis.objects.get(run=run).inputs)
    assert inputs.judged_for == COMPONENTS + ["rng"] and len(inputs.judged) == N
    assert stored.result["generations_summary"]["by_status"] == {"rejected": N}
    assert stored.result["last_restorable"] is None
    assert stored.result == rebuilt(run, now)
