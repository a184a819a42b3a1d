"""Airflow's SQLite metadata database as the devenv and the tests run it: several Airflow
processes (scheduler, dag-processor, triggerer, api-server, task processes) write it at once.

SQLite takes one writer at a time and Python's sqlite3 gives up after waiting 5 s for the lock;
on a loaded two-core machine a component holds it longer, and the api-server answered a PATCH of
a DAG with 500 "Database error" (CI of stop 39). So: write-ahead logging (readers never wait for
the writer; a persistent mode of the file, set once after ``airflow db migrate``) and a 60 s wait
for the write lock.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path

# Airflow imports this by name (``sql_alchemy_connect_args``) and passes it to sqlite3.connect
CONNECT_ARGS = {"timeout": 60.0}


def url(db: Path) -> str:
    return f"sqlite:///{db}"


def settings() -> dict[str, str]:
    """The Airflow settings (environment variables) that make every process wait for the lock."""
    name = f"{__name__}.CONNECT_ARGS"
    return {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS": name,
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS_ASYNC": name}


def use_wal(db: Path) -> None:
    """Switch the migrated database file to write-ahead logging (kept by the file)."""
    with sqlite3.connect(db, timeout=CONNECT_ARGS["timeout"]) as con:
        mode = con.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    if mode.lower() != "wal":
        raise RuntimeError(f"{db}: SQLite kept journal mode {mode!r}, not WAL")
