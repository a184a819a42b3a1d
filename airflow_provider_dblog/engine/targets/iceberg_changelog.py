"""An Iceberg target's changelog table (changelog.py says what it holds):
``<schema>.<db>__<table>__changelog`` in the target's catalog, identity-partitioned on
``commit_date``, append-only (fast appends: no delete files, no rewrites).

Its position per source is the table property ``dblog.changelog.<source>``, set in the
same transaction (one catalog commit) as the snapshot that appends the rows; the snapshot's
summary carries it too. A concurrent commit fails ours (CommitFailedException): the apply
runs the step again from the new position.

Rows with no log event of their own (a sweep's, a rebuild's: changelog.py) are a snapshot of
their own (summary ``dblog.marked``: op and position) that leaves the property as it is.

The images' struct evolves in the same transaction: a new column is a new nested field;
a widening is an Iceberg promotion (int -> long, float -> double, a decimal's precision);
a widening Iceberg cannot promote in place (a decimal's scale) or a type that holds
neither is refused (TargetValueError) rather than rewritten lossily. The pages are written
to data files one at a time (never the batch in memory), then committed as one snapshot.
No Spark and no Airflow here.
"""
from __future__ import annotations

import logging
import uuid
from itertools import chain
from typing import Iterable

import pyarrow as pa
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.expressions import And, EqualTo
from pyiceberg.io.pyarrow import _dataframe_to_data_files, schema_to_pyarrow

from ..positions import Position
from ..schema import TableSchema
from .lake_values import ICEBERG_RANGES
from .base import POS_COLUMN
from .changelog import (PARTITION, POSITION_KEY, changelog_name, changelog_rows, changelog_schema, image_struct,
                        marked_rows, merged_struct, pending)
from .iceberg_commits import NO_RETRY, refusing_retries
from .iceberg_evolve import _promotes, iceberg_schema

log = logging.getLogger(__name__)
MARK_KEY = "dblog.marked"   # a marked append's snapshot summary: "<op> <position>"

PROPERTIES = {**NO_RETRY, "format-version": "2", "write.parquet.compression-codec": "zstd",
              "write.metadata.delete-after-commit.enabled": "true", "write.metadata.previous-versions-max": "50"}


def _iceberg_type(t: pa.DataType):
    return iceberg_schema(pa.schema([pa.field("x", t)])).fields[0].field_type


def iceberg_relation(old: pa.DataType, new: pa.DataType) -> str | None:
    """changelog.Relation in Iceberg's terms: types compared as Iceberg holds them (an
    int16 and an int32 are both ``int``), a widening only where Iceberg promotes in place."""
    a, b = _iceberg_type(old), _iceberg_type(new)
    if a == b:
        return "same"
    if _promotes(a, b):
        return "widen"
    if _promotes(b, a):
        return "holds"
    return None


def _create(catalog, ident: tuple[str, str], schema: pa.Schema):
    try:
        txn = catalog.create_table_transaction(ident, schema=schema, properties=PROPERTIES)
        with txn.update_spec() as spec:
            spec.add_identity(PARTITION)
        txn.commit_transaction()
        log.info("created Iceberg changelog table %s.%s", *ident)
    except Exception:   # noqa: BLE001 - created concurrently: use it; else the error stands
        if not catalog.table_exists(ident):
            raise
    return catalog.load_table(ident)


