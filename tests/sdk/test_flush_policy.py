"""The SDK's flush policy (recoverydash/sdk/flush.py, docs/ingest-v1.md#sdk-flush-policy): exact
waits on a fake clock, and the client's wiring of it."""

from __future__ import annotations

import pytest

from recoverydash.sdk.client import Client
from recoverydash.sdk.flush import (
    JOB_REQUESTS_PER_S,
    LEAD_PROMPT_TYPES,
    MAX_INTERVAL_S,
    PROMPT_S,
    PROMPT_TYPES,
    FlushPolicy,
    is_prompt,
)

from .conftest import wait_for


def test_the_defaults_are_the_documented_ones():
    assert (JOB_REQUESTS_PER_S, MAX_INTERVAL_S, PROMPT_S) == (40.0, 60.0, 1.0)
    assert PROMPT_TYPES == {"checkpoint_committed", "restore_failed"}
    assert LEAD_PROMPT_TYPES == {"attempt_started", "attempt_ended", "restore_completed"}


@pytest.mark.parametrize("world, interval, job_requests", [
    (None, 1.0, 1.0),        # unknown: one process
    (1, 1.0, 1.0),
    (8, 1.0, 8.0),
    (40, 1.0, 40.0),         # the budget reached at the base interval
    (64, 1.6, 40.0),
    (1024, 25.6, 40.0),
    (2400, 60.0, 40.0),      # 2,400 / 40 = 60 s: the cap
    (4096, 60.0, 4096 / 60),
    (16384, 60.0, 16384 / 60),  # capped: 273.07 requests/s
])
def test_the_interval_spreads_a_job_to_its_request_budget(world, interval, job_requests):
    policy = FlushPolicy(world_size=world)
    assert policy.interval() == interval
    assert policy.job_requests() == pytest.approx(job_requests, abs=1e-9)


def test_the_base_interval_is_the_floor_and_the_cap_never_undercuts_it():
    assert FlushPolicy(base_interval=5.0, world_size=64).interval() == 5.0
    assert FlushPolicy(base_interval=0.05, world_size=2).interval() == 0.05
    assert FlushPolicy(base_interval=90.0, world_size=16384).interval() == 90.0
    assert FlushPolicy(world_size=16384, job_requests_per_s=1024).interval() == 16.0
    assert FlushPolicy(world_size=16384, max_interval=30).interval() == 30.0
    assert FlushPolicy(world_size=1024, job_requests_per_s=256).interval() == 4.0


def test_the_periodic_deadline_on_a_fake_clock():
    policy = FlushPolicy(world_size=16384)          # 60 s
    assert policy.due(1000.0, 1.0, None) == 1060.0
    assert policy.due(1000.0, 0.8, None) == 1048.0
    assert policy.due(1000.0, 1.2, None) == 1072.0   # the latest: within the 120 s rank floor


def test_a_prompt_event_is_sent_within_its_bound_never_later_than_the_periodic_send():
    policy = FlushPolicy(world_size=16384)
    # queued at 1010.5 in a cycle that started at 1000: sent at 1011.5, not 1060
    assert policy.due(1000.0, 1.0, 1010.5) == 1011.5
    # queued 0.3 s before the periodic deadline: the periodic deadline comes first
    assert policy.due(1000.0, 1.0, 1059.7) == 1060.0
    small = FlushPolicy(base_interval=0.5)
    assert small.due(1000.0, 1.0, 1000.2) == 1000.5
    assert FlushPolicy(world_size=16384, prompt_s=0.25).due(1000.0, 1.0, 1010.0) == 1010.25


def test_only_a_large_jobs_first_cycle_draws_a_wide_jitter():
    large, small = FlushPolicy(world_size=16384), FlushPolicy(world_size=40)
    assert large.jitter_range(first=True) == (0.05, 1.2)
    assert large.jitter_range(first=False) == (0.8, 1.2)
    assert small.jitter_range(first=True) == (0.8, 1.2)


def test_what_is_prompt():
    for rank in (None, 0, 5):
        assert is_prompt({"type": "checkpoint_committed"}, rank)
        assert is_prompt({"type": "restore_failed", "rank": rank})
        assert not is_prompt({"type": "update_committed"}, rank)
        assert not is_prompt({"type": "heartbeat", "rank": rank})
    for kind in ("attempt_started", "attempt_ended", "restore_completed"):
        # the lead reporter's copy is prompt; the other ranks' go with their periodic send
        assert is_prompt({"type": kind}, None) and is_prompt({"type": kind}, 0)
        assert is_prompt({"type": kind, "rank": 0}, 5)
        assert not is_prompt({"type": kind}, 5) and not is_prompt({"type": kind, "rank": 3}, 0)
    assert not is_prompt(object()) and not is_prompt({})


def test_the_client_takes_the_world_size_from_its_argument_the_environment_or_its_start(
        monkeypatch, spool):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    made = []

    def client(**kw):
        c = Client("http://127.0.0.1:9", "t", "run-p", attempt=0, rank=0, spool_dir=spool,
                   **kw)
        made.append(c)
        return c

    try:
        assert client(world_size=16384).flush_policy.interval() == 60.0
        assert client(world_size=1).flush_policy.interval() == 1.0
        monkeypatch.setenv("WORLD_SIZE", "1024")
        assert client().flush_policy.interval() == 25.6
        monkeypatch.setenv("WORLD_SIZE", "not a number")
        c = client()
        assert c.flush_policy.world_size is None and c.flush_policy.interval() == 1.0
        c.attempt_started(world_size=2048, dataset_version="d")  # rank 0: prompt
        assert c.flush_policy.world_size == 2048 and c.flush_policy.interval() == 51.2
        assert c._worker._prompt_since is not None
        other = Client("http://127.0.0.1:9", "t", "run-p", attempt=0, rank=7, spool_dir=spool)
        made.append(other)
        other.attempt_started(world_size=512, dataset_version="d")  # rank 7: periodic
        assert other.flush_policy.world_size == 512 and other._worker._prompt_since is None
        d = client(world_size=16384)
        d.update_committed(1, [])
        d.heartbeat(1)
        assert d._worker._prompt_since is None  # nothing prompt queued: the 60 s cycle stands
    finally:
        for c in made:
            c.close(0.1)


def test_a_large_jobs_checkpoint_goes_out_promptly_with_what_was_queued_before_it(
        ingest, spool):
    # 16,384 ranks: a 60 s interval; the manifest must not wait for it
    c = Client(ingest.url, "t", "run-q", attempt=0, rank=0, spool_dir=spool,
               world_size=16384)
    try:
        c.update_committed(1, [])
        c.checkpoint_committed({"generation_id": "g1", "schema_revision": 1})
        assert wait_for(lambda: len(ingest.stored) == 2, timeout=10)
        [request] = ingest.requests
        assert [e["type"] for e in request["events"]] == ["update_committed",
                                                          "checkpoint_committed"]
        c.update_committed(2, [])
        assert c.flush(5) and len(ingest.requests) == 2
    finally:
        c.close(0.5)
