"""Canonical key strings: one string per primary-key value tuple, equal exactly when the
database's keys are equal (1.5 == 1.50, -0.0 == 0.0, a timestamptz in UTC).

The changelog's ``key`` column, the reconciler, Spark and the SQL target all join on
this one string, whatever the key's arity; ``TableSchema.encode_key`` is the typed entry.
"""
from __future__ import annotations

import datetime as dt
import decimal
import json
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from .arrow_values import from_arrow
from .values import FarDate, FarTimestamp, comparable_key, float32, numeric_key, numeric_text


def _canonical(value: Any, logical: str | None = None) -> Any:
    """One JSON value per key value, equal exactly when the database's values are equal."""
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, str):
        # numeric columns carry their text with its own scale: 1.50 and 1.5 are one key
        return numeric_key(value) if logical and logical.startswith("numeric") else value
    if isinstance(value, float):
        if logical == "float32":   # a REAL/FLOAT column holds float32: one value, one text
            value = float32(value)
        return "0.0" if value == 0 else repr(value)   # -0.0 and 0.0 are one key
    if isinstance(value, decimal.Decimal):
        # one string per number: 1.5 == 1.50, and -0.00 == 0 (a context as wide as the
        # value: the default one rounds to 28 digits, and two keys would become one)
        if not value.is_finite():
            return numeric_text(value)
        v = value.normalize(decimal.Context(prec=max(len(value.as_tuple().digits), 1)))
        return "0" if v.is_zero() else format(v, "f")
    if isinstance(value, (dt.datetime, dt.date, dt.time, FarDate, FarTimestamp)):
        if isinstance(value, dt.datetime) and value.tzinfo is not None:
            value = value.astimezone(dt.timezone.utc).replace(tzinfo=None)
        return value.isoformat()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "0x" + bytes(value).hex()
    raise TypeError(f"unsupported key value type {type(value).__name__}")


def encode_scalar(value: Any, logical: str | None = None) -> Any:
    """A key value as JSON can hold it; TableSchema.parse_key reads it back."""
    return _canonical(value, logical)


def encode_key(values: Sequence[Any], types: Sequence[str] | None = None) -> str:
    """The canonical string of a key tuple: equal keys give equal strings. ``types``
    (the key columns' logical types) matter for numeric columns carried as text."""
    if types is None:
        return json.dumps([_canonical(v) for v in values], separators=(",", ":"))
    return json.dumps([_canonical(v, t) for v, t in zip(values, types)], separators=(",", ":"))


def by_value(logical: str) -> bool:
    """A key type whose one value has several texts (values.comparable_key: an interval, of any
    precision or fields): keys of it are matched by value_keys where a key a user gave meets
    one the source printed."""
    return logical.startswith("text:interval")


def value_keys(keys: pa.Array, types: Sequence[str]) -> pa.Array:
    """encode_key strings in a form equal exactly when the database takes the keys for one
    (an interval '24:00:00' is '1 day'); the strings themselves when no key type needs it."""
    if not any(by_value(t) for t in types):
        return keys
    out = []
    for text in keys.to_pylist():
        values = None if text is None else json.loads(text)
        out.append(None if values is None else json.dumps(
            [comparable_key(t, v) if by_value(t) else v for t, v in zip(types, values)],
            separators=(",", ":")))
    return pa.array(out, pa.string())


# JSON needs no escaping for printable ASCII other than '"' and '\\'
_PLAIN_TEXT = r'^[\x20\x21\x23-\x5b\x5d-\x7e]*$'


def _key_part_fast(col: pa.Array) -> pa.Array | None:
    """One key column as its canonical JSON text, computed in Arrow, or None when only
    the per-value path is exact (floats, decimals, times, bytes, escapes, nulls)."""
    if col.null_count:
        return None
    if pa.types.is_integer(col.type):
        return pc.cast(col, pa.string())
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        col = pc.cast(col, pa.string())
        if len(col) and not pc.all(pc.match_substring_regex(col, _PLAIN_TEXT)).as_py():
            return None
        return pc.binary_join_element_wise('"', col, '"', "")
    return None


def encode_key_array(columns: Sequence[pa.Array], types: Sequence[str] | None = None) -> pa.Array:
    """``encode_key`` of every row of the key columns, as one string array.

    Integer and plain-ASCII text keys (nearly every primary key) are encoded in
    Arrow; a dump chunk of 100k rows would otherwise spend seconds in Python here.
    """
    columns = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in columns]
    types = list(types) if types is not None else [None] * len(columns)
    parts = [None if t and t.startswith("numeric") else _key_part_fast(c) for c, t in zip(columns, types)]
    if columns and all(p is not None for p in parts):
        return pc.binary_join_element_wise("[", *_interleave(parts, ","), "]", "")
    values = [from_arrow(_logical_of(c.type, t), c) for c, t in zip(columns, types)]
    return pa.array([encode_key(vals, types) for vals in zip(*values)], pa.string())


def _logical_of(arrow: pa.DataType, logical: str | None) -> str:
    """For from_arrow: the logical type, or what the Arrow type says when it is unknown."""
    if logical:
        return logical
    if pa.types.is_timestamp(arrow):
        return "timestamp"
    if pa.types.is_date32(arrow):
        return "date"
    return ""


def _interleave(parts: list[pa.Array], sep: str) -> list:
    out: list = []
    for i, p in enumerate(parts):
        out += [sep, p] if i else [p]
    return out
