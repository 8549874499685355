"""The lines each framework integration asks of a training script, counted: every page of
docs/integrations/ that says "Lines you add (N, marked `# recoverydash` in `examples/X`)" names
exactly the lines of that complete, tested example that carry the mark (issue 27: "user lines
counted"), and the integration module's docstring names the same number."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLAIM = re.compile(r"Lines you add \((\d+), marked `# recoverydash` in `examples/([\w.]+)`\)")
WORDS = {3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}
PAGES = {"megatron.md": "megatron.py", "streaming.md": "streaming.py",
         "torchtitan.md": "torchtitan.py"}


def marked(example: str) -> int:
    return sum(1 for line in (REPO / "examples" / example).read_text().splitlines()
               if "# recoverydash" in line)


@pytest.mark.parametrize("page, module", sorted(PAGES.items()))
def test_the_page_counts_the_marked_lines_of_its_example(page, module):
    text = " ".join((REPO / "docs" / "integrations" / page).read_text().split())
    claims = CLAIM.findall(text)
    assert len(claims) == 1, f"{page}: one 'Lines you add (N, marked ...)' sentence"
    (count, example), = claims
    assert int(count) == marked(example), (page, example)
    doc = " ".join((REPO / "recoverydash" / "integrations" / module).read_text().split())
    assert f"Its lines ({WORDS[int(count)]} in the complete loop ``examples/{example}``" in doc
