"""Reading a PostgreSQL target table (methods of PostgresTarget): its rows in key order (tests,
the demo), and its rows with the applied position of one consistent read (verification:
engine/verify_run.py). No Spark and no Airflow here."""
from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any, Callable, Iterator

import pyarrow as pa
from psycopg2 import sql

from ..arrow_values import column_from_text
from ..logical_types import DECIMAL_TYPE, arrow_type, is_text_carried, postgres_type
from ..positions import Position
from ..schema import TableSchema
from ..values import float32, pg_options
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
    rows are the table at that position. The rows of a table whose columns are of the types
    dblog makes (``_as_made``) stream through ADBC (COPY in PostgreSQL's binary format,
    straight into Arrow: a psycopg2 fetch of a 4M-row table spent ~20 s making Python
    objects) in a transaction that imports the snapshot the position was read in; another
    table's (a column retyped by hand: a money or oid column's binary form is not its
    logical type's) through psycopg2, value by value. The select runs when the rows are
    read: a comparison that stops before (a change of shape) runs none."""
    conn = self._connect(self.database)
    try:
        conn.set_session(isolation_level="REPEATABLE READ", readonly=True)
        with conn.cursor() as cur:
            pos = self._applied(cur, source, table)
            name = target_table_name(table)
            if not self._table_exists(cur, name):
                conn.close()
                return pos, iter(())
            if not _as_made(cur, self.qualified_stage(name), table):
                return pos, _Rows(lambda: _value_batches(self, conn, table), conn.close)
            cur.execute("SELECT pg_export_snapshot()")
            snapshot = cur.fetchone()[0]
            query = sql.SQL("SELECT {}, {} FROM {}").format(
                read_list(table, table.column_names, decimals_as_text=True), sql.Identifier(POS_COLUMN),
                self._tid(name)).as_string(conn)
        rows = _adbc_rows(table, self.config.endpoint, self.database, snapshot, query, self.connect_timeout)
        conn.close()   # (the snapshot is imported: the exporting transaction may end)
        return pos, rows
    except BaseException:
        conn.close()
        raise


def _as_made(cur, regclass: str, table: TableSchema) -> bool:
    """Every column read in its own binary form (not as text: bool, integers, floats, bytea,
    decimal) has the type dblog makes for its logical type (logical_types.postgres_type)."""
    cur.execute("SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
                "WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped", (regclass,))
    actual = dict(cur.fetchall())
    return all(actual.get(c.name) == postgres_type(c.type) for c in table.columns
               if c.type not in FROM_TEXT and (not is_text_carried(c.type) or DECIMAL_TYPE.match(c.type)))


class _Rows:
    """verify_rows batches of an open read; ``close`` ends its transaction (which would hold
    a lock on the table): at the end of the rows, or by the caller that stops before."""

    def __init__(self, batches: Callable[[], Iterator[pa.Table]], close: Callable[[], None]):
        self._batches, self._close = batches, close

    def __iter__(self) -> Iterator[pa.Table]:
        try:
            yield from self._batches()
        finally:
            self.close()

    def close(self) -> None:
        close, self._close = self._close, None
        if close is not None:
            close()


def _adbc_rows(table: TableSchema, ep, database: str, snapshot: str, query: str, timeout_s: float) -> _Rows:
    """The rows of ``query`` read by ADBC in a REPEATABLE READ transaction that imports
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
    except BaseException:
        conn.close()
        raise

    def close() -> None:
        try:
            cur.close()
        finally:
            conn.close()
    return _Rows(lambda: _adbc_batches(table, cur, query), close)


def _adbc_batches(table: TableSchema, cur, query: str) -> Iterator[pa.Table]:
    types = [c.type for c in table.columns]
    cur.execute(query)
    buf, held = [], 0
    for batch in cur.fetch_record_batch():
        buf.append(batch)
        held += batch.num_rows
        if held >= ROWS_PER_BATCH:
            yield _batch(table, types, pa.Table.from_batches(buf))
            buf, held = [], 0
    if buf:
        yield _batch(table, types, pa.Table.from_batches(buf))


def _batch(table: TableSchema, types: list[str], data: pa.Table) -> pa.Table:
    cols = [data.column(i).combine_chunks() for i in range(data.num_columns)]
    return make_batch(table, [_column(t, v) for t, v in zip(types, cols)], cols[-1])


def _column(logical: str, arr: pa.Array) -> tuple[pa.Array, list[int]]:
    """One column as read by ADBC (read_list's select: text where Python or Arrow would not
    hold the value exactly, else the column's own type, the one dblog makes) in its logical
    type's Arrow form: dates and timestamps through the vectorized text parser
    (column_from_text, held equal to the per-value parsers by a property test); integers
    narrowed only when every value fits; decimals from PostgreSQL's own text (numeric NaN:
    a value the type cannot hold marks its row, verify_rows.column)."""
    if logical in FROM_TEXT:
        out, errors = column_from_text(logical, "postgres", arr.cast(pa.string()))
        return out, sorted(errors)
    want = arrow_type(logical)
    if arr.type == want:
        return arr, []
    numbers = pa.types.is_integer(arr.type) and pa.types.is_integer(want)
    decimals = pa.types.is_decimal(want) and pa.types.is_string(arr.type)
    if numbers or decimals:
        try:
            return arr.cast(want), []   # (a safe cast: a value out of range, or past the scale, raises)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
    values = arr.to_pylist()
    return column(logical, [_decimal(v) for v in values] if decimals else values)


def _decimal(text: str | None):
    try:
        return None if text is None else Decimal(text)
    except InvalidOperation:
        return text   # (not a number: verify_rows.column marks its row)


def _value_batches(self, conn, table: TableSchema) -> Iterator[pa.Table]:
    """The rows through psycopg2 and from_row's per-value parsers, in the transaction of ``conn``."""
    types = [c.type for c in table.columns]
    with conn.cursor(name="dblog_verify") as cur:   # the same transaction: the same snapshot
        cur.itersize = ROWS_PER_BATCH
        cur.execute(sql.SQL("SELECT {}, {} FROM {}").format(read_list(table, table.column_names),
                                                           sql.Identifier(POS_COLUMN),
                                                           self._tid(target_table_name(table))))
        while rows := cur.fetchmany(ROWS_PER_BATCH):
            cols = list(zip(*rows))
            yield make_batch(table, [_value_column(t, v) for t, v in zip(types, cols)], list(cols[-1]))


def _value_column(logical: str, values: tuple) -> tuple[pa.Array, list[int]]:
    """One column of a psycopg2 read, as from_row reads each value, column at a time."""
    if logical in FROM_TEXT:
        arr, errors = column_from_text(logical, "postgres", pa.array(values, pa.string()))
        return arr, sorted(errors)
    if logical == "float32":   # psycopg2 reads real's shortest text; a wider value marks its row
        kept, bad = [], []
        for i, v in enumerate(values):
            try:
                kept.append(None if v is None else float32(v))
            except (ValueError, TypeError):
                kept.append(None)
                bad.append(i)
        arr, more = column(logical, kept)
        return arr, sorted(bad + more)
    if pa.types.is_binary(arrow_type(logical)):
        return column(logical, [bytes(v) if isinstance(v, memoryview) else v for v in values])
    return column(logical, list(values))
