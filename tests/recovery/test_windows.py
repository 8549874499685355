"""The first window after a restart (docs/definitions.md#first-window-after-a-restart): exact
marks and counts of ``recovery.windows.first_window_comparison``."""

from recoverydash.recovery.windows import first_window_comparison


def w(update, rank, slot, ids, epoch=0):
    return {"update": update, "rank": rank, "slot": slot, "ids": ids, "epoch": epoch}


# Restored at update 10; attempt 0 had trained update 10 on ids 0-3 (rank 0) and 4-7 (rank 1)
# and went on to update 11 with 8-11 and 12-15 before it failed.
BEFORE = [w(10, 0, 0, [0, 1, 2, 3]), w(10, 1, 0, [4, 5, 6, 7])]
ROLLED_BACK = [w(11, 0, 0, [8, 9, 10, 11]), w(11, 1, 0, [12, 13, 14, 15])]


def test_it_marks_an_exact_resume_in_place():
    out = first_window_comparison(10, BEFORE, ROLLED_BACK,
                                  [w(11, 0, 0, [8, 9, 10, 11]), w(11, 1, 0, [12, 13, 14, 15])])
    assert out["updates"] == [11]
    assert [r["same"] for r in out["rows"]] == [True, True]
    assert out["rows"][0]["observed_marks"] == ["expected"] * 4
    assert out["rows"][0]["expected_marks"] == ["seen"] * 4
    assert (out["replayed_ids"], out["skipped_ids"], out["in_place_ids"]) == (0, 0, 8)
    assert out["expected_known"] is True


def test_it_highlights_the_ids_a_resume_from_an_older_cursor_replayed():
    # the loader restarted one update early: update 11 delivers update 10's ids again
    out = first_window_comparison(10, BEFORE, ROLLED_BACK,
                                  [w(11, 0, 0, [0, 1, 2, 3]), w(11, 1, 0, [4, 5, 6, 7])])
    rank0 = out["rows"][0]
    assert rank0["observed_marks"] == ["replayed"] * 4
    assert rank0["expected_marks"] == ["skipped"] * 4
    assert rank0["same"] is False
    assert (out["replayed_ids"], out["skipped_ids"], out["moved_ids"]) == (8, 8, 0)


def test_it_counts_skipped_and_moved_ids_of_a_resume_past_the_cursor():
    # rank 0 resumed two ids late; rank 1's first ids turned up on rank 0
    observed = [w(11, 0, 0, [10, 11, 12, 13]), w(11, 1, 0, [16, 17, 18, 19])]
    out = first_window_comparison(10, BEFORE, ROLLED_BACK, observed)
    assert out["rows"][0]["observed_marks"] == ["expected", "expected", "moved", "moved"]
    assert out["rows"][1]["observed_marks"] == ["other"] * 4
    assert out["rows"][0]["expected_marks"] == ["skipped", "skipped", "seen", "seen"]
    assert out["rows"][1]["expected_marks"] == ["moved", "moved", "skipped", "skipped"]
    assert (out["skipped_ids"], out["moved_ids"], out["in_place_ids"]) == (4, 2, 2)
    assert out["replayed_ids"] == 0


def test_it_never_calls_an_id_of_another_epoch_replayed():
    out = first_window_comparison(10, BEFORE, [], [w(11, 0, 0, [0, 1], epoch=1)])
    assert out["rows"][0]["observed_marks"] == ["other", "other"]
    # an unknown epoch is compared with every epoch
    out = first_window_comparison(10, BEFORE, [], [w(11, 0, 0, [0, 1], epoch=None)])
    assert out["rows"][0]["observed_marks"] == ["replayed", "replayed"]


def test_it_expects_nothing_when_the_predecessor_sent_no_window_past_the_restore():
    out = first_window_comparison(10, BEFORE, [], [w(11, 0, 0, [8, 9, 10, 11])])
    assert out["expected_known"] is False
    assert out["rows"][0]["expected"] is None and out["rows"][0]["same"] is None
    assert out["rows"][0]["observed_marks"] == ["other"] * 4


def test_it_expects_nothing_per_rank_when_the_world_size_changed():
    out = first_window_comparison(10, BEFORE, ROLLED_BACK, [w(11, 0, 0, [8, 9, 10, 11])],
                                  same_world_size=False,
                                  digests_before={(11, 0): "aa"}, digests_after={(11, 0): "aa"})
    assert out["world_size_changed"] is True and out["expected_known"] is False
    assert [r["rank"] for r in out["rows"]] == [0]
    assert out["digests"] == []


def test_it_lists_an_expected_window_the_resume_did_not_send():
    out = first_window_comparison(10, BEFORE, ROLLED_BACK, [w(11, 0, 0, [8, 9, 10, 11])])
    rank1 = out["rows"][1]
    assert (rank1["rank"], rank1["observed"], rank1["expected_marks"]) == \
        (1, None, ["skipped"] * 4)
    assert out["skipped_ids"] == 4


def test_it_compares_ids_digests_past_the_restore_where_both_attempts_sent_one():
    out = first_window_comparison(
        10, [], [], [], digests_before={(10, 0): "x", (11, 0): "ab", (11, 1): "cd", (12, 0): "ef"},
        digests_after={(11, 0): "ab", (11, 1): "zz", (13, 0): "gh"})
    assert out["digests"] == [
        {"update": 11, "rank": 0, "expected": "ab", "observed": "ab", "same": True},
        {"update": 11, "rank": 1, "expected": "cd", "observed": "zz", "same": False}]
    assert out["rows"] == [] and out["updates"] == []
