"""Ingest's own COPY text spelling (``ingest.actions._copy_text``, ``_ledger_text``, the event
lines of ``_write_events``), attacked through the real HTTP API with an ingest token: events
whose strings (event ids, strata, sample ids, unknown fields and their keys, nested) hold tab,
newline, carriage return, backslash, ``\\N``, ``\\.``, form feed, non-BMP characters, and whose
numbers reach int64's limits (and beyond, in unknown fields), are answered 202 and read back
exactly as sent (each Event row's body is ``stored_body`` of what was sent, every rank's ledger
report is given back by ``LedgerRow.parts``, a heartbeat's cursors as sent), or 400 (NUL, lone
surrogates) storing nothing; never a 500, never a row of another run or project."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ingest_support import event, post, update

from recoverydash.ingest.actions import stored_body
from recoverydash.runs.models import Event, Heartbeat, LedgerRow, Run

pytestmark = pytest.mark.django_db(transaction=True)

_SPECIAL = ["\\", "\\N", "\\.", "\t", "\n", "\r", "\r\n", "\\t", "\\\\", "\f", "\b", "\v",
            "\x7f", "\u2028", "𝄞", "é", '"', "'", ",", "|", "{", "}", "\x1b"]
texts = st.lists(st.sampled_from(_SPECIAL) | st.text(st.characters(
    blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=3),
    min_size=1, max_size=5).map("".join)
ints = st.sampled_from([0, -1, 2 ** 63 - 1, -2 ** 63, 2 ** 64, -2 ** 64 - 1, 10 ** 30]) \
    | st.integers(-2 ** 70, 2 ** 70)
leaves = st.none() | st.booleans() | ints | texts \
    | st.floats(allow_nan=False, allow_infinity=False, width=64)
json_values = st.recursive(leaves, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(texts, inner, max_size=3), max_leaves=6)
extras = st.dictionaries(texts.map(lambda s: "x" + s), json_values, max_size=2)
sample_ids = st.lists(st.integers(0, 2 ** 63 - 1) | texts, min_size=1, max_size=4, unique=True)

_counter = iter(range(10 ** 9))


def _numbers(value):
    """``value`` with every number as its decimal value (jsonb keeps a float's shortest spelling
    as a numeric: 5.247321412281742e+16 reads back as the int 52473214122817420, whichever way
    the text was sent)."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return Decimal(repr(value))
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    return {k: _numbers(v) for k, v in value.items()}


def _nid(prefix: str) -> str:
    return f"{prefix}-{next(_counter)}"


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(strata=st.lists(texts, min_size=1, max_size=3, unique=True), extra=extras,
       part_extra=extras, ids=sample_ids, positions=st.sampled_from([0, 2 ** 63 - 9]),
       world=st.integers(1, 4), audit_ids=sample_ids)
