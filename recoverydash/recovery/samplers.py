"""Orders the server re-creates (docs/definitions.md#re-created-orders): the sample identities of
the positions of a PyTorch ``DistributedSampler`` order, derived from the order itself.

A span under a named order carries its sample identities (``indices``, docs/ingest-v1.md
section 3) so that an epoch consumed under several orders is compared by sample. The SDK sends
none under a ``DistributedSampler`` order: its name, :func:`order_digest`, is a sha256 over the
sampler's settings, and the attempt's ``sampler`` declares them (``algorithm``, ``seed``,
``shuffle``, ``epoch_length`` of the stratum). When those settings hash to the order's name
(:func:`recreated_order`), the index list is re-created here exactly as torch makes it::

    g = torch.Generator(); g.manual_seed(seed + epoch)
    indices = torch.randperm(n, generator=g).tolist() if shuffle else list(range(n))
    # padded by repeating its head to total_size (drop_last False), or cut to it (True)
    indices[rank:total_size:num_replicas]          # rank r's share

and position ``p`` (below ``n``) of the epoch held dataset index ``indices[p]`` whatever the
world size (:func:`distributed_indices` re-creates a rank's share, for the tests against torch).

``torch.randperm(n)`` on CPU (``aten/src/ATen/native/TensorFactories.cpp: randperm_cpu``), for
``n < 2**32 // 20``: ``r = [0, ..., n-1]``, then for ``i`` in ``0 .. n-2``: ``z = random() %
(n - i)``, swap ``r[i]`` and ``r[i + z]``, where ``random()`` is the next 32-bit output of the
generator's MT19937, seeded by ``manual_seed(s)`` with ``s mod 2**32`` (``init_genrand``; a
negative seed as its two's complement). Larger ``n`` take another branch (64-bit draws), which is
not re-created: :func:`randperm` raises and :func:`recreated_order` declines, so those orders stay
``unverified``. The MT19937 words come from the standard library's ``random.Random`` (the same
generator, its state set to ``init_genrand(s)``), checked against the reference output at import;
a pure-Python generator stands in when the check fails. Pure Python, standard library only.

Cost (``bench/recreated_orders.py``): one permutation of 10**6 is 0.36 s, memoized per
``(n, seed)`` (:func:`randperm`, up to ``CACHE_ELEMENTS`` indices in all); an epoch longer than
``RECREATED_LENGTH_LIMIT`` is not re-created (its samples stay unknown).
"""
from __future__ import annotations

import hashlib
import json
import random
import sys
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from threading import Lock

from pyroaring import BitMap64

SAMPLER_ALGORITHM = "torch.utils.data.DistributedSampler"
"""``attempt_started.sampler.algorithm`` of a ``DistributedSampler`` order."""

RANDPERM_LIMIT = 0xFFFFFFFF // 20
"""``torch.randperm`` on CPU draws ``random() % (n - i)`` for ``n`` below this (214,748,364):
the branch :func:`randperm` re-creates."""

RECREATED_LENGTH_LIMIT = 2 ** 24
"""The longest shuffled epoch (16,777,216 samples) whose order the core re-creates
(:meth:`RecreatedOrder.identities`): 12 s on the loaded 2-core development machine and 134 MB
(the words are drawn 65,536 at a time; 155 MB peak RSS of the process) once per ``(n, seed)``;
a longer one's samples stay unknown."""

CACHE_ELEMENTS = 2 ** 24
"""Memoized permutations hold at most this many indices in all (8 bytes each), newest kept."""

_MT_N = 624
_CACHE: OrderedDict = OrderedDict()
_CACHE_LOCK = Lock()


def order_digest(*, seed: int, epoch: int, dataset_length: int, shuffle: bool,
                 dataset_version: str | None = None,
                 algorithm: str = SAMPLER_ALGORITHM) -> str:
    """The name of one epoch's order: the first 32 hex chars of sha256 over the canonical JSON
    (sorted keys, no spaces) of ``{"algorithm", "dataset_length", "dataset_version", "epoch",
    "seed", "shuffle"}``; the SDK's ``recoverydash.sdk.ledger.order_digest``, the same text
    (``tests/recovery/test_recreated_orders.py`` holds one against the other)."""
    doc = {"algorithm": algorithm, "dataset_length": int(dataset_length),
           "dataset_version": dataset_version, "epoch": int(epoch), "seed": int(seed),
           "shuffle": bool(shuffle)}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
                          ).hexdigest()[:32]


def torch_seed(seed: int) -> int:
    """The 32-bit MT19937 seed of ``torch.Generator().manual_seed(seed)``: ``seed mod 2**32``
    (a negative seed is taken as its 64-bit two's complement, whose low 32 bits are the same).
    Raises ValueError outside ``[-2**63, 2**64)``, which torch refuses."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"a seed is an int, not {type(seed).__name__}")
    if not -2 ** 63 <= seed < 2 ** 64:
        raise ValueError(f"seed {seed} is outside [-2**63, 2**64), which torch refuses")
    return seed & 0xFFFFFFFF


def _init_genrand(seed32: int) -> list[int]:
    """MT19937's ``init_genrand``: the 624 state words of a 32-bit seed."""
    state = [seed32]
    last = seed32
    for j in range(1, _MT_N):
        last = (1812433253 * (last ^ (last >> 30)) + j) & 0xFFFFFFFF
        state.append(last)
    return state


