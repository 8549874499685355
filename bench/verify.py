#!/usr/bin/env python
"""Verification at checkpoint scale (issue 28): every byte of every shard hashed, against the
machine's raw read + hash rate of the same files.

What it does:

1. writes a generation of ``BENCH_VERIFY_SHARDS`` (default 64) shards of ``BENCH_VERIFY_SHARD_MIB``
   (default 512) MiB of random bytes on local disk (``BENCH_VERIFY_DIR``, default a temporary
   folder under /var/tmp), each one file; deleted at the end;
2. **baseline**: ``hashlib.sha256`` of every file, read in 1 MiB pieces, by a pool of
   ``BENCH_VERIFY_PROCS`` processes (default: the machine's cores), one file per task;
3. **pipeline**: a real ``celery worker`` (prefork, ``--concurrency BENCH_VERIFY_PROCS``) on the
   machine's Redis and a throwaway PostgreSQL database; the run's ``attempt_started`` and update
   are ingested, then its ``checkpoint_committed`` (manifest: every shard's size and sha256), and
   the time from that POST to the generation's status ``restorable`` is measured: the
   verification task stats each object and sends one task per object (each over
   ``RECOVERYDASH_VERIFY_INLINE_MAX_BYTES``), the workers hash them, the run is analysed;
4. both, cold (``echo 3 > /proc/sys/vm/drop_caches`` before each; said "warm only" when this
   process may not) and warm (the files read once just before; a generation bigger than the
   page cache is only partly warm, and the script says how much of it fits);
5. prints the time from ``checkpoint_committed`` to ``restorable`` for 1, 8 and all shards (cold),
   and the ratio of the pipeline's throughput to the baseline's over all shards (goal >= 0.8).

Run: ``.venv/bin/python bench/verify.py`` (needs PostgreSQL and Redis on localhost; about 70 GB
of disk I/O and a few minutes at the defaults). Quick: ``BENCH_VERIFY_SHARDS=8
BENCH_VERIFY_SHARD_MIB=128`` (shards of at most ``RECOVERYDASH_VERIFY_INLINE_MAX_BYTES``, 64 MiB,
are hashed in the generation's own task instead).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DB = f"recoverydash_bench_verify_{os.getpid()}"
QUEUE = f"bench-verify-{os.getpid()}"
SHARDS = int(os.environ.get("BENCH_VERIFY_SHARDS", "64"))
SHARD_MIB = int(os.environ.get("BENCH_VERIFY_SHARD_MIB", "512"))
PROCS = int(os.environ.get("BENCH_VERIFY_PROCS", str(os.cpu_count() or 2)))
LEVELS = sorted({n for n in (1, 8, SHARDS) if n <= SHARDS})
CHUNK = 1024 * 1024
GOAL = 0.8
ENV = {
    "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{DB}",
    "CELERY_BROKER_URL": "redis://127.0.0.1:6379/0",
    "CELERY_TASK_DEFAULT_QUEUE": QUEUE,
    "RECOVERYDASH_ANALYSIS_DEBOUNCE_S": "0.2",
    "RECOVERYDASH_RATE_LIMIT_PER_SECOND": "0",
    "LOG_LEVEL": "WARNING",
}
os.environ.update(ENV)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "recoverydash.settings")
sys.path.insert(0, str(REPO))


def hash_file(path: str) -> tuple[str, int]:
    """The baseline: sha256 of a file read in 1 MiB pieces (what the worker reads)."""
    h = hashlib.sha256()
    n = 0
    with open(path, "rb", buffering=0) as f:
        while b := f.read(CHUNK):
            h.update(b)
            n += len(b)
    return h.hexdigest(), n


def write_shards(folder: Path) -> list[tuple[str, int, str]]:
    """``SHARDS`` files of ``SHARD_MIB`` MiB, each different; ``(path, size, sha256)``."""
    block = bytearray(os.urandom(16 * CHUNK))
    out = []
    for i in range(SHARDS):
        path = folder / f"__{i}_0.distcp"
        h = hashlib.sha256()
        with open(path, "wb") as f:
            for j in range(SHARD_MIB // 16 or 1):
                block[:16] = i.to_bytes(8, "big") + j.to_bytes(8, "big")
                piece = bytes(block) if SHARD_MIB >= 16 else bytes(block[:SHARD_MIB * CHUNK])
                f.write(piece)
                h.update(piece)
        out.append((str(path), path.stat().st_size, h.hexdigest()))
    return out


def drop_caches() -> bool:
    """Empty the page cache (root only); False when this process may not."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def warm(paths: list[str]) -> None:
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.read(16 * CHUNK):
                pass


