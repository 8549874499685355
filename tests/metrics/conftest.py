"""Scraping ``/metrics`` the way Prometheus does, parsed with prometheus_client's own parser."""

from __future__ import annotations

import base64

import pytest
from prometheus_client.parser import text_string_to_metric_families


class Scrape:
    """A parsed exposition: ``families`` (name -> type), ``samples`` (sample name -> {labels as
    a sorted tuple of pairs: value})."""

    def __init__(self, text: str):
        self.text = text
        self.families: dict[str, str] = {}
        self.samples: dict[str, dict[tuple, float]] = {}
        for family in text_string_to_metric_families(text):
            self.families[family.name] = family.type
            for sample in family.samples:
                self.samples.setdefault(sample.name, {})[
                    tuple(sorted(sample.labels.items()))] = sample.value

    def value(self, name: str, **labels) -> float | None:
        return self.samples.get(name, {}).get(tuple(sorted(labels.items())))

    def series(self) -> int:
        return sum(len(v) for v in self.samples.values())

    def label_values(self, name: str, label: str) -> set[str]:
        return {dict(k)[label] for k in self.samples.get(name, {})}


def scrape(client, token: str | None = None, basic: tuple[str, str] | None = None,
           status: int = 200) -> Scrape | object:
    headers = {}
    if token:
        headers["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    if basic:
        headers["HTTP_AUTHORIZATION"] = "Basic " + base64.b64encode(
            ":".join(basic).encode()).decode()
    response = client.get("/metrics", **headers)
    assert response.status_code == status, response.content[:500]
    if status != 200:
        return response
    assert response["Content-Type"].startswith("text/plain; version=")
    return Scrape(response.content.decode())


@pytest.fixture
def metrics_token(project):
    """A raw token of ``project`` with scope metrics only."""
    from recoverydash.runs.models import ApiToken

    return ApiToken.issue(project, ["metrics"])[1]
