"""Megatron-LM checkpoints: ``latest_checkpointed_iteration.txt`` and ``iter_XXXXXXX/``.

Rule (``RULE``): rank 0 writes the tracker file after every rank saved, so the iteration it names
is committed; an ``iter_`` folder above it never committed; one below was committed by an
earlier tracker and is judged by its files alone. Complete, in the legacy layout, when every
model-parallel rank's folder (``mp_rank_TT`` or ``mp_rank_TT_PPP``, with ``_EEE`` for expert
parallelism) holds a readable ``model_optim_rng.pt`` (and ``distrib_optim.pt`` with the
distributed optimizer), the tensor / pipeline / expert sizes and ``use_distributed_optimizer``
being read from the saved ``args``; the first one's keys include ``model`` (or ``model0``...),
``optimizer`` (unless distributed), ``opt_param_scheduler`` and ``rng_state``, and its
``iteration`` equals the folder's. In the ``torch_dist`` layout (a DCP save in ``iter_``) the DCP
rule applies. ``update`` is the iteration.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from recoverydash.checkpoints.formats import dcp
from recoverydash.checkpoints.formats.base import Generation
from recoverydash.checkpoints.formats.readers import Refused
from recoverydash.checkpoints.formats.store import Tree
from recoverydash.checkpoints.formats.torchzip import (
    MEGATRON_GLOBALS,
    check_torch_file,
    top_keys,
)
from recoverydash.checkpoints.objects import StorageError

NAME = "megatron"
RULE = ("latest_checkpointed_iteration.txt commits the iteration it names (written after "
        "every rank saved); complete when every tensor/pipeline(/expert) rank folder of the "
        "saved args holds a readable model_optim_rng.pt (and distrib_optim.pt with the "
        "distributed optimizer), or, for torch_dist saves, by the DCP rule")
REQUIRED = ["model", "optimizer", "scheduler", "rng"]
TRACKER = "latest_checkpointed_iteration.txt"
_ITER = re.compile(r"iter_(\d+)")
_RANK = re.compile(r"mp_rank_(\d+)(?:_(\d+))?(?:_(\d+))?")
MODEL_FILE = "model_optim_rng.pt"
DIST_OPTIM = "distrib_optim.pt"


def detect(tree: Tree) -> int:
    score = 3 if TRACKER in tree.files else 0
    return score + 2 * sum(1 for n in tree.children() if (_ITER.fullmatch(n) or n == "release")
                           and tree.is_dir(n))


def _tracker(tree: Tree) -> str | None:
    if TRACKER not in tree.files:
        return None
    try:
        return tree.read(TRACKER).decode("utf-8", "replace").strip() or None
    except StorageError:
        return None


def scan(tree: Tree) -> list[Generation]:
    tracked = _tracker(tree)
    tracked_iter = int(tracked) if tracked and tracked.isdigit() else None
    out = []
    for name in tree.children():
        m = _ITER.fullmatch(name)
        if not (m or name == "release") or not tree.is_dir(name):
            continue
        it = int(m.group(1)) if m else None
        gen = Generation(NAME, name, name, update=it, required_components=list(REQUIRED))
        check_iteration(tree, gen, name)
        last = max((o.mtime for o in gen.objects), default=None)
        if (tracked == "release" and name == "release") or (it is not None and it == tracked_iter):
            gen.commit(tree, TRACKER, when=last)
        elif it is not None and tracked_iter is not None and it < tracked_iter:
            gen.commit(tree, TRACKER, when=last)
            gen.notes.append(f"committed by an earlier tracker (now {tracked}): judged by its "
                             "files alone")
        elif tracked is None:
            gen.uncommitted = f"no {TRACKER}: Megatron writes it after every rank saved"
        else:
            gen.uncommitted = (f"{TRACKER} names {tracked}; this iteration is newer, so its save "
                               "did not finish (the tracker is written last)")
        out.append(gen)
    if tracked_iter is not None and not any(g.update == tracked_iter for g in out):
        gen = Generation(NAME, f"iter_{tracked_iter:07d}", f"iter_{tracked_iter:07d}",
                         update=tracked_iter, required_components=list(REQUIRED))
        gen.commit(tree, TRACKER)
        gen.problem("object_missing", f"{TRACKER} names iteration {tracked_iter}: no such folder")
        out.append(gen)
    return out


def _arg(args: Any, name: str) -> Any:
    """Field ``name`` of the saved ``args`` (an argparse Namespace, read as a placeholder, or a
    dict), None when absent."""
    if isinstance(args, Refused):
        return args.field(name)
    if isinstance(args, dict):
        return args.get(name)
    return None


RankKey = tuple[int | None, ...]


def check_iteration(tree: Tree, gen: Generation, folder: str) -> None:
    """Check one ``iter_`` folder (legacy per-rank files, or a torch_dist DCP save): find the rank
    folders, read the first one's ``model_optim_rng.pt``, settle the parallel layout from its
    ``args``, check every rank's files, then what the first file carries. Findings go to
    ``gen``."""
    if dcp.is_dcp_folder(tree, folder):
        _check_torch_dist(tree, gen, folder)
        return
    ranks = _rank_folders(tree, folder)
    if not ranks:
        gen.problem("object_missing", f"{folder}: no mp_rank_* folder")
        return
    first_key = min(ranks, key=lambda k: tuple(-1 if v is None else v for v in k))
    first = f"{folder}/{ranks[first_key]}/{MODEL_FILE}"
    keys = top_keys(check_torch_file(tree, gen, first, MEGATRON_GLOBALS)) \
        if first in tree.files else {}
    layout = _Layout.of(gen, keys, ranks, first)
    gen.required_shards = layout.shards()
    _check_rank_files(tree, gen, folder, layout, first)
    if keys:
        _take_contents(gen, keys, first, layout.distributed)


def _check_torch_dist(tree: Tree, gen: Generation, folder: str) -> None:
    """A ``torch_dist`` save: the DCP rule, plus ``common.pt`` when present."""
    dcp.check_folder(tree, folder, gen.generation_id, gen=gen)
    gen.required_components = list(dcp.REQUIRED)
    gen.required_shards = sorted({o.shard for o in gen.objects})
    if f"{folder}/common.pt" in tree.files:
        gen.add(tree, f"{folder}/common.pt", "rank0", "train_state")


def _rank_folders(tree: Tree, folder: str) -> dict[RankKey, str]:
    """(tensor, pipeline or None, expert or None) rank -> ``mp_rank_*`` folder name."""
    ranks: dict[RankKey, str] = {}
    for n in tree.children(folder):
        m = _RANK.fullmatch(n)
        if m and tree.is_dir(f"{folder}/{n}"):
            ranks[tuple(int(g) if g is not None else None for g in m.groups())] = n
    return ranks


class _Layout(NamedTuple):
    """The parallel layout of a legacy save: tensor / pipeline / expert sizes, whether the rank
    folder names carry the pipeline and expert ranks, whether the optimizer is distributed."""

    tp: int
    pp: int
    ep: int
    pipeline: bool
    expert: bool
    distributed: bool

    @classmethod
    def of(cls, gen: Generation, keys: dict[str, Any], ranks: dict[RankKey, str],
           first: str) -> _Layout:
        """From the saved ``args`` of the first file; without them, from the folders present
        (noted, or the required components left unread when the file was not read)."""
        args = keys.get("args")
        tp = _arg(args, "tensor_model_parallel_size") or 1
        pp = _arg(args, "pipeline_model_parallel_size") or 1
        ep = _arg(args, "expert_model_parallel_size") or 1
        world = _arg(args, "world_size")
        if isinstance(world, int):
            gen.world_size = world
        if args is None:
            if keys:
                gen.notes.append(f"{first}: no args saved: tensor/pipeline sizes taken from the "
                                 "folders")
            else:
                gen.unread(REQUIRED)
            tp = max(k[0] or 0 for k in ranks) + 1
            pp = max((k[1] or 0) for k in ranks) + 1
        return cls(tp, pp, ep, pp > 1 or any(k[1] is not None for k in ranks),
                   ep > 1 or any(k[2] is not None for k in ranks),
                   bool(_arg(args, "use_distributed_optimizer")))

    def shards(self) -> list[str]:
        """Every rank folder the layout requires, ``mp_rank_TT[_PPP][_EEE]``."""
        out = []
        for t in range(self.tp):
            for p in range(self.pp):
                for e in range(self.ep):
                    name = f"mp_rank_{t:02d}"
                    if self.pipeline:
                        name += f"_{p:03d}"
                    if self.expert:
                        name += f"_{e:03d}"
                    out.append(name)
        return out


def _check_rank_files(tree: Tree, gen: Generation, folder: str, layout: _Layout,
                      first: str) -> None:
    """Every required rank folder's ``model_optim_rng.pt`` (and ``distrib_optim.pt`` with the
    distributed optimizer), each a readable torch zip."""
    for name in gen.required_shards:
        rel = f"{folder}/{name}/{MODEL_FILE}"
        obj = gen.add(tree, rel, name, "model")
        if obj is not None and rel != first:
            check_torch_file(tree, gen, rel, MEGATRON_GLOBALS)
        if layout.distributed:
            rel = f"{folder}/{name}/{DIST_OPTIM}"
            if gen.add(tree, rel, name, "optimizer") is not None:
                check_torch_file(tree, gen, rel, MEGATRON_GLOBALS)


def _take_contents(gen: Generation, keys: dict[str, Any], first: str, distributed: bool) -> None:
    """What the first file carries: its components, the iteration (``update_mismatch`` when the
    folder names another), consumed samples and the checkpoint version as progress."""
    if any(k == "model" or re.fullmatch(r"model\d+", k) for k in keys):
        gen.carries("model")
    if keys.get("optimizer") is not None or distributed:
        gen.carries("optimizer")
    for key, component in (("opt_param_scheduler", "scheduler"), ("lr_scheduler", "scheduler"),
                           ("rng_state", "rng")):
        if keys.get(key) is not None:
            gen.carries(component)
    it = keys.get("iteration")
    if isinstance(it, int):
        if gen.update is not None and it != gen.update:
            gen.problem("update_mismatch", f"folder says {gen.update}, {first} iteration {it}")
        gen.update = it
        gen.progress["iteration"] = it
    consumed = _arg(keys.get("args"), "consumed_train_samples")
    if isinstance(consumed, int):
        gen.progress["consumed_train_samples"] = consumed
    version = keys.get("checkpoint_version")
    if isinstance(version, (int, float)):
        gen.progress["checkpoint_version"] = version
