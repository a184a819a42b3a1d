"""Row-for-row comparison of a source table and its target table (invariant 2).

The source is read the way the dump reads it (the source's select expressions and
value conversion); the target is read as PostgreSQL's text of every value that is
not a plain int, float, bool or bytea, parsed by engine/values.py. Both sides are
normalised per logical type (exact: a numeric keeps its scale, a float its bits) and
compared by key through a digest per row, so a million rows fit in memory.
"""
from __future__ import annotations

import decimal
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, Iterator

from .config import SourceConfig, TargetConfig
from .events import encode_key
from .schema import TableSchema, is_text_carried
from .values import float32, parse_pg_date, parse_pg_timestamp, pg_options


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


_HMS = re.compile(r"^(-)?(\d+):(\d\d):(\d\d)(?:\.(\d{1,6}))?$")


def _interval_us(text: str) -> Any:
    """'[-]H:MM:SS[.f]' (MySQL TIME, and PostgreSQL's text of such an interval) in
    microseconds; any other interval text stays text (PostgreSQL on both sides)."""
    m = _HMS.match(text)
    if not m:
        return text
    us = ((int(m.group(2)) * 60 + int(m.group(3))) * 60 + int(m.group(4))) * 1_000_000 \
        + int((m.group(5) or "0").ljust(6, "0"))
    return -us if m.group(1) else us


def normalise(logical: str, v: Any) -> Any:
    """One exact, comparable form of a value of a logical type."""
    if v is None:
        return None
    if isinstance(v, memoryview | bytearray):
        return bytes(v)
    if logical.startswith("decimal("):
        d = decimal.Decimal(v)
        return format(d.normalize(decimal.Context(prec=max(len(d.as_tuple().digits), 1))), "f")
    if logical == "float32":
        return repr(float32(float(v)))
    if logical == "float64":
        return repr(float(v))
    if logical == "text:interval":
        return _interval_us(v)
    if logical in ("date", "timestamp", "timestamptz"):
        return v.isoformat()
    return v


def _digest(values: tuple) -> bytes:
    return hashlib.blake2b(repr(values).encode(), digest_size=16).digest()


def _source_rows(cfg: SourceConfig, table: TableSchema) -> Iterator[tuple]:
    """The source's rows through its own select expressions and conversion."""
    from .sources import open_source
    with open_source(cfg) as source:
        schema = source.table_schema(table.qualified)
        native = source.native_columns(table.qualified)
        select_list = source.select_list(schema)
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
            cur.execute(f"SELECT {select_list} FROM {quote_table(table.qualified)}")
        try:
            for row in cur:
                yield tuple(source.to_logical(native[c], v) for c, v in zip(table.column_names, row))
        finally:
            conn.close()


def _target_rows(cfg: TargetConfig, table: TableSchema, relation: str) -> Iterator[tuple]:
    import psycopg2
    from psycopg2 import sql
    from .targets.postgres import json_as_text
    e = cfg.endpoint
    conn = psycopg2.connect(host=e.host, port=e.port, user=e.user, password=e.password,
                            dbname=e.database, options=pg_options())
    json_as_text(conn)
    parse = {"date": parse_pg_date, "timestamp": parse_pg_timestamp,
             "timestamptz": lambda t: parse_pg_timestamp(t, True)}
    as_text = [c.type in parse or is_text_carried(c.type) for c in table.columns]
    try:
        with conn.cursor(name="dblog_verify") as cur:
            cur.itersize = 20_000
            cur.execute(sql.SQL("SELECT {} FROM {}.{}").format(
                sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(c.name)) if t
                                   else sql.Identifier(c.name) for c, t in zip(table.columns, as_text)),
                sql.Identifier(cfg.schema), sql.Identifier(relation)))
            for row in cur:
                yield tuple(parse[c.type](v) if v is not None and c.type in parse else v
                            for c, v in zip(table.columns, row))
    finally:
        conn.close()


def compare(table: TableSchema, source_rows: Iterator[tuple], target_rows: Iterator[tuple]) -> TableDiff:
    types = [c.type for c in table.columns]
    idx = [table.column_names.index(k) for k in table.key]
    diff = TableDiff(table.qualified)
    seen: dict[str, bytes] = {}

    def norm(row: tuple) -> tuple:
        return tuple(normalise(t, v) for t, v in zip(types, row))

    for row in source_rows:
        n = norm(row)
        seen[encode_key([n[i] for i in idx])] = _digest(n)
        diff.source_rows += 1
    for row in target_rows:
        diff.target_rows += 1
        n = norm(row)
        key = encode_key([n[i] for i in idx])
        want = seen.pop(key, None)
        if want is None:
            diff.extra.append(key)
        elif want != _digest(n):
            diff.different.append(key)
    diff.missing = list(seen)
    return diff


def compare_source_target(src: SourceConfig, tgt: TargetConfig, table: TableSchema, relation: str) -> TableDiff:
    if src.kind not in ("mysql", "postgres"):
        raise NotImplementedError(f"comparing a {src.kind} source is not supported")
    return compare(table, _source_rows(src, table), _target_rows(tgt, table, relation))
