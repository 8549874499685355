"""Fuzzing through the real server (gunicorn on PostgreSQL): 5,000 generated requests, valid
runs with restarts and checkpoints mixed with hostile values in every field and broken bodies,
must get zero 5xx; the runs they built are then analysed as the workers would, and every
dashboard page and read endpoint of them must answer without a 500. A SQLite server shows a
locked database as a quick 503, and both databases refuse an unknown field nested 944 deep with a
400."""

from __future__ import annotations

import gzip
import itertools
import json
import sqlite3
import time
from collections import Counter
from urllib.parse import quote as _quote

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from recoverydash.dashboard.converters import SegmentConverter

from .live import LiveServer


def quote(segment: str) -> str:
    """A path segment percent-encoded as Django's reverse() does."""
    return _quote(segment, safe="!$&'()*+,;=~:@")


pytestmark = pytest.mark.slow

REQUESTS = 5000
RUNS = [f"fz-{i}" for i in range(6)]
GENERATIONS = [f"g{i}" for i in range(0, 60, 5)]
T0 = 1793491200  # 2026-11-01T00:00:00Z
_ids = itertools.count()


@pytest.fixture(scope="module")
def pg_server():
    server = LiveServer("postgresql")
    yield server
    server.close()


@pytest.fixture(scope="module")
def statuses():
    return Counter()


# --- generated requests -------------------------------------------------------------------------
def iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + \
        f".{int((seconds % 1) * 1000):03d}Z"


EDGE_TIMES = st.sampled_from([
    "9999-12-31T23:59:59Z", "9999-12-31T23:59:59.999999Z", "9999-12-31T23:00:00-01:00",
    "0001-01-01T00:00:00Z", "0001-01-01T00:00:00+00:01", "1970-01-01T00:00:00Z",
    "2026-11-01T00:00:00.999999999+14:00", "2026-02-30T00:00:00Z"])
# an ordinary run's clock (skewed both ways between events), and one time in twenty at an edge
times = st.integers(0, 19).flatmap(
    lambda k: EDGE_TIMES if k == 0 else st.floats(0, 7200).map(lambda s: iso(T0 + s)))
hostile = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**64), 2**64), st.floats(allow_nan=False),
    st.text(max_size=40), st.sampled_from(["", "a/b", "../..", ".", "x" * 300, "\x00",
                                           "\ud800", "1e999", "NaN", "g5/../g10", "%2e%2e"]),
    st.lists(st.none(), min_size=0, max_size=300),
    st.recursive(st.integers(), lambda inner: st.dictionaries(st.text(max_size=3), inner,
                                                              max_size=2), max_leaves=40),
    st.integers(33, 60).map(lambda d: json.loads('{"a":' * d + "1" + "}" * d)),
)


@st.composite
def span(draw, update: int, rank: int):
    epoch = draw(st.integers(0, 2))
    base = (update - 1) * 8 + draw(st.sampled_from([0, 0, 0, 8, -8, 48]))
    base = max(0, base)
    if draw(st.integers(0, 9)) == 0:
        return {"stratum": "ids", "epoch": epoch,
                "ids": draw(st.lists(st.integers(0, 99) | st.text(max_size=4), max_size=5))}
    return {"stratum": draw(st.sampled_from(["main", "main", "aux"])), "epoch": epoch,
            "ranges": [[base + rank, base + 8, draw(st.sampled_from([1, 2, 4]))]]}


def file_object(gid: str, shard: str, component: str, draw) -> dict:
    obj = {"uri": f"file:///tmp/recoverydash-fuzz/{gid}/{shard}/{component}.pt",
           "shard": shard, "component": component, "size": draw(st.integers(0, 4096))}
    if draw(st.booleans()):
        obj["sha256"] = draw(st.text("0123456789abcdef", min_size=64, max_size=64))
    return obj


