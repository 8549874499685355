"""Every code block of the README and the guides is executed, or checked where running it is
impossible in a test, and nothing is left unchecked silently.

How each kind of block is handled (``blocks.py`` reads them, ``commands.py`` runs or checks the
shell commands and says which of the two it did):

- ``python`` blocks **run**, each in a fresh interpreter, against the live test server where they
  send events: a named setup (``PYTHON``, keyed by the block's ``<!-- block: NAME -->``) defines
  what the block takes as given (``URL``, ``TOKEN``, a dataset, a model) and, after it, prints
  what the test then compares with exact values (the ledger the server stored, the manifest the
  block published, the calls a logger received). The DDP loop runs under torchrun on 2 gloo ranks,
  twice: the second launch resumes the first's checkpoint.
- ``sh`` blocks, command by command (``commands.py``): ``manage.py`` commands and ``curl`` run
  on the test database and against the live server, their output compared with the block's
  ``# ...`` lines; ``make``, ``docker compose``, ``torchrun``, ``python -m recoverydash.sdk`` and
  the examples are checked against the real Makefile, compose file and argument parsers.
- ``yaml`` and ``text`` blocks by name (``DOCUMENTS``): a configuration file is parsed and
  applied by the commands after it; a transcript is compared with what the code prints for the
  same input; a diagram's task names and paths must exist.

``test_every_block_of_the_guides_has_a_handler`` fails on a block nothing handles.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from .blocks import REPO, Block, all_blocks, blocks_of, guide_files
from .commands import Shell, output_matches, split

pytest.importorskip("django")


# --- python blocks: what each one is given, and what is compared after it --------------------

_COMMON = """
import json, os, sys
import torch
URL, TOKEN = os.environ["RD_URL"], os.environ["RD_TOKEN"]
RUN = os.environ["RD_RUN"]
torch.manual_seed(0)
"""

_DATASET = """
dataset = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
"""


def _example_on_one_rank(script: str) -> str:
    """Code that loads ``examples/<script>`` as ``example`` (its functions, without running it),
    and starts a gloo process group of one rank."""
    return f"""
import importlib.util, tempfile
import torch.distributed as dist
import recoverydash.sdk as rd
spec = importlib.util.spec_from_file_location("example", os.path.join(
    os.environ["PYTHONPATH"], "examples", "{script}"))
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)
dist.init_process_group("gloo", store=dist.FileStore(tempfile.mktemp(), 1), rank=0, world_size=1)
"""


@dataclass(frozen=True)
class PythonSetup:
    """``before`` runs first (what the block takes as given), then the block, then ``after``
    (prints one JSON line of facts). ``launch``: ``python`` or ``torchrun2`` (2 gloo ranks);
    ``runs``: the environment of each launch, one after the other. Every python block's test is
    marked slow (a fresh interpreter against the live server)."""

    before: str
    after: str
    launch: str = "python"
    runs: tuple = ({},)


PYTHON = {
    # README: the SDK in three lines (32 samples, batches of 8: 4 updates)
    "sdk-three-lines": PythonSetup(_COMMON + _DATASET, """
rec.client.flush(10)
print(json.dumps({"updates": rec.update}))
"""),
    # docs/integrations/plain-loops.md: a DistributedSampler needs a process group (one rank)
    "plain-loop": PythonSetup(_COMMON + _DATASET + """
import torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["RD_PORT"])
dist.init_process_group("gloo", rank=0, world_size=1)
""", """
rec.client.flush(10)
print(json.dumps({"updates": rec.update}))
dist.destroy_process_group()
"""),
    # docs/trainer-guide.md, audit windows: the dataset yields (x, y, id); one batch, update 1
    "audit-window": PythonSetup(_COMMON + """
import recoverydash.sdk as rd
from recoverydash.integrations.pytorch import observed_loader
client = rd.init(URL, TOKEN, RUN)
rec = rd.ObservedRecorder(client, dataset_version="ds-v1")
dataset = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1),
                                         torch.arange(100, 132))
batch = next(iter(observed_loader(rec, dataset, batch_size=8, shuffle=True, seed=0)))
update, every, resumed_update = 1, 50, 0
""", """
client.flush(10)
print(json.dumps({"ids": batch_ids.tolist()}))
"""),
    # docs/trainer-guide.md, a loop without an LR scheduler declares so: 4 updates, a save at 4
    "no-scheduler-contract": PythonSetup(_COMMON + _DATASET + """
