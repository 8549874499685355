"""An attacker holding only an ingest token of project A, and a new user sending bad input:
every hostile batch is answered 200 or 4xx (never 5xx), never changes project B's run of the
same run_id, and never leaves A's run unable to take and analyse a later valid batch."""

from __future__ import annotations

import gzip
import json

import pytest
from ingest_support import URL, event, post, update

from recoverydash.runs import analysis as bridge
from recoverydash.runs.models import Analysis, Attempt, Run

pytestmark = pytest.mark.django_db(transaction=True)

BIG = 2 ** 63
_NUMBERS = [BIG, BIG - 1, -BIG - 1, -1, 2 ** 31, 2 ** 64, 1.5, 1.0, True, "1", None, 10 ** 400,
            1e308]
_TEXT_NUMBERS = ["NaN", "Infinity", "-Infinity", "1e400", "-0", "1E+2"]


def _snapshot(run: Run) -> dict:
    run.refresh_from_db()
    return {"run": (run.event_count, run.last_event_at, run.ingest_seq, run.strata, run.contract),
            "attempts": sorted(Attempt.objects.filter(run=run).values_list(
                "attempt", "last_update", "last_event_at", "world_size", "fetched")),
            "events": run.events.count()}


def _hostile_bodies() -> list[tuple[str, bytes]]:
    out: list[tuple[str, dict | bytes]] = []
    for value in _NUMBERS:
        for field in ("attempt", "rank", "update"):
            out.append((f"{field}={value!r}", [{**update(f"h-{field}", 1), field: value}]))
        out.append((f"range stop={value!r}",
                    [update("h-r", 1, spans=[{"stratum": "main", "epoch": 0,
                                              "ranges": [[0, value]]}])]))
        out.append((f"range start={value!r}",
                    [update("h-s", 1, spans=[{"stratum": "main", "epoch": 0,
                                              "ranges": [[value, BIG - 1]]}])]))
        out.append((f"epoch={value!r}",
                    [update("h-e", 1, spans=[{"stratum": "main", "epoch": value,
                                              "ranges": [[0, 4]]}])]))
        out.append((f"step={value!r}",
                    [update("h-st", 1, spans=[{"stratum": "main", "epoch": 0,
                                               "ranges": [[0, 4, value]]}])]))
        out.append((f"fetched position={value!r}",
                    [event("heartbeat", "h-f", update=1,
                           fetched=[{"stratum": "main", "epoch": 0, "position": value}])]))
        out.append((f"heartbeat update={value!r}", [event("heartbeat", "h-hu", update=value)]))
        out.append((f"samples={value!r}", [update("h-sa", 1, samples=value)]))
        out.append((f"world_size={value!r}",
                    [event("attempt_started", "h-w", attempt=7, world_size=value,
                           dataset_version="ds")]))
        out.append((f"max_checkpoint_age_s={value!r}",
                    [event("attempt_started", "h-c", attempt=8, world_size=1,
                           dataset_version="ds", contract={"max_checkpoint_age_s": value})]))
        out.append((f"max_replay_samples={value!r}",
                    [event("attempt_started", "h-m", attempt=9, world_size=1,
                           dataset_version="ds", contract={"max_replay_samples": value})]))
        out.append((f"aggregate part rank={value!r}",
                    [event("update_aggregate", "h-ag", update=1,
                           ranks=[{"rank": value, "spans": []}])]))
        out.append((f"sdk_lost_updates={value!r}",
                    [event("heartbeat", "h-sl", update=1, rank=0, sdk_dropped=1,
                           sdk_lost_updates=[0, value])]))
        out.append((f"restore seconds={value!r}",
                    [event("restore_completed", "h-rs", generation_id="g", seconds=value)]))
    for run_id in ["", " ", "a" * 10_000, "run-1\x00", "../run-1", "run-1/", "RUN-1", "run-1 ",
                   "ｒｕｎ-1", "\ud800", None, 1, ["run-1"], {"run_id": "run-1"}]:
        out.append((f"run_id={run_id!r}", [{**update("h-id", 1), "run_id": run_id}]))
    for event_id in ["", "x" * 100_000, None, 5, "\x00"]:
        out.append((f"event_id={event_id!r}", [{**update("h-eid", 1), "event_id": event_id}]))
    out.append(("aggregate of 16385 parts",
                [event("update_aggregate", "h-agbig", update=1,
                       ranks=[{"rank": r, "spans": []} for r in range(16385)])]))
    out.append(("aggregate with one rank twice",
                [event("update_aggregate", "h-ag2", update=1,
                       ranks=[{"rank": 1, "spans": []}, {"rank": 1, "spans": []}])]))
    out.append(("one event_id twice with other content in one batch",
                [update("h-dup", 1, rank=0), update("h-dup", 2, rank=0)]))
    out.append(("unknown type", [event("update_commited", "h-t")]))
    out.append(("events not a list", {"events": {"0": update("h-l", 1)}}))
    out.append(("event not an object", {"events": [[1, 2]]}))
    out.append(("top level list", [[update("h-tl", 1)]]))
    raw = []
    for i, literal in enumerate(_TEXT_NUMBERS):
        for field in ("update", "rank", "attempt"):
            raw.append((f"{field} literal {literal}",
                        ('{"events":[{"event_id":"h-lit%d%s","type":"update_committed",'  # noqa: UP031
                         '"run_id":"run-1","attempt":0,"rank":0,"update":1,'
                         '"time":"2026-11-01T00:00:05Z","spans":[],"%s":%s}]}'
                         % (i, field, field, literal)).encode()))
        raw.append((f"contract age literal {literal}",
                    ('{"events":[{"event_id":"h-clit%d","type":"attempt_started","run_id":'  # noqa: UP031
                     '"run-1","attempt":11,"time":"2026-11-01T00:00:05Z","world_size":1,'
                     '"dataset_version":"ds","contract":{"max_checkpoint_age_s":%s}}]}'
                     % (i, literal)).encode()))
    raw += [("malformed json", b'{"events": [{"event_id": "x",'),
            ("not utf-8", b'{"events": [{"event_id": "\xff\xfe"}]}'),
            ("empty body", b""), ("null", b"null"), ("a number", b"7"),
            ("lone surrogate escape", (b'{"events":[{"event_id":"\\ud800","type":"heartbeat",'
                                      b'"run_id":"run-1","attempt":0,"time":"2026-11-01T00:00:05Z",'
                                      b'"update":1}]}')),
            ("duplicate keys", b'{"events":[], "events":[{"event_id":"k"}]}'),
            ("deep nesting", b'[' * 100_000 + b']' * 100_000)]
    bodies = []
    for n, (name, data) in enumerate(out):
        for ev in (data if isinstance(data, list) else data.get("events", [])):
            for one in (ev if isinstance(ev, list) else [ev]):
                if isinstance(one, dict) and isinstance(one.get("event_id"), str) \
                        and one["event_id"].startswith("h-") and "dup" not in one["event_id"]:
                    one["event_id"] += f"-{n}"
        bodies.append((name, json.dumps(data if isinstance(data, dict) else {"events": data}
                                        if not (isinstance(data, list) and data
                                                and isinstance(data[0], list)) else data[0])
                       .encode() if not isinstance(data, bytes) else data))
    return bodies + raw


