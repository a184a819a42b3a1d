"""Connections and names shared by the tests (importable as ``helpers``)."""
from __future__ import annotations

import os
import time
import uuid

import psycopg2
import pymysql

MARIADB_PORT = int(os.environ.get("DBLOG_TEST_MARIADB_PORT", 13306))
POSTGRES_PORT = int(os.environ.get("DBLOG_TEST_POSTGRES_PORT", 15432))
REDIS_PORT = int(os.environ.get("DBLOG_TEST_REDIS_PORT", 16379))


def mysql_connect(database: str | None = None, **kw):
    return pymysql.connect(host="127.0.0.1", port=MARIADB_PORT, user="root", password="",
                           database=database, autocommit=True, **kw)


def pg_connect(database: str = "postgres"):
    conn = psycopg2.connect(host="127.0.0.1", port=POSTGRES_PORT, user="postgres", dbname=database)
    conn.autocommit = True
    return conn


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def drop_pg_database(name: str) -> None:
    """Drop a PostgreSQL database and the replication slots that would keep it alive."""
    conn = pg_connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                        "WHERE database = %s AND active_pid IS NOT NULL", (name,))
            for _ in range(50):
                cur.execute("SELECT slot_name, active_pid FROM pg_replication_slots WHERE database = %s",
                            (name,))
                slots = cur.fetchall()
                if not any(pid for _, pid in slots):
                    break
                time.sleep(0.1)
            for slot, _ in slots:
                cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        conn.close()
