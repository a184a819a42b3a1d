"""An Iceberg apply target (issue 28), written with PyIceberg: one current-state Iceberg
table per captured source table, merged by position, copy-on-write.

The catalog is PyIceberg's SQL catalog in a PostgreSQL database (the target's
host/port/user/database or ``conn_id``); the table files live under ``path`` (the
warehouse). Source table ``shop.orders`` is ``<schema>.shop__orders``: the source's
columns (lake_schema.py), ``_dblog_pos`` and ``_dblog_op``; the key is the table's
identifier fields.

The applied position of each source is the table property ``dblog.applied.<source>``,
set **in the same catalog commit** as the rows (a pyiceberg Transaction is one metadata
commit), so a crash at any instant neither loses nor doubles a batch; the snapshots carry
it in their summary too. A batch is merged copy-on-write in one snapshot: the data files
whose key range meets the batch's are read, a row is deleted or replaced only by a newer
event (``_dblog_pos`` compared as text: positions encode in order), and those files are
replaced by files holding their kept rows and the batch's new ones; a batch of new keys
only is appended without rewriting anything. No delete files are ever written, so every
Iceberg reader (PyIceberg included) reads the tables. A replayed batch makes no commit.
A concurrent commit fails ours, never re-based (iceberg_commits.py): the step runs again.
No Spark and no Airflow here."""
from __future__ import annotations

import logging
import os
import time
import uuid
import warnings
from typing import Any, Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError, ValidationException
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import ArrowScan, _dataframe_to_data_files, schema_to_pyarrow
from sqlalchemy.engine import URL
from sqlalchemy.exc import OperationalError

from ..config import TargetConfig
from ..errors import TargetShapeError
from ..events import DELETE as _DELETE
from ..positions import Position
from ..schema import TableSchema
from ..verify_rows import arrow_to_batches
from .base import OP_COLUMN, POS_COLUMN, MergeResult, store_unreachable
from .delta_evolve import evolved
from .iceberg_commits import NO_RETRY, refusing_retries
from .iceberg_evolve import reshape
from .iceberg_rows import affected_files, matched
from .lake_rows import orphans
from .lake_schema import arrow_schema, carried, check_shape
from .lake_values import ICEBERG_RANGES, ValueRanges, check_values
from .pg_tables import target_table_name

log = logging.getLogger(__name__)

_APPLIED = "dblog.applied."   # + source: the table property holding the applied position
FILE_BYTES = 4 << 20
# copy-on-write everywhere: readers never meet delete files
_PROPERTIES = {**NO_RETRY, "format-version": "2", "write.delete.mode": "copy-on-write",
               "write.update.mode": "copy-on-write", "write.merge.mode": "copy-on-write",
               "write.parquet.compression-codec": "zstd",
               # small files: a merge rewrites each file it touches whole (copy-on-write), so its
               # cost follows the rows it changes, not the table (bench/lake.py)
               "write.target-file-size-bytes": str(FILE_BYTES),
               # old metadata files go with each commit (iceberg_maintain.py does the data files)
               "write.metadata.delete-after-commit.enabled": "true", "write.metadata.previous-versions-max": "50"}


def _warehouse(path: str) -> str:
    return path if "://" in path else "file://" + os.path.abspath(path)


