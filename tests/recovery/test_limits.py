"""Memory and time stay bounded by the reports, not by the numeric reach of positions, updates or
cursors (QA: one legal span ``[0, 2**63 - 1]`` grew analysis to ~22 GB; ``[0, 2**40]`` crashed in a
BitMap64 union; updates 1 and 100,000,000 took 1.5 GB; update 2**32 overflowed a 32-bit bitmap).

Each case runs ``analyze`` in a subprocess under ``RLIMIT_AS`` = 1.5 GB and a time limit."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from recoverydash.recovery import AttemptRecord, Ledger, LedgerRecord, RunInput, analyze
from recoverydash.recovery.positions import MAX_RANGE_LENGTH

LIMIT = int(1.5 * 2 ** 30)
SECONDS = 20.0

PRELUDE = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
from recoverydash.recovery import (AttemptRecord, HeartbeatRecord, LedgerRecord, RunInput,
                                   analyze)

def span(ranges, epoch=0):
    return {{"stratum": "m", "epoch": epoch, "ranges": ranges}}

def report(run):
    try:
        out = analyze(run, now=100.0).to_dict()
    except ValueError as exc:
        print(json.dumps({{"error": str(exc)}}))
    else:
        print(json.dumps({{"strata": out["strata"], "restarts": out["restarts"]}}))
"""


