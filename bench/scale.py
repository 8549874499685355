#!/usr/bin/env python
"""The worker's analysis at scale: a 64-rank run, with the heartbeats the SDK sends (issue 13).

A run of 64 data-parallel ranks, one update every 2 s, each rank reporting one strided span per
update (``update_committed``) and a heartbeat every 30 s (the SDK's ``heartbeat_interval``
default: 64 / 15 = 4.3 heartbeats per update). For each level of absorbed updates
(``BENCH_LEVELS``, default ``10000,100000``; add ``1000000`` where the machine can):

1. the history up to the level is written as rows: the first ``BENCH_INGESTED`` updates
   (default 1,000) through the real ingest path (``ingest.actions.ingest_batch`` with the SDK's
   batches of 1,000 events: validation, canonical JSON and hash, COPY, projection) and absorbed
   by the worker's own ``runs.analysis.analyze``; the rest is bulk-built (:func:`bulk_history`):
   ledger rows and heartbeats written by PostgreSQL (``INSERT ... SELECT generate_series``) in
   the shape ingest stores (same columns, spans and fetched JSON, one seq per 1,000 updates from
   the ingest sequence, which is moved past them), event rows up to ``BENCH_EVENTS_UPTO`` only,
   and the stored state built by the core (``Ledger.absorb_plain`` / ``beats.absorb`` of the
   rows the worker's raw read yields, in chunks of 1,000 updates, as a worker following the run
   would have);
2. in a fresh process (its peak RSS is the worker's): the analysis with nothing new, then 1,000
   new updates (64,000 events and their heartbeats) through ingest, then the analysis of them;
3. the web side's CPU per event (``ingest_batch`` process time: events/s per web core). Bytes
   per rank-update (live bytes, before and after compaction) are bench/storage.py's to measure.

The run saves ``BENCH_CHECKPOINTS`` checkpoints (default 20), spread evenly over the history,
each a generation of 64 shards (one per rank: model and optimizer objects, rank 0 also the other
required components: 131 objects) committed through ingest and its objects stored ``ok`` with
the verifier's change marker (``runs.seq.mark_changed``), so every one is restorable and the
analysis carries them (read once, then kept in ``Analysis.inputs``).

Then the projection for 1,024 and 16,384 ranks, arithmetic shown. Targets (printed, not asserted):
analysis of 1,000 new updates < 1 s and flat within 2x across levels, nothing new < 100 ms, peak
RSS < 500 MB.

The 16,384-rank level (issue 28, ``BENCH_WIDTHS``, default ``64,16384``; :func:`wide_main`): a
job of 2,048 nodes of 8 at 1 update/s reporting per rank (``update_committed``) or per node
(``update_aggregate``) on the SDK's flush policy; 100 updates of each shape through ingest at
``BENCH_WIDE_INGEST_RANKS`` (256) for the bytes per rank-update as ingested and the ledger rows
ingest's joins leave per update; at 16,384 ranks the worker's analysis of 100 new updates at
``BENCH_WIDE_LEVELS`` (1,000 and 100,000 absorbed, rows in ingest's stored shape) in a fresh
process (wall, CPU, peak RSS), and a restart on 16,376 ranks (a node lost) with its first windows
through ingest: the worker's analysis and the restart page. Goals printed with met / NOT MET:
< 1 s, flat within 2x, < 1 GB, restart < 2 s. Not with ``BENCH_KEEP_DB``.

Run: ``.venv/bin/python bench/scale.py`` (DATABASE_URL defaults to the local PostgreSQL; a
throwaway database is created and dropped).

``BENCH_KEEP_DB=name`` keeps each level's database (``name_<level>``) and reuses it on the next
run instead of building it again (1M takes 10-18 min): a reused database has grown by the 1,000
updates every earlier measurement ingested, so its level is read from it (``Attempt.last_update``,
printed) and the next 1,000 follow it. When its stored state was written in another format than
the code's ``ledger.STATE_FORMAT``, it is first stored again in that format (or, older than
``ledger.CONTINUED_FORMAT``, rebuilt by the core from the same synthetic history, as
:func:`bulk_history` built it: :func:`rebuild_state`), then analysed once by the worker. Drop one
with ``dropdb name_<level>``.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "recoverydash.settings")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/benchscale")
os.environ.setdefault("CELERY_BROKER_URL", "memory://")

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402

WORLD = 64
PER_RANK = 8
GBS = WORLD * PER_RANK
SECONDS_PER_UPDATE = 2.0
HEARTBEAT_S = 30.0
BEAT_EVERY = int(HEARTBEAT_S / SECONDS_PER_UPDATE)  # updates between a rank's heartbeats
NEW = 1000
#: 1,000,000 takes this 2-core machine about 25 min to build (1,607 s with the machine shared)
#: and ~26 GB of PostgreSQL (100,000: 116-185 s and 2.6 GB); BENCH_KEEP_DB keeps it
LEVELS = [int(x) for x in os.environ.get("BENCH_LEVELS", "10000,100000").split(",")]
INGESTED = int(os.environ.get("BENCH_INGESTED", "1000"))
#: the COPYed history writes event rows (canonical body and hash) up to this update only: beyond
#: it the Python side of building them is what would take the machine hours (the analysis never
#: reads the events table; its size is reported from the ingested updates)
EVENTS_UPTO = int(os.environ.get("BENCH_EVENTS_UPTO", "10000"))
CHECKPOINTS = int(os.environ.get("BENCH_CHECKPOINTS", "20"))
T0 = datetime(2026, 1, 1, tzinfo=UTC)
RUN_ID = "scale"


def at(update: int) -> datetime:
    return T0 + timedelta(seconds=SECONDS_PER_UPDATE * update)


def update_events(update: int) -> list[dict]:
    """One update's wire events: 64 ``update_committed`` and the heartbeats due (rank r beats at
    updates u with (u + r) % 15 == 0, so the ranks' beats are spread like real clocks')."""
    base = (update - 1) * GBS
    when = at(update).isoformat()
    out = [{"event_id": f"u{update}-{rank}", "type": "update_committed", "run_id": RUN_ID,
            "attempt": 0, "time": when, "rank": rank, "update": update, "samples": PER_RANK,
            "spans": [{"stratum": "main", "epoch": 0,
                       "ranges": [[base + rank, base + GBS, WORLD]]}]}
           for rank in range(WORLD)]
    out += [{"event_id": f"h{update}-{rank}", "type": "heartbeat", "run_id": RUN_ID,
             "attempt": 0, "time": when, "rank": rank, "update": update,
             "fetched": [{"stratum": "main", "epoch": 0, "position": update * GBS + 2 * GBS}]}
            for rank in range(WORLD) if (update + rank) % BEAT_EVERY == 0]
    return out


def start_event() -> dict:
    return {"event_id": "start", "type": "attempt_started", "run_id": RUN_ID, "attempt": 0,
            "time": T0.isoformat(), "world_size": WORLD, "dataset_version": "ds",
            "global_batch_size": GBS, "micro_batch_size": PER_RANK, "grad_accum_steps": 1}


def ingest_updates(project, first: int, last: int) -> tuple[int, float]:
    """Updates ``first..last`` through ``ingest_batch`` in the SDK's batches of 1,000 events;
    returns (events, process CPU seconds of the web side)."""
    from recoverydash.ingest.actions import ingest_batch

    events, cpu = 0, 0.0
    pending: list = []
    for update in range(first, last + 1):
        pending += update_events(update)
        while len(pending) >= 1000 or (update == last and pending):
            batch, pending = pending[:1000], pending[1000:]
            c0 = time.process_time()
            ingest_batch(project, batch)
            cpu += time.process_time() - c0
            events += len(batch)
    return events, cpu


def bulk_history(run, first: int, last: int, ledger) -> int:
    """Updates ``first..last`` bulk-built: their ledger rows and heartbeats written by
    PostgreSQL itself (``INSERT ... SELECT`` over ``generate_series``, in ingest's shape: the
    same columns, spans and fetched JSON as :func:`update_events` sends and ingest stores, one
    seq per 1,000 updates taken from the ingest sequence), and the same rows absorbed into
    ``ledger`` by the core (``Ledger.absorb_plain`` of the tuples the worker's raw read yields,
    chunks of 1,000 updates, as a worker following the run would have). Event rows (the audit
    log, never read by the analysis) are written for updates up to :data:`EVENTS_UPTO` only.
    Returns the last seq taken."""
    from recoverydash.runs.models import Attempt, Event, Heartbeat, LedgerRow, Run
    from recoverydash.runs.seq import SEQUENCE

    now = datetime.now(UTC)
    t0 = T0.timestamp()
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT nextval('{SEQUENCE}')")
        seq0 = int(cursor.fetchone()[0])
        steps = (last - first) // 1000 + 1
        cursor.execute(f"SELECT setval('{SEQUENCE}', %s)", [seq0 + steps])
    seq_of = f"({seq0} + (u - {first}) / 1000)"
    when = f"to_timestamp({t0} + {SECONDS_PER_UPDATE} * u)"
    ledger_sql = (
        f'INSERT INTO "{LedgerRow._meta.db_table}" (run_id, attempt, "update", rank, time, spans, '
        'samples, tokens, first_seq, last_seq) '
        f"SELECT %s, 0, u, r, {when}, jsonb_build_array(jsonb_build_object('stratum', 'main', "
        f"'epoch', 0, 'ranges', jsonb_build_array(jsonb_build_array((u - 1) * {GBS} + r, "
        f"u * {GBS}, {WORLD})))), {PER_RANK}, NULL, {seq_of}, {seq_of} "
        f"FROM generate_series(%s, %s) u, generate_series(0, {WORLD - 1}) r ORDER BY u, r")
    beat_sql = (
        f'INSERT INTO "{Heartbeat._meta.db_table}" (run_id, attempt, rank, time, "update", '
        f"fetched, seq) SELECT %s, 0, r, {when}, u, jsonb_build_array(jsonb_build_object("
        f"'stratum', 'main', 'epoch', 0, 'position', u * {GBS} + 2 * {GBS})), {seq_of} "
        f"FROM generate_series(%s, %s) u, generate_series(0, {WORLD - 1}) r "
        f"WHERE mod(u + r, {BEAT_EVERY}) = 0 ORDER BY u, r")
    event_sql = (
        f'INSERT INTO "{Event._meta.db_table}" (run_id, event_id, type, attempt, rank, time, '
        "received_at, batch_seq, content_hash, body) "
        f"SELECT %s, 'u' || u || '-' || r, 'update_committed', 0, r, {when}, %s, {seq_of}, "
        "encode(sha256(convert_to(b::text, 'UTF8')), 'hex'), b FROM ("
        f"SELECT u, r, jsonb_build_object('event_id', 'u' || u || '-' || r, 'type', "
        f"'update_committed', 'run_id', %s, 'attempt', 0, 'time', "
        f"to_char({when} AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"+00:00\"'), 'rank', r, "
        f"'update', u, 'samples', {PER_RANK}, 'spans', jsonb_build_array(jsonb_build_object("
        f"'stratum', 'main', 'epoch', 0, 'ranges', jsonb_build_array(jsonb_build_array("
        f"(u - 1) * {GBS} + r, u * {GBS}, {WORLD}))))) b "
        f"FROM generate_series(%s, %s) u, generate_series(0, {WORLD - 1}) r) e ORDER BY u, r")
    chunk = 50_000
    for lo in range(first, last + 1, chunk):
        hi = min(last, lo + chunk - 1)
        with connection.cursor() as cursor:
            cursor.execute(ledger_sql, [run.pk, lo, hi])
            cursor.execute(beat_sql, [run.pk, lo, hi])
            if lo <= EVENTS_UPTO:
                cursor.execute(event_sql, [run.pk, now, RUN_ID, lo, min(hi, EVENTS_UPTO)])
    absorb_synthetic(ledger, first, last)
    seq = seq0 + steps - 1
    Run.objects.filter(pk=run.pk).update(ingest_seq=seq, last_received_at=now,
                                         last_event_at=at(last))
    # the attempt's last update and event move as ingest moves them (the silence rules read the
    # newest updates below Attempt.last_update: left at the ingested part, they read the whole
    # bulk history on every analysis)
    Attempt.objects.filter(run=run, attempt=0).update(last_update=last, last_update_at=at(last),
                                                      last_event_at=at(last))
    return seq


def commit_event(update: int) -> dict:
    """A checkpoint of the run at ``update``: 64 shards, the manifest's data cursor at the
    ledger's frontier (``update * GBS``)."""
    from recoverydash.recovery.contract import DEFAULT_REQUIRED_COMPONENTS

    gid = f"ckpt-{update:08d}"
    extra = [c for c in DEFAULT_REQUIRED_COMPONENTS if c not in ("model", "optimizer")]
    objects = [{"uri": f"file:///ckpt/{gid}/{c}-{rank}.pt", "shard": f"rank{rank}",
                "component": c, "size": 1000 + rank,
                "sha256": hashlib.sha256(f"{gid}/{c}/{rank}".encode()).hexdigest()}
               for rank in range(WORLD) for c in (["model", "optimizer"] +
                                                  (extra if rank == 0 else []))]
    manifest = {"schema_revision": 1, "generation_id": gid, "update": update,
                "world_size": WORLD, "required_shards": [f"rank{r}" for r in range(WORLD)],
                "components": sorted({o["component"] for o in objects}), "objects": objects,
                "dataset_version": "ds", "committed_at": at(update).isoformat(),
                "data_progress": {"cursor": [{"stratum": "main", "epoch": 0,
                                              "position": update * GBS}]}}
    return {"event_id": f"commit-{update}", "type": "checkpoint_committed", "run_id": RUN_ID,
            "attempt": 0, "time": at(update).isoformat(), "manifest": manifest}


