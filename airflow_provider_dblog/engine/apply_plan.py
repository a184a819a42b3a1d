"""Planning an apply run: which tables, their schemas, each table's batch, which path.

A table's batch is every event with ``applied <= pos < frontier``: ``applied`` is the
target's checkpoint for the table, ``frontier`` is ``RedisState.frontier()``.
:func:`plan_table` works out the batch (creating the target table, resetting the
checkpoint of a recreated table, moving the checkpoint over an empty range, stopping
before a value no target can take and leaving out one a later change of its row releases:
engine/apply_hold.py). Both paths then execute it the
same way (engine/apply_batch.py: latest event per key, stage, merge), locally or on Spark.

A run's tables one after another, riding out outages: engine/apply_run.py (which first
finds, with engine/apply_survey.py, the tables with nothing to apply). The path
(:func:`choose_path`): up to ``apply.local_max_events`` events in-process, else Spark.

No Spark and no Airflow here.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .apply_hold import held_at, latest_per_key, released  # noqa: F401 - (latest_per_key: imported from here)
from .apply_survey import Survey, survey
from .config import Config, SourceConfig
from .errors import NoPrimaryKeyError, SourceSetupError, SourceUnavailableError, UnknownTableError
from .positions import Position
from .retry import Retrier
from .schema import TableSchema
from .quarantine import fix_for, quarantine_table, release_refused_shape, settle
from .schema_evolution import Evolution, kept_name_reused, version_evolution
from .schema_history import version_at
from .sweep import sweep_table
from .targets.base import append_changelog

log = logging.getLogger(__name__)

LOCAL, SPARK = "local", "spark"


# -- what a run applies ------------------------------------------------------------------
def resolve_tables(scfg: SourceConfig, tables: str | list[str] | None) -> list[str]:
    """The requested tables (a list or comma-separated ``db.table``), checked; all if none."""
    if isinstance(tables, str):
        tables = [t.strip() for t in tables.split(",") if t.strip()]
    return [scfg.table(t) for t in tables] if tables else list(scfg.tables)


def load_schemas(scfg: SourceConfig, tables: list[str], schema_file: str = "",
                 retry_for_s: float = 0.0, store=None) -> dict[str, TableSchema]:
    """The tables' schemas: from ``schema_file`` (JSON ``{db.table: TableSchema.to_dict()}``)
    if given, else asked from the source; the source away: asked again with backoff for up
    to ``retry_for_s`` (``apply.retry_for_s``: an apply outlives a source restart too). A
    table gone from the source (renamed away, dropped: the tail quarantined it) takes the
    latest shape the tail recorded in ``store``, so that it stops only itself; so does one
    the catalog cannot give (a column of a type no target holds, no key any more)."""
    if schema_file:
        with open(schema_file) as f:
            raw = json.load(f)
        missing = [t for t in tables if t not in raw]
        if missing:
            raise ValueError(f"{schema_file} has no schema for {missing}")
        return {t: TableSchema.from_dict(raw[t]) for t in tables}
    from .sources import open_source

    source = open_source(scfg)

    def schema(t: str) -> TableSchema:
        try:
            return source.table_schema(t)
        except (UnknownTableError, SourceSetupError, NoPrimaryKeyError):
            versions = store.schema_versions(t) if store is not None else []
            if not versions:
                raise
            return TableSchema.from_dict(versions[-1][1]["schema"])

    def ask() -> dict[str, TableSchema]:
        try:
            return {t: schema(t) for t in tables}
        except Exception:
            source.close()  # a dead connection: the next attempt opens a new one
            raise
    try:
        if retry_for_s <= 0:
            return ask()
        retry = Retrier("apply.retry_for_s", retry_for_s, source.is_transient, SourceUnavailableError)
        return retry.run(ask, f"schemas of {', '.join(tables)} from source {scfg.name}")
    finally:
        source.close()


def events_in_range(store, files: list[str], lo: str, hi: str, stop_above: int | None = None) -> int:
    """How many events ``files`` hold with ``lo <= pos < hi`` (``pos`` column alone; a
    replayed flush's twice); with ``stop_above``, some number above it once passed."""
    n = 0
    for f in files:
        pos = pq.read_table(f, columns=["pos"], filesystem=store.fs)["pos"]
        n += pc.sum(pc.and_(pc.greater_equal(pos, lo), pc.less(pos, hi)).cast("int64")).as_py() or 0
        if stop_above is not None and n > stop_above:
            break
    return n


@dataclass
class Batch:
    """One table's batch. ``result`` is set when there is nothing to stage (the status is
    final: ``no_frontier``, ``up_to_date`` or ``empty``); else ``events`` wait in ``files``.
    ``schema``: the shape of its events (read with it); ``write_schema``: its columns the
    target has (``ignore`` keeps columns out); ``evolve``: the change of shape the target
    takes where the batch ends (engine/schema_evolution.py), with the new shape."""
    schema: TableSchema
    applied: Position | None
    frontier: Position | None
    files: list[str] = field(default_factory=list)
    events: int = 0
    out: dict = field(default_factory=dict)
    result: dict | None = None
    started: float = field(default_factory=time.monotonic)
    held: dict | None = None   # {"at": pos, "error": why}: the batch stops before an uncarried value
    quarantined: dict | None = None   # engine/quarantine.py: the batch stops before the table's change
    write_schema: TableSchema | None = None
    evolve: tuple[Evolution, TableSchema] | None = None
    released: pa.Array | None = None   # positions left out of the merge (apply_hold.released)

    @property
    def status(self) -> str:
        """Of a batch that ran: it stopped early for a reason, or it was applied."""
        return "quarantined" if self.quarantined else "held" if self.held else "applied"

    @property
    def lo(self) -> str:
        return self.applied.encode() if self.applied else ""

    @property
    def hi(self) -> str:
        return self.frontier.encode()

    def finish(self, status: str, **more) -> dict:
        if self.quarantined:
            status = "quarantined"
        return self.out | {"status": status, "seconds": round(time.monotonic() - self.started, 3)} | more


def shape_at(versions: list[tuple[Position, dict]], catalog: TableSchema, applied: Position | None) -> TableSchema:
    """The table's shape holding at ``applied`` (engine/schema_history.py; the first
    version before any: the tail records one at its first checkpoint; the catalog's when
    none is recorded): the shape of a batch's events from there, and of the target."""
    if not versions:
        return catalog
    version = (version_at(versions, applied) if applied is not None else None) or versions[0][1]
    return TableSchema.from_dict(version["schema"])


def next_change(versions: list[tuple[Position, dict]], applied: Position | None,
                frontier: Position) -> tuple[Position, Evolution, TableSchema] | None:
    """The first version after ``applied`` and up to ``frontier`` that changes the table's
    shape (a batch ends there), with its evolution and its shape; None if none does. One at
    the frontier is taken too: the tail wrote it before its checkpoint reached it (a
    change with no event after it yet, e.g. an ALTER on a quiet table, reaches the target)."""
    for (_, before), (at, version) in zip(versions, versions[1:]):
        if (applied is None or at > applied) and at <= frontier:
            ev = version_evolution(before, version)
            if ev.changed:
                return at, ev, TableSchema.from_dict(version["schema"])
    return None


def plan_table(target, store, state, source_name: str, schema: TableSchema) -> Batch:
    """The table's batch, with the bookkeeping both paths do before staging: stop before a
    quarantined change (or release it); forget the checkpoint of a target table that was
    dropped (re-apply from the start); create the target table in the shape holding at the
    checkpoint; end the batch at the next change of shape, which the target takes as its
    checkpoint moves there; move the checkpoint over a range without events."""
    started = time.monotonic()
    table = schema.qualified
    frontier = state.frontier()
    versions = store.schema_versions(table) if frontier is not None else []
    quarantine = None if frontier is None else settle(target, state, source_name, table, versions,
                                                      lambda at: shape_at(versions, schema, at))
    if quarantine is not None:   # the batch stops before the change, in the shape before it
        frontier = min(frontier, Position.decode(quarantine["at"]))
    applied = target.applied_pos(source_name, table)
    if applied is not None and not target.exists(table):
        # the target table was dropped (by hand): its checkpoint no longer says anything
        log.warning("%s: target table was recreated; re-applying from the start of the log", table)
        target.reset_applied(source_name, table)
        applied = None
    if frontier is not None and release_refused_shape(target, state, source_name, table, versions,
                                                      lambda at: shape_at(versions, schema, at), applied, frontier):
        applied = target.applied_pos(source_name, table)   # rebuilt in a later shape it holds
    shape = shape_at(versions, schema, applied)
    target.ensure_table(shape)
    change = next_change(versions, applied, frontier) if frontier is not None else None
    have = set(target.columns(table))
    folds = getattr(target, "folds_case", False)
    if change is not None and (why := kept_name_reused(change[1], shape, change[2], have, folds)):
        change = (change[0], replace(change[1], problems=(why,)), change[2])
    if change is not None and not change[1].compatible:   # a quarantine whose record is gone: stop too,
        why = f"changed at {change[0]}: {change[1].describe()}"   # recorded again so that a dump releases it
        quarantine_table(state, table, change[0], why)
        quarantine = {"at": change[0].encode(), "why": why, "fix": fix_for(table)} | {
            k: v for k, v in (quarantine or {}).items() if k == "releasing"}   # (a release after this batch)
        frontier, change = change[0], None
    ahead = frontier   # a held value's fix may lie past the change the batch ends at (held_at)
    if change is not None:
        frontier = change[0]
    b = Batch(shape, applied, frontier, started=started, quarantined=quarantine,
              write_schema=TableSchema(shape.database, shape.name,
                                       tuple(c for c in shape.columns if c.name in have), shape.key),
              evolve=None if change is None else (change[1], change[2]))
    b.out = {"from": applied.encode() if applied else None, "to": frontier.encode() if frontier else None,
             "files": 0, "events": 0, "rows": 0, "inserted": 0, "updated": 0, "deleted": 0, "stale": 0}
    if quarantine is not None:
        b.out["quarantined"] = quarantine
    if frontier is None:
        b.result = b.finish("no_frontier")
        return b
    if applied is not None and frontier <= applied:
        b.result = b.finish("up_to_date")
        return b
    b.files = store.files_with_events(table, applied, frontier)   # (both paths read them in its shape)
    b.out["files"] = len(b.files)
    if b.files:
        more = b.files if ahead <= frontier else store.files_for_range(table, applied, ahead)
        at, why = ((None, None) if b.evolve and b.evolve[0].truncate   # nothing before a TRUNCATE outlives it
                   else held_at(store, more, b.lo, b.hi, ahead.encode()))
        if at is not None:   # stop before the first event no target can take (held_at)
            b.held = b.out["held"] = {"at": at.encode(), "error": why}
            b.evolve = None
            log.warning("%s: apply held at %s: %s", table, at, why)
            if applied is not None and at <= applied:
                b.result = b.finish("held")
                return b
            b.frontier, b.out["to"] = at, at.encode()
        elif b.evolve is not None and not b.evolve[0].truncate:   # a refused value fixed past the change
            b.released = released(target, store, more, b.lo, b.hi, ahead.encode())
        b.events = b.out["events"] = events_in_range(store, b.files, b.lo, b.hi)
    if b.evolve is not None:
        b.out["evolved"] = [{"at": b.hi, "change": b.evolve[0].describe()}]
    if not b.events:   # (a TRUNCATE it ends at is still a changelog row: targets/changelog.py)
        b.out |= {"changelog_rows": n} if (n := append_changelog(target, b.write_schema, [], source_name,
                                                                  b.frontier, b.evolve)) is not None else {}
        target.advance_applied(source_name, shape, b.frontier, evolve=b.evolve)
        b.result = b.finish("held" if b.held else "empty")
    return b


def pending_ranges(target, store, state, source_name: str, tables: list[str],
                   found: Survey | None = None) -> Iterator[tuple[str, list[str], str, str]]:
    """``(table, files, lo, hi)`` of each table with events still to apply, read-only. A
    target table that does not exist counts from the start of the log (:func:`plan_table`
    will reset it). ``found``: the run's survey, if made already (its quiet tables left out)."""
    found = found or survey(target, store, state, source_name, tables)
    frontier = found.frontier
    if frontier is None:
        return
    for table in tables:
        if table in found.quiet:
            continue
        applied = target.applied_pos(source_name, table) if target.exists(table) else None
        if applied is None or applied < frontier:
            files = store.files_for_range(table, applied, frontier)
            yield table, files, applied.encode() if applied else "", frontier.encode()


def held_tables(target, store, state, source_name: str, tables: list[str]) -> dict[str, dict]:
    """The tables whose apply to ``target`` is held (``held_at``) right now:
    {table: {"at": position, "error": why}}, read-only (``dblog status``)."""
    out: dict[str, dict] = {}
    for table, files, lo, hi in pending_ranges(target, store, state, source_name, tables):
        at, why = held_at(store, files, lo, hi) if files else (None, None)
        if at is not None:
            out[table] = {"at": at.encode(), "error": why}
    return out


def pending_events(target, store, state, source_name: str, tables: list[str],
                   stop_above: int | None = None, found: Survey | None = None) -> int:
    """Events still to apply in ``tables`` (a replayed flush's count twice), without
    changing anything: the basis of :func:`choose_path`."""
    n = 0
    for _, files, lo, hi in pending_ranges(target, store, state, source_name, tables, found):
        n += events_in_range(store, files, lo, hi, None if stop_above is None else stop_above - n)
        if stop_above is not None and n > stop_above:
            break
    return n


def choose_path(config: Config, target, store, state, source_name: str,
                tables: list[str]) -> tuple[str, int, Survey | None]:
    """``("local", events, survey)`` when the run's events fit ``apply.local_max_events``,
    else ``("spark", events, survey)`` (``events`` then only says "more than the limit");
    ``survey``: the run's (engine/apply_survey.py), which the in-process run takes over."""
    limit = config.apply.local_max_events
    if limit <= 0:
        return SPARK, -1, None
    found = survey(target, store, state, source_name, tables)
    n = pending_events(target, store, state, source_name, tables, stop_above=limit, found=found)
    return (LOCAL if n <= limit else SPARK), n, found


def with_sweep(result: dict, target, target_name: str, store, state, source_cfg: SourceConfig,
               schema: TableSchema) -> dict:
    """After a table's batch (either path): run the orphan sweep of a finished full-table
    dump once the apply has reached it (``engine/sweep.py``)."""
    deleted = sweep_table(target, target_name, store, state, source_cfg, schema)
    return result if deleted is None else result | {"orphans_deleted": deleted}
