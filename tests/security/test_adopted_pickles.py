"""An adopted ``.ckpt`` whose pickle names ``os.system`` and ``eval`` (nothing runs) is never
restorable: through beat's discovery task and the worker's analysis it is ``rejected`` with
``refused_globals`` naming both, and the generation page lists them; one whose zip declares
64 MiB of NONE is refused unread."""

from __future__ import annotations

import os

import pytest

from recoverydash.runs.models import Generation, Run
from recoverydash.storage.models import KIND_ADOPT
from tests.checkpoints.test_pickle_budget import PWNED, evil_ckpt, none_flood, write_ckpt

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def worker(settings):
    """Beat's discovery task as a worker runs it (eagerly: what it enqueues runs here too)."""
    settings.CELERY_TASK_ALWAYS_EAGER = True

    def run():
        from workers.tasks import discover_manifests

        discover_manifests.apply().get()

    return run


def test_an_adopted_ckpt_naming_os_system_and_eval_is_rejected_and_its_page_lists_them(
        project, tmp_path, declare_location, worker, member_client):
    if os.path.exists(PWNED):
        os.remove(PWNED)
    root = tmp_path / "lit"
    root.mkdir()
    evil_ckpt(root / "epoch=0-step=10.ckpt")
    write_ckpt(root / "epoch=0-step=20.ckpt", none_flood(64 * 1024 * 1024))
    declare_location(project, root, kind=KIND_ADOPT, format="lightning")
    worker()
    assert not os.path.exists(PWNED)
    run = Run.objects.get(project=project, run_id="adopted-lit")
    gens = {g.generation_id: g for g in Generation.objects.filter(run=run)}
    evil = gens["epoch=0-step=10.ckpt"]
    assert evil.status == "rejected"
    assert [r["code"] for r in evil.reasons] == ["refused_globals"]
    assert evil.reasons[0]["detail"] == (
        "epoch=0-step=10.ckpt names 2 global(s) a checkpoint loader must not import: "
        "builtins.eval, posix.system (read as inert placeholders: nothing ran; "
        "torch.load(weights_only=True) refuses them too)")
    assert evil.manifest["adopted"]["refused_globals"] == ["builtins.eval", "posix.system"]
    flood = gens["epoch=0-step=20.ckpt"]
    assert flood.status == "rejected"
    assert flood.reasons == [{"code": "schema_unsupported", "detail": (
        "epoch=0-step=20.ckpt: data.pkl declares 67108867 bytes, over the 67108864 a pickle "
        "may have: not read")}]
    assert run.analysis.result["last_restorable"] is None

    page = member_client.get(f"/p/{project.name}/runs/adopted-lit/generations/"
                             "epoch=0-step=10.ckpt/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "<code>refused_globals</code>" in html
    listed = html.split('<div class="refused-globals">', 1)[1].split("</div>", 1)[0]
    assert "Its pickles name 2 globals that no checkpoint loader should import" in listed
    assert listed.count("<li>") == 2
    assert "<li><code>builtins.eval</code></li>" in listed
    assert "<li><code>posix.system</code></li>" in listed
