"""Source databases. ``open_source`` picks the implementation from the config's kind."""
from __future__ import annotations

from ..config import SourceConfig
from .base import Source


def open_source(config: SourceConfig) -> Source:
    if config.kind == "mysql":
        from .mysql import MySQLSource
        return MySQLSource(config)
    if config.kind == "postgres":
        from .postgres import PostgresSource
        return PostgresSource(config)
    raise NotImplementedError(f"source kind {config.kind!r} is not supported yet")
