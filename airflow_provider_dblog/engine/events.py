"""The one event schema shared by log events and dump (snapshot) events.

An event is (table, op, key, before, after, position, source timestamp). In
Parquet ``before``/``after`` are structs typed by the table's TableSchema and
``key`` is a canonical string of the key values, so the reconciler, Spark and
SQL can join on one column whatever the key's arity.
"""
from __future__ import annotations

import datetime as dt
import decimal
import json
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import pyarrow as pa

from .positions import Position
from .schema import TableSchema

INSERT, UPDATE, DELETE, SNAPSHOT = "insert", "update", "delete", "snapshot"
OPS = (INSERT, UPDATE, DELETE, SNAPSHOT)


def _canonical(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, decimal.Decimal):
        # one string per number: 1.5 == 1.50, and -0.00 == 0
        v = value.normalize()
        return "0" if v.is_zero() else format(v, "f")
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "0x" + bytes(value).hex()
    raise TypeError(f"unsupported key value type {type(value).__name__}")


def encode_scalar(value: Any) -> Any:
    """A key value as JSON can hold it; TableSchema.parse_key reads it back."""
    return _canonical(value)


def encode_key(values: Sequence[Any]) -> str:
    """The canonical string of a key tuple: equal keys give equal strings."""
    return json.dumps([_canonical(v) for v in values], separators=(",", ":"))


@dataclass(frozen=True)
class Event:
    table: str  # "db.table"
    op: str
    key: tuple
    before: dict | None
    after: dict | None
    pos: Position
    source_ts: int = 0  # milliseconds since the epoch, as the source reports it

    @property
    def row(self) -> dict | None:
        """The row image that survives this event (None after a delete)."""
        return None if self.op == DELETE else self.after


def event_arrow_schema(table: TableSchema) -> pa.Schema:
    row = table.row_struct()
    return pa.schema([
        pa.field("table", pa.string(), nullable=False),
        pa.field("op", pa.string(), nullable=False),
        pa.field("key", pa.string(), nullable=False),
        pa.field("before", row),
        pa.field("after", row),
        pa.field("pos", pa.string(), nullable=False),
        pa.field("source_ts", pa.int64(), nullable=False),
    ])


def events_to_arrow(table: TableSchema, events: Iterable[Event]) -> pa.Table:
    events = list(events)
    return pa.Table.from_pydict({
        "table": [e.table for e in events],
        "op": [e.op for e in events],
        "key": [encode_key(e.key) for e in events],
        "before": [e.before for e in events],
        "after": [e.after for e in events],
        "pos": [e.pos.encode() for e in events],
        "source_ts": [e.source_ts for e in events],
    }, schema=event_arrow_schema(table))


def events_from_arrow(table: TableSchema, data: pa.Table) -> list[Event]:
    out = []
    for r in data.to_pylist():
        image = r["after"] if r["after"] is not None else r["before"]
        out.append(Event(r["table"], r["op"], table.key_of(image), r["before"], r["after"],
                         Position.decode(r["pos"]), r["source_ts"]))
    return out
