"""Benchmark: ``check`` of a torchtitan-style folder of 200 generations x 64 shards (DCP), without
--hash, beside a bare listing of the same folder in the same process.

The folder is built once in a temporary directory: each ``step-N/`` holds 64 ``__<rank>_0.distcp``
files (sparse, of the length their items declare) and a ``.metadata`` pickled from torch's own
DCP classes (two tensors per rank, as a model shard and its optimizer moment). Timed, interleaved,
median of 5 rounds each on a warm page cache:

* ``listing``: ``os.scandir`` of every folder and ``stat`` of every file (what ``ls -lR`` does;
  the sizes are what the check compares);
* ``names``: the same walk without ``stat``;
* ``check``: ``recoverydash.formats.check(root)`` as a server listing the folder every minute
  (or a check run again in one process) does it: listing, every item's file and length
  compared, the status rule; each ``.metadata`` was decoded by an earlier check and its summary
  is kept in process by (URI, size, modification time), ``recoverydash.formats.dcp.summary_of``;
* ``check_cold``: the same with that cache cleared first, so all 200 ``.metadata`` are read and
  decoded with the restricted unpickler (what one ``python -m recoverydash.sdk check`` pays).

Times are the process's CPU time (``time.process_time``: user + system, the listing's system
calls included), which stays comparable on a loaded machine, and wall time beside it. Prints the
medians and, last, ``check / listing`` (target: under 2x).
"""

from __future__ import annotations

import os
import pickle
import shutil
import statistics
import sys
import tempfile
import time

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
            pickle.dump(Metadata(state_dict_metadata=sdm, storage_data=storage), f)
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
    from recoverydash.formats import check, dcp

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
                            ("check_cold", "check, every .metadata decoded")):
            print(f"  {label:32s} {c[name] * 1000:8.1f} {w[name] * 1000:8.1f}")
        print(f"check, every .metadata decoded / listing = {c['check_cold'] / c['listing']:.2f} "
              f"CPU, {w['check_cold'] / w['listing']:.2f} wall")
        print(f"check / listing = {c['check'] / c['listing']:.2f} CPU, "
              f"{w['check'] / w['listing']:.2f} wall (target < 2)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
