"""docs/definitions.md#at-risk-ratio and #attention-order."""

from recoverydash.recovery.attention import at_risk_ratio, attention_key, needs_attention


def test_it_divides_the_seconds_since_last_restorable_by_the_limit():
    assert at_risk_ratio(5400, 3600) == 1.5
    assert at_risk_ratio(None, 3600) == 0.0
    assert at_risk_ratio(-3, 3600) == 0.0
    assert at_risk_ratio(1, 0) == float("inf") and at_risk_ratio(0, 0) == 0.0


def test_it_orders_critical_then_warnings_then_ratio_then_health_drills_last():
    runs = {
        "five-warnings": dict(critical=0, warning=5, ratio=0.1, health="ok"),
        "one-critical": dict(critical=1, warning=0, ratio=0.0, health="ended"),
        "stale": dict(critical=0, warning=0, ratio=2.5, health="ok"),
        "failing": dict(critical=0, warning=0, ratio=0.2, health="failing"),
        "ok": dict(critical=0, warning=0, ratio=0.2, health="ok"),
        "drill": dict(critical=3, warning=0, ratio=9.0, health="failing", drill=True),
    }
    order = sorted(runs, key=lambda name: attention_key(**runs[name]) + (name,))
    assert order == ["one-critical", "five-warnings", "stale", "failing", "ok", "drill"]
    assert [n for n in order if needs_attention(**runs[n])] == [
        "one-critical", "five-warnings", "stale", "failing"]
