"""The demo owns its folder and its command line only prints help: found by an operator, a second
``make demo`` while one served wiped the first one's database under it, and ``python -m
recoverydash.demo --help`` started a demo."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _demo(*args, folder: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "RECOVERYDASH_DEMO_DIR": str(folder), "DEMO_EXIT": "1"}
    return subprocess.run([sys.executable, "-m", "recoverydash.demo", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_help_prints_the_environment_and_starts_nothing(tmp_path):
    done = _demo("--help", folder=tmp_path / "demo")
    assert done.returncode == 0
    assert done.stdout.startswith("usage: python -m recoverydash.demo")
    assert "RECOVERYDASH_DEMO_DIR" in done.stdout and "DEMO_ONLY" in done.stdout
    assert not (tmp_path / "demo").exists() and list(tmp_path.iterdir()) == []


def test_a_second_demo_refuses_the_folder_the_first_one_holds(tmp_path):
    from recoverydash.demo.__main__ import own_folder

    folder = tmp_path / "demo"
    folder.mkdir()
    (folder / "keep").write_text("the first demo's database")
    held = own_folder(folder)
    assert held is not None
    try:
        done = _demo(folder=folder)
        assert done.returncode == 2
        assert f"the demo folder {folder} is in use by demo pid {os.getpid()}" in done.stdout
        assert (folder / "keep").read_text() == "the first demo's database"  # untouched
    finally:
        held.close()
    assert own_folder(folder) is not None  # free once the holder is gone


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _processes_naming(text: str) -> list[int]:
    """Pids of this machine's processes whose environment holds ``text`` (every process a demo
    starts inherits its RECOVERYDASH_DEMO_DIR or RECOVERYDASH_VAR_DIR)."""
    needle = text.encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if needle in (entry / "environ").read_bytes():
                    pids.append(int(entry.name))
            except OSError:  # gone meanwhile, or not ours to read
                pass
    return pids


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc")
def test_sigterm_stops_the_server_and_the_ranks_it_started(tmp_path):
    folder = tmp_path / "demo"
    env = {**os.environ, "RECOVERYDASH_DEMO_DIR": str(folder), "DEMO_EXIT": "1",
           "DEMO_ONLY": "h", "PORT": str(free_port())}
    demo = subprocess.Popen([sys.executable, "-m", "recoverydash.demo"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(demo.stdout), daemon=True).start()
    try:
        deadline = time.monotonic() + 240
        while not any("server up" in line for line in lines) and time.monotonic() < deadline:
            assert demo.poll() is None, lines
            time.sleep(0.2)
        server = len(_processes_naming(str(folder)))  # the demo and its server's processes
        while not any("fault (h)" in line for line in lines) and time.monotonic() < deadline:
            assert demo.poll() is None, lines
            time.sleep(0.2)
        while len(_processes_naming(str(folder))) <= server and time.monotonic() < deadline:
            assert demo.poll() is None, lines  # the ranks are forked
            time.sleep(0.2)
        started = _processes_naming(str(folder))
        assert len(started) > server >= 5, (server, started)
        demo.send_signal(signal.SIGTERM)
        demo.wait(60)
        deadline = time.monotonic() + 30
        while _processes_naming(str(folder)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _processes_naming(str(folder)) == []
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
        for pid in _processes_naming(str(folder)):
            os.kill(pid, signal.SIGKILL)
