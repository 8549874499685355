"""The documentation pages (docs/definitions.md, docs/ingest-v1.md served at /docs/<page>/) and the
links from every figure of the dashboard to the paragraph that defines it."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest
from django.urls import reverse

from recoverydash.dashboard import docs

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "templates"
# The anchors every reader, docstring and page may rely on (docs/definitions.md#<anchor>).
PROMISED = """lineage counting consumed duplicates omissions frontier duplicate-rate omission-rate
expected-cursor resume-cursor replayed omitted recomputed lost-updates lost-seconds recovery-seconds
verdict restorable generation-status seconds-since-last-restorable updates-at-risk health goodput
mtbf save-cost young-interval observed-interval refinements""".split()


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation other than ``-`` and
    ``_`` dropped, each space a ``-``."""
    text = unicodedata.normalize("NFKC", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def headings(name: str) -> list[str]:
    """The text of every Markdown heading of a docs page (inline code marks dropped)."""
    source = (docs.docs_dir() / docs.PAGES[name][0]).read_text()
    source = re.sub(r"```.*?```", "", source, flags=re.DOTALL)
    found = re.finditer(r"^#{1,6} (.+?)\s*$", source, re.MULTILINE)
    return [m.group(1).replace("`", "") for m in found]


def template_anchors() -> dict[str, set[str]]:
    """``{anchor: {template, ...}}`` of every definition link in the dashboard's templates: the
    ``{% definition "x" %}`` tags and literal ``/docs/definitions/#x`` links."""
    found: dict[str, set[str]] = {}
    for path in TEMPLATES.rglob("*.html"):
        text = path.read_text()
        names = re.findall(r'{%\s*definition\s+"([^"]+)"', text)
        names += re.findall(r"docs_page 'definitions' %}#([\w-]+)", text)
        names += re.findall(r"/docs/definitions/#([\w-]+)", text)
        for name in names:
            found.setdefault(name, set()).add(str(path.relative_to(TEMPLATES)))
    return found


def test_every_anchor_linked_from_the_templates_exists_in_the_definitions():
    linked = template_anchors()
    anchors = docs.definition_anchors()
    missing = {a: sorted(where) for a, where in linked.items() if a not in anchors}
    assert not missing, missing
    # the run, restart and generation pages each link their figures
    pages = {where for places in linked.values() for where in places}
    assert {"dashboard/live/run.html", "dashboard/restart.html",
            "dashboard/live/generation.html"} <= pages
    assert {"replayed", "omitted", "recomputed", "verdict", "seconds-since-last-restorable",
            "updates-at-risk", "goodput", "young-interval", "generation-status"} <= set(linked)


def test_the_definitions_have_every_promised_anchor():
    assert set(PROMISED) <= docs.definition_anchors()


@pytest.mark.parametrize("name", sorted(docs.PAGES))
def test_heading_ids_are_the_github_anchors_and_unique(name):
    """A link such as docs/definitions.md#replayed works on GitHub and on the served page alike."""
    page = docs.render_page(name)
    ids = re.findall(r'<h[1-6] id="([^"]+)"', page.html)
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    assert ids == [github_slug(h) for h in headings(name)]


@pytest.mark.parametrize("name", sorted(docs.PAGES))
def test_every_link_between_the_pages_lands_on_a_heading(name):
    source = (docs.docs_dir() / docs.PAGES[name][0]).read_text()
    for target, anchor in re.findall(r"\]\(([\w.-]*\.md)?#([\w-]+)\)", source):
        other = next((n for n, (file, _) in docs.PAGES.items() if file == target), name)
        assert anchor in docs.render_page(other).anchors, (name, target, anchor)


def test_the_code_and_readmes_cite_only_anchors_that_exist():
    """Docstrings, comments and READMEs cite ``docs/definitions.md#<anchor>`` and
    ``docs/ingest-v1.md#<section>``; each must be a heading of that page."""
    pages = {file: name for name, (file, _) in docs.PAGES.items()}
    sources = [REPO / "README.md"]
    for folder in ("recoverydash", "workers", "tests", "bench", "examples", "templates"):
        sources += [p for p in (REPO / folder).rglob("*") if p.suffix in (".py", ".md", ".html")]
    cited = set()
    for path in sources:
        for file, anchor in re.findall(r"docs/(definitions\.md|ingest-v1\.md)#([\w-]+)",
                                       path.read_text()):
            cited.add((pages[file], anchor, str(path.relative_to(REPO))))
    assert cited
    missing = [c for c in cited if c[1] not in docs.render_page(c[0]).anchors]
    assert not missing, sorted(missing)


@pytest.mark.django_db
@pytest.mark.parametrize("name, heading", [("definitions", 'id="replayed"'),
                                           ("ingest-v1", 'id="restore-plan"')])
def test_the_docs_pages_render_for_a_signed_in_user(owner_client, name, heading):
    response = owner_client.get(reverse("docs_page", args=[name]))
    assert response.status_code == 200
    html = response.content.decode()
    assert heading in html
    assert 'class="docs-toc"' in html and 'href="/static/dashboard/dashboard.css"' in html
    # links to the other page go to the served page, not to the .md file
    other = "ingest-v1" if name == "definitions" else "definitions"
    assert f'href="/docs/{other}/#' in html
    assert ".md#" not in re.sub(r"<code>.*?</code>", "", html)


@pytest.mark.django_db
def test_the_docs_pages_need_sign_in_and_unknown_pages_are_404(client, owner):
    anonymous = client.get(reverse("docs_page", args=["definitions"]))
    assert anonymous.status_code == 302 and anonymous["Location"].startswith(reverse("login"))
    client.force_login(owner)
    assert client.get("/docs/nope/").status_code == 404


@pytest.mark.django_db
def test_the_figures_of_the_run_restart_and_generation_pages_link_their_definitions(
        owner_client, known_run):
    run = owner_client.get(reverse("run", args=[known_run.project.name, known_run.run_id])).content.decode()
    for anchor in ("health", "restorable", "seconds-since-last-restorable", "updates-at-risk",
                   "verdict", "replayed", "omitted", "recomputed", "lost-seconds",
                   "recovery-seconds", "goodput", "mtbf", "save-cost", "young-interval",
                   "observed-interval", "consumed", "duplicates", "omissions", "duplicate-rate",
                   "omission-rate", "generation-status"):
        assert f'href="/docs/definitions/#{anchor}"' in run, anchor
    assert 'aria-label="Definition of replayed"' in run
    restart = owner_client.get(reverse("restart", args=[known_run.project.name, known_run.run_id, 1])).content.decode()
    for anchor in ("expected-cursor", "resume-cursor", "lost-updates", "restart-findings"):
        assert f'href="/docs/definitions/#{anchor}"' in restart, anchor
    generation = owner_client.get(reverse("generation", args=[known_run.project.name, known_run.run_id, "g1250"]))
    assert 'href="/docs/definitions/#generation-status"' in generation.content.decode()
    footer = owner_client.get("/").content.decode()
    assert 'numbers defined in <a href="/docs/definitions/">Definitions</a>' in footer
