"""The run's new heartbeats reduced by the database before they reach the core's fold.

The analysis folds the heartbeats whose ``seq`` lies in ``(since, upto]`` into the stored state
(``recovery.heartbeats.HeartbeatFold``). The fold keeps of them only per rank its latest
heartbeat, per cursor key the furthest position, how many there were and every ``stride``-th as a
chart point, so on PostgreSQL the rows are grouped first (:func:`reduced_beats`: three queries
returning a row per distinct ``fetched`` list, per rank and per chart point, never one per
heartbeat; no JSON taken apart by the database) and handed to ``HeartbeatFold.absorb_reduced``,
whose result equals folding every row in ``(seq, id)`` order whatever the rows hold
(tests/runs/test_reduced_beats.py pins it). Other vendors fold the rows one by one.
"""
from __future__ import annotations

import json

from django.db import connection

from recoverydash.runs.models import Heartbeat

_WHERE = "run_id = %s AND seq > %s AND seq <= %s"


def reduced_beats(run_pk: int, since: int, upto: int, fold) -> dict | None:
    """What :meth:`HeartbeatFold.absorb_reduced` takes, per attempt, of run ``run_pk``'s
    heartbeats whose ``seq`` is in ``(since, upto]`` as PostgreSQL groups them, the chart points
    those ``fold`` (the state they are to be folded into) keeps: ``{attempt: (count, last,
    cursors, points)}`` in the order of each attempt's first heartbeat by ``(seq, id)``.
    ``last``: per rank its latest heartbeat by time (ties: the last by ``(seq, id)``) as ``(rank,
    POSIX seconds, update)``, ranks in the order of their first heartbeat; ``cursors``: the
    cursors of each distinct ``fetched`` text in the order of its first heartbeat; ``points``
    ``(offset, time, rank, update, fetched)`` of the offsets ``fold.chart_rule`` keeps (read by
    that rule, checked against ``fold.chart_offsets``). None when they are not those (rows
    deleted meanwhile): the caller folds the rows one by one."""
    table = Heartbeat._meta.db_table
    params = [run_pk, since, upto]
    out: dict = {}
    with connection.cursor() as cursor:
        cursor.execute(
            'SELECT attempt, fetched::text, count(*), min(ARRAY[seq, id]) '
            f'FROM "{table}" WHERE {_WHERE} GROUP BY attempt, fetched::text ORDER BY 4', params)
        groups = cursor.fetchall()
        if not groups:
            return out
        texts = json.loads("[" + ",".join(g[1] or "null" for g in groups) + "]")
        for (attempt, _, count, _), fetched in zip(groups, texts, strict=True):
            held = out.setdefault(attempt, [0, [], [], []])
            held[0] += count
            held[2] += list(fetched or [])
        cursor.execute(
            'SELECT attempt, rank, (min(ARRAY[seq, id]))[1], (min(ARRAY[seq, id]))[2], '
            '(max(ARRAY[extract(epoch from time), seq, id, "update"]))[1]::float8, '
            '(max(ARRAY[extract(epoch from time), seq, id, "update"]))[4]::bigint '
            f'FROM "{table}" WHERE {_WHERE} GROUP BY attempt, rank', params)
        for attempt, rank, _, _, when, update in sorted(cursor.fetchall(),
                                                           key=lambda r: (r[2], r[3])):
            out[attempt][1].append((rank, when, update))
        rules = [(a, *fold.chart_rule(a, held[0])) for a, held in out.items()]
        cursor.execute(
            'SELECT t.attempt, t.o, extract(epoch from h.time)::float8, h.rank, h."update", '
            'h.fetched::text FROM (SELECT id, attempt, row_number() OVER (PARTITION BY attempt '
            f'ORDER BY seq, id) - 1 AS o FROM "{table}" WHERE {_WHERE}) t '
            'JOIN unnest(%s::int[], %s::bigint[], %s::bigint[]) AS k(a, seen, stride) '
            f'ON t.attempt = k.a JOIN "{table}" h ON h.id = t.id '
            'WHERE mod(k.seen + t.o, k.stride) = 0 ORDER BY t.attempt, t.o',
            params + [list(column) for column in zip(*rules, strict=True)])
        rows = cursor.fetchall()
        wanted = sorted((a, o) for a, held in out.items() for o in fold.chart_offsets(a, held[0]))
        if [(a, o) for a, o, *_ in rows] != wanted:
            return None
        texts = json.loads("[" + ",".join(r[5] or "null" for r in rows) + "]")
        for (attempt, o, when, rank, update, _), fetched in zip(rows, texts, strict=True):
            out[attempt][3].append((o, when, rank, update, fetched))
    return {a: tuple(held) for a, held in out.items()}


def absorb_reduced(run_pk: int, since: int, upto: int, fold) -> int | None:
    """Fold into ``fold`` (a ``HeartbeatFold``) the run's heartbeats whose ``seq`` is in
    ``(since, upto]`` from :func:`reduced_beats`; returns how many, or None (nothing folded)
    where the caller is to fold the rows one by one (another vendor than PostgreSQL, or
    :func:`reduced_beats` None). Raises what the fold raises on a malformed cursor."""
    if connection.vendor != "postgresql":
        return None
    reduced = reduced_beats(run_pk, since, upto, fold)
    if reduced is None:
        return None
    return sum(fold.absorb_reduced(attempt, count, last, cursors, points)
               for attempt, (count, last, cursors, points) in reduced.items())
