"""Row-for-row comparison of a source table and its target table (invariant 2).

The source is read the way the dump reads it (the source's select expressions and
value conversion); the target is read as PostgreSQL's text of every value that is
not a plain int, float, bool or bytea, parsed by engine/values.py. Both sides are
normalised per logical type (exact: a numeric keeps its scale, a float its bits) and
compared by key through a digest per row, so a million rows fit in memory. A lake
target's rows are read as Arrow (:func:`arrow_rows`).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Iterator

from .arrow_values import arrow_rows
from .config import SourceConfig, TargetConfig
from .keys import encode_key
from .schema import TableSchema
from .values import comparable, comparable_key, pg_options


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


def _digest(values: tuple) -> bytes:
    return hashlib.blake2b(repr(values).encode(), digest_size=16).digest()


def _source_rows(cfg: SourceConfig, table: TableSchema) -> Iterator[tuple]:
    """The source's rows through its own select expressions and conversion."""
    from .sources import open_source
    with open_source(cfg) as source:
        source.table_schema(table.qualified)
        native = source.native_columns(table.qualified)
        select_list = source.select_list(table)   # the compared columns (all, or those a target carries)
        if cfg.kind == "mysql":
            import pymysql
            import pymysql.cursors
            from .sources.mysql import quote_table
            e = cfg.endpoint
            conn = pymysql.connect(host=e.host, port=e.port, user=e.user, password=e.password,
                                   cursorclass=pymysql.cursors.SSCursor, autocommit=True,
                                   charset="utf8mb4", init_command="SET SESSION time_zone='+00:00'")
            cur = conn.cursor()
            cur.execute(f"SELECT {select_list} FROM {quote_table(table.qualified)}")
        else:
            import psycopg2
            from .sources.postgres import quote_table
            e = cfg.endpoint
            conn = psycopg2.connect(host=e.host, port=e.port, user=e.user, password=e.password or None,
                                    dbname=e.database, options=pg_options())
            cur = conn.cursor(name="dblog_verify_source")
            cur.itersize = 20_000
            cur.execute(f"SELECT {select_list} FROM ONLY {quote_table(table.qualified)}")
        try:
            for row in cur:
                yield tuple(source.to_logical(native[c], v) for c, v in zip(table.column_names, row))
        finally:
            conn.close()


def _target_rows(cfg: TargetConfig, table: TableSchema, relation: str) -> Iterator[tuple]:
    import psycopg2
    from psycopg2 import sql
    from .targets.pg_tables import from_row, json_as_text, read_list
    e = cfg.endpoint
    conn = psycopg2.connect(host=e.host, port=e.port, user=e.user, password=e.password,
                            dbname=e.database, options=pg_options())
    json_as_text(conn)
    names = table.column_names
    try:
        with conn.cursor(name="dblog_verify") as cur:
            cur.itersize = 20_000
            cur.execute(sql.SQL("SELECT {} FROM {}.{}").format(
                read_list(table, names), sql.Identifier(cfg.schema), sql.Identifier(relation)))
            for row in cur:
                yield from_row(table, names, row)
    finally:
        conn.close()


def compare(table: TableSchema, source_rows: Iterator[tuple], target_rows: Iterator[tuple]) -> TableDiff:
    types = [c.type for c in table.columns]
    idx = [table.column_names.index(k) for k in table.key]
    diff = TableDiff(table.qualified)
    seen: dict[str, bytes] = {}

    def norm(row: tuple) -> tuple:
        return tuple(comparable(t, v) for t, v in zip(types, row))

    def key(row: tuple) -> str:
        return encode_key([comparable_key(types[i], row[i]) for i in idx])

    for row in source_rows:
        seen[key(row)] = _digest(norm(row))
        diff.source_rows += 1
    for row in target_rows:
        diff.target_rows += 1
        n = norm(row)
        key_ = key(row)
        want = seen.pop(key_, None)
        if want is None:
            diff.extra.append(key_)
        elif want != _digest(n):
            diff.different.append(key_)
    diff.missing = list(seen)
    return diff


def _lake_rows(cfg: TargetConfig, table: TableSchema) -> Iterator[tuple]:
    from .targets import open_target   # a lake target: its rows as Arrow
    with open_target(cfg) as target:
        data = target.read(table)
    yield from arrow_rows(table, data)


def compare_source_target(src: SourceConfig, tgt: TargetConfig, table: TableSchema, relation: str) -> TableDiff:
    if src.kind not in ("mysql", "postgres"):
        raise NotImplementedError(f"comparing a {src.kind} source is not supported")
    rows = _lake_rows(tgt, table) if tgt.kind in ("delta", "iceberg") else _target_rows(tgt, table, relation)
    return compare(table, _source_rows(src, table), rows)
