"""The logical column types: their names, their Arrow type and their PostgreSQL column type.

The vocabulary every layer shares (``engine/schema.py`` describes it value by value);
it depends on nothing else of the engine, so values, keys and schema can all use it.
"""
from __future__ import annotations

import re

import pyarrow as pa

DECIMAL_TYPE = re.compile(r"^decimal\((\d+),(\d+)\)$")
NUMERIC_TYPE = re.compile(r"^numeric(?:\((\d+),(\d+)\))?$")

_ARROW = {
    "bool": pa.bool_(),
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "string": pa.string(),
    "json": pa.string(),
    "binary": pa.binary(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us"),
    "timestamptz": pa.timestamp("us", tz="UTC"),
}

_POSTGRES = {
    "bool": "boolean",
    "int8": "smallint",
    "int16": "smallint",
    "int32": "integer",
    "int64": "bigint",
    "float32": "real",
    "float64": "double precision",
    "string": "text",
    "json": "json",
    "binary": "bytea",
    "date": "date",
    "timestamp": "timestamp(6)",
    "timestamptz": "timestamp(6) with time zone",
}

# "text:<sql type>": a value carried as the source's own text form (the string the
# source prints and reads back unchanged), typed by <sql type> in a SQL target. Only
# built-in PostgreSQL types whose text form round-trips exactly; the type text goes
# into the target's DDL, so it is checked against this grammar.
_TEXT_TYPES = {"uuid", "inet", "cidr", "macaddr", "macaddr8", "xml", "json", "jsonb", "interval",
               "time", "time with time zone", "time without time zone", "bit", "bit varying",
               "smallint", "integer", "bigint", "real", "double precision", "numeric", "boolean",
               "text", "character varying", "character", "bytea", "date", "timestamp",
               "timestamp with time zone", "timestamp without time zone"}
_TEXT_TYPE = re.compile(
    r"^(?P<base>[a-z][a-z ]*?)(?:\((?P<mods>\d+(?:,\d+)?)\))?"
    r"(?P<tz> with(?:out)? time zone)?(?P<arr>(?:\[\])*)$")


_INTERVAL_FIELDS = re.compile(
    r"^interval(?: (?:year|month|day|hour|minute|second)(?: to (?:month|hour|minute|second))?)?$")


def _text_sql_type(logical: str) -> str | None:
    """The SQL type of a "text:<sql type>" logical type (None for any other type)."""
    if not logical.startswith("text:"):
        return None
    sql_type = logical[5:]
    m = _TEXT_TYPE.match(sql_type)
    base = (m.group("base").strip() + (m.group("tz") or "")) if m else ""
    if not m or not (base in _TEXT_TYPES or _INTERVAL_FIELDS.match(base)):
        raise ValueError(f"unknown logical type {logical!r}")
    return sql_type


def is_text_carried(logical: str) -> bool:
    """Carried as a Python str / Arrow string (text, JSON, numeric, text:<sql type>)."""
    return logical in ("string", "json") or logical.startswith(("numeric", "text:"))


def arrow_type(logical: str) -> pa.DataType:
    m = DECIMAL_TYPE.match(logical)
    if m:
        return pa.decimal128(int(m.group(1)), int(m.group(2)))
    if NUMERIC_TYPE.match(logical) or _text_sql_type(logical):
        return pa.string()
    try:
        return _ARROW[logical]
    except KeyError:
        raise ValueError(f"unknown logical type {logical!r}") from None


def postgres_type(logical: str) -> str:
    """The column type of a logical type in a PostgreSQL target."""
    m = DECIMAL_TYPE.match(logical) or NUMERIC_TYPE.match(logical)
    if m:
        return f"numeric({m.group(1)},{m.group(2)})" if m.group(1) else "numeric"
    text = _text_sql_type(logical)
    if text:
        return text
    return _POSTGRES[logical]


def check_type(logical: str) -> str:
    arrow_type(logical)
    return logical