def baseline_s(paths: list[str]) -> float:
    started = time.perf_counter()
    with Pool(PROCS) as pool:
        pool.map(hash_file, paths, chunksize=1)
    return time.perf_counter() - started


def recreate_database() -> None:
    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{DB}"')


def drop_database() -> None:
    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')


def events_for(run_id: str, shards: list[tuple[str, int, str]]) -> tuple[list, list]:
    """(the attempt and its update, the checkpoint_committed) of a run whose generation ``g1``
    holds one ``model`` object per shard."""
    t = "2026-11-01T00:00:%02dZ"
    names = [f"rank{i}" for i in range(len(shards))]
    objects = [{"uri": f"file://{path}", "shard": name, "component": "model", "size": size,
                "sha256": sha} for name, (path, size, sha) in zip(names, shards, strict=True)]
    first = [
        {"type": "attempt_started", "world_size": 1, "dataset_version": "v1",
         "global_batch_size": 4, "time": t % 0, "contract": {"required_components": ["model"]}},
        {"type": "update_committed", "update": 1, "time": t % 1, "rank": 0,
         "spans": [{"stratum": "main", "epoch": 0, "ranges": [[0, 4]]}]},
    ]
    commit = [{"type": "checkpoint_committed", "time": t % 3, "manifest": {
        "schema_revision": 1, "generation_id": "g1", "update": 1, "world_size": 1,
        "required_shards": names, "components": ["model"], "objects": objects,
        "dataset_version": "v1", "committed_at": t % 3,
        "data_progress": {"cursor": [{"stratum": "main", "epoch": 0, "position": 4}]}}}]
    for i, e in enumerate(first + commit):
        e.update(event_id=f"{run_id}-{i}", run_id=run_id, attempt=0)
    return first, commit


