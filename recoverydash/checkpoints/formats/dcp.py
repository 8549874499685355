"""torch.distributed.checkpoint (DCP) folders, alone or in torchtitan's ``step-N/`` layout.

Rule (``RULE``): a DCP save is committed by its ``.metadata``, which the coordinator writes only
after every rank's write results were gathered (torchtitan's loader takes the newest ``step-N``
holding one). Complete when every storage item the metadata lists has its file, and every file is
exactly as long as its items reach (``offset + length``); the save holds model and optimizer
state. A ``step-N`` folder with ``.distcp`` files and no ``.metadata`` never committed.

Components are told from the state dict keys: ``optimizer*`` / ``optim*`` -> optimizer,
``lr_scheduler*`` / ``scheduler*`` -> scheduler, ``dataloader*`` / ``data_loader*`` ->
data_progress, ``train_state*`` -> train_state, ``rng*`` -> rng, anything else -> model
(torchtitan flattens the model's keys to the top level). Shards are ranks, from file names
``__<rank>_<n>.distcp``. ``update`` is N of ``step-N`` (the folder's number).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import NamedTuple

from recoverydash.checkpoints.formats.base import Columns, Generation, columns, number_in
from recoverydash.checkpoints.formats.readers import (
    DcpLayout,
    DcpMetadata,
    UnreadableFile,
    dcp_layout,
    read_dcp_metadata,
    same_save_layout,
)
from recoverydash.checkpoints.formats.store import Tree
from recoverydash.checkpoints.formats.torchzip import refused_detail
from recoverydash.checkpoints.objects import StorageError

NAME = "dcp"
RULE = ("committed by .metadata (written once every rank's write results were gathered); "
        "complete when every storage item's file exists and is exactly as long as its items "
        "reach (offset + length), with model and optimizer state")
REQUIRED = ["model", "optimizer"]
METADATA = ".metadata"
_DISTCP = re.compile(r"__(\d+)_(\d+)\.distcp")


def _rank_of(name: str) -> int:
    """The rank of a ``__<r>_<n>.distcp`` file name (matched by ``_DISTCP`` already)."""
    return int(name[2:name.index("_", 2)])
_PREFIXES = (("optimizer", "optimizer"), ("optim", "optimizer"), ("lr_scheduler", "scheduler"),
             ("scheduler", "scheduler"), ("dataloader", "data_progress"),
             ("data_loader", "data_progress"), ("train_state", "train_state"), ("rng", "rng"))


_HEADS: dict[str, str] = {}


def component_of(fqn: str) -> str:
    """The component a state dict key belongs to (module doc)."""
    head = fqn.split(".", 1)[0]
    got = _HEADS.get(head)
    if got is None:
        got = next((c for prefix, c in _PREFIXES if head.startswith(prefix)), "model")
        if len(_HEADS) < 4096:
            _HEADS[head] = got
    return got


class Summary(NamedTuple):
    """What a check needs of one ``.metadata``: ``files``, one ``(relative_path, end, shard,
    component, held)`` per file its storage items live in, sorted by path (``end``: the furthest
    ``offset + length`` of its items, the bytes the file must hold; ``shard``: ``rank<r>`` of
    ``__<r>_<n>.distcp``; ``component``: the component with the most bytes in it; ``held``:
    every component with items in it, most bytes first), and
    ``components``, those of every state dict key."""

    files: tuple[tuple[str, int, str, str, tuple[str, ...]], ...]
    components: frozenset[str]
    shards: tuple[str, ...] = ()      # rank0 and every file's shard, by rank number
    listed: frozenset[str] = frozenset()  # the files' relative paths
    #: the files then the .metadata as :class:`~recoverydash.checkpoints.formats.base.Columns` of
    #: the save's folder (None when an item's file lies in a sub-folder): shared by every save of
    #: the layout
    cols: Columns | None = None
    #: globals the ``.metadata`` names that a loader must not import (``readers.SAFE_GLOBALS``)
    refused: tuple[str, ...] = ()


MAX_CACHED_FILES = 1 << 20
"""Files summarised in the in-process cache of :func:`summary_of` at most (oldest dropped)."""
_SUMMARIES: OrderedDict[tuple[str, str, int, float], Summary] = OrderedDict()
_cached_files = 0


def summarise(md: DcpMetadata) -> Summary:
    """The :class:`Summary` of a decoded ``.metadata`` (``readers.DcpMetadata``)."""
    ends: dict[str, int] = {}
    weight: dict[str, dict[str, int]] = {}
    for fqn, rel, offset, length in md.items:
        end = offset + length
        if end > ends.get(rel, -1):
            ends[rel] = end
        c = component_of(fqn)
        w = weight.get(rel)
        if w is None:
            w = weight[rel] = {}
        w[c] = w.get(c, 0) + length
    files = []
    for rel, end in sorted(ends.items()):
        m = _DISTCP.fullmatch(rel.rsplit("/", 1)[-1])
        held = tuple(c for c, _ in sorted(weight[rel].items(), key=lambda kv: -kv[1]))
        files.append((rel, end, f"rank{int(m.group(1))}" if m else "rank0", held[0], held))
    shards = sorted({f[2] for f in files} | {"rank0"}, key=lambda s: int(s[4:]))
    cols = None
    if not any("/" in f[0] for f in files):
        cols = columns([f[0] for f in files] + [METADATA], [f[2] for f in files] + ["rank0"],
                       [f[3] for f in files] + ["model"], [f[1] for f in files] + [None],
                       [f[4] for f in files] + [()])
    return Summary(tuple(files), frozenset(component_of(fqn) for fqn in md.fqns),
                   tuple(shards), frozenset(ends), cols, tuple(sorted(md.refused)))


def summary_of(tree: Tree, marker: str) -> Summary:
    """The :class:`Summary` of the ``.metadata`` at ``marker`` (relative to the tree's root).

    Decoded once per file version: the summary is kept in process, keyed by the file's URI,
    size and modification time as listed, so a server listing the same folder every minute (and
    a check run again) reads and decodes only the ``.metadata`` files that are new or changed.
    At most :data:`MAX_CACHED_FILES` files are summarised in the cache.

    Within one listing (``tree.decoded``), a ``.metadata`` whose bytes equal an already decoded
    one's up to its ``storage_meta`` value, with the same opcodes after it (only the save's
    literals differing: ``checkpoint_id``, ``save_id``), declares the same state dict and
    storage items, so it is not decoded again (``readers.dcp_layout``,
    ``readers.same_save_layout``): the saves of one job are checked at the cost of reading
    their ``.metadata`` and comparing bytes. Every generation's files are still looked up and
    their sizes compared with the items' ends. Raises UnreadableFile, StorageError."""
    global _cached_files
    entry = tree.files[marker]
    key = (tree.uri(marker), marker, entry.size, entry.mtime)
    got = _SUMMARIES.get(key)
    if got is not None:
        _SUMMARIES.move_to_end(key)
        return got
    data = tree.read(marker)
    layout = dcp_layout(data)
    layouts = tree.decoded.setdefault(NAME, {})
    ref: tuple[DcpLayout, Summary] | None = (layouts.get(layout.key) if layout is not None
                                             else None)
    if ref is not None and layout is not None and same_save_layout(ref[0], layout):
        got = ref[1]  # a save of the same job: the same state dict and storage items
    else:
        got = summarise(read_dcp_metadata(data))
        if layout is not None:
            layouts.setdefault(layout.key, (layout, got))
    _SUMMARIES[key] = got
    _cached_files += len(got.files) + 1
    while _cached_files > MAX_CACHED_FILES and _SUMMARIES:
        _, old = _SUMMARIES.popitem(last=False)
        _cached_files -= len(old.files) + 1
    return got


