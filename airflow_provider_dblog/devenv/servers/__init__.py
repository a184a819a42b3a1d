"""Start and stop private MariaDB, PostgreSQL 15 and Redis instances.

The servers belong to this project only: they listen on 127.0.0.1 on
non-default ports (13306, 15432, 16379) and keep all their files under one
base directory (``$DBLOG_LOCAL_DIR``, default ``<repo>/.dblog-local``).
System-wide servers on 3306 / 5432 / 6379 are never touched.

Everything is idempotent: ``start()`` on running servers only checks that they
answer (a few milliseconds), ``stop()`` on stopped servers does nothing.

Command line::

    python -m airflow_provider_dblog.devenv.servers start  [--only mariadb,postgres,redis]
    python -m airflow_provider_dblog.devenv.servers stop   [--only ...]
    python -m airflow_provider_dblog.devenv.servers status

Only the standard library is needed, plus PyMySQL (MariaDB readiness check and
root account fix-up) and psycopg2 (PostgreSQL readiness check); both are
imported lazily.  No Airflow import.

Modules: ``processes`` (process and port helpers), ``base`` (the base directory,
:class:`ServerPaths`, the life cycle in :class:`PrivateServer`), one module per
server (``mariadb``, ``postgres``, ``redis``), ``control`` (all three together),
``cli``.
"""

from __future__ import annotations

from .base import START_TIMEOUT, PrivateServer, ServerPaths, default_base
from .control import SERVERS, start, status, stop
from .mariadb import MARIADB, MARIADB_JDBC_JAR, MARIADB_PORT, MARIADB_SETTINGS, mariadb_url
from .postgres import PG_BIN, PG_USER, POSTGRES, POSTGRES_JDBC_JAR, POSTGRES_PORT, POSTGRES_SETTINGS, postgres_url
from .processes import HOST, STOP_TIMEOUT, ServerError
from .redis import REDIS, REDIS_PORT, REDIS_SETTINGS, redis_url

__all__ = [
    "HOST",
    "MARIADB",
    "MARIADB_JDBC_JAR",
    "MARIADB_PORT",
    "MARIADB_SETTINGS",
    "PG_BIN",
    "PG_USER",
    "POSTGRES",
    "POSTGRES_JDBC_JAR",
    "POSTGRES_PORT",
    "POSTGRES_SETTINGS",
    "REDIS",
    "REDIS_PORT",
    "REDIS_SETTINGS",
    "SERVERS",
    "START_TIMEOUT",
    "STOP_TIMEOUT",
    "PrivateServer",
    "ServerError",
    "ServerPaths",
    "default_base",
    "mariadb_url",
    "postgres_url",
    "redis_url",
    "start",
    "status",
    "stop",
]
