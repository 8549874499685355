"""Who may change what of a project's configuration: one rule for the dashboard and the admin API
(the table of docs/ingest-v1.md#who-may-change-what, walked by
``tests/security/test_permission_table.py`` through both).

Three actors: the server's **operator** (``manage.py`` commands, ``apply_config``, the Django
admin, a staff account in the dashboard), a **member** of the project on the dashboard, and an
**admin token** of the project on the API. Any member can issue an admin token, so a token may do
exactly what a member may, never more.

Storage locations are where the two differ. A location **belongs to the operator** when it acts
with the server's own files, identity or network (a ``file://`` folder, ``use_ambient_credentials``,
a custom ``endpoint_url``: :data:`OPERATOR_ONLY`) or when the operator declared it (its ``origin``
is not ``dashboard`` or ``api``, the two ways a member declares one; a location whose origin is
unknown counts as the operator's). A member or a token may create a location that is none of
that, change any field of one that belongs to the project, and delete it; an operator's location
they may neither change (no field: not even its ``trainer_url``, which would remap what the
trainers' URIs point at) nor delete. Every other kind (webhook endpoints, contracts, alerts) is
the project's: members and tokens change it alike.
"""

from __future__ import annotations

#: What only the server's operator may give a location: each acts with the server's own files,
#: identity or network.
OPERATOR_ONLY = {"url": "a folder of the server's file system",
                 "use_ambient_credentials": "the server's own credentials",
                 "endpoint_url": "a custom S3 endpoint (the server's network)"}

#: ``StorageLocation.origin`` of the locations a project's member declares: the dashboard
#: (a member who is not staff) and the admin API. Any other origin is the operator's.
PROJECT_ORIGINS = frozenset({"dashboard", "api"})
#: The origin a staff account's declaration on the dashboard is stored with.
STAFF_ORIGIN = "staff"

HOW = ("the server's operator declares and changes it (manage.py add_location or apply_config, "
       "or a staff account on the storage locations page), not a project's member or token")


def operator_only_fields(url: str, use_ambient_credentials: bool,
                         endpoint_url: str) -> list[str]:
    """The fields of :data:`OPERATOR_ONLY` that these values use (``url`` a ``file://`` folder,
    ambient credentials on, a custom endpoint set), in that order."""
    used = {"url": (url or "").startswith("file://"),
            "use_ambient_credentials": bool(use_ambient_credentials),
            "endpoint_url": bool(endpoint_url)}
    return [name for name, yes in used.items() if yes]


def operators_location(location) -> str | None:
    """Why ``location`` (a saved ``StorageLocation``) is the operator's, in words, or None when it
    belongs to the project (module docstring)."""
    used = operator_only_fields(location.url, location.use_ambient_credentials,
                                location.endpoint_url)
    if used:
        return f"it uses {OPERATOR_ONLY[used[0]]}"
    if location.origin not in PROJECT_ORIGINS:
        return "the server's operator declared it"
    return None


def location_refusals(instance, url: str, values: dict) -> dict[str, list[str]]:
    """What a member or an admin token may not do when declaring the location ``url`` (canonical
    form) with ``values`` (the fields given, cleaned), ``instance`` the stored location with that
    URL or None: ``{field: [message]}``, empty when allowed. An operator's location refuses the
    whole item (field ``""``); otherwise each field that would use what :data:`OPERATOR_ONLY`
    names is refused."""
    if instance is not None:
        why = operators_location(instance)
        if why is not None:
            return {"": [f"storage location {instance.url} is the operator's ({why}): {HOW}"]}
    used = operator_only_fields(url, values.get("use_ambient_credentials", False),
                                values.get("endpoint_url", ""))
    return {f: [f"{OPERATOR_ONLY[f]} is declared by the server's operator (manage.py "
                "add_location or apply_config, or a staff account on the storage locations "
                "page), not by a project's member or token"] for f in used}


def location_delete_refusal(location) -> str | None:
    """Why a member or an admin token may not delete ``location``, or None when they may."""
    why = operators_location(location)
    if why is None:
        return None
    return f"storage location {location.url} is the operator's ({why}): {HOW}"


__all__ = ["HOW", "OPERATOR_ONLY", "PROJECT_ORIGINS", "STAFF_ORIGIN", "location_delete_refusal",
           "location_refusals", "operator_only_fields", "operators_location"]
