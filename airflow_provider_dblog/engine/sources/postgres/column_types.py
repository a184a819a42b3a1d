"""PostgreSQL column types -> the engine's logical types (engine/schema.py), and the
one form each value is read in on every path.

* int2/int4/int8 -> int16/int32/int64; float4/float8 -> float32/float64; bool -> bool
* numeric(p,s) / numeric -> numeric(p,s) / numeric: the exact text (NaN and
  ±Infinity included), typed numeric in a target
* text/varchar/bpchar/name/citext, enums -> string (CHAR(n) keeps its padding)
* uuid, inet, cidr, macaddr(8), xml, interval, time, timetz, bit, varbit, jsonb and
  arrays of built-in types -> ``text:<the column's type>``: PostgreSQL's own text of the
  value, which a target column of the same type reads back unchanged
* json -> json (the text as written); bytea -> binary
* date / timestamp / timestamptz -> date / timestamp / timestamptz, BC years and
  ±infinity included (engine/values.py FarDate / FarTimestamp)
* money and other types -> refused by ``dblog check`` (money's text depends on lc_monetary)

Every value that is not a plain int, float, bool, bytea or text is selected as its text
(``select_expr``: ``::text``) and parsed by the same functions on every path: the log
(pgoutput sends text, ``text_converter``), ``select_keys`` and the Spark chunk select.
Every session prints with ``values.PG_TEXT_SETTINGS``, whatever the server's defaults.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from ...logical_types import arrow_type, is_text_carried
from ...values import float32, parse_pg_date, parse_pg_timestamp
from .text_values import BOOL, BYTEA, FLOAT8, INT2, INT4, INT8, converter_for
from .sql import quote_ident

_SIMPLE = {"int2": "int16", "int4": "int32", "int8": "int64", "float4": "float32",
           "float8": "float64", "bool": "bool", "json": "json", "bytea": "binary", "date": "date",
           "timestamp": "timestamp", "timestamptz": "timestamptz"}
_STRINGS = {"text", "varchar", "bpchar", "name", "citext"}
# carried as PostgreSQL's text, typed as the column's own type in a target
_TEXT_TYPED = {"uuid", "inet", "cidr", "macaddr", "macaddr8", "xml", "interval", "time", "timetz",
               "bit", "varbit", "jsonb"}
_PARSED = {"date", "timestamp", "timestamptz"}   # selected as text, parsed by values.py
_INT_BITS = {"int16": 16, "int32": 32, "int64": 64}


@dataclass(frozen=True)
class NativeColumn:
    name: str
    type_name: str       # base type's pg_type.typname ("_int4" for int4[])
    formatted: str       # format_type() of the base type: "numeric(10,2)", "integer[]", ...
    logical: str
    category: str = ""   # pg_type.typcategory of the base type ("A" array, "E" enum)
    type_oid: int = 0    # the base type's oid (how pgoutput's text value is parsed)
    att_type_oid: int = 0  # the column's declared type oid (a domain's own), as pgoutput sends it
    # pg_attribute.atttypmod, as pgoutput's Relation message sends it (None: not recorded):
    # numeric(10,2) -> numeric(12,3) keeps the type OID, only this tells them apart
    typmod: int | None = None
    attnum: int = 0        # the column's identity (0: not recorded): a dropped and re-added one gets a new one


def logical_type(type_name: str, category: str, formatted: str, builtin: bool = True) -> str:
    """The logical type of a PostgreSQL column (base type of a domain); ValueError if
    unsupported. ``formatted``: format_type of the base type with the column's typmod;
    ``builtin``: the type (an array's element type) is one of PostgreSQL's own."""
    t = type_name.lower()
    if category == "A":
        if builtin:
            try:
                arrow_type(f"text:{formatted}")
                return f"text:{formatted}"
            except ValueError:
                pass
        return "string"   # an array of an enum, a domain, a composite: its text
    if category == "E":
        return "string"
    if t in _SIMPLE:
        return _SIMPLE[t]
    if t == "numeric":
        m = re.fullmatch(r"numeric\((\d+),(\d+)\)", formatted)
        return f"numeric({m.group(1)},{m.group(2)})" if m else "numeric"
    if t in _STRINGS:
        return "string"
    if t in _TEXT_TYPED:
        return f"text:{formatted}"
    if t == "money":
        raise ValueError("type money is not supported: its text depends on lc_monetary, so no "
                         "value is exact across servers; use numeric(p,2)")
    raise ValueError(f"column type {type_name!r} is not supported")


def text_parsed(n: NativeColumn) -> bool:
    """Selected as text that engine/values.py parses into the logical type."""
    return n.type_name in _PARSED or n.logical.startswith("numeric")


def select_expr(n: NativeColumn, quote: Callable[[str], str] = quote_ident) -> str:
    """The SELECT expression giving a column's value in the form every path shares (the
    same for psycopg2 and Spark's JDBC reader): its text, unless it is a plain int,
    float, bool, bytea or text value."""
    q = quote(n.name)
    expr = read_expr(n, q)
    return q if expr == q else f"{expr} AS {q}"


def read_expr(n: NativeColumn, value: str) -> str:
    """select_expr's expression of the SQL value ``value`` of the column's type (no alias)."""
    if n.type_name == "inet":   # its cast to text keeps a full netmask ('::1/128'); abbrev is the
        return f"abbrev({value})"   # output function's text, as the log has it ('::1')
    if text_parsed(n) or n.logical.startswith("text:") or n.logical == "json" or (
            n.logical == "string" and n.type_name not in ("text", "varchar", "bpchar", "name")):
        return f"{value}::text"
    return value


def needs_expr(n: NativeColumn) -> bool:
    """Read through an expression (select_expr), not as the bare column."""
    return select_expr(n) != quote_ident(n.name)


def to_logical(n: NativeColumn, value: Any) -> Any:
    """A value from psycopg2 (through select_expr) as the column's logical Python type.
    Strict: an unexpected Python type raises TypeError (the table changed under us)."""
    if value is None:
        return None
    t = n.logical
    if isinstance(value, str) and text_parsed(n):
        return text_converter(n)(value)
    if t in _INT_BITS:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"expected an integer, got {type(value).__name__}")
        return int(value)
    if t in ("float32", "float64"):
        if not isinstance(value, float):
            raise TypeError(f"expected a float, got {type(value).__name__}")
        return float32(value) if t == "float32" else value
    if t == "bool":
        if not isinstance(value, bool):
            raise TypeError(f"expected a bool, got {type(value).__name__}")
        return value
    if is_text_carried(t):
        if not isinstance(value, str):
            raise TypeError(f"expected text, got {type(value).__name__}")
        return value
    if t == "binary":
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        raise TypeError(f"expected bytes, got {type(value).__name__}")
    raise TypeError(f"no conversion of a {type(value).__name__} to {t}")


def text_converter(n: NativeColumn) -> Callable[[str], Any]:
    """The function turning a value in PostgreSQL's text output (pgoutput's tuple data,
    or a ``::text`` select) into the column's logical Python value: the same value on
    every path. Built once per column, not per value: the tail calls it for every value."""
    t = n.logical
    if is_text_carried(t):
        return str        # the text is the value (numeric: PostgreSQL's text is canonical)
    if t == "date":
        return parse_pg_date
    if t == "timestamp":
        return parse_pg_timestamp
    if t == "timestamptz":
        return lambda text: parse_pg_timestamp(text, True)
    if t == "float32":
        return lambda text: float32(float(text))
    parse = converter_for(n.type_oid)
    # these parsers always return exactly the logical type (and the tail checks every
    # Relation's type OIDs against the captured schema): no per-value to_logical
    exact = {"int16": (INT2,), "int32": (INT4,), "int64": (INT8,), "bool": (BOOL,),
             "binary": (BYTEA,), "float64": (FLOAT8,)}
    if n.type_oid in exact.get(t, ()):
        return parse
    return lambda text: to_logical(n, parse(text))
