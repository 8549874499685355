# recoverydash: the two commands a new user needs are `make demo` and `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8000
# The machine's PostgreSQL (trust auth); `make test` uses it when it answers, else SQLite.
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/test
# PyTorch is pinned (torch==2.13.0): a local wheel folder, when the machine has one, avoids a download.
PIP_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)

.PHONY: install test test-sqlite test-fast serve demo bench browser migrate lint clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	$(PY) -m pip install --quiet $(PIP_LINKS) -e ".[dev,torch,frameworks]"
	touch $@

install: $(VENV)/.installed  ## create .venv and install everything
	@$(MAKE) --no-print-directory browser || echo "note: no chromium: browser tests will be skipped"

browser:  ## Debian's chromium for the Playwright tests (no browser download)
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null)

migrate: $(VENV)/.installed
	$(PY) manage.py migrate --noinput

test: $(VENV)/.installed  ## the whole suite on PostgreSQL (SQLite when PostgreSQL does not answer)
	@if pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then \
	  echo "tests on PostgreSQL: $(TEST_DATABASE_URL)"; \
	  DATABASE_URL=$(TEST_DATABASE_URL) $(PY) -m pytest; \
	else \
	  echo "PostgreSQL does not answer on 127.0.0.1:5432: tests on SQLite"; \
	  DATABASE_URL= $(PY) -m pytest; \
	fi

test-sqlite: $(VENV)/.installed  ## the API and model tests on SQLite (the embedded default)
	DATABASE_URL= $(PY) -m pytest -m "not slow"

serve: $(VENV)/.installed  ## web + Celery worker + beat in the foreground (PORT, default 8000)
	PORT=$(PORT) $(PY) -m recoverydash.serve

demo: $(VENV)/.installed  ## a real fault-injected PyTorch run, watched by recoverydash
	$(PY) -m recoverydash.demo

bench: $(VENV)/.installed  ## every benchmark in bench/, each prints its ratio last
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check recoverydash workers tests bench

clean:
	rm -rf var test-artifacts .pytest_cache .hypothesis