def test_hostile_batches_are_4xx_and_touch_no_other_project(client, ingest_token, other_token,
                                                            other_project, project,
                                                            read_token):
    # project B has a run of the same run_id with a state
    assert post(client, other_token, [update("b1", 1, rank=0), update("b2", 1, rank=1)]
                ).status_code == 202
    assert post(client, ingest_token, [update("a1", 1, rank=0)]).status_code == 202
    run_b = Run.objects.get(project=other_project, run_id="run-1")
    bridge.analyze(run_b)
    before_b = _snapshot(run_b)
    analysis_b = Analysis.objects.get(run=run_b).result
    failures = []
    for name, body in _hostile_bodies():
        answer = post(client, ingest_token, body=body)
        if not (answer.status_code in (200, 202) or 400 <= answer.status_code < 500):
            failures.append((name, answer.status_code, answer.content[:300]))
        if answer.status_code >= 400 and answer.status_code not in (401, 403, 429):
            problem = answer.json()
            if not (isinstance(problem, dict) and problem):
                failures.append((name, "no error document", answer.content[:200]))
    assert failures == []
    assert _snapshot(run_b) == before_b
    assert Analysis.objects.get(run=run_b).result == analysis_b
    # a later valid batch into A's run is stored and analysed
    assert post(client, ingest_token, [update("a2", 2, rank=0), update("a3", 2, rank=1)]
                ).status_code == 202
    now = 1_800_000_000.0
    for run in Run.objects.filter(project=project):
        analysed = bridge.analyze(run, now=now)
        assert analysed.error == "", (run.run_id, analysed.error)
        # nothing new, later: equal to a rebuild at that time (accepted extremes included)
        later = bridge.analyze(run, now=now + 7200).result
        Analysis.objects.filter(run=run).delete()
        assert bridge.analyze(run, now=now + 7200).result == later, run.run_id
        for path in (f"/api/v1/runs/{run.run_id}/recovery",
                     f"/api/v1/runs/{run.run_id}/restore-plan"):
            answer = client.get(path, headers={"Authorization": f"Bearer {read_token}"})
            assert answer.status_code < 500, (path, answer.status_code, answer.content[:300])
    # the pages of every run, as a member sees them
    from django.contrib.auth import get_user_model

    from recoverydash.runs.models import Membership

    user = get_user_model().objects.create_user("member", password="a long passphrase 1")
    Membership.objects.create(project=project, user=user)
    client.force_login(user)
    for run in Run.objects.filter(project=project):
        for page in ("", "charts.json", "contract/", "restarts/0/", "restarts/11/"):
            path = f"/p/{project.name}/runs/{run.run_id}/{page}"
            answer = client.get(path)
            assert answer.status_code < 500, (path, answer.status_code)
            if page in ("", "charts.json"):
                assert answer.status_code == 200, (path, answer.status_code)