class IcebergTarget:   # implements targets.base.Target
    def __init__(self, config: TargetConfig):
        self.config = config
        self.namespace = config.schema
        self._catalog: SqlCatalog | None = None

    @property
    def catalog(self) -> SqlCatalog:
        if self._catalog is None:
            from .postgres import PostgresTarget   # the catalog's database, created if missing
            PostgresTarget(self.config).ensure_database()
            ep = self.config.endpoint
            uri = URL.create("postgresql+psycopg2", username=ep.user, password=ep.password or None,
                             host=ep.host, port=ep.port, database=ep.database)
            # an object-store warehouse (s3://...): its FileIO properties (s3.endpoint, ...)
            self._catalog = SqlCatalog("dblog", uri=uri.render_as_string(hide_password=False),
                                       warehouse=_warehouse(self.config.path), **dict(self.config.storage_options))
            self._catalog.create_namespace_if_not_exists(self.namespace)
        return self._catalog

    @staticmethod
    def is_transient(error: BaseException) -> bool:
        """A concurrent commit won the race (the catalog refused ours; ValidationException: a
        conflict found), or the catalog or object store is away: run again, from the new snapshot."""
        return (isinstance(error, (CommitFailedException, ValidationException, OperationalError))
                or store_unreachable(error))

    def close(self) -> None:
        if self._catalog is not None:
            self._catalog.engine.dispose()
        self._catalog = None

    def __enter__(self) -> "IcebergTarget":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- tables ----------------------------------------------------------------------
    def identifier(self, table: TableSchema | str) -> tuple[str, str]:
        return self.namespace, target_table_name(table)

    def _load(self, table: TableSchema | str, write: bool = False):
        try:
            t = self.catalog.load_table(self.identifier(table))
        except NoSuchTableError:
            return None
        return refusing_retries(t, lambda: self.catalog.load_table(self.identifier(table))) if write else t

    def exists(self, table: TableSchema | str) -> bool:
        return self.catalog.table_exists(self.identifier(table))

    def check_table(self, table: TableSchema, names: list[str] | None = None) -> None:
        check_shape(table, "iceberg", f"Iceberg target {self.config.name}", names)

    def ensure_table(self, table: TableSchema) -> bool:
        if self.exists(table):   # (its later shapes are checked as they come: _evolve)
            return False
        self.check_table(table)
        try:
            txn = self.catalog.create_table_transaction(self.identifier(table), schema=arrow_schema(table),
                                                        properties=_PROPERTIES)
            with txn.update_schema() as update:
                update.set_identifier_fields(*table.key)
            txn.commit_transaction()
        except (ValueError, TypeError) as e:   # a type Iceberg cannot hold: named, never mapped lossily
            raise TargetShapeError(f"{table.qualified}: its columns cannot be an Iceberg table exactly: {e}; the "
                                   f"table is held on Iceberg target {self.config.name} (its other tables go on)",
                                   table=table.qualified) from e
        except Exception:   # noqa: BLE001 - created concurrently
            if self.exists(table):
                return False
            raise
        log.info("created Iceberg table %s.%s", *self.identifier(table))
        return True

    def columns(self, table: TableSchema | str) -> list[str]:
        t = self._load(table)
        return [f.name for f in t.schema().fields] if t is not None else []

    def drop_table(self, table: TableSchema) -> None:
        """Empty the table in ``table``'s shape (a quarantined table rebuilt): one commit,
        so its earlier snapshots stay readable (time travel)."""
        t = self._load(table, write=True)
        if t is None:
            return
        txn = t.transaction()
        reshape(txn, t.schema(), arrow_schema(table), key=table.key)
        if t.current_snapshot() is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")   # "did not match any records": an empty table
                txn.delete(AlwaysTrue())
        txn.commit_transaction()

    def drop_all(self) -> list[str]:
        names = self.table_names()
        for n in names:
            self.catalog.purge_table((self.namespace, n))
        return names

    def count(self, table: TableSchema | str) -> int:
        return self._load(table).scan().count()

    def read(self, table: TableSchema | str, snapshot_id: int | None = None) -> pa.Table:
        """The current-state table as Arrow (verification, tests), or an earlier snapshot."""
        return self._load(table).scan(snapshot_id=snapshot_id).to_arrow()

    def read_at(self, table: TableSchema, source: str) -> tuple[Position | None, Iterator[pa.Table]]:
        """The rows (verify_rows' batches: the logical types' Arrow form) and the applied
        position of one metadata version: its properties and its current snapshot (verification)."""
        t = self._load(table)
        if t is None:
            return None, iter(())
        have = {f.name for f in t.schema().fields}
        data = t.scan(selected_fields=tuple(c for c in (*table.column_names, POS_COLUMN) if c in have)).to_arrow()
        for name in table.column_names:   # a column dropped since: verification leaves such a read out
            data = data if name in have else data.append_column(name, pa.nulls(data.num_rows))
        return self._applied(t, source), arrow_to_batches(table, data)

    def rows(self, table: TableSchema, with_pos: bool = False) -> list[dict[str, Any]]:
        names = table.column_names + ([POS_COLUMN] if with_pos else [])
        data = self.read(table).select(names)
        return data.sort_by([(k, "ascending") for k in table.key]).to_pylist()

    def version(self, table: TableSchema | str) -> int | None:
        """The current snapshot's id (an Asset event's ``extra``), None while empty."""
        snap = self._load(table).current_snapshot()
        return snap.snapshot_id if snap is not None else None

    def uri(self, table: TableSchema | str) -> str:
        """The table's Asset URI: its catalog's database, namespace and name."""
        ep = self.config.endpoint
        return f"iceberg://{ep.host}:{ep.port}/{ep.database}/{self.namespace}/{target_table_name(table)}"

    def table_names(self) -> list[str]:
        return sorted(name for _, name in self.catalog.list_tables(self.namespace))

    def maintain(self, table: TableSchema | str, retention_hours: float = 168, dry_run: bool = False,
                 z_order: bool = False):
        """Compact small files (sorted by key), expire old snapshots, delete unreferenced
        files (iceberg_maintain.py): a report of file counts before and after. ``table``: a
        schema, ``db.table`` or a name from :meth:`table_names`. (Files are always sorted by
        key: ``z_order`` changes nothing here.)"""
        from .iceberg_maintain import maintain
        name = table if isinstance(table, str) and table in self.table_names() else target_table_name(table)
        load = lambda: self.catalog.load_table((self.namespace, name))   # noqa: E731
        return maintain(load() if dry_run else refusing_retries(load(), load), retention_hours, dry_run)

    # -- the applied position ----------------------------------------------------------
    @staticmethod
    def _applied(t, source: str) -> Position | None:
        value = t.properties.get(_APPLIED + source)
        return Position.decode(value) if value else None

    def applied_pos(self, source: str, table: TableSchema | str) -> Position | None:
        t = self._load(table)
        return self._applied(t, source) if t is not None else None

    def advance_applied(self, source: str, table: TableSchema | str, pos: Position,
                        evolve: tuple | None = None) -> bool:
        t = self._load(table, write=True)
        applied = self._applied(t, source)
        if applied is not None and pos <= applied:
            return False
        txn = t.transaction()
        if evolve is not None:
            self._evolve(txn, t, evolve, source, pos)
        txn.set_properties({_APPLIED + source: pos.encode()})
        txn.commit_transaction()
        return True

    def reset_applied(self, source: str, table: TableSchema | str) -> None:
        t = self._load(table, write=True)
        if t is not None and self._applied(t, source) is not None:
            t.transaction().remove_properties(_APPLIED + source).commit_transaction()

    def _evolve(self, txn, t, evolve: tuple, source: str, pos: Position) -> None:
        """The rows rewritten in the new shape, in ``txn`` (one commit with the position)."""
        ev, new = evolve
        check_shape(new, "iceberg", f"Iceberg target {self.config.name}", carried(new, ev, t.schema().column_names))
        data = evolved(t.scan().to_arrow(), ev, new, arrow_schema(new))
        check_values(new, data, ICEBERG_RANGES, f"Iceberg target {self.config.name}", at=pos.encode())
        reshape(txn, t.schema(), data.schema, ev.rename, new.key)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # "did not match any records": an empty table
            txn.overwrite(data, snapshot_properties={_APPLIED + source: pos.encode()})
        log.info("Iceberg table %s: %s", t.name(), ev.describe())

    # -- writes --------------------------------------------------------------------------
    def _file_schema(self, t) -> pa.Schema:
        return schema_to_pyarrow(t.schema(), include_field_ids=False)

    def _rewrite(self, txn, t, replaced: list, added: pa.Table | None, props: dict) -> None:
        """One snapshot of ``txn``: each ``(task, keep mask)`` of ``replaced`` swapped for a file
        of its kept rows (read and written one file at a time), and ``added``'s rows in new
        files; a plain append when nothing is replaced (copy-on-write: no delete files)."""
        full = self._reader(t, None)
        schema = self._file_schema(t)
        new_files = []
        for task, keep in replaced:
            rows = full.to_table(tasks=[task]).cast(schema).filter(keep)
            if rows.num_rows:   # a file's rows stay in its order (sorted by key when written)
                new_files += _dataframe_to_data_files(table_metadata=txn.table_metadata, df=rows, io=t.io,
                                                      write_uuid=uuid.uuid4())
        if added is not None and added.num_rows:
            new_files += _dataframe_to_data_files(table_metadata=txn.table_metadata, df=added, io=t.io,
                                                  write_uuid=uuid.uuid4())
        if not replaced:
            if new_files:
                with txn.update_snapshot(snapshot_properties=props).fast_append() as snapshot:
                    for f in new_files:
                        snapshot.append_data_file(f)
            return
        with txn.update_snapshot(snapshot_properties=props).overwrite() as snapshot:
            for task, _ in replaced:
                snapshot.delete_data_file(task.file)
            for f in new_files:
                snapshot.append_data_file(f)

    @staticmethod
    def _reader(t, columns: list[str] | None) -> ArrowScan:
        projected = t.schema() if columns is None else t.schema().select(*columns)
        return ArrowScan(table_metadata=t.metadata, io=t.io, projected_schema=projected, row_filter=AlwaysTrue())

    def _read_files(self, t, tasks, columns: list[str]) -> list[pa.Table]:
        """``columns`` of each data file of ``tasks`` (the key and position: what a merge matches on)."""
        reader, schema = self._reader(t, columns), self._file_schema(t)
        want = pa.schema([schema.field(c) for c in columns])
        return [reader.to_table(tasks=[task]).cast(want) for task in tasks]

    def value_ranges(self) -> ValueRanges:
        """The dates and timestamps it holds (lake_values.ICEBERG_RANGES), for the apply's planning."""
        return ValueRanges(ICEBERG_RANGES, f"Iceberg target {self.config.name}")

    def merge_batch(self, table: TableSchema, pages: pa.Table | Iterable[pa.Table], source: str,
                    new_pos: Position, run_id: str, evolve: tuple | None = None) -> MergeResult:
        t0 = time.monotonic()
        t = self._load(table, write=True)
        applied = self._applied(t, source)
        if applied is not None and new_pos <= applied:   # the batch is in already (a replay): no commit
            return MergeResult()
        names = table.column_names + [POS_COLUMN, OP_COLUMN]
        schema = self._file_schema(t)
        want = pa.schema([schema.field(n) for n in names])
        batch = pa.concat_tables([p.select(names).cast(want) for p in
                                  ([pages] if isinstance(pages, pa.Table) else pages)] or [want.empty_table()])
        if applied is not None:   # below the position: applied already
            batch = batch.filter(pc.greater_equal(batch[POS_COLUMN], applied.encode()))
        check_values(table, batch, ICEBERG_RANGES, f"Iceberg target {self.config.name}")   # before any file
        t1 = time.monotonic()
        key = list(table.key)
        tasks = affected_files(t, batch, key) if batch.num_rows else []
        m = matched(batch, self._read_files(t, tasks, key + [POS_COLUMN]), key)
        # rows written: new keys and newer updates; kept columns (lenient) keep the old row's value
        written = batch.filter(m.write)
        kept_cols = [n for n in schema.names if n not in names]
        if kept_cols and written.num_rows:
            written = m.with_kept(written, self._read_files(t, tasks, kept_cols), kept_cols)
        written = written.select(schema.names).cast(schema).sort_by([(k, "ascending") for k in key]) \
            if written.num_rows else None
        moved = evolve is None
        shown = new_pos if moved else applied   # the snapshot summary's position
        props = {_APPLIED + source: shown.encode() if shown else ""}
        txn = t.transaction()
        self._rewrite(txn, t, [(task, keep) for task, keep in zip(tasks, m.keep_masks) if not pc.all(keep).as_py()],
                      written, props)
        if moved:
            txn.set_properties({_APPLIED + source: new_pos.encode()})
        txn.commit_transaction()
        if evolve is not None:   # a second commit: the new shape with the position (a crash between re-merges: no change)
            t = self._load(table, write=True)
            txn = t.transaction()
            self._evolve(txn, t, evolve, source, new_pos)
            txn.set_properties({_APPLIED + source: new_pos.encode()})
            txn.commit_transaction()
            moved = True
        res = MergeResult(inserted=m.inserted, updated=m.updated, deleted=m.deleted, stale=m.stale,
                          staged=batch.num_rows, checkpoint_moved=moved, stage_s=t1 - t0,
                          merge_s=time.monotonic() - t1)
        log.info("merged %d rows into Iceberg table %s: %s", batch.num_rows, t.name(), res)
        return res

    def delete_orphans(self, table: TableSchema, source: str, keep: pa.Table, below: Position,
                       until: Position, in_source=None, before_delete=None) -> int | None:
        """The sweep of a full dump (engine/sweep.py): rows below ``below`` whose key is not in
        ``keep`` and not in the source now, deleted in one commit, once every event below
        ``until`` is applied (a commit racing it fails and the sweep is run again);
        ``before_delete`` gets those rows (every column) before the commit."""
        t = self._load(table, write=True)
        applied = self._applied(t, source) if t is not None else None
        if applied is None or applied < until:
            return None
        key = list(table.key)
        gone = orphans(t.scan(selected_fields=tuple(key + [POS_COLUMN])).to_arrow(), keep, key, below,
                       table, in_source)
        if gone.num_rows == 0:
            return 0
        tasks = affected_files(t, gone, key)
        marks = gone.append_column(POS_COLUMN, pa.array([below.encode()] * gone.num_rows, pa.string()))
        marks = marks.append_column(OP_COLUMN, pa.array([_DELETE] * gone.num_rows, pa.string()))
        names = key + [POS_COLUMN] if before_delete is None else self._file_schema(t).names
        files = self._read_files(t, tasks, names)
        m = matched(marks, files, key)
        replaced = [(task, keep) for task, keep in zip(tasks, m.keep_masks) if not pc.all(keep).as_py()]
        if not replaced:
            return 0
        if before_delete is not None:
            before_delete(pa.concat_tables([f.filter(pc.invert(k)) for f, k in zip(files, m.keep_masks)]))
        txn = t.transaction()
        self._rewrite(txn, t, replaced, None, {_APPLIED + source: applied.encode()})
        txn.commit_transaction()
        return sum(len(k) - pc.sum(k.cast(pa.int64())).as_py() for _, k in replaced)   # rows, not keys (as Delta)

    def append_changelog(self, table: TableSchema, events: Iterable[pa.Table], source: str, new_pos: Position,
                         truncated_ts: int | None = None) -> int:
        """The table's changelog table (``changelog: true``): iceberg_changelog.py."""
        from .iceberg_changelog import append
        return append(self.catalog, self.namespace, table, events, source, new_pos,
                      f"Iceberg target {self.config.name}", truncated_ts)

    def append_marked(self, table: TableSchema, source: str, op: str, at: Position,
                      images: pa.Table | None = None) -> int:
        """Changelog rows with no log event of their own (base.append_marked): iceberg_changelog.py."""
        from .iceberg_changelog import append_marked
        return append_marked(self.catalog, self.namespace, table, source, op, at, images,
                             f"Iceberg target {self.config.name}")
