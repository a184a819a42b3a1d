"""The chunk lifecycle: Algorithm 1 steps 2-4 per chunk, then reconcile on the HW.

Every driver of a dump (``DumpRunner.run`` in the Spark dump job, the Airflow chunk,
sensor and reconcile tasks) goes through these steps and nothing else writes a watermark
or a request's state:

1. ``next_chunk_of``: the request's flags and status, then its next chunk (None: done);
2. ``open_chunk``: an exclusive window (its floor holds the apply frontier back), the LW;
3. ``select_chunk``: the chunk's rows (step 3 of the paper);
4. ``write_hw``: the HW;
5. ``finish_chunk``: wait until the tail has made the log durable through the HW,
   reconcile (steps 6-7), write the snapshot, and only then move chunk progress and close
   the window together (invariant 5; a chunk must advance); the request is done when its last table is;
6. ``fail_window``: a chunk that failed between its LW and its finish closes its window
   as failed (no longer holding the apply frontier back) and marks the request failed.

``DumpRunner.run`` rides out the source or Redis going away: a chunk that meets a
connection error is redone from step 1, in a new window, with backoff for up to
``dump.retry_for_s`` (engine/retry.py), then SourceUnavailableError. Progress moves only
when a chunk completes, so completed chunks are never redone, and a rerun resumes.

One runner per request: a runner holds the request's lease (``holding``,
``engine/request_lease.py``) and checks it before each write; the chunk's completion is
fenced by its token. A window whose runner died is closed by the tail once it is older
than ``dump.abandon_after`` (``RedisState.close_abandoned_windows``). The tail never
waits for any of this (invariant 3).
"""
from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Protocol

import pyarrow as pa
import redis

from .chunk_plan import ChunkPlanner
from .chunks import MISSING_SHOWN, ChunkTask, DumpSummary, check_advance, fail_window, missing_note  # noqa: F401
from .config import DumpConfig
from .dump_ahead import ChunkAhead
from .errors import (ChunkShapeChangedError, ConfigError, DumpCancelledError, DumpPausedError, LeaseLostError,
                     SourceUnavailableError)
from .keys import encode_scalar
from .positions import ZERO
from .reconcile import reconcile
from .request_lease import RequestLease
from .requests import DumpSpec, request_or_raise, validate_spec
from .retry import Retrier, count_retry, redis_is_transient
from .schema import TableSchema
from .schema_history import chunk_shape_problem
from .sources.base import Source
from .state import RedisState
from .windows import Window
from .store import EventStore
from .sweep import orphan_sweep

SHAPE_REDOS = 5   # a chunk selected again at once after its table changed shape, in a row

log = logging.getLogger(__name__)


class ChunkReader(Protocol):
    """Reads a planned key range of a table (Spark JDBC in production). A reader whose errors
    the source cannot judge (a JVM's) may also have ``is_transient(error) -> bool``."""

    def read(self, table: TableSchema, predicates: list[str], dest_uri: str, keep_file: bool = True) -> pa.Table: ...


