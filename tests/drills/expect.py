"""What the drill report of a correct trainer holds, whichever trainer it drilled (the drills
over examples/train_ddp.py, the HF Trainer and Lightning examples share the geometry: 8 updates,
a generation every 2, the faulted one of update 4)."""

from __future__ import annotations

import json

POINTS = ("before_shards", "during_shard", "before_commit", "after_commit",
          "corrupt_after_commit")


def assert_every_point_passed(report: dict, g2: str, g4: str) -> dict:
    """Assert the report of a correct trainer drilled at every crash point of :data:`POINTS`:
    the rules' generation restored (``g2``, the generation of update 2, or ``g4``, of update 4,
    when its manifest was committed), no divergence,
    the parameters equal to the control's after the resume, the server's verdict exact, lost
    updates 2, 0 and 3. Returns the drills by crash point for the trainer's own checks."""
    assert report["control"]["updates"] == 8, report["control"]
    by = {d["point"]: d for d in report["drills"]}
    assert {p: (d["expected"], d["restored"]) for p, d in by.items()} == {
        "before_shards": (g2, g2), "during_shard": (g2, g2), "before_commit": (g2, g2),
        "after_commit": (g4, g4), "corrupt_after_commit": (g2, g2)}
    assert by["corrupt_after_commit"]["corrupted"]["generation_id"] == g4
    for d in report["drills"]:
        assert d["crash"]["reached"] and d["crash"]["returncode"] != 0, d
        assert d["first_divergence"] is None, d
        restored_update = 4 if d["point"] == "after_commit" else 2
        assert d["restored_update"] == restored_update
        assert d["state"] == {"match": True, "first_mismatch": None,
                              "updates_compared": 8 - restored_update}, d
        assert (d["server"]["verdict"], d["server"]["replayed"], d["server"]["omitted"]) == \
            ("exact", 0, 0), d["server"]
        assert d["server"]["resumed_from"] == d["restored"]
        assert d["passed"], d["failures"]
    # the crash of generation u4 lost the updates after u2 (3 and 4); the corrupt drill killed
    # after update 5 and fell back to u2 (3 lost)
    assert [by[p]["cost"]["lost_updates"] for p in ("before_shards", "after_commit",
                                                   "corrupt_after_commit")] == [2, 0, 3]
    assert report["passed"] is True and report["sent"] is True
    json.dumps(report)
    return by
