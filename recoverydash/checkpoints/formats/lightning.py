"""PyTorch Lightning ``.ckpt`` files (``ModelCheckpoint``, ``trainer.save_checkpoint``).

Rule (``RULE``): every ``.ckpt`` file is one generation, committed by being there (Lightning
writes it through an fsspec transaction: a temporary file moved into place). Complete when it is a
readable torch zip (central directory, ``data.pkl``, every tensor storage present with the bytes
its element count needs; tensors are never materialised) whose top-level dict holds
``state_dict``, ``optimizer_states``, ``lr_schedulers``, ``loops``, ``global_step`` and ``epoch``
(a ``save_weights_only`` checkpoint lacks the optimizer, scheduler and loop state: rejected with
``component_missing``), and whose ``global_step`` equals the ``step=N`` of its name when it has
one. ``update`` is ``global_step``. Lightning saves no RNG state by itself.

A ``.ckpt`` that is a folder (DeepSpeed or FSDP strategies) is checked by the DeepSpeed or DCP
rule. Files are looked for in the root and up to three folder levels below it
(``lightning_logs/version_0/checkpoints/``).
"""

from __future__ import annotations

import re

from recoverydash.checkpoints.formats import dcp, deepspeed
from recoverydash.checkpoints.formats.base import Generation
from recoverydash.checkpoints.formats.store import Tree
from recoverydash.checkpoints.formats.torchzip import check_torch_file, top_keys

NAME = "lightning"
RULE = ("every .ckpt is a generation, committed by being there (written to a temporary file "
        "and moved); complete when it is a readable torch zip with all its storages and the "
        "keys state_dict, optimizer_states, lr_schedulers, loops, global_step and epoch")
KEYS = {"state_dict": "model", "optimizer_states": "optimizer", "lr_schedulers": "scheduler",
        "loops": "loops", "global_step": "progress", "epoch": "progress"}
REQUIRED = ["model", "optimizer", "scheduler", "loops", "progress"]
MAX_DEPTH = 4


def _ckpts(tree: Tree) -> list[str]:
    """``.ckpt`` files and folders at most MAX_DEPTH levels down, as relative paths."""
    out = set()
    for folder, names in tree.files.folders():
        if ".ckpt" in folder:  # a folder of .ckpt (DCP, DeepSpeed): any one file names it
            rels = [f"{folder}/{next(iter(names))}"] if names else []
        else:  # most folders: one C substring test per file, full paths made for .ckpt only
            prefix = folder + "/" if folder else ""
            rels = [prefix + n for n in names if ".ckpt" in n]
        for rel in rels:
            parts = rel.split("/")
            for depth, part in enumerate(parts[:MAX_DEPTH]):
                if part.endswith(".ckpt"):
                    out.add("/".join(parts[:depth + 1]))
                    break
    return sorted(out)


def detect(tree: Tree) -> int:
    return 2 * len(_ckpts(tree))


def scan(tree: Tree) -> list[Generation]:
    return [check_ckpt(tree, rel) for rel in _ckpts(tree)]


def check_ckpt(tree: Tree, rel: str) -> Generation:
    """Check one ``.ckpt`` (a file, or a folder written by a sharded strategy)."""
    name = rel.rsplit("/", 1)[-1]
    m = re.search(r"step=(\d+)", name)
    named_step = int(m.group(1)) if m else None
    gen = Generation(NAME, rel, rel, update=named_step, required_components=list(REQUIRED))
    if rel not in tree.files:  # a folder
        if "latest" in tree.children(rel):
            deepspeed.check_inside(tree, gen, rel)
            gen.commit(tree, f"{rel}/latest")
        elif dcp.is_dcp_folder(tree, rel):
            dcp.check_folder(tree, rel, rel, gen=gen)
            gen.commit(tree, f"{rel}/.metadata" if f"{rel}/.metadata" in tree.files else None)
        else:
            gen.uncommitted = "a .ckpt folder with neither a DeepSpeed tag nor DCP metadata"
        gen.required_components = ["model", "optimizer"]
        return gen
    gen.commit(tree, rel)
    obj = gen.add(tree, rel, "rank0", "model")
    found = check_torch_file(tree, gen, rel) if obj is not None else None
    keys = top_keys(found)
    if found is None:
        gen.unread(REQUIRED)
        return gen
    if not keys:
        gen.problem("schema_unsupported", f"{rel}: the top level is not a dict")
        return gen
    for key, component in KEYS.items():
        if key in keys:
            gen.carries(component)
    gen.objects[0].component = "model" if "state_dict" in keys else "checkpoint"
    step, epoch = keys.get("global_step"), keys.get("epoch")
    gen.progress = {k: keys[k] for k in ("global_step", "epoch") if isinstance(keys.get(k), int)}
    version = keys.get("pytorch-lightning_version")
    if isinstance(version, str):
        gen.progress["lightning_version"] = version
    if isinstance(step, int):
        gen.update = step
        if named_step is not None and named_step != step:
            gen.problem("update_mismatch", f"{name} says step {named_step}, its global_step "
                                           f"is {step}")
    if epoch is not None and not isinstance(epoch, int):
        gen.problem("schema_unsupported", f"{rel}: epoch is {epoch!r}")
    return gen
