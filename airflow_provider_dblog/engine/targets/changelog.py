"""The changelog table of a lake target (issue 28): the ordered event log of one source
table, append-only, next to its current-state table (``<db>__<table>__changelog``), kept
when the target's config says ``changelog: true``. This module is what both kinds share;
the writes are delta_changelog.py and iceberg_changelog.py.

One row per event, every event (not the latest per key; dump rows, ``op`` ``snapshot``,
included), in position order: ``_dblog_pos``, ``op``, ``source_ts`` (the source's commit
time, UTC), ``commit_date`` (its UTC day: the partition column), ``before`` and ``after``
(the row images, structs of the table's columns typed as in the current-state table,
lake_schema.py) and ``error`` (why a value of the event could not be carried: that field
of the image is null; such an event is never the one a current-state row keeps,
apply_hold.held_at, but it is still an event of the log).

Exactly once: the changelog table carries its own applied position per source, moved in
the same commit as the rows it appends. An append takes the batch's events at or past it
and below the batch's end, and moves it to the batch's end; a replay appends nothing (no
commit). A crash between the changelog's commit and the current-state table's is harmless:
each table has its own position.

The images' struct only grows: a new column is a new field (null in earlier rows), a
dropped one stays (null afterwards), a rename is a new field, a widening widens the field
(each kind says how); a value the lake cannot hold (a far date: lake_values.py) is null in
its image and named, with its exact text, in the row's ``error`` (an event stays in the
log: refusing it would hold the table for good); a change the table cannot hold exactly
(a column of the same name whose type neither holds the other's) is refused (TargetValueError: the table's apply is
held, engine/apply_batch.py). A TRUNCATE that empties the target (schema_changes
``evolve``) is a row too: ``op`` ``truncate`` at the TRUNCATE's position, both images null,
appended with the events before it in the commit that moves the changelog's position to
it (the batch ends there: engine/apply_plan.py), so it is in exactly once. Under
``lenient``/``ignore`` the targets keep their rows and the changelog has no such row.

Two changes of the current-state table have no log event of their own (base.append_marked):
a full dump's orphan sweep, one row per deleted row, ``op`` ``sweep``, its before image the
deleted row, at the position just below the sweep's ``until`` (engine/sweep.py says why it
is exact); and a quarantine's rebuild that empties the table, ``op`` ``rebuild``, no images,
just below the break it is rebuilt at (engine/quarantine.py): replayed like a truncate,
every row before it is gone. Their ``source_ts`` is when they were made. Both land below
the changelog's own position (or where no event is yet), so they are appended in a commit of
their own that leaves the position where it is, exactly once by a look for rows of that
position and op before the append. Hence a reader follows the commits (Delta versions,
Iceberg snapshots) or reads by position (``ORDER BY _dblog_pos``); it must not keep a
high-water mark of positions and skip rows below it.

No Spark and no Airflow here.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Callable, Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import TargetValueError
from ..events import event_arrow_schema
from ..logical_types import arrow_type
from ..positions import Position
from ..schema import TableSchema
from . import CHANGELOG_SUFFIX
from .base import POS_COLUMN, REBUILD, SWEEP
from .lake_values import mark_out_of_range
from .pg_tables import target_table_name

SUFFIX = CHANGELOG_SUFFIX
TRUNCATE = "truncate"   # the op of a TRUNCATE's row (the events' ops: engine/events.py)
MARKED = (SWEEP, REBUILD)   # the ops of rows with no log event of their own (base.append_marked)
POSITION_KEY = "dblog.changelog."   # + source: where each kind keeps the changelog's position
PARTITION = "commit_date"
IMAGES = ("before", "after")


def changelog_name(table: TableSchema | str) -> str:
    return target_table_name(table) + SUFFIX


def image_struct(table: TableSchema) -> pa.StructType:
    """A row image: the table's columns, typed as in the current-state table (nullable:
    a delete's after image and an insert's before image are null)."""
    return pa.struct([pa.field(c.name, arrow_type(c.type)) for c in table.columns])


def changelog_schema(image: pa.StructType) -> pa.Schema:
    return pa.schema([pa.field(POS_COLUMN, pa.string(), nullable=False),
                      pa.field("op", pa.string(), nullable=False),
                      pa.field("source_ts", pa.timestamp("us", tz="UTC"), nullable=False),
                      pa.field(PARTITION, pa.date32(), nullable=False),
                      pa.field("before", image), pa.field("after", image),
                      pa.field("error", pa.string())])


# -- the images' struct through the table's changes of shape ---------------------------
# relation(old, new) -> "same" (the table's field holds it as it is), "widen" (the
# table's field must become ``new``), "holds" (the table's wider field holds ``new``'s
# values: cast up on write) or None (neither holds the other: refused)
Relation = Callable[[pa.DataType, pa.DataType], "str | None"]


def merged_struct(current: pa.StructType | None, wanted: pa.StructType, relation: Relation,
                  table: str, target: str) -> tuple[pa.StructType, list[str], list[str]]:
    """The images' struct after taking ``wanted`` (the batch's columns) into ``current``
    (the table's): ``(struct, added, widened)``. Fields never go: a column dropped at the
    source keeps its field (null in later rows)."""
    if current is None:
        return wanted, [], []
    fields, added, widened = {f.name: f for f in current}, [], []
    for f in wanted:
        old = fields.get(f.name)
        if old is None:
            fields[f.name] = pa.field(f.name, f.type)
            added.append(f.name)
            continue
        how = relation(old.type, f.type)
        if how == "widen":
            fields[f.name] = pa.field(f.name, f.type)
            widened.append(f.name)
        elif how is None:
            raise TargetValueError(
                f"{table}.{f.name}: the changelog table of {target} holds it as {old.type}, and the events now "
                f"carry it as {f.type}; neither holds the other's values exactly, so the changelog cannot take "
                f"them (never cast lossily). The table's apply to {target} is held (its other tables go on); "
                f"drop or rename the changelog table's field, or the changelog table, to go on",
                table=table, column=f.name, value=str(f.type))
    return pa.struct(list(fields.values())), added, widened


def arrow_relation(old: pa.DataType, new: pa.DataType) -> str | None:
    """Whether one Arrow type holds the other's values exactly (an integer with more
    bits, a decimal with at least as many digits on each side of the point, a double for
    a float; text is text whatever its Arrow layout)."""
    texts = (pa.string(), pa.large_string(), pa.string_view())
    if old == new or (old in texts and new in texts):
        return "same"
    for a, b, how in ((old, new, "widen"), (new, old, "holds")):
        if pa.types.is_signed_integer(a) and pa.types.is_signed_integer(b) and a.bit_width < b.bit_width:
            return how
        if pa.types.is_decimal(a) and pa.types.is_decimal(b) and a.scale <= b.scale and \
                a.precision - a.scale <= b.precision - b.scale:
            return how
        if a == pa.float32() and b == pa.float64():
            return how
    return None


def conform(images: pa.Array | pa.ChunkedArray, struct: pa.StructType) -> pa.StructArray:
    """Row images in ``struct``'s fields: a field the images lack is null, each other
    field cast to the struct's type (a safe cast: it raises rather than lose a value)."""
    if isinstance(images, pa.ChunkedArray):
        images = images.combine_chunks() if images.num_chunks != 1 else images.chunk(0)
    have = {images.type.field(i).name for i in range(images.type.num_fields)}
    children = [images.field(f.name).cast(f.type) if f.name in have else pa.nulls(len(images), f.type)
                for f in struct]
    mask = images.is_null() if images.null_count else None
    return pa.StructArray.from_arrays(children, fields=list(struct), mask=mask)


