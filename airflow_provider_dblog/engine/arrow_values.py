"""Values between Python, the sources' text forms and Arrow arrays, column at a time.

``column_from_text`` is the vectorized form of ``engine/values.py``'s per-value text
parsers (a property test holds them equal); ``to_arrow`` / ``from_arrow`` carry Python
values (``FarDate`` / ``FarTimestamp`` included) to and from a logical type's Arrow array.
"""
from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .errors import UncarriedValueError
from .logical_types import arrow_type
from .values import (NUMERIC_TEXT, date_days, date_from_days, numeric_text, parse_mysql_datetime, parse_pg_date,
                     parse_pg_timestamp, timestamp_from_us, timestamp_us)

if TYPE_CHECKING:
    from .schema import TableSchema


# -- vectorized text -> Arrow --------------------------------------------------------
# the forms Arrow's own string casts read exactly as the per-value parsers do
_PLAIN_DATE = r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"
_PLAIN_TS = _PLAIN_DATE + r" \d\d:\d\d:\d\d(\.\d{1,6})?"


def _by_value(arr: pa.Array, parse: Callable[[str], Any], to_int: Callable[[Any], int],
              int_type: pa.DataType, errors: dict[int, UncarriedValueError],
              fast: pa.Array | None = None) -> pa.Array:
    """``arr`` parsed per value where ``fast`` (the Arrow-cast result, as integers) has no
    value; unparseable values go to ``errors`` and become null."""
    values = arr.to_pylist()
    out = np.zeros(len(values), dtype=np.int64)
    valid = np.zeros(len(values), dtype=bool)
    if fast is not None:
        f_valid = fast.is_valid().to_numpy(zero_copy_only=False)
        out[f_valid] = fast.fill_null(0).to_numpy(zero_copy_only=False)[f_valid]
        valid |= f_valid
    for i, text in enumerate(values):
        if text is None or valid[i]:
            continue
        try:
            out[i] = to_int(parse(text))
            valid[i] = True
        except UncarriedValueError as e:
            errors[i] = e
    ints = pa.array(out, pa.int64(), mask=~valid)
    return ints.cast(pa.int32()).cast(int_type) if pa.types.is_date32(int_type) else ints.cast(int_type)


def column_from_text(logical: str, dialect: str,
                     arr: pa.Array) -> tuple[pa.Array, dict[int, UncarriedValueError]]:
    """A column a source printed as text, in the logical type's Arrow form, and the rows
    whose value cannot be carried ({row: reason}; those rows are null). The plain forms
    go through Arrow's casts; the rest (BC, infinity, zero dates, years past 9999) through
    the per-value parser of the dialect ("mysql" or "postgres")."""

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    arr = arr.cast(pa.string())
    errors: dict[int, UncarriedValueError] = {}
    target = arrow_type(logical)
    if logical in ("timestamp", "timestamptz"):
        aware = logical == "timestamptz" and dialect == "postgres"
        suffix = r"\+00" if aware else ""
        plain = pc.match_substring_regex(arr, f"^{_PLAIN_TS}{suffix}$")
        cast_in = pc.replace_substring_regex(arr, r"\+00$", "") if aware else arr
        fast = _try_cast(pc.if_else(plain, cast_in, None), pa.timestamp("us"))
        fast_us = fast.cast(pa.int64()) if fast is not None else None
        if fast is not None and pc.all(pc.or_kleene(plain, arr.is_null())).as_py() is not False:
            return fast_us.cast(target), errors
        parse = ((lambda t: parse_pg_timestamp(t, aware)) if dialect == "postgres"
                 else parse_mysql_datetime)
        return _by_value(arr, parse, timestamp_us, target, errors, fast_us), errors
    if logical == "date":
        plain = pc.match_substring_regex(arr, f"^{_PLAIN_DATE}$")
        fast = _try_cast(pc.if_else(plain, arr, None), pa.date32())
        fast_days = fast.cast(pa.int32()).cast(pa.int64()) if fast is not None else None
        if fast is not None and pc.all(pc.or_kleene(plain, arr.is_null())).as_py() is not False:
            return fast, errors
        parse = (parse_pg_date if dialect == "postgres"
                 else (lambda t: parse_mysql_datetime(t, date_only=True)))
        return _by_value(arr, parse, date_days, target, errors, fast_days), errors
    if logical.startswith("numeric"):
        if pc.all(pc.or_kleene(pc.match_substring_regex(arr, NUMERIC_TEXT.pattern),
                               arr.is_null())).as_py() is not False:
            return arr, errors
        return pa.array([None if v is None else numeric_text(v) for v in arr.to_pylist()],
                        pa.string()), errors
    return arr.cast(target), errors


def _try_cast(arr: pa.Array, to: pa.DataType) -> pa.Array | None:
    try:
        return arr.cast(to)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None   # e.g. a day that does not exist: the per-value parser says which


# -- Python values -> Arrow ------------------------------------------------------------
def to_arrow(logical: str, values: list) -> pa.Array:
    """Python values of a logical type as its Arrow array (FarDate / FarTimestamp, and
    datetimes of a timestamptz column, included)."""

    target = arrow_type(logical)
    if logical in ("timestamp", "timestamptz"):
        return pa.array([None if v is None else timestamp_us(v) for v in values], pa.int64()).cast(target)
    if logical == "date":
        return pa.array([None if v is None else date_days(v) for v in values], pa.int32()).cast(target)
    return pa.array(values, target)


def from_arrow(logical: str, arr: pa.Array) -> list:
    """The inverse of to_arrow: an Arrow array of a logical type as Python values
    (never an OverflowError: out-of-range values come back as FarDate / FarTimestamp)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if logical in ("timestamp", "timestamptz"):
        return [None if v is None else timestamp_from_us(v) for v in arr.cast(pa.int64()).to_pylist()]
    if logical == "date":
        return [None if v is None else date_from_days(v) for v in arr.cast(pa.int32()).to_pylist()]
    return arr.to_pylist()


# -- one row, stored in JSON (a schema version's fill values) ------------------------------
def encode_row(columns: dict[str, str], values: dict[str, Any]) -> str:
    """One row of ``columns`` ({name: logical type}) as text that keeps every value exact
    (Arrow IPC, base64)."""
    table = pa.table({c: to_arrow(t, [values[c]]) for c, t in columns.items()})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return base64.b64encode(sink.getvalue().to_pybytes()).decode()


def decode_row(text: str) -> pa.Table:
    """The inverse of :func:`encode_row`: a one-row Arrow table."""
    return pa.ipc.open_stream(base64.b64decode(text)).read_all()


def arrow_rows(table: TableSchema, data: pa.Table) -> Iterator[tuple]:
    """Arrow rows of ``table``'s columns (a lake table's, a chunk's) in the form the source
    side gives: dates and timestamps through their integers (:func:`from_arrow`), so a
    value Python's datetime cannot hold (BC, past 9999, ±infinity) compares exactly as a
    FarDate / FarTimestamp instead of raising OverflowError."""
    types = [c.type for c in table.columns]
    for batch in data.select(table.column_names).to_batches(20_000):
        yield from zip(*(from_arrow(t, c) for t, c in zip(types, batch.columns)))
