"""Executing one table's batch (planned by engine/apply_plan.py) against a target.

Both paths end the same way: the latest event per key flattened to the table's columns
plus ``_dblog_op`` / ``_dblog_pos`` (:func:`flatten`, or its Spark twin in
``spark_jobs/apply_job.py``), handed to the target's ``merge_batch``, which merges it and
moves the applied position with the rows (targets/base.py; the PostgreSQL target stages
it with ``COPY`` and merges in one transaction, targets/pg_stage.py). So both give the same target rows, and every
guarantee of the merge (position guard, replay idempotence, checkpoint moved with the
rows) holds either way. :class:`LocalApplier` is the in-process path: pyarrow reads the
range's files.

No Spark and no Airflow here.
"""
from __future__ import annotations

import logging
import time
import uuid
from typing import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from .apply_hold import latest_per_key, without
from .apply_plan import LOCAL, Batch, plan_table
from .errors import TargetValueError
from .events import DELETE, event_arrow_schema
from .schema import TableSchema
from .targets.base import OP_COLUMN, POS_COLUMN, MergeResult, append_changelog

log = logging.getLogger(__name__)


def flatten(schema: TableSchema, latest: pa.Table) -> pa.Table:
    """The table's columns (the before image of a delete, the after image otherwise) plus
    ``_dblog_op`` and ``_dblog_pos``: the stage table's rows."""
    is_delete = pc.equal(latest["op"], DELETE)
    before, after = latest["before"].combine_chunks(), latest["after"].combine_chunks()
    cols = {}
    for c in schema.column_names:
        cols[c] = pc.if_else(is_delete, pc.struct_field(before, c), pc.struct_field(after, c))
    cols[OP_COLUMN] = latest["op"]
    cols[POS_COLUMN] = latest["pos"]
    # a latest event with an error below the batch's end (held_at) is a delete whose key
    # could not be carried (no target row has that key), or one whose row changes again past
    # the change of shape the batch ends at (apply_hold.py)
    return pa.table(cols).filter(pc.is_null(latest["error"]))


def stage_and_merge(target, batch: Batch, flat: pa.Table | Iterable[pa.Table], source_name: str,
                    run_id: str, started: float, events: Iterable[pa.Table] = ()) -> dict:
    """The end of a batch on either path: the target merges the flattened rows (one table,
    or pages of it) and moves its applied position with them (targets/base.py,
    ``merge_batch``). A target that keeps changelog tables first appends ``events`` (all
    the batch's events, in position order: targets/changelog.py) to the table's, which
    has its own position (a crash between the two commits re-appends nothing). Returns
    the batch's result counts."""
    logged = {}
    try:
        rows = append_changelog(target, batch.write_schema or batch.schema, events, source_name, batch.frontier,
                            batch.evolve)
        if rows is not None:
            logged["changelog_rows"] = rows
        if batch.evolve is not None and batch.evolve[0].truncate:   # emptied at its end: no row of it stays
            target.advance_applied(source_name, batch.schema, batch.frontier, evolve=batch.evolve)
            res = MergeResult(checkpoint_moved=True)
        else:
            if batch.released is not None:   # refused values whose row changes past the batch's end (apply_hold)
                flat = without(flat, batch.released)
            res = target.merge_batch(batch.write_schema or batch.schema, flat, source_name, batch.frontier, run_id,
                                     evolve=batch.evolve)
    except TargetValueError as e:
        return held(batch.out, e)
    secs = time.monotonic() - started
    uri = target.uri(batch.schema)
    if uri:   # a lake table: its Asset URI and the version this batch made (an Asset event's extra)
        logged |= {"uri": uri, "version": target.version(batch.schema)}
    return batch.out | logged | {"rows": res.staged, "inserted": res.inserted, "updated": res.updated,
                        "deleted": res.deleted, "stale": res.stale,
                        "status": batch.status,
                        "seconds": round(secs, 3), "stage_s": round(res.stage_s, 3),
                        "merge_s": round(res.merge_s, 3),
                        "rows_per_s": round(batch.events / secs, 1) if secs > 0 else None}


def held(out: dict, e: TargetValueError) -> dict:
    """The result of a table whose target refused a value (targets/lake_values.py): its
    applied position where it was, only this table stopped (the run's other tables go
    on), ``held`` naming the table, column, value and why."""
    log.error("apply held: %s", e)
    zero = dict.fromkeys(("files", "events", "rows", "inserted", "updated", "deleted", "stale"), 0)
    return zero | out | {"status": "held", "held": e.held()}


