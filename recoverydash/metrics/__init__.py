"""Prometheus metrics: ``GET /metrics`` (:mod:`.views`), the stored analyses and service state
read at scrape time (:mod:`.collector`), the web processes' request counters (:mod:`.counters`)
and gunicorn's hooks for counting across worker processes (:mod:`.gunicorn`).
docs/operator-guide.md, "Prometheus and Grafana"; the metric list is
:data:`.collector.METRICS`."""
