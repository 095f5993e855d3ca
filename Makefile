# Two commands: `make run` and `make test`.
VENV ?= .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-sqlite bench install clean

$(STAMP): pyproject.toml
	test -x $(PYTHON) || python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

## The whole console on embedded defaults (SQLite, filesystem broker) unless
## DATABASE_URL / REDIS_URL say otherwise.
run: $(STAMP)
	TUNEPLANE_DEBUG=$${TUNEPLANE_DEBUG:-1} $(PYTHON) manage.py runconsole

## Every test, on PostgreSQL and Redis (local ones unless DATABASE_URL / REDIS_URL are set).
## The quick loop (about half a minute): make test PYTEST_ARGS='-m "not e2e"' leaves out every
## test that starts real processes (tests/conftest.py says which).
test: $(STAMP)
	DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/tuneplane} \
	REDIS_URL=$${REDIS_URL:-redis://127.0.0.1:6379/15} \
	$(PYTHON) -m pytest $(PYTEST_ARGS)

## The suite on the embedded defaults (SQLite), without what needs PostgreSQL or Redis.
test-sqlite: $(STAMP)
	env -u DATABASE_URL -u REDIS_URL TUNEPLANE_VAR_DIR=$$(mktemp -d) \
	$(PYTHON) -m pytest -m "not postgres and not redis and not browser and not bench and not slurm" $(PYTEST_ARGS)

## Benchmarks: figures printed, not asserted (PostgreSQL as for `make test`).
bench: $(STAMP)
	DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/tuneplane} \
	REDIS_URL=$${REDIS_URL:-redis://127.0.0.1:6379/15} \
	$(PYTHON) -m pytest -m bench -q tests/bench $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) var
