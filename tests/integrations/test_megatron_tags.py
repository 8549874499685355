"""ObservedMegatronDataset.tag without a server: the batch tag made a source at a time (the
blend's indices looked up at once) equals the one made sample by sample, for a blend and a
single GPTDataset, in tokens and in samples, and names exactly the token ranges of the
samples' positions (docs/integrations/megatron.md#positions)."""

from __future__ import annotations

import importlib.util
import os
import random
from pathlib import Path

import pytest

pytest.importorskip("megatron.core.datasets.gpt_dataset")

from recoverydash.integrations.megatron import ObservedMegatronDataset  # noqa: E402
from recoverydash.sdk.tokens import TokenRanges  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SEQ = 32


@pytest.fixture(scope="module")
def blend(tmp_path_factory):
    """The example's two synthetic sources blended 2:1 (examples/megatron_gpt.py build_data),
    in a one-process gloo group (Megatron's builder asks it who writes the index cache)."""
    import torch.distributed as dist

    folder = tmp_path_factory.mktemp("megatron")
    spec = importlib.util.spec_from_file_location("megatron_gpt", REPO / "examples" /
                                                  "megatron_gpt.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    own = not dist.is_initialized()
    if own:
        dist.init_process_group("gloo", store=dist.FileStore(str(folder / "store"), 1), rank=0,
                                world_size=1)
    try:
        yield example.build_data(os.path.join(folder, "data"), SEQ, 320, 1234)
    finally:
        if own:
            dist.destroy_process_group()


def described(tag) -> list:
    out = []
    for it, drawn, ids in tag.groups:
        identities = getattr(drawn, "identities", None)
        out.append((it.stratum, it.padding_from, type(drawn).__name__, list(drawn),
                    None if identities is None else (identities.key, identities.items),
                    list(ids)))
    return out


def batches(n: int) -> list[list[int]]:
    rng = random.Random(7)
    return [list(range(0, 8)), list(range(300, 316)), rng.sample(range(n), 32),
            [5, 5, 200, 5], [n - 1]]


@pytest.mark.parametrize("units", ["tokens", "samples"])
@pytest.mark.parametrize("which", ["blend", "one source"])
def test_the_tag_of_a_batch_equals_the_tag_made_sample_by_sample(blend, units, which):
    ds = ObservedMegatronDataset(blend if which == "blend" else blend.datasets[0], units=units)
    for indices in batches(len(ds)):
        assert described(ds.tag(indices)) == described(ds._tag_each(indices)), indices


def test_the_token_ranges_are_the_positions_times_the_sequence_length(blend):
    ds = ObservedMegatronDataset(blend, units="tokens")
    indices = [0, 1, 2, 3, 4, 5]
    tag = ds.tag(indices)
    for it, drawn, ids in tag.groups:
        assert isinstance(drawn, TokenRanges)
        source = ds.names.index(it.stratum)
        samples = [int(blend.dataset_sample_index[i]) for i in ids]
        assert all(int(blend.dataset_index[i]) == source for i in ids)
        assert list(drawn) == [(s * SEQ, (s + 1) * SEQ) for s in samples]
        assert drawn.identities.items == [(source, s) for s in samples]
    assert sorted(i for _, _, ids in tag.groups for i in ids) == indices


def test_a_batch_holding_megatrons_padding_index_is_tagged_sample_by_sample(blend):
    ds = ObservedMegatronDataset(blend, units="tokens")
    tag = ds.tag([0, None, 1])
    assert described(tag) == described(ds._tag_each([0, None, 1]))
    assert any(it.padding_from == 0 for it, _, _ in tag.groups)
