"""examples/megatron_gpt.py (Megatron-Core's GPTDataset blended over two synthetic sources, its
batch-size ramp-up, a pretraining loop on CPU/gloo) against the real server, in tokens: crashed,
launched again, and the server's figures compared with the truth read from the token values the
model received (the example's ``--sample-log``: every token's value is its offset in its source,
so which tokens were fed twice is a fact of the tensors, independent of recoverydash)."""

from __future__ import annotations

import json
import sys
from collections import Counter

import pytest

pytest.importorskip("django")
pytest.importorskip("megatron.core.datasets.gpt_dataset")

if "pytest_django.plugin" not in sys.modules:  # run with -p no:django: nothing to serve
    pytest.skip("needs the pytest-django plugin (run without -p no:django)",
                allow_module_level=True)

from .conftest import launch

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SEQ = 32
CODE = 1_000_000  # the second source's first token value (examples/megatron_gpt.py SOURCES)


def args(server, run_id, updates, *extra):
    return ["--url", server.url, "--token", server.token, "--run-id", run_id,
            "--location", "ckpt", "--data", "data", "--updates", str(updates),
            "--save-every", "5", "--seq", str(SEQ), "--sample-log", "tokens.jsonl",
            "--rampup", "4", "2", "16", *extra]


def token_truth(path, resumed_update: int, attempt: int = 1) -> dict:
    """Per source (``web``, ``code``) and in all: the tokens the live lineage received (attempt
    0 up to ``resumed_update``, then ``attempt``), how many it received twice, and how many of
    ``attempt``'s it had received before the resume (replayed)."""
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    before = [x for x in lines if x["attempt"] == 0 and x["update"] <= resumed_update]
    after = [x for x in lines if x["attempt"] == attempt]
    fed: Counter = Counter()
    for x in before:
        for a, b in x["tokens"]:
            fed.update(range(a, b))
    seen_before = set(fed)
    replayed = 0
    for x in after:
        for a, b in x["tokens"]:
            replayed += sum(1 for v in range(a, b) if v in seen_before)
            fed.update(range(a, b))
    out = {"replayed": replayed, "consumed": sum(fed.values()),
           "duplicates": sum(n - 1 for n in fed.values())}
    for name, keep in (("web", lambda v: v < CODE), ("code", lambda v: v >= CODE)):
        mine = {v: n for v, n in fed.items() if keep(v)}
        out[name] = (sum(mine.values()), sum(n - 1 for n in mine.values()))
    return out


def run(server, tmp_path, run_id, first_extra=(), second_extra=(), nproc=(None, None),
        updates=20):
    first = launch("megatron_gpt.py", args(server, run_id, updates, *first_extra), tmp_path,
                   nproc=nproc[0])
    assert first.returncode in (3, 1), first.stdout + first.stderr[-3000:]
    assert "attempt 0: fresh start" in first.stdout, first.stdout + first.stderr[-3000:]
    second = launch("megatron_gpt.py", args(server, run_id, updates, *second_extra), tmp_path,
                    nproc=nproc[1])
    assert second.returncode == 0, second.stdout + second.stderr[-3000:]
    assert f"attempt 1: completed at update {updates}" in second.stdout, second.stdout
    return second, server.recovery(run_id)


def strata(report) -> dict:
    return {s["stratum"]: s for s in report["strata"]}


def test_killed_mid_accumulation_resumes_the_token_stream_exactly(server, tmp_path):
    second, report = run(server, tmp_path, "mg-mid-accum",
                         first_extra=("--crash-at-update", "12", "--crash-after-micro", "1"))
    assert "resumed u000000010-a0 at update 10" in second.stdout, (
        second.stdout, [(g["generation_id"], g["reasons"]) for g in report["generations"]])
    t = token_truth(tmp_path / "tokens.jsonl", 10)
    (restart,) = report["restarts"]
    assert (restart["verdict"], restart["replayed"], restart["omitted"], restart["units"]) == \
        ("exact", 0, 0, "tokens")
    assert t["replayed"] == t["duplicates"] == 0
    # the two committed updates 11-12 the crash rolled back are fed again: 8 samples each
    assert restart["recomputed"] == 2 * 8 * SEQ
    rows = strata(report)
    assert {name: (r["consumed"], r["duplicates"], r["omissions"], r["units"])
            for name, r in rows.items()} == {
        "web": (t["web"][0], 0, 0, "tokens"), "code": (t["code"][0], 0, 0, "tokens")}
    assert t["consumed"] == rows["web"]["consumed"] + rows["code"]["consumed"]


