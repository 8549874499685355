"""examples/lightning_trainer.py (PyTorch Lightning, a small MLP) against the real server: killed
(SIGKILL) at a known update, launched again, and the server's verdicts compared with exact
values and with the truth: the sample indices ``training_step`` received (the example's
``--sample-log``, read from the batches, independent of recoverydash)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("django")
pytest.importorskip("lightning")
import sys

if "pytest_django.plugin" not in sys.modules:  # run with -p no:django: nothing to serve
    pytest.skip("needs the pytest-django plugin (run without -p no:django)",
                allow_module_level=True)

from .conftest import killed, launch, truth

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# 64 samples, microbatch 4, no accumulation: 4 samples per update, 16 updates per epoch.
SAMPLES, PER_UPDATE = 64, 4
ARGS = ["--dirpath", "pl-ckpt", "--samples", str(SAMPLES), "--batch", "4", "--save-every", "5",
        "--sample-log", "samples.jsonl"]


def crash_and_resume(server, tmp_path, run_id, *, crash_at, max_steps, extra=(), between=None):
    common = ["--url", server.url, "--token", server.token, "--run-id", run_id,
              "--max-steps", str(max_steps), *ARGS, *extra]
    first = launch("lightning_trainer.py", [*common, "--crash-at-update", str(crash_at)],
                   tmp_path)
    assert killed(first), first.stdout + first.stderr[-3000:]
    assert "fresh start" in first.stdout
    if between is not None:
        between()
    second = launch("lightning_trainer.py", common, tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr[-3000:]
    assert f"attempt 1: completed at update {max_steps}" in second.stdout, second.stdout
    return second, server.recovery(run_id)


def test_a_mid_epoch_resume_of_a_plain_loader_is_replay_and_omission(server, tmp_path):
    # saves at 5 (20 samples of epoch 0 trained), killed at 7. Lightning restores "5 batches of
    # the epoch done" but a plain DataLoader starts the epoch again: it feeds the epoch's first
    # 5 batches again (20 replayed) and ends the epoch 5 batches early (20 never fed)
    second, report = crash_and_resume(server, tmp_path, "pl-plain", crash_at=7, max_steps=24)
    assert "resuming pl-ckpt/epoch=0-step=5.ckpt" in second.stdout
    t = truth(tmp_path / "samples.jsonl", 5, SAMPLES, PER_UPDATE)
    assert (t.replayed, t.omitted) == (5 * PER_UPDATE, 5 * PER_UPDATE)
    (restart,) = report["restarts"]
    assert (restart["resumed_from"], restart["resumed_update"], restart["lost_updates"]) == \
        ("u000000005-a0-epoch=0-step=5", 5, 2)
    assert (restart["verdict"], restart["replayed"], restart["omitted"]) == \
        ("replay_and_omission", t.replayed, t.omitted), restart
    (main,) = report["strata"]
    assert (main["consumed"], main["duplicates"], main["omissions"]) == \
        (t.consumed, t.duplicates, t.omitted) == (24 * PER_UPDATE, 20, 20)
    gens = {g["generation_id"]: g for g in report["generations"]}
    assert sorted(gens) == ["u000000005-a0-epoch=0-step=5", "u000000010-a1-epoch=0-step=10",
                            "u000000015-a1-epoch=0-step=15", "u000000020-a1-epoch=1-step=20"]
    manifest = json.loads((tmp_path / "pl-ckpt" / "u000000005-a0-epoch=0-step=5"
                           / "recoverydash-manifest.json").read_text())
    (obj,) = manifest["objects"]  # one file, its components said once
    assert obj["components"] == ["model", "optimizer", "scheduler", "data_progress", "rng"]
    assert manifest["data_progress"]["cursor"] == [{"stratum": "main", "epoch": 0,
                                                    "position": 5 * PER_UPDATE}]


def test_a_stateful_loader_resumes_mid_epoch_exactly(server, tmp_path):
    # the same run with a torchdata StatefulDataLoader: Lightning saves and restores its state
    second, report = crash_and_resume(server, tmp_path, "pl-stateful", crash_at=7, max_steps=24,
                                      extra=["--stateful"])
    assert "resuming pl-ckpt/epoch=0-step=5.ckpt" in second.stdout
    t = truth(tmp_path / "samples.jsonl", 5, SAMPLES, PER_UPDATE)
    (restart,) = report["restarts"]
    assert (restart["verdict"], restart["replayed"], restart["omitted"]) == \
        ("exact", t.replayed, t.omitted) == ("exact", 0, 0), restart
    assert restart["recomputed"] == 2 * PER_UPDATE
    (main,) = report["strata"]
    assert (main["consumed"], main["duplicates"], main["omissions"]) == (24 * PER_UPDATE, 0, 0)
    assert {g["status"] for g in report["generations"]} == {"restorable"}, report["generations"]


def test_resume_checkpoint_skips_a_truncated_ckpt(server, tmp_path):
    def truncate():
        path = tmp_path / "pl-ckpt" / "epoch=0-step=10.ckpt"
        path.write_bytes(path.read_bytes()[:1000])

    # saves 5 and 10, killed at 12, epoch=0-step=10.ckpt cut short: Lightning would load it
    # if told to; resume_checkpoint verifies and takes epoch=0-step=5.ckpt
    second, report = crash_and_resume(server, tmp_path, "pl-torn", crash_at=12, max_steps=15,
                                      extra=["--stateful"], between=truncate)
    assert "resuming pl-ckpt/epoch=0-step=5.ckpt" in second.stdout, second.stdout
    (restart,) = report["restarts"]
    assert (restart["resumed_from"], restart["lost_updates"]) == \
        ("u000000005-a0-epoch=0-step=5", 7)
    assert (restart["verdict"], restart["replayed"], restart["omitted"]) == ("exact", 0, 0)

    from recoverydash.runs.models import Generation
    from recoverydash.storage.verification import verify_generation

    verify_generation(Generation.objects.get(generation_id="u000000010-a0-epoch=0-step=10").pk,
                      recheck=True)
    gens = {g["generation_id"]: g for g in server.recovery("pl-torn")["generations"]}
    rejected = gens["u000000010-a0-epoch=0-step=10"]
    assert (rejected["status"], {r["code"] for r in rejected["reasons"]}) == \
        ("rejected", {"size_mismatch"})



@pytest.mark.parametrize("stateful", [False, True], ids=["plain", "stateful"])
def test_ddp_on_two_processes_resumed_on_one_is_compared_by_sample(server, tmp_path, stateful):
    # Lightning DDP on 2 CPU processes (8 samples per update), saved at update 3 (24 samples of
    # epoch 0), killed at 5, resumed on 1 process, whose loader draws another order (no
    # DistributedSampler on one device). plain: Lightning injects torch's DistributedSampler of
    # seed 0, whose samples the server re-creates; the resumed loader starts the epoch again and
    # ends it after the 13 batches Lightning believes are left. stateful: a StatefulDataLoader's
    # torchdata RandomSampler, which Lightning wraps in its DistributedSamplerWrapper (the order
    # goes through the wrapped sampler: the integration reports its indices); the resumed loader
    # skips 3 batches of its own order. Both compared by sample with the truth of the batches
    # training_step got
    run_id = f"pl-ddp-{'stateful' if stateful else 'plain'}"
    common = ["--url", server.url, "--token", server.token, "--run-id", run_id,
              "--max-steps", "20", "--dirpath", "pl-ckpt", "--samples", str(SAMPLES),
              "--batch", "4", "--save-every", "3", "--sample-log", "samples.jsonl",
              *(["--stateful"] if stateful else [])]
    first = launch("lightning_trainer.py", [*common, "--devices", "2", "--crash-at-update", "5"],
                   tmp_path)
    assert killed(first), first.stdout + first.stderr[-3000:]
    assert "fresh start" in first.stdout
    second = launch("lightning_trainer.py", common, tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr[-3000:]
    assert "resuming pl-ckpt/epoch=0-step=3.ckpt" in second.stdout, second.stdout
    # the tail rule at the resumed attempt's batch (4 samples on 1 process, no drop_last)
    t = truth(tmp_path / "samples.jsonl", 3, SAMPLES, PER_UPDATE)
    assert (t.replayed, t.omitted, t.consumed) == (18, 6, 92)  # 24 + 13 * 4 + 4 * 4
    report = server.recovery(run_id)
    (restart,) = report["restarts"]
    assert (restart["resumed_from"], restart["resumed_update"]) == \
        ("u000000003-a0-epoch=0-step=3", 3)
    assert (restart["verdict"], restart["replayed"], restart["omitted"]) == \
        ("replay_and_omission", t.replayed, t.omitted), restart
    assert {"world_size_changed", "order_changed"} <= {f["code"] for f in restart["findings"]}
    (main,) = report["strata"]
    assert (main["consumed"], main["duplicates"], main["omissions"]) == \
        (t.consumed, t.duplicates, t.omitted)
