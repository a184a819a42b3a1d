"""Catalog reads: a PostgreSQL table's shape (pg_class, pg_attribute, pg_index) as the
engine's TableSchema, the NativeColumn of each column and the table's replica identity.

Nothing here imports Airflow.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from ...errors import SourceSetupError, UnknownTableError
from ...schema import Column, TableSchema
from .column_types import NativeColumn, logical_type
from .sql import quote_table

Query = Callable[[Any, Sequence[Any]], list[tuple]]


def load_table(query: Query, table: str, source_name: str) -> tuple:
    """(schema, native columns by name, pg_class.relreplident, whether the primary key is
    DEFERRABLE, the columns' DEFAULTs (their SQL text), the columns' attnums, the table's
    oid; stored generated columns left out) of ``schema.table``, read
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
    # a domain is its base type with the domain's own typmod and default (a column added of
    # it fills existing rows); "builtin": the type (an array's element type) is
    # PostgreSQL's own, so a target has it too
    cols = query(
        "SELECT a.attname, bt.typname, "
        "format_type(bt.oid, CASE WHEN t.typtype = 'd' THEN t.typtypmod ELSE a.atttypmod END), "
        "a.attnotnull, bt.typcategory, bt.oid, a.atttypid, "
        "bt.typnamespace = 'pg_catalog'::regnamespace AND (bt.typelem = 0 OR "
        "(et.typnamespace = 'pg_catalog'::regnamespace AND et.typtype = 'b')), "
        "a.attgenerated, coalesce(pg_get_expr(d.adbin, d.adrelid), "
        "CASE WHEN t.typtype = 'd' THEN t.typdefault END), a.atttypmod, a.attnum "
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
    # a stored generated column is in no pgoutput v1 message: not carried at all (neither by
    # the log nor by a dump), so the target never holds a value the log cannot keep current
    generated = [r[0] for r in cols if r[8]]
    if set(generated) & set(key):
        raise SourceSetupError(f"{table}: the primary key holds the generated column(s) {generated}, which "
                               "the log (pgoutput) does not carry: the table cannot be captured")
    cols = [r for r in cols if not r[8]]
    columns, native, defaults = [], {}, {}
    # a column's identity: a renamed column keeps its attnum (engine/schema_evolution.py)
    attnums = {r[0]: int(r[-1]) for r in cols}
    for (cname, tname, formatted, notnull, category, base_oid, att_oid, builtin, _, default, typmod,
         attnum) in cols:
        if default is not None and default.upper() != "NULL":
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


def retyped_as_logged(query: Query, schema: TableSchema, native: dict[str, NativeColumn],
                      logged: Sequence) -> tuple[TableSchema, dict[str, NativeColumn]] | None:
    """The catalog's shape (``schema``, ``native``) with the type modifiers of a Relation
    message's columns (``logged``), when they are all it differs in: the tail met the
    message after a later ALTER ... TYPE within the same type (varchar(20) -> varchar(40),
    numeric(10,2) -> numeric(12,3)), and the message's modifiers are what its rows were
    written with. None when a name or a type oid differs (the catalog is past it)."""
    if [c.name for c in logged] != list(schema.column_names):
        return None
    out, columns = dict(native), list(schema.columns)
    for i, c in enumerate(logged):
        n = native[c.name]
        if c.type_oid != n.att_type_oid:
            return None
        if n.typmod is None or c.atttypmod == n.typmod:
            continue
        if n.att_type_oid != n.type_oid:   # a domain's modifier is the domain's, not the column's
            return None
        formatted = query("SELECT format_type(%s, %s)", (n.type_oid, c.atttypmod))[0][0]
        try:
            logical = logical_type(n.type_name, n.category, formatted,
                                   builtin=not (n.category == "A" and n.logical == "string"))
        except ValueError:
            return None
        out[c.name] = dataclasses.replace(n, formatted=formatted, logical=logical, typmod=c.atttypmod)
        columns[i] = dataclasses.replace(columns[i], type=logical)
    return dataclasses.replace(schema, columns=tuple(columns)), out


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


def catalog_oids(query: Query, tables) -> dict[str, int]:
    """{schema.table: the oid the name has now} of those of ``tables`` that exist: one
    query for all (the tail asks every few seconds)."""
    rows = query("SELECT n.nspname || '.' || c.relname, c.oid FROM pg_class c JOIN pg_namespace n "
                 "ON n.oid = c.relnamespace WHERE c.relkind = 'r' AND (n.nspname || '.' || c.relname) = ANY(%s)",
                 (list(tables),))
    return {r[0]: int(r[1]) for r in rows}


def key_deferrable_now(query: Query, table: str) -> tuple[bool, str]:
    """(whether the table's primary key is DEFERRABLE in the catalog now, the WAL's end read
    after it in the same statement: every change the catalog shows committed before it)."""
    rows = query("SELECT coalesce(bool_or(k.condeferrable), false), pg_current_wal_lsn()::text "
                 "FROM (SELECT 1) AS one LEFT JOIN pg_constraint k ON k.conrelid = to_regclass(%s) "
                 "AND k.contype = 'p'", (quote_table(table),))
    return bool(rows[0][0]), str(rows[0][1])


def partition_roots(query: Query, tables) -> dict[str, list[str]]:
    """{an ancestor of captured partitions: those partitions}: a publication with
    publish_via_partition_root sends their changes as that ancestor's."""
    out: dict[str, list[str]] = {}
    for table in tables:
        rows = query("SELECT n.nspname || '.' || c.relname FROM pg_partition_ancestors(to_regclass(%s)) AS a "
                     "JOIN pg_class c ON c.oid = a.relid JOIN pg_namespace n ON n.oid = c.relnamespace "
                     "WHERE a.relid <> to_regclass(%s)", (quote_table(table), quote_table(table)))
        for (root,) in rows:
            out.setdefault(root, []).append(table)
    return out


# the captured tables' shapes (and their oids), as one JSON text: what a watermark carries
# into the log (watermarks.py), compared by the tail with the shapes it reads (log_marks.py)
SHAPES_SQL = (
    "SELECT coalesce(json_object_agg(n.nspname || '.' || c.relname, json_build_object("
    "'oid', c.oid::bigint, 'cols', (SELECT json_agg(json_build_array(a.attname, a.atttypid::bigint, a.atttypmod, a.attnum, "
    "a.attnotnull) ORDER BY a.attnum) FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 "
    "AND NOT a.attisdropped AND a.attgenerated = ''), "
    "'key', (SELECT json_agg(a.attname ORDER BY k.ord) FROM pg_index i "
    "CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord) "
    "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
    "WHERE i.indrelid = c.oid AND i.indisprimary))), '{}')::text "
    "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE c.relkind = 'r' AND (n.nspname || '.' || c.relname) = ANY(%s)")
