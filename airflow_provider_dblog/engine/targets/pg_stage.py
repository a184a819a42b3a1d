"""A batch into a PostgreSQL target (its ``merge_batch``): the flattened rows (one Arrow
table, or pages of one: the Spark path's stage files) are ``COPY``-ed into a new stage
table typed like the target, then ``merge_from_stage`` merges them and moves the applied
position in one transaction. A failed attempt drops its stage, unless the server is away
(a retry's stage, same name, replaces it). No Spark and no Airflow here.
"""
from __future__ import annotations

import logging
import time
from typing import Iterable

import pyarrow as pa

from ..positions import Position
from ..schema import TableSchema
from .base import MergeResult
from .pg_copy import copy_rows
from .pg_tables import qualified_name, stage_table_name

log = logging.getLogger(__name__)


def stage_and_merge(target, table: TableSchema, pages: pa.Table | Iterable[pa.Table], source: str,
                    new_pos: Position, run_id: str, evolve: tuple | None) -> MergeResult:
    stage = stage_table_name(table, run_id)
    target.create_stage(table, stage)
    try:
        t1 = time.monotonic()
        with target.conn, target.conn.cursor() as cur:
            for page in ([pages] if isinstance(pages, pa.Table) else pages):
                copy_rows(cur, qualified_name(target.schema, stage), page)
        t2 = time.monotonic()
        res = target.merge_from_stage(table, stage, source, new_pos, drop_stage=True, evolve=evolve)
        res.stage_s, res.merge_s = t2 - t1, time.monotonic() - t2
        return res
    except BaseException as e:
        if target.is_transient(e):
            log.warning("stage table %s left by a failed attempt (%s)", stage, type(e).__name__)
            raise
        try:
            target.drop_stage(stage)
        except Exception:  # noqa: BLE001 - the original error matters more
            log.exception("could not drop stage table %s", stage)
        raise
