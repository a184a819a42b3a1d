"""What a batch holds back: values that cannot reach a target, "held until a change of the
row at the source".

Two kinds, one rule:

- a value the log could not carry (an event's ``error``, engine/values.py): :func:`held_at`
  ends the batch before the earliest such event that is its key's latest;
- a value the log carries but one target cannot hold (a lake's far date: the target's
  ``value_ranges()``, targets/lake_values.py): that target's merge refuses the batch and the
  table is held there, its applied position unmoved.

Either way a later event of the key (the row fixed at the source, deleted, dumped again)
releases it, **also past the change of shape the batch ends at** (the fix is in the next
batch, which the held one would never reach): :func:`held_at` looks that far, and
``apply_batch.flatten`` drops a batch's latest event with ``error``; :func:`released` names
the batch's latest events with a value the target refuses whose key changes again before
that point, and ``apply_batch.stage_and_merge`` leaves them out of the merge (the target
keeps the key's row as it was until the fix). Nothing here runs on a batch that ends at no
change of shape (the merge's own check is the whole cost) or on a target without ranges.

No Spark and no Airflow here.
"""
from __future__ import annotations

from typing import Iterable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from .events import DELETE
from .positions import Position
from .targets.base import POS_COLUMN


def latest_per_key(data: pa.Table) -> pa.Table:
    """The latest event per key (sort by key, then position descending; keep each key's
    first). A replayed flush's duplicate has the same key and position: one is kept."""
    if data.num_rows <= 1:
        return data
    data = data.sort_by([("key", "ascending"), ("pos", "descending")])
    key = data["key"].combine_chunks()
    first = pc.not_equal(key.slice(1), key.slice(0, len(key) - 1))
    return data.filter(pa.concat_arrays([pa.array([True]), first]))


def held_at(store, files: list[str], lo: str, hi: str, until: str = "") -> tuple[Position | None, str | None]:
    """Where a batch ``lo <= pos < hi`` must stop so that no event whose values could not
    be carried (``error`` set, engine/values.py) reaches a target: (None, None) when none
    would. A target keeps a key's latest event, so the apply stops before the earliest such
    event that is its key's latest up to ``until`` (default ``hi``; ``files`` reach it: the
    run goes on past a change of shape at ``hi``); a later event of the key (the row fixed
    at the source, a re-dump) lets it pass. A delete whose key could not be carried deletes
    nothing: those pass (and are dropped)."""
    # (a file written before events had an ``error`` column reads it as nulls)
    errors = pa.schema([pa.field("error", pa.string())])
    parts = [pq.read_table(f, schema=errors, filesystem=store.fs) for f in files]
    if not any(p["error"].null_count < p.num_rows for p in parts):
        return None, None
    cols = pa.schema([pa.field(c, pa.string()) for c in ("key", "op", "pos", "error")])
    data = pa.concat_tables([pq.read_table(f, schema=cols, filesystem=store.fs) for f in files])
    ceiling, why = max(hi, until), None
    data = data.filter(pc.and_(pc.greater_equal(data["pos"], lo), pc.less(data["pos"], ceiling)))
    while True:
        latest = latest_per_key(data.filter(pc.less(data["pos"], ceiling)))
        bad = latest.filter(pc.and_(pc.is_valid(latest["error"]), pc.not_equal(latest["op"], DELETE)))
        if bad.num_rows == 0:
            break
        first = bad.sort_by([("pos", "ascending")]).slice(0, 1).to_pylist()[0]
        ceiling, why = first["pos"], first["error"]
    return (None, None) if why is None or ceiling >= hi else (Position.decode(ceiling), why)


def released(target, store, files: list[str], lo: str, hi: str, until: str) -> pa.Array | None:
    """The positions of the batch's (``lo <= pos < hi``) latest events with a value
    ``target`` cannot hold (its ``value_ranges()``) whose key has a later event below
    ``until`` (``files`` reach it: past the change of shape the batch ends at): left out of
    the merge, so that the batch is not held for a row already fixed. None when there are
    none, the batch ends at ``until``, or the target holds every value the log carries."""
    ranges = getattr(target, "value_ranges", lambda: None)()   # (a target without ranges holds every value)
    if ranges is None or until <= hi or not files:
        return None
    # first only the positions and the columns with a range; the keys only if a value is refused
    if not any(pc.any(pc.and_(pc.less(p["pos"], hi), p["refused"])).as_py()
               for p in (_refused(ranges, store, f, lo, until, []) for f in files) if p.num_rows):
        return None
    data = pa.concat_tables([_refused(ranges, store, f, lo, until, ["key", "op"]) for f in files])
    latest = latest_per_key(data.filter(pc.less(data["pos"], hi)))
    bad = latest.filter(pc.and_(latest["refused"], pc.not_equal(latest["op"], DELETE)))
    later = data.filter(pc.greater_equal(data["pos"], hi))["key"].combine_chunks()
    out = bad.filter(pc.is_in(bad["key"], value_set=later))["pos"].combine_chunks()
    return out if len(out) else None


def _refused(ranges, store, path: str, lo: str, until: str, more: list[str]) -> pa.Table:
    """The events of one file with ``lo <= pos < until``: ``pos``, ``more`` columns, and
    ``refused`` (a value of its row image outside ``ranges``), reading only the image's
    columns that have a range."""
    schema = pq.read_schema(path, filesystem=store.fs)
    names = ranges.ranged(schema.field("after").type) if "after" in schema.names else []
    cols = {c: ds.field(c) for c in ["pos"] + more} | {f"_{i}": ds.field("after", n) for i, n in enumerate(names)}
    data = ds.dataset(path, filesystem=store.fs, format="parquet").to_table(
        columns=cols, filter=(ds.field("pos") >= lo) & (ds.field("pos") < until))
    refused = (ranges.outside(pa.StructArray.from_arrays([data[f"_{i}"].combine_chunks() for i in range(len(names))],
                                                        names=names))
               if names else pa.array([False] * data.num_rows, pa.bool_()))
    return pa.table({c: data[c].cast(pa.string()) for c in ["pos"] + more} | {"refused": refused})


def without(pages: pa.Table | Iterable[pa.Table], positions: pa.Array) -> pa.Table | Iterable[pa.Table]:
    """A batch's flattened rows (a table, or pages of it) without the rows of ``positions``."""
    def keep(page: pa.Table) -> pa.Table:
        return page.filter(pc.invert(pc.is_in(page[POS_COLUMN], value_set=positions)))
    return keep(pages) if isinstance(pages, pa.Table) else (keep(p) for p in pages)
