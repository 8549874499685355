"""Microsoft Teams through a Workflows webhook ("When a Teams webhook request is received", then
"Post card in a chat or channel"): a message with one Adaptive Card.

Body (https://learn.microsoft.com/en-us/microsoftteams/platform/webhooks-and-connectors/how-to/connectors-using#send-adaptive-cards-using-an-incoming-webhook,
https://adaptivecards.io/explorer/): ``{"type": "message", "attachments": [{"contentType":
"application/vnd.microsoft.card.adaptive", "contentUrl": null, "content": AdaptiveCard}]}``, the
card of version 1.4 (what Teams renders) at most 28 KB. The Workflows URL carries its own
signature (the ``sig`` query parameter): the URL is the secret, as for Slack.

Adaptive Cards read ``TextBlock`` text as Markdown, so a run id such as ``[click](https://evil)``
or a summary with ``**`` would become a link or formatting in the channel. Every value that did
not come from this module is therefore placed only in ``TextRun`` elements of a
``RichTextBlock``, whose text Adaptive Cards never read as Markdown; ``TextBlock`` holds only
this module's own words. The one link is the run's page (``Action.OpenUrl``).
"""

from __future__ import annotations

from .transports import Transport, clip

SUMMARY_LIMIT = 2000
VALUE_LIMIT = 300
COLORS = {"critical": "Attention", "warning": "Warning", "info": "Accent"}


def run_of(text: str, **style) -> dict:
    """A ``TextRun`` (plain text, never Markdown) with optional styles (``weight``, ``color``)."""
    return {"type": "TextRun", "text": text, **style}


class TeamsTransport(Transport):
    """Teams Workflows webhook with an Adaptive Card (module docstring)."""

    def body(self, payload: dict) -> dict:
        alert, run = payload["alert"], payload["run"]
        color = COLORS.get(alert["severity"], "Default")
        facts = [("Rule", alert["rule"]), ("Severity", alert["severity"]),
                 ("State", alert.get("state", payload["status"])), ("Run", run["run_id"]),
                 ("Health", str(run.get("health", ""))), ("Alert", alert["id"])]
        if run.get("project"):
            facts.insert(3, ("Project", run["project"]))
        change = payload.get("change") or {}
        facts[:0] = [(f"Subjects {key}", ", ".join(str(s) for s in change[key]))
                     for key in ("added", "removed") if change.get(key)]  # subjects changed
        card = {
            "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
            "type": "AdaptiveCard", "version": "1.4",
            "body": [
                {"type": "TextBlock", "text": f"recoverydash: {payload['status']}"
                 + (", updated" if change else ""),
                 "weight": "Bolder", "size": "Medium", "color": color, "wrap": True},
                {"type": "RichTextBlock", "inlines": [
                    run_of(clip(alert["summary"], SUMMARY_LIMIT))]},
                *({"type": "RichTextBlock", "inlines": [
                    run_of(f"{name}: ", weight="Bolder"), run_of(clip(value, VALUE_LIMIT))]}
                  for name, value in facts),
            ],
            "actions": [{"type": "Action.OpenUrl", "title": "Open the run", "url": run["url"]}],
            "msteams": {"width": "Full"},
        }
        return {"type": "message", "attachments": [
            {"contentType": "application/vnd.microsoft.card.adaptive", "contentUrl": None,
             "content": card}]}
