"""The whole `make demo` pipeline: a real server process (web + worker + beat on a fresh SQLite and
filesystem broker), real 4-rank gloo training jobs with DCP checkpoints published by the SDK, every
seed fault, on a loaded machine (a process spinning on a core beside it). Every conclusion
recoverydash reaches is asserted, and every alert flip it stored is read back afterwards: no flap
(docs/definitions.md#flaps), no alert that cleared without its cause changing, and every fault the
demo injects still paged by its rule.

Before issue 26, two runs in three of this demo paged ``generation_rejected``
(data_cursor_mismatch) or ``no_restorable_generation`` and resolved them seconds later: generations
judged on evidence that was still on its way."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# every fault of the demo: each run's restart page is compared with the recovery API (screens);
# killed mid-shard (abandoned generation), commit event lost (discovery), omission, replay, and a
# restart whose loader state was not restored (a replay observed from the positions delivered)
# are asserted in detail below; j is the Megatron-Core run (tokens, batch-size ramp-up)
FAULTS = "a,b,c,d,e,f,g,h,i,j"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The whole demo once, on a loaded machine (a process spinning on a core beside it); every
    alert and alert flip it stored read back from its SQLite database afterwards."""
    base = tmp_path_factory.mktemp("demo")
    env = {**os.environ, "DEMO_EXIT": "1", "DEMO_ONLY": FAULTS, "PORT": str(_free_port()),
           "RECOVERYDASH_DEMO_DIR": str(base / "demo"), "DEMO_ANALYSIS_TIMEOUT": "120",
           "DEMO_SCREENSHOTS": str(base / "shots")}
    for name in ("DATABASE_URL", "CELERY_BROKER_URL"):
        env.pop(name, None)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        proc = subprocess.run([sys.executable, "-m", "recoverydash.demo"], cwd=str(REPO), env=env,
                              capture_output=True, text=True, timeout=900, check=False)
    finally:
        hog.kill()
        hog.wait()
    results = json.loads((base / "demo" / "results.json").read_text())
    db = sqlite3.connect(base / "demo" / "var" / "recoverydash.sqlite3")
    alerts = db.execute("SELECT a.id, r.run_id, a.rule, a.state, a.resolved_by, a.flaps "
                        "FROM alerts_alert a JOIN runs_run r ON r.id = a.run_id "
                        "ORDER BY a.id").fetchall()
    flips = db.execute("SELECT alert_id, old_state, new_state, reason, created_at, cleared "
                       "FROM alerts_alertflip ORDER BY created_at, id").fetchall()
    db.close()
    by_id = {a[0]: a for a in alerts}
    print("every alert flip of the demo:")
    for alert_id, old, new, reason, at, _ in flips:
        print(f"  {at} {by_id[alert_id][1]} {by_id[alert_id][2]} {old or '-'} -> {new}: "
              f"{reason[:160]}")
    return proc, results, alerts, flips


def _run(results, key):
    return next(r for r in results["runs"] if r["key"] == key)


def _answer(results, key):
    return results["answers"][_run(results, key)["run_id"]]


def _restart(results, key):
    return next(r for r in _answer(results, key)["restarts"] if r["attempt"] == 1)


def _gen(results, key, gid):
    return next(g for g in _answer(results, key)["generations"] if g["generation_id"] == gid)


def test_the_demo_exits_0_and_every_conclusion_matches(demo):
    proc, results, _, _ = demo
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert results["ok"]
    assert sorted(r["key"] for r in results["runs"]) == FAULTS.split(",")
    assert "injected fault" in proc.stdout and "10/10 conclusions match" in proc.stdout


def test_killed_mid_shard_leaves_an_abandoned_generation_and_an_exact_restart(demo):
    _, results, _, _ = demo
    g = _gen(results, "b", "u000000004-a0")
    assert g["status"] == "abandoned"
    assert "never_committed" in [r["code"] for r in g["reasons"]]
    r = _restart(results, "b")
    assert (r["resumed_from"], r["verdict"], r["replayed"], r["omitted"], r["recomputed"],
            r["lost_updates"]) == ("u000000002-a0", "exact", 0, 0, 32, 2)


def test_a_manifest_whose_commit_event_was_lost_is_discovered_and_restorable(demo):
    _, results, _, _ = demo
    assert _gen(results, "d", "u000000004-a0")["status"] == "restorable"
    r = _restart(results, "d")
    assert (r["resumed_from"], r["verdict"], r["recomputed"], r["lost_updates"]) \
        == ("u000000004-a0", "exact", 0, 0)


