"""examples/hf_trainer.py (HF Transformers Trainer, tiny GPT-2 from a config) against the real
server: killed (SIGKILL) at a known update, launched again, and the server's verdicts compared
with exact values and with the truth: the sample indices the model received (the example's
``--sample-log``, read from the batches, independent of recoverydash)."""

from __future__ import annotations

import hashlib

import pytest

pytest.importorskip("django")
pytest.importorskip("transformers")
import sys

if "pytest_django.plugin" not in sys.modules:  # run with -p no:django: nothing to serve
    pytest.skip("needs the pytest-django plugin (run without -p no:django)",
                allow_module_level=True)

from .conftest import killed, launch, truth

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# 96 samples, microbatch 4, accumulation 2: 8 samples per update, 12 updates per epoch.
SAMPLES, PER_UPDATE = 96, 8
ARGS = ["--output-dir", "hf-out", "--samples", str(SAMPLES), "--batch", "4", "--accum", "2",
        "--save-steps", "5", "--sample-log", "samples.jsonl"]


def common(server, run_id, max_steps):
    return ["--url", server.url, "--token", server.token, "--run-id", run_id,
            "--max-steps", str(max_steps), *ARGS]


def crash_and_resume(server, tmp_path, run_id, *, crash_at, max_steps, resume_args=(),
                     between=None, nproc=None):
    first = launch("hf_trainer.py", [*common(server, run_id, max_steps), "--crash-at-update",
                                     str(crash_at)], tmp_path, nproc=nproc)
    assert killed(first), first.stdout + first.stderr[-3000:]
    assert "fresh start" in first.stdout
    if between is not None:
        between()
    second = launch("hf_trainer.py", [*common(server, run_id, max_steps), *resume_args],
                    tmp_path, nproc=nproc)
    assert second.returncode == 0, second.stdout + second.stderr[-3000:]
    assert f"attempt 1: completed at update {max_steps}" in second.stdout, second.stdout
    return first, second, server.recovery(run_id)


def test_a_default_resume_is_exact_and_counts_what_the_model_received(server, tmp_path):
    # saves at 5, killed at 7; resumes checkpoint-5 mid epoch 0 (position 40), runs to 20
    _, second, report = crash_and_resume(server, tmp_path, "hf-exact", crash_at=7, max_steps=20)
    assert "resuming hf-out/checkpoint-5" in second.stdout
    gens = {g["generation_id"]: g for g in report["generations"]}
    assert sorted(gens) == ["u000000005-a0", "u000000010-a1", "u000000015-a1", "u000000020-a1"]
    assert {g["status"] for g in gens.values()} == {"restorable"}, \
        [(g["generation_id"], g["reasons"]) for g in gens.values()]
    (restart,) = report["restarts"]
    t = truth(tmp_path / "samples.jsonl", 5, SAMPLES, PER_UPDATE)
    assert (t.replayed, t.omitted, t.duplicates) == (0, 0, 0)
    assert (restart["resumed_from"], restart["resumed_update"], restart["lost_updates"]) == \
        ("u000000005-a0", 5, 2)
    assert (restart["verdict"], restart["replayed"], restart["omitted"]) == ("exact", 0, 0), \
        restart
    assert restart["recomputed"] == 2 * PER_UPDATE  # updates 6 and 7, rolled back, fed again
    (main,) = report["strata"]
    assert (main["consumed"], main["duplicates"], main["omissions"]) == \
        (t.consumed, t.duplicates, t.omitted) == (20 * PER_UPDATE, 0, 0)


def test_a_relaunch_with_another_seed_is_compared_by_the_samples_the_model_received(
        server, tmp_path):
    """docs/definitions.md#epochs-under-several-orders: relaunched with another seed, Trainer
    skips the 40 positions already trained under its new order: samples fed twice and samples
    never fed, counted by identity (the SDK's indices), equal to the truth read from the batches
    once epoch 0 is left (update 12), never an exact verdict."""
    _, second, report = crash_and_resume(server, tmp_path, "hf-seed", crash_at=7, max_steps=20,
                                         resume_args=["--seed", "1"])
    assert "resuming hf-out/checkpoint-5" in second.stdout
    (restart,) = report["restarts"]
    t = truth(tmp_path / "samples.jsonl", 5, SAMPLES, PER_UPDATE)
    assert t.replayed > 0 and t.omitted > 0
    assert (restart["replayed"], restart["omitted"]) == (t.replayed, t.omitted), restart
    assert restart["verdict"] == "replay_and_omission"
    assert "order_changed" in {f["code"] for f in restart["findings"]}
    (main,) = report["strata"]
    assert (main["consumed"], main["duplicates"], main["omissions"]) == \
        (t.consumed, t.duplicates, t.omitted)