@st.composite
def event(draw):
    run_id = draw(st.sampled_from(RUNS))
    attempt = draw(st.integers(0, 3))
    rank = draw(st.integers(0, 3))
    kind = draw(st.sampled_from(["attempt_started", "update_committed", "update_committed",
                                 "update_committed", "heartbeat", "checkpoint_started",
                                 "shard_written", "checkpoint_committed", "restore_completed",
                                 "attempt_ended", "audit_window"]))
    # a new event id, or one in twenty an earlier one (a re-send, or a conflict)
    n = next(_ids)
    if draw(st.integers(0, 19)) == 0:
        n = int(draw(st.floats(0, 1)) * n)
    ev = {"event_id": f"e{n}", "type": kind, "run_id": run_id,
          "attempt": attempt, "time": draw(times), "rank": rank}
    update = draw(st.integers(1, 60))
    gid = draw(st.sampled_from(GENERATIONS))
    components = ["model", "optimizer"]
    shards = [f"rank{r}" for r in range(draw(st.integers(1, 2)))]
    if kind == "attempt_started":
        # every rank of a launch reports the same values; one start in ten is a relaunch that
        # reuses the attempt number with other values (a 409 when the first one is in)
        seed = RUNS.index(run_id) + attempt
        reused = draw(st.integers(0, 9)) == 0
        ev.update(world_size=draw(st.sampled_from([1, 2, 4])) if reused else [1, 2, 4][seed % 3],
                  dataset_version="v2" if reused else "v1", global_batch_size=64,
                  sampler={"epoch_length": {"main": 480}, "drop_last": draw(st.booleans())},
                  contract={"max_checkpoint_age_s": draw(st.sampled_from([0, 60, 3600]))})
        if attempt > 0:
            gid_from = GENERATIONS[(seed * 3) % len(GENERATIONS)]
            ev["resumed_from"] = {"generation_id": gid_from, "update": int(gid_from[1:]),
                                  "cursor": [{"stratum": "main", "epoch": 0,
                                              "position": draw(st.integers(0, 500))}]}
    elif kind == "update_committed":
        ev.update(update=update, spans=[draw(span(update, rank))], samples=8)
    elif kind == "heartbeat":
        ev.update(update=update, fetched=[{"stratum": "main", "epoch": 0,
                                           "position": update * 8 + draw(st.integers(0, 64))}])
        if draw(st.integers(0, 5)) == 0:
            ev.update(sdk_dropped=draw(st.integers(0, 500)), sdk_lost_updates=[update, update])
    elif kind == "checkpoint_started":
        ev.update(generation_id=gid, update=int(gid[1:]), required_shards=shards,
                  components=components)
    elif kind == "shard_written":
        shard = draw(st.sampled_from(shards))
        ev.update(generation_id=gid, shard=shard, update=int(gid[1:]),
                  objects=[file_object(gid, shard, c, draw) for c in components])
    elif kind == "checkpoint_committed":
        ev["manifest"] = {
            "schema_revision": draw(st.sampled_from([1, 1, 1, 2])), "generation_id": gid,
            "update": int(gid[1:]), "world_size": len(shards), "required_shards": shards,
            "components": components,
            "objects": [file_object(gid, s, c, draw) for s in shards for c in components],
            "data_progress": {"cursor": [{"stratum": "main", "epoch": 0,
                                          "position": int(gid[1:]) * 8}]},
            "dataset_version": "v1", "committed_at": draw(times)}
    elif kind == "restore_completed":
        ev.update(generation_id=gid, seconds=draw(st.floats(0, 600)))
    elif kind == "attempt_ended":
        ev.update(reason=draw(st.sampled_from(["completed", "failed", "preempted",
                                               "cancelled"])), update=update)
    else:
        ev.update(update=update, accum_slot=0, sample_ids=[f"s{update}-{rank}"])
    # one event in ten carries a hostile value somewhere
    if draw(st.integers(0, 9)) == 0:
        path = draw(st.sampled_from(sorted(ev) + ["x_unknown", "spans", "manifest"]))
        target = ev
        if path == "manifest" and isinstance(ev.get("manifest"), dict):
            target = ev["manifest"]
            path = draw(st.sampled_from(sorted(target)))
        elif path == "spans" and ev.get("spans"):
            target = ev["spans"][0]
            path = draw(st.sampled_from(sorted(target) + ["x_unknown"]))
        target[path] = draw(hostile)
    return ev


def encode(body) -> bytes:
    return json.dumps(body).encode("utf-8", "surrogatepass")


