"""The one event schema shared by log events and dump (snapshot) events.

An event is (table, op, key, before, after, position, source timestamp). In
Parquet ``before``/``after`` are structs typed by the table's TableSchema and
``key`` is a canonical string of the key values, so the reconciler, Spark and
SQL can join on one column whatever the key's arity.
"""
from __future__ import annotations

from typing import Iterable, NamedTuple, Sequence

import numpy as np
import pyarrow as pa

from .keys import encode_key, encode_key_array
from .positions import Position
from .schema import TableSchema
from .arrow_values import from_arrow, to_arrow

INSERT, UPDATE, DELETE, SNAPSHOT = "insert", "update", "delete", "snapshot"
OPS = (INSERT, UPDATE, DELETE, SNAPSHOT)


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
    # why a value of this event could not be carried (that column is null in the image);
    # the apply never lets such an event reach a target (engine/apply_hold.py: held_at)
    error: str | None = None

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
        pa.field("error", pa.string()),
    ])


def images_to_arrow(table: TableSchema, images: list[dict | None]) -> pa.StructArray:
    """Row images as a struct array, built column by column: the path for values that
    pyarrow's own conversion does not take (FarDate/FarTimestamp, numeric text)."""
    row = table.row_struct()
    mask = pa.array([img is None for img in images], pa.bool_())
    cols = [to_arrow(c.type, [None if img is None else img.get(c.name) for img in images])
            for c in table.columns]
    return pa.StructArray.from_arrays(cols, fields=list(row), mask=mask)


def events_to_arrow(table: TableSchema, events: Iterable[Event]) -> pa.Table:
    events = events if isinstance(events, list) else list(events)
    schema = event_arrow_schema(table)
    keys = [e.key for e in events]
    key = None
    logical = table.key_types
    key_types = [table.column(k).arrow_type for k in table.key]
    fast = {t: (int if pa.types.is_integer(t) else str if pa.types.is_string(t) else None)
            for t in key_types}
    if (events and all(fast[t] is not None for t in key_types)
            and not any(t.startswith("numeric") for t in logical)
            and all(len(k) == len(key_types) for k in keys)):
        # nearly every primary key: exact ints or text, encoded in Arrow
        # (encode_key_array itself falls back to encode_key for text that needs escaping)
        cols = [[k[i] for k in keys] for i in range(len(key_types))]
        if all(all(v.__class__ is fast[t] for v in c) for c, t in zip(cols, key_types)):
            try:
                key = encode_key_array([pa.array(c, t) for c, t in zip(cols, key_types)])
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
                key = None
    if key is None:
        key = [encode_key(k, logical) for k in keys]
    pos = encode_positions([e.pos[0] for e in events], [e.pos[1] for e in events],
                           [e.pos[2] for e in events])
    columns = {
        "table": [e.table for e in events],
        "op": [e.op for e in events],
        "key": key,
        "before": [e.before for e in events],
        "after": [e.after for e in events],
        "pos": pos,
        "source_ts": [e.source_ts for e in events],
        "error": [e.error for e in events],
    }
    try:
        return pa.Table.from_pydict(columns, schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
        columns["before"] = images_to_arrow(table, columns["before"])
        columns["after"] = images_to_arrow(table, columns["after"])
        return pa.Table.from_pydict(columns, schema=schema)


def rows_from_arrow(table: TableSchema, rows: pa.StructArray | pa.ChunkedArray) -> list[dict | None]:
    """Row images (a struct column of the event log) as Python dicts of logical values."""
    if isinstance(rows, pa.ChunkedArray):
        rows = rows.combine_chunks()
    valid = rows.is_valid().to_pylist()
    cols = {c.name: from_arrow(c.type, rows.field(c.name)) for c in table.columns}
    return [{n: v[i] for n, v in cols.items()} if ok else None for i, ok in enumerate(valid)]


def rows_of(table: TableSchema, data: pa.Table) -> list[dict]:
    """The rows of a table of the row columns (chunk rows, select_keys) as Python dicts of
    logical values (a timestamptz naive in UTC, out-of-range dates as FarDate, ...);
    columns other than the table's (ERROR_COLUMN) are left out."""
    cols = {c.name: from_arrow(c.type, data[c.name]) for c in table.columns}
    return [{n: v[i] for n, v in cols.items()} for i in range(data.num_rows)]


def events_from_arrow(table: TableSchema, data: pa.Table) -> list[Event]:
    before = rows_from_arrow(table, data["before"])
    after = rows_from_arrow(table, data["after"])
    errors = data["error"].to_pylist() if "error" in data.column_names else [None] * data.num_rows
    out = []
    for i, (t, op, pos, ts) in enumerate(zip(data["table"].to_pylist(), data["op"].to_pylist(),
                                             data["pos"].to_pylist(), data["source_ts"].to_pylist())):
        image = after[i] if after[i] is not None else before[i]
        out.append(Event(t, op, table.key_of(image), before[i], after[i], Position.decode(pos), ts,
                         errors[i]))
    return out
