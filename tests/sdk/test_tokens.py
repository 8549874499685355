"""Token positions through the observed recorder (docs/definitions.md#units): packed sequences
carry ranges, update_committed sends token-range spans with their identities, counts tokens,
marks padding, and the attempt's sampler declares the unit."""

from __future__ import annotations

from recoverydash.sdk.observe import BatchTag, Iteration, ObservedRecorder
from recoverydash.sdk.tokens import TokenRanges, merge
from tests.sdk.test_ledger import CaptureClient


def recorder():
    return ObservedRecorder(CaptureClient(rank=0), rank=0, world_size=1, start_timeout=0)


TEXT = Iteration("text", 0, "o1", length=10_000, info={"algorithm": "packer", "units": "tokens"})
PAD = Iteration("text", 0, "o1", length=10_000, padding_from=0, info=TEXT.info)


def test_merge_unites_touching_ranges_and_counts_repeats():
    assert merge([(10, 20), (0, 10), (15, 25), (30, 31), (31, 31)]) == ([[0, 25], [30, 31]], 5)
    assert merge([]) == ([], 0)


def test_an_update_of_packed_sequences_is_sent_as_token_ranges_with_their_identities():
    rec = recorder()
    first = TokenRanges([(0, 512), (512, 1024)], identities=[(4096, 4400), (0, 724)])
    second = TokenRanges([(1024, 1536)], identities=[(724, 1236)])
    rec.record(BatchTag([(TEXT, first, [0, 1])]))
    rec.record(BatchTag([(TEXT, second, [2]), (PAD, TokenRanges([(1536, 1600)]), [-1])]))
    rec.commit(1)
    (ev,) = rec.client.of("update_committed")
    spans = {bool(s.get("padding")): s for s in ev["spans"]}
    assert spans[False] == {"stratum": "text", "epoch": 0, "order": "o1",
                            "ranges": [[0, 1536]], "indices": [[0, 1236], [4096, 4400]]}
    assert spans[True]["ranges"] == [[1536, 1600]] and "indices" not in spans[True]
    assert (ev["tokens"], ev["samples"]) == (1536, 4)  # padding tokens never count
    assert rec.cursor() == [{"stratum": "text", "epoch": 0, "position": 1536}]


def test_a_token_range_fed_twice_in_one_update_is_counted_as_repeated():
    rec = recorder()
    rec.record(BatchTag([(TEXT, TokenRanges([(0, 512)], identities=[(0, 512)]), [0])]))
    rec.record(BatchTag([(TEXT, TokenRanges([(256, 768)], identities=[(256, 768)]), [1])]))
    rec.commit(1)
    (ev,) = rec.client.of("update_committed")
    assert ev["spans"][0]["ranges"] == [[0, 768]] and ev["repeated"] == 256
    assert ev["tokens"] == 1024


def test_a_group_without_identities_leaves_the_span_without_indices():
    rec = recorder()
    rec.record(BatchTag([(TEXT, TokenRanges([(0, 64)], identities=[(0, 64)]), [0])]))
    rec.record(BatchTag([(TEXT, TokenRanges([(64, 128)]), [1])]))
    rec.commit(1)
    (ev,) = rec.client.of("update_committed")
    assert ev["spans"] == [{"stratum": "text", "epoch": 0, "order": "o1", "ranges": [[0, 128]]}]


def test_the_attempt_declares_the_stratum_in_tokens():
    rec = recorder()
    rec.start()
    rec.record(BatchTag([(TEXT, TokenRanges([(512, 1024)], identities=[(0, 512)]), [1])]))
    (started,) = rec.client.of("attempt_started")
    assert started["sampler"]["units"] == {"text": "tokens"}
    assert started["sampler"]["epoch_length"] == {"text": 10_000}


def test_deferred_identities_are_resolved_where_the_update_is_sent():
    from recoverydash.sdk.tokens import DeferredIdentities, register_identities

    register_identities("test:doubles", lambda items: [(2 * i, 2 * i + 2) for i in items])
    rec = recorder()
    first = TokenRanges([(0, 2)], identities=DeferredIdentities("test:doubles", [5]))
    rec.record(BatchTag([(TEXT, first, [0])]))
    rec.record(BatchTag([(TEXT, TokenRanges([(2, 4)], identities=DeferredIdentities(
        "test:doubles", [6])), [1])]))
    rec.commit(1)
    (ev,) = rec.client.of("update_committed")
    assert ev["spans"][0]["indices"] == [[10, 14]]
    unknown = recorder()
    unknown.record(BatchTag([(TEXT, TokenRanges([(0, 2)], identities=DeferredIdentities(
        "test:nobody", [1])), [0])]))
    unknown.commit(1)
    assert "indices" not in unknown.client.of("update_committed")[0]["spans"][0]


def test_the_deferred_identities_of_one_key_are_resolved_in_one_call_per_update():
    """bench/sdk_overhead.py, packing: the sender resolves an update's deferred identities per
    key, not per group; what is sent is the same union."""
    from recoverydash.sdk.tokens import DeferredIdentities, register_identities

    calls = []
    register_identities("test:counted", lambda items: calls.append(list(items)) or [
        (10 * i, 10 * i + 10) for i in items])
    rec = recorder()
    for k in range(4):
        rec.record(BatchTag([(TEXT, TokenRanges([(10 * k, 10 * k + 10)], identities=(
            DeferredIdentities("test:counted", [k]))), [k])]))
    rec.record(BatchTag([(TEXT, TokenRanges([(40, 50)], identities=[(40, 50)]), [4])]))
    rec.commit(1)
    (ev,) = rec.client.of("update_committed")
    assert ev["spans"] == [{"stratum": "text", "epoch": 0, "order": "o1", "ranges": [[0, 50]],
                            "indices": [[0, 50]]}]
    assert calls == [[0, 1, 2, 3]]


def test_identities_are_unknown_when_one_group_of_the_key_has_none():
    from recoverydash.sdk.tokens import DeferredIdentities, identities_of_all, register_identities

    register_identities("test:tens", lambda items: [(10 * i, 10 * i + 10) for i in items])
    assert identities_of_all([[(5, 6)], DeferredIdentities("test:tens", [1, 2])]) == [
        (5, 6), (10, 20), (20, 30)]
    assert identities_of_all([[(5, 6)], None, DeferredIdentities("test:tens", [1])]) is None
    assert identities_of_all([DeferredIdentities("test:nobody", [1])]) is None
    assert identities_of_all([]) == []


def test_identities_of_one_source_are_made_when_first_read_and_pickle_as_items():
    import pickle

    from recoverydash.sdk.tokens import DeferredIdentities

    lazy = DeferredIdentities("k", source=2, samples=[7, 9])
    assert lazy.items == [(2, 7), (2, 9)]
    again = pickle.loads(pickle.dumps(DeferredIdentities("k", source=2, samples=[7, 9])))
    assert (type(again), again.key, again.items) == (DeferredIdentities, "k", [(2, 7), (2, 9)])
    assert DeferredIdentities("k").items == [] and DeferredIdentities("k", [(1, 2)]).items == [
        (1, 2)]
    assert TokenRanges([(3, 9), (20, 22), (0, 1)]).tokens() == 9
    assert (TokenRanges([(3, 9), (20, 22)]).highest(), TokenRanges([(3, 9), (0, 1)]).lowest()) \
        == (21, 0)