def changelog_rows(events: pa.Table | pa.RecordBatch, schema: pa.Schema, table: TableSchema | None = None,
                   ranges: dict | None = None, target: str = "") -> pa.Table:
    """Event rows (engine/events.py) as changelog rows of ``schema``; with ``ranges`` (the
    values the lake holds: lake_values.py), a value outside them is null in its image and
    named in the row's ``error`` (lake_values.mark_out_of_range)."""
    ts = events["source_ts"]
    micros = pc.multiply_checked(ts.cast(pa.int64()), 1000).cast(pa.timestamp("us", tz="UTC"))
    image = schema.field("before").type
    errors = events["error"] if "error" in events.schema.names else pa.nulls(events.num_rows, pa.string())
    errors = errors.combine_chunks() if isinstance(errors, pa.ChunkedArray) else errors
    images = [conform(events[name], image) for name in IMAGES]
    if ranges:
        for i, name in enumerate(IMAGES):
            images[i], errors = mark_out_of_range(table, images[i], errors, name, ranges, target)
    cols = [events["pos"], events["op"], micros, micros.cast(pa.date32()), *images, errors]
    return pa.Table.from_arrays(cols, schema=schema)


def truncate_event(table: TableSchema, pos: str, ts: int) -> pa.Table:
    """A TRUNCATE at ``pos`` as one event row (engine/events.py's shape): no images; a time
    the tail did not record (versions from before it did) is named in ``error``."""
    row = {"table": table.qualified, "op": TRUNCATE, "key": "", "before": None, "after": None, "pos": pos,
           "source_ts": ts, "error": None if ts else "the TRUNCATE's source time was not recorded"}
    return pa.Table.from_pylist([row], schema=event_arrow_schema(table))


