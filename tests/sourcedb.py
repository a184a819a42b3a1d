"""One fresh source namespace per test, on either source kind, so the convergence
tests run unchanged against MariaDB and PostgreSQL (importable as ``sourcedb``).

``name`` is the namespace the test's tables live in (a MariaDB database, a
PostgreSQL schema): tables are ``f"{name}.t"``. ``cursor()`` gives an autocommit
cursor on which unqualified table names resolve to that namespace. Both drivers
bind ``%s`` parameters. The few statements whose SQL differs are methods here.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

from helpers import (MARIADB_PORT, POSTGRES_PORT, drop_pg_database, mysql_connect, pg_connect,
                     unique)


class MariaDB:
    kind = "mysql"
    types = {"datetime": "DATETIME(6)", "json": "JSON", "blob": "BLOB", "double": "DOUBLE"}
    now = "NOW(6)"

    def __init__(self) -> None:
        self.name = unique("t")
        with mysql_connect() as conn, conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{self.name}`")

    @contextlib.contextmanager
    def cursor(self) -> Iterator:
        with mysql_connect(self.name) as conn, conn.cursor() as cur:
            yield cur

    def source_config(self, tables: list[str], wm_ns: str, server_id: int) -> dict:
        return {"kind": "mysql", "host": "127.0.0.1", "port": MARIADB_PORT, "user": "root",
                "password": "", "server_id": server_id, "watermark_namespace": wm_ns, "heartbeat_seconds": 0.1,
                "tables": [f"{self.name}.{t}" for t in tables]}

    def create_table(self, cur, name: str, columns: str) -> None:
        cur.execute(f"CREATE TABLE {name} ({columns})")

    @staticmethod
    def series(n: int) -> str:
        return f"seq_1_to_{int(n)}"

    @staticmethod
    def ts_plus_seconds(expr: str) -> str:
        return f"TIMESTAMP '2025-01-01 00:00:00' + INTERVAL {expr} SECOND"

    @staticmethod
    def md5_bytes(expr: str) -> str:
        return f"UNHEX(MD5({expr}))"

    @staticmethod
    def json_object(key: str, value_sql: str) -> str:
        return f"JSON_OBJECT('{key}', {value_sql})"

    @staticmethod
    def upsert(table: str, values: str, key: str, set_sql: str) -> str:
        return f"INSERT INTO {table} VALUES ({values}) ON DUPLICATE KEY UPDATE {set_sql}"

    @staticmethod
    def insert_or_skip(table: str, values: str, key: str) -> str:
        return f"INSERT IGNORE INTO {table} VALUES ({values})"

    def drop_namespace(self, ns: str) -> None:
        with mysql_connect() as conn, conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{ns}`")

    def close(self) -> None:
        self.drop_namespace(self.name)


class Postgres:
    kind = "postgres"
    types = {"datetime": "TIMESTAMP(6)", "json": "JSONB", "blob": "BYTEA",
             "double": "DOUBLE PRECISION"}
    now = "clock_timestamp()"

    def __init__(self) -> None:
        self.database = unique("src")
        self.name = "app"
        with contextlib.closing(pg_connect()) as conn, conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{self.database}"')
        with self.cursor() as cur:
            cur.execute(f'CREATE SCHEMA "{self.name}"')

    @contextlib.contextmanager
    def cursor(self) -> Iterator:
        with contextlib.closing(pg_connect(self.database)) as conn, conn.cursor() as cur:
            cur.execute(f'SET search_path TO "{self.name}"')
            yield cur

    def source_config(self, tables: list[str], wm_ns: str, server_id: int) -> dict:
        return {"kind": "postgres", "host": "127.0.0.1", "port": POSTGRES_PORT, "user": "postgres",
                "password": "", "database": self.database, "watermark_namespace": wm_ns, "heartbeat_seconds": 0.1,
                "slot": unique("slot"), "publication": unique("pub"),
                "tables": [f"{self.name}.{t}" for t in tables]}

    def create_table(self, cur, name: str, columns: str) -> None:
        cur.execute(f"CREATE TABLE {name} ({columns})")
        cur.execute(f"ALTER TABLE {name} REPLICA IDENTITY FULL")  # what check() asks for

    @staticmethod
    def series(n: int) -> str:
        return f"generate_series(1, {int(n)}) AS s(seq)"

    @staticmethod
    def ts_plus_seconds(expr: str) -> str:
        return f"TIMESTAMP '2025-01-01 00:00:00' + {expr} * INTERVAL '1 second'"

    @staticmethod
    def md5_bytes(expr: str) -> str:
        return f"decode(md5(({expr})::text), 'hex')"

    @staticmethod
    def json_object(key: str, value_sql: str) -> str:
        return f"jsonb_build_object('{key}', {value_sql})"

    @staticmethod
    def upsert(table: str, values: str, key: str, set_sql: str) -> str:
        return f"INSERT INTO {table} VALUES ({values}) ON CONFLICT ({key}) DO UPDATE SET {set_sql}"

    @staticmethod
    def insert_or_skip(table: str, values: str, key: str) -> str:
        return f"INSERT INTO {table} VALUES ({values}) ON CONFLICT ({key}) DO NOTHING"

    def drop_namespace(self, ns: str) -> None:
        with self.cursor() as cur:
            cur.execute(f'DROP SCHEMA IF EXISTS "{ns}" CASCADE')

    def close(self) -> None:
        drop_pg_database(self.database)


KINDS = {"mariadb": MariaDB, "postgres": Postgres}
