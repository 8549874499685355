"""The project's documentation, served by the dashboard: every Markdown file under ``docs/``
(subfolders included) rendered as HTML at ``/docs/<page>/``, where ``<page>`` is the file's path
without ``.md`` (``docs/definitions.md`` at ``/docs/definitions/``,
``docs/integrations/hf.md`` at ``/docs/integrations/hf/``), and ``docs/index.md`` at ``/docs/``.
Images under ``docs/`` are served at ``/docs-files/<path>``.

The Markdown files in the repository are the only source: the same files are built into a static
site by ``make docs`` (mkdocs, ``mkdocs.yml``) and read on GitHub. They are rendered here with
Python-Markdown (extensions ``toc``, ``tables``, ``fenced_code``), as mkdocs renders them. A
heading's ``id`` is its slug, the same one GitHub gives it, so ``docs/definitions.md#replayed``
in a docstring and ``/docs/definitions/#replayed`` on a page name the same paragraph. Relative
links between the files (``ingest-v1.md#restore-plan``, ``../trainer-guide.md#restoring``) are
rewritten to the served pages, and image sources to ``/docs-files/``. A page is rendered once per
change of its file (cached by modification time).

The list of pages follows ``docs/index.md``: the index first, then every page in the order the
index links it, then any page it does not link (``tests/dashboard/test_docs.py`` requires that
there is none). A page's title is its first ``# `` heading.

The dashboard links each figure to its definition with
``{% load docs %}{% definition "replayed" %}`` (:mod:`recoverydash.dashboard.templatetags.docs`).
"""
from __future__ import annotations

import mimetypes
import posixpath
import re
import threading
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit
from xml.etree.ElementTree import Element

import markdown
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import FileResponse, Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from markdown.extensions import Extension
from markdown.extensions.toc import TocExtension
from markdown.treeprocessors import Treeprocessor

#: The index page (``docs/index.md``), served at ``/docs/``.
INDEX = "index"
#: The definitions page, which every figure of the dashboard links to.
DEFINITIONS = "definitions"
#: Files under docs/ served as they are (the images the pages show).
ASSET_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".svg", ".gif", ".webp"})
_TITLE = re.compile(r"^# (.+?)\s*$", re.MULTILINE)
_INDEX_LINK = re.compile(r"\]\(([\w./-]+\.md)(?:#[\w-]*)?\)")


@dataclass(frozen=True)
class DocPage:
    """A rendered page: its ``name`` (``integrations/hf``), ``file`` under docs/
    (``integrations/hf.md``), ``title``, ``html`` of the body, ``toc`` (the headings as nested
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


def _title_of(path: Path) -> str:
    """The text of the file's first ``# `` heading (inline code marks dropped), else its name."""
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.DOTALL)
    match = _TITLE.search(text)
    return match.group(1).replace("`", "") if match else path.stem


_pages_cache: dict = {}
_cache: dict = {}
_lock = threading.Lock()


def pages() -> dict[str, tuple[str, str]]:
    """Every page: ``{name: (file under docs/, title)}``, the index first, then in the order
    ``docs/index.md`` links them, then the pages it does not link, by name. Read again when a
    file under docs/ is added, removed or changed."""
    root = docs_dir()
    files = sorted(p for p in root.rglob("*.md") if p.is_file())
    stamp = tuple((str(p), p.stat().st_mtime_ns) for p in files)
    with _lock:
        if _pages_cache.get("stamp") == stamp:
            return _pages_cache["pages"]
    by_file = {p.relative_to(root).as_posix(): p for p in files}
    order: list[str] = []
    if "index.md" in by_file:
        order.append("index.md")
        for target in _INDEX_LINK.findall(by_file["index.md"].read_text(encoding="utf-8")):
            target = posixpath.normpath(target)
            if target in by_file and target not in order:
                order.append(target)
    order += [f for f in by_file if f not in order]
    found = {f[:-3]: (f, _title_of(by_file[f])) for f in order}
    with _lock:
        _pages_cache.update(stamp=stamp, pages=found)
    return found


def page_url(name: str, anchor: str = "") -> str:
    """The served URL of page ``name`` (``/docs/`` for the index), with ``#anchor`` when given."""
    url = reverse("docs_index") if name == INDEX else reverse("docs_page", args=[name])
    return url + (f"#{anchor}" if anchor else "")


def asset_url(path: str) -> str:
    """The served URL of the file ``path`` under docs/ (an image)."""
    return reverse("docs_asset", args=[path])


