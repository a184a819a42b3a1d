"""The contract of an apply target (issue 28): what the apply, the quarantine, the orphan
sweep and recovery ask of any target, so that none of them branches on its kind. The
PostgreSQL target (postgres.py) implements it; a lake table target is one more
implementation.

A target holds, per captured source table, one current-state table (the source's
columns plus ``_dblog_pos``) and per (source, table) the *applied position*: every event
of the table below it is in the target. Its guarantees, whatever the kind:

- ``merge_batch``: a batch (the latest event per key, flattened to the table's columns
  plus ``_dblog_op`` / ``_dblog_pos``) is merged by position (a row is written or deleted
  only by a newer event: invariant 1) and the applied position moves to the batch's end
  **atomically with the rows**, so a crash at any instant neither loses nor doubles a
  batch and a replayed batch changes nothing; a change of the table's shape (``evolve``,
  including a TRUNCATE as a step of its history) is taken in the same step.
- ``advance_applied`` moves the position without rows (an empty batch), forward only.
- ``delete_orphans``: the sweep of a full dump (engine/sweep.py), done only once every
  event below ``until`` is applied, checked under the table's exclusive apply lock; a lake
  target hands the rows it is about to delete to ``before_delete`` before its delete
  commit (their changelog rows; PostgreSQL, which keeps no changelog, ignores it).
- ``drop_table`` / ``reset_applied``: a quarantined table rebuilt in its new shape.
- ``append_changelog`` (a lake target with ``changelog: true``): every event of a batch,
  and the TRUNCATE it ends at, appended exactly once to the table's ordered event log
  (changelog.py); :func:`append_changelog` is the apply's one way in. Changes of the
  table with no log event of their own (a sweep's deletes, a quarantine's rebuild) go in
  through :func:`append_marked` (``append_marked``, exactly once by position and op).

Nothing here imports Airflow.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Iterator, Protocol

import pyarrow as pa

from ..positions import Position
from ..schema import TableSchema

# an object store that cannot be reached (delta-rs's and pyarrow's OSError texts), as opposed
# to one that refuses (a bad credential, a missing bucket): the first is waited out
_UNREACHABLE = re.compile(r"connect|error sending request|timed out|timeout|broken pipe|reset by peer|"
                          r"unreachable|dns|NETWORK_CONNECTION|temporar", re.I)


def store_unreachable(error: BaseException) -> bool:
    """Whether ``error`` says a lake target's object store is away (retried by the apply)."""
    return isinstance(error, OSError) and bool(_UNREACHABLE.search(str(error)))


POS_COLUMN = "_dblog_pos"   # the position of the event that wrote the row
OP_COLUMN = "_dblog_op"     # a batch row's operation (c / u / d / r)
SWEEP, REBUILD = "sweep", "rebuild"   # the ops of changelog rows with no log event (append_marked)


@dataclass
class MergeResult:
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    stale: int = 0      # batch rows at or below the target's version (or the checkpoint)
    staged: int = 0     # batch rows considered (at or after the checkpoint, latest per key)
    checkpoint_moved: bool = False
    stage_s: float = 0.0   # time to hand the rows to the target
    merge_s: float = 0.0   # time to merge them and move the position

    def to_dict(self) -> dict:
        return asdict(self)


# The least retention (hours) each lake kind's maintenance takes (also the maintenance form's
# minimum): Delta's vacuum refuses less than delta.deletedFileRetentionDuration (7 days by
# default, which our tables keep); Iceberg keeps an hour for a running apply's data files,
# unreferenced until its commit.
MIN_RETENTION_HOURS = {"delta": 168, "iceberg": 1}


@dataclass
class MaintainReport:
    """What a lake table's maintenance did (``dblog maintain``, DBLogMaintainOperator)."""
    table: str
    files_before: int
    files_after: int
    bytes_before: int
    bytes_after: int
    version_before: int | None    # Delta version / Iceberg snapshot id
    version_after: int | None
    files_compacted: int = 0      # small files the compaction replaced
    files_vacuumed: int = 0       # unreferenced data files removed (or, dry run, that would be)
    versions_removed: int = 0     # Delta log versions / Iceberg snapshots expired
    z_order: list | None = None
    dry_run: bool = False
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


