"""Path converters for names that appear in dashboard URLs: project names, run ids and
generation ids (``/p/<project>/runs/<run_id>/generations/<generation_id>/``).

What they must carry:

- a run id sent by a trainer matches ``[A-Za-z0-9._:-]{1,128}`` (docs/ingest-v1.md, the
  ``run_id`` field), but stored run ids are wider: an adopt location's run is ``adopted-`` and
  its folder's name, or the ``run_id`` a location declares, so any character but ``/`` occurs;
- a generation id sent now follows docs/ingest-v1.md#identifiers (``A-Z a-z 0-9 _ . - : = @ + ~``,
  not starting with ``.`` or ``-``), yet one stored before that rule or found in storage may hold a
  ``/``;
- a project name is any text of up to 100 characters (``Project.name``).

So a segment is any non-empty text, and ``to_url`` escapes the three things a path segment
cannot carry as they are: ``%`` (``%25``), ``/`` (``%2F``) and a segment that is only dots
(``.``/``..``, which a browser resolves away; each dot becomes ``%2E``). ``reverse()``
percent-encodes the result once more, the server decodes it once (PATH_INFO), and ``to_python``
undoes the escape: every stored name round-trips, and every id the identifier rule allows
(dots, colons, ``@``, ``+``, ``~``, ``=``) appears in the URL as it is.
"""

from __future__ import annotations

import re

_ESCAPED = re.compile(r"%(25|2F|2E)", re.IGNORECASE)
_CHAR = {"25": "%", "2F": "/", "2E": "."}


class SegmentConverter:
    """One path segment holding a stored name (see the module docstring)."""

    regex = r"[^/]+"

    def to_python(self, value: str) -> str:
        """The name from the decoded path segment: ``%25``, ``%2F``, ``%2E`` undone."""
        return _ESCAPED.sub(lambda m: _CHAR[m.group(1).upper()], value)

    def to_url(self, value) -> str:
        """The segment for ``value`` (a non-empty str); ValueError for an empty one, which
        ``reverse()`` reports as NoReverseMatch."""
        value = str(value)
        if not value:
            raise ValueError("an empty name has no URL")
        out = value.replace("%", "%25").replace("/", "%2F")
        if set(out) == {"."}:
            out = "%2E" * len(out)
        return out
