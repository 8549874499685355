"""Each receiver's documented body, written down as JSON Schema (fields, types, limits), with the
page it was read from. The tests validate every body a transport makes against these; limits a
JSON Schema cannot say (a total over several fields, a card's size) are checked beside them in
``test_receivers.py``. Nothing here is taken from the code under test."""

from __future__ import annotations


def text_object(limit: int) -> dict:
    """A Block Kit text object."""
    return {"type": "object", "required": ["type", "text"], "additionalProperties": False,
            "properties": {"type": {"enum": ["mrkdwn", "plain_text"]},
                           "text": {"type": "string", "minLength": 1, "maxLength": limit},
                           "emoji": {"type": "boolean"}, "verbatim": {"type": "boolean"}}}


#: https://api.slack.com/messaging/webhooks (text, blocks);
#: https://api.slack.com/reference/block-kit/blocks (at most 50 blocks; section text at most
#: 3,000 characters; a context block at most 10 elements);
#: https://api.slack.com/methods/chat.postMessage#truncating (text truncated past 40,000).
SLACK = {
    "type": "object", "required": ["text"], "additionalProperties": False,
    "properties": {
        "text": {"type": "string", "minLength": 1, "maxLength": 40000},
        "blocks": {"type": "array", "maxItems": 50, "items": {"oneOf": [
            {"type": "object", "required": ["type", "text"], "additionalProperties": False,
             "properties": {"type": {"const": "section"}, "text": text_object(3000)}},
            {"type": "object", "required": ["type", "elements"], "additionalProperties": False,
             "properties": {"type": {"const": "context"},
                            "elements": {"type": "array", "minItems": 1, "maxItems": 10,
                                         "items": text_object(3000)}}},
        ]}},
    },
}

#: https://developer.pagerduty.com/docs/events-api-v2/trigger-events/ (routing_key 32
#: characters; dedup_key at most 255; payload.summary at most 1,024; severity critical, error,
#: warning or info; source required).
PAGERDUTY_TRIGGER = {
    "type": "object", "required": ["routing_key", "event_action", "payload"],
    "additionalProperties": False,
    "properties": {
        "routing_key": {"type": "string", "minLength": 32, "maxLength": 32},
        "event_action": {"const": "trigger"},
        "dedup_key": {"type": "string", "minLength": 1, "maxLength": 255},
        "payload": {
            "type": "object", "required": ["summary", "source", "severity"],
            "additionalProperties": False,
            "properties": {
                "summary": {"type": "string", "minLength": 1, "maxLength": 1024},
                "source": {"type": "string", "minLength": 1},
                "severity": {"enum": ["critical", "error", "warning", "info"]},
                "timestamp": {"type": "string"},
                "component": {"type": "string"}, "group": {"type": "string"},
                "class": {"type": "string"}, "custom_details": {"type": "object"},
            },
        },
        "images": {"type": "array"},
        "links": {"type": "array", "items": {
            "type": "object", "required": ["href"], "additionalProperties": False,
            "properties": {"href": {"type": "string"}, "text": {"type": "string"}}}},
        "client": {"type": "string"}, "client_url": {"type": "string"},
    },
}

#: https://developer.pagerduty.com/docs/events-api-v2/acknowledge-events/ and
#: .../resolve-events/: routing_key, event_action and the dedup_key of the trigger.
PAGERDUTY_FOLLOW_UP = {
    "type": "object", "required": ["routing_key", "event_action", "dedup_key"],
    "additionalProperties": False,
    "properties": {
        "routing_key": {"type": "string", "minLength": 32, "maxLength": 32},
        "event_action": {"enum": ["acknowledge", "resolve"]},
        "dedup_key": {"type": "string", "minLength": 1, "maxLength": 255},
    },
}

_LABELS = {"type": "object", "propertyNames": {"pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"},
           "additionalProperties": {"type": "string"}}

#: https://prometheus.io/docs/alerting/latest/configuration/#webhook_config (the JSON body a
#: webhook receiver gets; label names per
#: https://prometheus.io/docs/concepts/data_model/#metric-names-and-labels).
ALERTMANAGER = {
    "type": "object", "additionalProperties": False,
    "required": ["version", "groupKey", "status", "receiver", "groupLabels", "commonLabels",
                 "commonAnnotations", "externalURL", "alerts"],
    "properties": {
        "version": {"const": "4"},
        "groupKey": {"type": "string", "minLength": 1},
        "truncatedAlerts": {"type": "integer", "minimum": 0},
        "status": {"enum": ["firing", "resolved"]},
        "receiver": {"type": "string", "minLength": 1},
        "groupLabels": _LABELS, "commonLabels": _LABELS, "commonAnnotations": _LABELS,
        "externalURL": {"type": "string"},
        "alerts": {"type": "array", "minItems": 1, "items": {
            "type": "object", "additionalProperties": False,
            "required": ["status", "labels", "annotations", "startsAt", "endsAt",
                         "generatorURL", "fingerprint"],
            "properties": {
                "status": {"enum": ["firing", "resolved"]},
                "labels": _LABELS, "annotations": _LABELS,
                "startsAt": {"type": "string"}, "endsAt": {"type": "string"},
                "generatorURL": {"type": "string"},
                "fingerprint": {"type": "string", "minLength": 1},
            },
        }},
    },
}

