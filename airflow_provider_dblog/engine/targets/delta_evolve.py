"""A Delta target table takes a change of its source table's shape
(engine/schema_evolution.py): the table's rows are rewritten in Arrow as the change says
and written back as one overwrite commit (delta.py), which also moves the applied
position to the change. Exact by construction: columns renamed, dropped, widened with an
Arrow cast that refuses to lose a value, added as null or filled with the default the
source gave existing rows, copied (lenient renames), emptied by a TRUNCATE.
No Spark and no Airflow here.
"""
from __future__ import annotations

import pyarrow as pa

from ..arrow_values import decode_row
from ..schema import TableSchema
from ..schema_evolution import Evolution
from .base import OP_COLUMN, POS_COLUMN


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
            value = fills[c][0]
            cols[c] = pa.array([value.as_py()] * n, typ) if n else pa.array([], typ)
        else:
            cols[c] = pa.nulls(n, typ)
    for a, b in ev.copy:
        if a in cols:
            cols[b] = cols[a].cast(new_schema.field(b).type)
    meta = (POS_COLUMN, OP_COLUMN)
    # a widening is an Arrow cast, which raises rather than lose a value
    source = [(f, cols.pop(f.name).cast(f.type)) for f in new_schema if f.name not in meta and f.name in cols]
    ends = [(new_schema.field(m), cols.pop(m)) for m in meta]
    kept = [(pa.field(name, col.type), col) for name, col in cols.items()]   # gone at the source, kept
    columns = source + kept + ends
    return pa.table([c for _, c in columns], schema=pa.schema([f for f, _ in columns]))
