"""examples/train_ddp.py with one deliberate recovery bug, for the drill tests (run it as the
example: ``python tests/drills/broken_ddp.py --broken read_cursor|optimizer ...`` under torchrun).

- ``read_cursor``: the loader prefetches (one worker, two batches in flight) and resumes at the
  read cursor saved beside the committed one: the samples that were in flight at the save are
  never consumed (an omission), and the state differs from the first update after the resume;
- ``optimizer``: the model is restored but the optimizer state is not (AdamW starts its moments
  from zero): the data sequence is right, the parameters differ from the first update after the
  resume;
- ``seed``: the resumed launch (the drill's second launch of a crash point, its trace folder
  ``.../launch2``) shuffles with another sampler seed: the same positions hold other samples
  (an order changed), the model and optimizer are restored correctly.
"""

from __future__ import annotations

import functools
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "examples"))

import train_ddp

import recoverydash.sdk as rd
from recoverydash.integrations.pytorch import observed_loader


def _without_optimizer():
    # DCP loads in place into the state dict get_state_dict handed out, whose tensors are the
    # optimizer's own: leaving set_state_dict out would still restore it. The bug is not to
    # load the optimizer component at all (its moments stay as get_state_dict initialised them).
    load = rd.load_generation

    def load_generation(location, generation_id, *, state, **kw):
        return load(location, generation_id,
                    state={k: v for k, v in state.items() if k != "optimizer"}, **kw)

    rd.load_generation = load_generation


def _resume_at_read_cursor():
    save, load = rd.ObservedRecorder.state_dict, rd.ObservedRecorder.load_state_dict

    def state_dict(self):
        return {**save(self), "read_cursor": self.fetched_cursor()}

    def load_state_dict(self, state, *, cursor=None):
        load(self, state, cursor=(state or {}).get("read_cursor"))

    rd.ObservedRecorder.state_dict = state_dict
    rd.ObservedRecorder.load_state_dict = load_state_dict
    train_ddp.observed_loader = functools.partial(observed_loader, num_workers=1,
                                                  prefetch_factor=2)


def _another_seed_when_resumed():
    from torch.utils.data import DistributedSampler

    from recoverydash.sdk.faults import TRACE_ENV

    if os.path.basename(os.environ.get(TRACE_ENV, "").rstrip("/")) != "launch2":
        return
    def another_seed(*args, **kw):
        return DistributedSampler(*args, **{**kw, "seed": 1})

    train_ddp.DistributedSampler = another_seed


if __name__ == "__main__":
    broken = sys.argv.pop(sys.argv.index("--broken") + 1)
    sys.argv.remove("--broken")
    if broken == "optimizer":
        _without_optimizer()
    elif broken == "read_cursor":
        _resume_at_read_cursor()
    elif broken == "seed":
        _another_seed_when_resumed()
    else:
        raise SystemExit(f"--broken must be read_cursor, optimizer or seed, got {broken!r}")
    train_ddp.train(train_ddp.parse())
