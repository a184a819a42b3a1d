"""Airflow set-up for the provider's tests: a private AIRFLOW_HOME with SQLite metadata.

The environment is set by tests/conftest.py, before anything imports Airflow
(Airflow reads its configuration once, at import). Tests that need the
metadata database (``dag.test()``) ask for the ``airflow_db`` fixture, which runs
``airflow db migrate`` once per session.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_HOME = os.environ["AIRFLOW_HOME"]  # set by tests/conftest.py before Airflow is imported

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def airflow_db():
    """The metadata database, migrated once (about 4 s with SQLite)."""
    airflow = str(Path(sys.executable).parent / "airflow")
    subprocess.run([airflow, "db", "migrate"], check=True, env=os.environ.copy(),
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=300)
    return _HOME


class DBLogSetup:
    """A dblog config for one test: a fresh source namespace (tests/sourcedb.py: MariaDB
    by default) with the given tables, a PostgreSQL target database, a Redis prefix and
    a storage root (all removed afterwards)."""

    def __init__(self, sdb, tables: dict[str, str], tmp_path: Path, redis_prefix: str):
        import time

        import yaml

        from helpers import POSTGRES_PORT, REDIS_PORT, unique

        self.sdb = sdb
        self.db = sdb.name
        self.wm_ns = unique("wm")
        self.target_db = unique("tgt")
        with sdb.cursor() as cur:
            for name, ddl in tables.items():
                sdb.create_table(cur, name, ddl)
        raw = {
            "sources": {"src": sdb.source_config(list(tables), self.wm_ns,
                                                 7000 + int(time.time() * 1000) % 100000)},
            "targets": {"tgt": {"kind": "postgres", "source": "src", "host": "127.0.0.1",
                                "port": POSTGRES_PORT, "user": "postgres", "database": self.target_db}},
            "state": {"redis_url": f"redis://127.0.0.1:{REDIS_PORT}/0", "prefix": redis_prefix},
            "storage": {"root": str(tmp_path / "storage")},
            "spark": {"master": "local[2]"},
            "dump": {"chunk_size": 1000, "parallelism": 2, "window_timeout_s": 60},
            "tail": {"flush_events": 1000, "flush_seconds": 0.2, "lease_seconds": 10},
        }
        self.path = tmp_path / "dblog.yaml"
        self.path.write_text(yaml.safe_dump(raw))
        self.tables = [f"{self.db}.{t}" for t in tables]

    @property
    def config(self):
        from airflow_provider_dblog.engine.config import load_config
        return load_config(self.path)

    def state(self):
        from airflow_provider_dblog.engine.state import RedisState
        cfg = self.config
        return RedisState(cfg.redis_url, cfg.state_prefix, "src")

    def source(self):
        from airflow_provider_dblog.engine.sources import open_source
        return open_source(self.config.source())

    def target(self):
        from airflow_provider_dblog.engine.targets import open_target
        return open_target(self.config.target())

    def execute(self, sql: str, args=None) -> None:
        with self.sdb.cursor() as cur:
            cur.execute(sql, args)

    def close(self) -> None:
        from helpers import pg_connect
        self.sdb.drop_namespace(self.wm_ns)
        conn = pg_connect()
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{self.target_db}" WITH (FORCE)')
        conn.close()


@pytest.fixture
def setup_kind():
    """The source kind of ``dblog_setup`` (override with parametrize("setup_kind", [...]))."""
    return "mariadb"


@pytest.fixture
def dblog_setup(setup_kind, servers, tmp_path, redis_prefix):
    """``make(tables={"items": "id INT PRIMARY KEY, v VARCHAR(20)"})`` -> DBLogSetup."""
    from sourcedb import KINDS
    sdb = KINDS[setup_kind]()
    made: list[DBLogSetup] = []

    def make(tables: dict[str, str]) -> DBLogSetup:
        s = DBLogSetup(sdb, tables, tmp_path, redis_prefix)
        made.append(s)
        return s
    yield make
    try:
        for s in made:
            s.close()
    finally:
        sdb.close()


class FakeTI:
    """The little of a task instance that ``operator.execute(context)`` uses here."""

    def __init__(self, dag_id: str = "test_dag", task_id: str = "task"):
        self.dag_id, self.task_id = dag_id, task_id
        self.xcom: dict[str, object] = {}

    def xcom_push(self, key: str, value) -> None:
        self.xcom[key] = value


@pytest.fixture
def context():
    """A minimal task context for ``operator.execute(context)``."""
    from airflow.sdk.execution_time.context import OutletEventAccessors
    return {"ti": FakeTI(), "outlet_events": OutletEventAccessors()}
