# recoverydash: the two commands a new user needs are `make demo` and `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8000
# The machine's PostgreSQL (trust auth); `make test` uses it when it answers, else SQLite.
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/test
# Test processes (pytest-xdist; each has its own test database, test_<name>_gw<N>). 1 runs in one.
# Whole files go to one process (--dist loadfile): a module-scoped fixture (a whole demo, a real
# distributed job) then runs once, not once per process.
TEST_PROCESSES ?= 2
PYTEST_PROCESSES := $(if $(filter 1,$(TEST_PROCESSES)),,-n $(TEST_PROCESSES) --dist loadfile)
# make test-sqlite: the tests of the code that speaks SQL differently per database (ingest's
# locks and sequences, the run models and analysis state, alert rules, storage locations, metrics,
# health, the migrations) on the embedded SQLite. `make test` already runs the whole demo, whose
# server is on SQLite, end to end.
SQLITE_TESTS := tests/ingest tests/runs tests/alerts tests/storage tests/metrics \
  tests/security/test_deployment.py tests/test_migrations.py
# PyTorch is pinned to its CPU build (torch==2.13.0 in pyproject.toml, 2.13.0+cpu). It comes from
# PyTorch's CPU wheel index (PyPI's Linux wheel is the CUDA build, several GB); a local folder of
# wheels that holds torch (TORCH_WHEELS) replaces that index, for machines without a route to it.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_WHEELS ?= /opt/wheels
PIP_TORCH := $(if $(wildcard $(TORCH_WHEELS)/torch-*.whl),--find-links $(TORCH_WHEELS),--extra-index-url $(TORCH_INDEX))
CHROMIUM := /usr/bin/chromium
# Mosaic Streaming without its declared requirements (transformers<5 and numpy<2.2 clash with the
# frameworks extra's pins); the modules it imports for local shards are in that extra.
STREAMING := mosaicml-streaming==0.13.0

.PHONY: install alertmanager test test-sqlite test-fast serve demo bench browser migrate lint typecheck docs clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	$(PY) -m pip install --quiet $(PIP_TORCH) -e ".[server,dev,torch,frameworks]"
	$(PY) -m pip install --quiet --no-deps $(STREAMING)
	touch $@

install: $(VENV)/.installed  ## create .venv and install everything (server, SDK, PyTorch CPU, test tools)
	@$(MAKE) --no-print-directory browser alertmanager

# Debian's Alertmanager, for the test that pushes alerts into a real one
# (tests/alerts/test_alertmanager_api.py; without it that test checks the bodies against the
# API's schema only). Like the browser: root and apt-get, else a note.
alertmanager:
	@if command -v prometheus-alertmanager >/dev/null 2>&1; then \
	  echo "alertmanager: $$(command -v prometheus-alertmanager)"; \
	elif ! command -v apt-get >/dev/null 2>&1 || [ "$$(id -u)" != 0 ]; then \
	  echo "note: no prometheus-alertmanager (apt-get as root installs it); its live test will be skipped"; \
	elif apt-get install -y -qq prometheus-alertmanager >/dev/null 2>&1 \
	    || (apt-get update -qq && apt-get install -y -qq prometheus-alertmanager >/dev/null); then \
	  echo "alertmanager: installed"; \
	else \
	  echo "note: apt-get did not install prometheus-alertmanager; its live test will be skipped"; \
	fi

# Debian's chromium for the Playwright tests (never a browser download). Installing it needs root
# and apt-get; without them this says so and goes on: the browser tests are then skipped.
browser:  ## Debian's chromium for the browser tests, when root on Debian/Ubuntu
	@if [ -x $(CHROMIUM) ]; then \
	  echo "chromium: $(CHROMIUM)"; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
	  echo "note: no $(CHROMIUM) and no apt-get: chromium not installed; browser tests will be skipped"; \
	elif [ "$$(id -u)" != 0 ]; then \
	  echo "note: no $(CHROMIUM); installing Debian's chromium needs root (sudo apt-get install chromium); browser tests will be skipped"; \
	elif apt-get update -qq && apt-get install -y -qq chromium >/dev/null && [ -x $(CHROMIUM) ]; then \
	  echo "chromium: installed $(CHROMIUM)"; \
	else \
	  echo "note: apt-get did not install $(CHROMIUM); browser tests will be skipped"; \
	fi

migrate: $(VENV)/.installed
	$(PY) manage.py migrate --noinput

test: $(VENV)/.installed  ## the whole suite on PostgreSQL (SQLite when PostgreSQL does not answer)
	@if pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then \
	  echo "tests on PostgreSQL: $(TEST_DATABASE_URL)"; \
	  DATABASE_URL=$(TEST_DATABASE_URL) $(PY) -m pytest $(PYTEST_PROCESSES); \
	else \
	  echo "PostgreSQL does not answer on 127.0.0.1:5432: tests on SQLite"; \
	  DATABASE_URL= $(PY) -m pytest $(PYTEST_PROCESSES); \
	fi

test-sqlite: $(VENV)/.installed  ## the SQL-speaking code's tests on SQLite (the embedded default)
	DATABASE_URL= $(PY) -m pytest $(PYTEST_PROCESSES) -m "not slow" $(SQLITE_TESTS)

serve: $(VENV)/.installed  ## web + Celery workers + beat in the foreground (PORT; ROLES="web worker" for some)
	PORT=$(PORT) $(PY) -m recoverydash.serve $(ROLES)

demo: $(VENV)/.installed  ## a real fault-injected PyTorch run, watched by recoverydash
	$(PY) -m recoverydash.demo

bench: $(VENV)/.installed  ## every benchmark in bench/, each prints its ratio last
	@for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

lint: $(VENV)/.installed  ## ruff, pinned, with the rule set of pyproject.toml
	$(VENV)/bin/ruff check recoverydash workers tests bench examples

# The typed packages: the recovery core, the checkpoints layer, the SDK and the integrations
# (pyproject.toml's [tool.mypy]; the checkpoints layer under mypy's strict flags).
typecheck: $(VENV)/.installed  ## mypy on recovery/, checkpoints/, sdk/ and integrations/
	$(VENV)/bin/mypy recoverydash/recovery recoverydash/checkpoints recoverydash/sdk recoverydash/integrations

# The documentation site (mkdocs.yml, docs/*.md) into site/; --strict fails on a link to a page
# or heading that does not exist. The dashboard serves the same files at /docs/.
docs: $(VENV)/.installed  ## the documentation site, mkdocs build --strict, into site/
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

clean:
	rm -rf var test-artifacts .pytest_cache .hypothesis site
