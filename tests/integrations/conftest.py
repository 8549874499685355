"""Fixtures of the framework integration tests: the real server (pytest-django's live_server),
launching an example script as a trainer would be launched, waiting for the analysis, and the
truth of what the model received, read from the examples' ``--sample-log``.

Needs Django and a database: run without ``-p no:django``, e.g.
``DATABASE_URL=postgres://postgres@127.0.0.1:5432/test .venv/bin/python -m pytest
tests/integrations``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Server:
    url: str
    token: str

    def get(self, path: str):
        req = urllib.request.Request(f"{self.url}{path}",
                                     headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    def recovery(self, run_id: str, timeout: float = 60.0) -> dict:
        """The run's analysis once nothing ingested is pending."""
        deadline = time.monotonic() + timeout
        while True:
            report = self.get(f"/api/v1/runs/{run_id}/recovery")
            if not report["pending_analysis"] or time.monotonic() > deadline:
                return report
            time.sleep(0.5)


@pytest.fixture
def server(live_server, settings, full_token, project, tmp_path):
    """The live server with its work done in the request (eager Celery, no rate limit), and the
    test's folder declared as the project's storage location (the checkpoints live there)."""
    from recoverydash.storage.models import StorageLocation

    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.RECOVERYDASH_RATE_LIMIT_PER_SECOND = 0
    settings.RECOVERYDASH_REDIS_URL = ""
    StorageLocation.objects.create(project=project, url=f"file://{tmp_path}")
    return Server(live_server.url, full_token)


def trainer_env(tmp_path) -> dict:
    """The environment of a launched trainer: no RECOVERYDASH_*/torchrun/Slurm leftovers of the
    test process, the repository importable, one thread, a spool of its own, no hub access."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RECOVERYDASH_", "TORCHELASTIC_", "SLURM_"))}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false",
               RECOVERYDASH_SPOOL_DIR=str(tmp_path / "spool"))
    return env


def launch(script: str, args: list[str], tmp_path, *, nproc: int | None = None,
           timeout: float = 240, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``examples/<script>`` with ``args`` in ``tmp_path`` (under torchrun with ``nproc``
    ranks when given; ``env`` added to :func:`trainer_env`)."""
    path = str(REPO / "examples" / script)
    cmd = [sys.executable, path, *args] if nproc is None else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
         str(nproc), path, *args]
    return subprocess.run(cmd, capture_output=True, text=True,
                          env={**trainer_env(tmp_path), **(env or {})},
                          cwd=tmp_path, timeout=timeout, check=False)


def killed(proc: subprocess.CompletedProcess) -> bool:
    """Whether the process (or, under torchrun, a rank) died of SIGKILL."""
    return proc.returncode == -9 or "Signal 9 (SIGKILL)" in proc.stderr


@dataclass
class Truth:
    """What the model received, from the sample log (one line per microbatch: attempt, rank,
    epoch, update, indices), restricted to the live lineage: the first attempt's microbatches of
    updates up to the resumed update, and every microbatch of the resumed attempt."""

    replayed: int     # samples the resumed attempt fed again in an epoch the lineage had fed them
    omitted: int      # samples of epochs the lineage left that it never fed
    duplicates: int   # lineage repeats within an epoch
    consumed: int     # lineage samples, with repeats
    epochs: dict      # epoch -> Counter of sample indices fed by the lineage


def truth(log_path, resumed_update: int, samples: int, global_batch: int) -> Truth:
    lines = [json.loads(x) for x in Path(log_path).read_text().splitlines() if x.strip()]
    before = [x for x in lines if x["attempt"] == 0 and x["update"] <= resumed_update]
    after = [x for x in lines if x["attempt"] == 1]
    fed_before = {(x["epoch"], i) for x in before for i in x["indices"]}
    replayed = sum(1 for x in after for i in x["indices"] if (x["epoch"], i) in fed_before)
    epochs: dict = {}
    for x in before + after:
        epochs.setdefault(x["epoch"], Counter()).update(x["indices"])
    last = max(epochs)
    omitted = 0
    for e, seen in epochs.items():
        missing = samples - len(seen)
        if e < last and missing >= global_batch:  # the tail rule: a drop_last remainder is not
            omitted += missing
    duplicates = sum(n - 1 for seen in epochs.values() for n in seen.values())
    consumed = sum(sum(seen.values()) for seen in epochs.values())
    return Truth(replayed, omitted, duplicates, consumed, epochs)
