"""What the engine needs from a source database (MySQL/MariaDB, PostgreSQL).

A source knows its table shapes, writes watermarks, plans chunks in key order,
reads rows for a list of keys with bound parameters, and reads its change log as
a stream of LogItems. Nothing here knows about Airflow or Spark.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, NamedTuple, Protocol, Sequence

import pyarrow as pa

from ..config import SourceConfig
from ..events import Event
from ..positions import Position
from ..schema import TableSchema


# -- what a log reader yields -------------------------------------------------
class RowChange(NamedTuple):
    """One row change of a captured table (a NamedTuple: one is made per change)."""
    event: Event


@dataclass(frozen=True)
class WatermarkSeen:
    value: str  # the UUID written into the watermark row
    pos: Position


@dataclass(frozen=True)
class TxnEnd:
    """A transaction committed: every event before ``pos`` is complete, and the
    reader can restart from ``resume`` without re-reading any of them. ``checkpoint_now``:
    the reader waits for this position to be the checkpoint (and confirmed) before it
    reads on."""
    pos: Position
    resume: dict
    checkpoint_now: bool = False


@dataclass(frozen=True)
class Idle:
    """Nothing new in the log right now (lets the tail flush and check its deadline)."""


@dataclass(frozen=True)
class SchemaChange:
    """A captured table's shape changed at ``pos`` (an ALTER TABLE, a new Relation
    message): the reader decodes its rows from here on with the shape the source now
    gives (``table_schema``, ``describe_table``). Every change of the table before ``pos``
    was given out before it; none after. ``renamed``: the (old, new) column names the
    statement renamed, where only the statement says so (MySQL/MariaDB)."""
    table: str
    pos: Position
    renamed: tuple[tuple[str, str], ...] = ()
    non_strict: bool = False   # MySQL/MariaDB: the statement ran without strict mode


@dataclass(frozen=True)
class TableTruncated:
    """A captured table was emptied at ``pos`` (TRUNCATE): every row before it is gone, and
    the rows after it come as row events (engine/schema_evolution.py: the targets follow
    it as a step of the table's history)."""
    table: str
    pos: Position
    source_ts: int = 0   # its commit time (ms since the epoch; 0: unknown)


@dataclass(frozen=True)
class TableBroken:
    """A captured table's rows changed at ``pos`` without row events (DROP TABLE, RENAME
    TABLE, CREATE OR REPLACE TABLE, DROP DATABASE): its targets stop before ``pos`` until it is
    re-dumped (engine/quarantine.py); the reader goes on."""
    table: str
    pos: Position
    why: str


LogItem = RowChange | WatermarkSeen | TxnEnd | Idle | SchemaChange | TableTruncated | TableBroken


@dataclass(frozen=True)
class ChunkPlan:
    """A chunk ``after < key <= end`` split into read partitions by ``bounds``:
    partition i covers ``bounds[i] < key <= bounds[i+1]`` (bounds[0] is ``after``,
    None meaning the start of the table; the last bound is ``end``)."""
    after: tuple | None
    end: tuple
    bounds: tuple[tuple | None, ...]
    rows: int  # how many keys the plan saw


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a source's set-up, with what to do about it."""
    what: str
    fix: str
    table: str = ""

    def __str__(self) -> str:
        where = f"[{self.table}] " if self.table else ""
        return f"{where}{self.what} -> {self.fix}"


class Source(Protocol):
    name: str
    tables: tuple[str, ...]
    config: SourceConfig   # its schema_changes setting is read at each SchemaChange

    def check(self) -> list[Problem]: ...
    def table_schema(self, table: str) -> TableSchema: ...
    def describe_table(self, table: str) -> dict: ...                   # a schema version, JSON-able
    def adopt_table(self, table: str, version: dict) -> TableSchema: ...  # decode with a stored version
    def ensure_watermark_table(self) -> None: ...
    def write_watermark(self, value: str) -> None: ...
    def max_key(self, table: TableSchema) -> tuple | None: ...
    def plan_chunk(self, table: TableSchema, after: tuple | None, upto: tuple,
                   size: int, parts: int) -> ChunkPlan | None: ...
    def range_predicates(self, table: TableSchema, plan: ChunkPlan) -> list[str]: ...
    def select_keys(self, table: TableSchema, keys: Sequence[tuple]) -> pa.Table: ...
    def keys_where(self, table: TableSchema, condition: str, limit: int) -> list[tuple]: ...
    def canonical_keys(self, table: TableSchema, keys: list[tuple]) -> list[tuple]: ...
    def equal_keys(self, table: TableSchema, candidates: list[tuple], known: list[str]) -> set[int]: ...
    def jdbc(self) -> tuple[str, dict[str, str]]: ...
    def prepare_log(self) -> None: ...
    def read_log(self, resume: dict | None, should_stop: Callable[[], bool]) -> Iterator[LogItem]: ...
    def confirm(self, resume: dict) -> None: ...
    def log_gap(self, resume: dict) -> str | None: ...
    def is_transient(self, error: BaseException) -> bool: ...
    def mark_shapes(self) -> None: ...   # the tables' shapes into the log here, where it does not say them
    def current_resume(self) -> tuple[Position, dict]: ...
    def close(self) -> None: ...