class LocalApplier:
    """Applies batches in this process: pyarrow reads the range's files, keeps the latest
    event per key, and :func:`stage_and_merge` stages and merges them, as on Spark."""
    via = LOCAL

    def __init__(self, target, store, state, source_name: str, run_id: str | None = None):
        self.target, self.store, self.state, self.source_name = target, store, state, source_name
        self.run_id = run_id or uuid.uuid4().hex[:8]

    def read_batch(self, batch: Batch) -> pa.Table:
        schema = event_arrow_schema(batch.schema)
        parts = [pq.read_table(f, filesystem=self.store.fs, schema=schema) for f in batch.files]
        data = pa.concat_tables(parts) if parts else schema.empty_table()
        return data.filter(pc.and_(pc.greater_equal(data["pos"], batch.lo), pc.less(data["pos"], batch.hi)))

    def apply_table(self, schema: TableSchema) -> dict:
        try:
            batch = plan_table(self.target, self.store, self.state, self.source_name, schema)
        except TargetValueError as e:   # a change of shape with no event before it, refused by the target
            return held({}, e) | {"via": LOCAL}
        if batch.result is not None:
            return batch.result | {"via": LOCAL}
        return self.apply_batch(batch)

    def apply_batch(self, batch: Batch) -> dict:
        t0 = time.monotonic()
        events = self.read_batch(batch)
        flat = flatten(batch.write_schema or batch.schema, latest_per_key(events))
        t_read = time.monotonic() - t0
        out = stage_and_merge(self.target, batch, flat, self.source_name, self.run_id, t0, events=ordered(events))
        out.update(read_s=round(t_read, 3), via=LOCAL)
        log.info("%s: applied locally %s", batch.schema.qualified, out)
        return out


# -- a batch's events in position order (a changelog table's append: targets/changelog.py) --
PAGE_ROWS = 8192   # event rows per page read from a file (bounded memory on the Spark driver)


def between(page: pa.Table, lo: str, hi: str) -> pa.Table:
    """The rows with ``lo <= pos < hi`` ("" for lo: from the start)."""
    mask = pc.less(page["pos"], hi)
    if lo:
        mask = pc.and_(mask, pc.greater_equal(page["pos"], lo))
    return page.filter(mask)


def _dedup(page: pa.Table, last: str | None) -> pa.Table:
    """``page`` (sorted by position) without a position seen already: a replayed flush may
    have left the same event in two files."""
    if last is not None:
        page = page.filter(pc.greater(page["pos"], last))
    if page.num_rows > 1:
        pos = page["pos"]
        keep = pc.not_equal(pos.slice(1), pos.slice(0, page.num_rows - 1)).combine_chunks()
        page = page.filter(pa.concat_arrays([pa.array([True]), keep]))
    return page


def ordered(data: pa.Table, rows: int = PAGE_ROWS * 8) -> Iterator[pa.Table]:
    """Events held in memory (the in-process apply's batch) in position order, once each."""
    data = _dedup(data.sort_by([("pos", "ascending")]), None)
    for start in range(0, data.num_rows, rows):
        yield data.slice(start, rows)


class _FileStream:
    """One event file's rows in ``lo <= pos < hi``, sorted by position, a page at a time."""

    def __init__(self, fs, path: str, schema: pa.Schema, lo: str, hi: str, rows: int):
        self.lo, self.hi, self.buf = lo, hi, None
        pos = pq.read_table(path, columns=["pos"], filesystem=fs)["pos"]
        # the tail and the reconciler write each file in position order; a file that is not
        # is read whole and sorted (one file, never the batch)
        in_order = pos.num_chunks == 0 or len(pos) < 2 or pc.all(pc.less(
            pos.slice(0, len(pos) - 1).combine_chunks(), pos.slice(1).combine_chunks())).as_py()
        data = ds.dataset(path, schema=schema, filesystem=fs, format="parquet")
        if in_order:   # the schema fills a column an older file lacks (error) with nulls
            self.pages = (pa.Table.from_batches([b], schema=schema)
                          for b in data.to_batches(batch_size=rows, use_threads=False))
        else:
            self.pages = ordered(data.to_table(), rows)

    def fill(self) -> bool:
        """A non-empty buffer, or False once the file is done."""
        while self.buf is None or self.buf.num_rows == 0:
            page = next(self.pages, None)
            if page is None:
                return False
            self.buf = between(page, self.lo, self.hi)
        return True

    def take(self, bound: str) -> pa.Table:
        """The buffered rows at or below ``bound``."""
        n = pc.sum(pc.less_equal(self.buf["pos"], bound).cast(pa.int64())).as_py() or 0
        out, self.buf = self.buf.slice(0, n), self.buf.slice(n)
        return out


def ordered_events(fs, files: list[str], schema: pa.Schema, lo: str, hi: str,
                   rows: int = PAGE_ROWS) -> Iterator[pa.Table]:
    """The events of ``files`` with ``lo <= pos < hi`` in position order, each once, as
    pages: a merge of the files (each in position order: a log segment, a snapshot), one
    page of each file in memory at a time, never the batch (the Spark apply's driver)."""
    live = [s for s in (_FileStream(fs, f, schema, lo, hi, rows) for f in files) if s.fill()]
    last = None
    while live:
        # every row up to the smallest of the buffers' last positions can go: no file has
        # a row below it that is not buffered already
        bound = min(s.buf["pos"][-1].as_py() for s in live)
        page = _dedup(pa.concat_tables([s.take(bound) for s in live]).sort_by([("pos", "ascending")]), last)
        if page.num_rows:
            last = page["pos"][-1].as_py()
            yield page
        live = [s for s in live if s.fill()]
