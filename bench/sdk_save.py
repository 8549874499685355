"""What publishing a checkpoint costs the trainer, per GB saved, against saving the same state
without the SDK (issue 28: the SDK pays no second read).

The state: ``--mib`` MiB of float32 tensors (16 of them) as one DCP component ``model``. Four
ways to save it, interleaved over ``--rounds`` rounds in one process, each into a fresh folder
on the same file system (deleted after the round):

- ``torch.save``: one file (no fsync);
- ``dcp.save``: ``torch.distributed.checkpoint.save`` into a folder (fsync, DCP's default);
- ``save_generation``: the SDK (``recoverydash.sdk.save_generation``): the same DCP save, hashed
  while it is written (sha256 and CRC32 of the bytes on their way to the file), plus the small
  per-rank files and the manifest (the commit). No client: no events are sent;
- ``dcp + reread``: what the SDK did before: ``dcp.save``, then every file read back for its
  sha256.

Per way: the wall time and this process's CPU time (``time.process_time``: all threads), as
seconds per GB, medians over rounds. The ratios printed last are ``save_generation`` against
``dcp.save`` (the SDK's cost over the plain save it wraps) and against ``torch.save``, and
``dcp + reread`` against ``dcp.save`` (what the second read cost). The machine is shared: read the
ratios, which are measured in the same process at the same time, not the absolute seconds.

Usage: ``.venv/bin/python bench/sdk_save.py [--mib 512] [--rounds 5] [--dir DIR]``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=512, help="MiB of state to save")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary folder)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")  # DCP warns that torch.distributed is not initialised

    import torch
    import torch.distributed.checkpoint as dcp

    from recoverydash.sdk import save_generation

    torch.manual_seed(0)
    per = args.mib * 1024 * 1024 // 16 // 4
    state = {f"layer{i}.weight": torch.randn(per) for i in range(16)}
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    root = tempfile.mkdtemp(prefix="rd-sdk-save-", dir=args.dir)

    def plain_torch(folder: str) -> None:
        os.makedirs(folder)
        torch.save(state, os.path.join(folder, "state.pt"))

    def plain_dcp(folder: str) -> None:
        dcp.save({"model": state}, checkpoint_id=os.path.join(folder, "model"))

    def sdk(folder: str) -> None:
        manifest = save_generation(folder, "g1", 1, state={"model": state}, capture_rng=False,
                                   required_components=["model", "data_progress"])
        assert manifest is not None

    def dcp_reread(folder: str) -> None:
        plain_dcp(folder)
        for base, _, names in os.walk(folder):
            for name in names:
                h = hashlib.sha256()
                with open(os.path.join(base, name), "rb") as f:
                    while chunk := f.read(8 << 20):
                        h.update(chunk)

    ways = {"torch.save": plain_torch, "dcp.save": plain_dcp, "save_generation": sdk,
            "dcp + reread": dcp_reread}
    rows: dict[str, list[tuple[float, float]]] = {k: [] for k in ways}
    try:
        for r in range(args.rounds + 1):  # round 0 warms up (imports, allocator, page cache)
            order = list(ways) if r % 2 else list(ways)[::-1]
            for name in order:
                folder = os.path.join(root, f"r{r}-{name.replace(' ', '').replace('.', '')}")
                w0, c0 = time.perf_counter(), time.process_time()
                ways[name](folder)
                wall, cpu = time.perf_counter() - w0, time.process_time() - c0
                shutil.rmtree(folder, ignore_errors=True)
                if r:
                    rows[name].append((wall, cpu))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    gb = nbytes / 1e9
    med = {k: (statistics.median(w for w, _ in v) / gb, statistics.median(c for _, c in v) / gb)
           for k, v in rows.items()}
    print(f"state {nbytes / 2**20:.0f} MiB ({gb:.3f} GB) of float32, {args.rounds} rounds, "
          f"interleaved; seconds per GB saved, medians")
    for k, (wall, cpu) in med.items():
        print(f"  {k:16s} wall {wall:7.3f} s/GB   process cpu {cpu:7.3f} s/GB")
    print("ratios:")
    for a, b in (("save_generation", "dcp.save"), ("save_generation", "torch.save"),
                 ("dcp + reread", "dcp.save")):
        print(f"  {a} / {b}: wall {med[a][0] / med[b][0]:.3f}, "
              f"cpu {med[a][1] / med[b][1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
