"""Values a lake table can hold, checked before a write (issue 28).

The event log carries every PostgreSQL date and timestamp exactly (engine/values.py: BC
years, years past 9999, ``±infinity`` at the ends of the integer range). A lake format's
writer or its readers may hold less. Such a value is never clamped and never lets a
write fail half-way through a run: :func:`check_values` finds it in an Arrow page
(vectorised: one comparison per column) and raises :class:`TargetValueError` naming the
table, the column, the value, the event's position and why, so that the apply holds that
table on that target only (engine/apply_batch.py) and every other table goes on. A target
gives its ranges to the apply's planning too (``value_ranges()``: :class:`ValueRanges`), so
that a refused value whose row is fixed at the source past the change of shape the batch
ends at is left out of the merge instead of holding the table (engine/apply_hold.py).

Each target passes its own :class:`ValueRange` per Arrow type. The Delta target's were
measured with deltalake 1.6.6 (write_deltalake, DeltaTable.merge insert and update,
then reading the table back with ``to_pyarrow_table``), :data:`DELTA_RANGES`:

- ``date32``: 0001-01-01 .. 9999-12-31 (days -719162 .. 2932896). Past ±262143 years
  the writer panics on the file statistics (chrono: "NaiveDate + TimeDelta
  overflowed"); in between, the write and the MERGE commit, but every later
  ``to_pyarrow_dataset`` / ``to_pyarrow_table`` raises ValueError (deltalake turns a date
  column's min/max statistics into Python dates): the table would be unreadable.
- ``timestamp[us]`` and ``timestamp[us, tz=UTC]``: the whole int64 range, ``±infinity``
  included, is written, merged and read back exactly: no limit.

No Spark and no Airflow here.
"""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import TargetValueError
from ..events import DELETE
from ..schema import TableSchema
from ..values import date_from_days, pg_date_text, pg_timestamp_text, timestamp_from_us
from .base import OP_COLUMN, POS_COLUMN


@dataclass(frozen=True)
class ValueRange:
    """The values of an Arrow type a target holds: ``lo`` .. ``hi`` (inclusive) in the
    type's integer storage (days for date32, the unit's count for a timestamp)."""
    lo: int
    hi: int
    why: str


DELTA_RANGES: dict[pa.DataType, ValueRange] = {
    pa.date32(): ValueRange(-719_162, 2_932_896, "deltalake 1.6.6 reads a date column's file statistics as "
                            "Python dates (years 1..9999); past years ±262143 its writer panics"),
}


_PY_US = (-62_135_596_800_000_000, 253_402_300_799_999_999)   # 0001-01-01 .. 9999-12-31 23:59:59.999999
_PYICEBERG = ("pyiceberg 0.12 turns a column's Parquet statistics into Python dates and datetimes when it "
              "writes a file (years 1..9999)")
# measured with pyiceberg 0.12.0 (append, then a scan): one day / microsecond past either end
# raises OverflowError in the writer, so nothing is committed
ICEBERG_RANGES: dict[pa.DataType, ValueRange] = {
    pa.date32(): ValueRange(-719_162, 2_932_896, _PYICEBERG),
    pa.timestamp("us"): ValueRange(*_PY_US, _PYICEBERG),
    pa.timestamp("us", tz="UTC"): ValueRange(*_PY_US, _PYICEBERG),
}


def _text(typ: pa.DataType, logical: str, v: int) -> str:
    """``v`` (the integer storage of ``typ``) as PostgreSQL prints it."""
    if pa.types.is_date32(typ):
        return pg_date_text(date_from_days(v))
    if pa.types.is_timestamp(typ) and typ.unit == "us":
        return pg_timestamp_text(timestamp_from_us(v), logical == "timestamptz")
    return f"{v} ({typ})"


def _storage(typ: pa.DataType) -> pa.DataType:
    return pa.int32() if pa.types.is_date32(typ) else pa.int64()


def _outside(values: pa.Array | pa.ChunkedArray, typ: pa.DataType, r: ValueRange):
    """Per value of ``typ``: outside ``r`` (null for a null): the one range check of a
    merge (:func:`check_values`), a changelog (:func:`mark_out_of_range`) and the apply's
    planning (:meth:`ValueRanges.outside`)."""
    ints = values.cast(_storage(typ))
    return pc.or_(pc.less(ints, r.lo), pc.greater(ints, r.hi))


@dataclass(frozen=True)
class ValueRanges:
    """A target's ranges (its ``value_ranges()``, targets/base.py), as the apply's planning
    asks them (engine/apply_hold.py): which events' row images it would refuse."""
    ranges: dict[pa.DataType, ValueRange]
    target: str   # its name in messages ("Delta target lake")

    def ranged(self, image: pa.DataType) -> list[str]:
        """The columns of a row image of this struct type whose type has a range."""
        return [f.name for f in image if f.type in self.ranges] if pa.types.is_struct(image) else []

    def outside(self, images: pa.Array | pa.ChunkedArray) -> pa.Array:
        """Per row image (a struct of a table's columns, as an event's ``after``): whether
        one of its values lies outside the ranges (a null image or value: False)."""
        images = images.combine_chunks() if isinstance(images, pa.ChunkedArray) else images
        out = pa.array([False] * len(images), pa.bool_())
        for i, f in enumerate(images.type):
            if (r := self.ranges.get(f.type)) is not None:
                out = pc.or_(out, pc.fill_null(_outside(pc.struct_field(images, [i]), f.type, r), False))
        return pc.and_(out, images.is_valid())


