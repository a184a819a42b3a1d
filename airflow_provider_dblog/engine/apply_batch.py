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
from typing import Iterable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .apply_plan import LOCAL, Batch, latest_per_key, plan_table
from .events import DELETE, event_arrow_schema
from .schema import TableSchema
from .targets.base import OP_COLUMN, POS_COLUMN

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
    # could not be carried: no target row has that key
    return pa.table(cols).filter(pc.is_null(latest["error"]))


def stage_and_merge(target, batch: Batch, flat: pa.Table | Iterable[pa.Table], source_name: str,
                    run_id: str, started: float) -> dict:
    """The end of a batch on either path: the target merges the flattened rows (one table,
    or pages of it) and moves its applied position with them (targets/base.py,
    ``merge_batch``). Returns the batch's result counts."""
    res = target.merge_batch(batch.write_schema or batch.schema, flat, source_name, batch.frontier, run_id,
                             evolve=batch.evolve)
    secs = time.monotonic() - started
    return batch.out | {"rows": res.staged, "inserted": res.inserted, "updated": res.updated,
                        "deleted": res.deleted, "stale": res.stale,
                        "status": batch.status,
                        "seconds": round(secs, 3), "stage_s": round(res.stage_s, 3),
                        "merge_s": round(res.merge_s, 3),
                        "rows_per_s": round(batch.events / secs, 1) if secs > 0 else None}


class LocalApplier:
    """Applies batches in this process: pyarrow reads the range's files, keeps the latest
    event per key, and :func:`stage_and_merge` stages and merges them, as on Spark."""

    def __init__(self, target, store, state, source_name: str, run_id: str | None = None):
        self.target, self.store, self.state, self.source_name = target, store, state, source_name
        self.run_id = run_id or uuid.uuid4().hex[:8]

    def read_batch(self, batch: Batch) -> pa.Table:
        schema = event_arrow_schema(batch.schema)
        parts = [pq.read_table(f, filesystem=self.store.fs, schema=schema) for f in batch.files]
        data = pa.concat_tables(parts) if parts else schema.empty_table()
        return data.filter(pc.and_(pc.greater_equal(data["pos"], batch.lo), pc.less(data["pos"], batch.hi)))

    def apply_table(self, schema: TableSchema) -> dict:
        batch = plan_table(self.target, self.store, self.state, self.source_name, schema)
        if batch.result is not None:
            return batch.result | {"via": LOCAL}
        return self.apply_batch(batch)

    def apply_batch(self, batch: Batch) -> dict:
        t0 = time.monotonic()
        flat = flatten(batch.write_schema or batch.schema, latest_per_key(self.read_batch(batch)))
        t_read = time.monotonic() - t0
        out = stage_and_merge(self.target, batch, flat, self.source_name, self.run_id, t0)
        out.update(read_s=round(t_read, 3), via=LOCAL)
        log.info("%s: applied locally %s", batch.schema.qualified, out)
        return out