def _chunks_stdlib(seed32: int, count: int, chunk: int) -> Iterator[array]:
    """``count`` MT19937 outputs of ``seed32`` from ``random.Random`` (its state set so), in
    arrays of at most ``chunk`` words (a call takes exactly its words: ``chunk`` whole words)."""
    gen = random.Random()
    gen.setstate((3, (*_init_genrand(seed32), _MT_N), None))
    while count > 0:
        k = min(chunk, count)
        out = array("I")  # getrandbits fills 32-bit words least significant first: in order
        out.frombytes(gen.getrandbits(32 * k).to_bytes(4 * k, "little"))
        if sys.byteorder != "little":  # pragma: no cover
            out.byteswap()
        count -= k
        yield out


def _chunks_python(seed32: int, count: int, chunk: int) -> Iterator[array]:
    """``count`` MT19937 outputs of ``seed32`` (the reference algorithm, in Python), in arrays
    of at most ``chunk`` words."""
    mt = _init_genrand(seed32)
    out = array("I")
    index = _MT_N
    for _ in range(count):
        if index >= _MT_N:
            for k in range(_MT_N):
                y = (mt[k] & 0x80000000) | (mt[(k + 1) % _MT_N] & 0x7FFFFFFF)
                mt[k] = mt[(k + 397) % _MT_N] ^ (y >> 1) ^ (0x9908B0DF if y & 1 else 0)
            index = 0
        y = mt[index]
        index += 1
        y ^= y >> 11
        y ^= (y << 7) & 0x9D2C5680
        y ^= (y << 15) & 0xEFC60000
        y ^= y >> 18
        out.append(y)
        if len(out) == chunk:
            yield out
            out = array("I")
    if out:
        yield out


def _words_stdlib(seed32: int, count: int, chunk: int = 1 << 16) -> array:
    out = array("I")
    for part in _chunks_stdlib(seed32, count, chunk):
        out.extend(part)
    return out


def _words_python(seed32: int, count: int, chunk: int = 1 << 16) -> array:
    out = array("I")
    for part in _chunks_python(seed32, count, chunk):
        out.extend(part)
    return out


def mt19937_words(seed32: int, count: int, chunk: int = 1 << 16) -> Iterator[array]:
    """The first ``count`` outputs (32-bit words) of MT19937 seeded with ``init_genrand(seed32)``
    (``seed32`` in ``[0, 2**32)``), as torch's CPU generator draws them with ``random()``: in
    arrays of at most ``chunk`` words, so that only a chunk is held at a time."""
    return _CHUNKS(seed32, count, chunk)


def _pick_chunks():
    # 5489 is MT19937's reference seed; its 1st and 10,000th outputs are published
    sample = _words_stdlib(5489, 10_000, 4_096)
    if sample[0] == 3499211612 and sample[-1] == 4123659995:
        return _chunks_stdlib
    return _chunks_python  # pragma: no cover (an interpreter whose random is not MT19937)


_CHUNKS = _pick_chunks()


def randperm(n: int, seed: int) -> array:
    """``torch.randperm(n, generator=torch.Generator().manual_seed(seed))`` on CPU, as an
    ``array('Q')`` of the ``n`` dataset indices (module doc: the algorithm). Memoized per
    ``(n, seed mod 2**32)``, the newest first, up to ``CACHE_ELEMENTS`` indices in all
    (:func:`clear_cache` empties it); callers must not mutate the result. Raises ValueError for
    ``n < 0``, for ``n >= RANDPERM_LIMIT`` (torch's 64-bit branch, not re-created) and for a
    seed torch refuses (:func:`torch_seed`)."""
    if n < 0:
        raise ValueError(f"randperm of a negative length {n}")
    if n >= RANDPERM_LIMIT:
        raise ValueError(f"randperm of {n} >= {RANDPERM_LIMIT} takes torch's 64-bit branch, "
                         "which is not re-created")
    seed32 = torch_seed(seed)
    key = (n, seed32)
    with _CACHE_LOCK:
        found = _CACHE.get(key)
        if found is not None:
            _CACHE.move_to_end(key)
            return found
    out = array("Q", range(n))
    start = 0  # draw i (0 <= i < n - 1) swaps items i and i + word % (n - i)
    for words in mt19937_words(seed32, max(0, n - 1)):
        k = len(words)
        for i, m, x in zip(range(start, start + k), range(n - start, n - start - k, -1), words,
                           strict=True):
            z = x % m + i
            t = out[z]
            out[z] = out[i]
            out[i] = t
        start += k
    if n <= CACHE_ELEMENTS:
        with _CACHE_LOCK:
            _CACHE[key] = out
            held = sum(len(v) for v in _CACHE.values())
            while held > CACHE_ELEMENTS:
                held -= len(_CACHE.popitem(last=False)[1])
    return out


