"""gunicorn hooks that make the web processes' counters one count (:mod:`.counters`):
``gunicorn recoverydash.wsgi --config python:recoverydash.metrics.gunicorn ...``.

* ``on_starting`` (the master, before any worker is forked): points ``PROMETHEUS_MULTIPROC_DIR``
  at ``$RECOVERYDASH_VAR_DIR/prometheus`` unless it is set, creates it, and removes the counter
  files a previous server left there (their counts belong to processes gone with that server; a
  restart is a counter reset, which Prometheus handles). The workers inherit the variable, so
  each writes its own files and a scrape sums them.
* ``child_exit``: tells prometheus_client a worker is gone (``mark_process_dead``).

Only the counters of :mod:`.counters` live there; nothing else of the service is kept per
process. Command-line options keep precedence over this file, which sets no other option.
"""

from __future__ import annotations

import glob
import os

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's variable (counters.py reads it)


def prepare_multiproc_dir(path: str | None = None) -> str:
    """Create the counter directory (``path``, else the environment's, else
    ``$RECOVERYDASH_VAR_DIR/prometheus`` or ``var/prometheus``), empty it of prometheus_client's
    ``*.db`` files, export it in ``PROMETHEUS_MULTIPROC_DIR``; returns it."""
    if path is None:
        var = os.environ.get("RECOVERYDASH_VAR_DIR") or os.path.join(
            os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
            "var")
        path = os.environ.get(MULTIPROC_ENV) or os.path.join(var, "prometheus")
    os.makedirs(path, exist_ok=True)
    for stale in glob.glob(os.path.join(path, "*.db")):
        os.remove(stale)
    os.environ[MULTIPROC_ENV] = path
    return path


def on_starting(server) -> None:
    """gunicorn master hook: prepare the counter directory before the workers exist."""
    path = prepare_multiproc_dir()
    server.log.info("prometheus counters of the workers in %s", path)


def child_exit(server, worker) -> None:
    """gunicorn master hook: a worker exited; its counter files stay and keep counting."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)
