"""The columns of a lake target's current-state table (Delta, Iceberg): the source's, each
with the Arrow type of its logical type (engine/logical_types.py: decimals as decimals,
``numeric`` and ``text:`` types as the source's exact text, timestamps as ``timestamp_ntz``
/ UTC ``timestamp``), then ``_dblog_pos`` and ``_dblog_op``. The key's columns are not
nullable. No Spark and no Airflow here."""
from __future__ import annotations

import pyarrow as pa

from ..errors import TargetShapeError
from ..logical_types import arrow_type
from ..schema import TableSchema
from .base import OP_COLUMN, POS_COLUMN


def arrow_schema(table: TableSchema) -> pa.Schema:
    fields = [pa.field(c.name, arrow_type(c.type), nullable=c.name not in table.key) for c in table.columns]
    return pa.schema(fields + [pa.field(POS_COLUMN, pa.string(), nullable=False),
                               pa.field(OP_COLUMN, pa.string(), nullable=False)])


def carried(new: TableSchema, ev, have: list[str]) -> list[str]:
    """The source's columns a lake table has after the change ``ev`` to ``new`` (``have``:
    its columns before): those it had and those the change adds, renames or copies to;
    ``ignore`` leaves added ones out. (Columns kept by ``lenient``, gone at the source, are
    schema_evolution.kept_name_reused's.)"""
    brought = set(ev.add) | {b for _, b in ev.rename} | {b for _, b in ev.copy}
    return [c for c in new.column_names if c not in ev.skip and (c in have or c in brought)]


def check_shape(table: TableSchema, kind: str, target: str, names: list[str] | None = None) -> None:
    """Refuse (TargetShapeError: the table held on this target only) a shape the lake table
    cannot hold exactly: column names that differ only in case (Delta takes them as one;
    ``_dblog_pos`` and ``_dblog_op`` are ours), a key of unconstrained ``numeric`` (1.5 and
    1.50 are one key at the source, two texts in a lake table), or (Iceberg) a key of floats,
    which cannot be identifier fields. ``names``: the columns the lake table will have, when
    not the source's (``ignore`` leaves some out, ``lenient`` keeps some)."""
    seen: dict[str, str] = {}
    names = table.column_names if names is None else names
    for name in names + [POS_COLUMN, OP_COLUMN]:
        other = seen.setdefault(name.lower(), name)
        if other != name or (name in (POS_COLUMN, OP_COLUMN) and name in names):
            raise TargetShapeError(
                f"{table.qualified}: columns {other!r} and {name!r} are one column to a {kind} table (names "
                f"compared without case, {POS_COLUMN} / {OP_COLUMN} are dblog's): the table is held on {target} "
                "(its other tables go on); rename one at the source, then re-dump the table (a full dump read "
                "after the rename releases it), or capture it into a PostgreSQL target",
                table=table.qualified, column=name)
    for k, t in zip(table.key, table.key_types):
        why = ("an unconstrained numeric key: 1.5 and 1.50 are one key at the source but two texts in a "
               "lake table" if t == "numeric" else
               "a floating-point key cannot be an Iceberg identifier field"
               if kind == "iceberg" and t in ("float32", "float64") else "")
        if why:
            raise TargetShapeError(
                f"{table.qualified}.{k}: {why}; the table is held on {target} (its other tables go on). "
                f"Declare the key with a fixed scale (numeric(p,s)) or capture it into a PostgreSQL target",
                table=table.qualified, column=k)
