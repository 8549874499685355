"""``storage.confirm.newer_undecided`` (docs/definitions.md#newer-undecided): the generations a
restore plan passes over undecided: committed or pending, above the named update, of the named
generation's attempt or a later one; newest first, at most NEWER_UNDECIDED_SHOWN."""

from __future__ import annotations

from recoverydash.recovery.generations import GenerationVerdict
from recoverydash.storage.confirm import NEWER_UNDECIDED_SHOWN, newer_undecided


def v(gen, attempt, update, status):
    return GenerationVerdict(generation_id=gen, attempt=attempt, update=update, status=status)


def test_it_lists_the_undecided_generations_above_the_named_one_newest_first():
    named = v("g100", 1, 100, "restorable")
    verdicts = [v("g50", 0, 50, "committed"), named,
                v("g150", 0, 150, "committed"),  # an older attempt's: rolled back by attempt 1
                v("g120", 1, 120, "rejected"), v("g130", 1, 130, "abandoned"),
                v("g100b", 1, 100, "committed"),  # not above the named update
                v("g200", 1, 200, "committed"), v("g300", 2, 300, "pending"),
                v("g250", 2, None, "pending"), v("g180", 1, 180, "restorable")]
    assert newer_undecided(verdicts, named) == [
        {"generation_id": "g300", "update": 300, "status": "pending"},
        {"generation_id": "g200", "update": 200, "status": "committed"}]
    assert newer_undecided(verdicts, None) == []


def test_it_keeps_the_newest_shown():
    named = v("g0", 0, 0, "restorable")
    verdicts = [named] + [v(f"g{u}", 0, u, "committed") for u in range(1, 31)]
    out = newer_undecided(verdicts, named)
    assert NEWER_UNDECIDED_SHOWN == 20
    assert [g["update"] for g in out] == list(range(30, 10, -1))