class Target(Protocol):
    config: Any   # its TargetConfig

    def is_transient(self, error: BaseException) -> bool: ...   # the target away: retry
    def close(self) -> None: ...

    # its tables
    def exists(self, table: TableSchema | str) -> bool: ...
    def check_table(self, table: TableSchema, names: list[str] | None = None) -> None: ...   # TargetShapeError:
    # a shape it cannot hold (``names``: the columns it would have, when not the source's); a target whose
    # ``holds_every_shape`` attribute is true (PostgreSQL) refuses none
    def ensure_table(self, table: TableSchema) -> bool: ...       # True if created
    def columns(self, table: TableSchema | str) -> list[str]: ...  # [] if absent
    def drop_table(self, table: TableSchema) -> None: ...
    def drop_all(self) -> list[str]: ...
    def count(self, table: TableSchema | str) -> int: ...
    def rows(self, table: TableSchema, with_pos: bool = False) -> list[dict[str, Any]]: ...
    # verification: the rows (batches of engine/verify_rows.py: each column in its logical
    # type's Arrow form, _dblog_pos, _dblog_bad) and the applied position of ``source``, both
    # of one consistent read of the table; rows with a ``close()`` (an open read) are closed by
    # the caller once compared, or when it stops before
    def read_at(self, table: TableSchema, source: str) -> tuple[Position | None, Iterator[pa.Table]]: ...
    # a lake table's Asset URI and its version (Delta version / Iceberg snapshot id); None for SQL
    def uri(self, table: TableSchema | str) -> str | None: ...
    def version(self, table: TableSchema | str) -> int | None: ...

    # the applied position
    def applied_pos(self, source: str, table: TableSchema | str) -> Position | None: ...
    def advance_applied(self, source: str, table: TableSchema | str, pos: Position,
                        evolve: tuple | None = None) -> bool: ...
    def reset_applied(self, source: str, table: TableSchema | str) -> None: ...

    # writes
    def merge_batch(self, table: TableSchema, pages: pa.Table | Iterable[pa.Table], source: str,
                    new_pos: Position, run_id: str, evolve: tuple | None = None) -> MergeResult: ...
    def delete_orphans(self, table: TableSchema, source: str, keep: pa.Table, below: Position,
                       until: Position, in_source=None,
                       before_delete: Callable[[pa.Table], None] | None = None) -> int | None: ...
    # the values it holds of each Arrow type where it holds less than the log carries (a lake's
    # dates: lake_values.ValueRanges), asked by the apply's planning (engine/apply_hold.py); a
    # target without this method (PostgreSQL) holds every value the log carries
    def value_ranges(self) -> Any: ...
    # only a target whose config has ``changelog: true``
    def append_changelog(self, table: TableSchema, events: Iterable[pa.Table], source: str, new_pos: Position,
                         truncated_ts: int | None = None) -> int: ...
    def append_marked(self, table: TableSchema, source: str, op: str, at: Position,
                      images: pa.Table | None = None) -> int: ...


def checkpoints(target: Target, source: str, tables: list[str]) -> dict[str, tuple[bool, Position | None]]:
    """{table: (its target table exists, its applied position)} of many tables: in one read
    where the target has a ``checkpoints`` method (PostgreSQL), else asked table by table;
    there, a table whose read fails for a reason of its own (its table damaged) is left out
    (an apply meets the error with that table alone), the target away is raised."""
    many = getattr(target, "checkpoints", None)
    if many is not None:
        return many(source, tables)
    out = {}
    for t in tables:
        try:
            there = target.exists(t)
            out[t] = (there, target.applied_pos(source, t) if there else None)
        except Exception as e:   # noqa: BLE001 - the table's own trouble
            if target.is_transient(e):
                raise
    return out


def advance_applied_many(target: Target, source: str, tables: dict[str, Position], pos: Position) -> None:
    """``advance_applied`` of many tables to ``pos`` (no rows, no change of shape), each only
    from the checkpoint given for it (``{table: applied}``, as read before): one that moved
    or was forgotten meanwhile (another run applied the table, or reset it to re-apply it
    from the start) is left as it is. In one transaction where the target has
    ``advance_applied_many`` (PostgreSQL), else one by one."""
    many = getattr(target, "advance_applied_many", None)
    if many is not None:
        many(source, tables, pos)
        return
    for t, applied in tables.items():
        if target.applied_pos(source, t) == applied:
            target.advance_applied(source, t, pos)


def append_changelog(target: Target, table: TableSchema, events: Iterable[pa.Table], source: str,
                     frontier: Position, evolve: tuple | None) -> int | None:
    """A batch's events below ``frontier`` (and, when the batch ends at a TRUNCATE that empties
    the target, that TRUNCATE: ``evolve``) into the table's changelog table, if the target
    keeps one; rows appended, None if it keeps none."""
    if not getattr(target.config, "changelog", False):
        return None
    ev = evolve[0] if evolve is not None else None
    return target.append_changelog(table, events, source, frontier,
                                   truncated_ts=ev.truncated_ts if ev is not None and ev.truncate else None)


def append_marked(target: Target, table: TableSchema, source: str, op: str, at: Position,
                  images: pa.Table | None = None) -> int | None:
    """Rows with no log event of their own into the table's changelog table, if the target
    keeps one (changelog.py): ``op`` (``sweep``: one per row of ``images``, the rows a sweep
    deletes; ``rebuild``: one, no images) at ``at``, in a commit of their own that leaves the
    changelog's position as it is; nothing when rows of that position and op are there
    already (a rerun's). ``at`` may be a log event's position too (``just_below`` a position
    inside a transaction): such a row orders after that event (README, changelog tables).
    Rows appended, None if the target keeps no changelog."""
    if not getattr(target.config, "changelog", False):
        return None
    return target.append_marked(table, source, op, at, images)
