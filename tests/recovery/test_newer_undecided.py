"""``recovery.figures.newer_undecided`` (docs/definitions.md#newer-undecided): the generations a
restore plan passes over undecided: committed or pending, above the named update, with a state on
the live lineage; newest first, at most NEWER_UNDECIDED_SHOWN."""

from __future__ import annotations

from recoverydash.recovery.figures import NEWER_UNDECIDED_SHOWN, newer_undecided
from recoverydash.recovery.generations import GenerationVerdict
from recoverydash.recovery.lineage import Lineage, Segment

#: attempt 0 wrote updates 1..; attempt 1 resumed at 90 and went on; attempt 2 resumed from
#: attempt 1's update 250 and is live. Attempt 1's updates above 250 were rolled back.
LIVE = Lineage((Segment(2, 250, None), Segment(1, 90, 250), Segment(0, 0, 90)))


def v(gen, attempt, update, status):
    return GenerationVerdict(generation_id=gen, attempt=attempt, update=update, status=status)


def test_it_lists_the_undecided_generations_above_the_named_one_on_the_live_lineage():
    named = v("g100", 1, 100, "restorable")
    verdicts = [v("g50", 0, 50, "committed"), named,
                v("g150", 0, 150, "committed"),  # attempt 0 above 90: rolled back by attempt 1
                v("g120", 1, 120, "rejected"), v("g130", 1, 130, "abandoned"),
                v("g100b", 1, 100, "committed"),  # not above the named update
                v("g200", 1, 200, "committed"),
                v("g280", 1, 280, "committed"),  # attempt 1 above 250: rolled back by attempt 2
                v("g300", 2, 300, "pending"),
                v("g250", 2, None, "pending"), v("g180", 1, 180, "restorable")]
    assert newer_undecided(verdicts, LIVE, named) == [
        {"generation_id": "g300", "update": 300, "status": "pending"},
        {"generation_id": "g200", "update": 200, "status": "committed"}]
    assert newer_undecided(verdicts, LIVE, None) == []
    assert newer_undecided(verdicts, LIVE, v("g?", 1, None, "restorable")) == []


def test_it_keeps_the_newest_shown():
    named = v("g0", 0, 0, "restorable")
    whole = Lineage((Segment(0, 0, None),))
    verdicts = [named] + [v(f"g{u}", 0, u, "committed") for u in range(1, 31)]
    out = newer_undecided(verdicts, whole, named)
    assert NEWER_UNDECIDED_SHOWN == 20
    assert [g["update"] for g in out] == list(range(30, 10, -1))
