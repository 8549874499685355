"""Test support: set an attempt's RankSeen rows outright (what ``Attempt.rank_seen_at = {...}``
did before the map became rows)."""

from __future__ import annotations

from datetime import datetime

from recoverydash.runs.models import Attempt, RankSeen


def set_ranks_seen(attempts, seen: dict) -> None:
    """Replace the RankSeen rows of ``attempts`` (an Attempt or a queryset of them) with
    ``seen``: ``{reporter: aware datetime or RFC 3339}``."""
    pks = [attempts.pk] if isinstance(attempts, Attempt) else list(
        attempts.values_list("pk", flat=True))
    RankSeen.objects.filter(attempt_id__in=pks).delete()
    RankSeen.objects.bulk_create(
        RankSeen(attempt_id=pk, reporter=k,
                 seen_at=v if isinstance(v, datetime) else datetime.fromisoformat(v))
        for pk in pks for k, v in seen.items())
