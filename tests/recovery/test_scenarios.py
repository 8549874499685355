"""Every worked scenario of tests/scenarios/ reaches its `expect` through the core."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
from scenarios import NAMES as SCENARIOS
from scenarios import load

from recoverydash.recovery import RunInput, analyze, restore_plan


def object_checks(events):
    """What a storage verifier would say of every manifest object the loader wrote."""
    out = {}
    for event in events:
        for obj in (event.get("manifest") or {}).get("objects") or []:
            path = unquote(urlparse(obj["uri"]).path)
            if not os.path.exists(path):
                out[obj["uri"]] = "object_missing"
                continue
            data = Path(path).read_bytes()
            if len(data) != obj["size"]:
                out[obj["uri"]] = "size_mismatch"
            elif obj.get("sha256") and hashlib.sha256(data).hexdigest() != obj["sha256"]:
                out[obj["uri"]] = "digest_mismatch"
            else:
                out[obj["uri"]] = "ok"
    return out


@pytest.mark.parametrize("name", SCENARIOS)
def test_it_reaches_the_scenario_expectations(name, tmp_path):
    events, expect = load(name, tmp_path)
    run = RunInput.from_events(events, object_checks(events))
    analysis = analyze(run, now=run.first_event_at + 600)
    got = analysis.to_dict()
    generations = {g["generation_id"]: g for g in got["generations"]}
    for gid, want in expect.get("generations", {}).items():
        status = generations[gid]["status"]
        if "status" in want:
            assert status == want["status"], (gid, generations[gid])
        if "status_in" in want:
            assert status in want["status_in"], (gid, generations[gid])
        if "reason_any" in want:
            codes = {r["code"] for r in generations[gid]["reasons"]}
            assert codes & set(want["reason_any"]), (gid, generations[gid])
    if "last_restorable" in expect:
        assert (got["last_restorable"] or {}).get("generation_id") == expect["last_restorable"]
    if "restore_plan" in expect:
        plan = restore_plan(analysis)
        if expect["restore_plan"] is None:
            assert plan.status_code == 409
        else:
            assert plan.status_code == 200
            assert plan.body["generation_id"] == expect["restore_plan"]
    restarts = {r["attempt"]: r for r in got["restarts"]}
    for attempt, want in expect.get("restarts", {}).items():
        mine = restarts[int(attempt)]
        for field, value in want.items():
            if field == "findings_include":
                assert set(value) <= {f["code"] for f in mine["findings"]}
            else:
                assert mine[field] == value, (field, mine)
    strata = {s["stratum"]: s for s in got["strata"]}
    for stratum, want in expect.get("strata", {}).items():
        for field, value in want.items():
            assert strata[stratum][field] == value, (field, strata[stratum])


def test_the_scenarios_are_there():
    assert len(SCENARIOS) >= 5
