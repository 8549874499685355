"""``make serve``: migrate, then run the web server, a Celery worker and Celery beat in the
foreground as one unit. Ctrl-C (or SIGTERM) stops all three; if one of them dies, the others are
stopped too and the exit status says so, rather than leaving a half-running service.

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
    from django.core.management import call_command

    port = int(os.environ.get("PORT", "8000"))
    host = os.environ.get("HOST", "127.0.0.1")
    call_command("migrate", interactive=False, verbosity=0)
    procs = {name: subprocess.Popen(cmd) for name, cmd in commands(port, host).items()}
    print(f"recoverydash: web on http://{host}:{port}/ with a worker and beat "
          f"(Ctrl-C stops all)", flush=True)
    stopping = False

    def stop(*_):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    status = 0
    while not stopping:
        for name, proc in procs.items():
            if proc.poll() is not None:
                print(f"recoverydash: {name} exited with status {proc.returncode}; stopping",
                      file=sys.stderr, flush=True)
                status, stopping = proc.returncode or 1, True
                break
        time.sleep(0.5)
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


if __name__ == "__main__":
    sys.exit(main())