import recoverydash.sdk as rd
from recoverydash.integrations.pytorch import observed_loader
client = rd.init(URL, TOKEN, RUN)
rec = rd.ObservedRecorder(client, dataset_version="ds-v1")
resumed = None
""", """
for update, batch in enumerate(observed_loader(rec, dataset, batch_size=8), 1):
    x, y = rec.observe(batch)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    rec.commit(update)
manifest = rd.save_generation("ckpt", rd.make_generation_id(4, client.attempt), 4,
                              state={"model": model.state_dict(), "optimizer": opt.state_dict()},
                              recorder=rec)
rec.end("completed")
client.flush(10)
print(json.dumps({"required": manifest["required_components"], "contract": client.contract}))
"""),
    # docs/trainer-guide.md, publish_files: a trainer's own two files at update 40
    "publish-files": PythonSetup(_COMMON + """
import recoverydash.sdk as rd
os.makedirs("out/checkpoint-40")
for name, size in (("model.safetensors", 1000), ("optimizer.pt", 500)):
    with open(f"out/checkpoint-40/{name}", "wb") as f:
        f.write(os.urandom(size))
client = rd.init(URL, TOKEN, RUN)
rec = rd.ObservedRecorder(client, dataset_version="ds-v1")
update = 40
""", """
client.flush(10)
print(json.dumps({"published": result.published, "reason": result.reason,
                  "generation_id": (result.manifest or {}).get("generation_id"),
                  "objects": sorted(o["uri"].rsplit("/", 1)[1]
                                    for o in (result.manifest or {}).get("objects", []))}))
"""),
    # docs/trainer-guide.md, rewinding the loggers: a generation at update 100 in storage (the
    # server is not asked: url None), then the same block on a fresh start. wandb and
    # tensorboard are not dependencies: stand-ins record the calls with their arguments.
    "logger-rewind": PythonSetup(_COMMON + """
import types
import recoverydash.sdk as rd
calls = []
wandb = types.SimpleNamespace(init=lambda **kw: calls.append(["wandb.init", kw]))
def SummaryWriter(log_dir, purge_step=None):
    calls.append(["SummaryWriter", log_dir, purge_step])
P, wandb_run_id, log_dir = "proj", "abc123", "runs/x"
if os.environ["RD_CASE"] == "restored":
    model = torch.nn.Linear(4, 1)
    rd.save_generation("ckpt-restored", rd.make_generation_id(100, 0), 100,
                       state={"model": model.state_dict()}, required_components=["model"])
plan = rd.restore_plan(None, None, RUN, location="ckpt-" + os.environ["RD_CASE"])
""", """
print(json.dumps({"calls": calls, "generation_id": plan["generation_id"]}))
""", runs=({"RD_CASE": "restored"}, {"RD_CASE": "fresh"})),
    # docs/trainer-guide.md, the SDK in a training loop: torchrun, 2 gloo ranks; 4 updates with
    # checkpoints at 2 and 4, then a second launch to 8 that resumes generation u000000004-a0
    "ddp-loop": PythonSetup(_COMMON + """
from torch.utils.data import TensorDataset
g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(96, 4, generator=g), torch.randn(96, 1, generator=g))
def make_model():
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
LOCATION = os.path.abspath("ckpt")
MICRO, ACCUM, SAVE_EVERY = 4, 2, 2
UPDATES = int(os.environ["RD_UPDATES"])
""", """
if rank == 0:
    print(json.dumps({"attempt": client.attempt, "update": update,
                      "resumed": resumed and resumed["generation_id"],
                      "source": plan["source"]}))
del model, opt, sched   # DDP before the process group (examples/train_ddp.py says why)
dist.destroy_process_group()
""", launch="torchrun2", runs=({"RD_UPDATES": "4"}, {"RD_UPDATES": "8"})),
    # docs/integrations/torchdata.md: 3 updates trained and saved, then a new recorder and
    # loader restored from the generation: the next batch is the fourth of the epoch
    "torchdata-loader": PythonSetup(_COMMON + """
