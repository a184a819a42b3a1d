"""The orphans of a full dump in a lake table (engine/sweep.py asks each target to delete
them): both lake kinds find them alike, in Arrow, and delete them their own way.
No Spark and no Airflow here."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from ..arrow_values import to_arrow
from ..positions import Position
from ..schema import TableSchema
from ..values import comparable_key
from .base import POS_COLUMN


def orphans(rows: pa.Table, keep: pa.Table, key: list[str], below: Position, table: TableSchema,
            in_source) -> pa.Table:
    """The keys of ``rows`` (the target's keys and positions) below ``below`` that a full
    dump did not see (``keep``) and the source does not hold now (``in_source``)."""
    rows = rows.filter(pc.less(rows[POS_COLUMN], below.encode())).select(key)
    # each key once, though the table holds it twice (a writer behind the apply): one MERGE source row per key
    gone = rows.join(keep.select(key).cast(rows.schema), key, join_type="left anti").group_by(key).aggregate([])
    if gone.num_rows == 0 or in_source is None:
        return gone
    candidates = [tuple(r[k] for k in key) for r in gone.to_pylist()]
    there = in_source(candidates)
    candidates = [c for c in candidates
                  if tuple(comparable_key(t, v) for t, v in zip(table.key_types, c)) not in there]
    return pa.table({k: to_arrow(t, [c[i] for c in candidates]) for i, (k, t) in
                     enumerate(zip(key, table.key_types))}).cast(rows.schema)