def capped(body: str) -> dict:
    """Run ``body`` (after PRELUDE) under the memory cap; its last stdout line, as JSON."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    code = PRELUDE.format(limit=LIMIT) + textwrap.dedent(body)
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                          timeout=SECONDS * 3, env=env)
    elapsed = time.monotonic() - t0
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert elapsed < SECONDS, elapsed
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("stop", [2 ** 63 - 1, 2 ** 40, MAX_RANGE_LENGTH + 1])
def test_a_range_beyond_the_bound_is_a_clear_error_not_an_oom(stop):
    got = capped(f"""
        run = RunInput("r", [AttemptRecord(0, started_at=0.0)],
                       [LedgerRecord(0, 1, 0, 1.0, [span([[0, {stop}]])])])
        report(run)
    """)
    assert f"[0, {stop}]" in got["error"] and "2**30" in got["error"]


def test_a_range_beyond_the_bound_is_refused_on_every_absorb_path():
    for records in ([LedgerRecord(0, 1, 0, 1.0, [{"stratum": "m", "ranges": [[0, 2 ** 40]]}])],
                    [LedgerRecord(0, 1, 0, 1.0,
                                  [{"stratum": "m", "ranges": [[0, 2], [5, 2 ** 40]]}])],
                    [LedgerRecord(0, 1, 0, 1.0, [{"stratum": "m", "ranges": [[0, 2]]}]),
                     LedgerRecord(0, 1, 0, 1.0, [{"stratum": "m", "ranges": [[0, 2 ** 40, 3]]}])]):
        for fast in (True, False):
            with pytest.raises(ValueError, match="2\\*\\*30"):
                Ledger().absorb(records, fast=fast)


def test_the_largest_range_within_the_bound_is_cheap():
    got = capped(f"""
        run = RunInput("r", [AttemptRecord(0, started_at=0.0)],
                       [LedgerRecord(0, 1, 0, 1.0,
                                     [span([[2 ** 62, 2 ** 62 + {MAX_RANGE_LENGTH}]])]),
                        LedgerRecord(0, 2, 0, 2.0, [span([[0, {MAX_RANGE_LENGTH}, 65537]])])])
        report(run)
    """)
    assert got["strata"][0]["consumed"] == MAX_RANGE_LENGTH + len(range(0, MAX_RANGE_LENGTH, 65537))


def test_far_apart_updates_keep_times_sparse():
    got = capped("""
        run = RunInput("r", [AttemptRecord(0, started_at=0.0)],
                       [LedgerRecord(0, 1, 0, 1.0, [span([[0, 4]])]),
                        LedgerRecord(0, 100_000_000, 0, 2.0, [span([[4, 8]])]),
                        LedgerRecord(0, 2 ** 62, 0, 3.0, [span([[8, 12]])])])
        report(run)
    """)
    assert got["strata"][0]["consumed"] == 12


def test_far_apart_updates_below_a_restored_generation():
    """The useful time of a capped segment finds its last update without walking the gap."""
    got = capped("""
        from recoverydash.recovery import GenerationRecord
        attempts = [AttemptRecord(0, started_at=0.0),
                    AttemptRecord(1, started_at=9.0, resumed_from={
                        "generation_id": "g", "update": 90_000_000, "cursor": []})]
        records = [LedgerRecord(0, u, 0, float(u % 7), [span([[4 * i, 4 * i + 4]])])
                   for i, u in enumerate((1, 2, 100_000_000))]
        records.append(LedgerRecord(1, 90_000_001, 0, 10.0, [span([[8, 12]])]))
        run = RunInput("r", attempts, records, generations=[GenerationRecord("g", 0, 90_000_000)])
        report(run)
    """)
    assert got["strata"][0]["consumed"] == 12
    assert got["restarts"][0]["lost_updates"] == 10_000_000


def test_updates_beyond_32_bits_are_absorbed():
    got = capped("""
        records = [LedgerRecord(0, 2 ** 32 + u, r, float(u), [span([[8 * u + r, 8 * u + 8, 2]])])
                   for u in range(5) for r in range(2)]
        report(RunInput("r", [AttemptRecord(0, started_at=0.0)], records))
    """)
    assert got["strata"][0]["consumed"] == 40
    state = Ledger.from_records([LedgerRecord(0, 2 ** 32, 0, 1.0, [])])
    assert Ledger.from_bytes(state.to_bytes()).update_time(0, 2 ** 32) == 1.0
    with pytest.raises(ValueError, match="update"):
        Ledger().absorb([LedgerRecord(0, 2 ** 63, 0, 1.0, [])])


def test_huge_pre_tracking_and_read_cursors_stay_intervals():
    """An untracked root's cursor at 2**62 and a read cursor at 2**62: counted, never built."""
    got = capped("""
        top = 2 ** 62
        start = {"generation_id": None, "update": 0,
                 "cursor": [{"stratum": "m", "epoch": 0, "position": top}]}
        attempts = [AttemptRecord(0, started_at=0.0, resumed_from=start, end_reason="failed",
                                  ended_at=5.0, end_update=2,
                                  end_fetched=[{"stratum": "m", "epoch": 0, "position": top + 40}]),
                    AttemptRecord(1, started_at=10.0, resumed_from=dict(start, update=0))]
        records = [LedgerRecord(0, 1, 0, 1.0, [span([[top - 4, top + 8]])]),
                   LedgerRecord(0, 2, 0, 2.0, [span([[top + 8, top + 16]])]),
                   LedgerRecord(1, 1, 0, 11.0, [span([[top - 2, top + 20]])])]
        report(RunInput("r", attempts, records,
                        [HeartbeatRecord(0, 0, 3.0, 2, [{"stratum": "m", "epoch": 0,
                                                         "position": top + 30}])]))
    """)
    main = got["strata"][0]
    top = 2 ** 62
    # live lineage: attempt 1 alone, pre-tracking [0, top) then [top - 2, top + 20)
    assert (main["consumed"], main["duplicates"], main["omissions"]) == (top + 22, 2, 0)
    first, restart = got["restarts"]  # attempt 0 resumed an untracked state: a row of its own
    assert (first["attempt"], first["verdict"], first["omitted"]) == (0, "unverified", 0)
    # K = [top - 2, top + 20), L_U = [0, top): replayed 2; recomputed: K & [top, top + 40) - L_U
    assert (restart["replayed"], restart["recomputed"]) == (2, 20)


def test_the_old_ledger_state_format_still_loads():
    """Format 1 (32-bit update bitmaps, one dense array of times) is read and converted."""
    import base64
    import zlib
    from array import array

    from pyroaring import BitMap
    times = array("d", [1.0, float("inf"), 3.0])
    doc = {"format": 1, "keys": [["m", 0, None]], "id_strata": [], "attempts": {"0": {
        "runs": [[0, 0, 0, 5, 7, 0, 4, 4, 1, 1]], "pieces": [],
        "absorbed": [[0, base64.b64encode(BitMap([5, 6, 7]).serialize()).decode()]],
        "updates": base64.b64encode(BitMap([5, 6, 7]).serialize()).decode(),
        "times": base64.b64encode(times.tobytes()).decode(), "time_base": 5}}}
    state = Ledger.from_bytes(zlib.compress(json.dumps(doc).encode()))
    assert [state.update_time(0, u) for u in (5, 6, 7)] == [1.0, None, 3.0]
    assert state.updates_in(0, 0, None) == 3
    run = RunInput("r", [AttemptRecord(0, started_at=0.0)], [])
    assert analyze(run, 10.0, ledger=state).strata[0].consumed == 12
