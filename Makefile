# Two commands: `make run` and `make test`.
VENV ?= .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# openapi-python-client in a virtualenv of its own: it pins httpx below the console's.
TOOLS ?= .venv-tools
TOOLS_STAMP := $(TOOLS)/.installed
# pytest-xdist workers for `make test` and `make test-sqlite` (WORKERS=0: no xdist, every test in
# pytest's own process). Three on two cores: much of an e2e test's time is spent waiting (for a
# process to start, a threshold to pass, an outage to last). Measured on the PostgreSQL pass:
# 3 and 4 workers about 3 minutes each, 6 no faster; each test takes longer the more run at
# once (the sum of their times: 480 s with 3, 580 s with 4, 870 s with 6), and 6 made a
# timing-bound e2e test fail. Each worker has a test database and a Redis database of its own
# (tests/conftest.py).
WORKERS ?= 3
# loadgroup: tests are handed out one by one to whichever worker is free, except the groups
# of XDIST_GROUPS in tests/conftest.py (the Slurm cluster's tests; the tests that build the
# agent's wheels), each handed out first and whole to one worker.
XDIST = $(if $(filter 0,$(WORKERS)),,-n $(WORKERS) --dist loadgroup)

.PHONY: run test quick test-sqlite lint docs docs-build bench install clean token mutate

# The console, and the `tuneplane` command line (cli/, a distribution of its own) beside it.
$(STAMP): pyproject.toml cli/pyproject.toml
	test -x $(PYTHON) || python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet -e '.[test]'
	$(PYTHON) -m pip install --quiet -e ./cli
	touch $(STAMP)

$(TOOLS_STAMP): tools/openapi-client.txt
	test -x $(TOOLS)/bin/python || python3 -m venv $(TOOLS)
	$(TOOLS)/bin/python -m pip install --quiet -r tools/openapi-client.txt
	touch $(TOOLS_STAMP)

install: $(STAMP) $(TOOLS_STAMP)

## An API token for USER (an existing login, e.g. the admin `make run` made): printed once.
## It goes to the console `make run` runs: the same DATABASE_URL, or var/'s SQLite file.
## USER from the command line only: the shell's own $$USER (root, say) is no console login.
TOKEN_USER = $(if $(filter command line,$(origin USER)),$(USER),admin)
token: $(STAMP)
	@TUNEPLANE_DEBUG=$${TUNEPLANE_DEBUG:-0} $(PYTHON) manage.py create_api_token "$(TOKEN_USER)"

## The whole console on embedded defaults (SQLite, filesystem broker) unless
## DATABASE_URL / REDIS_URL say otherwise.
run: $(STAMP)
	TUNEPLANE_DEBUG=$${TUNEPLANE_DEBUG:-0} $(PYTHON) manage.py runconsole

