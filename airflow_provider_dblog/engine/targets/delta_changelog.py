"""A Delta target's changelog table (changelog.py says what it holds): a sibling
directory of the current-state table, ``<path>/<db>__<table>__changelog``, partitioned by
``commit_date``.

Its position per source is the commit metadata ``dblog.changelog.<source>`` of the newest
commit that carries it, written by the append that moves it: rows and position are one
Delta commit. Each commit also carries an application transaction (``txn``) of the same
name, so two applies appending at once cannot both commit (Delta's conflict check fails the
second: CommitFailedError, which the apply retries from the new position); a blind append
alone would let both in.

Rows with no log event of their own (a sweep's, a rebuild's: changelog.py) are appended in a
commit that carries no position (``dblog.marked``: op and position) but the application
transaction's next version, so it races an append as an append does.

A new column of the source is a new field of the images (``schema_mode="merge"``, in the
append's commit). A widening rewrites the table once in the wider type (an overwrite
commit that keeps the position; its values cast exactly, streamed from the version before),
then appends. A value Delta's readers cannot hold (lake_values.DELTA_RANGES) is null in its
image and named in the row's ``error`` (changelog.py). No Spark and no Airflow here.
"""
from __future__ import annotations

import logging
from itertools import chain
from typing import Iterable

import pyarrow as pa
import pyarrow.dataset as ds
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import TableNotFoundError

from ..positions import Position
from ..schema import TableSchema
from .base import POS_COLUMN
from .changelog import (IMAGES, PARTITION, POSITION_KEY, arrow_relation, changelog_name, changelog_rows,
                        changelog_schema, conform, image_struct, marked_rows, merged_struct, pending)
from .lake_values import DELTA_RANGES

log = logging.getLogger(__name__)
MARK_KEY = "dblog.marked"   # a marked append's commit metadata: "<op> <position>"


def _open(path: str, options: dict | None) -> DeltaTable | None:
    try:
        return DeltaTable(path, storage_options=options)
    except TableNotFoundError:
        return None


def position(dt: DeltaTable, source: str) -> str:
    """The changelog's encoded position for ``source`` ("" if none): the newest commit
    carrying it (a maintenance commit carries none and is passed over)."""
    key, limit = POSITION_KEY + source, 64
    while True:
        history = dt.history(limit)
        for commit in history:   # newest first
            if key in commit:
                return commit[key]
        if len(history) < limit:
            return ""
        limit *= 8


def _commit(dt: DeltaTable, source: str, pos: str | None, mark: str = "") -> CommitProperties:
    """The position ``pos`` (None: none, a marked append's commit, ``mark`` saying what it is)
    and the application transaction's next version."""
    app = POSITION_KEY + source
    return CommitProperties(custom_metadata={app: pos} if pos is not None else {MARK_KEY: mark},
                            app_transactions=[Transaction(app, (dt.transaction_version(app) or 0) + 1)])


def _images(dt: DeltaTable) -> pa.StructType:
    return pa.schema(dt.schema().to_arrow()).field("before").type


def _rewrite(dt: DeltaTable, schema: pa.Schema, source: str, pos: str) -> None:
    """The whole table in ``schema`` (wider image fields), one overwrite commit keeping the
    position; read from the version before, a page at a time."""
    image = schema.field("before").type
    before = dt.to_pyarrow_dataset()   # opened here: delta-rs cannot be called from inside its own write

    def pages():
        for b in before.to_batches():
            cols = [conform(b[n], image) if n in IMAGES else b[n].cast(schema.field(n).type) for n in schema.names]
            yield pa.RecordBatch.from_arrays(cols, schema=schema)
    write_deltalake(dt, pa.RecordBatchReader.from_batches(schema, pages()), mode="overwrite",
                    schema_mode="overwrite", partition_by=[PARTITION], commit_properties=_commit(dt, source, pos))


def _ready(path: str, dt: DeltaTable | None, table: TableSchema, source: str, applied: str, target: str,
           options: dict | None) -> tuple[DeltaTable, pa.Schema, list[str]]:
    """The changelog table made ready for ``table``'s images: created, or its images widened
    (a rewrite keeping the position ``applied``); with its schema and the fields the
    append's commit adds (merged in by it)."""
    struct, added, widened = merged_struct(_images(dt) if dt is not None else None, image_struct(table),
                                           arrow_relation, table.qualified, target)
    schema = changelog_schema(struct)
    if dt is None:
        DeltaTable.create(path, schema=schema, partition_by=[PARTITION], mode="ignore", name=changelog_name(table),
                          storage_options=options)
        dt = _open(path, options)
        log.info("created Delta changelog table %s", path)
    elif widened:
        log.info("Delta changelog table %s: widening %s", path, ", ".join(widened))
        _rewrite(dt, schema, source, applied)
        dt = _open(path, options)
    return dt, schema, added


def append(root: str, table: TableSchema, events: Iterable[pa.Table | pa.RecordBatch], source: str,
           new_pos: Position, target: str, truncated_ts: int | None = None, options: dict | None = None) -> int:
    """Append the events the changelog lacks (below ``new_pos``; with ``truncated_ts``, the
    TRUNCATE at it: changelog.py) and move its position to ``new_pos`` in the same commit;
    rows appended (0: nothing to append, no commit)."""
    path = f"{root}/{changelog_name(table)}"
    dt, hi = _open(path, options), new_pos.encode()
    applied = position(dt, source) if dt is not None else ""
    if applied and hi <= applied:   # a replay: in already
        return 0
    pages = pending(events, applied, hi, truncated_ts, table)
    first = next(pages, None)
    if first is None:   # nothing new: no commit (the next batch's events are past hi anyway)
        return 0
    dt, schema, added = _ready(path, dt, table, source, applied, target, options)
    count = [0]

    def batches():   # a value Delta's readers cannot hold: null and named in the row's error
        for page in chain([first], pages):
            rows = changelog_rows(page, schema, table, DELTA_RANGES, target)
            count[0] += rows.num_rows
            yield from rows.to_batches()
    reader = pa.RecordBatchReader.from_batches(schema, batches())
    write_deltalake(dt, reader, mode="append", schema_mode="merge" if added else None,
                    partition_by=[PARTITION], commit_properties=_commit(dt, source, hi))
    log.info("appended %d events to Delta changelog table %s", count[0], path)
    return count[0]


def append_marked(root: str, table: TableSchema, source: str, op: str, at: Position, images: pa.Table | None,
                  target: str, options: dict | None = None) -> int:
    """Rows with no log event of their own (changelog.marked_rows: ``op`` at ``at``) in a commit
    of their own that leaves the changelog's position where it is; nothing if the changelog
    holds rows of that position and op already (a rerun's). Rows appended."""
    path = f"{root}/{changelog_name(table)}"
    dt = _open(path, options)
    if dt is not None and dt.to_pyarrow_dataset().count_rows(
            filter=(ds.field(POS_COLUMN) == at.encode()) & (ds.field("op") == op)):
        return 0
    if images is not None and not images.num_rows:
        return 0
    dt, schema, added = _ready(path, dt, table, source, position(dt, source) if dt is not None else "", target,
                               options)
    rows = marked_rows(schema, op, at, images)
    write_deltalake(dt, rows, mode="append", schema_mode="merge" if added else None, partition_by=[PARTITION],
                    commit_properties=_commit(dt, source, None, f"{op} {at.encode()}"))
    log.info("appended %d %s rows at %s to Delta changelog table %s", rows.num_rows, op, at, path)
    return rows.num_rows
