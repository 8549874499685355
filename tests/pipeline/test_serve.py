"""``make serve`` keeps its processes running: one that dies is started again without touching
the others; one that keeps dying stops the whole unit with its status."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from recoverydash.serve import supervise

ALIVE = [sys.executable, "-c", "import time; time.sleep(120)"]


def dies_once(marker) -> list[str]:
    """A process that exits with status 3 the first time and stays up the next."""
    code = (f"import os, sys, time\nif not os.path.exists({str(marker)!r}):\n"
            f"    open({str(marker)!r}, 'w').close(); sys.exit(3)\ntime.sleep(120)")
    return [sys.executable, "-c", code]


def test_a_dead_worker_is_started_again_and_the_web_server_keeps_running(tmp_path, capsys):
    cmds = {"web": ALIVE, "worker": dies_once(tmp_path / "died")}
    procs = {name: subprocess.Popen(cmd) for name, cmd in cmds.items()}
    web, first_worker = procs["web"], procs["worker"]
    stop = threading.Event()
    result = {}
    supervisor = threading.Thread(
        target=lambda: result.setdefault("status", supervise(procs, cmds, stop.is_set,
                                                             poll_s=0.05)))
    supervisor.start()
    try:
        deadline = time.monotonic() + 30
        # the supervisor waits 1 s before the restart: wait for the second process itself
        while time.monotonic() < deadline and procs["worker"] is first_worker:
            time.sleep(0.05)
        time.sleep(0.3)
        assert first_worker.poll() == 3 and (tmp_path / "died").exists()
        assert procs["worker"] is not first_worker
        assert procs["worker"].poll() is None  # the second one is up
        assert procs["web"] is web and web.poll() is None  # never touched
    finally:
        stop.set()
        supervisor.join(10)
        for proc in procs.values():
            proc.kill()
            proc.wait()
    assert result["status"] == 0
    err = capsys.readouterr()
    assert "recoverydash: worker exited with status 3; starting it again in 1 s" in err.err
    assert "recoverydash: worker started again" in err.out


def test_a_process_that_keeps_dying_stops_the_unit_with_its_status(capsys):
    cmds = {"web": ALIVE, "beat": [sys.executable, "-c", "import sys; sys.exit(7)"]}
    procs = {name: subprocess.Popen(cmd) for name, cmd in cmds.items()}
    try:
        status = supervise(procs, cmds, lambda: False, poll_s=0.05, max_restarts=2,
                           window_s=60)
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
    assert status == 7
    assert "recoverydash: beat exited 3 times within 60 s (last status 7); stopping" in \
        capsys.readouterr().err


def test_roles_choose_the_processes_and_the_worker_role_keeps_webhooks_on_their_own_queue(
        settings, monkeypatch):
    from recoverydash.serve import commands, parse_roles

    monkeypatch.delenv("RECOVERYDASH_ROLES", raising=False)
    assert parse_roles([]).roles == ("web", "worker", "beat")
    assert parse_roles(["beat", "web"]).roles == ("web", "beat")
    assert parse_roles(["web,worker"]).roles == ("web", "worker")
    monkeypatch.setenv("RECOVERYDASH_ROLES", "worker")
    assert parse_roles([]).roles == ("worker",)
    assert parse_roles(["--no-migrate", "beat"]).no_migrate is True
    cmds = commands(8123, "0.0.0.0", ("worker",))
    assert list(cmds) == ["worker", "webhooks"]
    assert cmds["worker"][cmds["worker"].index("-Q") + 1] == "celery"
    assert cmds["webhooks"][cmds["webhooks"].index("-Q") + 1] == "webhooks"
    assert list(commands(8123, "0.0.0.0", ("web", "beat"))) == ["web", "beat"]


def test_an_unknown_role_is_refused_naming_the_roles(capsys):
    from recoverydash.serve import parse_roles

    with pytest.raises(SystemExit) as stopped:
        parse_roles(["web", "scheduler"])
    assert stopped.value.code == 2
    assert "expected roles among web, worker, beat, got scheduler" in capsys.readouterr().err


def test_webhook_deliveries_are_routed_to_their_own_queue():
    from celery import current_app

    from recoverydash.runs import queue

    # An earlier test of this process may have pointed the app at a queue of its own
    # (tests/pipeline's workers_on): the webhooks queue is then named after that one.
    default = current_app.conf.task_default_queue
    router = current_app.amqp.router
    for name in (queue.DELIVER_WEBHOOK, queue.SEND_TEST_WEBHOOK, "workers.tasks.deliver_due"):
        assert router.route({}, name)["queue"].name == queue.webhooks_queue(default), name
    for name in (queue.ANALYZE_RUN, queue.VERIFY_GENERATION, queue.EVALUATE_ALERTS_CHUNK,
                 "workers.tasks.sweep_runs"):
        assert router.route({}, name)["queue"].name == default, name
    assert queue.webhooks_queue("celery") == "webhooks"
