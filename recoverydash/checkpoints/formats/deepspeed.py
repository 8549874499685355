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

from recoverydash.checkpoints.formats.base import Generation, number_in
from recoverydash.checkpoints.formats.readers import Refused
from recoverydash.checkpoints.formats.store import Tree
from recoverydash.checkpoints.formats.torchzip import check_torch_file, top_keys
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
    """Check one tag folder's files against the world sizes its model states declare."""
    prefix = f"{folder}/" if folder else ""
    names = tree.children(folder)
    models = {(_dp(m), int(m.group(2))): n for n in names if (m := _MODEL.fullmatch(n))}
    optims = {(int(m.group(2)), int(m.group(3))): n for n in names if (m := _OPTIM.fullmatch(n))}
    first = models.get((None, 0)) or models.get((0, 0)) or (sorted(models.values()) or [None])[0]
    keys: dict = {}
    readable = False
    if first is not None:
        found = check_torch_file(tree, gen, prefix + first)
        readable = found is not None
        keys = top_keys(found)
        if not readable:
            gen.unread(REQUIRED)
    dp = _int(keys.get("dp_world_size"))
    mp = _int(keys.get("mp_world_size")) or 1
    steps = _int(keys.get("global_steps"))
    if steps is not None:
        if gen.update is not None and gen.update != steps and gen.format == NAME:
            gen.problem("update_mismatch", f"folder says {gen.update}, global_steps is {steps}")
        gen.update = steps
        gen.progress.update({"global_steps": steps})
    if _int(keys.get("global_samples")) is not None:
        gen.progress["global_samples"] = keys["global_samples"]
    stage = _zero_stage(keys.get("ds_config"))
    zero = bool(optims) or (stage or 0) > 0 or (first is not None and keys.get("optimizer") is None
                                                and keys.get("param_shapes") is not None)
    if first is None:
        gen.problem("object_missing", f"{folder}: no mp_rank_XX_model_states.pt")
    elif dp is None:
        if readable:
            gen.problem("schema_unsupported", f"{prefix + first}: no dp_world_size (not a "
                                              "DeepSpeed model states file?)")
        dp = max([d for d, _ in optims] + [0]) + 1
        mp = max([m for _, m in optims] + [m for _, m in models] + [0]) + 1
    gen.world_size = dp * mp if dp else None
    if set_shards and dp:
        gen.required_shards = [_shard(d, m, mp) for m in range(mp) for d in range(dp)]
    if stage is not None:
        gen.progress["zero_stage"] = stage
    per_dp_model = any(d is not None for d, _ in models) or stage == 3
    for m in range(mp):
        for d in (range(dp or 1) if per_dp_model else [None]):
            name = models.get((d, m))
            want = name or (f"zero_pp_rank_{d}_mp_rank_{m:02d}_model_states.pt" if d is not None
                            else f"mp_rank_{m:02d}_model_states.pt")
            obj = gen.add(tree, prefix + want, _shard(d or 0, m, mp), "model")
            if obj is not None and want != first:
                check_torch_file(tree, gen, obj.path)
    if not zero:
        if keys and keys.get("optimizer") is not None:
            gen.carries("optimizer")
        return
    lead = next((re.match(r"(bf16_|fp16_)?", n).group(0) for n in optims.values()), "")
    for m in range(mp):
        for d in range(dp or 0):
            name = optims.get((d, m)) or f"{lead}zero_pp_rank_{d}_mp_rank_{m:02d}_optim_states.pt"
            obj = gen.add(tree, prefix + name, _shard(d, m, mp), "optimizer")
            if obj is not None:
                check_torch_file(tree, gen, obj.path)
    extra = sorted(n for (d, m), n in optims.items() if dp is not None and (d >= dp or m >= mp))
    if extra:
        gen.notes.append(f"{len(extra)} optimizer partition(s) beyond the declared world size: "
                         f"{', '.join(extra[:3])}")


def _dp(m) -> int | None:
    return int(m.group(1)) if m.group(1) is not None else None


def _shard(dp: int, mp: int, mp_world: int) -> str:
    return f"rank{dp}" if mp_world == 1 else f"rank{dp}-mp{mp}"


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _zero_stage(config) -> int | None:
    """``zero_optimization.stage`` of a saved ``ds_config`` (a dict, or a placeholder of
    DeepSpeedConfig whose state holds it)."""
    if isinstance(config, Refused):
        config = config.field("_param_dict") or config.field("zero_config") or config.state
    if isinstance(config, dict):
        zero = config.get("zero_optimization")
        if isinstance(zero, dict):
            return _int(zero.get("stage"))
        if isinstance(zero, Refused):
            return _int(zero.field("stage"))
    return None