#: https://docs.opsgenie.com/docs/alert-api#create-alert (message required, at most 130
#: characters; alias 512; description 15,000; responders and visibleTo at most 50; actions at
#: most 10 of 50 characters; tags at most 20 of 50 characters; details a map of strings, 8,000
#: characters in all; entity 512; source 100; priority P1-P5; user 100; note 25,000).
OPSGENIE_CREATE = {
    "type": "object", "required": ["message"], "additionalProperties": False,
    "properties": {
        "message": {"type": "string", "minLength": 1, "maxLength": 130},
        "alias": {"type": "string", "maxLength": 512},
        "description": {"type": "string", "maxLength": 15000},
        "responders": {"type": "array", "maxItems": 50},
        "visibleTo": {"type": "array", "maxItems": 50},
        "actions": {"type": "array", "maxItems": 10,
                    "items": {"type": "string", "maxLength": 50}},
        "tags": {"type": "array", "maxItems": 20, "items": {"type": "string", "maxLength": 50}},
        "details": {"type": "object", "additionalProperties": {"type": "string"}},
        "entity": {"type": "string", "maxLength": 512},
        "source": {"type": "string", "maxLength": 100},
        "priority": {"enum": ["P1", "P2", "P3", "P4", "P5"]},
        "user": {"type": "string", "maxLength": 100},
        "note": {"type": "string", "maxLength": 25000},
    },
}
OPSGENIE_DETAILS_LIMIT = 8000

#: https://docs.opsgenie.com/docs/alert-api#close-alert and #acknowledge-alert (user 100, source
#: 100, note 25,000; the alert named in the path, identifierType=alias in the query).
OPSGENIE_FOLLOW_UP = {
    "type": "object", "additionalProperties": False,
    "properties": {"user": {"type": "string", "maxLength": 100},
                   "source": {"type": "string", "maxLength": 100},
                   "note": {"type": "string", "maxLength": 25000}},
}

_TEXT_RUN = {"type": "object", "required": ["type", "text"],
             "properties": {"type": {"const": "TextRun"}, "text": {"type": "string"},
                            "weight": {"enum": ["Default", "Lighter", "Bolder"]},
                            "color": {"type": "string"}}}

#: https://learn.microsoft.com/en-us/microsoftteams/platform/webhooks-and-connectors/how-to/connectors-using#send-adaptive-cards-using-an-incoming-webhook
#: (the message envelope) and https://adaptivecards.io/explorer/ (AdaptiveCard, TextBlock,
#: RichTextBlock, TextRun: "Markdown is not supported", Action.OpenUrl); Teams renders card
#: version 1.4 and messages up to 28 KB.
TEAMS = {
    "type": "object", "required": ["type", "attachments"], "additionalProperties": False,
    "properties": {
        "type": {"const": "message"},
        "attachments": {"type": "array", "minItems": 1, "maxItems": 1, "items": {
            "type": "object", "required": ["contentType", "content"],
            "additionalProperties": False,
            "properties": {
                "contentType": {"const": "application/vnd.microsoft.card.adaptive"},
                "contentUrl": {"type": "null"},
                "content": {
                    "type": "object", "required": ["type", "version", "body"],
                    "properties": {
                        "$schema": {"type": "string"},
                        "type": {"const": "AdaptiveCard"},
                        "version": {"enum": ["1.0", "1.1", "1.2", "1.3", "1.4"]},
                        "body": {"type": "array", "items": {"oneOf": [
                            {"type": "object", "required": ["type", "text"],
                             "properties": {"type": {"const": "TextBlock"},
                                            "text": {"type": "string"}}},
                            {"type": "object", "required": ["type", "inlines"],
                             "properties": {"type": {"const": "RichTextBlock"},
                                            "inlines": {"type": "array", "items": _TEXT_RUN}}},
                        ]}},
                        "actions": {"type": "array", "items": {
                            "type": "object", "required": ["type", "url"],
                            "properties": {"type": {"const": "Action.OpenUrl"},
                                           "title": {"type": "string"},
                                           "url": {"type": "string"}}}},
                        "msteams": {"type": "object"},
                    },
                },
            },
        }},
    },
}
TEAMS_MAX_BYTES = 28 * 1024
