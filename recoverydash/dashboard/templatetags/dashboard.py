"""Template filters of the dashboard: durations and numbers for people, and status badges that
carry a word and a symbol (never colour alone)."""

from __future__ import annotations

from datetime import UTC
from functools import cache

from django import template
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from recoverydash.alerts.rules import duration as _duration
from recoverydash.dashboard.queries import HEALTH_WORDS
from recoverydash.recovery.counting import TOKENS
from recoverydash.recovery.counting import unit_word as _unit_word

register = template.Library()

# status word -> (css class, symbol). The symbol and the word say it; colour only repeats it.
BADGES = {
    "failing": ("bad", "✖"), "at_risk": ("warn", "▲"), "ok": ("good", "✔"), "ended": ("muted", "■"),
    "unknown": ("muted", "…"),
    "restorable": ("good", "✔"), "committed": ("muted", "◇"), "pending": ("warn", "…"),
    "rejected": ("bad", "✖"), "abandoned": ("muted", "○"),
    "exact": ("good", "✔"), "replay": ("bad", "↺"), "omission": ("bad", "⤼"),
    "replay_and_omission": ("bad", "✖"), "unverified": ("muted", "?"),
    "firing": ("bad", "●"), "acknowledged": ("warn", "◐"), "resolved": ("good", "✔"),
    "critical": ("bad", "‼"), "warning": ("warn", "!"), "info": ("muted", "i"),
    "ok_check": ("good", "✔"), "object_missing": ("bad", "✖"), "size_mismatch": ("bad", "✖"),
    "digest_mismatch": ("bad", "✖"), "object_outside_locations": ("bad", "✖"),
    "storage_unverified": ("warn", "?"), "error": ("warn", "!"),
    "absent": ("bad", "✖"), "delivered": ("good", "✔"), "failed": ("bad", "✖"),
}
WORDS = dict(HEALTH_WORDS, replay_and_omission="replay and omission", at_risk="at risk",
             ok_check="ok", absent="absent")


@register.filter
def badge(status, label: str = ""):
    """``<span class="badge bad">✖ rejected</span>``: symbol and word for a status."""
    status = str(status or "unknown")
    css, symbol = BADGES.get(status, ("muted", "•"))
    word = label or WORDS.get(status, status.replace("_", " "))
    if status in HEALTH_WORDS and not label:
        word = HEALTH_WORDS[status]
    return format_html('<span class="badge {}" data-status="{}">'
                       '<span aria-hidden="true">{}</span> {}</span>',
                       css, status, symbol, word)


@register.filter
def check_badge(status):
    """A storage check result (CheckpointObject.check_status) as a badge."""
    return badge("ok_check" if status == "ok" else status, "ok" if status == "ok" else "")


@register.filter
def duration(seconds):
    """Seconds as ``3h 05m`` / ``12m 30s`` / ``45s`` (alerts.rules.duration); ``—`` for None."""
    if seconds is None or seconds == "":
        return "—"
    return _duration(float(seconds))


@register.filter
def num(value):
    """An integer with thousands separators; ``—`` for None."""
    if value is None or value == "":
        return "—"
    try:
        if float(value).is_integer():
            return f"{int(value):,}"
        return f"{float(value):,.2f}"
    except (TypeError, ValueError):
        return value


@register.filter
def unit_word(units) -> str:
    """What a count of ``units`` (docs/definitions.md#units) is called on a page: the core's
    ``recovery.counting.unit_word`` (``tokens`` for a token stratum, ``positions`` for samples and
    for an analysis stored before units existed, ``positions (samples and tokens)`` for a sum
    over strata of both)."""
    return _unit_word(units)


@register.filter
def percent(value, digits: int = 1):
    """A share 0..1 as a percentage; ``—`` for None (or a figure the stored analysis lacks)."""
    if value is None or value == "":
        return "—"
    return f"{100.0 * float(value):.{int(digits)}f}%"


@register.filter
def share_width(value):
    """A share clamped to 0..100 for a CSS width."""
    try:
        return f"{max(0.0, min(100.0, 100.0 * float(value))):.1f}"
    except (TypeError, ValueError):
        return "0"


@register.filter
def raw(value):
    """``value`` as JSON, for a ``data-value`` attribute beside a formatted number
    (``dashboard.agreement``: the page's number beside the API's)."""
    import json

    return json.dumps(value)


@register.filter
def cursor_text(cursor, units=None):
    """A wire cursor as ``epoch 0 · position 80,048``, or ``epoch 0 · token 80,048`` in a token
    stratum (``units``: the stratum's, docs/definitions.md#units)."""
    if not cursor:
        return "—"
    word = "token" if units == TOKENS else "position"
    return f"epoch {cursor.get('epoch', 0)} · {word} {int(cursor.get('position', 0)):,}"


