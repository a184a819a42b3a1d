"""Apply targets. ``open_target`` picks the implementation from the config's kind."""
from __future__ import annotations

from ..config import TargetConfig
from .pg_tables import stage_table_name, target_table_name
from .postgres import MergeResult, PostgresTarget

__all__ = ["MergeResult", "PostgresTarget", "open_target", "stage_table_name", "target_table_name"]


def open_target(config: TargetConfig) -> PostgresTarget:
    if config.kind == "postgres":
        return PostgresTarget(config)
    raise NotImplementedError(f"target kind {config.kind!r} is not supported yet")
