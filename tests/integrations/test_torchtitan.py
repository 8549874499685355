"""examples/torchtitan_train.py (torchtitan's CheckpointManager and HuggingFaceTextDataLoader in
a CPU/gloo loop) against the real server: every step-N/ folder published once its .metadata is
there (sync and async saves), the step to load chosen among restorable generations (not the
highest folder with a .metadata, torchtitan #1729), and the token stream compared with the truth
read from the token values the model received (each value is its offset in the corpus)."""

from __future__ import annotations

import json
import os
import sys

import pytest

pytest.importorskip("django")
pytest.importorskip("torchtitan.components.checkpoint")

if "pytest_django.plugin" not in sys.modules:  # run with -p no:django: nothing to serve
    pytest.skip("needs the pytest-django plugin (run without -p no:django)",
                allow_module_level=True)

from .conftest import launch

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PER_STEP = 2 * 2 * 64  # micro 2 x accumulation 2 x seq_len 64 tokens


def args(server, run_id, steps, *extra):
    return ["--url", server.url, "--token", server.token, "--run-id", run_id,
            "--dump", "titan", "--corpus", "corpus", "--steps", str(steps), "--save-every", "5",
            "--sample-log", "tokens.jsonl", *extra]


def run(tmp_path, *argv, nproc=None):
    os.environ.setdefault("HF_HOME", str(tmp_path / "hf"))
    return launch("torchtitan_train.py", list(argv), tmp_path, nproc=nproc)


def token_truth(path, resumed: int) -> dict:
    """Tokens the live lineage received (attempt 0 up to step ``resumed``, then attempt 1), how
    many attempt 1 received that the lineage had before, and repeats."""
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    before = [t for x in lines if x["attempt"] == 0 and x["update"] <= resumed
              for t in x["tokens"]]
    after = [t for x in lines if x["attempt"] == 1 for t in x["tokens"]]
    seen = set(before)
    return {"replayed": sum(1 for t in after if t in seen), "consumed": len(before) + len(after),
            "duplicates": len(before) + len(after) - len(set(before) | set(after))}


def test_a_killed_run_resumes_the_newest_restorable_step_and_its_token_stream(server, tmp_path):
    first = run(tmp_path, *args(server, "tt-exact", 20, "--crash-at-step", "12",
                                "--crash-after-micro", "1"))
    assert first.returncode == 3, first.stdout + first.stderr[-3000:]
    second = run(tmp_path, *args(server, "tt-exact", 20))
    assert "attempt 1: resumed step 10" in second.stdout, second.stdout + second.stderr[-3000:]
    report = server.recovery("tt-exact")
    gens = {g["generation_id"]: g["status"] for g in report["generations"]}
    assert gens == {"u000000005-a0": "restorable", "u000000010-a0": "restorable",
                    "u000000015-a1": "restorable", "u000000020-a1": "restorable"}, \
        [(g["generation_id"], g["reasons"]) for g in report["generations"]]
    t = token_truth(tmp_path / "tokens.jsonl", 10)
    (restart,) = report["restarts"]
    assert (restart["verdict"], restart["replayed"], restart["omitted"], restart["units"]) == \
        ("exact", 0, 0, "tokens")
    assert t["replayed"] == t["duplicates"] == 0
    assert restart["recomputed"] == 2 * PER_STEP  # steps 11 and 12 rolled back, fed again
    (stratum,) = report["strata"]
    assert (stratum["stratum"], stratum["units"], stratum["consumed"], stratum["duplicates"]) == \
        ("c4_test/dp0of1", "tokens", t["consumed"], 0) == ("c4_test/dp0of1", "tokens",
                                                             20 * PER_STEP, 0)


def test_excluding_the_dataloader_state_replays_exactly_the_tokens_fed_again(server, tmp_path):
    run(tmp_path, *args(server, "tt-nodata", 20, "--crash-at-step", "12"))
    second = run(tmp_path, *args(server, "tt-nodata", 20, "--exclude-dataloader"))
    assert "attempt 1: resumed step 10" in second.stdout, second.stdout + second.stderr[-3000:]
    report = server.recovery("tt-nodata")
    t = token_truth(tmp_path / "tokens.jsonl", 10)
    (restart,) = report["restarts"]
    assert t["replayed"] == 10 * PER_STEP
    assert (restart["verdict"], restart["replayed"], restart["units"]) == \
        ("replay", 10 * PER_STEP, "tokens")
    assert report["strata"][0]["duplicates"] == t["duplicates"] == 10 * PER_STEP


def test_async_saves_are_published_when_their_upload_completes(server, tmp_path):
    first = run(tmp_path, *args(server, "tt-async", 20, "--async-mode", "async",
                                "--crash-at-step", "12"))
    assert first.returncode == 3, first.stdout + first.stderr[-3000:]
    folder = tmp_path / "titan" / "checkpoint"
    for step in (5, 10):
        manifest = json.loads((folder / f"u{step:09d}-a0" / "recoverydash-manifest.json")
                              .read_text())
        names = {os.path.basename(o["uri"]) for o in manifest["objects"]}
        assert ".metadata" in names and any(n.endswith(".distcp") for n in names)
        assert manifest["data_progress"]["cursor"] == [
            {"stratum": "c4_test/dp0of1", "epoch": 0, "position": step * PER_STEP}]
    second = run(tmp_path, *args(server, "tt-async", 20, "--async-mode", "async"))
    assert "attempt 1: resumed step 10" in second.stdout, second.stdout + second.stderr[-3000:]
    (restart,) = server.recovery("tt-async")["restarts"]
    assert (restart["verdict"], restart["replayed"], restart["omitted"]) == ("exact", 0, 0)


def test_a_damaged_newest_step_is_passed_over_where_torchtitan_would_load_it(server, tmp_path):
    run(tmp_path, *args(server, "tt-1729", 20, "--crash-at-step", "12"))
    folder = tmp_path / "titan" / "checkpoint"
    data = sorted((folder / "step-10").glob("*.distcp"))[0]
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])  # a torn write
    # torchtitan's _find_load_step: the highest step-N with a .metadata
    steps = [int(p.name.split("-")[1]) for p in folder.glob("step-*")
             if (p / ".metadata").is_file()]
    assert max(steps) == 10
    second = run(tmp_path, *args(server, "tt-1729", 20))
    assert "attempt 1: resumed step 5" in second.stdout, second.stdout + second.stderr[-3000:]
    (restart,) = server.recovery("tt-1729")["restarts"]
    assert (restart["resumed_from"], restart["verdict"], restart["replayed"]) == \
        ("u000000005-a0", "exact", 0)


def test_a_dataloader_snapshot_behind_the_model_is_rejected(server, tmp_path):
    # one worker snapshots its state every 3 batches (torchdata's snapshot_every_n_steps): the
    # save at step 5, after batch 20, holds an older snapshot
    first = run(tmp_path, *args(server, "tt-stale", 20, "--workers", "1", "--snapshot-every",
                                "3", "--crash-at-step", "12"))
    assert first.returncode == 3, first.stdout + first.stderr[-3000:]
    report = server.recovery("tt-stale")
    for g in report["generations"]:
        assert g["status"] == "rejected", g
        assert "data_cursor_mismatch" in {r["code"] for r in g["reasons"]}, g
    manifest = json.loads((tmp_path / "titan" / "checkpoint" / "u000000005-a0" /
                           "recoverydash-manifest.json").read_text())
    position = manifest["data_progress"]["cursor"][0]["position"]
    assert position < 5 * PER_STEP and position % (2 * 64) == 0  # whole batches, behind
