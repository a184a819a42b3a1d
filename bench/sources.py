"""What the harness needs from a source database, behind one small interface.

Everything source-specific (DDL, seeding, the application's writes, the position
of the log's end, the bare decode-only log reader, the C decoder shipped with the
database) lives in a BenchSource; the phases only talk to this interface:
MySQLBench (mysql.py), PostgresBench (postgres.py).
"""
from __future__ import annotations

import subprocess
from typing import Any, Protocol

# Every bench table has this shape: a key, the writer's sequence number (so an
# event in the changelog can be matched to the write that made it) and a few
# typed columns so decoding does realistic work.
COLUMNS = ("id", "wseq", "v", "amount", "note", "at")


class BenchSource(Protocol):
    kind: str
    run_id: str

    def setup(self) -> None: ...                         # the bench database / schema
    def teardown(self) -> None: ...                      # drop everything setup() and envs made
    def qualified(self, table: str) -> str: ...          # "db.table" as the engine config names it
    def source_config(self, tables: list[str], server_id: int, wm_namespace: str) -> dict: ...
    def create_table(self, table: str) -> None: ...
    def seed(self, table: str, rows: int) -> None: ...   # ids 1..rows, outside the change log
    def connect(self) -> Any: ...                        # autocommit DB-API connection for writers
    def insert_sql(self, table: str) -> str: ...         # params: id, wseq
    def update_sql(self, table: str) -> str: ...         # params: wseq, id
    def write_events(self, table: str, n: int, txn_rows: int) -> tuple[Any, dict]: ...  # start Position, resume
    def bare_read(self, resume: dict, n_events: int, tables: list[str], wm_namespace: str) -> dict: ...
    def log_end(self) -> dict: ...                       # the log's head, as a resume dict
    # the C decoder shipped with the database over resume .. end (issue 30)
    def physical_read(self, resume: dict, end: dict, n_events: int, tables: list[str],
                      wm_namespace: str) -> dict: ...
    def drop_namespace(self, name: str) -> None: ...


def open_bench_source(kind: str, run_id: str) -> BenchSource:
    if kind == "mysql":
        from .mysql import MySQLBench
        return MySQLBench(run_id)
    if kind == "postgres":
        from .postgres import PostgresBench
        return PostgresBench(run_id)
    raise SystemExit(f"bench: unknown source kind {kind!r} (mysql, postgres)")


def finish(proc: subprocess.Popen, cmd: list[str], err, timeout: float = 900) -> None:
    """Wait for a decoder process (stderr in the file ``err``); a non-zero exit or a
    warning (e.g. mariadb-binlog's stop position not reached before the end of the file)
    is an error: the range was not read as asked."""
    try:
        rc = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"{cmd[0]} ran over {timeout} s: {' '.join(cmd)}") from None
    finally:
        err.seek(0)
        msg = err.read().decode(errors="replace").strip()
        err.close()
    if rc != 0 or msg:
        raise RuntimeError(f"{' '.join(cmd)} exited {rc}: {msg[-2000:]}")
