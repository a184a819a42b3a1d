"""Dump orchestration: Algorithm 1 steps 2-4 per chunk, then reconcile on the HW.

For each chunk: open a window (its floor holds the apply frontier back), write
the LW, select the chunk, write the HW, wait until the tail has made the log
durable through the HW, reconcile, write the snapshot, and only then move chunk
progress and close the window together (invariant 5). The tail never waits for
any of this (invariant 3).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

import pyarrow as pa

from .config import DumpConfig
from .errors import ConfigError, DumpCancelledError, DumpPausedError, InvalidKeyError
from .events import encode_scalar
from .positions import ZERO
from .reconcile import reconcile
from .schema import TableSchema
from .sources.base import Source
from .state import RedisState, Window
from .store import EventStore
from .sweep import orphan_sweep

log = logging.getLogger(__name__)

SCOPES = ("all", "table", "keys", "where")
MAX_KEYS = 1_000_000


class ChunkReader(Protocol):
    """Reads a planned key range of a table (Spark JDBC in production)."""

    def read(self, table: TableSchema, predicates: list[str], dest_uri: str) -> pa.Table: ...


@dataclass
class DumpSpec:
    """What a user asked to dump. Validated before anything touches the source."""
    scope: str  # all | table | keys | where
    tables: list[str]
    keys: list[list] = field(default_factory=list)
    chunk_size: int | None = None
    parallelism: int | None = None
    where: str | None = None  # scope "where": resolved to a key list when submitted

    def to_dict(self) -> dict:
        return {"scope": self.scope, "tables": self.tables, "keys": self.keys,
                "chunk_size": self.chunk_size, "parallelism": self.parallelism, "where": self.where}

    @classmethod
    def from_dict(cls, d: dict) -> "DumpSpec":
        return cls(d["scope"], list(d["tables"]), list(d.get("keys") or []),
                   d.get("chunk_size"), d.get("parallelism"), d.get("where"))

    @property
    def by_keys(self) -> bool:
        """Key-list and WHERE dumps read rows by key with bound parameters."""
        return self.scope in ("keys", "where")


def validate_spec(source: Source, spec: DumpSpec, defaults: DumpConfig) -> DumpSpec:
    """Every field checked against the config and the table's key; errors say what is wrong."""
    if spec.scope not in SCOPES:
        raise ConfigError(f"scope must be one of {SCOPES}, not {spec.scope!r}")
    if spec.scope == "all":
        tables = list(source.tables)
    else:
        if len(spec.tables) != 1:
            raise ConfigError(f"scope {spec.scope!r} takes exactly one table, got {spec.tables!r}")
        tables = [source.config.table(spec.tables[0])]
    for name, value, lo, hi in (("chunk_size", spec.chunk_size, 1, 10_000_000),
                                ("parallelism", spec.parallelism, 1, 64)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi):
            raise ConfigError(f"{name} must be an integer from {lo} to {hi}, not {value!r}")
    keys: list[list] = []
    if spec.scope == "keys":
        if not spec.keys:
            raise InvalidKeyError("scope 'keys' needs at least one primary key")
        if len(spec.keys) > MAX_KEYS:
            raise InvalidKeyError(f"at most {MAX_KEYS:,} keys per request; split the list")
        schema = source.table_schema(tables[0])
        parsed = source.canonical_keys(schema, [schema.parse_key(k) for k in spec.keys])
        parsed = dict.fromkeys(parsed)  # drop repeats, keep order
        keys = [[encode_scalar(v) for v in k] for k in parsed]
    elif spec.scope == "where":
        # the condition picks the keys now (a bound, read-only select); their rows are
        # then dumped like a key list, so rows deleted meanwhile are deleted in targets
        schema = source.table_schema(tables[0])
        found = source.keys_where(schema, spec.where or "", MAX_KEYS)
        if len(found) > MAX_KEYS:
            raise ConfigError(f"the condition matches more than {MAX_KEYS:,} rows; dump the table instead")
        if not found:
            raise ConfigError(f"no row of {schema.qualified} matches {spec.where!r}: nothing to dump")
        keys = [[encode_scalar(v) for v in k] for k in found]
    else:
        for t in tables:
            source.table_schema(t)  # raises for a missing table or one without a key
    return DumpSpec(spec.scope, tables, keys, spec.chunk_size or defaults.chunk_size,
                    spec.parallelism or defaults.parallelism, spec.where if spec.scope == "where" else None)


@dataclass
class DumpSummary:
    request: str
    tables: dict[str, dict] = field(default_factory=dict)
    seconds: float = 0.0

    def total(self, name: str) -> int:
        return sum(t.get(name, 0) for t in self.tables.values())


@dataclass
class ChunkTask:
    """One chunk of a request: a key range (read on Spark) or a batch of keys (bound select).
    Plain data, so the steps of a chunk can run in different processes (Airflow tasks)."""
    request: str
    table: str
    predicates: list[str] = field(default_factory=list)
    keys: list[list] | None = None  # a key batch, JSON-typed (encode_scalar)
    end: str | None = None           # encode_key of the range's last key
    last: bool = False               # completing it completes the table

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict) -> "ChunkTask":
        return cls(**d)


