"""A Delta target table takes a change of its source table's shape
(engine/schema_evolution.py): the table's rows are rewritten in Arrow as the change says
and written back as one overwrite commit (delta.py), which also moves the applied
position to the change. Exact by construction: columns renamed, dropped, widened with an
Arrow cast that refuses to lose a value, added as null or filled with the default the
source gave existing rows, copied (lenient renames), emptied by a TRUNCATE.
No Spark and no Airflow here.
"""
from __future__ import annotations

import re

import pyarrow as pa

from ..arrow_values import decode_row
from ..logical_types import NUMERIC_TYPE
from ..schema import TableSchema
from ..schema_evolution import Evolution
from .base import OP_COLUMN, POS_COLUMN


_PLAIN = re.compile(r"^-?\d+(?:\.\d*)?$")


def _rescaled(text: str | None, scale: int) -> str | None:
    """``text`` (a numeric's exact text) with ``scale`` digits after the point ('1.25' ->
    '1.250'): what the source prints after widening the scale. NaN, infinities: as they are."""
    if text is None or not _PLAIN.match(text):
        return text
    whole, _, frac = text.partition(".")
    return f"{whole}.{frac.ljust(scale, '0')}"


def evolved(data: pa.Table, ev: Evolution, new: TableSchema, new_schema: pa.Schema) -> pa.Table:
    """``data`` (the table's rows) in the shape after ``ev``; ``new_schema``: the Delta
    columns of ``new`` (delta.arrow_schema). Columns the target keeps (lenient: dropped at
    the source) stay after the source's."""
    if ev.truncate:
        data = data.slice(0, 0)
    cols = {n: data[n] for n in data.column_names}
    for a, b in ev.rename:
        if a in cols:
            cols[b] = cols.pop(a)
    for c in ev.drop:
        cols.pop(c, None)
    fills = decode_row(ev.fill_values) if ev.fill else None
    n = data.num_rows
    for c in ev.add:
        typ = new_schema.field(c).type
        if c in ev.fill:
            # repeated as an Arrow scalar: a value outside Python's datetime (a far date) too
            cols[c] = pa.repeat(fills[c][0], n).cast(typ)
        else:
            cols[c] = pa.nulls(n, typ)
    for a, b in ev.copy:
        if a in cols:
            cols[b] = cols[a].cast(new_schema.field(b).type)
    for c, typ in ev.retype:   # a numeric(p,s) carried as text: shown with its new scale, as the source does
        m = NUMERIC_TYPE.match(typ)
        if c in cols and m and m.group(2) and int(m.group(2)) > 0:
            cols[c] = pa.array([_rescaled(v, int(m.group(2))) for v in cols[c].to_pylist()], pa.string())
    meta = (POS_COLUMN, OP_COLUMN)
    # a widening is an Arrow cast, which raises rather than lose a value
    source = [(f, cols.pop(f.name).cast(f.type)) for f in new_schema if f.name not in meta and f.name in cols]
    ends = [(new_schema.field(m), cols.pop(m)) for m in meta]
    kept = [(pa.field(name, col.type), col) for name, col in cols.items()]   # gone at the source, kept
    columns = source + kept + ends
    return pa.table([c for _, c in columns], schema=pa.schema([f for f, _ in columns]))
