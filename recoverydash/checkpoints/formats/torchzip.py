"""Checking a ``torch.save`` file of a generation (``optimizer.pt``, a DeepSpeed partition, a
Lightning ``.ckpt``) without torch: see ``readers.read_torch_zip``."""

from __future__ import annotations

from typing import Any

from recoverydash.checkpoints.formats.base import Generation
from recoverydash.checkpoints.formats.readers import TorchFile, UnreadableFile, read_torch_zip
from recoverydash.checkpoints.formats.store import Tree
from recoverydash.checkpoints.objects import StorageError


def check_torch_file(tree: Tree, gen: Generation, rel: str) -> TorchFile | None:
    """Read the torch zip at ``rel``: a broken one is recorded on ``gen`` (``size_mismatch`` when
    truncated, ``schema_unsupported`` when not a torch file, ``storage_unverified`` when storage
    could not answer) and None returned. Legacy non-zip files are noted, not checked."""
    entry = tree.files.get(rel)
    if entry is None:
        return None
    try:
        with tree.open(rel) as f:
            found = read_torch_zip(f, entry.size)
    except UnreadableFile as e:
        gen.problem(e.code, f"{rel}: {e.detail}")
        return None
    except StorageError as e:
        gen.problem("storage_unverified", f"{rel}: {e}")
        return None
    if found.legacy:
        gen.notes.append(f"{rel}: legacy (non-zip) torch file, only its presence is checked")
    if found.refused:
        names = sorted(found.refused)
        gen.notes.append(f"{rel}: {len(names)} class(es) not imported (read as placeholders): "
                         f"{', '.join(names[:4])}")
    return found


def top_keys(found: TorchFile | None) -> dict[str, Any]:
    """The top-level dict of a torch file (empty when it is not a dict)."""
    return found.obj if found is not None and isinstance(found.obj, dict) else {}