class DumpRunner:
    """Runs a request chunk after chunk; each chunk is start -> select -> end -> finish."""

    def __init__(self, source: Source, state: RedisState, store: EventStore,
                 reader: ChunkReader | None, config: DumpConfig,
                 on_chunk: Callable[[str, dict], None] | None = None):
        self.source, self.state, self.store, self.reader = source, state, store, reader
        self.config = config
        self.on_chunk = on_chunk or (lambda table, progress: None)

    def submit(self, spec: DumpSpec) -> str:
        spec = validate_spec(self.source, spec, self.config)
        return self.state.create_request(spec.to_dict())

    def spec(self, rid: str) -> DumpSpec:
        req = self.state.request(rid)
        if req is None:
            raise ConfigError(f"unknown dump request {rid!r}")
        return DumpSpec.from_dict(req["spec"])

    def run(self, rid: str, max_chunks: int | None = None) -> DumpSummary:
        """Run (or resume) a request from its last completed chunk."""
        spec = self.spec(rid)
        status = self.state.request(rid)["status"]
        if status in ("done", "cancelled"):
            log.info("request %s is already %s", rid, status)
            return self._summary(rid, spec, 0.0)
        self.prepare(rid)
        started = time.monotonic()
        done = 0
        try:
            while max_chunks is None or done < max_chunks:
                self.check_flags(rid)
                task = self.next_chunk(rid)
                if task is None:
                    self.state.set_request_status(rid, "done")
                    return self._summary(rid, spec, time.monotonic() - started)
                window = self.start_chunk(task)
                rows = self.select_chunk(task, window)
                self.end_select(window)
                self.finish_chunk(task, window, rows)
                done += 1
            if self.next_chunk(rid) is None:
                self.state.set_request_status(rid, "done")
            else:
                self.state.set_request_status(rid, "paused")
        except DumpPausedError:
            self.state.set_request_status(rid, "paused")
        except DumpCancelledError:
            self.state.set_request_status(rid, "cancelled")
            raise
        except Exception as e:
            self.state.set_request_status(rid, "failed", f"{type(e).__name__}: {e}")
            raise
        return self._summary(rid, spec, time.monotonic() - started)

    def prepare(self, rid: str) -> None:
        """Before a run: the watermark table exists, and windows a crashed run of this
        request left open are closed as abandoned (their chunks are redone)."""
        self.source.ensure_watermark_table()
        for w in self.state.open_windows():
            if w.request == rid:
                self.state.close_window(w, "abandoned")
        self.state.set_request_status(rid, "running")

    # -- planning ------------------------------------------------------------
    def next_chunk(self, rid: str) -> ChunkTask | None:
        """The request's next chunk, from the progress of its last completed chunk."""
        spec = self.spec(rid)
        for table in spec.tables:
            schema = self.source.table_schema(table)
            task = (self._next_keys(rid, spec, schema) if spec.by_keys
                    else self._next_range(rid, spec, schema))
            if task is not None:
                return task
        return None

    def _next_range(self, rid: str, spec: DumpSpec, schema: TableSchema) -> ChunkTask | None:
        progress = self.state.progress(rid, schema.qualified)
        if progress.get("done"):
            return None
        if "max_key" not in progress:  # captured once, when the table's dump starts
            # the log head before the max key read bounds the orphan sweep (sweep.py)
            before, _ = self.source.current_resume()
            top = self.source.max_key(schema)
            progress = {"max_key": schema.encode_key(top) if top is not None else None, "last_key": None,
                        "chunks": 0, "rows": 0, "dropped": 0, "started_at": time.time(),
                        "head_before": before.encode()}
            self.state.save_progress(rid, schema.qualified, progress)
        if progress["max_key"] is None:
            return self._table_done(rid, schema, progress, end_read=True)
        upto = schema.decode_key(progress["max_key"])
        after = schema.decode_key(progress["last_key"]) if progress["last_key"] else None
        plan = self.source.plan_chunk(schema, after, upto, spec.chunk_size, spec.parallelism)
        if plan is None:  # the rows up to the max key are gone
            return self._table_done(rid, schema, progress, end_read=True)
        return ChunkTask(rid, schema.qualified, predicates=self.source.range_predicates(schema, plan),
                         end=schema.encode_key(plan.end), last=plan.end == upto)

    def _next_keys(self, rid: str, spec: DumpSpec, schema: TableSchema) -> ChunkTask | None:
        progress = self.state.progress(rid, schema.qualified)
        if progress.get("done"):
            return None
        if not progress:
            progress = {"done_keys": 0, "chunks": 0, "rows": 0, "dropped": 0, "missing": [],
                        "missing_count": 0, "started_at": time.time()}
            self.state.save_progress(rid, schema.qualified, progress)
        start = progress["done_keys"]
        if start >= len(spec.keys):
            return self._table_done(rid, schema, progress)
        batch = spec.keys[start:start + spec.chunk_size]
        return ChunkTask(rid, schema.qualified, keys=batch, last=start + len(batch) >= len(spec.keys))

    def _table_done(self, rid: str, schema: TableSchema, progress: dict, end_read: bool = False) -> None:
        """``end_read``: a read of the source just found no more rows (the sweep waits for
        the log up to here)."""
        if end_read and "head_before" in progress:
            progress["head_end"] = self.source.current_resume()[0].encode()
        progress["done"] = True
        self.state.save_progress(rid, schema.qualified, progress)
        sweep = orphan_sweep(rid, schema.qualified, progress)
        if sweep is not None:
            self.state.add_sweep(sweep)
        return None

    # -- one chunk: Algorithm 1 steps 2-4, then 6-7 ----------------------------
    def start_chunk(self, task: ChunkTask) -> Window:
        """Open the window (its floor holds the apply frontier back), then write the LW."""
        cp = self.state.checkpoint()
        window = self.state.open_window(task.request, task.table, cp.pos if cp else ZERO)
        self.source.write_watermark(window.lw)                                     # step 2
        return window

    def select_chunk(self, task: ChunkTask, window: Window) -> pa.Table:
        """Step 3: the chunk's rows, also kept as Parquet for a finish in another process."""
        schema = self.source.table_schema(task.table)
        if task.keys is not None:
            rows = self.source.select_keys(schema, [schema.parse_key(k) for k in task.keys])
            self.store.write_chunk(task.request, task.table, window.id, rows)
            return rows
        if self.reader is None:
            raise ConfigError("a key-range chunk needs a chunk reader (Spark)")
        return self.reader.read(schema, task.predicates,
                                self.store.chunk_uri(task.request, task.table, window.id))

    def end_select(self, window: Window) -> None:
        self.source.write_watermark(window.hw)                                     # step 4

    def finish_chunk(self, task: ChunkTask, window: Window, rows: pa.Table | None = None,
                     timeout_s: float | None = None) -> dict:
        """Wait for the HW in the log, reconcile (steps 6-7), write the snapshot, and only
        then move chunk progress and close the window, together (invariant 5)."""
        schema = self.source.table_schema(task.table)
        t0 = time.monotonic()
        try:
            lw, hw = self.state.wait_window(window, timeout_s or self.config.window_timeout_s)
            hw_wait = time.monotonic() - t0
        except Exception as e:
            self.state.close_window(window, "failed", {"error": f"{type(e).__name__}: {e}"})
            raise
        if rows is None:
            # as selected: a Spark chunk's text columns are parsed here (conform_chunk)
            rows = self.source.conform_chunk(schema, self.store.read_chunk(task.request, task.table, window.id))
        requested = [schema.parse_key(k) for k in task.keys] if task.keys is not None else None
        in_window = self.store.read_range(schema, lw, hw)
        result = reconcile(schema, rows, in_window, hw, requested_keys=requested)
        self.store.write_snapshot(schema, hw, result.events)
        progress = self.state.progress(task.request, task.table)
        progress["chunks"] += 1
        progress["rows"] += result.kept
        progress["dropped"] += result.dropped
        if task.end is not None:
            progress["last_key"] = task.end
            progress["last_hw"] = hw.encode()
        if task.keys is not None:
            progress["done_keys"] += len(task.keys)
            progress["missing"] = (progress["missing"] + [[encode_scalar(v) for v in k]
                                                          for k in result.missing])[:10_000]
            progress["missing_count"] = progress.get("missing_count", 0) + len(result.missing)
        progress["done"] = task.last
        progress["updated_at"] = time.time()
        detail = {"rows": result.kept, "dropped": result.dropped, "selected": result.selected,
                  "missing": len(result.missing), "window_events": in_window.num_rows,
                  "lw": lw.encode(), "hw": hw.encode(),
                  # hw_wait_s: until the tail had the HW durable; finish_s: all of this step
                  "hw_wait_s": round(hw_wait, 3), "finish_s": round(time.monotonic() - t0, 3)}
        sweep = orphan_sweep(task.request, task.table, progress) if task.last else None
        self.state.complete_chunk(task.request, task.table, progress, window, detail, sweep)
        self.store.remove_chunk(task.request, task.table, window.id)
        log.info("%s chunk %d: %d rows selected, %d kept, %d dropped as stale, %d window events",
                 task.table, progress["chunks"], result.selected, result.kept, result.dropped,
                 in_window.num_rows)
        self.on_chunk(task.table, dict(progress))
        return detail

    def check_flags(self, rid: str) -> None:
        if self.state.flag(rid, "cancel"):
            raise DumpCancelledError(f"dump {rid} cancelled")
        if self.state.flag(rid, "pause"):
            raise DumpPausedError(f"dump {rid} paused")

    def _summary(self, rid: str, spec: DumpSpec, seconds: float) -> DumpSummary:
        return DumpSummary(rid, {t: self.state.progress(rid, t) for t in spec.tables}, seconds)
