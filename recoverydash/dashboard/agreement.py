"""One answer per page: the numbers a page shows beside the API's for the same thing.

A page marks each number it shows from an API answer with ``data-field`` (where the number is in
the answer's item, dotted: ``replayed``, ``expected_cursor.main.position``; a list of cursors is
indexed by its ``stratum``) and ``data-value`` (the number as JSON, before formatting). The demo
(``recoverydash.demo.screens``) and the tests read the restart page and ``GET
/api/v1/runs/{run_id}/recovery`` and call :func:`disagreements`: every marked number must be the
API's, and every number of ``HEADLINE`` must be marked.
"""

from __future__ import annotations

import html as html_lib
import json
import re

#: The fields of a restart (docs/ingest-v1.md#recovery ``restarts`` item) the restart page must
#: show, each marked.
HEADLINE = ("replayed", "omitted", "recomputed", "lost_updates", "lost_seconds",
            "recovery_seconds", "resumed_update", "world_size_before", "world_size_after")

_MARK = re.compile(r'data-field="([^"]+)"\s+data-value="([^"]*)"')
_MISSING = object()


def marked(page: str) -> list[tuple[str, object]]:
    """``(field, value)`` of every number ``page`` (HTML) marks, in page order."""
    return [(field, json.loads(html_lib.unescape(value)))
            for field, value in _MARK.findall(page)]


def lookup(item, path: str):
    """The value at ``path`` (dotted) in ``item``; a list of mappings is indexed by the value of
    their ``stratum`` (cursors); ``_MISSING`` when there is none."""
    here = item
    for part in path.split("."):
        if isinstance(here, list):
            here = next((x for x in here if isinstance(x, dict)
                         and str(x.get("stratum")) == part), _MISSING)
        elif isinstance(here, dict):
            here = here.get(part, _MISSING)
        else:
            return _MISSING
        if here is _MISSING:
            return _MISSING
    return here


def disagreements(page: str, item: dict, required=HEADLINE) -> list[str]:
    """What differs between the numbers ``page`` marks and the API's ``item``: a sentence per
    marked number that is not the API's (or that the API does not state) and per ``required``
    field the page does not mark. Empty: one answer."""
    out = []
    shown = marked(page)
    for field, value in shown:
        api = lookup(item, field)
        if api is _MISSING:
            out.append(f"{field}: the page shows {value!r}, the API states nothing")
        elif api != value:
            out.append(f"{field}: the page shows {value!r}, the API {api!r}")
    fields = {f for f, _ in shown}
    out += [f"{f}: not shown on the page" for f in required if f not in fields]
    return out
