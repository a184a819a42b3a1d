"""Reading a PostgreSQL target table (methods of PostgresTarget): its rows in key order (tests,
the demo), and its rows with the applied position of one consistent read (verification:
engine/verify_run.py). No Spark and no Airflow here."""
from __future__ import annotations

from typing import Any, Iterator

import pyarrow as pa
from psycopg2 import sql

from ..arrow_values import column_from_text
from ..logical_types import arrow_type
from ..positions import Position
from ..schema import TableSchema
from ..values import float32
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
    """The rows (read exactly: pg_tables.read_list / from_row, the source side's values, in
    verify_rows' batches) and the applied position, in one REPEATABLE READ transaction of
    its own connection: the rows are the table at that position. The rows stream (a
    server-side cursor)."""
    conn = self._connect(self.database)
    try:
        conn.set_session(isolation_level="REPEATABLE READ", readonly=True)
        with conn.cursor() as cur:
            pos = self._applied(cur, source, table)
            present = self._table_exists(cur, target_table_name(table))
    except BaseException:
        conn.close()
        raise
    if not present:
        conn.close()
        return pos, iter(())
    return pos, _stream(self, conn, table)


def _stream(self, conn, table: TableSchema) -> Iterator[pa.Table]:
    names, types = table.column_names, [c.type for c in table.columns]
    try:
        with conn.cursor(name="dblog_verify") as cur:   # the same transaction: the same snapshot
            cur.itersize = ROWS_PER_BATCH
            cur.execute(sql.SQL("SELECT {}, {} FROM {}").format(read_list(table, names), sql.Identifier(POS_COLUMN),
                                                               self._tid(target_table_name(table))))
            while rows := cur.fetchmany(ROWS_PER_BATCH):
                cols = list(zip(*rows))
                yield make_batch(table, [_column(t, v) for t, v in zip(types, cols)], list(cols[-1]))
    finally:
        conn.close()


def _column(logical: str, values: tuple) -> tuple[pa.Array, list[int]]:
    """One column of a batch read with ``read_list``, as from_row reads each value, column at a
    time: dates and timestamps read as text through the vectorized parser (column_from_text,
    held equal to from_row's per-value parsers by a property test)."""
    if logical in FROM_TEXT:
        arr, errors = column_from_text(logical, "postgres", pa.array(values, pa.string()))
        return arr, sorted(errors)
    if logical == "float32":   # psycopg2 reads real's shortest text
        return column(logical, [None if v is None else float32(v) for v in values])
    if pa.types.is_binary(arrow_type(logical)):
        return column(logical, [bytes(v) if isinstance(v, memoryview) else v for v in values])
    return column(logical, list(values))
