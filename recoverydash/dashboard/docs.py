"""The project's documentation pages, served by the dashboard: ``docs/definitions.md`` (what every
number means), ``docs/ingest-v1.md`` (the wire contract) and ``docs/formats.md`` (checkpoint
formats read without the SDK) rendered as HTML at ``/docs/definitions/``, ``/docs/ingest-v1/``
and ``/docs/formats/``.

The Markdown files in the repository are the only source; the pages are rendered from them with
Python-Markdown (extensions ``toc``, ``tables``, ``fenced_code``). A heading's ``id`` is its slug,
the same one GitHub gives it, so ``docs/definitions.md#replayed`` in a docstring and
``/docs/definitions/#replayed`` on a page name the same paragraph. Links from one page to the other
(``ingest-v1.md#restore-plan``) are rewritten to the served pages. A page is rendered once per
change of its file (cached by modification time).

The dashboard links each figure to its definition with ``{% load docs %}{% definition "replayed" %}``
(:mod:`recoverydash.dashboard.templatetags.docs`).
"""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from pathlib import Path
from xml.etree.ElementTree import Element

import markdown
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import render
from django.urls import reverse
from markdown.extensions import Extension
from markdown.extensions.toc import TocExtension
from markdown.treeprocessors import Treeprocessor

#: Served pages: URL name -> (file under docs/, title).
PAGES = {
    "definitions": ("definitions.md", "Definitions"),
    "ingest-v1": ("ingest-v1.md", "Wire contract v1"),
    "formats": ("formats.md", "Checkpoint formats"),
}
#: The definitions page, which every figure of the dashboard links to.
DEFINITIONS = "definitions"
_PAGE_LINK = re.compile(r"^(?:\./)?(?P<file>[\w.-]+\.md)(?P<anchor>#[\w-]*)?$")


@dataclass(frozen=True)
class DocPage:
    """A rendered page: its ``file`` under docs/, ``html`` of the body, ``toc`` (the headings as nested
    ``{"id", "name", "level", "children"}`` dicts), and ``anchors``, the ids of all headings."""

    name: str
    file: str
    title: str
    html: str
    toc: list
    anchors: frozenset


def docs_dir() -> Path:
    """The folder of the Markdown sources (``docs/`` of the repository)."""
    return Path(settings.BASE_DIR) / "docs"


def page_url(name: str, anchor: str = "") -> str:
    """The served URL of page ``name``, with ``#anchor`` when given."""
    return reverse("docs_page", args=[name]) + (f"#{anchor}" if anchor else "")


class _PageLinks(Treeprocessor):
    """Rewrite links to the other served pages (``ingest-v1.md#x``) to their URLs."""

    def __init__(self, md, by_file: dict):
        super().__init__(md)
        self.by_file = by_file

    def run(self, root: Element) -> None:
        for link in root.iter("a"):
            match = _PAGE_LINK.match(link.get("href", ""))
            if match and match["file"] in self.by_file:
                anchor = (match["anchor"] or "#")[1:]
                link.set("href", page_url(self.by_file[match["file"]], anchor))


class _PageLinksExtension(Extension):
    def extendMarkdown(self, md) -> None:  # the name Markdown calls
        by_file = {file: name for name, (file, _title) in PAGES.items()}
        md.treeprocessors.register(_PageLinks(md, by_file), "recoverydash_page_links", 5)


def _convert(text: str) -> tuple[str, list]:
    md = markdown.Markdown(extensions=[
        "tables", "fenced_code",
        TocExtension(permalink="#", permalink_title="Link to this section", toc_depth="2-3"),
        _PageLinksExtension()])
    html = md.convert(text)
    return html, md.toc_tokens


_cache: dict = {}
_lock = threading.Lock()


def render_page(name: str) -> DocPage:
    """Page ``name`` (a key of :data:`PAGES`) rendered from its Markdown file. Raises KeyError for
    an unknown name and OSError when the file cannot be read."""
    file, title = PAGES[name]
    path = docs_dir() / file
    stamp = path.stat().st_mtime_ns
    with _lock:
        cached = _cache.get(name)
        if cached is not None and cached[0] == stamp:
            return cached[1]
    html, tokens = _convert(path.read_text(encoding="utf-8"))
    anchors = frozenset(re.findall(r'<h[1-6] id="([^"]+)"', html))
    toc = tokens[0]["children"] if len(tokens) == 1 else tokens  # below the page's one h1
    page = DocPage(name, file, title, html, toc, anchors)
    with _lock:
        _cache[name] = (stamp, page)
    return page


def definition_anchors() -> frozenset:
    """The ids of every heading of the definitions page."""
    return render_page(DEFINITIONS).anchors


@login_required
def page(request, name: str):
    """``/docs/<name>/``: one documentation page, with the list of its sections; 404 for a name
    that is not a page."""
    if name not in PAGES:
        raise Http404(f"no documentation page {name!r}")
    doc = render_page(name)
    others = [{"name": other, "title": title, "url": page_url(other)}
              for other, (_file, title) in PAGES.items()]
    return render(request, "dashboard/docs.html", {"doc": doc, "pages": others})
