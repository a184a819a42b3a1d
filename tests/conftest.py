"""Shared fixtures: the project's private servers and per-test namespaces.

The servers (MariaDB with ROW/FULL binlog, PostgreSQL with logical WAL, Redis
with AOF) are started once per session by the devenv module, on non-default
ports; each test gets its own database names and Redis prefix.
"""
from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

# -- Airflow: a private AIRFLOW_HOME with SQLite metadata, set before anything imports
# Airflow (it reads its configuration once, at import) ---------------------------------
_HOME = tempfile.mkdtemp(prefix="dblog-airflow-home-")
atexit.register(shutil.rmtree, _HOME, True)

AIRFLOW_ENV = {
    "AIRFLOW_HOME": _HOME,
    "AIRFLOW__CORE__UNIT_TEST_MODE": "True",
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__CORE__DAGS_FOLDER": str(Path(_HOME) / "dags"),
    "AIRFLOW__CORE__PLUGINS_FOLDER": str(Path(_HOME) / "plugins"),
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{_HOME}/airflow.db",
    "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
    # the Spark connection the operators use by default (a missing one falls back to YARN)
    "AIRFLOW_CONN_SPARK_DEFAULT": '{"conn_type":"spark","host":"local[2]"}',
    "SPARK_LOCAL_IP": "127.0.0.1",
}
if "airflow.configuration" in sys.modules or "airflow.sdk.configuration" in sys.modules:
    warnings.warn("Airflow was imported before tests/conftest.py set AIRFLOW_HOME", stacklevel=1)
os.environ.update(AIRFLOW_ENV)
for sub in ("dags", "plugins"):
    (Path(_HOME) / sub).mkdir(exist_ok=True)

import pytest  # noqa: E402
import redis  # noqa: E402
from hypothesis import settings as hypothesis_settings  # noqa: E402

# no per-example deadline: this is a noisy 2-core machine, and speed is for bench/
hypothesis_settings.register_profile("dblog", deadline=None)
hypothesis_settings.load_profile("dblog")

from helpers import (MARIADB_PORT, POSTGRES_PORT, REDIS_PORT, drop_pg_database, mysql_connect, pg_connect,  # noqa: E402
                     spark_submit_opts, unique)

# the driver JVM of every spark-submit the tests start (the jobs, pyspark in-process, the
# running Airflow's tasks): quicker to start (tests/helpers.py, spark_submit_opts); the
# class-data archive is used when already made, else made by the ``servers`` fixture
_SPARK_SUBMIT_OPTS = os.environ.get("SPARK_SUBMIT_OPTS", "")


def _set_spark_submit_opts(build_cds: bool) -> None:
    os.environ["SPARK_SUBMIT_OPTS"] = f"{spark_submit_opts(build_cds)} {_SPARK_SUBMIT_OPTS}".strip()


_set_spark_submit_opts(build_cds=False)


def pytest_sessionfinish(session, exitstatus):
    """With DBLOG_FAIL_ON_SKIP=1 (``make test``, hence CI) a skipped test fails the run: on a
    machine set up by bootstrap.sh every test can run, so a skip hides a broken set-up."""
    if os.environ.get("DBLOG_FAIL_ON_SKIP") != "1" or exitstatus not in (0, pytest.ExitCode.OK):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter else []
    if skipped:
        reporter.write_line(f"DBLOG_FAIL_ON_SKIP: {len(skipped)} test(s) skipped; every test must run here:",
                            red=True)
        for rep in skipped:
            reporter.write_line(f"  {rep.nodeid}: {rep.longrepr[2] if isinstance(rep.longrepr, tuple) else rep.longrepr}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def servers():
    if os.environ.get("DBLOG_TEST_EXTERNAL_SERVERS") != "1":
        from airflow_provider_dblog.devenv import servers as devenv
        devenv.start()
    _set_spark_submit_opts(build_cds=True)  # once per JDK and Spark install (about a minute), then cached
    return {"mariadb_port": MARIADB_PORT, "postgres_port": POSTGRES_PORT, "redis_port": REDIS_PORT}


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory):
    """A Spark standalone cluster (master and two workers of the installed pyspark on
    loopback, tests/spark_cluster.py), started when a test first asks for it and shared
    by all (integration and Airflow tests alike)."""
    from spark_cluster import TestCluster
    cluster = TestCluster(tmp_path_factory.mktemp("spark-cluster"), workers=2, cores=1, memory="1g")
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@pytest.fixture
def mysql_db(servers):
    """A fresh MariaDB database name, dropped afterwards."""
    name = unique("t")
    conn = mysql_connect()
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{name}`")
    yield name
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
    conn.close()


@pytest.fixture
def pg_db(servers):
    """A fresh PostgreSQL database name, dropped afterwards."""
    name = unique("t")
    conn = pg_connect()
    with conn.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    conn.close()
    yield name
    drop_pg_database(name)


@pytest.fixture
def redis_client(servers):
    return redis.Redis(host="127.0.0.1", port=REDIS_PORT, decode_responses=True)


@pytest.fixture
def redis_prefix(redis_client):
    prefix = unique("dblogtest")
    yield prefix
    keys = list(redis_client.scan_iter(match=f"{prefix}:*"))
    if keys:
        redis_client.delete(*keys)
