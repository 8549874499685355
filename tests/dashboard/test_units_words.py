"""docs/definitions.md#units on the restart page, without the database: the cursor table of a
token stratum says "tokens" (its difference) and "token" (its cursors); a samples stratum keeps
"positions"; a restart's own unit names its strata's when the analysis does not list them."""

from __future__ import annotations

from recoverydash.dashboard.queries import cursor_comparison, restarts_units
from recoverydash.dashboard.templatetags.dashboard import cursor_text

EXPECTED = [{"stratum": "text", "epoch": 0, "position": 1024},
            {"stratum": "img", "epoch": 0, "position": 8}]
RESUME = [{"stratum": "text", "epoch": 0, "position": 1236},
          {"stratum": "img", "epoch": 0, "position": 4}]


def test_each_stratum_of_the_cursor_table_speaks_its_unit():
    rows = {r["stratum"]: r for r in cursor_comparison(
        EXPECTED, RESUME, {"text": "tokens", "img": "samples"})}
    assert rows["text"]["meaning"] == "212 tokens ahead: skipped"
    assert rows["img"]["meaning"] == "4 positions behind: read again"
    assert cursor_text(rows["text"]["resume"], rows["text"]["units"]) == "epoch 0 · token 1,236"
    assert cursor_text(rows["img"]["resume"], rows["img"]["units"]) == "epoch 0 · position 4"


def test_the_restarts_unit_names_strata_the_analysis_does_not_list():
    (row,) = cursor_comparison(EXPECTED[:1], RESUME[:1], None, "tokens")
    assert (row["units"], row["meaning"]) == ("tokens", "212 tokens ahead: skipped")
    (row,) = cursor_comparison(EXPECTED[:1], RESUME[:1])
    assert row["meaning"] == "212 positions ahead: skipped"


def test_the_unit_of_several_restarts():
    assert restarts_units([{"units": "tokens"}, {"units": "tokens"}]) == "tokens"
    assert restarts_units([{"units": "tokens"}, {}]) == "mixed"  # {} stored before units
    assert restarts_units([]) == "samples"