def test_a_resent_event_id_with_other_content_is_409_and_stores_nothing(client, ingest_token,
                                                                       project):
    assert post(client, ingest_token, [update("same", 1, rank=0)]).status_code == 202
    run = Run.objects.get(project=project)
    before = _snapshot(run)
    for changed in ({"rank": 1}, {"update": 2}, {"time": "2026-11-01T00:00:06Z"},
                    {"run_id": "run-1", "attempt": 1}, {"samples": 3}):
        batch = [update("fresh", 3, rank=2), {**update("same", 1, rank=0), **changed}]
        answer = post(client, ingest_token, batch)
        if changed.get("attempt") == 1:
            # another attempt: still the same event_id of the run, other content
            assert answer.status_code in (202, 409), answer.content
        else:
            assert answer.status_code == 409, (changed, answer.content)
            assert _snapshot(run) == before
    assert post(client, ingest_token, [update("same", 1, rank=0)]).status_code == 202


@pytest.mark.parametrize("encoding", ["gzip", "x-gzip"])
def test_a_gzip_bomb_is_413_quickly(client, ingest_token, settings, encoding):
    settings.RECOVERYDASH_MAX_BODY_BYTES = 1 << 20
    bomb = gzip.compress(b'{"events": [' + b" " * (64 << 20) + b"]}", compresslevel=9)
    multi = gzip.compress(b" " * (600 << 10)) * 4
    for body in (bomb, multi, bomb[:-10], b"\x1f\x8b" + b"\x00" * 30):
        answer = client.generic("POST", URL, data=body, content_type="application/json",
                                headers={"Authorization": f"Bearer {ingest_token}",
                                         "Content-Encoding": encoding})
        assert 400 <= answer.status_code < 500, answer.status_code


def test_an_ingest_token_reads_nothing(client, ingest_token, other_project, other_token):
    post(client, other_token, [update("b1", 1)])
    headers = {"Authorization": f"Bearer {ingest_token}"}
    for path in ("/api/v1/runs", "/api/v1/runs/run-1", "/api/v1/runs/run-1/recovery",
                 "/api/v1/runs/run-1/restore-plan"):
        answer = client.get(path, headers=headers)
        assert answer.status_code in (403, 404), (path, answer.status_code)


