"""The pipeline through real processes: ingest in this process, a real ``celery worker``
process on the machine's Redis (or a private redis-server a test can stop), the test database.

Marked slow: each test starts worker processes."""

from __future__ import annotations

import time

import pytest

from recoverydash.runs.models import Analysis, CheckpointObject, Generation, Run

from .conftest import RedisServer, wait_for
from .test_scenarios_api import check_expect, post_events, read

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
MACHINE_REDIS = "redis://127.0.0.1:6379/0"


def analysed(run_id: str):
    """True when the run's analysis reflects every ingested batch and every manifest object
    has been checked in storage."""
    run = Run.objects.filter(run_id=run_id).first()
    if run is None:
        return False
    analysis = Analysis.objects.filter(run=run).first()
    unchecked = CheckpointObject.objects.filter(generation__run=run, in_manifest=True,
                                                check_status__in=("pending", "error")).exists()
    return bool(analysis and analysis.ingest_seq >= run.ingest_seq and not unchecked
                and analysis.computed_at.timestamp() >= max(
                    [g.verified_at.timestamp() for g in Generation.objects.filter(run=run)
                     if g.verified_at] or [0]))


@pytest.mark.parametrize("name", ["s2_resume_at_read_cursor_omission", "s4_rank_dies_during_save",
                                  "s5_three_of_four_shards"])
def test_it_reaches_the_verdicts_through_a_real_worker(name, client, full_token, scenario_loader,
                                                       tmp_path, settings, workers_on, project,
                                                       declare_location):
    settings.RECOVERYDASH_RATE_LIMIT_PER_SECOND = 0
    declare_location(project, tmp_path)
    workers_on(MACHINE_REDIS)
    events, expect = scenario_loader(name, str(tmp_path))
    post_events(client, full_token, events)
    run_id = events[0]["run_id"]
    wait_for(lambda: analysed(run_id), timeout=90)
    recovery, plan_status, plan = read(client, full_token, run_id)
    assert recovery["pending_analysis"] is False
    check_expect(recovery, plan_status, plan, expect)


def test_it_verifies_again_after_the_worker_is_killed_mid_verification(
        client, full_token, scenario_loader, tmp_path, settings, workers_on, project,
        declare_location):
    """SIGKILL of the whole worker while it hashes a 6 GiB (sparse) object: the task is handed out
    again (acks_late, visibility timeout) and the result is the same as an undisturbed run."""
    settings.RECOVERYDASH_RATE_LIMIT_PER_SECOND = 0
    declare_location(project, tmp_path)
    events, _ = scenario_loader("s1_resume_at_checkpoint_exact", str(tmp_path))
    big = tmp_path / "big.bin"
    with open(big, "wb") as f:  # sparse: cheap to make, real bytes to hash
        f.truncate(6 * 1024 ** 3)
    import hashlib

    digest = hashlib.sha256()
    with open(big, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    for ev in events:
        if ev["type"] == "checkpoint_committed":
            ev["manifest"]["objects"][0].update(uri=f"file://{big}", size=big.stat().st_size,
                                                sha256=digest.hexdigest())
    first = workers_on(MACHINE_REDIS, visibility_s=4)
    time.sleep(2.0)  # let the worker connect before the work arrives
    post_events(client, full_token, events)
    gen = Generation.objects.get(generation_id="g1250")
    big_obj = CheckpointObject.objects.get(generation=gen, uri=f"file://{big}")
    time.sleep(1.0)  # the worker is hashing now
    big_obj.refresh_from_db()
    assert big_obj.check_status == "pending"
    first.kill()
    workers_on(MACHINE_REDIS, visibility_s=4)
    # kombu restores unacknowledged Redis messages on its own schedule (about 100 s here)
    wait_for(lambda: analysed("s1-exact"), timeout=300)
    big_obj.refresh_from_db()
    assert big_obj.check_status == "ok" and big_obj.observed_sha256 == digest.hexdigest()
    gen.refresh_from_db()
    assert gen.status == "restorable"


def test_it_answers_202_while_redis_is_down_and_the_sweep_catches_up(
        client, full_token, scenario_loader, tmp_path, settings, workers_on, project,
        declare_location):
    settings.RECOVERYDASH_RATE_LIMIT_PER_SECOND = 0
    declare_location(project, tmp_path)
    redis = RedisServer().start()
    try:
        from .conftest import point_app_at

        point_app_at(redis.url, workers_on.queue, settings)
        redis.stop()
        events, expect = scenario_loader("s3_resume_one_update_early_replay", str(tmp_path))
        started = time.monotonic()
        post_events(client, full_token, events, batch=2000)
        assert time.monotonic() - started < 60
        run = Run.objects.get(run_id="s3-replay")
        assert run.event_count == len(events)
        assert not Analysis.objects.filter(run=run).exists()
        redis.start()
        workers_on(redis.url)
        from datetime import timedelta

        from django.utils import timezone

        from recoverydash.runs.analysis import sweep
        from recoverydash.storage.verification import sweep_unverified

        assert sweep() == 1
        # the verification sweep re-queues what the broker never delivered: the first pass
        # starts the generation's clock, the one after RECOVERYDASH_VERIFY_STALE_S sends it
        assert sweep_unverified() == 0
        later = timezone.now() + timedelta(seconds=settings.RECOVERYDASH_VERIFY_STALE_S + 1)
        assert sweep_unverified(now=later) == 1
        wait_for(lambda: analysed("s3-replay"), timeout=90)
        recovery, plan_status, plan = read(client, full_token, "s3-replay")
        check_expect(recovery, plan_status, plan, expect)
        assert recovery["pending_analysis"] is False
    finally:
        redis.stop()
