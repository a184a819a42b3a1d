"""A Delta Lake apply target (issue 28), written with delta-rs (``deltalake``): one
current-state Delta table per captured source table, merged by position.

Source table ``shop.orders`` lands in ``<path>/shop__orders``: the source's columns (the
Arrow type of each logical type: decimals as decimals, ``numeric`` and ``text:`` types as
the source's exact text, timestamps as ``timestamp_ntz`` / UTC ``timestamp``),
``_dblog_pos`` (the position of the event that wrote the row) and ``_dblog_op``.

The applied position of each source lives in the table's own commits: every commit this
target makes carries ``dblog.applied.<source>`` in its commit metadata, so the position
moves **in the same Delta commit as the rows** (a crash at any instant neither loses nor
doubles a batch). A batch is **one** MERGE keyed by the primary key: a row is deleted,
updated or inserted only by a newer event (``_dblog_pos`` compared as text: positions
encode in order), so a replayed batch changes nothing. A change of shape (delta_evolve.py)
is one overwrite commit that carries the new position; the batch before it is merged
first without moving the position (a crash between the two re-merges it: nothing
changes). ``path`` is a local path or any URI delta-rs takes (``s3://``, ``gs://``,
``az://``/``abfss://``), with the target's ``storage_options``. The merge's
file pruning, the tables' file size and their maintenance (compaction, vacuum): delta_maintain.py.

No Spark and no Airflow here.
"""
from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any, Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from deltalake import CommitProperties, DeltaTable, write_deltalake
from deltalake.fs import DeltaStorageHandler
from deltalake.exceptions import CommitFailedError, TableNotFoundError

from ..config import TargetConfig
from ..errors import TargetShapeError
from ..events import DELETE as _DELETE
from ..positions import Position
from ..schema import TableSchema
from ..verify_rows import arrow_to_batches
from .base import OP_COLUMN, POS_COLUMN, MergeResult, store_unreachable
from .delta_evolve import evolved
from .delta_keys import collapse, merged, pending, touched_twice
from .delta_maintain import (APPLIED, KeySpan, MaintainReport, applied_in, maintain as maintain_table,
                             quote_name as _q, spooled, store_files, table_configuration)
from .lake_rows import orphans
from .lake_schema import arrow_schema, carried, check_shape
from .lake_values import DELTA_RANGES, ValueGuard, ValueRanges, check_values
from .pg_tables import target_table_name

log = logging.getLogger(__name__)

