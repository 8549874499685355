"""The few collectives the checkpoint code needs, as plain tensor collectives (no ``*_object``
helpers, which need numpy). torch is imported only inside them."""

from __future__ import annotations

import json
from typing import Any


def all_gather_json(obj: Any, group: Any = None) -> list[Any]:
    """Every rank's JSON-able ``obj``, in rank order, through two tensor all_gathers."""
    import torch
    import torch.distributed as dist

    data = json.dumps(obj, separators=(",", ":")).encode()
    world = dist.get_world_size(group)
    size = torch.tensor([len(data)], dtype=torch.int64)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(sizes, size, group=group)
    longest = max(int(s.item()) for s in sizes)
    buf = torch.zeros(max(longest, 1), dtype=torch.uint8)
    if data:
        buf[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    outs = [torch.zeros_like(buf) for _ in range(world)]
    dist.all_gather(outs, buf, group=group)
    return [json.loads(bytes(o[:int(s.item())].tolist()))
            for o, s in zip(outs, sizes, strict=True)]


def all_agree(flag: bool, group: Any = None) -> bool:
    """True when every rank passes True (an all_reduce MIN of 0/1)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([1 if flag else 0], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
    return bool(t.item())


def dist_info(group: Any = None) -> tuple[bool, int, int]:
    """``(torch.distributed initialised, this rank, world size)``; ``(False, 0, 1)`` without
    it (or without torch)."""
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover
        return False, 0, 1
    if dist.is_available() and dist.is_initialized():
        return True, dist.get_rank(), dist.get_world_size(group)
    return False, 0, 1


__all__ = ["all_agree", "all_gather_json", "dist_info"]