## Every test, on PostgreSQL and Redis (local ones unless DATABASE_URL / REDIS_URL are set).
## The quick loop: make test PYTEST_ARGS='-m "not e2e"' leaves out every test that starts real
## processes (tests/conftest.py says which): under a minute; with WORKERS=0 about half a minute,
## as these tests are all computing, and each worker first builds its own test database.
## REDIS_URL's database number is the first xdist worker's; the next ones count down from it.
test: lint docs-build $(TOOLS_STAMP)
	DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/tuneplane} \
	REDIS_URL=$${REDIS_URL:-redis://127.0.0.1:6379/15} \
	$(PYTHON) -m pytest $(XDIST) $(PYTEST_ARGS)

## The newcomer's loop: every test that starts no real process (no gateway, agent, Celery,
## browser or Slurm) on the embedded defaults — SQLite, no PostgreSQL and no Redis needed —
## in two pytest-xdist workers. What needs PostgreSQL's row locks or a Redis server is left
## to `make test`.
## The test databases are kept between runs (--reuse-db) in a folder of the system's
## temporary one named for the checkout and the migrations they were made by: a changed
## migration makes new ones.
QUICK_VAR = $$(test -w /dev/shm && echo /dev/shm || echo $${TMPDIR:-/tmp})/tuneplane-quick-$(shell (pwd; cat */migrations/*.py) | md5sum | cut -c1-12)
quick: $(STAMP)
	mkdir -p $(QUICK_VAR)
	env -u DATABASE_URL -u REDIS_URL -u PYTHONDONTWRITEBYTECODE TUNEPLANE_VAR_DIR=$(QUICK_VAR) \
	$(PYTHON) -m pytest -n 2 --reuse-db -p no:playwright -p no:schemathesis -m "not e2e and not slow and not postgres and not redis" -q $(PYTEST_ARGS)

## ruff: lint and import order, and the formatting, as pyproject.toml configures them.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

## The documentation site (mkdocs.yml, docs/): built with --strict, so a broken link, a page
## missing from the nav or a reference generator failing (docs/_hooks/reference.py: settings,
## the agent's and the CLI's options, the API from `manage.py spectacular`, the control
## protocol) fails `make test`. Into var/site; a few seconds. Not --quiet:
## with it MkDocs 1.6 no longer counts the warnings that --strict fails on.
docs-build: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir var/site

## The site served with live reload at http://127.0.0.1:$(DOCS_PORT) (8008: beside `make run`'s 8000).
DOCS_PORT ?= 8008
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --strict --dev-addr 127.0.0.1:$(DOCS_PORT)

## The suite again on the embedded defaults (SQLite, filesystem broker): what can come out
## differently there, after `make test` ran everything on PostgreSQL. That is every test that
## has a database: the in-process ones (the ORM, locking and transactions differ by vendor),
## and the e2e ones that hand their database to real processes, which prove the embedded
## default itself: runconsole (`make run`), migrations from zero, the gateway and the agent,
## join and install.sh. Left out: what needs PostgreSQL or Redis; the browser and Slurm tests
## and bench (left out before: the browser and Slurm drive what in-process tests cover here);
## and the tests marked nodb by tests/conftest.py, which use no database (parsers, clients of
## replayed APIs, the settings read in a subprocess): the same on either, run by `make test`.
test-sqlite: $(STAMP)
	env -u DATABASE_URL -u REDIS_URL TUNEPLANE_VAR_DIR=$$(mktemp -d) \
	$(PYTHON) -m pytest $(XDIST) -m "not postgres and not redis and not browser and not bench and not slurm and not nodb" $(PYTEST_ARGS)

## Mutation testing (mutmut 3, pyproject.toml's [tool.mutmut]): each mutant of the rule-bearing
## files tried against the in-process tests that reach it; the score per file and its survivors
## printed at the end (tests/mutation/score.py), those left on purpose listed with why in
## tests/mutation/survivors.md. FILE=placement/decide.py for one file. Slow: each mutant is a
## pytest run, 3–10 s here (measured: placement/sharing.py, 63 mutants, ~6 minutes with 2
## children on 2 busy cores; all 11 files, 2,773 mutants, several hours). Results are kept in
## mutants/ and a mutant is tried again only when its function or the tests change.
## A test database of its own (tuneplane_mutate), so that it runs beside `make test`.
MUTATE_CHILDREN ?= 2
mutate: $(STAMP)
	mkdir -p var/mutate
	DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/tuneplane_mutate} \
	REDIS_URL=$${REDIS_URL:-redis://127.0.0.1:6379/15} TUNEPLANE_VAR_DIR=$(CURDIR)/var/mutate \
	$(PYTHON) tests/mutation/run.py --max-children $(MUTATE_CHILDREN) $(FILE)
	$(PYTHON) tests/mutation/score.py $(FILE)

## Benchmarks: figures printed, not asserted (PostgreSQL as for `make test`).
bench: $(STAMP)
	DATABASE_URL=$${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/tuneplane} \
	REDIS_URL=$${REDIS_URL:-redis://127.0.0.1:6379/15} \
	$(PYTHON) -m pytest -m bench -q tests/bench $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(TOOLS) var
