"""Row arithmetic of the Iceberg target's copy-on-write merge (iceberg.py), in Arrow: which
data files a batch's keys can meet (their column bounds) and which of their rows a batch
replaces by position. No Spark and no Airflow here."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import AlwaysTrue, And, GreaterThanOrEqual, LessThanOrEqual
from pyiceberg.expressions.visitors import bind

from ..events import DELETE
from .base import OP_COLUMN, POS_COLUMN

_F, _R, _B, _TPOS = "__dblog_file", "__dblog_row", "__dblog_batch", "__dblog_tpos"


def key_bounds(schema, keys: pa.Table, key: list[str]):
    """A filter on the key columns' ranges in ``keys`` that Iceberg prunes data files by (their
    column bounds); a column whose bounds cannot be a literal exactly (floats: NaN sorts
    outside min/max) is left out, and with none, every file."""
    expr = AlwaysTrue()
    for k in key:
        col = keys[k]
        if pa.types.is_floating(col.type) or pa.types.is_boolean(col.type) or col.null_count:
            continue
        try:
            lo, hi = pc.min_max(col).values()
            part = And(GreaterThanOrEqual(k, lo.as_py()), LessThanOrEqual(k, hi.as_py()))
            bind(schema, part, case_sensitive=True)   # the literals fit the column's type
        except Exception:   # noqa: BLE001 - e.g. a timestamp outside Python's datetime: no pruning
            continue
        expr = part if isinstance(expr, AlwaysTrue) else And(expr, part)
    return expr


def affected_files(t, keys: pa.Table, key: list[str]) -> list:
    """The scan tasks (data files) of ``t`` whose key ranges meet ``keys``'s."""
    return list(t.scan(row_filter=key_bounds(t.schema(), keys, key)).plan_files())


@dataclass
class Matched:
    write: np.ndarray                 # batch rows to write (new keys, newer updates)
    keep_masks: list[pa.Array]        # per file: its rows that stay
    old_row: np.ndarray               # per batch row: the global index of the row it replaces, or -1
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    stale: int = 0
    offsets: list[int] = field(default_factory=list)

    def with_kept(self, written: pa.Table, files: list[pa.Table], kept: list[str]) -> pa.Table:
        """``written`` (the batch rows of ``write``) with the columns the target keeps
        (lenient) taken from the rows they replace (null for new keys)."""
        old = pa.concat_tables([f.select(kept) for f in files]) if files else None
        idx = self.old_row[self.write]
        take = pa.array(idx, pa.int64(), mask=idx < 0)
        for name in kept:
            values = old[name].take(take) if old is not None else pa.nulls(written.num_rows)
            written = written.append_column(name, values)
        return written


def matched(batch: pa.Table, files: list[pa.Table], key: list[str]) -> Matched:
    """The merge by position of ``batch`` (latest event per key, with ``_dblog_pos`` and
    ``_dblog_op``) into the rows of ``files``: a row is replaced or deleted only by a newer
    event (invariant 1); a delete of an absent key and an older event are stale."""
    n = batch.num_rows
    offsets = list(np.cumsum([0] + [f.num_rows for f in files]))
    if files:
        old = pa.concat_tables([
            f.select(key + [POS_COLUMN]).rename_columns(key + [_TPOS])
            .append_column(_F, pa.array(np.full(f.num_rows, i, np.int64)))
            .append_column(_R, pa.array(np.arange(f.num_rows, dtype=np.int64))) for i, f in enumerate(files)])
    else:
        old = None
    b = batch.select(key + [POS_COLUMN, OP_COLUMN]).append_column(_B, pa.array(np.arange(n, dtype=np.int64)))
    if old is not None and old.num_rows:
        j = b.join(old.cast(pa.schema([old.schema.field(k).with_type(b.schema.field(k).type) if k in key
                                       else old.schema.field(k) for k in old.column_names])),
                   keys=key, join_type="left outer")
    else:
        j = b.append_column(_TPOS, pa.nulls(n, pa.string())).append_column(_F, pa.nulls(n, pa.int64())) \
             .append_column(_R, pa.nulls(n, pa.int64()))
    has = pc.is_valid(j[_TPOS])
    newer = pc.fill_null(pc.and_(has, pc.greater(j[POS_COLUMN], j[_TPOS])), False)
    is_delete = pc.equal(j[OP_COLUMN], DELETE)
    write_rows = pc.or_(pc.and_(pc.invert(has), pc.invert(is_delete)), pc.and_(newer, pc.invert(is_delete)))
    write = np.zeros(n, bool)
    write[j[_B].filter(write_rows).to_numpy()] = True
    old_row = np.full(n, -1, np.int64)
    replaced = j.filter(newer)
    f_idx, r_idx = replaced[_F].to_numpy(), replaced[_R].to_numpy()
    old_row[replaced[_B].to_numpy()] = np.asarray(offsets[:-1], np.int64)[f_idx] + r_idx if len(f_idx) else []
    masks = []
    for i, f in enumerate(files):
        keep = np.ones(f.num_rows, bool)
        keep[r_idx[f_idx == i]] = False
        masks.append(pa.array(keep))
    # batch rows, each once (a key the table holds twice joins twice)
    count = lambda m: len(np.unique(j[_B].filter(m).to_numpy()))   # noqa: E731
    inserted = count(pc.and_(pc.invert(has), pc.invert(is_delete)))
    updated, deleted = count(pc.and_(newer, pc.invert(is_delete))), count(pc.and_(newer, is_delete))
    return Matched(write=write, keep_masks=masks, old_row=old_row, inserted=inserted, updated=updated,
                   deleted=deleted, stale=n - inserted - updated - deleted, offsets=offsets)
