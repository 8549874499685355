"""The Grafana dashboard and the Prometheus rule file in deploy/ load, and every query in them
names metrics that ``/metrics`` exports (no Grafana or Prometheus runs here)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from recoverydash.metrics.collector import METRICS
from recoverydash.metrics.counters import REGISTRY

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NAME = re.compile(r"\brecoverydash_[a-z0-9_]+")


def exported_names() -> set[str]:
    """Sample names a scrape can carry: gauges as named, counters with ``_total``."""
    names = {name + ("_total" if spec.kind == "counter" else "") for name, spec in METRICS.items()}
    for family in REGISTRY.collect():
        names.add(family.name + "_total" if family.type == "counter" else family.name)
    return names


def exprs(value):
    """Every PromQL expression in a Grafana dashboard: targets' ``expr`` and the template
    variables' queries."""
    if isinstance(value, dict):
        for key, inner in value.items():
            if key in ("expr", "definition") and isinstance(inner, str):
                yield inner
            elif key == "query" and isinstance(inner, dict) and "query" in inner:
                yield inner["query"]
            else:
                yield from exprs(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from exprs(inner)


def test_the_grafana_dashboard_is_valid_json_whose_queries_name_exported_metrics():
    dashboard = json.loads((DEPLOY / "grafana" / "recoverydash.json").read_text())
    assert dashboard["title"] == "recoverydash" and dashboard["uid"] == "recoverydash"
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    queries = list(exprs(dashboard))
    assert len(queries) >= 25
    known = exported_names()
    for query in queries:
        named = NAME.findall(query)
        assert named, query
        assert set(named) <= known, (query, set(named) - known)
    for panel in panels:
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24
        if panel["type"] != "row":
            assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}"
            assert panel["description"]
    used = {n for q in queries for n in NAME.findall(q)}
    # Every per-run figure the issue asks for is on the board.
    for name in ("recoverydash_run_seconds_since_last_restorable",
                 "recoverydash_run_updates_at_risk",
                 "recoverydash_run_last_restart_replayed", "recoverydash_run_last_restart_omitted",
                 "recoverydash_run_last_restart_recomputed",
                 "recoverydash_run_stratum_duplicate_rate",
                 "recoverydash_run_stratum_omission_rate",
                 "recoverydash_run_goodput", "recoverydash_run_alerts_open",
                 "recoverydash_ingest_requests_total", "recoverydash_ingest_events_total",
                 "recoverydash_analysis_lag_seconds", "recoverydash_verification_queue_depth",
                 "recoverydash_webhook_deliveries_failed_total"):
        assert name in used, name


def test_the_prometheus_rules_load_and_name_exported_metrics():
    doc = yaml.safe_load((DEPLOY / "prometheus" / "recoverydash-rules.yml").read_text())
    rules = [rule for group in doc["groups"] for rule in group["rules"]]
    assert len(rules) >= 10
    assert len({r["alert"] for r in rules}) == len(rules)
    known = exported_names()
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        named = set(NAME.findall(rule["expr"]))
        assert named and named <= known, (rule["alert"], named - known)
        assert rule["labels"]["severity"] in ("info", "warning", "critical")
        assert rule["annotations"]["summary"]
        assert rule["expr"].count("(") == rule["expr"].count(")")