import recoverydash.sdk as rd
from recoverydash.integrations.torchdata import observed_loader as first_loader
dataset = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.arange(64))
def trained(rec):
    loader = first_loader(rec, dataset, batch_size=8, shuffle=True, seed=0, num_workers=2)
    seen = []
    for i, batch in enumerate(loader):
        x, ids = rec.observe(batch)
        seen.append(ids.tolist())
        rec.commit(i + 1)
        if i + 1 == 3:
            rd.save_generation("ckpt", rd.make_generation_id(3, 0), 3,
                               state={"model": torch.nn.Linear(4, 1).state_dict()},
                               required_components=["model", "data_progress"],
                               recorder=rec)
        if i + 1 == 4:
            break
    return seen
client = rd.init(URL, TOKEN, RUN, attempt=0)
seen = trained(rd.ObservedRecorder(client, dataset_version="ds-v1"))
client.flush(10)
client = rd.init(URL, TOKEN, RUN, attempt=1)
rec = rd.ObservedRecorder(client, dataset_version="ds-v1")
small = rd.load_generation("ckpt", rd.make_generation_id(3, 0),
                           state={"model": torch.nn.Linear(4, 1).state_dict()})
""", """
x, ids = rec.observe(next(iter(loader)))
client.flush(10)
print(json.dumps({"seen": seen, "after_restore": ids.tolist()}))
"""),
    # docs/integrations/hf.md: a tiny GPT-2 from a config (nothing downloaded), 4 updates,
    # a checkpoint every 2
    "hf-trainer": PythonSetup(_COMMON + """
os.environ.setdefault("HF_HUB_OFFLINE", "1")
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
config = GPT2Config(n_layer=1, n_head=2, n_embd=32, n_positions=8, vocab_size=128)
class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 48
    def __getitem__(self, i):
        ids = torch.full((8,), i % 128)
        return {"input_ids": ids, "labels": ids}
args = TrainingArguments(output_dir="out", max_steps=4, save_steps=2,
                         per_device_train_batch_size=4, learning_rate=1e-3, seed=0,
                         use_cpu=True, report_to=[], disable_tqdm=True, logging_steps=10**6)
trainer = Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=Tokens())
""", """
print(json.dumps({"global_step": trainer.state.global_step,
                  "manifests": sorted(d for d in os.listdir("out")
                                      if os.path.exists(f"out/{d}/recoverydash-manifest.json"))}))
"""),
    # docs/integrations/lightning.md: a linear model, 100 steps, the block's checkpoint every 50
    "lightning-trainer": PythonSetup(_COMMON + """
import lightning.pytorch as pl
class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
    def training_step(self, batch, i):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)
    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)
model = Model()
loader = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=4)
MAX_STEPS = 100
""", """
print(json.dumps({"global_step": trainer.global_step,
                  "manifests": sorted(d for d in os.listdir("ckpt")
                                      if os.path.exists(f"ckpt/{d}/recoverydash-manifest.json"))}))
"""),
    # docs/integrations/megatron.md: examples/megatron_gpt.py's two synthetic sources blended
    # 2:1 by Megatron-Core (sequences of 16 tokens), its pretraining batch order, one gloo rank;
    # after the block, 2 updates of 2 microbatches of 2 samples: 128 tokens
    "megatron-dataset": PythonSetup(_COMMON + _example_on_one_rank("megatron_gpt.py") + """
