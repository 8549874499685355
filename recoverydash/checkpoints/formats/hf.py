"""Hugging Face Trainer ``checkpoint-N/`` folders.

Rule (``RULE``): ``Trainer._save_checkpoint`` writes the model, then optimizer, scheduler, scaler
and RNG states, and ``trainer_state.json`` last: that file is the commit marker (HF's own
``get_last_checkpoint`` takes the highest N and checks nothing). Complete when
``trainer_state.json`` parses and its ``global_step`` is N; the model's safetensors headers
declare tensor byte ranges that end exactly at each file's size (and, when sharded, every file of
``model.safetensors.index.json`` is there holding the tensors it maps); ``optimizer.pt`` and
``scheduler.pt`` are readable torch zips whose storages are all present; RNG states exist for
every process (``rng_state.pth``, or ``rng_state_<i>.pth`` for i = 0..n-1). ``save_only_model``
checkpoints lack optimizer, scheduler and RNG: they are rejected with ``component_missing``
(resuming from one silently restarts the optimizer).

Shards are processes: ``rank<i>`` from ``rng_state_<i>.pth``; process 0 writes the shared files.
A DeepSpeed save inside the checkpoint (``global_stepN/`` with ``latest``) or FSDP folders
(``pytorch_model_fsdp_0/``, ``optimizer_0/``: DCP saves) are checked by those formats' rules.
"""

from __future__ import annotations

import json
import re

from recoverydash.checkpoints.formats import dcp, deepspeed
from recoverydash.checkpoints.formats.base import Generation, number_in
from recoverydash.checkpoints.formats.readers import (
    SafetensorsHeader,
    UnreadableFile,
    read_safetensors_header,
    safetensors_header_length,
)
from recoverydash.checkpoints.formats.store import Tree
from recoverydash.checkpoints.formats.torchzip import NUMPY_GLOBALS, check_torch_file
from recoverydash.checkpoints.objects import StorageError

NAME = "hf"
RULE = ("committed by trainer_state.json (written last); complete when its global_step is N, "
        "the model's safetensors headers end exactly at each file's size (every shard of the "
        "index present), optimizer.pt and scheduler.pt are readable torch zips with all their "
        "storages, and every process's rng_state file exists")
REQUIRED = ["model", "optimizer", "scheduler", "rng", "trainer_state"]
STATE = "trainer_state.json"
_CKPT = re.compile(r"checkpoint-(\d+)")
_TMP = re.compile(r"tmp-checkpoint-(\d+)")
_RNG = re.compile(r"rng_state(?:_(\d+))?\.pth")


def detect(tree: Tree) -> int:
    if STATE in tree.files and any(n.endswith(".safetensors") or n == "optimizer.pt"
                                   for n in tree.children()):
        return 3
    return 2 * sum(1 for n in tree.children()
                   if (_CKPT.fullmatch(n) or _TMP.fullmatch(n)) and tree.is_dir(n))


def scan(tree: Tree) -> list[Generation]:
    """Every ``checkpoint-N`` (and staged ``tmp-checkpoint-N``) folder, or the root itself when
    it is one checkpoint."""
    if STATE in tree.files:
        name = tree.root.rstrip("/").rsplit("/", 1)[-1]
        return [check_folder(tree, "", name)]
    return [check_folder(tree, n, n) for n in tree.children()
            if (_CKPT.fullmatch(n) or _TMP.fullmatch(n)) and tree.is_dir(n)]


def check_folder(tree: Tree, folder: str, name: str) -> Generation:
    """Check one HF Trainer checkpoint folder (relative to the root)."""
    prefix = f"{folder}/" if folder else ""
    n = number_in(name, r"(?:tmp-)?checkpoint-(\d+)")
    gen = Generation(NAME, name, folder, update=n, required_components=list(REQUIRED))
    names = tree.children(folder)
    state_rel = prefix + STATE
    if _TMP.fullmatch(name):
        gen.uncommitted = "a staging folder (tmp-checkpoint-N): never renamed into place"
    elif state_rel not in tree.files:
        gen.uncommitted = (f"no {STATE}: the Trainer writes it last, after model, optimizer, "
                           "scheduler and RNG states")
    else:
        gen.commit(tree, state_rel)
        _trainer_state(tree, gen, state_rel, n)

    rng = {}
    for f in names:
        m = _RNG.fullmatch(f)
        if m:
            rng[int(m.group(1)) if m.group(1) is not None else 0] = f
    world = (max(rng) + 1) if rng else 1
    gen.world_size = world if rng else None
    gen.required_shards = [f"rank{i}" for i in range(world)]
    for i, f in sorted(rng.items()):
        gen.add(tree, prefix + f, f"rank{i}", "rng")
    if rng and len(rng) < world:
        lacking = [f"rng_state_{i}.pth" for i in range(world) if i not in rng]
        gen.problem("object_missing", f"no {', '.join(lacking[:5])} (processes "
                                      f"0..{world - 1} saved RNG state)")
    if state_rel in tree.files:
        gen.add(tree, state_rel, "rank0", "trainer_state")
    _model(tree, gen, prefix, names)
    for f, component in (("optimizer.pt", "optimizer"), ("optimizer.bin", "optimizer"),
                         ("scheduler.pt", "scheduler"), ("scaler.pt", "scaler")):
        if f in names:
            obj = gen.add(tree, prefix + f, "rank0", component)
            if obj is not None:
                check_torch_file(tree, gen, obj.path, NUMPY_GLOBALS)
    for f in names:
        if re.fullmatch(r"rank\d+-of-\d+-optimizer\.pt", f):  # XLA FSDP
            gen.add(tree, prefix + f, "rank" + f[4:].split("-")[0], "optimizer")
    for f in names:
        sub = prefix + f
        if f.startswith("pytorch_model_fsdp") and dcp.is_dcp_folder(tree, sub):
            dcp.check_folder(tree, sub, name, gen=gen, component="model")
        elif f.startswith("optimizer_") and dcp.is_dcp_folder(tree, sub):
            dcp.check_folder(tree, sub, name, gen=gen, component="optimizer")
    if "latest" in names:  # a DeepSpeed engine saved its own states here
        deepspeed.check_inside(tree, gen, folder)
    return gen


