# airflow-provider-dblog: local development entry points.
# Every target that needs them first runs bootstrap.sh (packages, .venv,
# private MariaDB:13306 / PostgreSQL:15432 / Redis:16379); it is quick when done.

SHELL := /bin/bash
REPO := $(abspath $(dir $(lastword $(MAKEFILE_LIST))))
VENV := $(REPO)/.venv
PY := $(VENV)/bin/python
BOOTSTRAP := bash $(REPO)/airflow_provider_dblog/devenv/bootstrap.sh
SERVERS := $(PY) -m airflow_provider_dblog.devenv.servers

# The one place for the environment of tests, demo and bench.
RUN_ENV := env \
	SPARK_LOCAL_IP=127.0.0.1 \
	TZ=UTC \
	PYSPARK_PYTHON=$(PY) \
	PYSPARK_DRIVER_PYTHON=$(PY) \
	PATH="$(VENV)/bin:$$PATH"

PYTEST_ARGS ?= -q --durations=30
TESTS ?= tests

.PHONY: bootstrap demo test bench chaos fuzz-schema airflow servers-start servers-stop servers-status

bootstrap:
	$(BOOTSTRAP)

# DEMO_ARGS="--target-kind delta" (or iceberg): the demo applies into a lake table and reads it back
demo: bootstrap
	cd $(REPO) && $(RUN_ENV) $(VENV)/bin/dblog demo --config airflow_provider_dblog/devenv/demo.yaml $(DEMO_ARGS)

airflow: bootstrap
	cd $(REPO) && $(RUN_ENV) $(PY) -m airflow_provider_dblog.devenv.airflow_local standalone airflow_provider_dblog/devenv/demo.yaml

# DBLOG_FAIL_ON_SKIP: every test runs here; a skipped one fails the run (tests/conftest.py)
test: bootstrap
	cd $(REPO) && $(RUN_ENV) DBLOG_FAIL_ON_SKIP=1 $(PY) -m pytest $(PYTEST_ARGS) $(TESTS)

bench: bootstrap
	cd $(REPO) && $(RUN_ENV) $(PY) -m bench

# the chaos loop (issue 15): CHAOS_ARGS="--minutes 10 --seed 1 --source mariadb"; it stops
# and starts the private servers, so it holds the tests' lock
chaos: bootstrap
	cd $(REPO) && flock /tmp/dblog-tests.lock $(RUN_ENV) $(PY) -m bench.chaos $(CHAOS_ARGS)

# the schema-change fuzzer (issue 27): FUZZ_ARGS="--source postgres --seed 1 --sequences 10 --statements 30"
fuzz-schema: bootstrap
	cd $(REPO) && flock /tmp/dblog-tests.lock $(RUN_ENV) $(PY) -m bench.schema_fuzz $(or $(FUZZ_ARGS),--source mariadb)

servers-start:
	$(BOOTSTRAP)

servers-stop:
	@if [ -x $(PY) ]; then $(SERVERS) stop; else echo "no $(VENV): nothing to stop"; fi

servers-status:
	$(SERVERS) status