from torch.utils.data import DataLoader
train_ds = example.build_data(os.path.abspath("data"), 16, 64, 0)
gbs, mbs = 4, 2
sampler = example.PretrainingBatches(len(train_ds), 0, mbs, 0, 1)
rec = rd.ObservedRecorder(rd.init(URL, TOKEN, RUN), dataset_version="blend-v1")
resumed = None
""", """
batches = iter(loader)
for update in (1, 2):
    for _ in range(gbs // mbs):
        batch = rec.observe(next(batches))
    rec.commit(update)
rec.client.flush(10)
print(json.dumps({"updates": rec.update}))
dist.destroy_process_group()
"""),
    # docs/integrations/streaming.md: examples/streaming_train.py's two MDS streams mixed 3:1,
    # one gloo rank, batches of 2, 4 updates, a checkpoint every 2
    "streaming-loader": PythonSetup(_COMMON + _example_on_one_rank("streaming_train.py") + """
from torch.distributed.checkpoint.state_dict import get_state_dict
from recoverydash.integrations.streaming import streaming_base
DataState = example.DataState
example.write_streams(os.path.abspath("mds"))
streams = [streaming_base().Stream(local=os.path.abspath(f"mds/{name}"), proportion=p)
           for name, p in (("web", 0.75), ("code", 0.25))]
model = torch.nn.Linear(1, 1)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
model(torch.ones(1, 1)).sum().backward()
opt.step()
msd, osd = get_state_dict(model, opt)
state = {"model": msd, "optimizer": osd}
b, update, save_every, updates, location = 2, 0, 2, 4, os.path.abspath("ckpt")
rec = rd.ObservedRecorder(rd.init(URL, TOKEN, RUN), dataset_version="mds-v1")
""", """
rec.client.flush(10)
manifests = sorted(d for d in os.listdir(location)
                   if os.path.exists(f"{location}/{d}/recoverydash-manifest.json"))
with open(f"{location}/{manifests[-1]}/recoverydash-manifest.json") as f:
    cursor = json.load(f)["data_progress"]["cursor"]
print(json.dumps({"update": update, "manifests": manifests,
                  "cursor": sum(c["position"] for c in cursor)}))
dist.destroy_process_group()
"""),
    # docs/integrations/torchtitan.md: examples/torchtitan_train.py's CheckpointManager and
    # HuggingFaceTextDataLoader over its synthetic corpus, one gloo rank, a fresh start
    "torchtitan-watch": PythonSetup(_COMMON + _example_on_one_rank("torchtitan_train.py") + """
args = example.parse(["--dump", os.path.abspath("titan"), "--corpus", os.path.abspath("corpus")])
example.write_corpus(args.corpus)
dataloader, model, opt, sched, checkpointer, train_state = example.build(args, 0, 1)
rec = rd.ObservedRecorder(rd.init(URL, TOKEN, RUN, location=checkpointer.folder),
                          dataset_version="text-v1")
""", """
from recoverydash.integrations.torchtitan import REQUIRED

input_dict, labels = next(iter(dataloader))  # attempt_started goes with the first batch
input_dict = rec.observe(input_dict)
rec.commit(1)
rec.client.flush(10)
print(json.dumps({"resumed": resumed, "required": list(REQUIRED)}))
checkpointer.close()
dist.destroy_process_group()
"""),
}


def python_blocks() -> list[Block]:
    return [b for b in all_blocks() if b.lang == "python"]


def run_python(block: Block, setup: PythonSetup, server, token, cwd: Path, run_id: str) -> list:
    """Run the block with its setup; returns the JSON facts each launch printed last."""
    script = cwd / "block.py"
    script.write_text(setup.before + "\n# --- the block, as the page has it ---\n" + block.text
                      + "\n# --- after ---\n" + setup.after)
    port = str(_free_port())
    facts = []
    for extra in setup.runs:
        env = {**os.environ, "RD_URL": server, "RD_TOKEN": token, "RD_RUN": run_id,
               "RD_PORT": port, "RECOVERYDASH_SPOOL_DIR": str(cwd / "spool"),
               "PYTHONPATH": str(REPO), **extra}
        if setup.launch == "torchrun2":
            argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc_per_node", "2", str(script)]
        else:
            argv = [sys.executable, str(script)]
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=300, check=False)
        assert done.returncode == 0, f"{block.id}: {done.stderr[-4000:]}"
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        assert lines, f"{block.id}: printed nothing: {done.stdout[-2000:]}"
        facts.append(json.loads(lines[-1]))
    return facts


def _free_port() -> int:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def stored(run_id: str, kind: str) -> list[dict]:
    """The bodies of the stored events of ``kind`` of run ``run_id``, in the order received."""
    from recoverydash.runs.models import Event

    return [e.body for e in Event.objects.filter(run__run_id=run_id, type=kind)
            .order_by("batch_seq", "pk")]


def recovery(run_id: str, token: str) -> dict:
    """The run's analysis brought up to date here (no worker runs in these tests), as the read
    API answers it (docs/ingest-v1.md#recovery)."""
    from django.test import Client

    from recoverydash.runs.analysis import analyze
    from recoverydash.runs.models import Run

    analyze(Run.objects.get(run_id=run_id))
    answer = Client().get(f"/api/v1/runs/{run_id}/recovery",
                          HTTP_AUTHORIZATION=f"Bearer {token}")
    assert answer.status_code == 200, answer.content
    return answer.json()


def stratum(report: dict) -> tuple:
    """``(consumed, duplicates, omissions)`` of the run's one stratum."""
    (main,) = report["strata"]
    return main["consumed"], main["duplicates"], main["omissions"]


def check_python(label: str, facts: list, run_id: str, cwd: Path, token: str) -> None:
    """The exact outcome of each python block."""
    if label in ("sdk-three-lines", "plain-loop"):
        (f,) = facts
        assert f == {"updates": 4}
        assert [b["update"] for b in stored(run_id, "update_committed")] == [1, 2, 3, 4]
        assert stratum(recovery(run_id, token)) == (32, 0, 0)  # each of the 32 samples once
    elif label == "audit-window":
        (f,) = facts
        from recoverydash.runs.models import AuditWindow

        (window,) = AuditWindow.objects.filter(run__run_id=run_id)
        assert (window.attempt, window.update, window.accum_slot) == (0, 1, 0)
        assert window.sample_ids == f["ids"] and len(f["ids"]) == 8
        assert all(100 <= i < 132 for i in f["ids"])
    elif label == "no-scheduler-contract":
        (f,) = facts
        without = ["model", "optimizer", "rng", "data_progress"]
        assert f == {"required": without, "contract": {"required_components": without}}
        (start,) = stored(run_id, "attempt_started")
        assert start["contract"] == {"required_components": without}
        (commit,) = stored(run_id, "checkpoint_committed")
        assert commit["manifest"]["required_components"] == without
    elif label == "publish-files":
        (f,) = facts
        assert f == {"published": True, "reason": None, "generation_id": "u000000040-a0",
                     "objects": ["model.safetensors", "optimizer.pt"]}
        assert (cwd / "ckpt" / "u000000040-a0" / "recoverydash-manifest.json").is_file()
        (commit,) = stored(run_id, "checkpoint_committed")
        manifest = commit["manifest"]
        assert (manifest["generation_id"], manifest["update"]) == ("u000000040-a0", 40)
    elif label == "logger-rewind":
        restored, fresh = facts
        assert restored == {"generation_id": "u000000100-a0", "calls": [
            ["wandb.init", {"project": "proj", "resume_from": "abc123?_step=100"}],
            ["SummaryWriter", "runs/x", 101]]}
        assert fresh == {"generation_id": None, "calls": []}
    elif label == "ddp-loop":
        first, second = facts
        assert first == {"attempt": 0, "update": 4, "resumed": None, "source": "storage"} or \
            first == {"attempt": 0, "update": 4, "resumed": None, "source": "server"}, first
        assert (second["attempt"], second["update"], second["resumed"]) == \
            (1, 8, "u000000004-a0"), second
        report = recovery(run_id, token)
        (restart,) = report["restarts"]
        assert (restart["attempt"], restart["resumed_from"], restart["verdict"]) == \
            (1, "u000000004-a0", "exact"), restart
        assert (restart["replayed"], restart["omitted"], restart["lost_updates"]) == (0, 0, 0)
        # 8 updates of 2 ranks x 4 samples x 2 microbatches, none rolled back
        assert stratum(report) == (128, 0, 0)
    elif label == "megatron-dataset":
        (f,) = facts
        assert f == {"updates": 2}
        strata = recovery(run_id, token)["strata"]
        assert len(strata) == 2  # one stratum per blended source
        assert sum(s["consumed"] for s in strata) == 2 * 4 * 16  # tokens, each once
        assert {s["units"] for s in strata} == {"tokens"}
        assert sum(s["duplicates"] + s["omissions"] for s in strata) == 0
    elif label == "streaming-loader":
        (f,) = facts
        assert f == {"update": 4, "manifests": ["u000000002-a0", "u000000004-a0"], "cursor": 8}
        strata = recovery(run_id, token)["strata"]
        assert sum(s["consumed"] for s in strata) == 8  # 4 updates of 2 samples, each once
        assert sum(s["duplicates"] + s["omissions"] for s in strata) == 0
    elif label == "torchtitan-watch":
        (f,) = facts
        assert f["resumed"] is None and "rng" not in f["required"]  # nothing saved: fresh
        (started,) = stored(run_id, "attempt_started")
        assert started["contract"]["required_components"] == f["required"]
        (main,) = recovery(run_id, token)["strata"]
        # one update of 2 sequences of 64 tokens
        assert (main["consumed"], main["duplicates"], main["units"]) == (128, 0, "tokens")
    elif label == "torchdata-loader":
        (f,) = facts
        # the restored loader delivers the epoch's fourth batch, as the first loader did
        assert f["after_restore"] == f["seen"][3]
    elif label == "hf-trainer":
        (f,) = facts
        assert f == {"global_step": 4, "manifests": ["u000000002-a0", "u000000004-a0"]}
        assert stratum(recovery(run_id, token)) == (16, 0, 0)  # 4 updates of 4 samples
    elif label == "lightning-trainer":
        (f,) = facts
        assert f["global_step"] == 100
        # saved at 50 and 100; ModelCheckpoint's save_top_k=1 deleted the first .ckpt, and its
        # manifest went with it (the page says so)
        assert f["manifests"] == ["u000000100-a0-epoch=6-step=100"], f
        # 100 updates of 4 samples: 6.25 epochs of 64, no position twice within an epoch
        assert stratum(recovery(run_id, token)) == (400, 0, 0)
    else:
        raise AssertionError(f"no check for {label}")


def _python_params():
    params = []
    for block in python_blocks():
        # each runs a fresh interpreter (torch, often a framework) against the live server: a
        # process-level test, run once in CI (make test), not again on SQLite
        params.append(pytest.param(block, id=f"{block.label or 'unlabelled'}",
                                   marks=[pytest.mark.slow]))
    return params


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("block", _python_params())
def test_the_python_block_runs_and_does_what_its_page_says(block, live_server, full_token,
                                                           tmp_path):
    setup = PYTHON.get(block.label)
    assert setup is not None, f"{block.id}: no setup named {block.label!r} in PYTHON"
    run_id = f"doc-{block.label}"
    facts = run_python(block, setup, live_server.url, full_token, tmp_path, run_id)
    check_python(block.label, facts, run_id, tmp_path, full_token)


# --- yaml and text blocks ---------------------------------------------------------------------

def check_diagram(block: Block, cwd: Path) -> str:
    """The task names and URL paths a diagram names exist."""
    from django.urls import Resolver404, resolve

    from workers.celery import app

    tasks = {name.rsplit(".", 1)[-1] for name in app.tasks}
    words = set(re.findall(r"\b[a-z]+(?:_[a-z]+)+\b", block.text))
    assert words <= tasks, sorted(words - tasks)
    for path in re.findall(r"(/(?:api/v1/events|metrics))\b", block.text):
        try:
            resolve(path)
        except Resolver404 as e:
            raise AssertionError(f"the diagram names {path}, which is not served") from e
    return f"checked: task names {sorted(words)} and paths exist"


def check_prometheus(block: Block, cwd: Path) -> str:
    import yaml
    from django.urls import resolve

    config = yaml.safe_load(block.text)
    (job,) = config["scrape_configs"]
    resolve(job["metrics_path"])
    for rules in config["rule_files"]:
        yaml.safe_load((REPO / "deploy" / "prometheus" / rules).read_text())
    return "checked: parsed; its metrics path is served and its rule files exist"


def check_adapter_rules(block: Block, cwd: Path) -> str:
    """prometheus-adapter's rules: each series is a metric ``/metrics`` exports, and they are
    the external metrics the worker autoscaler of ``deploy/kubernetes`` reads."""
    import yaml

    from recoverydash.metrics.collector import METRICS

    rules = yaml.safe_load(block.text)["externalRules"]
    series = [rule["seriesQuery"] for rule in rules]
    assert set(series) <= set(METRICS), sorted(set(series) - set(METRICS))
    for rule in rules:
        assert rule["metricsQuery"] == f"sum({rule['seriesQuery']})", rule
    scaler = yaml.safe_load((REPO / "deploy" / "kubernetes" / "worker-autoscaler.yaml")
                            .read_text())
    read = [m["external"]["metric"]["name"] for m in scaler["spec"]["metrics"]]
    assert sorted(read) == sorted(series), (read, series)
    return "checked: its series are exported metrics, the ones the autoscaler reads"


def write_config(block: Block, cwd: Path) -> str:
    """A configuration file the commands after it use: written under the name of its first
    comment line (``# recoverydash.yml``)."""
    import yaml

    name = block.text.splitlines()[0].lstrip("# ").strip()
    assert yaml.safe_load(block.text), block.id
    (cwd / name).write_text(block.text)
    return f"written as {name}, parsed; applied by the commands after it"


def check_drill_report(block: Block, cwd: Path) -> str:
    """The transcript is what ``drill.table`` prints for the same rows."""
    from recoverydash.sdk.drill import table

    lines = block.text.rstrip("\n").splitlines()
    head = re.fullmatch(r"drill (\S+) \(trainer (\S+), (\d+) updates, crash at generation >= "
                        r"u(\d+), kill (\w+)(?:, undecided wait up to (\S+) s)?; state (.+); "
                        r"loss not compared\)", lines[0])
    assert head, lines[0]
    drills = []
    for row in lines[3:-1]:
        point, restored, verdict, divergence, state, seconds, result = re.split(r"\s{2,}", row)
        v, counts = verdict.split()
        r, o, c = (int(n) for n in counts.split("/"))
        drills.append({"point": point, "restored": restored, "expected": restored,
                       "server": {"verdict": v, "replayed": r, "omitted": o, "recomputed": c},
                       "first_divergence": None if divergence == "none" else divergence,
                       "state": {"match": state.startswith("match"),
                                 "updates_compared": int(state.split()[1])},
                       "cost": {"restore_seconds": float(seconds)}, "passed": result == "pass",
                       "failures": []})
    report = {"drill_id": head[1], "config_digest": head[2], "updates": int(head[3]),
              "at": int(head[4]), "kill": head[5], "state_compare": head[7], "control": {},
              "drills": drills, "passed": lines[-1] == "all drills passed"}
    if head[6] is not None:
        report["wait_undecided_s"] = float(head[6])
    assert table(report) == "\n".join(lines)
    return "checked: drill.table prints exactly this for the same rows"


def check_check_output(block: Block, cwd: Path) -> str:
    """``check`` of a torch DCP folder like the transcript's (step-10 saved, step-15 cut to
    1,000 bytes, step-20 without .metadata): the lines match, ``...`` for any text and the
    commit time aside."""
    script = cwd / "make_dcp.py"
    script.write_text(textwrap.dedent("""
        import os, sys, warnings
        import torch, torch.distributed.checkpoint as dcp
        root = sys.argv[1]
        for step in (10, 15, 20):
            torch.manual_seed(step)
            model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            model(torch.randn(3, 8)).sum().backward()
            opt.step()
            state = {"model": model.state_dict(), "optimizer": opt.state_dict(),
                     "lr_scheduler": {"last_epoch": step}, "train_state": {"step": step}}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                dcp.save(state, checkpoint_id=os.path.join(root, f"step-{step}"))
        with open(os.path.join(root, "step-15", "__0_0.distcp"), "r+b") as f:
            f.truncate(1000)
        os.remove(os.path.join(root, "step-20", ".metadata"))
    """))
    folder = cwd / "outputs" / "checkpoint"
    subprocess.run([sys.executable, str(script), str(folder)], check=True, timeout=120)
    lines = block.text.rstrip("\n").splitlines()
    command = lines[0].removeprefix("$ ").split()
    assert command[:3] == ["python", "-m", "recoverydash.sdk"], command
    done = subprocess.run([sys.executable, *command[1:]], cwd=cwd, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    got = re.sub(r"committed \S+Z", "committed TIME", done.stdout).rstrip("\n").splitlines()
    expect = [re.sub(r"committed \S+Z", "committed TIME", e) for e in lines[1:]]
    assert len(got) >= len(expect), done.stdout
    for want, line in zip(expect, got, strict=False):
        # "..." stands for the rest of a line; the size the structure declares is the folder's
        pattern = re.escape(want).replace(r"\.\.\.", ".*")
        pattern = re.sub(r"declares(\\)? \d+", r"declares\\ \\d+", pattern)
        assert re.fullmatch(pattern, line), (want, line)
    return "ran: check of a folder like the transcript's; the lines match"


DOCUMENTS = {
    "diagram": check_diagram,
    "prometheus-config": check_prometheus,
    "prometheus-adapter-rules": check_adapter_rules,
    "config-as-code": write_config,
    "drill-report": check_drill_report,
    "check-output": check_check_output,
}


# --- the inventory -------------------------------------------------------------------------------

def handler_of(block: Block) -> str:
    """Which handler executes or checks ``block``; AssertionError when none does."""
    if block.label.startswith("run-by "):
        target = block.label[len("run-by "):]
        path, _, name = target.partition("::")
        source = (REPO / path).read_text()
        assert f"def {name}(" in source, f"{block.id}: no test {target}"
        assert block.file in source, f"{block.id}: {path} does not read {block.file}"
        return f"run by {target}"
    if block.lang == "python":
        assert block.label in PYTHON, f"{block.id}: a python block needs a setup in PYTHON"
        return f"python, run with setup {block.label}"
    if block.lang in ("sh", "bash", "shell"):
        assert not block.label, f"{block.id}: shell blocks are handled command by command"
        split(block.text, _VARIABLES)  # every command of it reads
        return "sh, each command run or checked"
    assert block.label in DOCUMENTS, (
        f"{block.id}: a {block.lang or 'plain'} block needs <!-- block: NAME --> with NAME in "
        f"DOCUMENTS (or run-by a test)")
    return f"{block.lang or 'plain'}, {block.label}"


def test_every_block_of_the_guides_has_a_handler():
    found = {b.id: handler_of(b) for b in all_blocks()}
    assert len(found) >= 25, found
    files = guide_files()
    assert "README.md" in files and "docs/trainer-guide.md" in files
    assert "docs/integrations/hf.md" in files and "docs/operator-guide.md" in files
    # the README keeps both commands literally
    first = blocks_of("README.md")[0]
    assert [c.argv for c in split(first.text)] == [["make", "demo"], ["make", "test"]]


_VARIABLES = {"PWD": "", "TOKEN": ""}  # filled in per test (the folder, a live token)


def _pages_with_other_blocks():
    # the trainer guide's blocks start processes (a DCP save and check, the examples' parsers
    # with their frameworks): slow
    return [pytest.param(f, marks=[pytest.mark.slow] if f == "docs/trainer-guide.md" else [])
            for f in guide_files() if any(b.lang != "python" for b in blocks_of(f))]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("page", _pages_with_other_blocks())
def test_the_shell_and_document_blocks_of_a_page_run_or_are_checked(page, live_server,
                                                                    tmp_path):
    """The blocks of one page in order, in one working folder (a configuration file a block
    writes is used by the commands after it)."""
    from recoverydash.runs.models import ApiToken, Project

    token = ApiToken.issue(Project.objects.create(name="myteam"), ["ingest", "read"])[1]
    environ = {"TEAM_S3_SECRET": "s3-secret-of-the-team",
               "PAGERDUTY_ROUTING_KEY": "R" * 32,
               "SLACK_WEBHOOK_URL": "https://hooks.slack.com/services/T000/B000/XXXX",
               "VISION_AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "VISION_AWS_SECRET_ACCESS_KEY": "x" * 40,
               "TOKEN": token}
    shell = Shell(tmp_path, server=live_server.url, environ=environ)
    verdicts = []
    for block in blocks_of(page):
        if block.lang == "python":
            continue
        if block.label.startswith("run-by "):
            verdicts.append((block.id, [handler_of(block)]))
            continue
        if block.label:
            verdicts.append((block.id, [DOCUMENTS[block.label](block, tmp_path)]))
            continue
        assert block.lang in ("sh", "bash", "shell"), block.id
        done = []
        for command in split(block.text, {"PWD": str(tmp_path), "TOKEN": token}):
            shell.last_output = None
            verdict = shell.do(command)
            if command.expect and verdict.startswith("ran: manage.py"):
                assert output_matches(shell.last_output, command.expect), \
                    (command.source, shell.last_output)
                verdict += ", its output as the block shows it"
            done.append(verdict)
        verdicts.append((block.id, done))
    for where, done in verdicts:  # shown with pytest -rP: what was run, what was checked
        assert done, where
        for verdict in done:
            print(f"{where}: {verdict}")
