"""The documentation pages (every docs/**/*.md served at /docs/<page>/, docs/index.md at /docs/),
the links between them, and the links from every figure of the dashboard to the paragraph that
defines it."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest
from django.test import Client
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
    source = (docs.docs_dir() / docs.pages()[name][0]).read_text()
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


@pytest.mark.parametrize("name", sorted(docs.pages()))
def test_heading_ids_are_the_github_anchors_and_unique(name):
    """A link such as docs/definitions.md#replayed works on GitHub and on the served page alike."""
    page = docs.render_page(name)
    ids = re.findall(r'<h[1-6] id="([^"]+)"', page.html)
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    assert ids == [github_slug(h) for h in headings(name)]


def markdown_links(text: str) -> list[str]:
    """The targets of the inline links and images of a Markdown text, code left out."""
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"\]\(([^)\s]+)\)", text)


def test_every_page_is_linked_from_the_index_and_the_index_comes_first():
    names = list(docs.pages())
    assert names[0] == docs.INDEX
    index = (docs.docs_dir() / "index.md").read_text()
    linked = {docs.resolve_link("index.md", t)[1] for t in markdown_links(index)
              if docs.resolve_link("index.md", t)}
    assert set(names) - {docs.INDEX} <= linked, sorted(set(names) - linked - {docs.INDEX})
    assert {"trainer-guide", "operator-guide", "integrations/hf", "integrations/lightning",
            "integrations/torchdata", "integrations/plain-loops", "ingest-v1", "definitions",
            "formats", "benchmarks"} <= set(names)


def test_the_site_nav_lists_every_page_once():
    """mkdocs.yml's nav (``make docs`` fails on a page left out; this says it sooner)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *a: None)
    nav = yaml.load((REPO / "mkdocs.yml").read_text(), Loader=Loader)["nav"]

    def files(items):
        for item in items:
            for value in item.values():
                yield from (files(value) if isinstance(value, list) else [value])

    listed = list(files(nav))
    assert len(listed) == len(set(listed))
    assert sorted(f[:-3] for f in listed) == sorted(docs.pages())


@pytest.mark.parametrize("name", sorted(docs.pages()))
def test_every_relative_link_of_a_page_lands_on_a_page_heading_or_file(name):
    """Relative links between the files (``../definitions.md#replayed``, ``#restoring``,
    ``drills-page.png``) resolve to a page and one of its headings, or to a file under docs/:
    the same links mkdocs checks with --strict, and the dashboard rewrites."""
    file = docs.pages()[name][0]
    for target in markdown_links((docs.docs_dir() / file).read_text()):
        where = docs.resolve_link(file, target)
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        assert where is not None, (name, target, "a link outside docs/: use a code span")
        kind, to, anchor = where
        if kind == "page":
            assert to in docs.pages(), (name, target)
            assert not anchor or anchor in docs.render_page(to).anchors, (name, target)
        else:
            assert (docs.docs_dir() / to).is_file(), (name, target)


def test_the_readme_and_contributing_link_only_files_and_headings_that_exist():
    for source in ("README.md", "CONTRIBUTING.md"):
        path = REPO / source
        if not path.exists():
            continue
        for target in markdown_links(path.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            file, _, anchor = target.partition("#")
            if not file:
                assert anchor in {github_slug(h) for h in re.findall(
                    r"^#{1,6} (.+?)\s*$", re.sub(r"```.*?```", "", path.read_text(),
                                                 flags=re.DOTALL), re.MULTILINE)}, (source, target)
                continue
            assert (REPO / file).exists(), (source, target)
            if anchor and file.startswith("docs/") and file.endswith(".md"):
                assert anchor in docs.render_page(file[len("docs/"):-3]).anchors, (source, target)


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
    names = [known_run.project.name, known_run.run_id]
    run = owner_client.get(reverse("run", args=names)).content.decode()
    for anchor in ("health", "restorable", "seconds-since-last-restorable", "updates-at-risk",
                   "verdict", "replayed", "omitted", "recomputed", "lost-seconds",
                   "recovery-seconds", "goodput", "mtbf", "save-cost", "young-interval",
                   "observed-interval", "consumed", "duplicates", "omissions", "duplicate-rate",
                   "omission-rate", "generation-status"):
        assert f'href="/docs/definitions/#{anchor}"' in run, anchor
    assert 'aria-label="Definition of replayed"' in run
    restart = owner_client.get(reverse("restart", args=[*names, 1])).content.decode()
    for anchor in ("expected-cursor", "resume-cursor", "lost-updates", "restart-findings"):
        assert f'href="/docs/definitions/#{anchor}"' in restart, anchor
    generation = owner_client.get(reverse("generation", args=[*names, "g1250"]))
    assert 'href="/docs/definitions/#generation-status"' in generation.content.decode()
    footer = owner_client.get("/").content.decode()
    assert 'numbers defined in <a href="/docs/definitions/">Definitions</a>' in footer


@pytest.mark.django_db
def test_the_index_a_page_in_a_subfolder_and_their_links_are_served(owner_client):
    index = owner_client.get("/docs/")
    assert index.status_code == 200
    html = index.content.decode()
    assert '<h1 id="recoverydash-documentation">' in html
    # the index's links go to the served pages, subfolders included
    assert 'href="/docs/integrations/hf/"' in html and 'href="/docs/trainer-guide/"' in html
    assert owner_client.get("/docs/index/")["Location"] == "/docs/"
    hf = owner_client.get("/docs/integrations/hf/").content.decode()
    assert '<h1 id="hf-transformers-trainer">' in hf
    # ../trainer-guide.md#attempt-numbers from docs/integrations/hf.md
    assert 'href="/docs/trainer-guide/#attempt-numbers"' in hf
    # the side list names every page, the subfolder's indented
    assert '<li class="docs-sub"><a href="/docs/integrations/hf/" aria-current="page">' in hf


@pytest.mark.django_db
def test_the_images_of_the_pages_are_served_and_nothing_else_under_docs(owner_client):
    guide = owner_client.get("/docs/trainer-guide/").content.decode()
    assert 'src="/docs-files/drills-page.png"' in guide
    image = owner_client.get("/docs-files/drills-page.png")
    assert image.status_code == 200 and image["Content-Type"] == "image/png"
    assert b"".join(image.streaming_content)[:8] == b"\x89PNG\r\n\x1a\n"
    for path in ("definitions.md", "../pyproject.toml", "nope.png", "../static/x.png"):
        assert owner_client.get(f"/docs-files/{path}").status_code == 404, path
    assert Client().get("/docs-files/drills-page.png").status_code == 302  # sign-in first


def test_every_integration_page_is_in_the_readme_and_the_trainer_guide_tables():
    """A framework integration a new user needs appears where they look: the README's framework
    table and the trainer guide's, each linking its page."""
    pages = sorted(p.name for p in (docs.docs_dir() / "integrations").glob("*.md"))
    readme = (REPO / "README.md").read_text()
    guide = (docs.docs_dir() / "trainer-guide.md").read_text()
    for page in pages:
        assert f"](docs/integrations/{page})" in readme, page
        assert f"](integrations/{page})" in guide, page


