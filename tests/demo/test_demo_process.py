"""The demo owns its folder and its command line only prints help: found by an operator, a second
``make demo`` while one served wiped the first one's database under it, and ``python -m
recoverydash.demo --help`` started a demo."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
