"""The code blocks of the README and the guides, as the tests of ``tests/docs`` read them.

A block is a fenced code block (```` ```lang ````). The line ``<!-- block: NAME -->`` just before
its fence (blank lines allowed between) names the handler that executes or checks it: an HTML
comment, invisible on GitHub, on the mkdocs site and on the dashboard's pages. A block without
one is handled by its language: ``sh`` blocks command by command (``commands.py``), ``python``
blocks run as they are. ``<!-- block: run-by tests/x.py::test_y -->`` says that another test
executes the block (it must exist and read the page).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: The reference pages: examples of documents (events, answers, manifests), not of commands;
#: every other page under docs/, with README.md and CONTRIBUTING.md, is a guide, and every code
#: block of a guide is executed or checked by a test.
REFERENCE_PAGES = frozenset({"docs/definitions.md", "docs/ingest-v1.md", "docs/formats.md",
                             "docs/retention.md", "docs/benchmarks.md"})


_FENCE = re.compile(r"^```([\w+-]*)[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_LABEL = re.compile(r"<!--\s*block:\s*(.+?)\s*-->\s*\Z")


@dataclass(frozen=True)
class Block:
    """One fenced block: ``file`` (relative to the repository), ``line`` of its fence (1-based),
    ``lang`` (the fence's info word, "" when none), ``label`` (the ``<!-- block: -->`` name,
    "" when none) and ``text`` (its content)."""

    file: str
    line: int
    lang: str
    label: str
    text: str

    @property
    def id(self) -> str:
        return f"{self.file}:{self.line}"


def guide_files() -> list[str]:
    """README.md, CONTRIBUTING.md and every page under docs/ but the reference pages, relative
    to the repository, sorted."""
    pages = {p.relative_to(REPO).as_posix() for p in (REPO / "docs").rglob("*.md")}
    found = {"README.md", "CONTRIBUTING.md"} | (pages - REFERENCE_PAGES)
    return sorted(f for f in found if (REPO / f).is_file())


def blocks_of(file: str) -> list[Block]:
    """Every fenced block of ``file`` (relative to the repository), in order."""
    text = (REPO / file).read_text(encoding="utf-8")
    found = []
    for m in _FENCE.finditer(text):
        before = text[:m.start()].rstrip()
        label = _LABEL.search(before)
        found.append(Block(file, text.count("\n", 0, m.start()) + 1, m.group(1).lower(),
                           label.group(1) if label else "", m.group(2)))
    return found


def all_blocks() -> list[Block]:
    """Every block of every guide file."""
    return [b for f in guide_files() for b in blocks_of(f)]