def test_contributing_copies_the_layers_of_the_layering_test():
    """CONTRIBUTING.md's numbered list names the apps of tests/test_layers.py's LAYERS, floor by
    floor, in order."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("test_layers", REPO / "tests" / "test_layers.py")
    layers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layers)
    text = (REPO / "CONTRIBUTING.md").read_text()
    section = text[text.index("## The layering"):text.index("## The gates")]
    items = re.findall(r"^\d+\. (.+?)(?=^\d+\. |^\s*$)", section, re.MULTILINE | re.DOTALL)
    floors = [apps.split() for apps, _side in layers.LAYERS]
    assert len(items) == len(floors), items
    for item, apps in zip(items, floors, strict=True):
        if apps == ["project"]:
            assert "the project" in item, item
        else:
            assert all(f"`{app}`" in item.split(":")[0] for app in apps), (item, apps)


def test_every_benchmark_has_a_readme_line_and_a_history_section():
    """The README keeps one line per benchmark; docs/benchmarks.md its history."""
    names = sorted(p.name for p in (REPO / "bench").glob("*.py") if not p.name.startswith("_"))
    readme = (REPO / "README.md").read_text()
    history = (docs.docs_dir() / "benchmarks.md").read_text()
    for name in names:
        assert readme.count(f"| `bench/{name}` |") == 1, name
        assert f"\n## bench/{name}\n" in history, name


def test_the_readme_is_a_short_guide_with_a_table_of_contents():
    """Under 350 lines; its Contents lists every section, in order; both commands literally."""
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) < 350
    body = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    sections = [h for h in re.findall(r"^## (.+?)\s*$", body, re.MULTILINE) if h != "Contents"]
    contents = body[body.index("## Contents"):].split("\n## ", 1)[0]
    assert re.findall(r"^- \[(.+?)\]\(#([\w-]+)\)$", contents, re.MULTILINE) == [
        (h, github_slug(h)) for h in sections]
    assert "make demo" in text and "make test" in text
