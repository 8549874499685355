"""``Analysis.inputs`` (runs.analysis.StoredInputs, format 3): a head and chunks of generation
entries; what is read back equals what was written, and a copy whose chunks were partly kept as
read (their entries not replaced) writes the same bytes as one encoding every chunk afresh."""
from __future__ import annotations

import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from recoverydash.runs.analysis import GENERATION_CHUNK, StoredInputs

entry = st.fixed_dictionaries({
    "generation_id": st.text(min_size=1, max_size=8), "attempt": st.integers(0, 5),
    "update": st.one_of(st.none(), st.integers(0, 10**6)),
    "committed_at": st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False)),
    "manifests": st.lists(st.dictionaries(st.text(max_size=4), st.integers()), max_size=2)})


def copy_of(generations: dict, judged: dict) -> StoredInputs:
    return StoredInputs({0: {"attempt": {"attempt": 0}, "restore": None}}, dict(generations),
                        {pk: ["restorable", []] for pk in generations}, dict(judged),
                        ["model"])


def fields(inputs: StoredInputs) -> tuple:
    return (inputs.attempts, inputs.generations, inputs.statuses, inputs.judged,
            inputs.judged_for)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.integers(1, 4 * GENERATION_CHUNK), entry, max_size=60),
       st.dictionaries(st.integers(1, 4 * GENERATION_CHUNK), entry, max_size=10))
def test_kept_chunks_write_the_bytes_of_a_fresh_encoding(generations, replaced):
    judged = {pk: {"notes": [], "before": [], "storage": [], "soft": [], "unchecked": False}
              for pk in list(generations)[::2]}
    blob = copy_of(generations, judged).to_bytes()
    read = StoredInputs.from_bytes(blob)
    assert fields(read) == fields(copy_of(generations, judged))
    # replace some entries as read_changes does (the chunk's kept bytes dropped)
    for pk, value in replaced.items():
        read.generations[pk] = value
        read.judged.pop(pk, None)
        read._raw.pop(pk // GENERATION_CHUNK, None)
    after = {**generations, **replaced}
    fresh = copy_of(after, {pk: j for pk, j in judged.items() if pk not in replaced})
    fresh.statuses = read.statuses
    assert read.to_bytes() == fresh.to_bytes()
    assert fields(StoredInputs.from_bytes(read.to_bytes())) == fields(fresh)


def test_another_format_is_read_as_none():
    old = zlib.compress(b'{"format":2,"attempts":{},"generations":{},"statuses":{}}')
    assert StoredInputs.from_bytes(old) is None
    assert StoredInputs.from_bytes(b"RDI3\x00\x00\x00\x05junk!") is None
    assert StoredInputs.from_bytes(b"") is None
