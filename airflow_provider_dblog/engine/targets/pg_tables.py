"""How a PostgreSQL target names its tables and columns, and reads its values back.

Source table ``shop.orders`` lands in ``"<schema>"."shop__orders"`` with the extra
column ``_dblog_pos``; a batch is staged in ``_dblog_stage__shop__orders__<run>`` with
``_dblog_op`` as well; ``dblog_apply_state`` holds the checkpoints. The target and both
apply paths take these names from here (a module below both, so neither imports the other).
No Spark and no Airflow here.
"""
from __future__ import annotations

import hashlib

from psycopg2 import sql

from ..logical_types import DECIMAL_TYPE, is_text_carried
from ..schema import TableSchema
from ..values import float32, parse_pg_date, parse_pg_timestamp
from .base import OP_COLUMN, POS_COLUMN  # noqa: F401 - the names every target uses

STATE_TABLE = "dblog_apply_state"
STAGE_PREFIX = "_dblog_stage__"
_MAX_IDENT = 63  # PostgreSQL's NAMEDATALEN - 1, in bytes


# -- names ---------------------------------------------------------------------------------
def _fit(name: str) -> str:
    """PostgreSQL silently truncates long names; shorten them deterministically instead."""
    if len(name.encode()) <= _MAX_IDENT:
        return name
    digest = hashlib.sha1(name.encode()).hexdigest()[:12]
    return name.encode()[:_MAX_IDENT - 13].decode(errors="ignore") + "_" + digest


def source_table_name(table: TableSchema | str) -> str:
    """The source's ``db.table`` (the checkpoint table's ``table_name``)."""
    return table.qualified if isinstance(table, TableSchema) else str(table)


def target_table_name(table: TableSchema | str) -> str:
    """``shop.orders`` -> ``shop__orders`` (the table's name in the target schema)."""
    db, name = source_table_name(table).split(".", 1)
    return _fit(f"{db}__{name}")


def stage_table_name(table: TableSchema | str, run_id: str = "") -> str:
    """The stage table of one apply of ``table``; ``run_id`` makes it private to a run."""
    db, name = source_table_name(table).split(".", 1)
    return _fit(f"{STAGE_PREFIX}{db}__{name}" + (f"__{run_id}" if run_id else ""))


def dblog_tables(cur, schema: str) -> list[str]:
    """The tables of ``schema`` that dblog created: ``dblog_apply_state``, stage tables,
    and tables with a ``_dblog_pos`` column."""
    cur.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relkind IN ('r', 'p') AND ("
        " c.relname = %s OR c.relname LIKE %s OR EXISTS ("
        "  SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = %s"
        "  AND NOT a.attisdropped))",
        (schema, STATE_TABLE, STAGE_PREFIX.replace("_", r"\_") + "%", POS_COLUMN))
    return [r[0] for r in cur.fetchall()]


def qualified_name(schema: str, name: str) -> sql.Composed:
    """``"schema"."name"`` as a SQL identifier."""
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(name))


def qualified_text(schema: str, name: str) -> str:
    """``"schema"."name"`` as text (``to_regclass``'s argument, Spark's ``dbtable``)."""
    return '"{}"."{}"'.format(schema.replace('"', '""'), name.replace('"', '""'))


# -- reading values back exactly -------------------------------------------------------------
FROM_TEXT = {"date": parse_pg_date, "timestamp": parse_pg_timestamp,
              "timestamptz": lambda text: parse_pg_timestamp(text, True)}


def read_list(table: TableSchema, names: list[str], alias: str = "", decimals_as_text: bool = False) -> sql.Composable:
    """A select list of target columns that reads each value exactly: as text where Python's
    types or psycopg2's would not hold it (BC dates, infinity, numeric's scale, intervals),
    parsed back by ``from_row``; ``decimals_as_text``: a decimal(p,s) column too (a reader
    other than psycopg2: PostgreSQL's own text, not the reader's)."""
    pre = sql.SQL(f"{alias}.") if alias else sql.SQL("")

    def read(n: str) -> sql.Composable:
        t = table.column(n).type
        if t == "text:inet":   # its output form, as the log has it (a cast to text keeps '/128')
            return sql.SQL("abbrev({}{})").format(pre, sql.Identifier(n))
        if t in FROM_TEXT or is_text_carried(t) or (decimals_as_text and DECIMAL_TYPE.match(t)):
            return sql.SQL("{}{}::text").format(pre, sql.Identifier(n))
        return sql.SQL("{}{}").format(pre, sql.Identifier(n))
    return sql.SQL(", ").join(read(n) for n in names)


def from_row(table: TableSchema, names: list[str], row: tuple) -> tuple:
    """A row read with ``read_list`` as logical Python values."""
    out = []
    for n, v in zip(names, row):
        t = table.column(n).type
        out.append(None if v is None else FROM_TEXT[t](v) if t in FROM_TEXT
                   else float32(v) if t == "float32"      # psycopg2 reads real's shortest text
                   else bytes(v) if isinstance(v, memoryview) else v)
    return tuple(out)


def json_as_text(conn) -> None:
    """json / jsonb values read as their text, as the event log carries them."""
    import psycopg2.extras
    psycopg2.extras.register_default_json(conn, loads=lambda text: text)
    psycopg2.extras.register_default_jsonb(conn, loads=lambda text: text)