def _trainer_state(tree: Tree, gen: Generation, rel: str, n: int | None) -> None:
    try:
        state = json.loads(tree.read(rel))
    except StorageError as e:
        gen.problem("storage_unverified", f"{rel}: {e}")
        return
    except (UnicodeDecodeError, ValueError) as e:
        gen.problem("schema_unsupported", f"{rel} is not JSON ({e}): cut short while written?")
        return
    if not isinstance(state, dict) or not isinstance(state.get("global_step"), int):
        gen.problem("schema_unsupported", f"{rel} has no integer global_step")
        return
    step = state["global_step"]
    gen.update = step
    gen.progress = {k: state[k] for k in ("global_step", "epoch", "max_steps", "num_train_epochs",
                                          "train_batch_size", "total_flos") if k in state}
    if n is not None and n != step:
        gen.problem("update_mismatch", f"folder says {n}, trainer_state.json global_step {step}")


def _model(tree: Tree, gen: Generation, prefix: str, names: list[str]) -> None:
    index = next((f for f in names if f.endswith(".safetensors.index.json")), None)
    shards = [f for f in names if f.endswith(".safetensors")]
    mapped: dict[str, list[str]] = {}
    if index is not None:
        gen.add(tree, prefix + index, "rank0", "model")
        try:
            weight_map = json.loads(tree.read(prefix + index)).get("weight_map") or {}
        except (StorageError, ValueError, AttributeError) as e:
            gen.problem("schema_unsupported", f"{prefix + index}: unreadable ({e})")
            weight_map = {}
        for tensor, f in weight_map.items():
            mapped.setdefault(f, []).append(tensor)
        for f in sorted(mapped):
            if f not in shards:
                gen.problem("object_missing", f"{prefix + f}: listed by {index}, no such file")
    for f in shards:
        header = _safetensors(tree, gen, prefix + f)
        if header is not None and f in mapped:
            absent = [t for t in mapped[f] if t not in header.tensors]
            if absent:
                gen.problem("object_missing", f"{prefix + f}: lacks {len(absent)} tensor(s) the "
                                              f"index maps to it ({', '.join(absent[:3])})")
    for f in ("pytorch_model.bin", "model.pt"):
        if f in names:
            obj = gen.add(tree, prefix + f, "rank0", "model")
            if obj is not None:
                check_torch_file(tree, gen, obj.path, NUMPY_GLOBALS)
    for f in names:
        if re.fullmatch(r"pytorch_model-\d+-of-\d+\.bin", f):
            obj = gen.add(tree, prefix + f, "rank0", "model")
            if obj is not None:
                check_torch_file(tree, gen, obj.path, NUMPY_GLOBALS)


def _safetensors(tree: Tree, gen: Generation, rel: str) -> SafetensorsHeader | None:
    """Check one safetensors file; returns its header, or None when it is broken."""
    entry = tree.files[rel]
    try:
        head = tree.read(rel, 0, 8)
        n = safetensors_header_length(head, entry.size)
        header = read_safetensors_header(tree.read(rel, 0, 8 + n), entry.size)
    except UnreadableFile as e:
        gen.add(tree, rel, "rank0", "model")
        gen.problem(e.code, f"{rel}: {e.detail}")
        return None
    except StorageError as e:
        gen.add(tree, rel, "rank0", "model")
        gen.problem("storage_unverified", f"{rel}: {e}")
        return None
    gen.add(tree, rel, "rank0", "model", declared_size=header.declared_size)
    return header
