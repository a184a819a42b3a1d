"""A captured table's shape: columns with one logical type each, and the key.

Sources map their native types to these logical types; the changelog (pyarrow),
the chunk rows (Spark) and the SQL target all derive their types from here, so a
log event and a snapshot row of the same table always have the same schema.

Logical type -> Python value (Arrow; PostgreSQL target):

* bool, int8..int64, float32 (rounded to float32 on every path), float64;
* decimal(p,s), p <= 38 -> Decimal (decimal128; numeric(p,s));
* numeric / numeric(p,s) -> its exact text, 'NaN' and '±Infinity' included (string;
  numeric[(p,s)]); keys compare by value (keys.encode_key: 1.5 == 1.50);
* string, json -> str (string; text, json); binary -> bytes (binary; bytea);
* date -> date | values.FarDate; timestamp -> naive datetime | values.FarTimestamp;
  timestamptz -> the same in UTC (timestamp("us", "UTC"); timestamp(6) with time zone);
* text:<sql type> -> the source's own text of the value (string; <sql type>): PostgreSQL
  types whose text reads back unchanged (uuid, inet, interval, arrays, jsonb, ...) and
  MySQL TIME as text:interval.
"""
from __future__ import annotations

import datetime as dt
import decimal
import json
import re
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from .errors import InvalidKeyError, NoPrimaryKeyError
from .keys import encode_key, encode_key_array
from .logical_types import DECIMAL_TYPE, NUMERIC_TYPE, arrow_type, check_type, postgres_type
from .values import FarDate, FarTimestamp, float32, numeric_text, parse_pg_date, parse_pg_timestamp

_INT_RANGES = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}


def _coerce_decimal(value: Any, precision: int | None, scale: int | None) -> decimal.Decimal:
    if isinstance(value, (bool, float)):
        raise ValueError(f"{value!r} is not an exact decimal; pass it as a string")
    try:
        v = decimal.Decimal(str(value).strip())
    except decimal.InvalidOperation:
        raise ValueError(f"{value!r} is not a decimal") from None
    if precision is None:
        return v
    if not v.is_finite():
        raise ValueError(f"{value!r} is not a finite decimal")
    if v != 0 and v.adjusted() >= precision - scale:
        raise ValueError(f"{value!r} has more than {precision - scale} digits before the point")
    try:
        q = v.quantize(decimal.Decimal(1).scaleb(-scale), context=decimal.Context(prec=precision + 1))
    except decimal.InvalidOperation:
        raise ValueError(f"{value!r} does not fit decimal({precision},{scale})") from None
    if q != v:
        raise ValueError(f"{value!r} has more than {scale} decimal places")
    return abs(q) if q.is_zero() else q


