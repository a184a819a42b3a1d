"""Reading a PostgreSQL target table (methods of PostgresTarget): its rows in key order (tests,
the demo), and its rows with the applied position of one consistent read (verification:
engine/verify_run.py). No Spark and no Airflow here."""
from __future__ import annotations

from typing import Any, Iterator

from psycopg2 import sql

from ..positions import Position
from ..schema import TableSchema
from .pg_tables import POS_COLUMN, from_row, read_list, target_table_name


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


def read_at(self, table: TableSchema, source: str) -> tuple[Position | None, Iterator[tuple]]:
    """The rows (read exactly: pg_tables.read_list / from_row, the source side's values, then
    each row's ``_dblog_pos``) and the applied position, in one REPEATABLE READ transaction
    of its own connection: the rows are the table at that position. The rows stream (a
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


def _stream(self, conn, table: TableSchema) -> Iterator[tuple]:
    names = table.column_names
    try:
        with conn.cursor(name="dblog_verify") as cur:   # the same transaction: the same snapshot
            cur.itersize = 20_000
            cur.execute(sql.SQL("SELECT {}, {} FROM {}").format(read_list(table, names), sql.Identifier(POS_COLUMN),
                                                               self._tid(target_table_name(table))))
            for row in cur:
                yield from_row(table, names, row[:-1]) + (row[-1],)
    finally:
        conn.close()