class DeltaTarget:   # implements targets.base.Target
    folds_case = True   # its column names ignore case (schema_evolution.kept_name_reused)

    def __init__(self, config: TargetConfig):
        self.config = config
        self.root = config.path.removeprefix("file://").rstrip("/")
        self.local = "://" not in self.root   # else an object store (delta-rs's, with these options)
        self.options = dict(config.storage_options) or None

    @staticmethod
    def is_transient(error: BaseException) -> bool:
        """A concurrent commit won the race, or the object store is away: the step is run
        again (from the table's new version)."""
        return isinstance(error, CommitFailedError) or store_unreachable(error)

    def close(self) -> None:
        pass

    def __enter__(self) -> "DeltaTarget":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- tables ----------------------------------------------------------------------
    def table_path(self, table: TableSchema | str) -> str:
        return f"{self.root}/{target_table_name(table)}"

    def _open(self, table: TableSchema | str) -> DeltaTable | None:
        try:
            return DeltaTable(self.table_path(table), storage_options=self.options)
        except TableNotFoundError:
            return None

    def exists(self, table: TableSchema | str) -> bool:
        return DeltaTable.is_deltatable(self.table_path(table), storage_options=self.options)

    def check_table(self, table: TableSchema, names: list[str] | None = None) -> None:
        check_shape(table, "Delta", f"Delta target {self.config.name}", names)

    def ensure_table(self, table: TableSchema) -> bool:
        if self.exists(table):   # (its later shapes are checked as they come: _evolve)
            return False
        self.check_table(table)
        if self.local:
            Path(self.table_path(table)).mkdir(parents=True, exist_ok=True)
        try:
            DeltaTable.create(self.table_path(table), schema=arrow_schema(table), mode="ignore",
                              name=target_table_name(table), configuration=table_configuration(),
                              storage_options=self.options)
        except Exception as e:   # noqa: BLE001 - a type Delta cannot hold: named, never mapped lossily
            raise TargetShapeError(f"{table.qualified}: its columns cannot be a Delta table exactly: {e}; the "
                                   f"table is held on Delta target {self.config.name} (its other tables go on)",
                                   table=table.qualified) from e
        log.info("created Delta table %s", self.table_path(table))
        return True

    def columns(self, table: TableSchema | str) -> list[str]:
        dt = self._open(table)
        return [f.name for f in dt.schema().fields] if dt is not None else []

    def drop_table(self, table: TableSchema) -> None:
        """Empty the table in ``table``'s shape (a quarantined table rebuilt): one overwrite
        commit, so its earlier versions stay readable (time travel), not a deleted directory."""
        dt = self._open(table)
        if dt is not None:
            write_deltalake(dt, arrow_schema(table).empty_table(), mode="overwrite", schema_mode="overwrite")

    def drop_all(self) -> list[str]:
        names = self.table_names()
        for n in names:
            if self.local:
                shutil.rmtree(Path(self.root) / n, ignore_errors=True)
            else:
                pafs.PyFileSystem(DeltaStorageHandler(self.root, self.options)).delete_dir(n)
        return names

    def uri(self, table: TableSchema | str) -> str:
        """The table's Asset URI: its location (``file://`` for a local path)."""
        path = self.table_path(table)
        return path if "://" in path else "file://" + os.path.abspath(path)

    def version(self, table: TableSchema | str) -> int | None:
        """The table's Delta version (an Asset event's ``extra``)."""
        dt = self._open(table)
        return dt.version() if dt is not None else None

    def table_names(self) -> list[str]:
        return [n for n in store_files(self.root, "", self.options, dirs=True)
                if DeltaTable.is_deltatable(f"{self.root}/{n}", storage_options=self.options)]

    def maintain(self, table: TableSchema | str, retention_hours: int = 168, dry_run: bool = False,
                 z_order: bool = False, **kw) -> MaintainReport:
        """Compaction and vacuum of one table (a schema, ``db.table`` or a name from
        :meth:`table_names`): delta_maintain.py; safe beside readers and an apply."""
        path = (f"{self.root}/{table}" if isinstance(table, str) and table in self.table_names()
                else self.table_path(table))
        return maintain_table(path, self.config.source, retention_hours=retention_hours,
                              dry_run=dry_run, z_order=z_order, storage_options=self.options, **kw)

    def count(self, table: TableSchema | str) -> int:
        return self._open(table).to_pyarrow_dataset().count_rows()

    def read(self, table: TableSchema | str) -> pa.Table:
        """The current-state table as Arrow (verification, tests)."""
        return self._open(table).to_pyarrow_table()

    def read_at(self, table: TableSchema, source: str) -> tuple[Position | None, Iterator[pa.Table]]:
        """The rows (verify_rows' batches: the logical types' Arrow form) and the applied
        position of one version of the table (verification)."""
        dt = self._open(table)
        if dt is None:
            return None, iter(())
        pos = applied_in(dt, source, upto=dt.version())
        data = _columns(dt.to_pyarrow_table(columns=[c for c in table.column_names + [POS_COLUMN]
                                                      if c in dt.schema().to_arrow().names]), table)
        return (Position.decode(pos) if pos else None), arrow_to_batches(table, data)

    def rows(self, table: TableSchema, with_pos: bool = False) -> list[dict[str, Any]]:
        names = table.column_names + ([POS_COLUMN] if with_pos else [])
        data = self.read(table).select(names)
        return data.sort_by([(k, "ascending") for k in table.key]).to_pylist()

    # -- the applied position ----------------------------------------------------------
    def _applied(self, dt: DeltaTable, source: str) -> Position | None:
        pos = applied_in(dt, source)   # maintenance commits skipped (delta_maintain.py)
        return Position.decode(pos) if pos else None

    def applied_pos(self, source: str, table: TableSchema | str) -> Position | None:
        dt = self._open(table)
        return self._applied(dt, source) if dt is not None else None

    @staticmethod
    def _commit(source: str, pos: Position | None, **marks: str) -> CommitProperties:
        return CommitProperties(custom_metadata={APPLIED + source: pos.encode() if pos else "", **marks})

    def _settle_keys(self, dt: DeltaTable, table: TableSchema, source: str) -> DeltaTable:
        """A MERGE that touched a key twice and whose collapse never committed (a crash
        between the two commits): collapsed now, the applied position unchanged (delta_keys.py)."""
        twice, since = pending(dt)
        if not twice:
            return dt
        collapse(dt, list(table.key), since, self._commit(source, self._applied(dt, source)), mark=True)
        return self._open(table)

    def advance_applied(self, source: str, table: TableSchema | str, pos: Position,
                        evolve: tuple | None = None) -> bool:
        dt = self._open(table)
        applied = self._applied(dt, source)
        if applied is not None and pos <= applied:
            return False
        if evolve is not None:
            self._evolve(dt, evolve, source, pos)
        else:   # a commit with no rows: only the position moves
            write_deltalake(dt, pa.schema(dt.schema().to_arrow()).empty_table(), mode="append",
                            commit_properties=self._commit(source, pos))
        return True

    def reset_applied(self, source: str, table: TableSchema | str) -> None:
        dt = self._open(table)
        if dt is not None and self._applied(dt, source) is not None:
            write_deltalake(dt, pa.schema(dt.schema().to_arrow()).empty_table(), mode="append",
                            commit_properties=self._commit(source, None))

    def _evolve(self, dt: DeltaTable, evolve: tuple, source: str, pos: Position) -> None:
        ev, new = evolve
        have = pa.schema(dt.schema().to_arrow()).names
        check_shape(new, "Delta", f"Delta target {self.config.name}", carried(new, ev, have))
        data = evolved(dt.to_pyarrow_table(), ev, new, arrow_schema(new))
        # a value Delta cannot hold (e.g. an added column's fill value): refused, never clamped
        check_values(new, data, DELTA_RANGES, f"Delta target {self.config.name}", at=pos.encode())
        write_deltalake(dt, data, mode="overwrite", schema_mode="overwrite",
                        commit_properties=self._commit(source, pos))
        log.info("Delta table %s: %s", dt.table_uri, ev.describe())

    # -- writes --------------------------------------------------------------------------
    def value_ranges(self) -> ValueRanges:
        """The dates it holds (lake_values.DELTA_RANGES), for the apply's planning (targets/base.py)."""
        return ValueRanges(DELTA_RANGES, f"Delta target {self.config.name}")

    def merge_batch(self, table: TableSchema, pages: pa.Table | Iterable[pa.Table], source: str,
                    new_pos: Position, run_id: str, evolve: tuple | None = None) -> MergeResult:
        import time
        t0 = time.monotonic()
        dt = self._settle_keys(self._open(table), table, source)
        applied = self._applied(dt, source)
        names = table.column_names + [POS_COLUMN, OP_COLUMN]
        if applied is not None and new_pos <= applied:   # the batch is in already (a replay): no commit
            return MergeResult()
        target_schema = pa.schema(dt.schema().to_arrow())
        want = pa.schema([target_schema.field(n) for n in names])
        staged, deletes = [0], [0]
        guard = ValueGuard(table, DELTA_RANGES, f"Delta target {self.config.name}")   # (lake_values.py)
        span = KeySpan(list(table.key), want)   # the batch's keys: the bounds that prune files

        def batches():   # the pages read once, spooled, then streamed into the merge
            for page in ([pages] if isinstance(pages, pa.Table) else pages):
                page = page.select(names).cast(want)
                if applied is not None:   # below the position: applied already
                    page = page.filter(pc.greater_equal(page[POS_COLUMN], applied.encode()))
                staged[0] += guard.check(page).num_rows
                deletes[0] += pc.sum(pc.equal(page[OP_COLUMN], _DELETE).cast(pa.int64())).as_py() or 0
                span.add(page)
                yield page
        with spooled(want, batches(), in_memory=isinstance(pages, pa.Table)) as data:
            t1 = time.monotonic()
            staged = staged[0]
            match = " AND ".join(f"t.{_q(k)} = s.{_q(k)}" for k in table.key) + span.predicate("t")
            newer = f"s.{_q(POS_COLUMN)} > t.{_q(POS_COLUMN)}"
            is_delete = f"s.{_q(OP_COLUMN)} = '{_DELETE}'"
            cols = {_q(n): f"s.{_q(n)}" for n in names}
            # the position moves with the rows, unless a change of shape follows (then with it)
            moved = evolve is None
            if not staged:   # nothing to merge: no scan of the table, only the position (if it moves)
                execute = dict
                if moved:
                    write_deltalake(dt, target_schema.empty_table(), mode="append",
                                    commit_properties=self._commit(source, new_pos))
            else:
                since = applied.encode() if applied else None   # (a crash before its collapse: delta_keys.pending)
                merger = dt.merge(data, predicate=match, source_alias="s", target_alias="t",
                                  commit_properties=self._commit(source, new_pos if moved else applied,
                                                                 **merged(staged, deletes[0], since)))
                if not span.misses(dt):   # (keys no file can hold, e.g. new ones past the table's: inserts only)
                    merger = (merger.when_matched_delete(predicate=f"{is_delete} AND {newer}")
                              .when_matched_update(updates=cols, predicate=f"NOT ({is_delete}) AND {newer}"))
                execute = merger.when_not_matched_insert(updates=cols, predicate=f"NOT ({is_delete})").execute
            version = dt.version()
            metrics = guard.run(execute)   # a refused value raised as itself, not as delta-rs's wrapping of it
        if staged and touched_twice(metrics, staged, deletes[0]):   # a key held twice: one row each (delta_keys.py)
            collapse(self._open(table), list(table.key), since, self._commit(source, new_pos if moved else applied))
        if staged and moved and self._open(table).version() == version:
            # every row was stale: delta-rs made no commit, so the position moves alone
            write_deltalake(dt, target_schema.empty_table(), mode="append",
                            commit_properties=self._commit(source, new_pos))
        if evolve is not None:
            self._evolve(self._open(table), evolve, source, new_pos)
            moved = True
        ins, upd, dele = (int(metrics.get(k, 0)) for k in
                          ("num_target_rows_inserted", "num_target_rows_updated", "num_target_rows_deleted"))
        res = MergeResult(inserted=ins, updated=upd, deleted=dele, stale=max(0, staged - ins - upd - dele),
                          staged=staged, checkpoint_moved=moved, stage_s=t1 - t0, merge_s=time.monotonic() - t1)
        log.info("merged %d rows into Delta table %s: %s", staged, self.table_path(table), res)
        return res

    def delete_orphans(self, table: TableSchema, source: str, keep: pa.Table, below: Position,
                       until: Position, in_source=None, before_delete=None) -> int | None:
        """The sweep of a full dump (engine/sweep.py): rows below ``below`` whose key is not in
        ``keep`` and not in the source now, deleted in one commit, once every event below
        ``until`` is applied (a commit racing it fails and the sweep is run again);
        ``before_delete`` gets those rows (every column) before the commit."""
        dt = self._open(table)
        applied = self._applied(dt, source) if dt is not None else None
        if applied is None or applied < until:
            return None
        key = list(table.key)
        gone = orphans(dt.to_pyarrow_table(columns=key + [POS_COLUMN]), keep, key, below, table, in_source)
        if gone.num_rows == 0:
            return 0
        if before_delete is not None:
            from .changelog import rows_of_keys
            before_delete(rows_of_keys(dt.to_pyarrow_dataset(), gone, key, below))
        gone = gone.append_column(POS_COLUMN, pa.array([below.encode()] * gone.num_rows, pa.string()))
        span = KeySpan(key, gone.schema)
        span.add(gone)
        match = " AND ".join(f"t.{_q(k)} = s.{_q(k)}" for k in key) + span.predicate("t")
        metrics = (dt.merge(gone, predicate=match, source_alias="s", target_alias="t",
                            commit_properties=self._commit(source, applied))
                   .when_matched_delete(predicate=f"t.{_q(POS_COLUMN)} < s.{_q(POS_COLUMN)}")
                   .execute())
        return int(metrics.get("num_target_rows_deleted", 0))

    def append_changelog(self, table: TableSchema, events: Iterable[pa.Table], source: str, new_pos: Position,
                         truncated_ts: int | None = None) -> int:
        """The table's changelog table (``changelog: true``): delta_changelog.py."""
        from .delta_changelog import append
        return append(self.root, table, events, source, new_pos, f"Delta target {self.config.name}", truncated_ts,
                      self.options)

    def append_marked(self, table: TableSchema, source: str, op: str, at: Position,
                      images: pa.Table | None = None) -> int:
        """Changelog rows with no log event of their own (base.append_marked): delta_changelog.py."""
        from .delta_changelog import append_marked
        return append_marked(self.root, table, source, op, at, images, f"Delta target {self.config.name}",
                             self.options)


def _columns(data: pa.Table, table: TableSchema) -> pa.Table:
    """``data`` with a null column for each of ``table``'s it lacks (a column dropped since:
    verification leaves such a read out, verify_run)."""
    for name in table.column_names:
        if name not in data.column_names:
            data = data.append_column(name, pa.nulls(data.num_rows))
    return data
