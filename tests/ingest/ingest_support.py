"""Builders of wire events (docs/ingest-v1.md, sections 2-4) and a poster for the ingest tests."""

from __future__ import annotations

import gzip
import json

URL = "/api/v1/events"
T0 = "2026-11-01T00:00:05Z"


def event(type_: str, event_id: str, run_id: str = "run-1", attempt: int = 0, **fields) -> dict:
    """A wire event with the common fields (docs/ingest-v1.md#2-common-fields) plus ``fields``."""
    return {"event_id": event_id, "type": type_, "run_id": run_id, "attempt": attempt,
            "time": fields.pop("time", T0), **fields}


def update(event_id: str, update_: int, rank: int | None = 0, run_id: str = "run-1",
           attempt: int = 0, start: int | None = None, width: int = 8, **fields) -> dict:
    """An ``update_committed`` with one contiguous span of ``width`` positions."""
    start = (update_ - 1) * width if start is None else start
    spans = fields.pop("spans",
                       [{"stratum": "main", "epoch": 0, "ranges": [[start, start + width]]}])
    body = event("update_committed", event_id, run_id, attempt, update=update_, spans=spans,
                 **fields)
    if rank is not None:
        body["rank"] = rank
    return body


def strided_batch(run_id: str, first_update: int, n_events: int, world: int = 64,
                  per_rank: int = 8, prefix: str = "e") -> list[dict]:
    """``n_events`` update_committed events as an SDK sends them: every rank reports one strided
    span (rank r owns positions r, r+W, ...) per update."""
    out = []
    gbs = world * per_rank
    for i in range(n_events):
        u, r = first_update + i // world, i % world
        base = (u - 1) * gbs
        out.append({"event_id": f"{prefix}-{u}-{r}", "type": "update_committed",
                    "run_id": run_id, "attempt": 0, "time": "2026-11-01T00:00:05.250+00:00",
                    "rank": r, "update": u, "samples": per_rank,
                    "spans": [{"stratum": "main", "epoch": 0,
                               "ranges": [[base + r, base + gbs, world]]}]})
    return out


def batch_order(seqs) -> list[int]:
    """Seqs as the order of their batches, 1 for the first (a batch's seq comes from one
    database sequence shared by every run on PostgreSQL, and is the run's count of batches on
    SQLite: recoverydash.runs.seq)."""
    seqs = list(seqs)
    rank = {s: i + 1 for i, s in enumerate(sorted(set(seqs)))}
    return [rank[s] for s in seqs]


def post(client, token: str | None, events=None, *, body: bytes | None = None,
         content_type: str = "application/json", encoding: str | None = None, gz: bool = False):
    """POST a batch; ``body`` overrides the JSON of ``{"events": events}``."""
    data = body if body is not None else json.dumps({"events": events}).encode()
    headers = {}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if gz:
        data = gzip.compress(data)
        encoding = encoding or "gzip"
    if encoding:
        headers["Content-Encoding"] = encoding
    return client.generic("POST", URL, data=data, content_type=content_type, headers=headers,
                          CONTENT_TYPE=content_type)


def json_places(value, path=()):
    """Every ``(path, value)`` inside a JSON value, containers included (the value itself
    first, at the path ``()``); a path is the keys and indexes leading to its value."""
    yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from json_places(item, path + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from json_places(item, path + (i,))
