"""Generation ids stored before the identifier rule (or read from storage) may hold characters a
URL path cannot carry plainly: every page that links a generation still answers, never a 500."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 1, tzinfo=UTC)


@pytest.fixture
def legacy_run(project):
    """A run whose generations are named ``ckpt/g10`` and ``step 20?#%`` (stored before the
    rule), attempt 1 resumed from the first; its stored analysis names both."""
    from recoverydash.runs.models import Analysis, Attempt, Generation, Run

    run = Run.objects.create(project=project, run_id="legacy", first_event_at=T0,
                             last_event_at=T0 + timedelta(minutes=30),
                             last_received_at=datetime.now(UTC))
    Attempt.objects.create(run=run, attempt=0, started_at=T0, world_size=1,
                           dataset_version="v1", end_reason="failed", end_update=12)
    Attempt.objects.create(run=run, attempt=1, started_at=T0 + timedelta(minutes=20),
                           world_size=1, dataset_version="v1",
                           resumed_from={"generation_id": "ckpt/g10", "update": 10})
    for gid, update, status in (("ckpt/g10", 10, "restorable"), ("step 20?#%", 20, "rejected")):
        Generation.objects.create(run=run, generation_id=gid, attempt=0, update=update,
                                  committed_at=T0 + timedelta(minutes=update), status=status,
                                  manifest={"generation_id": gid, "update": update})
    last = {"generation_id": "ckpt/g10", "update": 10,
            "committed_at": (T0 + timedelta(minutes=10)).isoformat()}
    Analysis.objects.create(run=run, computed_at=datetime.now(UTC), ingest_seq=0,
                            health="at_risk", result={
        "run_id": "legacy", "health": "at_risk", "last_restorable": last, "updates_at_risk": 2,
        "generations": [{"generation_id": "ckpt/g10", "attempt": 0, "update": 10,
                         "status": "restorable", "reasons": []},
                        {"generation_id": "step 20?#%", "attempt": 0, "update": 20,
                         "status": "rejected",
                         "reasons": [{"code": "shard_missing", "detail": "rank0"}]}],
        "restarts": [{"attempt": 1, "resumed_from": "ckpt/g10", "resumed_update": 10,
                      "world_size_before": 1, "world_size_after": 1, "expected_cursor": [],
                      "resume_cursor": [], "replayed": 0, "omitted": 0, "recomputed": 0,
                      "lost_updates": 2, "lost_seconds": 60.0, "recovery_seconds": 30.0,
                      "verdict": "exact", "findings": []}],
        "strata": [], "restorable_elsewhere": []})
    return run


def test_a_slash_in_a_stored_generation_id_never_500s_a_page(member_client, legacy_run):
    base = "/p/alpha/runs/legacy/"
    for url in ("/", base, f"{base}restarts/1/", f"{base}?fragment=live"):
        response = member_client.get(url)
        assert response.status_code == 200, url
        assert f'href="{base}generations/ckpt%252Fg10/"' in response.content.decode(), url
    page = member_client.get(f"{base}generations/ckpt%252Fg10/")
    assert page.status_code == 200
    assert "Generation ckpt/g10" in page.content.decode()


def test_a_generation_id_with_url_characters_is_escaped_in_links(member_client, legacy_run):
    page = member_client.get("/p/alpha/runs/legacy/").content.decode()
    link = "/p/alpha/runs/legacy/generations/step%2020%3F%23%2525/"
    assert f'href="{link}"' in page
    response = member_client.get(link)
    assert response.status_code == 200
    assert "Generation step 20?#%" in response.content.decode()


def test_an_unknown_generation_with_a_slash_is_a_404(member_client, legacy_run):
    response = member_client.get("/p/alpha/runs/legacy/generations/no%252Fsuch/")
    assert response.status_code == 404
    assert member_client.get("/p/alpha/runs/legacy/generations/no/such/").status_code == 404
    # the address of before redirects to the new one, the slash escaped in it
    old = member_client.get(f"/runs/{legacy_run.pk}/generations/ckpt/g10/")
    assert old.status_code == 301
    assert old["Location"] == "/p/alpha/runs/legacy/generations/ckpt%252Fg10/"
