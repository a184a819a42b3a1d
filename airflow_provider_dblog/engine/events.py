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
from typing import Any, Iterable, NamedTuple, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

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


def encode_key_array(columns: Sequence[pa.Array]) -> pa.Array:
    """``encode_key`` of every row of the key columns, as one string array.

    Integer and plain-ASCII text keys (nearly every primary key) are encoded in
    Arrow; a dump chunk of 100k rows would otherwise spend seconds in Python here.
    """
    columns = [c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in columns]
    parts = [_key_part_fast(c) for c in columns]
    if columns and all(p is not None for p in parts):
        return pc.binary_join_element_wise("[", *_interleave(parts, ","), "]", "")
    return pa.array([encode_key(vals) for vals in zip(*(c.to_pylist() for c in columns))], pa.string())


def _interleave(parts: list[pa.Array], sep: str) -> list:
    out: list = []
    for i, p in enumerate(parts):
        out += [sep, p] if i else [p]
    return out


# "00".."ff": a byte's two hex digits, so a column of numbers becomes hex in numpy
_HEX_PAIRS = np.frombuffer(b"".join(b"%02x" % i for i in range(256)), np.uint8).reshape(256, 2)
_POS_WIDTHS = (8, 16, 8)  # as Position.encode writes them


def _hex_columns(values: np.ndarray, digits: int) -> np.ndarray:
    """n uint64 values as an n x digits array of ASCII hex digits, big-endian."""
    octets = values.astype(">u8").view(np.uint8).reshape(-1, 8)[:, 8 - digits // 2:]
    return _HEX_PAIRS[octets].reshape(len(values), digits)


def encode_positions(logs: Sequence[int], offsets: Sequence[int], seqs: Sequence[int]) -> pa.Array:
    """Position(log, offset, seq).encode() of every row, as one string array, made in
    numpy: a per-row format() is a sizeable share of a tail flush and of a big chunk's
    snapshot. A value that is negative or too wide raises as Position.encode does."""
    n = len(seqs)
    out = np.empty((n, sum(_POS_WIDTHS) + 2), np.uint8)
    col = 0
    for values, digits in zip((logs, offsets, seqs), _POS_WIDTHS):
        try:
            v = np.asarray(values, dtype=np.uint64) if isinstance(values, np.ndarray) \
                else np.fromiter(values, np.uint64, n)
        except (OverflowError, ValueError):
            v = None  # negative or over 64 bits
        if v is None or (n and int(v.max()) >= 16 ** digits):
            bad = next(i for i in range(n) if not 0 <= int(values[i]) < 16 ** digits)
            Position(logs[bad], offsets[bad], seqs[bad]).encode()  # raises, naming the position
        out[:, col:col + digits] = _hex_columns(v, digits)
        col += digits
        if col < out.shape[1]:
            out[:, col] = ord("-")
            col += 1
    return pa.array(out.reshape(-1).view(f"S{out.shape[1]}"), pa.binary()).cast(pa.string())


def position_range(start: Position, n: int) -> pa.Array:
    """The encoded positions start, start+1, ... (in seq), n of them: a chunk's snapshot rows."""
    if n and start.seq + n - 1 >= 16 ** 8:
        raise ValueError(f"position {tuple(start)} + {n} does not fit its encoding")
    start.encode()  # its log and offset fit
    seqs = np.arange(start.seq, start.seq + n, dtype=np.uint64)
    return encode_positions(np.full(n, start.log, np.uint64), np.full(n, start.offset, np.uint64), seqs)


class Event(NamedTuple):
    """One change (or snapshot row). A NamedTuple, not a frozen dataclass: the tail makes
    one per row change, and a frozen dataclass's __init__ costs three times as much."""
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
    events = events if isinstance(events, list) else list(events)
    schema = event_arrow_schema(table)
    keys = [e.key for e in events]
    key = None
    key_types = [table.column(k).arrow_type for k in table.key]
    fast = {t: (int if pa.types.is_integer(t) else str if pa.types.is_string(t) else None)
            for t in key_types}
    if events and all(fast[t] is not None for t in key_types) and all(len(k) == len(key_types) for k in keys):
        # nearly every primary key: exact ints or text, encoded in Arrow
        # (encode_key_array itself falls back to encode_key for text that needs escaping)
        cols = [[k[i] for k in keys] for i in range(len(key_types))]
        if all(all(v.__class__ is fast[t] for v in c) for c, t in zip(cols, key_types)):
            try:
                key = encode_key_array([pa.array(c, t) for c, t in zip(cols, key_types)])
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
                key = None
    if key is None:
        key = [encode_key(k) for k in keys]
    pos = encode_positions([e.pos[0] for e in events], [e.pos[1] for e in events],
                           [e.pos[2] for e in events])
    return pa.Table.from_pydict({
        "table": [e.table for e in events],
        "op": [e.op for e in events],
        "key": key,
        "before": [e.before for e in events],
        "after": [e.after for e in events],
        "pos": pos,
        "source_ts": [e.source_ts for e in events],
    }, schema=schema)


def events_from_arrow(table: TableSchema, data: pa.Table) -> list[Event]:
    out = []
    for r in data.to_pylist():
        image = r["after"] if r["after"] is not None else r["before"]
        out.append(Event(r["table"], r["op"], table.key_of(image), r["before"], r["after"],
                         Position.decode(r["pos"]), r["source_ts"]))
    return out
