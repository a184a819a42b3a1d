"""An Iceberg target table takes a new shape inside the caller's transaction
(iceberg.py): its columns become those of the wanted Arrow schema, by name.

Renamed columns keep their field id (readers of earlier snapshots follow them); a type
change Iceberg allows in place (int -> long, float -> double, a wider decimal precision)
is an in-place promotion; any other change of type is the column dropped and added again
(the caller rewrites the rows, delta_evolve.evolved, so every value is exact). Columns
the table holds and the wanted schema lacks are dropped: the caller passes the columns
it keeps (lenient) in the wanted schema. No Spark and no Airflow here.
"""
from __future__ import annotations

from typing import Iterable

import pyarrow as pa
from pyiceberg.exceptions import ResolveError
from pyiceberg.io.pyarrow import _ConvertToIcebergWithoutIDs, visit_pyarrow
from pyiceberg.schema import Schema, promote

from .base import POS_COLUMN


def iceberg_schema(schema: pa.Schema) -> Schema:
    """An Arrow schema as Iceberg columns (field ids assigned by the catalog or the update)."""
    return visit_pyarrow(schema, _ConvertToIcebergWithoutIDs(format_version=2))


def _promotes(old, new) -> bool:
    if old == new:
        return True
    try:
        return promote(old, new) == new
    except ResolveError:
        return False


def reshape(txn, current: Schema, wanted: pa.Schema, renames: Iterable[tuple[str, str]] = (),
            key: Iterable[str] = ()) -> bool:
    """Make the table's columns ``wanted``'s, in ``txn`` (a pyiceberg Transaction), with
    ``key`` its identifier fields (a key column dropped or renamed at the source: the old
    identifier is let go first, the new one set once its columns exist). True if a
    column changed."""
    names = {f.name: f.field_type for f in current.fields}
    target = {f.name: f for f in iceberg_schema(wanted).fields}
    key = list(key)
    old_key = [current.find_field(i).name for i in current.identifier_field_ids]
    if key and old_key != key:
        with txn.update_schema(allow_incompatible_changes=True) as update:
            update.set_identifier_fields()
    renames = [(a, b) for a, b in renames if a in names and b not in names and b in target]
    if renames:
        with txn.update_schema(allow_incompatible_changes=True) as update:
            for a, b in renames:
                update.rename_column(a, b)
                names[b] = names.pop(a)
    drop = [n for n, t in names.items() if n not in target or not _promotes(t, target[n].field_type)]
    if drop:
        with txn.update_schema(allow_incompatible_changes=True) as update:
            for n in drop:
                update.delete_column(n)
    promoted = [n for n, t in names.items() if n not in drop and t != target[n].field_type]
    added = [n for n in target if n not in names or n in drop]
    if promoted or added:
        with txn.update_schema(allow_incompatible_changes=True) as update:
            for n in promoted:
                update.update_column(n, field_type=target[n].field_type)
            for n in added:   # optional (but a key column): existing rows are rewritten by the caller
                update.add_column(n, target[n].field_type, required=n in key)
                if POS_COLUMN in names and POS_COLUMN not in drop:   # the source's columns first
                    update.move_before(n, POS_COLUMN)
    if key and old_key != key:
        with txn.update_schema(allow_incompatible_changes=True) as update:
            for n in key:
                if n not in added:
                    update.update_column(n, required=True)
            update.set_identifier_fields(*key)
    return bool(renames or drop or promoted or added)
