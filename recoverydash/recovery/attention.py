"""The fleet's attention order (docs/definitions.md#attention-order): which run an on-call
person looks at first. Pure: counts, seconds and words in, a sort key out."""

from __future__ import annotations

#: docs/definitions.md#health words, most urgent first; anything else (not analysed yet) last.
HEALTH_RANK = {"failing": 0, "at_risk": 1, "ok": 2, "ended": 3}


def at_risk_ratio(seconds_since_restorable: float | None, max_checkpoint_age_s: float,
                  ended: bool = False) -> float:
    """docs/definitions.md#at-risk-ratio: the seconds since the last restorable generation
    (``figures.seconds_since_last_restorable``) divided by the contract's
    ``max_checkpoint_age_s``; 1.0 is at the limit. 0.0 when the seconds are unknown, and for a run
    that ended (``ended``: health ``ended``; nothing more can be lost, as
    ``figures.checkpoint_stale`` says); with a limit of 0 (every second stale) any positive age is
    ``inf`` and an age of 0 is 0.0."""
    if seconds_since_restorable is None or ended:
        return 0.0
    seconds = max(float(seconds_since_restorable), 0.0)
    limit = float(max_checkpoint_age_s)
    if limit <= 0:
        return float("inf") if seconds > 0 else 0.0
    return seconds / limit


def attention_key(*, critical: int, warning: int, ratio: float, health: str,
                  drill: bool = False) -> tuple:
    """docs/definitions.md#attention-order: the sort key of a run, smallest first.

    In order: a drill last (``drill``: a run marked as an exercise never outranks a real one);
    more open ``critical`` alerts first; then more open ``warning`` alerts; then a larger
    :func:`at_risk_ratio`; then the health word by ``HEALTH_RANK`` (failing, at risk, ok, ended,
    not analysed). Ties are left to the caller (the fleet breaks them by run id)."""
    return (1 if drill else 0, -int(critical), -int(warning), -float(ratio),
            HEALTH_RANK.get(health, len(HEALTH_RANK)))


def needs_attention(*, critical: int, warning: int, ratio: float, health: str,
                    drill: bool = False) -> bool:
    """docs/definitions.md#attention-order: the fleet's default view holds a run that is not a
    drill and has an open critical or warning alert, is past its checkpoint-age limit
    (``ratio`` above 1), or whose health is failing or at risk."""
    return not drill and (critical > 0 or warning > 0 or ratio > 1.0
                          or health in ("failing", "at_risk"))
