"""observe_streaming on a local mixture, without a server: the positions the samples carry are
Streaming's global order counted per stream (a prefix of each stream after every batch, with or
without worker processes, with Streaming's row repeats as padding), and streaming_cursor of
Streaming's own state is exactly where the recorded positions stand."""

from __future__ import annotations

import pytest

try:
    from recoverydash.integrations.streaming import (
        observe_streaming,
        streaming_base,
        streaming_cursor,
    )

    sb = streaming_base()
except ImportError:  # pragma: no cover
    pytest.skip("mosaicml-streaming is not installed", allow_module_level=True)

from recoverydash.sdk.observe import ObservedCollate, strip


@pytest.fixture(scope="module")
def streams(tmp_path_factory):
    root = tmp_path_factory.mktemp("mds")
    for name, n, first in (("web", 300, 0), ("code", 120, 100_000)):
        with sb.MDSWriter(out=str(root / name), columns={"x": "int64"}, size_limit=2048) as w:
            for i in range(n):
                w.write({"x": first + i})
    return root


@pytest.mark.parametrize("workers, canonical, size", [(0, 8, 400), (2, 7, 403)])
def test_positions_are_the_global_order_per_stream(streams, workers, canonical, size):
    ds = observe_streaming(sb.StreamingDataset(
        streams=[sb.Stream(local=str(streams / "web"), proportion=0.75),
                 sb.Stream(local=str(streams / "code"), proportion=0.25)],
        epoch_size=size, shuffle=True, shuffle_seed=3, batch_size=4,
        num_canonical_nodes=canonical))
    loader = sb.StreamingDataLoader(ds, batch_size=4, collate_fn=ObservedCollate(),
                                    num_workers=workers)
    real: dict = {"web": [], "code": []}
    padding = 0
    values = []
    for i, batch in enumerate(loader):
        clean, tag = strip(batch)
        values += clean["x"].tolist()
        named = []
        for it, positions, indices in tag.groups:
            named += [(it.stratum, i) for i in indices]
            if it.padding_from is not None:
                padding += len(positions)
                continue
            real[it.stratum] += positions
        # every sample's identity is its index in its stream
        assert sorted(named) == sorted(("code", v - 100_000) if v >= 100_000 else ("web", v)
                                       for v in clean["x"].tolist())
        if i == 9:  # 40 samples: each stream's positions are a prefix, where Streaming's state is
            cursor = streaming_cursor(ds, loader.state_dict())
            assert [c["position"] for c in cursor] == [len(real["web"]), len(real["code"])]
            assert sorted(real["web"]) == list(range(len(real["web"])))
            assert sorted(real["code"]) == list(range(len(real["code"])))
    assert sorted(real["web"]) == list(range(len(real["web"])))
    assert sorted(real["code"]) == list(range(len(real["code"])))
    # every position of the epoch once (a 403-sample epoch upsamples the 300-sample stream to
    # 302: two samples twice, at two positions); the repeats Streaming adds to even out its rows
    # are the padding, beyond the epoch
    assert len(real["web"]) + len(real["code"]) == size
    assert padding == len(values) - size



@pytest.mark.parametrize("proportions, size, lengths", [
    ((0.75, 0.25), 400, {"web": 300, "code": 100}),
    # the 120-sample stream upsampled to 200 (its samples once or twice), the other downsampled
    ((0.5, 0.5), 400, {"web": 200, "code": 200}),
    ((0.75, 0.25), 403, {"web": 302, "code": 101}),
])
def test_each_stream_is_a_stratum_whose_epoch_is_its_share_of_the_mixture(
        streams, proportions, size, lengths):
    """One stratum per stream, its epoch length the stream's share of the mixture's epoch
    (Streaming's ``resample_streams``: the proportion, not the stream's size): an epoch consumes
    positions ``0 .. length - 1`` of each stratum once, an upsampled stream's samples at as many
    positions as they are drawn."""
    import numpy as np

    ds = observe_streaming(sb.StreamingDataset(
        streams=[sb.Stream(local=str(streams / "web"), proportion=proportions[0]),
                 sb.Stream(local=str(streams / "code"), proportion=proportions[1])],
        epoch_size=size, shuffle=True, shuffle_seed=5, batch_size=4, num_canonical_nodes=8))
    loader = sb.StreamingDataLoader(ds, batch_size=4, collate_fn=ObservedCollate())
    real: dict = {"web": [], "code": []}
    drawn: dict = {"web": [], "code": []}
    declared: dict = {"web": set(), "code": set()}
    for batch in loader:
        _, tag = strip(batch)
        for it, positions, indices in tag.groups:
            if it.padding_from is not None:
                continue
            declared[it.stratum].add(it.length)
            real[it.stratum] += positions
            drawn[it.stratum] += indices
    assert declared == {k: {n} for k, n in lengths.items()}
    assert {k: sorted(v) for k, v in real.items()} == {k: list(range(n))
                                                        for k, n in lengths.items()}
    # Streaming's own draw of the epoch, per stream
    _, small_per_big = ds.resample_streams(0)
    stream = np.searchsorted(np.asarray(ds.sample_offset_per_stream), small_per_big,
                             side="right") - 1
    assert np.bincount(stream, minlength=2).tolist() == [lengths["web"], lengths["code"]]
    if proportions == (0.5, 0.5):  # 200 draws of the 120 code samples: each once or twice
        counts = np.bincount(np.asarray(drawn["code"]), minlength=120)
        assert counts.min() == 1 and counts.max() == 2 and counts.sum() == 200
