"""The trainer side installs light: ``pip install recoverydash`` (no extra) into a fresh venv
brings only what ``recoverydash.sdk`` imports, and every module of the SDK imports there with the
server's libraries absent (and blocked by a meta-path hook, should the environment leak one in).

The venv is made without system site-packages and filled from PyPI (the machine's local wheel
folder, ``/opt/wheels``, is a shortcut when it exists), from a copy of the sources, so the
build leaves nothing in the checkout.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from .conftest import REPO

pytestmark = pytest.mark.slow

# The base distribution: recoverydash and the core's roaring bitmaps. pip/setuptools are the
# venv's own, not the install's.
EXPECTED = {"recoverydash", "pyroaring"}
VENV_TOOLS = {"pip", "setuptools", "wheel"}
# The server's libraries. Not installed in the venv; blocked too, in case the environment leaks
# one in. torch and boto3 are not installed either: the SDK imports them only when used.
BLOCKED = ("django", "ninja", "celery", "kombu", "plotly", "psycopg", "redis", "pydantic",
           "gunicorn", "whitenoise", "standardwebhooks", "httpx", "dj_database_url", "markdown",
           "axes")
# What a trainer imports: the SDK, its framework integrations, and the pure layers it runs
# offline (the core; checkpoints: objects, restore selection, the format readers of its command
# line).
TRAINER_SIDE = ("recoverydash.sdk", "recoverydash.integrations", "recoverydash.recovery",
                "recoverydash.checkpoints")
# A framework's integration subclasses the framework's own classes (an HF TrainerCallback, a
# Lightning Callback), so it imports the framework when it is imported: in this venv, without
# any framework, such a module may only fail for that reason, and is listed.
FRAMEWORKS = ("torch", "numpy", "transformers", "lightning", "pytorch_lightning", "accelerate",
              "torchdata")

CHECK = r"""
import importlib, importlib.abc, importlib.metadata, json, os, pkgutil, sys

BLOCKED = set(sys.argv[1].split(","))
PACKAGES = sys.argv[2].split(",")
FRAMEWORKS = set(sys.argv[3].split(","))


class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked: the trainer side must not import it")
        return None


sys.meta_path.insert(0, Block())
import recoverydash
from recoverydash.checkpoints import objects

modules, needs = [], {}
for name in PACKAGES:
    pkg = importlib.import_module(name)
    modules.append(name)
    for info in pkgutil.walk_packages(pkg.__path__, name + "."):
        try:
            importlib.import_module(info.name)
        except ModuleNotFoundError as e:
            if not (name == "recoverydash.integrations" and e.name.split(".")[0] in FRAMEWORKS):
                raise
            needs[info.name] = e.name
            continue
        modules.append(info.name)
try:  # an s3:// location without the s3 extra: a clear error, not an ImportError
    objects.make_s3_client()
    s3 = "boto3 present"
except objects.PermanentStorageError as e:
    s3 = str(e)
print(json.dumps({
    "modules": sorted(modules),
    "needs": needs,
    "file": recoverydash.__file__,
    "typed": os.path.isfile(os.path.join(os.path.dirname(recoverydash.__file__), "py.typed")),
    "server_loaded": sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED),
    "installed": sorted(d.metadata["Name"].lower() for d in importlib.metadata.distributions()),
    "s3": s3,
}))
"""


def copy_sources(dest: Path) -> Path:
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dest / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for pkg in ("recoverydash", "workers"):
        shutil.copytree(REPO / pkg, dest / pkg, ignore=ignore)
    return dest


def test_it_installs_the_sdk_alone_and_imports_every_sdk_module_without_the_server(tmp_path):
    (tmp_path / "src").mkdir()
    source = copy_sources(tmp_path / "src")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False, system_site_packages=False, clear=True)
    python = env_dir / "bin" / "python"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "VIRTUAL_ENV", "DJANGO"))}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    packages = [p for p in TRAINER_SIDE if (REPO / p.replace(".", "/")).is_dir()]
    links = ["--find-links", "/opt/wheels"] if Path("/opt/wheels").is_dir() else []
    # this environment's pip installs into the fresh venv (no pip of its own needed there)
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
         "--no-cache-dir", *links, str(source)],
        env=env, capture_output=True, text=True, timeout=900)
    assert install.returncode == 0, install.stdout + install.stderr

    args = [",".join(BLOCKED), ",".join(packages), ",".join(FRAMEWORKS)]
    check = subprocess.run([str(python), "-I", "-c", CHECK, *args], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr
    found = json.loads(check.stdout.strip().splitlines()[-1])

    installed = set(found["installed"]) - VENV_TOOLS
    print(f"\nSDK install: {len(installed)} packages ({', '.join(sorted(installed))}); "
          f"{len(found['modules'])} modules of {', '.join(packages)} imported with "
          f"{', '.join(BLOCKED)} blocked; without their framework: "
          f"{', '.join(f'{m} ({lib})' for m, lib in sorted(found['needs'].items())) or 'none'}")
    assert installed == EXPECTED
    assert found["file"].startswith(str(env_dir))  # the installed copy, not the checkout
    assert found["typed"] is True  # py.typed ships: type checkers read the SDK's annotations
    assert found["server_loaded"] == []
    ours = {p.stem for p in (REPO / "recoverydash" / "sdk").glob("*.py")} - {"__init__"}
    assert {m.rpartition(".")[2] for m in found["modules"]
            if m.startswith("recoverydash.sdk.")} == ours
    assert "pip install 'recoverydash[s3]'" in found["s3"]

    # the offline check, from the console script the base install puts in the venv: a folder
    # without manifests has no restorable generation (exit status 1), and nothing is missing
    (tmp_path / "ckpt").mkdir()
    cli = subprocess.run([str(env_dir / "bin" / "recoverydash-check"), "check", "--json",
                          str(tmp_path / "ckpt")], env=env, capture_output=True, text=True,
                         timeout=120)
    assert cli.returncode == 1, cli.stdout + cli.stderr
    assert json.loads(cli.stdout)["restorable"] is None and cli.stderr == ""
