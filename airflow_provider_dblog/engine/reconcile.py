"""The watermark window reconciler: steps 6 and 7 of the paper's Algorithm 1.

Given the chunk rows selected between LW and HW and the log events of the same
table inside (LW, HW), drop every chunk row whose key changed in the window (the
log holds a newer version) and emit the survivors as snapshot events at the HW
position, in key order. Position-based, so the tail never pauses (invariant 3).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from .events import DELETE, SNAPSHOT, images_to_arrow, event_arrow_schema, position_range
from .keys import value_keys
from .positions import Position
from .schema import TableSchema


@dataclass
class ReconcileResult:
    events: pa.Table  # event schema: snapshot rows, then deletes for missing keys
    selected: int
    kept: int
    dropped: int  # chunk rows dropped as stale: their key changed inside the window
    missing: list[tuple] = field(default_factory=list)  # requested keys absent at HW


# the chunk rows' optional column naming values that could not be carried (values.py)
ERROR_COLUMN = "_dblog_error"


def conform_rows(table: TableSchema, rows: pa.Table) -> pa.Table:
    """Chunk rows in the table's column order and logical types (plus ERROR_COLUMN),
    sorted by key."""
    missing = set(table.column_names) - set(rows.column_names)
    if missing:
        raise ValueError(f"chunk of {table.qualified} lacks columns {sorted(missing)}")
    errors = (rows[ERROR_COLUMN] if ERROR_COLUMN in rows.column_names
              else pa.nulls(rows.num_rows, pa.string()))
    rows = rows.select(table.column_names).cast(pa.schema(list(table.row_struct())))
    rows = rows.append_column(ERROR_COLUMN, errors)
    return rows.sort_by([(k, "ascending") for k in table.key])


def row_keys(table: TableSchema, rows: pa.Table) -> pa.Array:
    return table.key_array([rows[k] for k in table.key])


def _before_keys(table: TableSchema, events: pa.Table) -> set[str]:
    """Keys the window's events moved rows away from: an update of the key itself
    changes the old key too, whether or not the source split it into delete+insert."""
    before = events["before"].combine_chunks() if events.num_rows else None
    if before is None or before.null_count == len(before):
        return set()
    before = before.filter(before.is_valid())
    return set(table.key_array([before.field(k) for k in table.key]).to_pylist())


def reconcile(table: TableSchema, chunk: pa.Table, window_events: pa.Table, hw: Position,
              requested_keys: Sequence[tuple] | None = None, source_ts: int = 0,
              equal_keys: Callable[[list[tuple], list[str]], set[int]] | None = None) -> ReconcileResult:
    """``window_events``: this table's log events with LW < pos < HW (event schema).
    ``equal_keys(candidates, known)``: which requested keys not found by their text the
    source's own ``=`` takes for a key it has (``known``: key strings; Source.equal_keys)."""
    changed = set(window_events["key"].to_pylist()) | _before_keys(table, window_events)
    rows = conform_rows(table, chunk)
    keys = row_keys(table, rows)
    # keys matched as the database matches them (an interval's texts: keys.value_keys)
    changed_v = value_keys(pa.array(sorted(changed), pa.string()), table.key_types)
    keys_v = value_keys(keys, table.key_types)
    keep = pc.invert(pc.is_in(keys_v, value_set=changed_v))
    survivors = rows.filter(keep)
    kept_keys = keys.filter(keep)

    missing: list[tuple] = []
    if requested_keys is not None:
        # a requested key the source holds under another text is not missing: its delete
        # would remove, in a target matching keys by value, the row just selected
        known = set(keys_v.to_pylist()) | set(changed_v.to_pylist())
        wanted = value_keys(pa.array([table.encode_key(k) for k in requested_keys], pa.string()),
                            table.key_types).to_pylist()
        missing = [key for key, v in zip(requested_keys, wanted) if v not in known]
        if missing and equal_keys is not None:
            same = equal_keys(missing, sorted(set(keys.to_pylist()) | changed))
            missing = [key for i, key in enumerate(missing) if i not in same]

    schema = event_arrow_schema(table)
    row_type = table.row_struct()
    n = survivors.num_rows
    after = pa.StructArray.from_arrays([survivors[c].combine_chunks() for c in table.column_names],
                                       fields=list(row_type)) if n else pa.array([], row_type)
    snap = pa.table({
        "table": pa.array([table.qualified] * n, pa.string()),
        "op": pa.array([SNAPSHOT] * n, pa.string()),
        "key": kept_keys,
        "before": pa.nulls(n, row_type),
        "after": after,
        "pos": position_range(hw.with_seq(hw.seq + 1), n),
        "source_ts": pa.array([source_ts] * n, pa.int64()),
        "error": survivors[ERROR_COLUMN].combine_chunks() if n else pa.nulls(0, pa.string()),
    }, schema=schema)
    if missing:
        images = [dict(zip(table.key, key)) | {c: None for c in table.column_names if c not in table.key}
                  for key in missing]
        deletes = pa.table({
            "table": [table.qualified] * len(missing),
            "op": [DELETE] * len(missing),
            "key": [table.encode_key(k) for k in missing],
            "before": images_to_arrow(table, images),
            "after": pa.nulls(len(missing), row_type),
            "pos": position_range(hw.with_seq(hw.seq + 1 + n), len(missing)),
            "source_ts": [source_ts] * len(missing),
            "error": pa.nulls(len(missing), pa.string()),
        }, schema=schema)
        snap = pa.concat_tables([snap, deletes])
    return ReconcileResult(snap, rows.num_rows, n, rows.num_rows - n, missing)
