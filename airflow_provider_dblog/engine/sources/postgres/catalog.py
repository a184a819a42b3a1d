"""Catalog reads: a PostgreSQL table's shape (pg_class, pg_attribute, pg_index) as the
engine's TableSchema, the NativeColumn of each column and the table's replica identity.

Nothing here imports Airflow.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from ...errors import SourceSetupError, UnknownTableError
from ...schema import Column, TableSchema
from .column_types import NativeColumn, logical_type

Query = Callable[[Any, Sequence[Any]], list[tuple]]


def load_table(query: Query, table: str, source_name: str) -> tuple:
    """(schema, native columns by name, pg_class.relreplident, whether the primary key is
    DEFERRABLE, the columns that give a row a value of their own: a DEFAULT (its SQL
    text) or GENERATED, the columns' attnums, the table's oid) of ``schema.table``, read
    through ``query(sql, args)``. UnknownTableError if it is not an ordinary table,
    NoPrimaryKeyError without a primary key, SourceSetupError for an unsupported type."""
    nsp, _, name = table.partition(".")
    rel = query(
        "SELECT c.oid, c.relkind, c.relreplident FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s",
        (nsp, name))
    if not rel:
        raise UnknownTableError(f"table {table} does not exist in source {source_name!r}")
    oid, kind, replident = rel[0]
    if kind != "r":
        what = {"v": "view", "m": "materialized view", "p": "partitioned table",
                "f": "foreign table", "S": "sequence", "i": "index"}.get(kind, f"relkind {kind}")
        raise UnknownTableError(f"{table} is a {what}, not an ordinary table: only ordinary "
                                "tables are captured (capture a partitioned table's partitions)")
    # a domain is its base type with the domain's own typmod; "builtin": the type (an
    # array's element type) is PostgreSQL's own, so a target has it too
    cols = query(
        "SELECT a.attname, bt.typname, "
        "format_type(bt.oid, CASE WHEN t.typtype = 'd' THEN t.typtypmod ELSE a.atttypmod END), "
        "a.attnotnull, bt.typcategory, bt.oid, a.atttypid, "
        "bt.typnamespace = 'pg_catalog'::regnamespace AND (bt.typelem = 0 OR "
        "(et.typnamespace = 'pg_catalog'::regnamespace AND et.typtype = 'b')), "
        "a.attgenerated, pg_get_expr(d.adbin, d.adrelid), a.atttypmod, a.attnum "
        "FROM pg_attribute a "
        "LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
        "JOIN pg_type t ON t.oid = a.atttypid "
        "JOIN pg_type bt ON bt.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END "
        "LEFT JOIN pg_type et ON et.oid = bt.typelem "
        "WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        (oid,))
    key = [r[0] for r in query(
        "SELECT a.attname FROM pg_index i "
        "CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord) "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
        "WHERE i.indrelid = %s AND i.indisprimary ORDER BY k.ord", (oid,))]
    deferrable = any(r[0] for r in query(
        "SELECT condeferrable FROM pg_constraint WHERE conrelid = %s AND contype = 'p'", (oid,)))
    columns, native, defaults = [], {}, {}
    # a column's identity: a renamed column keeps its attnum (engine/schema_evolution.py)
    attnums = {r[0]: int(r[-1]) for r in cols}
    for (cname, tname, formatted, notnull, category, base_oid, att_oid, builtin, generated, default, typmod,
         attnum) in cols:
        if generated:
            defaults[cname] = f"GENERATED ALWAYS AS ({default})"
        elif default is not None and default.upper() != "NULL":
            defaults[cname] = default
        try:
            logical = logical_type(tname, category, formatted, bool(builtin))
        except ValueError as e:
            raise SourceSetupError(f"{table}.{cname}: {e} ({formatted})") from None
        native[cname] = NativeColumn(cname, tname, formatted, logical, category,
                                     int(base_oid), int(att_oid), int(typmod), int(attnum))
        columns.append(Column(cname, logical, not notnull))
    schema = TableSchema(nsp, name, tuple(columns), tuple(key))  # NoPrimaryKeyError if no key
    return schema, native, replident, deferrable, defaults, attnums, int(oid)


def catalog_identity(query: Query, table: str) -> tuple[int | None, dict[str, int]]:
    """(the oid the name ``schema.table`` has now, or None; its columns' attnums by name):
    what tells a table or a column re-created under the same name from the one captured."""
    nsp, _, name = table.partition(".")
    rows = query(
        "SELECT c.oid, a.attname, a.attnum FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped "
        "WHERE n.nspname = %s AND c.relname = %s AND c.relkind = 'r'", (nsp, name))
    if not rows:
        return None, {}
    return int(rows[0][0]), {r[1]: int(r[2]) for r in rows if r[1] is not None}
