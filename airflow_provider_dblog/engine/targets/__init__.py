"""Apply targets: the contract (base.py) and its implementations. ``open_target`` picks
the implementation from the config's kind; nothing outside this package imports one."""
from __future__ import annotations

from ..config import TargetConfig
from .base import OP_COLUMN, POS_COLUMN, MergeResult, Target
from .pg_tables import stage_table_name, target_table_name
from .postgres import PostgresTarget

__all__ = ["MergeResult", "OP_COLUMN", "POS_COLUMN", "PostgresTarget", "Target", "open_target",
           "stage_table_name", "target_table_name"]


def open_target(config: TargetConfig) -> Target:
    if config.kind == "postgres":
        return PostgresTarget(config)
    if config.kind == "delta":
        from .delta import DeltaTarget   # deltalake is needed only by a Delta target
        return DeltaTarget(config)
    if config.kind == "iceberg":
        from .iceberg import IcebergTarget   # pyiceberg is needed only by an Iceberg target
        return IcebergTarget(config)
    raise NotImplementedError(f"target kind {config.kind!r} is not supported yet")