_NASTY = ["a\tb", "a\nb", "a\\b", "\\N", "\\.", "a\rb", "é☃𝄞", "a,b", '"q"', "a\u2028b", "'; --",
          "{}", "[1]", "NULL", ""]


def test_strings_copy_must_escape_arrive_as_sent(client, ingest_token, project):
    """Stratum names, unknown fields and cursors with the characters COPY's text format escapes
    (tab, newline, backslash, \\N, \\.) are stored and read back as sent."""
    from recoverydash.runs.models import Event, Heartbeat, LedgerRow

    accepted = []
    for i, s in enumerate(_NASTY):
        batch = [update(f"n-u{i}", i + 1, rank=0, note=s,
                        spans=[{"stratum": s, "epoch": 0, "ranges": [[0, 4]]}]),
                 event("heartbeat", f"n-h{i}", update=i + 1, rank=0, extra=s,
                       fetched=[{"stratum": s, "epoch": 0, "position": 4}])]
        answer = post(client, ingest_token, batch)
        assert answer.status_code in (202, 400), (s, answer.status_code)
        if answer.status_code == 202:
            accepted.append((i, s))
    assert len(accepted) >= len(_NASTY) - 2, accepted
    run = Run.objects.get(project=project)
    assert set(run.strata) == {s for _, s in accepted}
    for i, s in accepted:
        body = Event.objects.get(run=run, event_id=f"n-u{i}").body
        assert body.get("note") == s, (s, body)
        row = LedgerRow.objects.get(run=run, update=i + 1)
        assert [sp["stratum"] for sp in row.spans] == [s]
        hb = Event.objects.get(run=run, event_id=f"n-h{i}").body
        assert hb.get("extra") == s, (s, hb)
    fetched = Attempt.objects.get(run=run).fetched
    assert {c["stratum"] for c in fetched} == {s for _, s in accepted}
    assert Heartbeat.objects.filter(run=run).count() >= 1
    analysed = bridge.analyze(run, now=1_800_000_000.0)
    assert analysed.error == ""
    assert {s["stratum"] for s in analysed.result["strata"]} >= {s for _, s in accepted}


def test_a_run_of_the_same_name_in_another_project_never_joins_its_ledger_rows(
        client, ingest_token, other_token, project, other_project):
    """Project B sends the ranks of an update that would extend project A's stored fold (the
    DistributedSampler shape, the next ranks, same samples): A's analysis is that of A's events
    alone (a third project holding only them)."""
    from recoverydash.runs.models import Project as P

    world = 4
    def rank_event(eid, r):
        return update(eid, 1, rank=r, samples=2, time="2026-11-01T00:00:05Z",
                      spans=[{"stratum": "main", "epoch": 0, "ranges": [[r, 8, world]]}])

    alone = P.objects.create(name="alone")
    from recoverydash.ingest.actions import ingest_batch

    mine = [rank_event("a0", 0), rank_event("a1", 1)]
    assert post(client, ingest_token, [mine[0]]).status_code == 202
    assert post(client, other_token, [rank_event("b2", 2)]).status_code == 202
    assert post(client, ingest_token, [mine[1]]).status_code == 202
    assert post(client, other_token, [rank_event("b3", 3)]).status_code == 202
    ingest_batch(alone, [mine[0]])
    ingest_batch(alone, [mine[1]])
    now = 1_800_000_000.0
    got = bridge.analyze(Run.objects.get(project=project), now=now).result
    want = bridge.analyze(Run.objects.get(project=alone), now=now).result
    assert got == want
    from recoverydash.runs.models import LedgerRow

    for p in (project, other_project):
        rows = LedgerRow.objects.filter(run__project=p)
        ranks = sorted(r for row in rows for r in range(row.rank, row.rank + row.ranks))
        assert ranks == ([0, 1] if p == project else [2, 3]), (p.name, ranks)
