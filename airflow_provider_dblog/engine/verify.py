"""Row-for-row comparison of a source table and its target table (invariant 2).

Rows are normalised to one form (bytes for binary, Decimal, naive datetimes) and
compared by key through a digest per row, so a million rows fit in memory.
"""
from __future__ import annotations

import datetime as dt
import decimal
import hashlib
from dataclasses import dataclass, field
from typing import Any, Iterator

from .config import SourceConfig, TargetConfig
from .events import encode_key
from .schema import TableSchema


@dataclass
class TableDiff:
    table: str
    source_rows: int = 0
    target_rows: int = 0
    missing: list = field(default_factory=list)  # in source, not in target
    extra: list = field(default_factory=list)    # in target, not in source
    different: list = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return not (self.missing or self.extra or self.different)

    def describe(self, limit: int = 5) -> str:
        if self.equal:
            return f"{self.table}: equal ({self.source_rows} rows)"
        return (f"{self.table}: source {self.source_rows} rows, target {self.target_rows}; "
                f"missing {len(self.missing)} {self.missing[:limit]}, extra {len(self.extra)} "
                f"{self.extra[:limit]}, different {len(self.different)} {self.different[:limit]}")


def _norm(v: Any) -> Any:
    if isinstance(v, memoryview):
        return bytes(v)
    if isinstance(v, bytearray):
        return bytes(v)
    if isinstance(v, decimal.Decimal):
        return v.normalize()
    if isinstance(v, dt.datetime) and v.tzinfo is not None:
        return v.astimezone(dt.timezone.utc).replace(tzinfo=None)
    if isinstance(v, float):
        return repr(v)
    return v


def _digest(values: tuple) -> bytes:
    return hashlib.blake2b(repr(tuple(_norm(v) for v in values)).encode(), digest_size=16).digest()


def _mysql_rows(cfg: SourceConfig, table: TableSchema) -> Iterator[tuple]:
    import pymysql
    import pymysql.cursors
    e = cfg.endpoint
    conn = pymysql.connect(host=e.host, port=e.port, user=e.user, password=e.password,
                           cursorclass=pymysql.cursors.SSCursor, autocommit=True)
    cols = ", ".join(f"`{c}`" for c in table.column_names)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT {cols} FROM `{table.database}`.`{table.name}`")
            yield from cur
    finally:
        conn.close()


def _postgres_source_rows(cfg: SourceConfig, table: TableSchema) -> Iterator[tuple]:
    """The source's rows as its select_keys reads them (the same select expressions)."""
    import psycopg2
    from .sources.postgres import PostgresSource, quote_table
    with PostgresSource(cfg) as source:
        select_list = source.select_list(source.table_schema(table.qualified))
    e = cfg.endpoint
    conn = psycopg2.connect(host=e.host, port=e.port, user=e.user, password=e.password or None,
                            dbname=e.database, options="-c TimeZone=UTC")
    try:
        with conn.cursor(name="dblog_verify_source") as cur:
            cur.itersize = 20_000
            cur.execute(f"SELECT {select_list} FROM {quote_table(table.qualified)}")
            yield from cur
    finally:
        conn.close()


def _postgres_rows(cfg: TargetConfig, table: TableSchema, relation: str) -> Iterator[tuple]:
    import psycopg2
    from psycopg2 import sql
    e = cfg.endpoint
    conn = psycopg2.connect(host=e.host, port=e.port, user=e.user, password=e.password, dbname=e.database)
    try:
        with conn.cursor(name="dblog_verify") as cur:
            cur.itersize = 20_000
            cur.execute(sql.SQL("SELECT {} FROM {}.{}").format(
                sql.SQL(", ").join(sql.Identifier(c) for c in table.column_names),
                sql.Identifier(cfg.schema), sql.Identifier(relation)))
            yield from cur
    finally:
        conn.close()


def compare(table: TableSchema, source_rows: Iterator[tuple], target_rows: Iterator[tuple]) -> TableDiff:
    idx = [table.column_names.index(k) for k in table.key]
    diff = TableDiff(table.qualified)
    seen: dict[str, bytes] = {}
    for row in source_rows:
        seen[encode_key([_norm(row[i]) for i in idx])] = _digest(row)
        diff.source_rows += 1
    for row in target_rows:
        diff.target_rows += 1
        key = encode_key([_norm(row[i]) for i in idx])
        want = seen.pop(key, None)
        if want is None:
            diff.extra.append(key)
        elif want != _digest(row):
            diff.different.append(key)
    diff.missing = list(seen)
    return diff


def compare_source_target(src: SourceConfig, tgt: TargetConfig, table: TableSchema, relation: str) -> TableDiff:
    readers = {"mysql": _mysql_rows, "postgres": _postgres_source_rows}
    if src.kind not in readers:
        raise NotImplementedError(f"comparing a {src.kind} source is not supported")
    return compare(table, readers[src.kind](src, table), _postgres_rows(tgt, table, relation))
