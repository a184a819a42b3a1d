"""The columns of a lake target's current-state table (Delta, Iceberg): the source's, each
with the Arrow type of its logical type (engine/logical_types.py: decimals as decimals,
``numeric`` and ``text:`` types as the source's exact text, timestamps as ``timestamp_ntz``
/ UTC ``timestamp``), then ``_dblog_pos`` and ``_dblog_op``. The key's columns are not
nullable. No Spark and no Airflow here."""
from __future__ import annotations

import pyarrow as pa

from ..logical_types import arrow_type
from ..schema import TableSchema
from .base import OP_COLUMN, POS_COLUMN


def arrow_schema(table: TableSchema) -> pa.Schema:
    fields = [pa.field(c.name, arrow_type(c.type), nullable=c.name not in table.key) for c in table.columns]
    return pa.schema(fields + [pa.field(POS_COLUMN, pa.string(), nullable=False),
                               pa.field(OP_COLUMN, pa.string(), nullable=False)])