def coerce_value(logical: str, value: Any) -> Any:
    """A key value from a user, JSON or a stored checkpoint, as the column's Python type.

    Strict: "1.5" is not an int and True is not a number; the error names the type.
    """
    if value is None:
        raise ValueError("a key value cannot be null")
    m = DECIMAL_TYPE.match(logical)
    if logical in _INT_RANGES:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ValueError(f"{value!r} is not an integer")
        if isinstance(value, str) and not re.fullmatch(r"[+-]?\d+", value.strip()):
            raise ValueError(f"{value!r} is not an integer")
        v = int(value)
        bits = _INT_RANGES[logical]
        if not -(1 << (bits - 1)) <= v < (1 << (bits - 1)):
            raise ValueError(f"{v} is out of range for {logical}")
        return v
    if m:
        return _coerce_decimal(value, int(m.group(1)), int(m.group(2)))
    n = NUMERIC_TYPE.match(logical)
    if n:
        p, s = (int(n.group(1)), int(n.group(2))) if n.group(1) else (None, None)
        return numeric_text(_coerce_decimal(value, p, s))
    if logical in ("string", "json") or logical.startswith("text:"):
        if not isinstance(value, (str, int)) or isinstance(value, bool):
            raise ValueError(f"{value!r} is not a string")
        return str(value)
    if logical == "date":
        if isinstance(value, dt.datetime):
            raise ValueError(f"{value!r} is a timestamp, not a date")
        if isinstance(value, (dt.date, FarDate)):
            return value
        try:
            return dt.date.fromisoformat(str(value))
        except ValueError:
            return parse_pg_date(str(value))
    if logical in ("timestamp", "timestamptz"):
        if isinstance(value, FarTimestamp):
            return value
        if isinstance(value, dt.datetime):
            v = value
        else:
            try:
                v = dt.datetime.fromisoformat(str(value))
            except ValueError:
                return parse_pg_timestamp(str(value))
        if v.tzinfo is not None:
            if logical == "timestamp":
                raise ValueError(f"{value!r} has a time zone; timestamp keys are naive (as stored)")
            v = v.astimezone(dt.timezone.utc).replace(tzinfo=None)
        return v
    if logical == "binary":
        if isinstance(value, (bytes, bytearray)):
            return bytes(value)
        text = str(value)
        if not text.startswith("0x"):
            raise ValueError(f"{value!r}: binary key values are written as 0x<hex>")
        return bytes.fromhex(text[2:])
    if logical == "bool":
        if isinstance(value, bool):
            return value
        if str(value).lower() in ("true", "1"):
            return True
        if str(value).lower() in ("false", "0"):
            return False
        raise ValueError(f"{value!r} is not a boolean")
    if logical in ("float32", "float64"):
        if isinstance(value, bool):
            raise ValueError(f"{value!r} is not a number")
        v = float(value)
        return float32(v) if logical == "float32" else v
    raise ValueError(f"unsupported key type {logical}")


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # logical type, see logical_types
    nullable: bool = True

    def __post_init__(self) -> None:
        check_type(self.type)

    @property
    def arrow_type(self) -> pa.DataType:
        return arrow_type(self.type)

    @property
    def postgres_type(self) -> str:
        return postgres_type(self.type)


@dataclass(frozen=True)
class TableSchema:
    database: str
    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.key:
            raise NoPrimaryKeyError(
                f"table {self.qualified} has no primary key: DBLog chunks and reconciles "
                "by primary key, add one before capturing this table")
        missing = set(self.key) - set(self.column_names)
        if missing:
            raise ValueError(f"key columns {sorted(missing)} not in {self.qualified}")

    @property
    def qualified(self) -> str:
        return f"{self.database}.{self.name}"

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(name)

    @property
    def key_columns(self) -> list[Column]:
        return [self.column(k) for k in self.key]

    @property
    def key_types(self) -> list[str]:
        return [self.column(k).type for k in self.key]

    def encode_key(self, values: Any) -> str:
        """The canonical string of a key of this table (keys.encode_key, typed)."""
        return encode_key(values, self.key_types)

    def key_array(self, columns: list) -> pa.Array:
        """encode_key of every row of the key columns (Arrow arrays, in key order)."""
        return encode_key_array(columns, self.key_types)

    def row_struct(self) -> pa.StructType:
        return pa.struct([pa.field(c.name, c.arrow_type) for c in self.columns])

    def key_of(self, row: dict[str, Any]) -> tuple:
        return tuple(row[k] for k in self.key)

    def parse_key(self, values: Any) -> tuple:
        """A key given by a user (a scalar for one key column, a list otherwise), typed."""
        if not isinstance(values, (list, tuple)):
            values = [values]
        if len(values) != len(self.key):
            raise InvalidKeyError(
                f"{self.qualified} has key ({', '.join(self.key)}): expected {len(self.key)} "
                f"value(s), got {len(values)}: {values!r}")
        out = []
        for col, v in zip(self.key_columns, values):
            try:
                out.append(coerce_value(col.type, v))
            except (ValueError, TypeError) as e:
                raise InvalidKeyError(f"{self.qualified}.{col.name} ({col.type}): {e}") from None
        return tuple(out)

    def decode_key(self, text: str) -> tuple:
        """The inverse of keys.encode_key, for keys stored as chunk progress."""
        return self.parse_key(json.loads(text))

    def to_dict(self) -> dict:
        return {"database": self.database, "name": self.name, "key": list(self.key),
                "columns": [[c.name, c.type, c.nullable] for c in self.columns]}

    @classmethod
    def from_dict(cls, d: dict) -> "TableSchema":
        return cls(d["database"], d["name"],
                   tuple(Column(n, t, bool(nl)) for n, t, nl in d["columns"]),
                   tuple(d["key"]))