def test_a_restart_without_the_data_state_replays_exactly_the_tokens_fed_again(server,
                                                                                tmp_path):
    second, report = run(server, tmp_path, "mg-no-data",
                         first_extra=("--crash-at-update", "12"),
                         second_extra=("--no-restore-data",))
    assert "consumed_samples 0" in second.stdout, second.stdout
    t = token_truth(tmp_path / "tokens.jsonl", 10)
    (restart,) = report["restarts"]
    assert restart["verdict"] == "replay" and restart["units"] == "tokens"
    # updates 1-10 took 4, 6, 8, 8... samples on the ramp: every token of them is fed again
    assert restart["replayed"] == t["replayed"] > 0
    rows = strata(report)
    assert rows["web"]["duplicates"] + rows["code"]["duplicates"] == t["duplicates"] == \
        t["replayed"]
    assert (rows["web"]["duplicates"], rows["code"]["duplicates"]) == (t["web"][1], t["code"][1])


def test_a_resume_on_another_world_size_continues_the_global_order(server, tmp_path):
    second, report = run(server, tmp_path, "mg-world", first_extra=("--crash-at-update", "12"),
                         nproc=(2, None))
    t = token_truth(tmp_path / "tokens.jsonl", 10)
    (restart,) = report["restarts"]
    assert restart["resumed_from"] == "u000000010-a0"
    assert (restart["world_size_before"], restart["world_size_after"]) == (2, 1)
    assert (restart["verdict"], restart["replayed"], restart["omitted"]) == ("exact", 0, 0)
    assert t["replayed"] == t["duplicates"] == 0
    assert sum(r["consumed"] for r in report["strata"]) == t["consumed"]


def test_a_checkpoint_whose_data_state_lags_its_model_is_never_restored(server, tmp_path):
    second, report = run(server, tmp_path, "mg-lag", first_extra=("--crash-at-update", "12",
                                                                  "--lag-data-state"))
    first_gens = [g for g in report["generations"] if g["attempt"] == 0]
    assert [g["generation_id"] for g in first_gens] == ["u000000005-a0", "u000000010-a0"]
    for g in first_gens:
        assert g["status"] == "rejected", g
        assert "data_cursor_mismatch" in {r["code"] for r in g["reasons"]}, g
    # nothing of attempt 0 is restorable: the relaunch starts fresh rather than pairing the
    # model of update 10 with the data state of update 9
    assert "attempt 1: fresh start" in second.stdout, second.stdout


def test_a_restart_inside_the_batch_size_ramp_is_exact_in_tokens(server, tmp_path):
    """The ramp (``--rampup 4 2 16``: updates take 4, 4, 6, 6, then 8 samples) crosses the
    restart: a generation every 2 updates, killed inside update 4 after one microbatch, resumed
    from update 2 (``consumed_samples`` 8, where the global batch is 6). The resumed attempt
    takes 6, 6, 8, 8, ... samples, as Megatron's calculator says for that cursor, and the
    verdict and counts are exact in tokens."""
    second, report = run(server, tmp_path, "mg-ramp", updates=8,
                         first_extra=("--save-every", "2", "--crash-at-update", "3",
                                      "--crash-after-micro", "1"),
                         second_extra=("--save-every", "2"))
    assert "resumed u000000002-a0 at update 2, consumed_samples 8" in second.stdout, \
        second.stdout
    lines = [json.loads(x) for x in (tmp_path / "tokens.jsonl").read_text().splitlines()]
    per_update: Counter = Counter()
    for x in lines:
        per_update[(x["attempt"], x["update"])] += sum(b - a for a, b in x["tokens"])
    # what the model received per update, in samples: the ramp on both sides of the restart
    assert [per_update[(0, u)] // SEQ for u in (1, 2, 3)] == [4, 4, 6]
    assert [per_update[(1, u)] // SEQ for u in range(3, 9)] == [6, 6, 8, 8, 8, 8]
    t = token_truth(tmp_path / "tokens.jsonl", 2)
    assert t["replayed"] == t["duplicates"] == 0
    (restart,) = report["restarts"]
    assert (restart["resumed_from"], restart["verdict"], restart["units"], restart["replayed"],
            restart["omitted"], restart["lost_updates"]) == \
        ("u000000002-a0", "exact", "tokens", 0, 0, 1)
    # the expected cursor: the 8 samples of updates 1-2, in tokens, over the two sources
    assert sum(c["position"] for c in restart["expected_cursor"]) == 8 * SEQ
    # update 3 (6 samples), rolled back, is fed again
    assert restart["recomputed"] == 6 * SEQ
    rows = strata(report)
    assert {name: (r["consumed"], r["duplicates"], r["omissions"]) for name, r in rows.items()} \
        == {"web": (t["web"][0], 0, 0), "code": (t["code"][0], 0, 0)}
