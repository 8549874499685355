"""Benchmark: ``check`` of a torchtitan-style folder of 200 generations x 64 shards (DCP), without
--hash, beside a bare listing of the same folder in the same process.

The folder is built once in a temporary directory: each ``step-N/`` holds 64 ``__<rank>_0.distcp``
files (sparse, of the length their items declare) and a ``.metadata`` pickled from torch's own
DCP classes (two tensors per rank, as a model shard and its optimizer moment). Timed, interleaved,
median of 5 rounds each on a warm page cache:

* ``listing``: ``os.scandir`` of every folder and ``stat`` of every file (what ``ls -lR`` does;
  the sizes are what the check compares);
* ``names``: the same walk without ``stat``;
* ``check_cold``: ``recoverydash.checkpoints.formats.check(root)`` as one
  ``python -m recoverydash.sdk check`` does it, nothing kept from an earlier check (the
  in-process cache cleared first): the listing, every ``.metadata`` read, every item's file and
  end compared with the listed
  size, the status rule. The ``.metadata`` files of one job's saves differ only in their
  ``storage_meta`` (the save's path and id, written by ``FileSystemWriter`` as here), so one is
  decoded with the restricted unpickler and the other 199 are compared with it byte for byte
  up to that point and their tail's opcodes checked
  (``recoverydash.checkpoints.formats.dcp.summary_of``);
* ``check``: the same with each ``.metadata``'s summary kept in process by an earlier check
  (URI, size, modification time), as a server listing the folder every minute does it.

Times are the process's CPU time (``time.process_time``: user + system, the listing's system
calls included), which stays comparable on a loaded machine, and wall time beside it. Prints the
medians and, last, the one-off ``check / listing`` (target: under 2x).
"""

from __future__ import annotations

import os
import pickle
import shutil
import statistics
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

GENERATIONS = 200
SHARDS = 64
ROUNDS = 5


def build(root: str) -> int:
    """Write the folder; returns the number of files."""
    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        StorageMeta,
        TensorProperties,
        TensorStorageMetadata,
    )

    files = 0
    for g in range(GENERATIONS):
        step = (g + 1) * 100
        folder = os.path.join(root, f"step-{step}")
        os.makedirs(folder)
        sdm, storage = {}, {}
        for rank in range(SHARDS):
            rel = f"__{rank}_0.distcp"
            offset = 0
            for fqn in (f"layers.{rank}.weight", f"optimizer.state.layers.{rank}.weight.exp_avg"):
                length = 4096 * 4
                chunk = ChunkStorageMetadata(offsets=torch.Size([0, 0]),
                                             sizes=torch.Size([64, 64]))
                sdm[fqn] = TensorStorageMetadata(TensorProperties(dtype=torch.float32),
                                                 torch.Size([64, 64]), [chunk])
                storage[MetadataIndex(fqn, torch.Size([0, 0]), 0)] = \
                    _StorageInfo(rel, offset, length)
                offset += length
            with open(os.path.join(folder, rel), "wb") as f:
                f.truncate(offset)  # sparse: the check reads sizes, not bytes
            files += 1
        with open(os.path.join(folder, ".metadata"), "wb") as f:
            # as FileSystemWriter writes it: the save's path and a fresh save id in storage_meta
            pickle.dump(Metadata(state_dict_metadata=sdm, storage_data=storage,
                                 storage_meta=StorageMeta(checkpoint_id=folder,
                                                          save_id=str(uuid.uuid4()))), f)
        files += 1
    return files


def listing(root: str, with_stat: bool = True) -> int:
    n = 0
    stack = [root]
    while stack:
        with os.scandir(stack.pop()) as it:
            for d in it:
                if d.is_dir(follow_symlinks=False):
                    stack.append(d.path)
                else:
                    if with_stat:
                        d.stat()
                    n += 1
    return n


def main() -> None:
    from recoverydash.checkpoints.formats import check, dcp

    root = tempfile.mkdtemp(prefix="recoverydash-bench-check-")
    try:
        t0 = time.perf_counter()
        files = build(root)
        print(f"built {GENERATIONS} generations x {SHARDS} shards ({files} files) in "
              f"{time.perf_counter() - t0:.1f} s")
        result = check(root)
        assert result.format == "dcp" and len(result.generations) == GENERATIONS
        assert all(g.status == "restorable" for g in result.generations)
        assert sum(len(g.objects) for g in result.generations) == files

        def cold():
            dcp.clear_cache()  # every .metadata read and decoded again
            check(root)

        runs = (("listing", lambda: listing(root)), ("names", lambda: listing(root, False)),
                ("check", lambda: check(root)), ("check_cold", cold))
        cpu = {name: [] for name, _ in runs}
        wall = {name: [] for name, _ in runs}
        for _ in range(ROUNDS):
            for name, fn in runs:
                w, c = time.perf_counter(), time.process_time()
                fn()
                cpu[name].append(time.process_time() - c)
                wall[name].append(time.perf_counter() - w)
        c = {k: statistics.median(v) for k, v in cpu.items()}
        w = {k: statistics.median(v) for k, v in wall.items()}
        print(f"load average {os.getloadavg()[0]:.2f}; medians of {ROUNDS} (CPU ms / wall ms):")
        for name, label in (("listing", "listing with stat"), ("names", "listing names only"),
                            ("check", "check (no --hash)"),
                            ("check_cold", "check, one-off (nothing cached)")):
            print(f"  {label:32s} {c[name] * 1000:8.1f} {w[name] * 1000:8.1f}")
        print(f"warm: check with the in-process .metadata cache / listing = "
              f"{c['check'] / c['listing']:.2f} CPU, {w['check'] / w['listing']:.2f} wall")
        print(f"check / listing = {c['check_cold'] / c['listing']:.2f} CPU, "
              f"{w['check_cold'] / w['listing']:.2f} wall (one-off check, nothing cached; "
              f"target < 2)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
