"""``{% definition "replayed" %}``: the small link beside a figure's label to the paragraph of
docs/definitions.md that defines it (``/docs/definitions/#replayed``).

The link is a plain "?" in a circle drawn by CSS (no icon font), with an accessible name and a
tooltip saying which definition it opens. Every anchor used in a template is checked against the
headings of docs/definitions.md by ``tests/dashboard/test_docs.py``."""
from __future__ import annotations

from django import template
from django.utils.html import format_html

from recoverydash.dashboard.docs import DEFINITIONS, page_url

register = template.Library()


@register.simple_tag
def definition(anchor: str, label: str = ""):
    """``<a class="def" href="/docs/definitions/#anchor" ...>?</a>``; ``label`` names the figure
    for screen readers and the tooltip (default: the anchor in words)."""
    words = label or anchor.replace("-", " ")
    return format_html('<a class="def" href="{}" title="Definition: {}" '
                       'aria-label="Definition of {}">?</a>',
                       page_url(DEFINITIONS, anchor), words, words)


@register.simple_tag
def docs_url(name: str, anchor: str = ""):
    """The URL of documentation page ``name`` (``definitions`` or ``ingest-v1``), with
    ``#anchor`` when given."""
    return page_url(name, anchor)
