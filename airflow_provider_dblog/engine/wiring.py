"""The composition root: the engine's parts of one source, built from the config in one place.

Every entry point (the ``dblog`` command, the Airflow hook, the Spark jobs, apply, lag, the
demo and the benchmark) asks this module for a source's state, event store, database
connection and dump runner, instead of assembling them itself::

    parts = Wiring(config, "shop")        # or Wiring.of_target(config, "warehouse")
    parts.state, parts.store              # Redis state and the event log, made once
    with parts.opened_source() as source: ...
    runner = parts.runner(reader)         # opens the source; close it with runner.source.close()
"""
from __future__ import annotations

from contextlib import contextmanager
from functools import cached_property
from typing import TYPE_CHECKING, Iterator

from .config import Config, SourceConfig
from .state import RedisState
from .store import EventStore

if TYPE_CHECKING:
    from .dump import ChunkReader, DumpRunner
    from .sources.base import Source


class Wiring:
    def __init__(self, config: Config, source: str | None = None):
        self.config = config
        self.source_config: SourceConfig = config.source(source)
        self.name = self.source_config.name

    @classmethod
    def of_target(cls, config: Config, target: str | None = None) -> "Wiring":
        """The parts of the source a target is fed from."""
        return cls(config, config.target(target).source)

    @cached_property
    def state(self) -> RedisState:
        return RedisState(self.config.redis_url, self.config.state_prefix, self.name)

    @cached_property
    def store(self) -> EventStore:
        return EventStore(self.config.storage_root, self.name)

    def open_source(self) -> "Source":
        from .sources import open_source
        return open_source(self.source_config)

    @contextmanager
    def opened_source(self) -> Iterator["Source"]:
        source = self.open_source()
        try:
            yield source
        finally:
            source.close()

    def runner(self, reader: "ChunkReader | None" = None, source: "Source | None" = None,
               on_chunk=None) -> "DumpRunner":
        """A dump runner on ``source`` (opened here when not given: the caller closes
        ``runner.source``)."""
        from .dump import DumpRunner
        return DumpRunner(source or self.open_source(), self.state, self.store, reader, self.config.dump, on_chunk)
