"""A captured table's shape: columns with one logical type each, and the key.

Sources map their native types to these logical types; the changelog (pyarrow),
the chunk rows (Spark) and the SQL target all derive their types from here, so a
log event and a snapshot row of the same table always have the same schema.
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

_DECIMAL = re.compile(r"^decimal\((\d+),(\d+)\)$")

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
    "json": "text",
    "binary": "bytea",
    "date": "date",
    "timestamp": "timestamp(6)",
}


def _check_type(logical: str) -> str:
    if logical in _ARROW or _DECIMAL.match(logical):
        return logical
    raise ValueError(f"unknown logical type {logical!r}")


_INT_RANGES = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}


def coerce_value(logical: str, value: Any) -> Any:
    """A key value from a user, JSON or a stored checkpoint, as the column's Python type.

    Strict: "1.5" is not an int and True is not a number; the error names the type.
    """
    if value is None:
        raise ValueError("a key value cannot be null")
    m = _DECIMAL.match(logical)
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
        if isinstance(value, (bool, float)):
            raise ValueError(f"{value!r} is not an exact decimal; pass it as a string")
        try:
            v = decimal.Decimal(str(value).strip())
        except decimal.InvalidOperation:
            raise ValueError(f"{value!r} is not a decimal") from None
        if not v.is_finite():
            raise ValueError(f"{value!r} is not a finite decimal")
        precision, scale = int(m.group(1)), int(m.group(2))
        if v != 0 and v.adjusted() >= precision - scale:
            raise ValueError(f"{value!r} has more than {precision - scale} digits before the point")
        try:
            q = v.quantize(decimal.Decimal(1).scaleb(-scale))
        except decimal.InvalidOperation:
            raise ValueError(f"{value!r} does not fit {logical}") from None
        if q != v:
            raise ValueError(f"{value!r} has more than {scale} decimal places")
        return abs(q) if q.is_zero() else q
    if logical in ("string", "json"):
        if not isinstance(value, (str, int)) or isinstance(value, bool):
            raise ValueError(f"{value!r} is not a string")
        return str(value)
    if logical == "date":
        if isinstance(value, dt.datetime):
            raise ValueError(f"{value!r} is a timestamp, not a date")
        return value if isinstance(value, dt.date) else dt.date.fromisoformat(str(value))
    if logical == "timestamp":
        v = value if isinstance(value, dt.datetime) else dt.datetime.fromisoformat(str(value))
        if v.tzinfo is not None:
            raise ValueError(f"{value!r} has a time zone; timestamp keys are naive (as stored)")
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
        return float(value)
    raise ValueError(f"unsupported key type {logical}")


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # logical type, see _ARROW
    nullable: bool = True

    def __post_init__(self) -> None:
        _check_type(self.type)

    @property
    def arrow_type(self) -> pa.DataType:
        m = _DECIMAL.match(self.type)
        if m:
            return pa.decimal128(int(m.group(1)), int(m.group(2)))
        return _ARROW[self.type]

    @property
    def postgres_type(self) -> str:
        m = _DECIMAL.match(self.type)
        if m:
            return f"numeric({m.group(1)},{m.group(2)})"
        return _POSTGRES[self.type]


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
        """The inverse of events.encode_key, for keys stored as chunk progress."""
        return self.parse_key(json.loads(text))

    def to_dict(self) -> dict:
        return {"database": self.database, "name": self.name, "key": list(self.key),
                "columns": [[c.name, c.type, c.nullable] for c in self.columns]}

    @classmethod
    def from_dict(cls, d: dict) -> "TableSchema":
        return cls(d["database"], d["name"],
                   tuple(Column(n, t, bool(nl)) for n, t, nl in d["columns"]),
                   tuple(d["key"]))
