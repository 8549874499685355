"""The COPY text ingest spells itself (``ingest.actions._copy_text``, ``_ledger_text``, the event
lines of ``_write_events``) stores what psycopg's ``write_row`` stored: values of every kind the
ingest tables take (strings with backslashes, tabs, newlines, quotes and non-ASCII; JSON text
with escapes; nulls; ints to 2**63 - 1; aware datetimes of any offset and microsecond) COPYed
both ways into one table read back equal; the ledger's and the events' lines equal the generic
spelling of the rows built before; the plain update_committed's stored text equals the general
one's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from django.db import connection
from hypothesis import given, settings
from hypothesis import strategies as st

from recoverydash.ingest import actions
from recoverydash.ingest.schemas import json_text, validate_events

texts = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                max_size=20) | st.sampled_from(["\\", "\\N", "\\.", "a\tb", "a\nb\r", "\\\\t"])
json_values = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 63, 2 ** 63 - 1)
                           | texts, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(texts, inner, max_size=3), max_leaves=8)
times = st.datetimes(min_value=datetime(1990, 1, 1), max_value=datetime(2100, 1, 1),
                     timezones=st.sampled_from([UTC, timezone(timedelta(hours=5,
                                                                                 minutes=30)),
                                                timezone(timedelta(hours=-8))]))
rows = st.lists(st.tuples(st.integers(-2 ** 63, 2 ** 63 - 1) | st.none(), texts | st.none(),
                          json_values.map(json_text), times | st.none()), min_size=1, max_size=6)


def _read(table: str) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT i, s, j::text, t FROM {table} ORDER BY k")
        return cursor.fetchall()


@pytest.mark.django_db
@settings(max_examples=150, deadline=None)
@given(rows)
def test_copy_text_stores_what_write_row_stored(values):
    if connection.vendor != "postgresql":
        pytest.skip("COPY is PostgreSQL's")
    with connection.cursor() as cursor:
        for table in ("a_rows", "b_rows"):
            cursor.execute(f"CREATE TEMP TABLE IF NOT EXISTS {table} (k serial, i bigint, s text, "
                           "j jsonb, t timestamptz)")
            cursor.execute(f"TRUNCATE {table}")
        with cursor.cursor.copy("COPY a_rows (i, s, j, t) FROM STDIN") as copy:
            for row in values:
                copy.write_row(row)
    actions._copy("b_rows", ("i", "s", "j", "t"), values)
    assert _read("b_rows") == _read("a_rows")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2 ** 40), st.integers(0, 9), st.integers(1, 2 ** 40),
                          st.integers(-1, 4096), st.integers(1, 64), st.integers(-99, 99),
                          times, st.lists(st.dictionaries(texts, json_values, max_size=3),
                                          min_size=1, max_size=2),
                          st.none() | st.integers(0, 2 ** 62), st.none() | st.integers(0, 9)),
                max_size=5), st.integers(1, 2 ** 40))
def test_ledger_lines_are_the_generic_spelling_of_the_rows(rows_, seq):
    pending = {r[:5]: {"shift": r[5], "time": r[6], "spans": r[7], "samples": r[8],
                       "tokens": r[9]} for r in rows_}
    seqs = {key[0]: seq for key in pending}
    generic = actions._copy_text(key + (e["shift"], e["time"], json_text(e["spans"]),
                                        e["samples"], e["tokens"], seq, seq)
                                 for key, e in pending.items())
    assert actions._ledger_text(pending, seqs) == generic


_EXTRA = st.dictionaries(st.sampled_from(["ids_digest", "x-note", "update", "order", "rank"]),
                         json_values, max_size=2)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2 ** 40), st.none() | st.integers(0, 4095), _EXTRA, texts)
def test_event_lines_are_the_generic_spelling_of_the_rows(update, rank, extra, suffix):
    body = {"event_id": f"e{suffix}", "type": "update_committed", "run_id": "r", "attempt": 1,
            "time": "2026-11-01T00:00:05.250+05:30", "update": update, "samples": 4,
            "spans": [{"stratum": "m", "epoch": 0, "ranges": [[0, 4]]}]}
    if rank is not None:
        body["rank"] = rank
    body.update(extra)
    try:
        (ev,) = validate_events([body])
    except Exception:  # noqa: BLE001 - an extra the wire refuses: nothing to compare
        return
    # the plain update_committed's text is the general path's
    assert actions._stored_text(ev) == json_text(actions.stored_body(ev.model.type, ev.body))

    class Run:
        pk = 7

    now = datetime(2026, 12, 1, 23, 0, 0, 123456, tzinfo=UTC)
    sent = {}
    real = actions._copy_lines
    actions._copy_lines = lambda table, columns, text: sent.update(text=text, columns=columns)
    vendor = connection.vendor
    try:
        connection.vendor = "postgresql"
        actions._write_events({"r": Run()}, {7: 99}, [ev], now)
    finally:
        connection.vendor = vendor
        actions._copy_lines = real
    generic = actions._copy_text([(7, ev.model.event_id, ev.model.type, ev.model.attempt,
                                   ev.model.rank, ev.model.time, now, 99, ev.content_hash,
                                   actions._stored_text(ev))])
    assert sent == {"text": generic, "columns": actions._EVENT_COLUMNS}


@pytest.mark.django_db
@settings(max_examples=150, deadline=None)
@given(st.lists(texts | st.none() | json_values.map(json_text), max_size=6),
       st.lists(times | st.none(), max_size=4))
def test_array_literals_read_back_as_the_values(values, when):
    if connection.vendor != "postgresql":
        pytest.skip("array parameters are PostgreSQL's")
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::text[], %s::timestamptz[], %s::bigint[]",
                       [actions._texts(values), actions._texts(map(actions._time_or_none, when)),
                        actions._ints(range(-3, len(values)))])
        texts_back, times_back, ints_back = cursor.fetchone()
    assert texts_back == values
    assert times_back == when
    assert ints_back == list(range(-3, len(values)))
