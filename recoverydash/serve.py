"""``make serve``: migrate, then run the web server, a Celery worker and Celery beat in the
foreground as one unit. Ctrl-C (or SIGTERM) stops all three. One that dies is started again
(after 1 s, doubling to 30 s while it keeps dying) without touching the others, with a line saying
so; one that dies ``MAX_RESTARTS`` times within ``RESTART_WINDOW_S`` seconds is a fault that
restarting does not fix: then everything stops and the exit status says which.

Environment: ``PORT`` (default 8000), ``HOST`` (default 127.0.0.1: the embedded server is not
exposed to the network unless asked; ``HOST=0.0.0.0`` to serve other machines),
``WEB_CONCURRENCY`` (gunicorn workers, default 2),
``CELERY_CONCURRENCY`` (default 2), and every setting of ``recoverydash.settings``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time


def commands(port: int, host: str = "127.0.0.1") -> dict[str, list[str]]:
    """The three processes, by name."""
    from django.conf import settings

    py = sys.executable
    var = str(settings.VAR_DIR)
    return {
        # the config adds only the hooks that sum the workers' /metrics counters
        "web": [py, "-m", "gunicorn", "recoverydash.wsgi", "--bind", f"{host}:{port}",
                "--config", "python:recoverydash.metrics.gunicorn",
                "--workers", os.environ.get("WEB_CONCURRENCY", "2"), "--threads", "4",
                "--access-logfile", "-", "--timeout", "60"],
        "worker": [py, "-m", "celery", "-A", "workers.celery", "worker", "--loglevel", "INFO",
                   "--concurrency", os.environ.get("CELERY_CONCURRENCY", "2"),
                   "--hostname", f"worker@{os.uname().nodename}"],
        "beat": [py, "-m", "celery", "-A", "workers.celery", "beat", "--loglevel", "INFO",
                 "--schedule", os.path.join(var, "celerybeat-schedule")],
    }


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "recoverydash.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    port = int(os.environ.get("PORT", "8000"))
    host = os.environ.get("HOST", "127.0.0.1")
    call_command("migrate", interactive=False, verbosity=0)
    from recoverydash.dashboard.staticfiles import collect_if_changed

    if collect_if_changed():  # hashed, compressed static files (once per change of them)
        print(f"recoverydash: static files collected into {settings.STATIC_ROOT}", flush=True)
    cmds = commands(port, host)
    procs = {name: subprocess.Popen(cmd) for name, cmd in cmds.items()}
    print(f"recoverydash: web on http://{host}:{port}/ with a worker and beat "
          f"(Ctrl-C stops all)", flush=True)
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
