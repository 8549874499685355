"""``make serve`` / ``python -m recoverydash.serve [ROLE ...]``: migrate, then run the roles asked
for (default all three) in the foreground as one unit:

- ``web``: gunicorn on ``HOST:PORT``;
- ``worker``: two Celery workers, one for analysis, verification and the periodic jobs (queue
  ``celery``, ``CELERY_CONCURRENCY`` processes) and one for webhook deliveries (queue
  ``webhooks``, ``CELERY_WEBHOOK_CONCURRENCY``), so failing receivers never hold analysis up;
- ``beat``: Celery beat with the beat lock (``workers.beat.LockedScheduler``): on several hosts
  each may run one, exactly one sends the periodic tasks and the others wait, saying so.

Ctrl-C (or SIGTERM) stops them all. One that dies is started again (after 1 s, doubling to 30 s
while it keeps dying) without touching the others, with a line saying so; one that dies
``MAX_RESTARTS`` times within ``RESTART_WINDOW_S`` seconds is a fault that restarting does not
fix: then everything stops and the exit status says which. Migrations run under the migration
lock (``recoverydash.locks``), so hosts starting together migrate one after the other;
``--no-migrate`` skips them (a separate migrate job does it).

Environment: ``PORT`` (default 8000), ``HOST`` (default 127.0.0.1: the embedded server is not
exposed to the network unless asked; ``HOST=0.0.0.0`` to serve other machines),
``WEB_CONCURRENCY`` (gunicorn workers, default 2), ``CELERY_CONCURRENCY`` (default 2),
``CELERY_WEBHOOK_CONCURRENCY`` (default 2), ``RECOVERYDASH_ROLES`` (the roles when none are
given, e.g. ``web,worker``), and every setting of ``recoverydash.settings``
(docs/operating.md#roles).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

ROLES = ("web", "worker", "beat")


def commands(port: int, host: str = "127.0.0.1",
             roles: tuple[str, ...] = ROLES) -> dict[str, list[str]]:
    """The processes of ``roles``, by name (``web``; ``worker`` and ``webhooks`` for the worker
    role; ``beat``)."""
    from django.conf import settings

    from recoverydash.runs.queue import webhooks_queue

    py = sys.executable
    var = str(settings.VAR_DIR)
    node = os.uname().nodename
    celery = [py, "-m", "celery", "-A", "workers.celery"]
    every = {
        # the config adds only the hooks that sum the workers' /metrics counters
        "web": [py, "-m", "gunicorn", "recoverydash.wsgi", "--bind", f"{host}:{port}",
                "--config", "python:recoverydash.metrics.gunicorn",
                "--workers", os.environ.get("WEB_CONCURRENCY", "2"), "--threads", "4",
                "--access-logfile", "-", "--timeout", "60"],
        "worker": [*celery, "worker", "--loglevel", "INFO",
                   "-Q", settings.CELERY_TASK_DEFAULT_QUEUE,
                   "--concurrency", os.environ.get("CELERY_CONCURRENCY", "2"),
                   "--hostname", f"worker@{node}"],
        "webhooks": [*celery, "worker", "--loglevel", "INFO",
                     "-Q", webhooks_queue(settings.CELERY_TASK_DEFAULT_QUEUE),
                     "--concurrency", os.environ.get("CELERY_WEBHOOK_CONCURRENCY", "2"),
                     "--hostname", f"webhooks@{node}"],
        "beat": [*celery, "beat", "--loglevel", "INFO",
                 "--schedule", os.path.join(var, "celerybeat-schedule")],
    }
    wanted = {"web": ("web",), "worker": ("worker", "webhooks"), "beat": ("beat",)}
    return {name: every[name] for role in ROLES if role in roles for name in wanted[role]}


def parse_roles(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line: roles (``web``, ``worker``, ``beat``; several, or one argument
    ``web,worker``; none: ``RECOVERYDASH_ROLES`` or all three) and ``--no-migrate``. Exits with
    status 2 and a message naming the roles for an unknown one."""
    parser = argparse.ArgumentParser(
        prog="python -m recoverydash.serve",
        description="Run recoverydash's web server, Celery workers and beat in the foreground.",
        epilog="roles: web (gunicorn), worker (Celery workers of the queues celery and "
               "webhooks), beat (Celery beat; one sends, others wait on the beat lock)")
    parser.add_argument("roles", nargs="*", metavar="ROLE",
                        help="web, worker, beat (default: $RECOVERYDASH_ROLES or all three)")
    parser.add_argument("--no-migrate", action="store_true",
                        help="do not run the database migrations first")
    args = parser.parse_args(argv)
    given = args.roles or [os.environ.get("RECOVERYDASH_ROLES") or ",".join(ROLES)]
    roles = [r.strip() for arg in given for r in arg.split(",") if r.strip()]
    unknown = [r for r in roles if r not in ROLES]
    if unknown or not roles:
        parser.error(f"expected roles among {', '.join(ROLES)}, got {', '.join(unknown) or 'none'}")
    args.roles = tuple(r for r in ROLES if r in roles)
    return args