@register.filter
def get_item(mapping, key):
    return (mapping or {}).get(key)


@register.filter
def as_datetime(value):
    """A stored analysis time (RFC 3339 or POSIX seconds) as a datetime, for ``|date``."""
    from recoverydash.dashboard.queries import as_datetime as parse

    try:
        return parse(value)
    except (TypeError, ValueError):
        return None


@register.filter
def marked(ids, marks):
    """``[(id, mark), ...]``: sample identities beside their marks of
    ``recovery.windows.first_window_comparison`` (replayed, expected, other / seen, moved,
    skipped), for the restart page's first-window table."""
    return list(zip(ids or [], marks or []))


@register.filter
def ago(moment, now=None):
    """How long ago ``moment`` (a datetime, RFC 3339 text or POSIX seconds) was, for people:
    "just now" under a minute (also for a moment slightly in the future: clocks differ), else
    Django's ``timesince`` and "ago" ("3 minutes ago", "2 hours, 5 minutes ago"). Empty for
    None."""
    from datetime import timedelta

    from django.utils import timezone
    from django.utils.timesince import timesince

    moment = as_datetime(moment)
    if moment is None:
        return ""
    now = as_datetime(now) or timezone.now()
    if now - moment < timedelta(seconds=60):
        return "just now"
    return f"{timesince(moment, now)} ago"


@register.filter
def ts(moment, fmt: str = "Y-m-d H:i:s"):
    """``moment`` as ``<time class="ts" datetime="RFC 3339">… UTC</time>`` in the format ``fmt``
    (Django's ``date`` format); static/dashboard/time.js adds the browser's local time beside it
    when the reader chose so. A dash for None."""
    from django.utils.dateformat import format as date_format

    moment = as_datetime(moment)
    if moment is None:
        return "—"

    utc = moment.astimezone(UTC)
    return format_html('<time class="ts" datetime="{}" data-date="{}">{} UTC</time>',
                       utc.isoformat(), "1" if "Y" in fmt or "d" in fmt else "0",
                       date_format(utc, fmt))

ICONS = ("info", "bell-off", "copy", "hourglass")


@cache
def _icon_svg(name: str) -> str:
    from django.contrib.staticfiles import finders

    path = finders.find(f"dashboard/icons/{name}.svg")
    if not path:
        raise template.TemplateSyntaxError(f"no icon dashboard/icons/{name}.svg")
    with open(path, encoding="utf-8") as f:
        svg = f.read().strip()
    return svg.replace("<svg ", '<svg class="icon" aria-hidden="true" focusable="false" ', 1)


@register.simple_tag
def icon(name: str):
    """An icon of static/dashboard/icons/ inlined as SVG (``ICONS``): drawn with the page's
    text colour and size, so it shows whatever fonts the browser has (an emoji or a circled
    letter of a font the machine lacks draws an empty box). Decorative: the words beside it say
    what it means. TemplateSyntaxError for an icon that is not shipped."""
    if name not in ICONS:
        raise template.TemplateSyntaxError(f"unknown icon {name!r} (one of {ICONS})")
    return mark_safe(_icon_svg(name))  # noqa: S308 - our own static file


@register.simple_tag
def query_with(query: dict, **changes) -> str:
    """``?a=1&b=2``: the page's query ``query`` with ``changes`` applied (a value of None or ""
    drops the key); the page goes back to 1 unless ``page`` is among the changes."""
    from urllib.parse import urlencode

    merged = {k: v for k, v in dict(query or {}).items() if k != "page"}
    merged.update(changes)
    return "?" + urlencode({k: v for k, v in merged.items() if v not in (None, "")})


@register.simple_tag(takes_context=True)
def sort_link(context, column: str, label: str):
    """A column header that sorts the fleet by ``column`` (queries.FLEET_SORTS): the first click
    sorts its natural way, a click on the current sort reverses it; ``aria-sort`` says which."""
    query = context.get("query") or {}
    current = str(query.get("sort") or "attention")
    active = current.lstrip("-") == column
    reverse = active and not current.startswith("-")
    target = ("-" if reverse else "") + column
    arrow = ("▼" if not current.startswith("-") else "▲") if active else ""
    return format_html('<a class="sort" href="{}" data-sort="{}"{}>{}{}</a>',
                       query_with(query, sort=target), column,
                       mark_safe(' aria-current="true"') if active else "", label,
                       format_html(' <span aria-hidden="true">{}</span>', arrow) if arrow else "")