def resolve_link(from_file: str, href: str) -> tuple[str, str, str] | None:
    """Where a relative link ``href`` of the page ``from_file`` points, as ``(kind, target,
    anchor)``: ``("page", name, anchor)`` for another Markdown file under docs/ (or the same
    page for a bare ``#anchor``), ``("asset", path, "")`` for a file under docs/ that is not
    Markdown; None for an absolute URL or a path outside docs/."""
    parts = urlsplit(href)
    if parts.scheme or parts.netloc or href.startswith("/"):
        return None
    if not parts.path:
        return ("page", from_file[:-3], parts.fragment) if parts.fragment else None
    target = posixpath.normpath(posixpath.join(posixpath.dirname(from_file), unquote(parts.path)))
    if target.startswith("../") or target == "..":
        return None
    if target.endswith(".md"):
        return ("page", target[:-3], parts.fragment)
    return ("asset", target, "")


class _PageLinks(Treeprocessor):
    """Rewrite relative links to the other pages (``ingest-v1.md#x``) to their served URLs, and
    relative image sources to ``/docs-files/``."""

    def __init__(self, md, file: str, names: frozenset):
        super().__init__(md)
        self.file = file
        self.names = names

    def run(self, root: Element) -> None:
        for element, attribute in [(a, "href") for a in root.iter("a")] + \
                                  [(i, "src") for i in root.iter("img")]:
            where = resolve_link(self.file, element.get(attribute, ""))
            if where is None:
                continue
            kind, target, anchor = where
            if kind == "page" and target in self.names:
                if target != self.file[:-3]:
                    element.set(attribute, page_url(target, anchor))
            elif kind == "asset" and posixpath.splitext(target)[1].lower() in ASSET_SUFFIXES:
                element.set(attribute, asset_url(target))


class _PageLinksExtension(Extension):
    def __init__(self, file: str, names: frozenset):
        super().__init__()
        self.file = file
        self.names = names

    def extendMarkdown(self, md) -> None:  # the name Markdown calls
        md.treeprocessors.register(_PageLinks(md, self.file, self.names),
                                   "recoverydash_page_links", 5)


def github_slug(text: str, separator: str = "-") -> str:
    """The anchor GitHub gives a heading of ``text``: lower case, characters other than letters,
    digits, ``_``, ``-`` and spaces dropped, each space a ``separator`` (runs of ``-`` are kept:
    ``check --format`` is ``check---format``). mkdocs.yml configures the same rule
    (``pymdownx.slugs.slugify``, case lower)."""
    slug = unicodedata.normalize("NFC", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", slug).replace(" ", separator)


def _convert(text: str, file: str, names: frozenset) -> tuple[str, list]:
    md = markdown.Markdown(extensions=[
        "tables", "fenced_code",
        TocExtension(permalink="#", permalink_title="Link to this section", toc_depth="2-3",
                     slugify=github_slug),
        _PageLinksExtension(file, names)])
    html = md.convert(text)
    return html, md.toc_tokens


def render_page(name: str) -> DocPage:
    """Page ``name`` (a key of :func:`pages`) rendered from its Markdown file. Raises KeyError for
    an unknown name and OSError when the file cannot be read."""
    known = pages()
    file, title = known[name]
    path = docs_dir() / file
    stamp = (path.stat().st_mtime_ns, frozenset(known))
    with _lock:
        cached = _cache.get(name)
        if cached is not None and cached[0] == stamp:
            return cached[1]
    html, tokens = _convert(path.read_text(encoding="utf-8"), file, frozenset(known))
    anchors = frozenset(re.findall(r'<h[1-6] id="([^"]+)"', html))
    toc = tokens[0]["children"] if len(tokens) == 1 else tokens  # below the page's one h1
    page = DocPage(name, file, title, html, toc, anchors)
    with _lock:
        _cache[name] = (stamp, page)
    return page


def definition_anchors() -> frozenset:
    """The ids of every heading of the definitions page."""
    return render_page(DEFINITIONS).anchors


def _nav() -> list[dict]:
    """The pages for the side list: ``{"name", "title", "url", "depth"}`` in :func:`pages` order
    (depth 1 for a page in a subfolder)."""
    return [{"name": name, "title": title, "url": page_url(name), "depth": name.count("/")}
            for name, (_file, title) in pages().items()]


@login_required
def page(request, name: str = INDEX):
    """``/docs/<name>/`` (``/docs/`` for the index): one documentation page, with the list of
    pages and of its sections; 404 for a name that is not a page."""
    if name == INDEX and request.resolver_match.url_name != "docs_index":
        return redirect(page_url(INDEX), permanent=True)
    if name not in pages():
        raise Http404(f"no documentation page {name!r}")
    doc = render_page(name)
    return render(request, "dashboard/docs.html", {"doc": doc, "pages": _nav()})


@login_required
def asset(request, path: str):
    """``/docs-files/<path>``: an image under docs/ that a page shows; 404 for anything else
    (another suffix, a path outside docs/, a file that does not exist)."""
    root = docs_dir().resolve()
    target = (root / path).resolve()
    if (target.suffix.lower() not in ASSET_SUFFIXES or not target.is_relative_to(root)
            or not target.is_file()):
        raise Http404(f"no documentation file {path!r}")
    kind = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
    return FileResponse(target.open("rb"), content_type=kind)
