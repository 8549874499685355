"""The demo's Megatron-Core run (j), without running it: its expected counts follow Megatron's own
ramp-up rule, its truth is read from the sample log by the definitions, and it is left out, with
the reason said, where it cannot run. The run itself: tests/demo/test_demo.py (slow)."""

from __future__ import annotations

import json

import pytest

from recoverydash.demo import megatron as mg
from recoverydash.demo.__main__ import S3Mode, megatron_scenario, scenarios, without_unrunnable


def test_the_ramp_is_megatrons_own():
    """Samples per update from ``consumed_samples`` 0, against megatron-core's calculator (the
    example counts ``consumed_samples`` the same way: microbatches x micro batch x ranks)."""
    nmc = pytest.importorskip("megatron.core.num_microbatches_calculator")
    nmc.init_num_microbatches_calculator(0, list(mg.RAMPUP), 8, 2, 1, False)
    try:
        took, consumed = [], 0
        for _ in range(12):
            nmc.update_num_microbatches(consumed, consistency_check=False)
            took.append(nmc.get_num_microbatches() * 2)
            consumed += took[-1]
    finally:
        nmc.destroy_num_microbatches_calculator()
    assert took == mg.ramp_samples(12) == [4, 4, 6, 6, 8, 8, 8, 8, 8, 8, 8, 8]


def test_the_expected_counts_of_the_run():
    s = megatron_scenario()
    assert [x.key for x in scenarios() if x.trainer == "megatron"] == [s.key] == ["j"]
    assert (s.restart["replayed"], s.restart["recomputed"], s.restart["lost_updates"]) == \
        (20 * 32, 16 * 32, 2)
    assert s.restart["units"] == "tokens" and s.generations == {
        "u000000004-a0": ("restorable", None)}


def test_the_truth_is_read_from_the_token_values_the_model_received(tmp_path):
    """Attempt 0: updates 1-2 took tokens 0-9, update 3 (rolled back) 10-14; attempt 1 takes
    5-12: 5-9 are replayed (the lineage's), 10-12 recomputed (the rolled-back update's)."""
    log = tmp_path / "log.jsonl"
    rows = [{"attempt": 0, "update": 1, "tokens": [[0, 5]]},
            {"attempt": 0, "update": 2, "tokens": [[5, 10]]},
            {"attempt": 0, "update": 3, "tokens": [[10, 15]]},
            {"attempt": 1, "update": 3, "tokens": [[5, 9]]},
            {"attempt": 1, "update": 4, "tokens": [[9, 13]]}]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert mg.token_truth(log, 2) == {"replayed": 5, "recomputed": 3}


def test_the_run_is_left_out_in_s3_mode_with_the_reason(capsys):
    s3 = S3Mode(url="s3://b", bucket="b", prefix="")
    kept = without_unrunnable(scenarios(), s3)
    assert [s.key for s in kept] == list("abcdefghi")
    assert "run (j) left out: S3 mode" in capsys.readouterr().out