class DumpRunner:
    """A request's chunks, each through the lifecycle above; ``run`` drives them in one process."""

    def __init__(self, source: Source, state: RedisState, store: EventStore,
                 reader: ChunkReader | None, config: DumpConfig,
                 on_chunk: Callable[[str, dict], None] | None = None):
        self.source, self.state, self.store, self.reader = source, state, store, reader
        self.config = config
        self.on_chunk = on_chunk or (lambda table, progress: None)
        self._watermark_table_ready = False
        self.lease: RequestLease | None = None  # while this runner holds a request (``holding``)
        self.retrying = False  # inside ``run``: a chunk that failed transiently is redone
        self.ahead: ChunkAhead | None = None   # inside ``run`` with dump.pipeline

    def is_transient(self, error: BaseException) -> bool:
        """The source or Redis away (down, restarting, the connection cut), as Redis, the source
        or the chunk reader tell: a retry after a pause may get past it."""
        reader_says = getattr(self.reader, "is_transient", None)
        return (isinstance(error, ChunkShapeChangedError) or redis_is_transient(error) or self.source.is_transient(error)
                or bool(reader_says is not None and reader_says(error)))

    def _fail_window(self, window: Window, error: BaseException, step: str) -> None:
        """``fail_window`` unless this runner lost the request; a chunk about to be redone
        leaves the request's status alone. With Redis away the window stays open: the redo's
        ``open_chunk`` closes it as abandoned (or the tail, after ``dump.abandon_after_s``)."""
        try:
            if self._holds():
                fail_window(self.state, window, error, step,
                            request_failed=not (self.retrying and self.is_transient(error)))
        except redis.RedisError as e:
            log.warning("window %s of %s left open (Redis: %s): it is closed as abandoned later",
                        window.id, window.table, e)

    def _after_failure(self, error: BaseException) -> None:
        self.source.close()  # its connections are dead: the next use opens new ones
        count_retry(self.state, "dump_retries")

    @contextmanager
    def holding(self, rid: str, wait_s: float | None = None) -> Iterator[RequestLease]:
        """Hold the request's lease for the block (another runner has it: wait up to
        ``wait_s``, default one lease TTL, then RequestBusyError); every write of the
        block checks it."""
        ttl = self.config.lease_seconds
        with RequestLease(self.state, rid, ttl, ttl if wait_s is None else wait_s) as lease:
            self.lease = lease
            try:
                yield lease
            finally:
                self.lease = None

    def _check_lease(self) -> None:
        if self.lease is not None:
            self.lease.check()

    def _holds(self) -> bool:
        """False when this runner held the request's lease and lost it: then it writes nothing,
        not even a failure (the request is its new runner's)."""
        return self.lease is None or self.lease.holds()

    def submit(self, spec: DumpSpec) -> str:
        spec = validate_spec(self.source, spec, self.config)
        return self.state.create_request(spec.to_dict())

    def spec(self, rid: str) -> DumpSpec:
        return DumpSpec.from_dict(request_or_raise(self.state, rid)["spec"])

    def run(self, rid: str, max_chunks: int | None = None, wait_lease: float | None = None) -> DumpSummary:
        """Run (or resume) a request from its last completed chunk. This process owns the
        request while it runs (its lease; another runner has it: wait up to ``wait_lease``
        seconds, default one lease TTL, then RequestBusyError): windows an earlier run of it
        left open are abandoned."""
        spec = self.spec(rid)
        status = self.state.request(rid)["status"]
        if status in ("done", "cancelled"):
            log.info("request %s is already %s", rid, status)
            return self._summary(rid, spec, 0.0)
        with self.holding(rid, wait_lease):
            return self._run(rid, spec, max_chunks)

    def _run(self, rid: str, spec: DumpSpec, max_chunks: int | None) -> DumpSummary:
        started = time.monotonic()
        done = 0
        for w in self.state.open_windows():  # left by an earlier run of the request (crashed)
            if w.request == rid:
                self.state.close_window(w, "abandoned")
        retry = Retrier("dump.retry_for_s", self.config.retry_for_s, self.is_transient, SourceUnavailableError,
                        self._after_failure)
        what = f"dump request {rid} of source {self.state.source}"
        self.retrying = True
        self.ahead = ChunkAhead(self) if self.config.pipeline else None
        try:
            while max_chunks is None or done < max_chunks:
                more = max_chunks is None or done + 1 < max_chunks   # a chunk after this one may be selected
                if not retry.run(lambda: self._one_chunk_in_its_shape(rid, more), what):
                    break
                done += 1
            else:  # --max-chunks reached
                self._check_lease()
                self.state.set_request_status(rid, "paused" if self.next_chunk(rid) is not None else "done")
        except (DumpPausedError, DumpCancelledError) as e:  # status set by next_chunk_of
            log.info("%s", e)
            if isinstance(e, DumpCancelledError):
                raise
        except LeaseLostError:
            raise  # the request is someone else's now: its status is theirs to write
        except Exception as e:
            try:
                self._check_lease()  # lost meanwhile: LeaseLostError, and write nothing
                self.state.set_request_status(rid, "failed", f"{type(e).__name__}: {e}")
            except redis.RedisError:  # Redis is what is away: the error says so, its status waits
                pass
            raise
        finally:
            self.retrying = False
            if self.ahead is not None:
                self.ahead.close()
                self.ahead = None
        return self._summary(rid, spec, time.monotonic() - started, retry.retries)

    def _one_chunk_in_its_shape(self, rid: str, more: bool = False) -> bool:
        """``_one_chunk``; a chunk whose table changed shape under it is selected again at once in
        the new shape (an expected redo, not an outage: no pause; ``chunks_redone``), up to
        SHAPE_REDOS times in a row; past that the retrier pauses (a table that never holds still)."""
        for _ in range(SHAPE_REDOS):
            try:
                return self._one_chunk(rid, more)
            except ChunkShapeChangedError as e:
                count_retry(self.state, "chunks_redone")
                log.info("dump request %s: %s", rid, e)
        return self._one_chunk(rid, more)

    def _one_chunk(self, rid: str, more: bool = False) -> bool:
        """Steps 1-5 for the request's next chunk (made ready while the one before it
        finished, when it was: dump_ahead.py); False when none is left. ``more``: the
        chunk after it is made ready meanwhile."""
        ready = self.ahead.take() if self.ahead is not None else None
        if ready is not None and self.ahead.stopping(rid):   # a flag set while it was selected
            self.ahead.give_up(ready, "the request was paused or cancelled meanwhile")
            ready = None
        if ready is not None:
            task, window, rows = ready
        else:
            task = self.next_chunk_of(rid)
            if task is None:
                return False
            window, rows = self.open_and_select(task)
        if more and self.ahead is not None:
            self.ahead.start(rid, task, window)
        try:
            self.finish_chunk(task, window, rows)
        except BaseException:
            if self.ahead is not None:
                self.ahead.drop("the chunk before it did not finish")
            raise
        return True

    # -- 1. the next chunk ---------------------------------------------------------
    def next_chunk_of(self, rid: str) -> ChunkTask | None:
        """The request's flags, then its next chunk. Done: None. Cancel: its open windows are
        closed as cancelled, status cancelled, DumpCancelledError. Pause: status paused,
        DumpPausedError. No chunk left: status done, None."""
        self._check_lease()
        req = request_or_raise(self.state, rid)
        if req["status"] == "done":
            return None
        if req["status"] == "cancelled" or self.state.flag(rid, "cancel"):
            for w in self.state.open_windows():
                if w.request == rid:
                    self.state.close_window(w, "cancelled")
            self.state.set_request_status(rid, "cancelled")
            raise DumpCancelledError(f"dump request {rid} was cancelled")
        if self.state.flag(rid, "pause"):
            self.state.set_request_status(rid, "paused")
            raise DumpPausedError(f"dump request {rid} is paused: resume it to go on")
        task = self.next_chunk(rid)
        if task is None:
            self.state.set_request_status(rid, "done")
            log.info("dump request %s is done: every chunk of %s completed", rid,
                     ", ".join(DumpSpec.from_dict(req["spec"]).tables))
        return task

    # -- 2. the window and the LW -------------------------------------------------------
    def open_chunk(self, task: ChunkTask, abandon_after_s: float,
                   keep: str | None = None) -> tuple[Window, list[Window]]:
        """Open the chunk's window, then write its LW (step 2). One chunk of a request at a
        time: a window of the request younger than ``abandon_after_s`` is a chunk in flight
        (ChunkInFlightError, nothing written); older ones were left by a crashed run and are
        closed as abandoned (returned); but window ``keep``, the chunk before this one still
        finishing (dump_ahead.py). The window's floor is the tail's checkpoint."""
        if not self._watermark_table_ready:
            self.source.ensure_watermark_table()
            self._watermark_table_ready = True
        self._check_lease()
        self.state.set_request_status(task.request, "running")
        cp = self.state.checkpoint()
        if cp is None:
            log.warning("source %s has no tail checkpoint yet: the window waits until a log tail runs",
                        self.state.source)
        window, abandoned = self.state.open_exclusive_window(task.request, task.table, cp.pos if cp else ZERO,
                                                             abandon_after_s, keep)
        for w in abandoned:
            log.warning("closed window %s of %s (opened %.0fs ago) as abandoned: its chunk is redone",
                        w.id, w.table, time.time() - w.opened_at)
        try:
            self._check_lease()
            self.source.write_watermark(window.lw)                                  # step 2
        except BaseException as e:
            self._fail_window(window, e, "lw")
            raise
        return window, abandoned

    def open_and_select(self, task: ChunkTask, keep: str | None = None) -> tuple[Window, pa.Table]:
        """Steps 2-4 of a chunk (window and LW, select, HW); a failure between closes the window."""
        window, _ = self.open_chunk(task, abandon_after_s=0.0, keep=keep)
        try:
            rows = self.select_chunk(task, window)
            self.write_hw(window)
        except BaseException as e:
            self._fail_window(window, e, "select")
            raise
        return window, rows

    # -- planning (chunk_plan.py) -----------------------------------------------
    def next_chunk(self, rid: str) -> ChunkTask | None:
        """The request's next chunk, from the progress of its last completed chunk."""
        return ChunkPlanner(self.source, self.state).next_chunk(rid, self.spec(rid))

    # -- one chunk: Algorithm 1 steps 2-4, then 6-7 ----------------------------
    # -- 3. the select, 4. the HW ---------------------------------------------------------
    def select_chunk(self, task: ChunkTask, window: Window, keep_file: bool = False) -> pa.Table:
        """Step 3: the chunk's rows (``keep_file``: kept as Parquet too, for a finish in another
        process; a runner's are written once, as the snapshot). A select failed by a change of
        shape (a column gone) is redone in the new shape (ChunkShapeChangedError)."""
        schema = self.source.table_schema(task.table)
        if task.keys is None and self.reader is None:
            raise ConfigError("a key-range chunk needs a chunk reader (Spark)")
        try:
            if task.keys is None:
                return self.reader.read(schema, task.predicates,
                                        self.store.chunk_uri(task.request, task.table, window.id), keep_file)
            rows = self.source.select_keys(schema, [schema.parse_key(k) for k in task.keys])
        except Exception as e:
            if self.source.refresh_schema(task.table) != schema:
                raise ChunkShapeChangedError(f"{task.table} changed shape while a chunk was selected ({e}): the "
                                             "chunk is selected again in the new shape") from e
            raise
        if keep_file:
            self.store.write_chunk(task.request, task.table, window.id, rows)
        return rows

    def write_hw(self, window: Window) -> None:
        self._check_lease()
        self.source.write_watermark(window.hw)                                     # step 4

    def finish_chunk(self, task: ChunkTask, window: Window, rows: pa.Table | None = None,
                     timeout_s: float | None = None) -> dict:
        """Wait for the HW in the log, reconcile (steps 6-7), write the snapshot, and only
        then move chunk progress and close the window, together (invariant 5)."""
        schema = self.source.table_schema(task.table)
        check_advance(self.source, self.state, task, schema, lambda e: self._fail_window(window, e, "progress"))
        t0 = time.monotonic()
        try:
            lw, hw = self.state.wait_window(window, timeout_s or self.config.window_timeout_s)
            hw_wait = time.monotonic() - t0
        except Exception as e:
            self._fail_window(window, e, "wait_hw")
            raise
        try:   # a failure here (reconcile, snapshot, progress) closes the window as failed
            problem = chunk_shape_problem(self.store.schema_versions(task.table), schema, lw, hw)
            if problem is not None:
                # the chunk is redone in the table's new shape (a runner retries it at once)
                self.source.refresh_schema(task.table)
                err = ChunkShapeChangedError(f"{problem}: the chunk is selected again in the new shape")
                self._fail_window(window, err, "reconcile")
                raise err
            if rows is None:
                # as selected: a Spark chunk's text columns are parsed here (conform_chunk)
                rows = self.source.conform_chunk(schema, self.store.read_chunk(task.request, task.table, window.id))
            requested = [schema.parse_key(k) for k in task.keys] if task.keys is not None else None
            in_window = self.store.read_range(schema, lw, hw)
            result = reconcile(schema, rows, in_window, hw, requested_keys=requested,
                               equal_keys=lambda a, b: self.source.equal_keys(schema, a, b))
            self._check_lease()
            verifying = self.spec(task.request).verify
            if verifying:   # a verification: the rows as of the HW kept for its comparison (verify_run.py)
                self.store.write_verified(task.request, schema, lw, hw, result.events)
            else:
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
            sweep = orphan_sweep(task.request, task.table, progress) if task.last and not verifying else None
            self.state.complete_chunk(task.request, task.table, progress, window, detail, sweep,
                                      lease_token=self.lease.token if self.lease is not None else None)
        except BaseException as e:
            self._fail_window(window, e, "finish")   # closed already (shape, lease, abandoned): left as it is
            raise
        self.store.remove_chunk(task.request, task.table, window.id)
        log.info("%s chunk %d: %d rows selected, %d kept, %d dropped as stale, %d window events; "
                 "HW durable after %.2f s, chunk finished in %.2f s%s", task.table, progress["chunks"],
                 result.selected, result.kept, result.dropped, in_window.num_rows, detail["hw_wait_s"],
                 detail["finish_s"], missing_note(result.missing))
        self.on_chunk(task.table, dict(progress))
        request_done = task.last and self.request_done(task.request)
        if request_done:
            self.state.set_request_status(task.request, "done")
        return detail | {"table_done": task.last, "request_done": request_done}

    def request_done(self, rid: str) -> bool:
        """Every table of the request has its last chunk completed (a table not started yet
        is not done: the next chunk task finds it, or finds it empty and marks it done)."""
        return all(self.state.progress(rid, t).get("done") for t in self.spec(rid).tables)

    def _summary(self, rid: str, spec: DumpSpec, seconds: float, retries: int = 0) -> DumpSummary:
        return DumpSummary(rid, {t: self.state.progress(rid, t) for t in spec.tables}, seconds, retries)