def check_values(table: TableSchema, page: pa.Table, ranges: dict[pa.DataType, ValueRange], target: str,
                 at: str = "") -> None:
    """Raise TargetValueError for the earliest row of ``page`` (by ``_dblog_pos``) with a
    value outside ``ranges`` of its column's Arrow type; a delete's row (``_dblog_op``)
    is not written, so it passes. ``at``: the position to name instead of the row's
    ``_dblog_pos`` (a change of shape rewriting the table's rows at ``at``). ``target``:
    the target's name in the message."""
    if not ranges or page.num_rows == 0:
        return
    written = (pc.not_equal(page[OP_COLUMN], DELETE) if OP_COLUMN in page.column_names
               else pa.array([True] * page.num_rows))
    first = None   # (pos, field, value, key, range) of the earliest refused row
    for field in page.schema:
        r = ranges.get(field.type)
        if r is None or field.name in (OP_COLUMN, POS_COLUMN):
            continue
        bad = pc.and_kleene(_outside(page[field.name], field.type, r), written)
        if not pc.any(bad).as_py():
            continue
        rows = page.filter(bad)
        if POS_COLUMN in rows.column_names and not at:
            rows = rows.sort_by([(POS_COLUMN, "ascending")])
        pos = at or rows[POS_COLUMN][0].as_py()
        if first is None or pos < first[0]:
            key = {k: _key_text(table, k, rows[k].slice(0, 1)) for k in table.key if k in rows.column_names}
            first = (pos, field, rows[field.name].slice(0, 1).cast(_storage(field.type))[0].as_py(), key, r)
    if first is None:
        return
    pos, field, v, key, r = first
    logical = table.column(field.name).type if field.name in table.column_names else ""
    value = _text(field.type, logical, v)
    lo, hi = _text(field.type, logical, r.lo), _text(field.type, logical, r.hi)
    raise TargetValueError(
        f"{table.qualified}.{field.name} = {value!r} (key {key}, event at {pos}) cannot be held exactly by "
        f"{target}: it holds {logical or field.type} values from {lo} to {hi} only ({r.why}). Never clamped: the "
        f"table's apply to {target} is held (its other tables go on)"
        + (" at this change of its shape" if at else " until a change of the row at the source"),
        table=table.qualified, column=field.name, value=value, at=pos)


def mark_out_of_range(table: TableSchema, image: pa.StructArray, errors: pa.Array, name: str,
                      ranges: dict[pa.DataType, ValueRange], target: str) -> tuple[pa.StructArray, pa.Array]:
    """A changelog's row images (``name``: before / after) with each value outside
    ``ranges`` made null and named, with its exact text, in that row's ``errors``: an event
    stays in the log for good, so refusing it would hold the table forever; the row says
    what it does not carry (a current-state table refuses the value instead)."""
    children, notes = [], []
    for i, f in enumerate(image.type):
        child = image.field(i)
        r = ranges.get(f.type)
        if r is not None:
            bad = pc.fill_null(_outside(child, f.type, r), False)
            if pc.any(bad).as_py():
                ints = child.cast(_storage(f.type))
                logical = table.column(f.name).type if f.name in table.column_names else ""
                texts = [None if not b else f"{name}.{f.name} = {_text(f.type, logical, v)!r} is not carried: "
                         f"{target} holds {logical or f.type} values from {_text(f.type, logical, r.lo)} to "
                         f"{_text(f.type, logical, r.hi)} only ({r.why})"
                         for b, v in zip(bad.to_pylist(), ints.to_pylist())]
                notes.append(pa.array(texts, pa.string()))
                child = pc.if_else(bad, pa.nulls(len(child), f.type), child)
        children.append(child)
    if not notes:
        return image, errors
    for note in notes:
        errors = pc.if_else(pc.is_null(errors), note, pc.if_else(pc.is_null(note), errors,
                                                                  pc.binary_join_element_wise(errors, note, "; ")))
    mask = image.is_null() if image.null_count else None
    return pa.StructArray.from_arrays(children, fields=list(image.type), mask=mask), errors


def _key_text(table: TableSchema, name: str, one: pa.ChunkedArray) -> str:
    typ = one.type
    if pa.types.is_date32(typ) or pa.types.is_timestamp(typ):
        v = one.cast(_storage(typ))[0].as_py()
        return None if v is None else _text(typ, table.column(name).type, v)
    return one[0].as_py()


class ValueGuard:
    """:func:`check_values` on the pages a writer pulls from a stream (a delta-rs MERGE
    reads a RecordBatchReader): the writer wraps an error raised inside the stream in its
    own, so :meth:`run` raises the refusal itself (the write committed nothing)."""

    def __init__(self, table: TableSchema, ranges: dict[pa.DataType, ValueRange], target: str):
        self.table, self.ranges, self.target = table, ranges, target
        self.refused: TargetValueError | None = None

    def check(self, page: pa.Table) -> pa.Table:
        try:
            check_values(self.table, page, self.ranges, self.target)
        except TargetValueError as e:
            self.refused = e
            raise
        return page

    def run(self, write):
        try:
            return write()
        except Exception:
            if self.refused is not None:
                raise self.refused from None
            raise