def test_resuming_from_the_read_cursor_is_an_omission(demo):
    _, results, _, _ = demo
    r = _restart(results, "f")
    assert (r["verdict"], r["omitted"], r["replayed"]) == ("omission", 24, 0)
    assert r["expected_cursor"][0]["position"] == 64 and r["resume_cursor"][0]["position"] == 88
    assert "restart_omission" in {a["rule"] for a in _answer(results, "f")["alerts"]}


def test_resuming_from_an_older_cursor_is_a_replay(demo):
    _, results, _, _ = demo
    r = _restart(results, "g")
    assert (r["verdict"], r["replayed"], r["omitted"], r["recomputed"]) == ("replay", 16, 0, 24)
    assert "restart_replay" in {a["rule"] for a in _answer(results, "g")["alerts"]}


def test_a_loader_whose_state_was_not_restored_replays_what_the_checkpoint_had_consumed(demo):
    _, results, _, _ = demo
    r = _restart(results, "i")
    assert (r["verdict"], r["replayed"], r["omitted"], r["recomputed"], r["lost_updates"]) == \
        ("replay", 64, 0, 24, 1)
    assert r["expected_cursor"][0]["position"] == 64 and r["resume_cursor"][0]["position"] == 0
    assert "restart_replay" in {a["rule"] for a in _answer(results, "i")["alerts"]}


def test_a_megatron_run_without_its_consumed_samples_replays_its_tokens(demo):
    """The Megatron-Core run (j): the ramp took 4, 4, 6, 6 samples of 32 tokens in updates 1-4
    and 8 + 8 in the rolled-back updates 5-6; the restart from update 4 starts
    ``consumed_samples`` at 0 and takes samples 0-35 again. The truth is the example's sample
    log (the token values the model received), read by the demo beside the analysis."""
    _, results, _, _ = demo
    r = _restart(results, "j")
    assert (r["resumed_from"], r["verdict"], r["units"], r["replayed"], r["omitted"],
            r["recomputed"], r["lost_updates"]) == \
        ("u000000004-a0", "replay", "tokens", 20 * 32, 0, 16 * 32, 2)
    assert "truth (what the model received): replayed 640, recomputed 512 tokens" in \
        _run(results, "j")["concluded"]
    assert "restart_replay" in {a["rule"] for a in _answer(results, "j")["alerts"]}
    strata = {s["stratum"]: s for s in _answer(results, "j")["strata"]}
    assert set(strata) == {"web", "code"} and {s["units"] for s in strata.values()} == {"tokens"}
    assert sum(s["duplicates"] for s in strata.values()) == 640


def test_the_dashboard_shows_each_fault_where_on_call_looks(demo):
    """Screenshots in headless Chromium: each run page names the verdict or the abandoned
    generation, and each restart page shows the replayed / omitted counts, every number of it
    the recovery API's (``dashboard.agreement``: one answer per page)."""
    _, results, _, _ = demo
    screens = results["screens"]
    assert screens and sorted(r["key"] for r in screens) == FAULTS.split(",")
    for record in screens:
        assert record["missing"] == [], record
        for shot in record["shots"]:
            assert Path(shot).stat().st_size > 10_000, shot


def test_no_alert_flapped(demo):
    _, _, alerts, flips = demo
    assert [a for a in alerts if a[5]] == []
    flapped = [json.loads(c) for *_, c in flips if c]
    assert [c for cleared in flapped for c in cleared if c["flap"]] == []


def test_no_alert_cleared_without_its_cause_changing(demo):
    _, _, alerts, flips = demo
    by_id = {a[0]: a for a in alerts}
    cleared = [(by_id[alert_id][1], by_id[alert_id][2], json.loads(c or "null"))
               for alert_id, old, new, _, _, c in flips
               if new == "resolved" and not by_id[alert_id][4] or old == new and c]
    assert [(run, rule, c) for run, rule, entries in cleared for c in entries or [None]
            if c is None or c["cause"] != "changed"] == []


def test_every_injected_fault_is_still_paged(demo):
    from recoverydash.demo.__main__ import scenarios

    _, _, alerts, _ = demo
    fired = {(run_id, rule) for _, run_id, rule, *_ in alerts}
    expected = {(s.run_id, rule) for s in scenarios() for rule in s.alerts}
    assert expected and expected <= fired
    # and nothing a fault does not cause: the alerts are exactly the injected faults'
    assert fired == expected
