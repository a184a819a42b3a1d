"""Planning a dump request's chunks (Algorithm 1's step 1): the next chunk of a request from
its progress, a key range of the source's chunk plan or a slice of its key list, and a
table's end (its orphan sweep registered: engine/sweep.py). Used by dump.DumpRunner."""
from __future__ import annotations

import time

from .chunks import ChunkTask
from .requests import DumpSpec
from .schema import TableSchema
from .sources.base import Source
from .state import RedisState
from .sweep import orphan_sweep


class ChunkPlanner:
    def __init__(self, source: Source, state: RedisState):
        self.source, self.state = source, state

    def next_chunk(self, rid: str, spec: DumpSpec) -> ChunkTask | None:
        """The request's next chunk, from the progress of its last completed chunk."""
        for table in spec.tables:
            schema = self.source.table_schema(table)
            task = (self._next_keys(rid, spec, schema) if spec.by_keys
                    else self._next_range(rid, spec, schema))
            if task is not None:
                return task
        return None

    def successor(self, rid: str, spec: DumpSpec, task: ChunkTask, progress: dict) -> ChunkTask | None:
        """The chunk ``next_chunk`` gives once ``task`` has completed, planned while it still
        finishes (engine/dump_ahead.py): its table's next key range from ``task``'s end, or
        its next slice of keys. None after a table's last chunk (the next table's start
        writes progress: ``next_chunk`` plans it) or when no rows are left. ``progress``: the
        table's, read before ``task`` completed (read after, ``done_keys`` counts its keys)."""
        if task.last:
            return None
        schema = self.source.table_schema(task.table)
        if task.keys is not None:
            start = progress["done_keys"] + len(task.keys)
            batch = spec.keys[start:start + spec.chunk_size]
            return ChunkTask(rid, task.table, keys=batch, last=start + len(batch) >= len(spec.keys)) if batch else None
        upto = schema.decode_key(progress["max_key"])
        return self._range_after(rid, spec, schema, schema.decode_key(task.end), upto)

    def _range_after(self, rid: str, spec: DumpSpec, schema: TableSchema, after: tuple | None,
                     upto: tuple) -> ChunkTask | None:
        plan = self.source.plan_chunk(schema, after, upto, spec.chunk_size, spec.parallelism)
        if plan is None:
            return None
        return ChunkTask(rid, schema.qualified, predicates=self.source.range_predicates(schema, plan),
                         end=schema.encode_key(plan.end), last=plan.end == upto)

    def _next_range(self, rid: str, spec: DumpSpec, schema: TableSchema) -> ChunkTask | None:
        progress = self.state.progress(rid, schema.qualified)
        if progress.get("done"):
            return None
        if "max_key" not in progress:  # captured once, when the table's dump starts
            # the log head before the max key read bounds the orphan sweep (sweep.py); the
            # shapes marked first, so that a change of shape before it is a version below it
            self.source.mark_shapes()
            before, _ = self.source.current_resume()
            top = self.source.max_key(schema)
            progress = {"max_key": schema.encode_key(top) if top is not None else None, "last_key": None,
                        "chunks": 0, "rows": 0, "dropped": 0, "started_at": time.time(),
                        "head_before": before.encode()}
            self.state.save_progress(rid, schema.qualified, progress)
        if progress["max_key"] is None:
            return self._table_done(rid, spec, schema, progress, end_read=True)
        upto = schema.decode_key(progress["max_key"])
        after = schema.decode_key(progress["last_key"]) if progress["last_key"] else None
        task = self._range_after(rid, spec, schema, after, upto)
        if task is None:  # the rows up to the max key are gone
            return self._table_done(rid, spec, schema, progress, end_read=True)
        return task

    def _next_keys(self, rid: str, spec: DumpSpec, schema: TableSchema) -> ChunkTask | None:
        progress = self.state.progress(rid, schema.qualified)
        if progress.get("done"):
            return None
        if not progress:
            progress = {"done_keys": 0, "chunks": 0, "rows": 0, "dropped": 0, "missing": [],
                        "missing_count": 0, "started_at": time.time()}
            self.state.save_progress(rid, schema.qualified, progress)
        start = progress["done_keys"]
        if start >= len(spec.keys):
            return self._table_done(rid, spec, schema, progress)
        batch = spec.keys[start:start + spec.chunk_size]
        return ChunkTask(rid, schema.qualified, keys=batch, last=start + len(batch) >= len(spec.keys))

    def _table_done(self, rid: str, spec: DumpSpec, schema: TableSchema, progress: dict,
                    end_read: bool = False) -> None:
        """``end_read``: a read of the source just found no more rows (the sweep waits for
        the log up to here)."""
        if end_read and "head_before" in progress:
            progress["head_end"] = self.source.current_resume()[0].encode()
        progress["done"] = True
        self.state.save_progress(rid, schema.qualified, progress)
        sweep = None if spec.verify else orphan_sweep(rid, schema.qualified, progress)   # a verify deletes nothing
        if sweep is not None:
            self.state.add_sweep(sweep)
        return None