def clear_cache() -> None:
    """Forget every memoized permutation (:func:`randperm`)."""
    with _CACHE_LOCK:
        _CACHE.clear()


def padded_length(dataset_length: int, num_replicas: int, drop_last: bool) -> int:
    """``DistributedSampler.total_size``: positions of one epoch's index list, over all ranks."""
    n, w = dataset_length, num_replicas
    if drop_last and n % w != 0:
        per_rank = -(-(n - w) // w)
    else:
        per_rank = -(-n // w)
    return per_rank * w


def distributed_indices(dataset_length: int, *, seed: int, epoch: int, shuffle: bool,
                        drop_last: bool, num_replicas: int, rank: int) -> list[int]:
    """``list(iter(DistributedSampler(dataset_of_length_n, num_replicas, rank, shuffle, seed,
    drop_last)))`` after ``set_epoch(epoch)``: rank ``rank``'s dataset indices of the epoch, in
    the order it draws them (module doc). Raises ValueError as :func:`randperm`, and for
    ``num_replicas < 1`` or a rank outside ``[0, num_replicas)`` (torch's own refusal)."""
    if num_replicas < 1 or not 0 <= rank < num_replicas:
        raise ValueError(f"rank {rank} of {num_replicas} replicas")
    n = dataset_length
    order = list(randperm(n, seed + epoch)) if shuffle else list(range(n))
    total = padded_length(n, num_replicas, drop_last)
    if total > n and order:
        pad = total - n
        order += order[:pad] if pad <= n else (order * -(-pad // n))[:pad]
    else:
        order = order[:total]
    return order[rank:total:num_replicas]


@dataclass(frozen=True)
class RecreatedOrder:
    """One epoch's ``DistributedSampler`` order: its dataset length ``n``, seed, epoch and
    shuffle. Position ``p < n`` holds dataset index ``randperm(n, seed + epoch)[p]`` (``p``
    unshuffled), whatever the world size and ``drop_last`` (they change only the tail past
    ``n``: padding, which the ledger keeps apart)."""

    dataset_length: int
    seed: int
    epoch: int
    shuffle: bool

    def identities(self, positions: Iterable[int], prefix: int = 0) -> BitMap64 | None:
        """The dataset indices held by ``positions`` (ints) and by ``[0, prefix)`` (a
        pre-tracking cursor's interval), a BitMap64; None when a position is ``>= n`` (not a
        position of the permutation: an overrun), when ``n`` is above
        ``RECREATED_LENGTH_LIMIT`` (shuffled), or when :func:`randperm` refuses."""
        n = self.dataset_length
        bitmap = positions if isinstance(positions, BitMap64) else BitMap64(positions)
        if prefix > n or (bitmap and bitmap.max() >= n):
            return None
        if not self.shuffle:
            out = BitMap64(bitmap)
            out.add_range(0, prefix)
            return out
        if n > RECREATED_LENGTH_LIMIT:
            return None
        try:
            perm = randperm(n, self.seed + self.epoch)
        except ValueError:
            return None
        out = BitMap64(perm[:prefix])
        out.update(map(perm.__getitem__, bitmap))
        return out


def recreated_order(order: str | None, stratum: str, epoch: int,
                    attempts: Iterable) -> RecreatedOrder | None:
    """The :class:`RecreatedOrder` named ``order`` in ``(stratum, epoch)``, from the first of
    ``attempts`` (:class:`~.inputs.AttemptRecord`) whose declared settings name it: ``sampler``
    with ``algorithm`` ``torch.utils.data.DistributedSampler``, an int ``seed``, a bool
    ``shuffle`` and an int ``epoch_length`` of ``stratum``, whose :func:`order_digest` (with the
    attempt's ``dataset_version``, or none: the SDK names an order with the version its sampler
    was given) equals ``order``. None when no attempt does: the order is not re-created."""
    if not isinstance(order, str):
        return None
    for record in attempts:
        sampler = record.sampler or {}
        seed, shuffle = sampler.get("seed"), sampler.get("shuffle")
        length = (sampler.get("epoch_length") or {}).get(stratum) \
            if isinstance(sampler.get("epoch_length"), dict) else None
        if sampler.get("algorithm") != SAMPLER_ALGORITHM or type(seed) is not int \
                or type(shuffle) is not bool or type(length) is not int or length < 0:
            continue
        for version in dict.fromkeys((record.dataset_version, None)):
            if order_digest(seed=seed, epoch=epoch, dataset_length=length, shuffle=shuffle,
                            dataset_version=version) == order:
                return RecreatedOrder(length, seed, epoch, shuffle)
    return None