def migrate() -> None:
    """Apply the migrations under the migration lock (another host migrating: wait for it)."""
    from django.core.management import call_command

    from recoverydash.locks import migrate_lock

    lock = migrate_lock()
    lock.wait(poll_s=0.5, say_every_s=10.0)
    try:
        call_command("migrate", interactive=False, verbosity=0)
    finally:
        lock.release()


def main(argv: list[str] | None = None) -> int:
    args = parse_roles(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "recoverydash.settings")
    import django

    django.setup()
    port = int(os.environ.get("PORT", "8000"))
    host = os.environ.get("HOST", "127.0.0.1")
    if not args.no_migrate:
        migrate()
    cmds = commands(port, host, args.roles)
    procs = {name: subprocess.Popen(cmd) for name, cmd in cmds.items()}
    where = f"web on http://{host}:{port}/" if "web" in args.roles else "no web"
    print(f"recoverydash: {where}; running {', '.join(cmds)} (Ctrl-C stops all)", flush=True)
    stopping = False

    def stop(*_):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    status = supervise(procs, cmds, lambda: stopping)
    for proc in procs.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 15
    for proc in procs.values():
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            proc.kill()
    return status


MAX_RESTARTS = 5
RESTART_WINDOW_S = 120.0


def supervise(procs: dict, cmds: dict, stopping, *, poll_s: float = 0.5,
              max_restarts: int = MAX_RESTARTS, window_s: float = RESTART_WINDOW_S) -> int:
    """Keep the processes of ``procs`` (name -> Popen, started from ``cmds``) running until
    ``stopping()`` is true: one that exited is started again after a delay of 1 s doubling to
    30 s while it keeps exiting; after ``max_restarts`` exits within ``window_s`` seconds the
    supervision gives up. Returns 0 when stopped, else the exit status of the process given up
    on (1 when it had none)."""
    exits: dict[str, list[float]] = {name: [] for name in procs}
    due: dict[str, float] = {}
    while not stopping():
        now = time.monotonic()
        for name, proc in list(procs.items()):
            if name in due:
                if now >= due[name]:
                    del due[name]
                    procs[name] = subprocess.Popen(cmds[name])
                    print(f"recoverydash: {name} started again", flush=True)
                continue
            if proc.poll() is None:
                continue
            recent = [t for t in exits[name] if now - t < window_s] + [now]
            exits[name] = recent
            if len(recent) > max_restarts:
                print(f"recoverydash: {name} exited {len(recent)} times within "
                      f"{window_s:g} s (last status {proc.returncode}); stopping",
                      file=sys.stderr, flush=True)
                return proc.returncode or 1
            delay = min(30.0, 2.0 ** (len(recent) - 1))
            print(f"recoverydash: {name} exited with status {proc.returncode}; starting it again "
                  f"in {delay:g} s", file=sys.stderr, flush=True)
            due[name] = now + delay
        time.sleep(poll_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