@st.composite
def request(draw):
    """(body bytes, headers): a batch of events, or a broken request."""
    kind = draw(st.integers(0, 19))
    headers = {"Content-Type": "application/json"}
    if kind == 0:
        return draw(st.binary(max_size=300)), headers
    if kind == 1:
        return encode({"events": draw(hostile)}), headers
    if kind == 2:
        return b'{"events": [' * 5 + b"1", headers
    if kind == 3:
        body = encode({"events": [draw(event())]})
        content_type = draw(st.sampled_from(
            ["text/plain", "", "application/x-www-form-urlencoded"]))
        return body, {**headers, "Content-Type": content_type}
    events = draw(st.lists(event(), min_size=1, max_size=draw(st.sampled_from([1, 2, 4, 8]))))
    data = encode({"events": events})
    if kind == 4:
        return gzip.compress(data)[:-draw(st.integers(1, 20))], {**headers,
                                                                 "Content-Encoding": "gzip"}
    if kind < 8:
        return gzip.compress(data), {**headers, "Content-Encoding": "gzip"}
    return data, headers


@pytest.fixture(scope="module")
def http(pg_server):
    with httpx.Client(base_url=pg_server.url, timeout=60) as client:
        yield client


@settings(max_examples=REQUESTS, deadline=None, database=None, derandomize=True,
          phases=[Phase.generate], suppress_health_check=list(HealthCheck))
@given(req=request())
def test_5000_generated_requests_through_the_real_server_get_no_5xx(pg_server, http, statuses,
                                                                    req):
    data, headers = req
    response = http.post("/api/v1/events", content=data,
                         headers={**headers, "Authorization": f"Bearer {pg_server.token}"})
    statuses[response.status_code] += 1
    assert response.status_code < 500, (response.status_code, response.text[:500], data[:500])


def test_the_fuzz_sent_enough_of_every_kind_of_answer(statuses):
    print("answers to the fuzzed requests:", dict(sorted(statuses.items())))
    assert sum(statuses.values()) == REQUESTS
    assert statuses[202] > 1500 and statuses[400] > 500 and statuses[409] > 0 \
        and statuses[415] > 0


ANALYSE = """
import json
from recoverydash.alerts.evaluation import analyze_and_alert
from recoverydash.runs.models import Analysis, Generation, Run
from recoverydash.storage.verification import verify_generation
out = {"runs": 0, "verified": 0, "errors": []}
for gen in Generation.objects.filter(manifest__isnull=False).values_list("pk", flat=True):
    try:
        verify_generation(gen)
        out["verified"] += 1
    except Exception as exc:
        out["errors"].append(f"verify {gen}: {exc!r}")
for run in Run.objects.all():
    out["runs"] += 1
    try:
        analyze_and_alert(run.pk)
    except Exception as exc:
        out["errors"].append(f"analyse {run.run_id}: {exc!r}")
out["failed_analyses"] = {a.run.run_id: a.error for a in Analysis.objects.exclude(error="")}
print(json.dumps(out))
"""


def test_every_page_of_the_fuzzed_runs_answers_without_a_500(pg_server, statuses):
    assert sum(statuses.values()) == REQUESTS  # the fuzz ran first
    result = pg_server.manage("shell", "--no-imports", "-c", ANALYSE)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    print("analysis of the fuzzed runs:", report)
    assert report["runs"] >= len(RUNS) and report["errors"] == []
    assert report["failed_analyses"] == {}

    import psycopg

    with psycopg.connect(pg_server.database_url) as conn:
        runs = conn.execute("SELECT id, run_id FROM runs_run").fetchall()
        gens = conn.execute("SELECT run_id, generation_id FROM runs_generation").fetchall()
        attempts = conn.execute("SELECT run_id, attempt FROM runs_attempt").fetchall()
        projects = [r[0] for r in conn.execute("SELECT id FROM runs_project").fetchall()]
        names = dict(conn.execute("SELECT r.id, p.name FROM runs_run r JOIN runs_project p"
                                  " ON p.id = r.project_id").fetchall())
    urls = ["/", "/?health=failing", "/alerts/", "/alerts/?state=resolved", "/projects/",
            "/docs/definitions/", "/docs/ingest-v1/", "/healthz"]
    urls += [f"/projects/{p}/" for p in projects]
    seg = SegmentConverter().to_url
    page_of = {pk: f"/p/{quote(seg(names[pk]))}/runs/{quote(seg(rid))}/" for pk, rid in runs}
    for pk, _ in runs:
        base = page_of[pk]
        urls += [base, f"{base}?fragment=live", f"{base}charts.json", f"{base}contract/",
                 f"/runs/{pk}/"]
    urls += [f"{page_of[pk]}restarts/{a}/" for pk, a in attempts]
    urls += [f"{page_of[pk]}generations/{quote(seg(gid))}/" for pk, gid in gens]
    api = ["/api/v1/runs"] + [f"/api/v1/runs/{rid}/{what}" for _, rid in runs
                              for what in ("recovery", "restore-plan", "restore-plan?world_size=3")]
    answers = Counter()
    browser = pg_server.session()
    try:
        for url in urls:
            r = browser.get(url)
            answers[r.status_code] += 1
            assert r.status_code < 500, (url, r.status_code, r.text[:500])
    finally:
        browser.close()
    with httpx.Client(base_url=pg_server.url, timeout=60) as client:
        for url in api:
            r = client.get(url, headers={"Authorization": f"Bearer {pg_server.token}"})
            answers[r.status_code] += 1
            assert r.status_code < 500, (url, r.status_code, r.text[:500])
    print(f"{len(urls) + len(api)} pages and endpoints:", dict(sorted(answers.items())))
    assert len(urls) > 50


