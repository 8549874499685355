"""docs/definitions.md promises, for every figure, the test that pins it: every section (``##``
and ``###``) names at least one test, and every test it names exists. A name is a path
(``tests/recovery/test_figures.py``), a path with a test (``...py::test_x``), or ``::test_x``
alone, which is in the file the section named last."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "definitions.md"
_REF = re.compile(r"(tests/[\w/.-]*)(?:::(\w+))?|(?<![\w/])::(\w+)")


def sections() -> list[tuple[str, str]]:
    """``(heading, text)`` of every ``##`` and ``###`` section, code blocks left out; a ``##``
    section's text ends at its first ``###``."""
    text = re.sub(r"```.*?```", "", PAGE.read_text(), flags=re.DOTALL)
    parts = re.split(r"^(#{2,3} .+)$", text, flags=re.MULTILINE)
    return [(parts[i].strip(), parts[i + 1]) for i in range(1, len(parts), 2)]


def named_tests(text: str) -> list[tuple[str, str | None]]:
    """``(path, test or None)`` for every test the text names, ``::x`` resolved against the
    last path named before it."""
    found, last = [], None
    for path, test, bare in _REF.findall(text):
        if path:
            last = path.rstrip(".")
            found.append((last, test or None))
        elif bare:
            assert last, f"::{bare} names no file before it"
            found.append((last, bare))
    return found


def test_every_section_names_a_test_that_exists():
    problems = []
    for heading, text in sections():
        tests = named_tests(text)
        if not tests:
            problems.append(f"{heading}: names no test")
        for path, test in tests:
            where = REPO / path
            if not where.exists():
                problems.append(f"{heading}: no {path}")
            elif test and f"def {test}(" not in where.read_text():
                problems.append(f"{heading}: no {test} in {path}")
    assert len(sections()) >= 60
    assert not problems, "\n".join(problems)


def test_each_word_of_the_glossary_is_a_name_the_core_uses():
    """The words of docs/definitions.md#words are the core's: each appears in
    ``recoverydash/recovery/`` (its names, docstrings or comments)."""
    (words_text,) = [text for heading, text in sections() if heading == "## Words"]
    words = re.findall(r"\*\*([^*]+)\*\*", words_text)
    assert {"update", "attempt", "generation", "restorable", "position", "lineage"} <= set(words)
    core = " ".join(p.read_text().lower() for p in (REPO / "recoverydash" / "recovery")
                    .rglob("*.py"))
    core = core.replace("_", " ")
    missing = [w for w in words if not re.search(rf"\b{re.escape(w.lower())}\b", core)]
    assert not missing, missing
