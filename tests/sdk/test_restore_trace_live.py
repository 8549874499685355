"""The restore answer is true when it is asked, and the restart leaves a trace (issue 12), with
processes: examples/train_ddp.py (torchrun, 2 gloo ranks) against the live server runs to its
end; then a shard of the newest generation is truncated. Within one re-check of the ended run the
restore plan and the run page name the previous generation and generation_rejected fires; a
launch told to restore the broken generation anyway skips it (restore_failed), loads the
previous one, and the restart is exact."""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

import pytest

pytest.importorskip("django")
pytest.importorskip("torch")
if "pytest_django.plugin" not in sys.modules:
    pytest.skip("needs the pytest-django plugin (run without -p no:django)",
                allow_module_level=True)

from .conftest import api_get as get  # noqa: E402
from .test_example_train_ddp import torchrun  # noqa: E402

pytestmark = pytest.mark.slow

RUN = "truncated-after-end"
# 64 samples, 2 ranks, microbatch 4, accumulation 2: 4 updates per epoch; saves at 4 and 8.
ARGS = ["--run-id", RUN, "--save-every", "4", "--samples", "64", "--micro", "4", "--accum", "2"]
NEWEST, PREVIOUS = "u000000008-a0", "u000000004-a0"


def settled(live_server, token):
    deadline = time.monotonic() + 60
    while True:
        report = get(live_server, token, f"/api/v1/runs/{RUN}/recovery")
        if not report["pending_analysis"] or time.monotonic() > deadline:
            return report
        time.sleep(0.3)


@pytest.mark.django_db(transaction=True)
def test_it_names_the_previous_generation_after_a_truncation_and_the_resume_skips_it(
        live_server, full_token, tmp_path, trainer_env, settings, client, project,
        django_user_model):
    from django.utils import timezone

    from recoverydash.storage import verification

    common = ["--url", live_server.url, "--token", full_token, "--location", "ckpt", *ARGS]
    first = torchrun([*common, "--updates", "8"], trainer_env, tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    report = settled(live_server, full_token)
    assert report["health"] == "ended" and report["last_restorable"]["generation_id"] == NEWEST

    shard = tmp_path / "ckpt" / NEWEST / "model" / "__0_0.distcp"
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) // 2)
    # one re-check of the ended run (due after RECOVERYDASH_RECHECK_ENDED_S)
    later = timezone.now() + timedelta(seconds=settings.RECOVERYDASH_RECHECK_ENDED_S + 1)
    assert verification.recheck(now=later) == 1
    report = settled(live_server, full_token)
    assert report["last_restorable"]["generation_id"] == PREVIOUS
    assert report["health"] == "ended"
    gens = {g["generation_id"]: g for g in report["generations"]}
    assert gens[NEWEST]["status"] == "rejected"
    assert [r["code"] for r in gens[NEWEST]["reasons"]] == ["size_mismatch"]
    assert [(a["rule"], a["state"]) for a in report["alerts"]] == [
        ("generation_rejected", "firing")]
    plan = get(live_server, full_token, f"/api/v1/runs/{RUN}/restore-plan")
    assert (plan["generation_id"], plan["update"]) == (PREVIOUS, 4)
    from recoverydash.runs.models import Membership, Run

    owner = django_user_model.objects.create_user("oncall", password="pw")
    Membership.objects.create(project=project, user=owner)
    client.force_login(owner)
    page = client.get(f"/runs/{Run.objects.get(run_id=RUN).pk}/", follow=True).content.decode()
    assert "Yes, from <a href=\"/p/" in page and f"{PREVIOUS}</a>" in page.split(
        "Can we resume?")[1].split("</article>")[0]

    # told to restore the broken generation anyway: the SDK checks it, skips it, loads the
    # previous one
    second = torchrun([*common, "--updates", "12", "--restore", NEWEST], trainer_env, tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"attempt 1: resumed {PREVIOUS} at update 4 (given)" in second.stdout, second.stdout
    assert "attempt 1: completed at update 12" in second.stdout
    report = settled(live_server, full_token)
    (restart,) = report["restarts"]
    assert (restart["attempt"], restart["resumed_from"], restart["resumed_update"]) == (
        1, PREVIOUS, 4)
    assert (restart["verdict"], restart["replayed"], restart["omitted"]) == ("exact", 0, 0)
    from recoverydash.runs.models import Attempt

    att = Attempt.objects.get(run__run_id=RUN, attempt=1)
    [failure] = att.restore_failures
    assert (failure["generation_id"], failure["reason"]) == (NEWEST, "object_damaged")
    assert "size_mismatch" in failure["message"]
    assert att.restore_generation_id == PREVIOUS
    rules = {a["rule"]: a for a in get(live_server, full_token,
                                       f"/api/v1/runs/{RUN}/recovery")["alerts"]}
    assert rules["restore_failed"]["severity"] == "warning"
    assert rules["restore_failed"]["summary"].startswith(
        f"Attempt 1 could not restore {NEWEST} (object_damaged")
