"""DeepSpeed engine checkpoints: ``latest`` (the tag file) and one folder per tag
(``global_stepN/`` by default).

Rule (``RULE``): rank 0 writes ``latest`` after every rank saved its files, so the tag is the
commit of the generation it names; a tag folder newer than the tag (a higher step) never
committed; an older one was committed by an earlier tag that is overwritten now, so it is judged
by its files alone (the tag history is not kept). Complete when the model states of every
model-parallel rank (``mp_rank_XX_model_states.pt``; under ZeRO-3 one per data-parallel rank,
``zero_pp_rank_D_mp_rank_XX_model_states.pt``) are readable torch zips, and under ZeRO (stage >= 1)
the optimizer partition of every data-parallel rank of every model-parallel rank is there and
readable (``[bf16_|fp16_]zero_pp_rank_D_mp_rank_XX_optim_states.pt``, D = 0..dp_world_size-1).
``dp_world_size``, ``mp_world_size``, ``global_steps`` and the ZeRO stage are read from the
model states file (``ds_config``), never guessed from the files present; ``update`` is
``global_steps``.

Shards are ranks: ``rank<D>`` (``rank<D>-mp<M>`` with model parallelism). DeepSpeed itself is not
needed to read any of this.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from recoverydash.checkpoints.formats.base import Generation, number_in
from recoverydash.checkpoints.formats.readers import Refused
from recoverydash.checkpoints.formats.store import Tree
from recoverydash.checkpoints.formats.torchzip import (
    DEEPSPEED_GLOBALS,
    check_torch_file,
    top_keys,
)
from recoverydash.checkpoints.objects import StorageError

NAME = "deepspeed"
RULE = ("the `latest` tag commits the folder it names (written after every rank saved); "
        "complete when every model-parallel rank's model states and, under ZeRO, every "
        "data-parallel rank's optimizer partition are readable torch zips (world sizes read "
        "from the model states file)")
REQUIRED = ["model", "optimizer"]
TAG = "latest"
_MODEL = re.compile(r"(?:zero_pp_rank_(\d+)_)?mp_rank_(\d+)_model_states\.pt")
_OPTIM = re.compile(r"((?:bf16_|fp16_)?)zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt")


def _is_tag_folder(tree: Tree, folder: str) -> bool:
    names = tree.children(folder)
    if "_states.pt" not in "\n".join(names):  # one C scan of the folder's names
        return False
    return any(_MODEL.fullmatch(n) or _OPTIM.fullmatch(n) for n in names)


def detect(tree: Tree) -> int:
    score = 3 if TAG in tree.files else 0
    if _is_tag_folder(tree, ""):
        return 3
    return score + 2 * sum(1 for n in tree.children() if tree.is_dir(n)
                           and _is_tag_folder(tree, n))


def read_tag(tree: Tree, rel: str) -> str | None:
    """The tag a ``latest`` file names (stripped), or None when it is unreadable."""
    try:
        return tree.read(rel).decode("utf-8", "replace").strip() or None
    except StorageError:
        return None


def scan(tree: Tree) -> list[Generation]:
    """Every tag folder under the root (or the root itself when it is one tag folder)."""
    if _is_tag_folder(tree, ""):
        name = tree.root.rstrip("/").rsplit("/", 1)[-1]
        gen = Generation(NAME, name, "", required_components=list(REQUIRED))
        check_tag_folder(tree, gen, "")
        gen.commit(tree, None)
        gen.uncommitted = "a tag folder checked alone: the `latest` file beside it is not visible"
        return [gen]
    return _generations(tree, "")


def _generations(tree: Tree, base: str) -> list[Generation]:
    prefix = f"{base}/" if base else ""
    tag = read_tag(tree, prefix + TAG) if prefix + TAG in tree.files else None
    folders = [n for n in tree.children(base) if tree.is_dir(prefix + n)
               and _is_tag_folder(tree, prefix + n)]
    out = []
    tag_gen = None
    for name in folders:
        gen = Generation(NAME, name, prefix + name, update=number_in(name, r".*?(\d+)"),
                         required_components=list(REQUIRED))
        check_tag_folder(tree, gen, prefix + name)
        out.append(gen)
        if name == tag:
            tag_gen = gen
    if tag is not None and tag_gen is None:
        tag_gen = Generation(NAME, tag, prefix + tag, update=number_in(tag, r".*?(\d+)"),
                             required_components=list(REQUIRED))
        tag_gen.problem("object_missing", f"`latest` names {tag}, which has no model or "
                                          "optimizer states file")
        out.append(tag_gen)
    for gen in out:
        if gen is tag_gen:
            gen.commit(tree, prefix + TAG, when=max((o.mtime for o in gen.objects),
                                                    default=tree.files[prefix + TAG].mtime))
        elif tag_gen is not None and (gen.update or -1) < (tag_gen.update or -1):
            gen.commit(tree, prefix + TAG, when=max((o.mtime for o in gen.objects), default=None))
            gen.notes.append(f"committed by an earlier `latest` (now {tag}): judged by its "
                             "files alone")
        elif tag is None:
            gen.uncommitted = "no `latest` tag file: DeepSpeed writes it after every rank saved"
        else:
            gen.uncommitted = (f"`latest` names {tag}; this folder is newer, so its save did not "
                               "finish (the tag is written last)")
    return out


def check_inside(tree: Tree, gen: Generation, folder: str) -> None:
    """Add the DeepSpeed save found in ``folder`` (a ``latest`` tag and its folder) to another
    format's generation (an HF ``checkpoint-N``, a Lightning ``.ckpt`` folder)."""
    prefix = f"{folder}/" if folder else ""
    tag = read_tag(tree, prefix + TAG)
    gen.add(tree, prefix + TAG, "rank0", "model")
    if tag is None or not _is_tag_folder(tree, prefix + tag):
        gen.problem("object_missing", f"{prefix}latest names {tag!r}: no such DeepSpeed folder")
        return
    check_tag_folder(tree, gen, prefix + tag, set_shards=not gen.required_shards
                     or gen.required_shards == ["rank0"])


