"""Reading a PostgreSQL target table (methods of PostgresTarget): its rows in key order (tests,
the demo), and its rows with the applied position of one consistent read (verification:
engine/verify_run.py). No Spark and no Airflow here."""
from __future__ import annotations

from decimal import Decimal
from typing import Any, Iterator

import pyarrow as pa
from psycopg2 import sql

from ..arrow_values import column_from_text
from ..logical_types import arrow_type
from ..positions import Position
from ..schema import TableSchema
from ..values import pg_options
from ..verify_rows import ROWS_PER_BATCH, column, make_batch
from .pg_tables import FROM_TEXT, POS_COLUMN, read_list, target_table_name


def rows(self, table: TableSchema, with_pos: bool = False) -> list[dict[str, Any]]:
    """The target table's rows in key order, as Python values (bytea as bytes)."""
    names = table.column_names + ([POS_COLUMN] if with_pos else [])
    q = sql.SQL("SELECT {} FROM {} ORDER BY {}").format(
        sql.SQL(", ").join(sql.Identifier(c) for c in names),
        self._tid(target_table_name(table)),
        sql.SQL(", ").join(sql.Identifier(k) for k in table.key))
    with self.conn, self.conn.cursor() as cur:
        cur.execute(q)
        return [{n: bytes(v) if isinstance(v, memoryview) else v for n, v in zip(names, r)}
                for r in cur.fetchall()]


def read_at(self, table: TableSchema, source: str) -> tuple[Position | None, Iterator[pa.Table]]:
    """The rows (read exactly: pg_tables.read_list, the source side's values, in
    verify_rows' batches) and the applied position, in one REPEATABLE READ snapshot: the
    rows are the table at that position. The position is read in a transaction that
    exports its snapshot; the rows stream through ADBC (COPY in PostgreSQL's binary
    format, straight into Arrow: a psycopg2 fetch of a 4M-row table spent ~20 s making
    Python objects) in a transaction that imports it."""
    conn = self._connect(self.database)
    try:
        conn.set_session(isolation_level="REPEATABLE READ", readonly=True)
        with conn.cursor() as cur:
            pos = self._applied(cur, source, table)
            present = self._table_exists(cur, target_table_name(table))
            if not present:
                return pos, iter(())
            cur.execute("SELECT pg_export_snapshot()")
            snapshot = cur.fetchone()[0]
            query = sql.SQL("SELECT {}, {} FROM {}").format(
                read_list(table, table.column_names, decimals_as_text=True), sql.Identifier(POS_COLUMN),
                self._tid(target_table_name(table))).as_string(conn)
        reader = _adbc_reader(table, self.config.endpoint, self.database, snapshot, query, self.connect_timeout)
    finally:   # (the snapshot is imported: the exporting transaction may end)
        conn.close()
    return pos, reader


def _adbc_reader(table: TableSchema, ep, database: str, snapshot: str, query: str, timeout_s: float):
    """A record batch reader of ``query`` in a REPEATABLE READ transaction that imports
    ``snapshot``, in a session whose settings print values as the log has them
    (values.PG_TEXT_SETTINGS). The password goes in the connection string, never logged."""
    import adbc_driver_postgresql.dbapi as adbc

    settings = {"host": ep.host, "port": ep.port, "user": ep.user, "password": ep.password, "dbname": database,
                "options": pg_options(), "application_name": "dblog-verify", "client_encoding": "UTF8",
                "connect_timeout": int(timeout_s)}
    # libpq's keyword/value form (a host may be an IPv6 address or a socket directory)
    conninfo = " ".join("{}='{}'".format(k, str(v).replace("\\", "\\\\").replace("'", "\\'"))
                        for k, v in settings.items() if v not in (None, ""))
    conn = adbc.connect(conninfo, autocommit=True)
    try:
        cur = conn.cursor()
        cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        cur.execute(f"SET TRANSACTION SNAPSHOT '{snapshot}'")   # (pg_export_snapshot's own id)
        return _Reader(table, conn, cur, query)
    except BaseException:
        conn.close()
        raise


class _Reader:
    """The table's rows as verify_rows batches (each column its logical type's Arrow form),
    streamed from an ADBC cursor; ``close`` ends its transaction (which would hold a lock on
    the table): at the end of the rows, or by the caller that stops before (verify_run)."""

    def __init__(self, table: TableSchema, conn, cur, query: str):
        self.table, self.conn, self.cur, self.query = table, conn, cur, query

    def __iter__(self) -> Iterator[pa.Table]:
        types = [c.type for c in self.table.columns]
        buf, held = [], 0
        try:   # (the select runs when read: a comparison that stops before, at a change of shape, runs none)
            self.cur.execute(self.query)
            for batch in self.cur.fetch_record_batch():
                buf.append(batch)
                held += batch.num_rows
                if held >= ROWS_PER_BATCH:
                    yield _batch(self.table, types, pa.Table.from_batches(buf))
                    buf, held = [], 0
            if buf:
                yield _batch(self.table, types, pa.Table.from_batches(buf))
        finally:
            self.close()

    def close(self) -> None:
        if self.conn is None:
            return
        conn, self.conn = self.conn, None
        try:
            self.cur.close()
        finally:
            conn.close()


def _batch(table: TableSchema, types: list[str], data: pa.Table) -> pa.Table:
    cols = [data.column(i).combine_chunks() for i in range(data.num_columns)]
    return make_batch(table, [_column(t, v) for t, v in zip(types, cols)], cols[-1])


def _column(logical: str, arr: pa.Array) -> tuple[pa.Array, list[int]]:
    """One column as read by ADBC (read_list's select: text where Python or Arrow would not
    hold the value exactly, else the column's own type) in its logical type's Arrow form:
    dates and timestamps through the vectorized text parser (column_from_text, held equal to
    the per-value parsers by a property test); a type Arrow already holds as the logical type
    does as it is (integers narrowed only when every value fits); anything else through its
    Python values (verify_rows.column: a value the type cannot hold marks its row)."""
    if logical in FROM_TEXT:
        out, errors = column_from_text(logical, "postgres", arr.cast(pa.string()))
        return out, sorted(errors)
    want = arrow_type(logical)
    if arr.type == want:
        return arr, []
    numbers = pa.types.is_integer(arr.type) and pa.types.is_integer(want)
    decimals = pa.types.is_decimal(want) and pa.types.is_string(arr.type)   # (PostgreSQL's own text)
    if numbers or decimals:
        try:
            return arr.cast(want), []   # (a safe cast: a value out of range, or past the scale, raises)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
    values = arr.to_pylist()
    return column(logical, [Decimal(v) if v is not None else None for v in values] if decimals else values)