# --- both databases: deep nesting; SQLite: a locked database -------------------------------------
def deep(depth: int, event_id: str) -> bytes:
    """A heartbeat with an unknown field nested ``depth`` levels."""
    return ('{"events": [{"event_id": "' + event_id + '", "type": "heartbeat", "run_id": "deep", '
            '"attempt": 0, "time": "2026-11-01T00:00:05Z", "update": 1, "x_deep": ' +
            '{"a": ' * depth + "1" + "}" * depth + "}]}").encode()


@pytest.fixture(scope="module")
def sqlite_server():
    server = LiveServer("sqlite", RECOVERYDASH_DB_LOCK_TIMEOUT_S="1")
    yield server
    server.close()


@pytest.mark.parametrize("which", ["pg_server", "sqlite_server"])
def test_an_unknown_field_nested_944_deep_is_a_400(which, request):
    """Before: a 500 on SQLite. 944 levels are beyond what the parser follows inside a request,
    so the request as a whole is refused; 200 levels parse, and the field is named."""
    server = request.getfixturevalue(which)
    r = httpx.post(server.url + "/api/v1/events", content=deep(944, "d944"),
                   headers=server.headers(), timeout=60)
    assert r.status_code == 400, r.text[:300]
    assert r.json()["errors"][0]["message"].startswith(
        "expected JSON whose objects and arrays nest at most a few hundred levels")
    r = httpx.post(server.url + "/api/v1/events", content=deep(200, "d200"),
                   headers=server.headers(), timeout=60)
    assert r.status_code == 400, r.text[:300]
    assert r.json()["errors"][0] == {
        "index": 0, "path": "events[0].x_deep",
        "message": "expected a value nested at most 32 levels (objects and arrays), got one "
                   "nested deeper"}


def test_a_locked_sqlite_database_is_a_quick_503_and_healthz_names_it(sqlite_server):
    """Another process holds the SQLite file's write lock: ingest answers 503
    database_unavailable with Retry-After after the 1 s lock timeout (before: a 500 after 30 s),
    /healthz answers 503 naming the database; once the lock is gone both recover."""
    path = sqlite_server.database_url.removeprefix("sqlite:///")
    holder = sqlite3.connect(path, timeout=1, isolation_level=None)
    body = (b'{"events": [{"event_id": "h1", "type": "heartbeat", "run_id": "locked", '
            b'"attempt": 0, "time": "2026-11-01T00:00:05Z", "update": 1}]}')
    try:
        holder.execute("BEGIN EXCLUSIVE")
        started = time.monotonic()
        r = httpx.post(sqlite_server.url + "/api/v1/events", content=body,
                       headers=sqlite_server.headers(), timeout=60)
        took = time.monotonic() - started
        health = httpx.get(sqlite_server.url + "/healthz", timeout=60)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert r.status_code == 503, r.text[:300]
    assert r.headers["Retry-After"] == "5" and r.json()["error"] == "database_unavailable"
    assert "database is locked" in r.json()["errors"][0]["message"]
    print(f"a locked SQLite database answered 503 after {took:.2f} s (lock timeout 1 s)")
    assert health.status_code == 503 and health.json()["failed"] == ["database"]
    assert httpx.post(sqlite_server.url + "/api/v1/events", content=body,
                      headers=sqlite_server.headers(), timeout=60).status_code == 202
    assert httpx.get(sqlite_server.url + "/healthz", timeout=60).status_code == 200
