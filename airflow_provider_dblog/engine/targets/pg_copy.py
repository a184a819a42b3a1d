"""Arrow rows -> PostgreSQL ``COPY ... FROM STDIN`` (text format), exactly.

The one way rows reach a PostgreSQL target, whichever apply path staged them (the
in-process apply and the Spark apply both call :func:`copy_rows`), so a value has
one text form: shortest round-trip floats, decimals with their scale, dates and
timestamps in the proleptic Gregorian calendar with BC years and ``±infinity``
(engine/values.py), bytea as hex, text with COPY's escapes. The session reading it
runs with ``values.PG_TEXT_SETTINGS`` (intervals are read by IntervalStyle).

A value PostgreSQL cannot hold (a NUL character in text) raises
UncarriedValueError naming the column and the row's key. Columns are formatted
with Arrow compute, a page at a time; only the rare values outside Arrow's
formatting (years before 1 or after 9999, infinity, bytea) go through Python.
"""
from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from psycopg2 import sql

from ..errors import UncarriedValueError
from ..values import date_from_days, pg_date_text, pg_timestamp_text, timestamp_from_us

COPY_PAGE_ROWS = 50_000
NULL = "\\N"
# the microseconds / days that Arrow prints as plain ISO: years 0001..9999
_US_MIN, _US_MAX = -62_135_596_800_000_000, 253_402_300_800_000_000
_DAYS_MIN, _DAYS_MAX = -719_162, 2_932_897


def _escape(arr: pa.Array) -> pa.Array:
    """COPY text format: a backslash and the row/column separators are escaped."""
    for raw, esc in (("\\", "\\\\"), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t")):
        arr = pc.replace_substring(arr, raw, esc)
    return arr


def _special(arr: pa.Array, mask: pa.Array, fmt) -> pa.Array:
    """``arr`` (already text) with the rows of ``mask`` formatted by ``fmt`` in Python."""
    if not pc.any(mask).as_py():
        return arr
    idx = pc.indices_nonzero(mask).to_pylist()
    values = arr.to_pylist()
    for i in idx:
        values[i] = fmt(i)
    return pa.array(values, pa.string())


def _timestamps(arr: pa.Array) -> pa.Array:
    aware = arr.type.tz is not None
    us = arr.cast(pa.int64())
    text = pc.cast(arr.cast(pa.timestamp("us")), pa.string())
    if aware:
        text = pc.binary_join_element_wise(text, "+00", "")
    out_of_range = pc.fill_null(pc.or_(pc.less(us, _US_MIN), pc.greater_equal(us, _US_MAX)), False)
    values = us.to_pylist() if pc.any(out_of_range).as_py() else None
    return _special(text, out_of_range,
                    lambda i: pg_timestamp_text(timestamp_from_us(values[i]), aware))


def _dates(arr: pa.Array) -> pa.Array:
    days = arr.cast(pa.int32())
    text = pc.cast(arr, pa.string())
    out_of_range = pc.fill_null(pc.or_(pc.less(days, _DAYS_MIN), pc.greater_equal(days, _DAYS_MAX)), False)
    values = days.to_pylist() if pc.any(out_of_range).as_py() else None
    return _special(text, out_of_range, lambda i: pg_date_text(date_from_days(values[i])))


def column_text(arr: pa.Array, name: str = "") -> pa.Array:
    """One column in COPY's text format (nulls stay null: the caller writes \\N)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        nul = pc.fill_null(pc.match_substring(arr, "\x00"), False)
        if pc.any(nul).as_py():
            row = pc.index(nul, True).as_py()
            raise UncarriedValueError(
                f"column {name!r} holds a NUL character (row {row}): PostgreSQL text cannot "
                "hold it")
        return _escape(arr.cast(pa.string()))
    if pa.types.is_boolean(t):
        return pc.if_else(arr, "t", "f")
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return pa.array([None if v is None else "\\\\x" + v.hex() for v in arr.to_pylist()], pa.string())
    if pa.types.is_timestamp(t):
        return _timestamps(arr)
    if pa.types.is_date32(t):
        return _dates(arr)
    if pa.types.is_null(t):
        return pa.nulls(len(arr), pa.string())
    # integers, decimals (their scale kept), floats (shortest round-trip text; nan, inf)
    return pc.cast(arr, pa.string())


def copy_text(batch: pa.RecordBatch | pa.Table) -> bytes:
    """The rows of ``batch`` as COPY text (UTF-8): one line per row, columns by tab."""
    if batch.num_rows == 0:
        return b""
    cols = [pc.fill_null(column_text(batch.column(i), batch.schema.field(i).name), NULL)
            for i in range(batch.num_columns)]
    lines = pc.binary_join_element_wise(*cols, "\t") if len(cols) > 1 else cols[0]
    lines = pc.binary_join_element_wise(lines, "", "\n")    # each line ends with a newline
    lines = lines.cast(pa.large_string())
    if isinstance(lines, pa.ChunkedArray):
        lines = lines.combine_chunks()
    # the lines' characters follow one another in the array's data buffer: that is the text
    offsets = lines.buffers()[1]
    off = np.frombuffer(offsets, dtype=np.int64)[lines.offset:lines.offset + len(lines) + 1]
    return lines.buffers()[2].to_pybytes()[off[0]:off[-1]]


def copy_rows(cur, qualified_table: sql.Composable, flat: pa.Table,
              page_rows: int = COPY_PAGE_ROWS) -> int:
    """``COPY`` the rows of ``flat`` into a table of the same column names, in pages."""
    stmt = sql.SQL("COPY {} ({}) FROM STDIN").format(
        qualified_table, sql.SQL(", ").join(sql.Identifier(c) for c in flat.column_names))
    n = 0
    for batch in flat.to_batches(max_chunksize=page_rows):
        if batch.num_rows:
            cur.copy_expert(stmt, io.BytesIO(copy_text(batch)))
        n += batch.num_rows
    return n