def committed_to_restorable_s(client, token: str, run_id: str, shards) -> float:
    """Seconds from the POST of ``checkpoint_committed`` to the generation ``restorable``."""
    from recoverydash.runs.models import Generation

    first, commit = events_for(run_id, shards)

    def post(events):
        r = client.post("/api/v1/events", data=json.dumps({"events": events}),
                        content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {token}")
        assert r.status_code == 202, r.content

    post(first)
    started = time.perf_counter()
    post(commit)
    deadline = time.monotonic() + 3600
    while time.monotonic() < deadline:
        status = Generation.objects.filter(run__run_id=run_id, generation_id="g1") \
            .values_list("status", flat=True).first()
        if status == "restorable":
            return time.perf_counter() - started
        if status == "rejected":
            raise RuntimeError(f"{run_id}: g1 rejected: " + json.dumps(
                Generation.objects.get(run__run_id=run_id, generation_id="g1").reasons))
        time.sleep(0.02)
    raise RuntimeError(f"{run_id}: not restorable within an hour")


def page_cache_bytes() -> int:
    """Memory the kernel may use for the page cache: MemTotal (bytes)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> int:
    total = SHARDS * SHARD_MIB * CHUNK
    usage = shutil.disk_usage(os.environ.get("BENCH_VERIFY_DIR", "/var/tmp"))
    if usage.free < total * 1.2 + 2 * 1024**3:
        print(f"not enough disk: {total / 1e9:.1f} GB needed, {usage.free / 1e9:.1f} GB free",
              file=sys.stderr)
        return 2
    folder = Path(tempfile.mkdtemp(prefix="recoverydash-bench-verify-",
                                   dir=os.environ.get("BENCH_VERIFY_DIR", "/var/tmp")))
    worker = None
    try:
        t0 = time.perf_counter()
        shards = write_shards(folder)
        paths = [p for p, _, _ in shards]
        print(f"{SHARDS} shards of {SHARD_MIB} MiB ({total / 1e9:.1f} GB) written in "
              f"{time.perf_counter() - t0:.0f} s under {folder}; {PROCS} processes each side; "
              f"page cache at most {page_cache_bytes() / 1e9:.0f} GB (RAM)", flush=True)
        recreate_database()
        import django

        django.setup()
        from django.core.management import call_command
        from django.test import Client

        from recoverydash.runs.models import ApiToken, Project
        from recoverydash.storage.models import StorageLocation

        call_command("migrate", verbosity=0)
        project = Project.objects.create(name="bench")
        _, token = ApiToken.issue(project, ["ingest", "read"])
        StorageLocation.objects.create(project=project, url=folder.resolve().as_uri())
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "workers.celery", "worker", "-Q", QUEUE,
             "--concurrency", str(PROCS), "--loglevel", "WARNING", "--without-gossip",
             "--without-mingle", "--hostname", f"bench-verify-{os.getpid()}@%h"],
            cwd=REPO, env=dict(os.environ), start_new_session=True,
            stdout=subprocess.DEVNULL)
        time.sleep(4.0)  # the worker connects
        client = Client()
        committed_to_restorable_s(client, token, "warm-up", shards[:1])  # imports, connections
        cold = drop_caches()
        print("cold runs: page cache dropped before each" if cold else
              "cold runs: NOT possible (drop_caches needs root): warm only", flush=True)
        results: dict = {}
        for mode in (["cold"] if cold else []) + ["warm"]:
            for n in LEVELS:
                if mode == "cold":
                    drop_caches()
                else:
                    warm(paths[:n])
                took = committed_to_restorable_s(client, token, f"{mode}-{n}", shards[:n])
                results[(mode, "pipeline", n)] = took
                print(f"  {mode:4s} {n:3d} shards: checkpoint_committed -> restorable "
                      f"{took:7.2f} s ({n * SHARD_MIB * CHUNK / took / 1e9:.2f} GB/s)",
                      flush=True)
            if mode == "cold":
                drop_caches()
            else:
                warm(paths)
            base = baseline_s(paths)
            results[(mode, "baseline", SHARDS)] = base
            print(f"  {mode:4s} baseline: hashlib over {SHARDS} files, {PROCS} processes "
                  f"{base:7.2f} s ({total / base / 1e9:.2f} GB/s)", flush=True)
        print()
        for mode in (["cold"] if cold else []) + ["warm"]:
            pipe = results[(mode, "pipeline", SHARDS)]
            base = results[(mode, "baseline", SHARDS)]
            ratio = base / pipe
            times = ", ".join(f"{n}: {results[(mode, 'pipeline', n)]:.2f} s" for n in LEVELS)
            print(f"{mode}: committed -> restorable {times}; throughput {SHARDS} shards "
                  f"{total / pipe / 1e9:.2f} GB/s against raw hashlib {total / base / 1e9:.2f} "
                  f"GB/s: ratio {ratio:.2f} (goal >= {GOAL}: "
                  f"{'met' if ratio >= GOAL else 'NOT met'})")
        if total > page_cache_bytes() * 0.8:
            print("(the generation is bigger than the page cache: 'warm' is only partly warm)")
        return 0
    finally:
        if worker is not None:
            os.killpg(worker.pid, signal.SIGTERM)
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(worker.pid, signal.SIGKILL)
        shutil.rmtree(folder, ignore_errors=True)
        try:
            from django.db import connections

            connections.close_all()
            drop_database()
        except Exception as e:  # noqa: BLE001 - the files are gone; say why the db is not
            print(f"could not drop database {DB}: {e}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
