"""Slack incoming webhooks: a text fallback and Block Kit blocks, escaped per Slack's rules.

Slack reads ``&``, ``<`` and ``>`` as control characters in every ``mrkdwn`` text and in the
``text`` fallback: ``<!channel>`` pings a channel, ``<@U123>`` a person, ``<https://x|label>``
disguises a link. Every value that did not come from this module (run id, rule, summary, the
run's URL) is therefore escaped with :func:`escape` before it is placed in a text, and a text
cut to Slack's limits is never cut inside an escape. The only link in a body is the run's page.

Body (https://api.slack.com/messaging/webhooks, https://api.slack.com/reference/block-kit/blocks):
``{"text": headline, "blocks": [section (mrkdwn, at most 3,000 characters), context (the run's
link, health and alert id)]}``; a change of an open alert's subjects is a new message,
``[FIRING, UPDATED]``, saying which subjects were added and removed above the summary. Slack's
formatting rules: https://api.slack.com/reference/surfaces/formatting#escaping. The incoming
webhook's URL is its secret; Slack signs nothing it receives.
"""

from __future__ import annotations

from .transports import Transport, change_words, headline

#: Section block ``text`` limit (characters).
SECTION_LIMIT = 3000
#: Top-level ``text``: Slack recommends at most 4,000 characters.
TEXT_LIMIT = 3000
#: A context element's ``text`` limit.
CONTEXT_LIMIT = 2000


def escape(text: str) -> str:
    """``text`` with Slack's three control characters replaced by their entities: ``&`` ->
    ``&amp;``, ``<`` -> ``&lt;``, ``>`` -> ``&gt;`` (nothing else is encoded, as Slack asks)."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def cut(escaped: str, limit: int) -> str:
    """An escaped text cut to at most ``limit`` characters, ending in an ellipsis when cut, never
    inside an entity (a cut ``&am`` would be shown as is, and a bare ``&`` is what escaping
    removed)."""
    if len(escaped) <= limit:
        return escaped
    head = escaped[:limit - 1]
    amp = head.rfind("&")
    if amp != -1 and ";" not in head[amp:]:
        head = head[:amp]
    return head + "\u2026"


class SlackTransport(Transport):
    """Slack incoming-webhook body (module docstring): the headline as fallback, a section with
    the alert and a context line linking the run."""

    def body(self, payload: dict) -> dict:
        alert, run = payload["alert"], payload["run"]
        status = payload["status"].upper() + (", UPDATED" if payload.get("change") else "")
        title = (f"*[{escape(status)}] {escape(alert['severity'])}* "
                 f"{escape(alert['rule'])} on run {escape(run['run_id'])}")
        words = change_words(payload)
        told = f"\nSubjects {escape(words)}." if words else ""
        section = cut(f"{title}{told}\n{escape(alert['summary'])}", SECTION_LIMIT)
        context = cut(f"<{escape(run['url'])}|Open the run> \u00b7 health "
                      f"{escape(run.get('health', ''))} \u00b7 alert {escape(alert['id'])}",
                      CONTEXT_LIMIT)
        return {"text": cut(escape(headline(payload)), TEXT_LIMIT),
                "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": section}},
                           {"type": "context",
                            "elements": [{"type": "mrkdwn", "text": context}]}]}