def clear_cache() -> None:
    """Forget every cached summary (a benchmark's cold run, tests)."""
    global _cached_files
    _SUMMARIES.clear()
    _cached_files = 0


def is_dcp_folder(tree: Tree, folder: str) -> bool:
    """A folder holding a ``.metadata`` or ``__<r>_<n>.distcp`` files."""
    return any(n == METADATA or _DISTCP.fullmatch(n) for n in tree.children(folder)
               if f"{folder}/{n}".strip("/") in tree.files)


def detect(tree: Tree) -> int:
    """How strongly the root looks like DCP saves (0: not at all)."""
    if is_dcp_folder(tree, ""):
        return 3
    return 2 * sum(1 for n in tree.children() if tree.is_dir(n) and is_dcp_folder(tree, n))


def update_of(name: str) -> int | None:
    """N of ``step-N`` (torchtitan), else the number a folder name ends with."""
    return number_in(name, r"step-(\d+)") if name.startswith("step-") \
        else number_in(name, r".*?(\d+)")


def scan(tree: Tree) -> list[Generation]:
    """Every DCP generation under the root: the root itself when it is one, else each child
    folder holding DCP files."""
    if is_dcp_folder(tree, ""):
        name = tree.root.rstrip("/").rsplit("/", 1)[-1]
        return [check_folder(tree, "", name)]
    return [check_folder(tree, n, n) for n in tree.children()
            if tree.is_dir(n) and is_dcp_folder(tree, n)]