def test_ignore_data_skip_is_a_replay_of_exactly_the_samples_fed_again(server, tmp_path):
    # resumes checkpoint-5 (40 samples of epoch 0 trained), but Trainer starts epoch 0 again
    _, second, report = crash_and_resume(server, tmp_path, "hf-replay", crash_at=7,
                                         max_steps=20, resume_args=["--ignore-data-skip"])
    assert "resuming hf-out/checkpoint-5" in second.stdout
    (restart,) = report["restarts"]
    t = truth(tmp_path / "samples.jsonl", 5, SAMPLES, PER_UPDATE)
    assert (t.replayed, t.omitted) == (5 * PER_UPDATE, 0)
    assert (restart["verdict"], restart["replayed"], restart["omitted"]) == \
        ("replay", t.replayed, 0), restart
    (main,) = report["strata"]
    assert (main["duplicates"], main["omissions"], main["consumed"]) == \
        (t.duplicates, 0, t.consumed) == (40, 0, 20 * PER_UPDATE)


def test_resume_checkpoint_skips_a_checkpoint_whose_file_was_truncated(server, tmp_path):
    def truncate():
        path = tmp_path / "hf-out" / "checkpoint-10" / "model.safetensors"
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])

    # saves 5 and 10, killed at 12; checkpoint-10's weights cut in half before the relaunch:
    # Trainer's own choice (the newest folder) would load it
    _, second, report = crash_and_resume(server, tmp_path, "hf-torn", crash_at=12, max_steps=15,
                                         between=truncate)
    assert "resuming hf-out/checkpoint-5" in second.stdout, second.stdout
    (restart,) = report["restarts"]
    assert (restart["resumed_from"], restart["lost_updates"]) == ("u000000005-a0", 7)
    t = truth(tmp_path / "samples.jsonl", 5, SAMPLES, PER_UPDATE)
    assert (restart["verdict"], restart["replayed"], restart["omitted"]) == \
        ("exact", t.replayed, t.omitted) == ("exact", 0, 0)
    assert restart["recomputed"] == 7 * PER_UPDATE

    # The relaunch reached update 10 again and Trainer rewrote checkpoint-10 in place; an exact
    # resume of this seeded CPU run usually writes the very bytes a0 wrote, so a0's files are
    # whole again: the storage check says what the files hold now, whichever it is.
    from recoverydash.runs.models import Generation
    from recoverydash.storage.verification import verify_generation

    def recheck(*generation_ids):
        for gid in generation_ids:
            verify_generation(Generation.objects.get(generation_id=gid).pk, recheck=True)
        return {g["generation_id"]: g for g in server.recovery("hf-torn")["generations"]}

    model = tmp_path / "hf-out" / "checkpoint-10" / "model.safetensors"
    a0 = Generation.objects.get(generation_id="u000000010-a0")
    folder = model.parent
    same = all(hashlib.sha256((folder / o.uri.rsplit("/", 1)[1]).read_bytes()).hexdigest()
               == o.sha256 for o in a0.checkpoint_objects.all())
    gens = recheck("u000000010-a0")
    assert gens["u000000010-a0"]["status"] == ("restorable" if same else "rejected")

    # Other bytes of the same size (what nondeterministic kernels would write): the next
    # storage check of each generation naming the file rejects it; the others stay restorable.
    data = bytearray(model.read_bytes())
    data[-1] ^= 0xFF
    model.write_bytes(bytes(data))
    gens = recheck("u000000010-a0", "u000000010-a1")
    for gid in ("u000000010-a0", "u000000010-a1"):
        assert gens[gid]["status"] == "rejected"
        assert {r["code"] for r in gens[gid]["reasons"]} == {"digest_mismatch"}
    assert {gens[g]["status"] for g in ("u000000005-a0", "u000000015-a1")} == {"restorable"}


def test_two_ranks_report_their_own_positions_and_the_resume_is_exact(server, tmp_path):
    # torchrun, 2 gloo ranks: 16 samples per update, 6 per epoch; saves 5, killed at 7
    _, second, report = crash_and_resume(server, tmp_path, "hf-ddp", crash_at=7, max_steps=10,
                                         nproc=2)
    assert "resuming hf-out/checkpoint-5" in second.stdout
    gens = {g["generation_id"]: g for g in report["generations"]}
    assert sorted(gens) == ["u000000005-a0", "u000000010-a1"]
    assert {g["status"] for g in gens.values()} == {"restorable"}, \
        [(g["generation_id"], g["reasons"]) for g in gens.values()]
    (restart,) = report["restarts"]
    t = truth(tmp_path / "samples.jsonl", 5, SAMPLES, 2 * PER_UPDATE)
    assert (restart["verdict"], restart["replayed"], restart["omitted"]) == \
        ("exact", t.replayed, t.omitted) == ("exact", 0, 0)
    assert (restart["world_size_before"], restart["world_size_after"]) == (2, 2)
    (main,) = report["strata"]
    assert (main["consumed"], main["duplicates"], main["omissions"]) == \
        (t.consumed, 0, 0) == (10 * 2 * PER_UPDATE, 0, 0)
