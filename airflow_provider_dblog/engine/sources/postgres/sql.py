"""Quoting and SQL composition for PostgreSQL.

Statements executed here run with their values bound (``%s``) and their table
quoted by ``psycopg2.sql.Identifier`` (``stmt``). SQL that leaves the engine
without a connection (Spark's ``predicates=`` and ``table``, the quoter of user
WHERE conditions) is quoted by ``quote_ident``, which writes what ``Identifier``
writes, and renders literals by type (``pg_literal``).
"""
from __future__ import annotations

import datetime as dt
import decimal
import math
from typing import Any, Callable, Sequence

from psycopg2 import sql

from ...values import FarDate, FarTimestamp, pg_date_text, pg_timestamp_text
from ..sql_source import quote_with


def quote_ident(name: str) -> str:
    """A PostgreSQL identifier in double quotes (embedded quotes doubled): the text
    ``psycopg2.sql.Identifier(name)`` renders, for SQL that is built without a connection."""
    return quote_with('"', name)


def quote_table(qualified: str) -> str:
    schema, _, table = qualified.partition(".")
    return f"{quote_ident(schema)}.{quote_ident(table)}"


def table_ident(qualified: str) -> sql.Composable:
    schema, _, table = qualified.partition(".")
    return sql.Identifier(schema, table)


def table_stmt(before: str, table: str, after: str = "") -> sql.Composed:
    """``before <table> after``: the table quoted by sql.Identifier; the texts may hold
    quoted column names (never passed through str.format-like templating)."""
    return sql.Composed([sql.SQL(before), table_ident(table), sql.SQL(after)])


def _quote_string(text: str) -> str:
    if "\x00" in text:
        raise ValueError("PostgreSQL text cannot contain NUL characters")
    return "'" + text.replace("'", "''") + "'"


def pg_literal(value: Any, native_type: str = "") -> str:
    """A key value (read from the database itself) as a PostgreSQL literal.

    Only for values that came from the source (chunk bounds), never for user input.
    Assumes standard_conforming_strings=on (jdbc() sets it). ``native_type`` is the
    column's base type name (pg_type.typname): it picks timestamptz/float4 literals.
    Strings are untyped literals, which PostgreSQL reads as the column's own type
    (uuid, time, numeric, enum, ... keys are strings in the engine)."""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, decimal.Decimal):
        if value.is_nan():
            return "'NaN'::numeric"
        if not value.is_finite():
            raise ValueError(f"cannot render an infinite decimal {value!r}")
        return format(value, "f")
    if isinstance(value, float):
        cast = "float4" if native_type == "float4" else "float8"
        if math.isnan(value):
            return f"'NaN'::{cast}"
        if math.isinf(value):
            return f"'{'-' if value < 0 else ''}Infinity'::{cast}"
        return f"'{value!r}'::{cast}"
    if isinstance(value, str):
        return _quote_string(value)
    if isinstance(value, (dt.datetime, FarTimestamp)):
        if isinstance(value, dt.datetime) and value.tzinfo is not None:
            raise ValueError(f"cannot render timezone-aware datetime {value!r}")
        if native_type == "timestamptz":  # the engine's value is the UTC wall clock
            return f"'{pg_timestamp_text(value, True)}'::timestamptz"
        return f"'{pg_timestamp_text(value, False)}'::timestamp"
    if isinstance(value, (dt.date, FarDate)):
        return f"'{pg_date_text(value)}'::date"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "'\\x" + bytes(value).hex() + "'::bytea"
    raise TypeError(f"cannot render a {type(value).__name__} key value as SQL: {value!r}")


def bound_ident(name: str) -> str:
    """quote_ident for statements executed with parameters (a % in a name doubled)."""
    return quote_ident(name).replace("%", "%%")


def row_expr(cols: Sequence[str], quote: Callable[[str], str] = quote_ident) -> str:
    q = [quote(c) for c in cols]
    return q[0] if len(q) == 1 else "(" + ", ".join(q) + ")"


def _key_compare(op: str, cols: Sequence[str], vals: Sequence[Any], lit: Callable[[Any, str], str],
                 types: Sequence[str], quote: Callable[[str], str]) -> str:
    rhs = [lit(v, t) for v, t in zip(vals, types)]
    return f"{row_expr(cols, quote)} {op} {rhs[0] if len(rhs) == 1 else '(' + ', '.join(rhs) + ')'}"


def key_after(cols: Sequence[str], vals: Sequence[Any], lit: Callable[[Any, str], str],
              types: Sequence[str], quote: Callable[[str], str] = quote_ident) -> str:
    """``(a, b) > (x, y)``: PostgreSQL's row comparison, an index range scan on (a, b).
    ``lit`` renders each value (pg_literal, or a BoundParams that binds it)."""
    return _key_compare(">", cols, vals, lit, types, quote)


def key_upto(cols: Sequence[str], vals: Sequence[Any], lit: Callable[[Any, str], str],
             types: Sequence[str], quote: Callable[[str], str] = quote_ident) -> str:
    """``(a, b) <= (x, y)``, as key_after."""
    return _key_compare("<=", cols, vals, lit, types, quote)


class BoundParams:
    """A literal renderer that binds: each value becomes %s and joins ``args``
    (a timestamptz key value, naive UTC in the engine, is bound as aware UTC)."""

    def __init__(self) -> None:
        self.args: list[Any] = []

    def __call__(self, value: Any, native_type: str = "") -> str:
        if isinstance(value, (dt.datetime, FarTimestamp)):   # the text PostgreSQL reads exactly
            value = pg_timestamp_text(value, native_type == "timestamptz")
        elif isinstance(value, FarDate):
            value = pg_date_text(value)
        self.args.append(value)
        return "%s"