def checkpoints(project, run, level: int) -> int:
    """:data:`CHECKPOINTS` checkpoints spread over updates 1..``level`` through ingest, their
    objects stored ``ok`` with the change marker a verifier writes (one per generation)."""
    from django.db import transaction

    from recoverydash.ingest.actions import ingest_batch
    from recoverydash.runs.models import CheckpointObject, Generation
    from recoverydash.runs.seq import mark_changed

    updates = sorted({max(1, level * (k + 1) // CHECKPOINTS) for k in range(CHECKPOINTS)})
    for update in updates:
        ingest_batch(project, [commit_event(update)])
    for gen in Generation.objects.filter(run=run):
        with transaction.atomic():
            mark_changed(run.pk, gen.pk)
            CheckpointObject.objects.filter(generation=gen, in_manifest=True).update(
                check_status="ok", checked_at=datetime.now(UTC))
    return len(updates)


def absorb_synthetic(ledger, first: int, last: int) -> None:
    """Absorb updates ``first..last`` of the synthetic history (:func:`update_events`' ledger
    reports and heartbeats) into ``ledger`` by the core, in chunks of 1,000 updates (rows in
    ``(update, rank)`` order, as the worker's raw read yields them)."""
    from recoverydash import recovery

    t0 = T0.timestamp()
    for lo in range(first, last + 1, 1000):
        hi = min(last, lo + 999)
        rows = [(0, u, r, t0 + SECONDS_PER_UPDATE * u, None, "main", 0, (u - 1) * GBS + r,
                 u * GBS, WORLD) for u in range(lo, hi + 1) for r in range(WORLD)]
        ledger.absorb_plain(rows)
        ledger.beats.absorb([recovery.HeartbeatRecord(
            0, r, t0 + SECONDS_PER_UPDATE * u, u,
            [{"stratum": "main", "epoch": 0, "position": u * GBS + 2 * GBS}])
            for u in range(lo, hi + 1) for r in range(WORLD) if (u + r) % BEAT_EVERY == 0])


def store_state(run, ledger) -> None:
    """Store ``ledger`` as the run's analysis state at the run's ingest seq (what the worker
    would have stored after absorbing every row)."""
    from recoverydash.runs import analysis as bridge

    run.refresh_from_db()
    bridge.store_state(run, ledger, run.ingest_seq)


def build(level: int) -> dict:
    """A fresh run with ``level`` absorbed updates; returns what was measured while building."""
    from recoverydash.runs import analysis as bridge
    from recoverydash.runs.models import Analysis, Project, Run

    Project.objects.all().delete()
    project = Project.objects.create(name=f"scale{level}")
    from recoverydash.ingest.actions import ingest_batch

    ingest_batch(project, [start_event()])
    ingested = min(INGESTED, level)
    events, cpu = ingest_updates(project, 1, ingested)
    run = Run.objects.get(project=project, run_id=RUN_ID)
    bridge.analyze(run)
    analysis = Analysis.objects.get(run=run)
    ledger = bridge.load_state(analysis.pk, analysis.state)
    if level > ingested:
        bulk_history(run, ingested + 1, level, ledger)
        store_state(run, ledger)
    saved = checkpoints(project, run, level) if CHECKPOINTS else 0
    bridge.analyze(run)  # the stored result of the whole history, as the worker's would be
    result = Analysis.objects.get(run=run).result or {}
    statuses = (result.get("generations_summary") or {}).get("by_status") or {}
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return {"run_pk": run.pk, "project_pk": project.pk, "ingest_events": events,
            "ingest_cpu": cpu, "ingested_rank_updates": ingested * WORLD,
            "checkpoints": saved, "statuses": statuses}


def profiled(fn, *args) -> None:
    """Run ``fn`` under cProfile, the costliest calls on stderr (BENCH_PROFILE=none|new;
    BENCH_PROFILE_LINES, default 30)."""
    import cProfile
    import pstats

    profile = cProfile.Profile()
    profile.runcall(fn, *args)
    lines = int(os.environ.get("BENCH_PROFILE_LINES", "30"))
    pstats.Stats(profile, stream=sys.stderr).sort_stats("cumulative").print_stats(lines)


def measure(run_pk: int, project_pk: int, level: int) -> dict:
    """In a fresh process: the analysis with nothing new (median of 3), 1,000 new updates
    through ingest, their analysis; the process's peak RSS."""
    from recoverydash.runs import analysis as bridge
    from recoverydash.runs.models import Project, Run

    run = Run.objects.get(pk=run_pk)
    project = Project.objects.get(pk=project_pk)
    from django.test.utils import CaptureQueriesContext
    from django.urls import get_resolver

    # the URLconf, loaded once per worker process (an alert flip's payload reverses URLs): not
    # part of any analysis after a worker's first
    _ = get_resolver().reverse_dict

    none = []
    for _ in range(3):
        with CaptureQueriesContext(connection) as queries:
            t0 = time.perf_counter()
            bridge.analyze(run)
            none.append(time.perf_counter() - t0)
    if os.environ.get("BENCH_PROFILE") == "none":
        profiled(bridge.analyze, run)
    events, cpu = ingest_updates(project, level + 1, level + NEW)
    run.refresh_from_db()
    t0 = time.perf_counter()
    if os.environ.get("BENCH_PROFILE") == "new":
        profiled(bridge.analyze, run)
    else:
        bridge.analyze(run)
    new = time.perf_counter() - t0
    t0 = time.perf_counter()
    bridge.analyze(run)
    none_after = time.perf_counter() - t0
    return {"none_s": statistics.median(none), "none_queries": len(queries.captured_queries),
            "new_s": new, "none_after_s": none_after,
            "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "events": events, "cpu": cpu}


KEEP_DB = os.environ.get("BENCH_KEEP_DB", "")
#: the widths measured: 64 (the levels above) and the wide level (WIDE ranks, below)
WIDTHS = os.environ.get("BENCH_WIDTHS", "64,16384").split(",")


def _admin(sql: str) -> None:
    """Run ``sql`` (CREATE/DROP DATABASE) on the server's ``postgres`` database."""
    import psycopg

    params = connection.get_connection_params()
    params = {k: v for k, v in params.items() if k in ("host", "port", "user", "password")}
    with psycopg.connect(dbname="postgres", autocommit=True, **params) as conn:
        conn.execute(sql)


def _use_database(name: str) -> None:
    connection.close()
    connection.settings_dict["NAME"] = name


def kept(level: int) -> tuple[dict, int]:
    """The kept database of ``level`` (``BENCH_KEEP_DB``): ``(built, current level)``, built and
    marked complete when absent or incomplete, else reused (its state rebuilt by
    :func:`rebuild_state` when of another format)."""
    from django.core.management import call_command
    from django.db.utils import OperationalError

    name = f"{KEEP_DB}_{level}"
    try:
        _use_database(name)
        with connection.cursor() as cursor:
            cursor.execute("SELECT body FROM bench_scale_built")
            built = json.loads(cursor.fetchone()[0])
    except Exception as exc:  # noqa: BLE001 - absent, or incomplete: (re)build it
        if not isinstance(exc, OperationalError):
            print(f"{name}: not a complete build ({type(exc).__name__}); rebuilding",
                  file=sys.stderr)
        _use_database("postgres")
        _admin(f'DROP DATABASE IF EXISTS "{name}"')
        _admin(f'CREATE DATABASE "{name}"')
        _use_database(name)
        call_command("migrate", verbosity=0)
        t0 = time.perf_counter()
        built = build(level)
        built["build_s"] = time.perf_counter() - t0
        with connection.cursor() as cursor:
            cursor.execute("CREATE TABLE bench_scale_built (body text)")
            cursor.execute("INSERT INTO bench_scale_built VALUES (%s)", [json.dumps(built)])
        return built, level
    call_command("migrate", verbosity=0)  # the code's migrations since the build
    return built, rebuild_state(built)


def rebuild_state(built: dict) -> int:
    """Bring a reused database's stored state to the code's format: when it is of another one,
    load it and store it again when the code continues it (``ledger.CONTINUED_FORMAT``), else
    rebuild it by the core from the synthetic history up to the run's last update (every update
    of the run, bulk-built or ingested, has the shape :func:`update_events` gives); then let the
    worker analyse once. Returns the run's last update (the level measured)."""
    from recoverydash import recovery
    from recoverydash.recovery.ledger import CONTINUED_FORMAT, STATE_FORMAT
    from recoverydash.runs import analysis as bridge
    from recoverydash.runs.models import Analysis, Attempt, Run

    run = Run.objects.get(pk=built["run_pk"])
    level = Attempt.objects.get(run=run, attempt=0).last_update
    analysis = Analysis.objects.get(run=run)
    if analysis.state_format != STATE_FORMAT:
        t0 = time.perf_counter()
        if analysis.state_format >= CONTINUED_FORMAT:  # the same state, another layout
            ledger = bridge.load_state(analysis.pk, analysis.state)
        else:
            ledger = recovery.Ledger()
            absorb_synthetic(ledger, 1, level)
        store_state(run, ledger)
        bridge.analyze(run)
        print(f"state of format {analysis.state_format} rebuilt to {STATE_FORMAT} in "
              f"{time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return level


# --- the 16,384-rank level (issue 28, "Width") -----------------------------------------------

#: The wide job: ranks, ranks per node, samples per rank per update, seconds per update.
WIDE = int(os.environ.get("BENCH_WIDE_RANKS", "16384"))
NODE = 8
WIDE_PER_RANK = 8
WIDE_SECONDS = 1.0
#: Absorbed updates at which the wide level is measured, and the new updates each analysis meets.
WIDE_LEVELS = [int(x) for x in os.environ.get("BENCH_WIDE_LEVELS", "1000,100000").split(",")]
WIDE_NEW = int(os.environ.get("BENCH_WIDE_NEW", "100"))
#: how the ranks report: per-rank update_committed (each rank's client on the SDK's flush
#: policy) and update_aggregate from one reporter per node of NODE ranks
WIDE_SHAPES = [x for x in os.environ.get("BENCH_WIDE_SHAPES", "per-rank,aggregate").split(",")
               if x]
#: requests of about the same moment handed to one ingest_batch call (at most this many events):
#: the stored rows are those of separate requests (a batch's parts of consecutive ranks fold as
#: joined ones would); the web side's cost per request is bench/ingest_one_run.py's
WIDE_CALL_EVENTS = 2000
#: the width whose WIDE_NEW updates go through ingest for the bytes per rank-update (every
#: report of the SDK's shape through the real path; the bytes do not grow with the width: 318.6
#: and 316.2 per rank-update at 256 and 1,024 ranks; 16,384 ranks would take this machine ~30 min)
WIDE_INGEST_RANKS = int(os.environ.get("BENCH_WIDE_INGEST_RANKS", "256"))
#: measure the restart (its first updates and windows go through ingest: ~1 min)
WIDE_RESTART = os.environ.get("BENCH_WIDE_RESTART", "1") == "1"
#: goals (issue 28): analysis of WIDE_NEW new updates, its flatness across levels, peak RSS,
#: the restart's analysis
WIDE_NEW_GOAL_S, WIDE_FLAT_GOAL, WIDE_RSS_GOAL_MB, WIDE_RESTART_GOAL_S = 1.0, 2.0, 1024, 2.0


def met(ok: bool) -> str:
    return "met" if ok else "NOT MET"


def wide_gbs(world: int) -> int:
    return world * WIDE_PER_RANK


def wide_at(update: int) -> str:
    return (T0 + timedelta(seconds=WIDE_SECONDS * update)).isoformat()


def wide_phase(reporter: int, period: float) -> float:
    """A reporter's first send, seconds into the window: the SDK's first-cycle jitter spreads
    a large job's first sends over [0.05, 1.2] x the interval (a fixed pseudo-random draw)."""
    return period * (0.05 + 1.15 * ((reporter * 2654435761) % 1000003) / 1000003)


def wide_part(world: int, rank: int, update: int, first: int = 0, base: int = 0) -> dict:
    """Rank ``rank``'s report of ``update`` in a ``world``-rank attempt that started after
    update ``first`` at position ``base``: the DistributedSampler's strided range, spelled as
    the SDK's recorders spell it (start and stop both moved by the rank, so consecutive ranks'
    reports fold: runs.folding)."""
    gbs = wide_gbs(world)
    lo = base + (update - first - 1) * gbs + rank
    return {"stratum": "main", "epoch": 0, "ranges": [[lo, lo + gbs, world]]}


def wide_requests(run_id: str, shape: str, first: int, last: int, *, attempt: int = 0,
                  world: int = WIDE, start: int = 0, base: int = 0, offset: int = 0):
    """The requests the job sends for updates ``first..last`` of ``attempt`` (``world`` ranks;
    the attempt started after update ``start`` at position ``base``; its clock ``offset``
    updates later than the first attempt's), in the order they arrive:
    ``(time, events)``. Per-rank: each rank's client sends every ``FlushPolicy(world).interval()``
    seconds (60 s at 16,384 ranks) what it gathered, its update_committed and its heartbeats (one
    per rank every HEARTBEAT_S, carrying its read cursor); aggregate: one reporter per node sends
    an update_aggregate of its NODE ranks per update on the policy of ``world / NODE``
    reporters, and the ranks' own clients still send their heartbeats. Every reporter's last
    request (what close() or its next periodic send carries) comes after ``last``."""
    from recoverydash.sdk.flush import FlushPolicy

    when = {u: wide_at(u + offset) for u in range(first, last + 1)}
    gbs = wide_gbs(world)
    window = (last - first + 1) * WIDE_SECONDS
    out: list = []

    def sends(reporter: int, period: float) -> list[float]:
        t, times = wide_phase(reporter, period), []
        while t < window:
            times.append(t)
            t += period
        return times + [window]

    def cut(times: list[float]) -> list[tuple[float, int, int]]:
        """``(time, lo, hi)``: the updates committed since the previous send."""
        done, prev, pieces = first - 1, first - 1, []
        for t in times:
            done = min(last, first - 1 + int(t / WIDE_SECONDS))
            if done > prev:
                pieces.append((t, prev + 1, done))
                prev = done
        return pieces

    beat_every = int(HEARTBEAT_S / WIDE_SECONDS)
    rank_period = FlushPolicy(world_size=world).interval()
    for rank in range(world):
        for t, lo, hi in cut(sends(rank, rank_period)):
            events = []
            if shape == "per-rank":
                events = [{"event_id": f"a{attempt}u{u}r{rank}", "type": "update_committed",
                           "run_id": run_id, "attempt": attempt, "time": when[u], "rank": rank,
                           "update": u, "samples": WIDE_PER_RANK,
                           "spans": [wide_part(world, rank, u, start, base)]}
                          for u in range(lo, hi + 1)]
            events += [{"event_id": f"a{attempt}h{u}r{rank}", "type": "heartbeat",
                        "run_id": run_id, "attempt": attempt, "time": when[u], "rank": rank,
                        "update": u, "fetched": [{"stratum": "main", "epoch": 0,
                                                  "position": base + (u - start + 2) * gbs}]}
                       for u in range(lo, hi + 1) if (u + rank) % beat_every == 0]
            if events:
                out.append((t, rank, events))
    if shape == "aggregate":
        nodes = world // NODE
        node_period = FlushPolicy(world_size=nodes).interval()
        for node in range(nodes):
            ranks = range(node * NODE, node * NODE + NODE)
            for t, lo, hi in cut(sends(world + node, node_period)):
                out.append((t, world + node, [
                    {"event_id": f"a{attempt}u{u}n{node}", "type": "update_aggregate",
                     "run_id": run_id, "attempt": attempt, "time": when[u], "update": u,
                     "world_size": world,
                     "ranks": [{"rank": r, "samples": WIDE_PER_RANK,
                                "spans": [wide_part(world, r, u, start, base)]} for r in ranks]}
                    for u in range(lo, hi + 1)]))
    out.sort(key=lambda item: (item[0], item[1]))
    return out


def wide_ingest(project, requests) -> tuple[int, int, float]:
    """The requests through ``ingest_batch``, those of about the same moment together (at most
    :data:`WIDE_CALL_EVENTS` events a call, never a request split); returns (events,
    rank-updates, seconds)."""
    from recoverydash.ingest.actions import ingest_batch

    events = parts = 0
    pending: list = []
    started = time.perf_counter()
    for i, (_t, _reporter, body) in enumerate(requests):
        pending += body
        if len(pending) >= WIDE_CALL_EVENTS or i == len(requests) - 1:
            ingest_batch(project, pending)
            events += len(pending)
            parts += sum(len(e["ranks"]) if e["type"] == "update_aggregate" else
                         e["type"] == "update_committed" for e in pending)
            pending = []
    return events, parts, time.perf_counter() - started


def wide_start(run_id: str, attempt: int = 0, world: int = WIDE, resumed: dict | None = None,
               update: int = 0) -> dict:
    return {"event_id": f"start-{attempt}", "type": "attempt_started", "run_id": run_id,
            "attempt": attempt, "time": wide_at(update), "world_size": world,
            "dataset_version": "ds", "global_batch_size": wide_gbs(world),
            "micro_batch_size": WIDE_PER_RANK, "grad_accum_steps": 1,
            **({"resumed_from": resumed} if resumed else {})}


def wide_commit(run_id: str, update: int) -> dict:
    """A checkpoint at ``update`` of the wide job: a shard per rank (model and optimizer
    objects; rank 0 also the other required components), the data cursor at the ledger's
    frontier."""
    from recoverydash.recovery.contract import DEFAULT_REQUIRED_COMPONENTS

    gid = f"ckpt-{update:08d}"
    extra = [c for c in DEFAULT_REQUIRED_COMPONENTS if c not in ("model", "optimizer")]
    objects = [{"uri": f"file:///ckpt/{gid}/{c}-{rank}.pt", "shard": f"rank{rank}",
                "component": c, "size": 1000 + rank,
                "sha256": hashlib.sha256(f"{gid}/{c}/{rank}".encode()).hexdigest()}
               for rank in range(WIDE) for c in (["model", "optimizer"] +
                                                 (extra if rank == 0 else []))]
    manifest = {"schema_revision": 1, "generation_id": gid, "update": update,
                "world_size": WIDE, "required_shards": [f"rank{r}" for r in range(WIDE)],
                "components": sorted({o["component"] for o in objects}), "objects": objects,
                "dataset_version": "ds", "committed_at": wide_at(update),
                "data_progress": {"cursor": [{"stratum": "main", "epoch": 0,
                                              "position": update * wide_gbs(WIDE)}]}}
    return {"event_id": f"commit-{update}", "type": "checkpoint_committed", "run_id": run_id,
            "attempt": 0, "time": wide_at(update), "manifest": manifest}


def wide_rows_sql(run, first: int, last: int, beats: bool) -> int:
    """Updates ``first..last`` of the wide run's attempt 0 written by PostgreSQL in the shape
    ingest stores them (``INSERT ... SELECT generate_series``): one ledger row per update
    holding all WIDE ranks (what ingest's joins leave of the per-rank and the node reports:
    :func:`wide_ingested` checks it through ingest, ``rows/update`` printed), with
    ``beats`` the ranks' heartbeats (one per rank every HEARTBEAT_S, carrying its read cursor)
    and the attempt's RankSeen rows; one seq per 1,000 updates from the ingest sequence, which
    is moved past them. Moves the run's and the attempt's counters as ingest moves them.
    Returns the last seq taken."""
    from recoverydash.runs.models import Attempt, Heartbeat, LedgerRow, Run
    from recoverydash.runs.seq import SEQUENCE

    gbs = wide_gbs(WIDE)
    t0 = T0.timestamp()
    beat_every = int(HEARTBEAT_S / WIDE_SECONDS)
    when = f"to_timestamp({t0} + {WIDE_SECONDS} * u)"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT nextval('{SEQUENCE}')")
        seq0 = int(cursor.fetchone()[0])
        steps = (last - first) // 1000 + 1
        cursor.execute(f"SELECT setval('{SEQUENCE}', %s)", [seq0 + steps])
        seq_of = f"({seq0} + (u - {first}) / 1000)"
        cursor.execute(
            f'INSERT INTO "{LedgerRow._meta.db_table}" (run_id, attempt, "update", rank, ranks, '
            f"rank_shift, time, spans, samples, tokens, first_seq, last_seq) SELECT %s, 0, u, 0, "
            f"{WIDE}, 1, {when}, jsonb_build_array(jsonb_build_object('epoch', 0, 'ranges', "
            f"jsonb_build_array(jsonb_build_array((u - 1) * {gbs}, u * {gbs}, {WIDE})), "
            f"'stratum', 'main')), {WIDE_PER_RANK}, NULL, {seq_of}, {seq_of} "
            "FROM generate_series(%s::bigint, %s::bigint) u", [run.pk, first, last])
        if beats:
            cursor.execute(
                f'INSERT INTO "{Heartbeat._meta.db_table}" (run_id, attempt, rank, time, '
                f'"update", fetched, seq) SELECT %s, 0, r, {when}, u, jsonb_build_array('
                f"jsonb_build_object('stratum', 'main', 'epoch', 0, 'position', (u + 2) * "
                f"{gbs})), {seq_of} FROM generate_series(%s::bigint, %s::bigint) u, "
                f"generate_series(0, "
                f"{WIDE - 1}) r WHERE mod(u + r, {beat_every}) = 0 ORDER BY u, r",
                [run.pk, first, last])
            cursor.execute(
                "INSERT INTO runs_rankseen (attempt_id, reporter, seen_at) SELECT a.id, r::text, "
                "now() FROM runs_attempt a, generate_series(0, %s) r WHERE a.run_id = %s AND "
                "a.attempt = 0 ON CONFLICT (attempt_id, reporter) DO UPDATE SET seen_at = "
                "excluded.seen_at", [WIDE - 1, run.pk])
    seq = seq0 + steps - 1
    moment = T0 + timedelta(seconds=WIDE_SECONDS * last)
    Run.objects.filter(pk=run.pk).update(ingest_seq=seq, last_received_at=datetime.now(
        T0.tzinfo), last_event_at=moment)
    Attempt.objects.filter(run=run, attempt=0).update(last_update=last, last_update_at=moment,
                                                      last_event_at=moment)
    run.refresh_from_db()
    return seq


def wide_history(run, level: int) -> None:
    """Updates 1..``level`` of the wide run (:func:`wide_rows_sql`, without heartbeat rows: a
    history this long is compacted, docs/retention.md), its state absorbed by the core
    (``Ledger.absorb_folded`` of the same rows, chunks of 1,000 updates, as a worker following
    the run would have) with the heartbeat fold of the history's last HEARTBEAT_S of updates
    (every rank's newest beat and the furthest cursor: the fold's size is bounded whatever it
    absorbed), stored as the worker stores it."""
    from recoverydash import recovery
    from recoverydash.runs import analysis as bridge

    seq = wide_rows_sql(run, 1, level, beats=False)
    gbs = wide_gbs(WIDE)
    t0 = T0.timestamp()
    ledger = recovery.Ledger()
    for lo in range(1, level + 1, 1000):
        hi = min(level, lo + 999)
        ledger.absorb_folded([(0, u, 0, WIDE, 1, t0 + WIDE_SECONDS * u, None, "main", 0, None,
                               (u - 1) * gbs, u * gbs, WIDE) for u in range(lo, hi + 1)])
    beat_every = int(HEARTBEAT_S / WIDE_SECONDS)
    ledger.beats.absorb([recovery.HeartbeatRecord(
        0, r, t0 + WIDE_SECONDS * u, u, [{"stratum": "main", "epoch": 0,
                                          "position": (u + 2) * gbs}])
        for u in range(max(1, level - beat_every + 1), level + 1) for r in range(WIDE)
        if (u + r) % beat_every == 0])
    bridge.store_state(run, ledger, seq)


def wide_build(project, level: int) -> dict:
    """A wide run of ``level`` absorbed updates, analysed by the worker, with a restorable
    checkpoint at ``level`` (a shard per rank); then WIDE_NEW new updates in ingest's stored
    shape (:func:`wide_rows_sql`). Returns what the measuring process needs."""
    from django.db import transaction

    from recoverydash.ingest.actions import ingest_batch
    from recoverydash.runs import analysis as bridge
    from recoverydash.runs.models import CheckpointObject, Generation, Run
    from recoverydash.runs.seq import mark_changed

    run_id = f"wide-{level}"
    t0 = time.perf_counter()
    ingest_batch(project, [wide_start(run_id)])
    run = Run.objects.get(project=project, run_id=run_id)
    wide_history(run, level)
    ingest_batch(project, [wide_commit(run_id, level)])
    for gen in Generation.objects.filter(run=run):
        with transaction.atomic():
            mark_changed(run.pk, gen.pk)
            CheckpointObject.objects.filter(generation=gen, in_manifest=True).update(
                check_status="ok", checked_at=datetime.now(T0.tzinfo))
    bridge.analyze(run)  # the stored analysis of the history, as the worker's would be
    wide_rows_sql(run, level + 1, level + WIDE_NEW, beats=True)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return {"run_pk": run.pk, "run_id": run_id, "level": level,
            "build_s": time.perf_counter() - t0}


def wide_ingested(project, shape: str, world: int) -> dict:
    """WIDE_NEW updates of a ``world``-rank job reported in ``shape`` through ``ingest_batch``
    (:func:`wide_requests`, the SDK's flush policy): bytes per rank-update as ingested (events,
    ledger rows, heartbeats, RankSeen rows with their indexes' share) and the ledger rows left
    per update (what :func:`wide_rows_sql` writes at WIDE ranks: 1)."""
    from recoverydash.ingest.actions import ingest_batch
    from recoverydash.runs.models import Run

    run_id = f"ingested-{shape}-{world}"
    ingest_batch(project, [wide_start(run_id, 0, world)])
    run = Run.objects.get(project=project, run_id=run_id)
    events, parts, seconds = wide_ingest(project, wide_requests(run_id, shape, 1, WIDE_NEW,
                                                                world=world))
    sizes = wide_sizes(run)
    return {"shape": shape, "world": world, "events": events, "parts": parts,
            "seconds": seconds, "bytes": {k: v / parts for k, v in sizes.items()},
            "rows_per_update": wide_rows(run, 1, WIDE_NEW)}


def wide_sizes(run) -> dict:
    """Live bytes of the run's events, ledger rows and heartbeats with their indexes (each
    row's own size, ``pg_column_size`` of the whole row, plus its index entries estimated from
    the indexes' size per row of the table)."""
    from recoverydash.runs.models import Event, Heartbeat, LedgerRow, RankSeen

    out = {}
    with connection.cursor() as cursor:
        for name, model, where in (("events", Event, "run_id = %s"),
                                   ("ledger", LedgerRow, "run_id = %s"),
                                   ("heartbeats", Heartbeat, "run_id = %s"),
                                   ("ranks seen", RankSeen, "attempt_id IN (SELECT id FROM "
                                                            "runs_attempt WHERE run_id = %s)")):
            table = model._meta.db_table
            cursor.execute("SELECT coalesce(sum(pg_column_size(t.*)), 0), count(*) FROM "
                           f'"{table}" t WHERE {where}', [run.pk])
            rows_bytes, count = cursor.fetchone()
            cursor.execute("SELECT pg_indexes_size(%s), (SELECT count(*) FROM "
                           f'"{table}")', [table])
            index_bytes, total = cursor.fetchone()
            out[name] = int(rows_bytes) + (int(index_bytes) * int(count) // max(1, int(total)))
    return out


def wide_rows(run, first: int, last: int) -> float:
    from recoverydash.runs.models import LedgerRow

    rows = LedgerRow.objects.filter(run=run, attempt=0, update__gte=first,
                                    update__lte=last).count()
    return rows / max(1, last - first + 1)


def wide_restart(project, built: dict) -> dict:
    """The restart of the wide run: the attempt of WIDE ranks fails after its WIDE_NEW new
    updates, and attempt 1 resumes from the checkpoint at the level on WIDE - NODE ranks (a node
    lost): attempt_started (resumed_from the generation and its cursor) and restore_completed,
    then its first two updates from every rank (per-rank update_committed, flush policy) and each
    rank's first window (``audit_window`` of its first update, and the lost attempt's of the same
    update: the expected window). Returns the worker's analysis time of the restart (in the
    measuring process) and the restart page's (``dashboard.queries.restart_detail``)."""
    from recoverydash.ingest.actions import ingest_batch

    run_id, level = built["run_id"], built["level"]
    gid = f"ckpt-{level:08d}"
    world = WIDE - NODE
    base = level * wide_gbs(WIDE)
    ingest_batch(project, [
        wide_start(run_id, 1, world, {"generation_id": gid, "update": level, "cursor": [
            {"stratum": "main", "epoch": 0, "position": base}]}, level + WIDE_NEW + 60),
        {"event_id": "restored-1", "type": "restore_completed", "run_id": run_id, "attempt": 1,
         "time": wide_at(level + WIDE_NEW + 90), "rank": 0, "generation_id": gid,
         "seconds": 30.0}])
    requests = wide_requests(run_id, "per-rank", level + 1, level + 2, attempt=1, world=world,
                             start=level, base=base, offset=WIDE_NEW + 100)
    ids = WIDE_PER_RANK

    def window(attempt: int, rank: int, w: int, update: int) -> dict:
        lo = base + (update - level - 1) * wide_gbs(w) + rank
        return {"event_id": f"w{attempt}u{update}r{rank}", "type": "audit_window",
                "run_id": run_id, "attempt": attempt, "rank": rank, "update": update,
                "time": wide_at(update + (WIDE_NEW + 100 if attempt else 0)), "accum_slot": 0,
                "sample_ids": [lo + k * w for k in range(ids)]}
    # the lost attempt's windows of U (what the restored state trained on) and of U + 1 (the
    # expected window), the resumed attempt's of U + 1 (the observed one)
    windows = [(0.0, r, [window(0, r, WIDE, level), window(0, r, WIDE, level + 1)])
               for r in range(WIDE)]
    windows += [(1.0, r, [window(1, r, world, level + 1)]) for r in range(world)]
    events, parts, ingest_s = wide_ingest(project, windows + requests)
    return {"events": events, "parts": parts, "ingest_s": ingest_s}


def wide_measure(run_pk: int, warm_pk: int, restart: bool) -> dict:
    """In a fresh process (its peak RSS is the worker's): a small run's analysis first (the
    worker's code paths warm, as in a worker that has analysed before), then the wide run's
    analysis of what was ingested since its stored one, and once more with nothing new; with
    ``restart``, the restart page's figures too (``dashboard.queries.restart_detail`` of
    attempt 1, from the stored analysis)."""
    from django.urls import get_resolver

    from recoverydash.runs import analysis as bridge
    from recoverydash.runs.models import Run

    assert get_resolver().reverse_dict is not None  # the URLconf, loaded once per worker
    bridge.analyze(Run.objects.get(pk=warm_pk))
    run = Run.objects.get(pk=run_pk)
    t0, c0 = time.perf_counter(), time.process_time()
    if os.environ.get("BENCH_PROFILE") == "new":
        profiled(bridge.analyze, run)
    else:
        bridge.analyze(run)
    new, new_cpu = time.perf_counter() - t0, time.process_time() - c0
    t0 = time.perf_counter()
    analysis = bridge.analyze(run)
    none = time.perf_counter() - t0
    out = {"new_s": new, "new_cpu": new_cpu, "none_s": none, "health": analysis.health}
    if restart:
        from recoverydash.dashboard.queries import restart_detail

        item = next(r for r in (analysis.result or {}).get("restarts") or []
                    if int(r.get("attempt", -1)) == 1)
        t0, c0 = time.perf_counter(), time.process_time()
        if os.environ.get("BENCH_PROFILE") == "page":
            profiled(restart_detail, run, 1)
        detail = restart_detail(run, 1)
        out["page_s"], out["page_cpu"] = time.perf_counter() - t0, time.process_time() - c0
        out["restart"] = {k: item.get(k) for k in (
            "verdict", "replayed", "omitted", "resumed_update", "world_size_before",
            "world_size_after")}
        out["windows"] = {k: v for k, v in (detail.windows or {}).items()
                          if isinstance(v, (int, float, str, bool))}
    out["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def wide_subprocess(run_pk: int, warm_pk: int, restart: bool) -> dict:
    name = connection.settings_dict["NAME"]
    connection.close()
    out = subprocess.run([sys.executable, __file__, "--measure-wide", str(run_pk), str(warm_pk),
                          "1" if restart else "0", name], capture_output=True, text=True)
    if out.returncode or os.environ.get("BENCH_PROFILE"):
        print(out.stderr[-20000:], file=sys.stderr)
    out.check_returncode()
    return json.loads(out.stdout.strip().splitlines()[-1])


def wide_main() -> None:
    """The wide level: bytes per rank-update through ingest (WIDE_INGEST_RANKS, each shape);
    for each level, build and measure in a fresh process; the restart on the first level; each
    figure printed with its goal."""
    from recoverydash.ingest.actions import ingest_batch
    from recoverydash.runs.models import Project, Run

    project = Project.objects.create(name="wide")
    ingest_batch(project, [start_event()])
    ingest_updates(project, 1, 20)
    warm_pk = Run.objects.get(project=project, run_id=RUN_ID).pk
    print(f"\n{WIDE:,} ranks ({WIDE // NODE:,} nodes of {NODE}), an update every "
          f"{WIDE_SECONDS:g} s, a heartbeat per rank every {HEARTBEAT_S:g} s; reports per rank "
          f"(update_committed) or per node (update_aggregate of {NODE} ranks), sent on the SDK's "
          "flush policy", flush=True)
    for shape in WIDE_SHAPES:
        got = wide_ingested(project, shape, WIDE_INGEST_RANKS)
        print(f"{shape:>9}: {WIDE_NEW} updates of {got['world']:,} ranks through ingest "
              f"({got['events']:,} events, {got['parts']:,} rank-updates, {got['seconds']:.0f} s):"
              f" {sum(got['bytes'].values()):.1f} bytes per rank-update as ingested ("
              f"{', '.join(f'{k} {v:.1f}' for k, v in got['bytes'].items())}); "
              f"{got['rows_per_update']:.1f} ledger rows per update", flush=True)
    news = []
    for level in WIDE_LEVELS:
        built = wide_build(project, level)
        m = wide_subprocess(built["run_pk"], warm_pk, False)
        news.append(m["new_s"])
        print(f"{WIDE:,} ranks at {level:>7,} absorbed updates (built in {built['build_s']:.0f} "
              f"s): analysis of {WIDE_NEW} new updates ({WIDE_NEW * WIDE:,} rank-updates, "
              f"{WIDE_NEW * WIDE // int(HEARTBEAT_S / WIDE_SECONDS):,} heartbeats) "
              f"{m['new_s']:.3f} s ({m['new_cpu']:.3f} s of the worker's CPU; goal < "
              f"{WIDE_NEW_GOAL_S:g} s: "
              f"{met(m['new_s'] < WIDE_NEW_GOAL_S)}), nothing new {m['none_s'] * 1e3:.0f} ms, "
              f"worker peak RSS {m['rss_mb']:.0f} MB (goal < {WIDE_RSS_GOAL_MB} MB: "
              f"{met(m['rss_mb'] < WIDE_RSS_GOAL_MB)}); load average {os.getloadavg()[0]:.1f}",
              flush=True)
        if level == WIDE_LEVELS[0] and WIDE_RESTART:
            r = wide_restart(project, built)
            rm = wide_subprocess(built["run_pk"], warm_pk, True)
            print(f"restart of the {WIDE:,}-rank attempt on {WIDE - NODE:,} ranks (a node lost; "
                  f"its first 2 updates from every rank and the first windows through ingest, "
                  f"{r['events']:,} events): worker analysis {rm['new_s']:.3f} s "
                  f"({rm['new_cpu']:.3f} s CPU; goal < "
                  f"{WIDE_RESTART_GOAL_S:g} s: {met(rm['new_s'] < WIDE_RESTART_GOAL_S)}), "
                  f"restart page {rm['page_s']:.3f} s ({rm['page_cpu']:.3f} s CPU; goal < "
                  f"{WIDE_RESTART_GOAL_S:g} s: "
                  f"{met(rm['page_s'] < WIDE_RESTART_GOAL_S)}), worker peak RSS "
                  f"{rm['rss_mb']:.0f} MB; restart {rm['restart']}; first windows "
                  f"{rm['windows']}; load average {os.getloadavg()[0]:.1f}", flush=True)
    if len(news) > 1:
        flat = max(news) / min(news)
        print(f"analysis of {WIDE_NEW} new updates across levels "
              f"{', '.join(f'{x:.3f} s' for x in news)}: max/min {flat:.2f}x (goal within "
              f"{WIDE_FLAT_GOAL:g}x: {met(flat <= WIDE_FLAT_GOAL)})")


def main() -> None:
    from django.test.utils import setup_test_environment

    if len(sys.argv) == 6 and sys.argv[1] == "--measure-wide":
        connection.settings_dict["NAME"] = sys.argv[5]
        print(json.dumps(wide_measure(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1")))
        return
    if len(sys.argv) == 5 and sys.argv[1] == "--measure":
        connection.settings_dict["NAME"] = sys.argv[4]
        print(json.dumps(measure(int(sys.argv[2]), int(sys.argv[3]), LEVELS[0])))
        return
    setup_test_environment()
    old_name = connection.settings_dict["NAME"]
    if not KEEP_DB:
        connection.creation.create_test_db(verbosity=0, autoclobber=True)
    rows = []
    try:
        for wanted in LEVELS if "64" in WIDTHS else []:
            if KEEP_DB:
                built, level = kept(wanted)
                build_s = built["build_s"]
            else:
                level = wanted
                t0 = time.perf_counter()
                built = build(level)
                build_s = time.perf_counter() - t0
            name = connection.settings_dict["NAME"]
            connection.close()
            env = dict(os.environ, BENCH_LEVELS=str(level))
            out = subprocess.run([sys.executable, __file__, "--measure", str(built["run_pk"]),
                                  str(built["project_pk"]), name],
                                 env=env, capture_output=True, text=True)
            if out.returncode or os.environ.get("BENCH_PROFILE"):
                print(out.stderr[-20000:], file=sys.stderr)
            out.check_returncode()
            measured = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append((level, built, measured))
            print(f"{level:>9,} absorbed updates (built in {build_s:.0f} s): analysis of 1,000 new "
                  f"updates {measured['new_s']:.3f} s, "
                  f"nothing new {measured['none_s'] * 1e3:.1f} ms"
                  f" (after: {measured['none_after_s'] * 1e3:.1f} ms; "
                  f"{measured['none_queries']} queries), "
                  f"worker peak RSS "
                  f"{measured['rss_mb']:.0f} MB; {built['checkpoints']} checkpoints of "
                  f"{WORLD} shards ({built['statuses']})", flush=True)
        if rows:
            report(rows)
        if str(WIDE) in WIDTHS and KEEP_DB:
            print(f"\nthe {WIDE:,}-rank level runs on a throwaway database only (BENCH_KEEP_DB "
                  "is set): not measured")
        elif str(WIDE) in WIDTHS:
            wide_main()
    finally:
        if not KEEP_DB:
            connection.creation.destroy_test_db(old_name, verbosity=0)


def report(rows) -> None:
    level, built, m = rows[-1]
    per_core = (m["events"] + built["ingest_events"]) / (m["cpu"] + built["ingest_cpu"])
    print()
    print(f"run: {WORLD} ranks, an update every {SECONDS_PER_UPDATE:g} s, a heartbeat per rank "
          f"every {HEARTBEAT_S:g} s ({WORLD / BEAT_EVERY:.2f} per update); levels "
          f"{', '.join(f'{r[0]:,}' for r in rows)} (the first {INGESTED:,} updates and every "
          f"measured 1,000 through ingest, the rest bulk-built in ingest's shape)")
    news = [r[2]["new_s"] for r in rows]
    print(f"analysis of 1,000 new updates: {', '.join(f'{x:.3f} s' for x in news)} "
          f"(target < 1 s, flat within 2x: max/min {max(news) / min(news):.2f}x)")
    nones = ", ".join(f"{r[2]['none_s'] * 1e3:.1f} ms" for r in rows)
    rss = ", ".join(f"{r[2]['rss_mb']:.0f} MB" for r in rows)
    print(f"analysis with nothing new: {nones} (target < 100 ms)")
    print(f"worker peak RSS: {rss} (target < 500 MB)")
    print("bytes per rank-update (as ingested, after compaction): bench/storage.py")
    print(f"web side: {per_core:,.0f} events/s per core (ingest_batch process CPU, PostgreSQL's "
          f"own CPU not included)")
    print()
    per_update = WORLD + WORLD / BEAT_EVERY
    for ranks, period in ((1024, 2.0), (16384, 5.0)):
        events_s = ranks / period + ranks / HEARTBEAT_S
        cores = events_s / per_core
        analysis_s = m["new_s"] * ranks / WORLD
        print(f"{ranks:,} ranks, an update every {period:g} s: events/s = {ranks:,}/{period:g} + "
              f"{ranks:,}/{HEARTBEAT_S:g} = {events_s:,.0f}; web cores = {events_s:,.0f} / "
              f"{per_core:,.0f} = {cores:.2f}; analysis of 1,000 new "
              f"updates ~ {m['new_s']:.3f} s x {ranks:,}/{WORLD} = {analysis_s:.1f} s (rows scale "
              f"with ranks; {1000 * period:,.0f} s of training)")
    print(f"(per update: {per_update:.1f} events at {WORLD} ranks)")


if __name__ == "__main__":
    main()