def check_tag_folder(tree: Tree, gen: Generation, folder: str, set_shards: bool = True) -> None:
    """Check one tag folder's files against the world sizes its model states declare: read the
    first model states file, take its progress, settle the world sizes, then check every model
    states file and, under ZeRO, every optimizer partition. Findings go to ``gen``."""
    prefix = f"{folder}/" if folder else ""
    files = _TagFiles.of(tree.children(folder))
    first = files.first_model()
    keys, readable = _read_first(tree, gen, prefix, first)
    _take_progress(gen, keys)
    stage = _zero_stage(keys.get("ds_config"))
    dp, mp = _world_sizes(gen, keys, files, prefix, folder, first, readable)
    gen.world_size = dp * mp if dp else None
    if set_shards and dp:
        gen.required_shards = [_shard(d, m, mp) for m in range(mp) for d in range(dp)]
    if stage is not None:
        gen.progress["zero_stage"] = stage
    _check_model_states(tree, gen, prefix, files, first, dp, mp,
                        per_dp=any(d is not None for d, _ in files.models) or stage == 3)
    if _under_zero(files, stage, first, keys):
        _check_optimizer_partitions(tree, gen, prefix, files, dp, mp)
    elif keys.get("optimizer") is not None:
        gen.carries("optimizer")


class _TagFiles(NamedTuple):
    """The states files of a tag folder by rank: ``models`` (dp rank or None, mp rank) -> name,
    ``optims`` (dp rank, mp rank) -> name."""

    models: dict[tuple[int | None, int], str]
    optims: dict[tuple[int, int], str]

    @classmethod
    def of(cls, names: list[str]) -> _TagFiles:
        return cls({(_dp(m), int(m.group(2))): n for n in names if (m := _MODEL.fullmatch(n))},
                   {(int(m.group(2)), int(m.group(3))): n for n in names
                    if (m := _OPTIM.fullmatch(n))})

    def first_model(self) -> str | None:
        """The model states file read for the world sizes: mp rank 0's (of dp rank 0 under
        ZeRO-3), else the first by name, None when there is none."""
        return (self.models.get((None, 0)) or self.models.get((0, 0))
                or min(self.models.values(), default=None))


def _read_first(tree: Tree, gen: Generation, prefix: str,
                first: str | None) -> tuple[dict[str, Any], bool]:
    """(top-level keys of the first model states file, whether it was readable); an unreadable
    one leaves the required components unread."""
    if first is None:
        return {}, False
    found = check_torch_file(tree, gen, prefix + first, DEEPSPEED_GLOBALS)
    if found is None:
        gen.unread(REQUIRED)
        return {}, False
    return top_keys(found), True