def test_nasty_events_read_back_as_sent(client, ingest_token, other_token, strata, extra,
                                        part_extra, ids, positions, world, audit_ids):
    run_id = _nid("cp")
    # a run of the same run_id in another project, which nothing here may touch
    assert post(client, other_token, [update(_nid("o"), 1, run_id=run_id)]).status_code == 202
    other = Run.objects.get(project__name="beta", run_id=run_id)
    other_rows = sorted(LedgerRow.objects.filter(run=other).values_list("id", "spans"))
    per_rank = [update(_nid("u"), 1, rank=r, run_id=run_id, samples=8,
                       time="2026-11-01T00:00:05.250+05:30",
                       spans=[{"stratum": s, "epoch": 0,
                               "ranges": [[positions + r, positions + 8, world]]}
                              for s in strata], **extra)
                for r in range(world)]
    with_ids = update(_nid("i"), 2, rank=0, run_id=run_id,
                      spans=[{"stratum": strata[0] + "\tids", "epoch": 1, "ids": ids}], **extra)
    aggregate = event("update_aggregate", _nid("a"), run_id=run_id, update=3, rank=None,
                      ranks=[{"rank": r, "samples": 2, **(part_extra if r == 0 else {}),
                              "spans": [{"stratum": strata[-1], "epoch": 0,
                                         "ranges": [[r, 16, world]]}]} for r in range(world)],
                      **extra)
    beat = event("heartbeat", _nid("h"), run_id=run_id, update=3, rank=0,
                 fetched=[{"stratum": s, "epoch": 0, "position": positions} for s in strata],
                 **extra)
    audit = event("audit_window", _nid("w"), run_id=run_id, update=3, rank=0, accum_slot=0,
                  sample_ids=audit_ids, **extra)
    sent = per_rank + [with_ids, aggregate, beat, audit]
    answer = post(client, ingest_token, sent)
    assert answer.status_code in (202, 400), (answer.status_code, answer.content[:300])
    run = Run.objects.filter(project__name="alpha", run_id=run_id).first()
    if answer.status_code == 400:
        assert run is None or not run.events.exists(), answer.content[:300]
        return
    wire = json.loads(json.dumps(sent))  # what the server parsed
    stored = {e.event_id: e for e in Event.objects.filter(run=run)}
    assert set(stored) == {ev["event_id"] for ev in wire}
    for ev in wire:
        row = stored[ev["event_id"]]
        assert row.type == ev["type"]
        assert _numbers(row.body) == _numbers(stored_body(ev["type"], ev)), ev["event_id"]
    reports: dict[tuple[int, int], list] = {}
    for row in LedgerRow.objects.filter(run=run):
        for rank, spans in row.parts():
            reports.setdefault((row.update, rank), []).extend(spans)
    want: dict[tuple[int, int], list] = {}
    for ev in wire:
        if ev["type"] == "update_committed":
            want.setdefault((ev["update"], ev["rank"]), []).extend(ev["spans"])
        elif ev["type"] == "update_aggregate":
            for part in ev["ranks"]:
                want.setdefault((ev["update"], part["rank"]), []).extend(part["spans"])
    assert reports == want
    (hb,) = Heartbeat.objects.filter(run=run)
    assert hb.fetched == beat["fetched"]
    assert sorted(LedgerRow.objects.filter(run=other).values_list("id", "spans")) == other_rows
    assert other.events.count() == 1


def _nul_bodies(bad: str) -> list[tuple[str, dict]]:
    def spans(stratum="main", ids=None):
        span = {"stratum": stratum, "epoch": 0}
        span.update({"ids": ids} if ids is not None else {"ranges": [[0, 4]]})
        return [span]

    return [
        ("extra value", update(_nid("z"), 1, note=bad)),
        ("extra key", update(_nid("z"), 1, **{"x" + bad: 1})),
        ("nested key", update(_nid("z"), 1, note={"a": [{"k" + bad: 1}]})),
        ("nested value", update(_nid("z"), 1, note={"a": [1, ["v" + bad]]})),
        ("stratum", update(_nid("z"), 1, spans=spans("m" + bad))),
        ("sample id", update(_nid("z"), 1, spans=spans("ids", ["s" + bad]))),
        ("aggregate part extra", event("update_aggregate", _nid("z"), update=1, rank=0,
                                       ranks=[{"rank": 0, "spans": spans(), "x": bad}])),
        ("aggregate part key", event("update_aggregate", _nid("z"), update=1, rank=0,
                                     ranks=[{"rank": 0, "spans": spans(), "x" + bad: 1}])),
        ("heartbeat cursor stratum", event("heartbeat", _nid("z"), update=1, rank=0,
                                           fetched=[{"stratum": bad, "epoch": 0,
                                                     "position": 1}])),
        ("audit sample id", event("audit_window", _nid("z"), update=1, rank=0, accum_slot=0,
                                  sample_ids=[bad])),
        ("shard object uri", event("shard_written", _nid("z"), rank=0, generation_id="g",
                                   shard="rank0", update=1,
                                   objects=[{"uri": "mem://b/" + bad, "shard": "rank0",
                                             "component": "model", "size": 1}])),
    ]


@pytest.mark.parametrize("bad", ["\x00", "\ud800", "a\udfffb"])
def test_nul_and_lone_surrogates_anywhere_are_400_storing_nothing(client, ingest_token, bad):
    """A NUL character (PostgreSQL's text and jsonb cannot hold it) or a lone surrogate (no
    UTF-8 spelling) in any string or key that would reach a COPYed column: 400, nothing stored
    (never a 500 from COPY)."""
    for name, body in _nul_bodies(bad):
        answer = post(client, ingest_token, [body])
        assert answer.status_code == 400, (name, answer.status_code, answer.content[:200])
    assert not Event.objects.exists()