def pending(events: Iterable[pa.Table | pa.RecordBatch], applied: str, hi: str,
            truncated_ts: int | None = None, table: TableSchema | None = None) -> Iterator[pa.Table]:
    """The events (in position order, each once: engine/apply_batch.py reads them so) the
    changelog does not hold yet: at or past its position ``applied`` ("" if none) and
    below ``hi``, empty pages left out; then, with ``truncated_ts``, the TRUNCATE at ``hi``."""
    yield from _below(events, applied, hi)
    if truncated_ts is not None:
        yield truncate_event(table, hi, truncated_ts)


def _below(events: Iterable[pa.Table | pa.RecordBatch], applied: str, hi: str) -> Iterator[pa.Table]:
    for page in events:
        if isinstance(page, pa.RecordBatch):
            page = pa.Table.from_batches([page])
        mask = pc.less(page["pos"], hi)
        if applied:
            mask = pc.and_(mask, pc.greater_equal(page["pos"], applied))
        page = page.filter(mask)
        if page.num_rows:
            yield page


def marked_rows(schema: pa.Schema, op: str, at: Position, images: pa.Table | None = None) -> pa.Table:
    """Changelog rows of ``schema`` with no log event of their own: ``op`` at ``at``, one per
    row of ``images`` (a sweep's deleted rows: the before images; after null), or one with
    no images; ``source_ts`` now, ``commit_date`` its UTC day."""
    if op not in MARKED:
        raise ValueError(f"not an op of a row without an event: {op!r}")
    image, n = schema.field("before").type, 1 if images is None else images.num_rows
    if images is None:
        before = pa.nulls(n, image)
    else:
        before = conform(pa.StructArray.from_arrays([c.combine_chunks() for c in images.columns],
                                                    names=images.column_names), image)
    now = pa.array([datetime.now(timezone.utc)] * n, pa.timestamp("us", tz="UTC"))
    cols = [pa.array([at.encode()] * n, pa.string()), pa.array([op] * n, pa.string()), now,
            now.cast(pa.date32()), before, pa.nulls(n, image), pa.nulls(n, pa.string())]
    return pa.Table.from_arrays(cols, schema=schema)


def rows_of_keys(dataset, keys: pa.Table, key: list[str], below: Position) -> pa.Table:
    """The rows of ``dataset`` (a current-state table's, with ``_dblog_pos``: a pyarrow
    dataset) below ``below`` whose key is in ``keys``: a sweep's deleted rows, a page at a
    time (matched on the key and a row index alone, so any column type rides along)."""
    parts = []
    for page in dataset.to_batches():
        page = page.filter(pc.less(page[POS_COLUMN], below.encode()))
        if not page.num_rows:
            continue
        index = pa.table([page[k] for k in key] + [pa.array(range(page.num_rows), pa.int64())],
                         names=key + ["__dblog_row"])
        hit = index.join(keys.select(key).cast(index.select(key).schema), key, join_type="left semi")
        if hit.num_rows:
            parts.append(pa.Table.from_batches([page]).take(hit["__dblog_row"]))
    return pa.concat_tables(parts) if parts else dataset.schema.empty_table()
