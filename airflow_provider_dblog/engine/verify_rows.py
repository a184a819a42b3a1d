"""A target's rows in the form a verification compares (issue 29): each column as its
logical type's Arrow array (``logical_types.arrow_type``, the form the event log and a
verification's chunks hold), then ``_dblog_pos``, and ``_dblog_bad``: per row, the columns
whose value the logical type cannot hold (a damaged target can hold such a value: that row
differs from its source, whose value the type holds). Targets build these (``Target.read_at``);
verify_compare.py compares them column at a time. No Spark and no Airflow here.
"""
from __future__ import annotations

from typing import Iterable, Iterator

import pyarrow as pa

from .arrow_values import from_arrow, to_arrow
from .logical_types import arrow_type
from .schema import TableSchema

POS = "_dblog_pos"
BAD = "_dblog_bad"   # comma-joined positions of the row's columns whose value the logical type cannot hold
ROWS_PER_BATCH = 50_000


def column(logical: str, values: list) -> tuple[pa.Array, list[int]]:
    """``values`` as the type's Arrow array, and the rows it cannot hold (null in the array)."""
    try:
        return to_arrow(logical, values), []
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError, TypeError):
        pass
    bad, kept = [], []
    for i, v in enumerate(values):
        try:
            to_arrow(logical, [v])
            kept.append(v)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError, TypeError):
            bad.append(i)
            kept.append(None)
    return to_arrow(logical, kept), bad


def make_batch(table: TableSchema, columns: list[tuple[pa.Array, list[int]]], pos) -> pa.Table:
    """One batch of the columns' (array, rows it cannot hold) pairs, in column order, and the rows' positions."""
    bad_at: dict[int, list[int]] = {}
    for j, (_, bad) in enumerate(columns):
        for i in bad:
            bad_at.setdefault(i, []).append(j)
    n = len(pos)
    bad = pa.array([",".join(map(str, bad_at[i])) if i in bad_at else None for i in range(n)], pa.string()) if bad_at \
        else pa.nulls(n, pa.string())
    pos = pos.cast(pa.string()) if isinstance(pos, (pa.Array, pa.ChunkedArray)) else pa.array(pos, pa.string())
    return pa.table([arr for arr, _ in columns] + [pos, bad], names=table.column_names + [POS, BAD])


def rows_to_batches(table: TableSchema, rows: Iterable[tuple]) -> Iterator[pa.Table]:
    """Rows of logical Python values (the table's columns, then ``_dblog_pos``) in batches."""
    n = len(table.columns)
    buf: list[tuple] = []

    def flush() -> pa.Table:
        cols = list(zip(*buf)) if buf else [()] * (n + 1)
        return make_batch(table, [column(c.type, list(v)) for c, v in zip(table.columns, cols[:n])], list(cols[n]))

    for r in rows:
        buf.append(r)
        if len(buf) == ROWS_PER_BATCH:
            yield flush()
            buf = []
    if buf:
        yield flush()


def arrow_to_batches(table: TableSchema, data: pa.Table) -> Iterator[pa.Table]:
    """A lake table's rows (its columns, ``_dblog_pos``) in batches: a column already of its
    logical type's Arrow type as it is, another through its Python values (from_arrow)."""
    data = data.select(table.column_names + [POS])   # (a lake's names are unique: its shape check)
    for batch in data.to_batches(ROWS_PER_BATCH):
        columns = [(col, []) if col.type == arrow_type(c.type) else column(c.type, from_arrow(c.type, col))
                   for c, col in zip(table.columns, batch.columns)]
        yield make_batch(table, columns, batch.column(len(table.columns)))


def empty(table: TableSchema) -> pa.Table:
    return pa.table([pa.array([], arrow_type(c.type)) for c in table.columns]
                    + [pa.array([], pa.string()), pa.array([], pa.string())], names=table.column_names + [POS, BAD])
