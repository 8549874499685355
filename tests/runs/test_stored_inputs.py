"""``Analysis.inputs`` (runs.analysis.StoredInputs, format 4): the head read back equals what
was written; a generation whose chunk is not read (``StoredGeneration``) answers what the core
reads of it exactly as the full record does, reading its entry only for the heavy fields;
another format is read as None, and format 3 loads with every entry."""
from __future__ import annotations

import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from recoverydash.recovery.generations import repeat_row
from recoverydash.runs.analysis import StoredGeneration, StoredInputs, _generation_record, _light
from tests.state_formats import inputs_format_3

obj = st.fixed_dictionaries({
    "uri": st.text(min_size=1, max_size=4), "component": st.sampled_from(["model", "optimizer",
                                                                          "rng"]),
    "shard": st.sampled_from(["rank0", "rank1"]),
    "sha256": st.sampled_from(["a" * 64, "b" * 64, "c" * 64])})
manifest = st.fixed_dictionaries({
    "schema_revision": st.just(1), "update": st.one_of(st.integers(0, 9), st.none()),
    "attempt": st.integers(0, 2), "world_size": st.integers(1, 4),
    "committed_at": st.just("2026-11-01T00:00:05Z"), "objects": st.lists(obj, max_size=3),
    "required_shards": st.just(["rank0"]), "components": st.just(["model"]),
    "adopted": st.one_of(st.just({"format": "dcp"}), st.none())})
entry = st.fixed_dictionaries({
    "generation_id": st.text(min_size=1, max_size=8), "attempt": st.integers(0, 5),
    "update": st.one_of(st.none(), st.integers(0, 10**6)),
    "started_at": st.one_of(st.none(), st.floats(0, 1e9)),
    "required_shards": st.just([]), "components": st.just([]),
    "shards": st.one_of(st.just({}), st.just({"rank0": {"update": 3, "objects": [],
                                                          "time": None}})),
    "committed_at": st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False)),
    "object_checks": st.just({}),
    "manifests": st.lists(manifest, max_size=2)})


def _clean(e: dict) -> dict:
    e = dict(e, manifests=[{k: v for k, v in m.items() if v is not None} for m in e["manifests"]])
    return e


@settings(max_examples=200, deadline=None)
@given(entry)
def test_a_stored_generation_answers_as_the_full_record(e):
    e = _clean(e)
    full = _generation_record(e)
    loads = []
    lazy = StoredGeneration(_light(e), lambda: loads.append(1) or e)
    for name in ("generation_id", "attempt", "update", "started_at", "committed_at"):
        assert getattr(lazy, name) == getattr(full, name)
    assert lazy.conflicting() == full.conflicting()
    assert lazy.has_shards() == full.has_shards()
    assert lazy.state_update() == full.state_update()
    assert lazy.commit_time() == full.commit_time()
    head = full.manifest()
    assert lazy.manifest_head() == (None if head is None else {
        k: v for k, v in head.items() if k not in ("objects", "required_shards", "components")})
    assert loads == []
    assert repeat_row(lazy) == repeat_row(full)
    assert lazy.manifest() == full.manifest() and lazy.shards == full.shards
    assert len(loads) <= 1


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(st.integers(1, 200), entry, max_size=30))
def test_the_head_reads_back_and_format_3_loads_every_entry(generations):
    generations = {pk: _clean(e) for pk, e in generations.items()}
    attempts = {0: {"attempt": {"attempt": 0}, "restore": None}}
    statuses = {pk: ["restorable", []] for pk in generations}
    judged = {pk: {"notes": [], "before": [], "storage": [], "soft": [], "unchecked": False}
              for pk in list(generations)[::2]}
    old = StoredInputs.from_bytes(inputs_format_3(attempts, generations, statuses, judged,
                                                  ["model"]))
    assert old.entries == generations and old.replace
    assert old.light == {pk: _light(e) for pk, e in generations.items()}
    assert (old.attempts, old.statuses, old.judged, old.judged_for) == \
        (attempts, statuses, judged, ["model"])
    old.repeats = {"basis": {"top": 3, "told": False, "optimizer": None, "changed": True},
                   "sigs": {pk: None for pk in generations}, "found": {}}
    back = StoredInputs.from_bytes(old.to_bytes())
    assert (back.attempts, back.light, back.statuses, back.judged, back.judged_for,
            back.repeats) == (old.attempts, old.light, old.statuses, old.judged,
                              old.judged_for, old.repeats)
    assert back.entries == {} and not back.replace


def test_another_format_is_read_as_none():
    old = zlib.compress(b'{"format":2,"attempts":{},"generations":{},"statuses":{}}')
    assert StoredInputs.from_bytes(old) is None
    assert StoredInputs.from_bytes(b"RDI3\x00\x00\x00\x05junk!") is None
    assert StoredInputs.from_bytes(b"RDI4junk") is None
    assert StoredInputs.from_bytes(b"RDI4" + zlib.compress(b'{"format": 5}')) is None
    assert StoredInputs.from_bytes(b"") is None