def _ready(catalog, ident: tuple[str, str], t, table: TableSchema, target: str):
    """``(table, transaction, schema)``: the changelog table (created if absent) and a
    transaction whose first step takes ``table``'s images into its struct (new fields,
    promotions), with the changelog schema after it."""
    current = schema_to_pyarrow(t.schema(), include_field_ids=False).field("before").type if t is not None else None
    struct, added, widened = merged_struct(current, image_struct(table), iceberg_relation, table.qualified, target)
    if t is None:
        t = _create(catalog, ident, changelog_schema(struct))
    t = refusing_retries(t, lambda: catalog.load_table(ident))   # exactly once: never re-based on another's append
    txn = t.transaction()
    if added or widened:
        with txn.update_schema() as update:
            for image in ("before", "after"):
                for name in widened:
                    update.update_column((image, name), field_type=_iceberg_type(struct.field(name).type))
                for name in added:   # optional: earlier rows hold null
                    update.add_column((image, name), _iceberg_type(struct.field(name).type), required=False)
        log.info("Iceberg changelog table %s.%s: added %s, widened %s", *ident, added, widened)
    return t, txn, changelog_schema(struct)


def append(catalog, namespace: str, table: TableSchema, events: Iterable[pa.Table | pa.RecordBatch],
           source: str, new_pos: Position, target: str, truncated_ts: int | None = None) -> int:
    """Append the events the changelog lacks (below ``new_pos``; with ``truncated_ts``, the
    TRUNCATE at it: changelog.py) and move its position to ``new_pos`` in the same commit;
    rows appended (0: nothing to append, no commit)."""
    ident, hi, key = (namespace, changelog_name(table)), new_pos.encode(), POSITION_KEY + source
    try:
        t = catalog.load_table(ident)
    except NoSuchTableError:
        t = None
    applied = t.properties.get(key, "") if t is not None else ""
    if applied and hi <= applied:   # a replay: in already
        return 0
    pages = pending(events, applied, hi, truncated_ts, table)
    first = next(pages, None)
    if first is None:   # nothing new: no commit
        return 0
    t, txn, schema = _ready(catalog, ident, t, table, target)
    file_schema = schema_to_pyarrow(txn.table_metadata.schema(), include_field_ids=False)
    files, count = [], 0
    for page in chain([first], pages):   # written a page at a time, committed as one snapshot
        rows = changelog_rows(page, schema, table, ICEBERG_RANGES, target)
        count += rows.num_rows
        files += _dataframe_to_data_files(table_metadata=txn.table_metadata, df=rows.cast(file_schema), io=t.io,
                                          write_uuid=uuid.uuid4())
    with txn.update_snapshot(snapshot_properties={key: hi}).fast_append() as snapshot:
        for f in files:
            snapshot.append_data_file(f)
    txn.set_properties({key: hi})
    txn.commit_transaction()
    log.info("appended %d events to Iceberg changelog table %s.%s", count, *ident)
    return count


def append_marked(catalog, namespace: str, table: TableSchema, source: str, op: str, at: Position,
                  images: pa.Table | None, target: str) -> int:
    """Rows with no log event of their own (changelog.marked_rows: ``op`` at ``at``) in a
    snapshot of their own that leaves the changelog's position where it is; nothing if the
    changelog holds rows of that position and op already (a rerun's). Rows appended."""
    ident = (namespace, changelog_name(table))
    try:
        t = catalog.load_table(ident)
    except NoSuchTableError:
        t = None
    if t is not None and len(t.scan(row_filter=And(EqualTo(POS_COLUMN, at.encode()), EqualTo("op", op)),
                                    selected_fields=("op",)).to_arrow()):
        return 0
    if images is not None and not images.num_rows:
        return 0
    t, txn, schema = _ready(catalog, ident, t, table, target)
    file_schema = schema_to_pyarrow(txn.table_metadata.schema(), include_field_ids=False)
    rows = marked_rows(schema, op, at, images)
    files = _dataframe_to_data_files(table_metadata=txn.table_metadata, df=rows.cast(file_schema), io=t.io,
                                     write_uuid=uuid.uuid4())
    with txn.update_snapshot(snapshot_properties={MARK_KEY: f"{op} {at.encode()}"}).fast_append() as snapshot:
        for f in files:
            snapshot.append_data_file(f)
    txn.commit_transaction()
    log.info("appended %d %s rows at %s to Iceberg changelog table %s.%s", rows.num_rows, op, at, *ident)
    return rows.num_rows