def check_folder(tree: Tree, folder: str, generation_id: str, *, fmt: str = NAME,
                 gen: Generation | None = None, component: str | None = None) -> Generation:
    """Check one DCP save in ``folder`` (relative to the root). With ``gen``, the save is part
    of another format's generation (Megatron ``torch_dist``, HF FSDP folders): its objects and
    findings are added there, every object under ``component`` when given."""
    prefix = f"{folder}/" if folder else ""
    own = gen is None
    if gen is None:
        gen = Generation(fmt, generation_id, folder, update=update_of(generation_id),
                         required_components=list(REQUIRED))
    marker = prefix + METADATA
    names = tree.children(folder)
    if marker not in tree.files:
        distcp = [n for n in names if _DISTCP.fullmatch(n)]
        ranks = sorted({_rank_of(n) for n in distcp})
        if own:
            gen.uncommitted = (f"no .metadata in {folder or '.'}: {len(distcp)} .distcp file(s) "
                               f"from rank(s) {ranks or 'none'}; DCP writes .metadata only after "
                               "every rank finished")
            for n in distcp:
                gen.add(tree, prefix + n, f"rank{_rank_of(n)}", "model")
        else:
            gen.problem("object_missing", f"{marker}: no DCP metadata")
        return gen
    if own:
        gen.commit(tree, marker)
    try:
        summary = summary_of(tree, marker)
    except UnreadableFile as e:
        gen.problem(e.code, f"{marker}: {e.detail}")
        return gen
    except StorageError as e:
        gen.problem("storage_unverified", f"{marker}: {e}")
        return gen
    if summary.refused:
        gen.problem("refused_globals", refused_detail(marker, set(summary.refused)))
        gen.refused_globals.update(summary.refused)
    for c in ({component} if component else summary.components):
        gen.carries(c)
    if component is None and summary.cols is not None:
        gen.add_columns(tree, folder, summary.cols)
    else:
        gen.add_declared(tree, [(prefix + rel, shard, component or c, end,
                                 () if component else held)
                                for rel, end, shard, c, held in summary.files]
                         + [(marker, "rank0", component or "model", None, ())])
    if own:
        gen.required_shards = list(summary.shards)
    listed = summary.listed
    unlisted = sorted(n for n in set(names).difference(listed)  # names are sorted
                      if n != METADATA and _DISTCP.fullmatch(n))
    if unlisted:
        gen.notes.append(f"{len(unlisted)} .distcp file(s) the metadata does not list (ignored "
                         f"by a load): {', '.join(unlisted[:3])}")
    return gen