def _take_progress(gen: Generation, keys: dict[str, Any]) -> None:
    """``global_steps`` is the update (a folder naming another step is ``update_mismatch``);
    ``global_samples`` is kept as progress."""
    steps = _int(keys.get("global_steps"))
    if steps is not None:
        if gen.update is not None and gen.update != steps and gen.format == NAME:
            gen.problem("update_mismatch", f"folder says {gen.update}, global_steps is {steps}")
        gen.update = steps
        gen.progress.update({"global_steps": steps})
    if _int(keys.get("global_samples")) is not None:
        gen.progress["global_samples"] = keys["global_samples"]


def _world_sizes(gen: Generation, keys: dict[str, Any], files: _TagFiles, prefix: str,
                 folder: str, first: str | None, readable: bool) -> tuple[int | None, int]:
    """(data-parallel, model-parallel) world sizes as the model states declare them; when they
    do not, the sizes the files present imply (and a problem says why)."""
    dp = _int(keys.get("dp_world_size"))
    mp = _int(keys.get("mp_world_size")) or 1
    if first is None:
        gen.problem("object_missing", f"{folder}: no mp_rank_XX_model_states.pt")
        return dp, mp
    if dp is not None:
        return dp, mp
    if readable:
        gen.problem("schema_unsupported", f"{prefix + first}: no dp_world_size (not a "
                                          "DeepSpeed model states file?)")
    dp = max([d for d, _ in files.optims] + [0]) + 1
    mp = max([m for _, m in files.optims] + [m for _, m in files.models] + [0]) + 1
    return dp, mp


def _under_zero(files: _TagFiles, stage: int | None, first: str | None,
                keys: dict[str, Any]) -> bool:
    """Whether the optimizer is partitioned (ZeRO): partitions present, a stage above 0, or a
    model states file with parameter shapes and no optimizer."""
    return bool(files.optims) or (stage or 0) > 0 or (
        first is not None and keys.get("optimizer") is None
        and keys.get("param_shapes") is not None)


def _check_model_states(tree: Tree, gen: Generation, prefix: str, files: _TagFiles,
                        first: str | None, dp: int | None, mp: int, per_dp: bool) -> None:
    """Every model-parallel rank's model states (one per data-parallel rank too when
    ``per_dp``, ZeRO-3), each a readable torch zip."""
    for m in range(mp):
        for d in (range(dp or 1) if per_dp else [None]):
            want = files.models.get((d, m)) or (
                f"zero_pp_rank_{d}_mp_rank_{m:02d}_model_states.pt" if d is not None
                else f"mp_rank_{m:02d}_model_states.pt")
            obj = gen.add(tree, prefix + want, _shard(d or 0, m, mp), "model")
            if obj is not None and want != first:
                check_torch_file(tree, gen, obj.path, DEEPSPEED_GLOBALS)


def _check_optimizer_partitions(tree: Tree, gen: Generation, prefix: str, files: _TagFiles,
                                dp: int | None, mp: int) -> None:
    """Every data-parallel rank's optimizer partition of every model-parallel rank, each a
    readable torch zip; partitions beyond the declared world size are noted."""
    lead = next((found.group(0) for n in files.optims.values()
                 if (found := re.match(r"(bf16_|fp16_)?", n))), "")
    for m in range(mp):
        for d in range(dp or 0):
            name = (files.optims.get((d, m))
                    or f"{lead}zero_pp_rank_{d}_mp_rank_{m:02d}_optim_states.pt")
            obj = gen.add(tree, prefix + name, _shard(d, m, mp), "optimizer")
            if obj is not None:
                check_torch_file(tree, gen, obj.path, DEEPSPEED_GLOBALS)
    extra = sorted(n for (d, m), n in files.optims.items()
                   if dp is not None and (d >= dp or m >= mp))
    if extra:
        gen.notes.append(f"{len(extra)} optimizer partition(s) beyond the declared world size: "
                         f"{', '.join(extra[:3])}")


def _dp(m: re.Match[str]) -> int | None:
    return int(m.group(1)) if m.group(1) is not None else None


def _shard(dp: int, mp: int, mp_world: int) -> str:
    return f"rank{dp}" if mp_world == 1 else f"rank{dp}-mp{mp}"


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _zero_stage(config: Any) -> int | None:
    """``zero_optimization.stage`` of a saved ``ds_config`` (a dict, or a placeholder of
    DeepSpeedConfig whose state holds it)."""
    if isinstance(config, Refused):
        config = (config.field("_param_dict") or config.field("zero_config")
                  or config.__dict__.get("state"))
    if isinstance(config, dict):
        zero = config.get("zero_optimization")
        if isinstance(zero, dict):
            return _int(zero.get("stage"))
        if isinstance(zero, Refused):
            return _int(zero.field("stage"))
    return None
