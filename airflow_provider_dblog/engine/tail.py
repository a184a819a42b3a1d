"""The log tail: source log -> changelog segments -> fenced Redis checkpoint.

It never waits for a dump (invariant 3): watermarks are just rows whose
positions it records. A flush writes every table's events of the batch to files
named by the checkpoint the batch started from, makes them durable, and only
then moves the checkpoint and records the watermarks seen (invariant 5).
"""
from __future__ import annotations

import gc
import logging
import os
import socket
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

import pyarrow as pa
import redis

from .config import DumpConfig, TailConfig
from .events import Event
from .positions import Position
from .quarantine import quarantine_table
from .tail_shapes import TableShapes
from .sources.base import RowChange, SchemaChange, Source, TableBroken, TableTruncated, TxnEnd, WatermarkSeen
from .errors import LogGapError, SourceUnavailableError, StateLostError
from .recovery import earlier_history, log_gap_message, state_lost_message
from .retry import count_retry, pause_s, redis_is_transient
from .state import Checkpoint, RedisState
from .store import EventStore

log = logging.getLogger(__name__)

FULL_GC_EVERY_S = 30.0  # while the tail runs, cyclic garbage is collected by hand (see _loop)


@dataclass
class TailStats:
    events: int = 0
    watermarks: int = 0
    flushes: int = 0
    start: str = ""
    end: str = ""
    seconds: float = 0.0
    lag_s: float = 0.0  # now minus the source timestamp of the last event flushed
    skipped: bool = False  # another tail held the lease (past wait_lease)
    lease_holder: str = ""  # when skipped: the holder's token, and when its lease expires
    lease_expires_in_s: float | None = None
    retries: int = 0  # restarts from the checkpoint after the source or Redis was away
    per_table: dict = field(default_factory=lambda: defaultdict(int))
    dump_requests: list = field(default_factory=list)  # {"table", "request_id"} of tables new to the capture


def _expiry(seconds: float | None) -> str:
    if seconds is None:
        return "It has just ended."
    return (f"Its lease expires in {seconds:.1f}s unless that tail renews it (a live tail renews it "
            "every lease_seconds/3; a dead one does not).")


class _Progress:
    """A line in the log every ``every_s`` seconds while the tail runs (Airflow shows a task's
    log live): events, their rate since the last line, the lag, the checkpoint."""

    def __init__(self, source: str, every_s: float, started: float):
        self.source, self.every_s = source, every_s
        self.last_at, self.last_events = started, 0

    def maybe_report(self, stats: TailStats, checkpoint: Position) -> None:
        now = time.monotonic()
        if self.every_s <= 0 or now - self.last_at < self.every_s:
            return
        rate = (stats.events - self.last_events) / (now - self.last_at)
        log.info("tail %s: %d events, %d watermarks so far; %.0f events/s over the last %.0f s; "
                 "lag %.1f s; checkpoint %s", self.source, stats.events, stats.watermarks, rate,
                 now - self.last_at, stats.lag_s, checkpoint.encode())
        self.last_at, self.last_events = now, stats.events


class Tail:
    def __init__(self, source: Source, state: RedisState, store: EventStore, config: TailConfig,
                 owner: str | None = None, dump: DumpConfig | None = None):
        """``dump``: the config's dump section: a dump window open ``dump.abandon_after``
        whose request no runner holds is closed as abandoned
        (``RedisState.close_abandoned_windows``); a table new to the capture is dumped
        with its chunk size and parallelism."""
        self.source, self.state, self.store, self.config = source, state, store, config
        dump = dump or DumpConfig()
        self.abandon_after_s = dump.abandon_after
        self.owner = (owner or f"{socket.gethostname()}:{os.getpid()}").replace("|", "_")
        self.shapes = TableShapes(source, state, store, dump)   # each table's shape being read
        # pyarrow imports pandas the first time it converts a Python list (~0.4 s on a
        # small VM): pay that once here rather than inside the first flush
        pa.array([0])

    def run(self, max_seconds: float | None = None, max_events: int | None = None,
            should_stop: Callable[[], bool] | None = None, wait_lease: float = 0.0) -> TailStats:
        """Tail until the deadline, the event budget or should_stop(); flush, checkpoint, return.
        Another tail holding the lease: wait up to ``wait_lease`` seconds for it to end or
        expire, then give up (``stats.skipped``, with the holder and its expiry).

        The source or Redis away (a connection error): start again from the checkpoint, as
        after a crash, with backoff, for up to ``tail.retry_for_s`` since the last flush
        that went through; then SourceUnavailableError with the count and the last error.
        ``stats.retries`` counts the restarts."""
        stats = TailStats()
        stop = should_stop or (lambda: False)
        clock: dict[str, float] = {}  # "started": when the lease was first got (the budget counts from it)
        outage_since, flushes_then = None, -1
        while True:
            try:
                self._session(stats, clock, max_seconds, max_events, stop, wait_lease)
                return stats
            except Exception as e:
                if not self._is_transient(e):
                    raise
                if stats.flushes != flushes_then:  # it went on since the last failure: a new outage
                    outage_since, flushes_then, failures = time.monotonic(), stats.flushes, 0
                failures += 1
                stats.retries += 1
                down = time.monotonic() - outage_since
                if down >= self.config.retry_for_s or stop() or (
                        max_seconds is not None and time.monotonic() - clock.get("started", time.monotonic()) >= max_seconds):
                    raise SourceUnavailableError(
                        f"tail of {self.state.source}: gave up after {failures} failed attempt(s) over {down:.0f}s "
                        f"(tail.retry_for_s {self.config.retry_for_s:.0f}): {type(e).__name__}: {e}") from e
                pause = pause_s(failures)
                log.warning("tail of %s: %s: %s; attempt %d failed, %.0fs into the outage; starting again from "
                            "the checkpoint in %.1fs", self.state.source, type(e).__name__, e, failures, down, pause)
                self.source.close()  # its connections are dead: the next use opens new ones
                count_retry(self.state, "tail_retries")  # for `dblog status`
                deadline = time.monotonic() + pause
                while time.monotonic() < deadline and not stop():
                    time.sleep(0.1)

    def _is_transient(self, error: BaseException) -> bool:
        return redis_is_transient(error) or self.source.is_transient(error)

    def _session(self, stats: TailStats, clock: dict[str, float], max_seconds: float | None,
                 max_events: int | None, should_stop: Callable[[], bool], wait_lease: float) -> None:
        """One go: the lease, the checkpoint, the loop (``run`` starts it again after an outage)."""
        token = self._acquire(wait_lease, should_stop)
        if token is None:
            stats.skipped = True
            stats.lease_holder = self.state.lease_holder() or ""
            stats.lease_expires_in_s = self.state.lease_expires_in()
            log.warning("another tail (%s) holds the lease for %s; doing nothing. %s", stats.lease_holder,
                        self.state.source, _expiry(stats.lease_expires_in_s))
            return
        started = clock.setdefault("started", time.monotonic())  # not before: the wait for the lease
        try:
            cp = self.state.checkpoint()
            self._refuse_lost_state(cp)
            self.source.prepare_log()  # e.g. a replication slot, before the first checkpoint
            if cp is None:  # first run: start at the log's current end
                pos, resume = self.source.current_resume()
                self.state.commit(token, pos, resume, [], 0)
                cp = self.state.checkpoint()
            removed = self.store.remove_uncommitted_logs(cp.pos)
            if removed:
                log.info("removed %d uncommitted segment file(s) past %s", len(removed), cp.pos)
            self.shapes.take_at(cp.pos)
            stats.start = stats.start or cp.pos.encode()  # (the first session's, after an outage)
            # A batch holds ~5 tracked objects per event (tuples, dicts) until its flush, and
            # the automatic cyclic GC sweeps them again and again as they age (a full sweep
            # also walks the whole heap of an Airflow task): over half the tail's own cost
            # on PostgreSQL. Nothing here makes cycles, so the sweeps find nothing; while
            # the tail runs they are done by hand instead: the young generations after
            # each flush (when the batch is gone), the whole heap every FULL_GC_EVERY_S.
            gc_was_on = gc.isenabled()
            gc.disable()
            try:
                self._loop(token, cp.pos, cp.resume, started, max_seconds, max_events, should_stop, stats)
            finally:
                if gc_was_on:
                    gc.enable()
        finally:
            try:
                self.state.release_lease(token)
            except redis.RedisError:  # Redis away: the lease lapses by its TTL
                pass
        stats.seconds = time.monotonic() - started
        stats.end = self.state.checkpoint().pos.encode()
        stats.dump_requests = list(self.shapes.dump_requests)

    def _refuse_lost_state(self, cp: Checkpoint | None) -> None:
        """Fail closed rather than skip changes: no checkpoint though the source was captured
        before (StateLostError), or a checkpoint whose log is gone (LogGapError)."""
        if cp is None:
            evidence = earlier_history(self.state, self.store)
            if evidence:
                raise StateLostError(state_lost_message(self.state.source, evidence))
        elif (gap := self.source.log_gap(cp.resume)) is not None:
            raise LogGapError(log_gap_message(self.state.source, cp.pos, gap))

    def _acquire(self, wait_s: float, should_stop: Callable[[], bool]) -> str | None:
        """The lease's fencing token, trying until ``wait_s`` has passed; None if not got."""
        return self.state.wait_for_lease(
            lambda: self.state.acquire_lease(self.owner, self.config.lease_seconds), wait_s,
            on_first_wait=lambda holder, expires: log.warning(
                "another tail (%s) holds the lease for %s; waiting up to %.0fs for it. %s",
                holder, self.state.source, wait_s, _expiry(expires)),
            should_stop=should_stop)

    def _close_abandoned_windows(self) -> None:
        """A dead runner's window would hold the apply frontier back for the whole source:
        the tail, the one process always running, closes it once it is old enough."""
        for w in self.state.close_abandoned_windows(self.abandon_after_s):
            log.warning("closed window %s of %s (request %s, open %.0fs, no runner holds the request) as "
                        "abandoned: the apply frontier moves on; resume the request to redo its chunk",
                        w.id, w.table, w.request, time.time() - w.opened_at)

    def _loop(self, token, batch_start: Position, resume: dict, started: float,
              max_seconds, max_events, should_stop: Callable[[], bool], stats: TailStats) -> None:
        batch: dict[str, list[Event]] = defaultdict(list)
        marks: list[tuple[str, Position]] = []
        n_batch = 0
        committed: tuple[Position, dict] | None = None  # last TxnEnd not yet flushed
        last_flush = last_renew = last_full_gc = last_window_check = time.monotonic()
        last_ts = 0
        progress = _Progress(self.state.source, self.config.progress_seconds, started)
        writer = token.rsplit("|", 1)[1]  # in the segment names (store.py: a zombie's files)
        # a transaction larger than flush_events is written in parts as it is read (memory
        # stays bounded): part files of the batch's start, invisible to readers until the
        # commit moves the checkpoint past them, deleted by the next tail if it never does
        parts = 0                                   # part files written at batch_start
        spilled: dict[str, int] = defaultdict(int)  # the open transaction's events in them

        def out_of_budget() -> bool:
            return (should_stop() or (max_seconds is not None and time.monotonic() - started >= max_seconds)
                    or (max_events is not None and stats.events + n_batch >= max_events))

        def renew() -> None:
            nonlocal last_renew
            self.state.renew_lease(token, self.config.lease_seconds)
            last_renew = time.monotonic()

        def write(events_by_table) -> None:
            nonlocal parts
            for table, events in events_by_table.items():
                try:
                    self.store.write_log_segment(self.shapes.schemas[table], batch_start, events, writer, part=parts)
                except FileNotFoundError:
                    # a new tail's start swept our half-written file: we are a zombie, and
                    # the renewal says so (LeaseLostError) instead of a traceback
                    renew()
                    raise
            parts += 1

        def flush() -> None:
            nonlocal batch, marks, n_batch, committed, batch_start, last_flush, parts
            if committed is None:
                return
            pos, res = committed
            # a tail paused past its lease stops here, before it writes; one paused between
            # this renewal and its writes is what the writer in the file name is for (store.py)
            renew()
            write(batch)  # (no loop variable left holding a table's events)
            self.state.commit(token, pos, res, marks, n_batch)
            self.source.confirm(res)  # only now may the source release its log before pos
            stats.events += n_batch
            stats.watermarks += len(marks)
            stats.flushes += 1
            for table in batch:
                stats.per_table[table] += len(batch[table])
            if last_ts:
                stats.lag_s = max(0.0, time.time() - last_ts / 1000)
            batch, marks, n_batch, committed, parts = defaultdict(list), [], 0, None, 0
            batch_start, last_flush = pos, time.monotonic()
            collect_garbage()

        def spill() -> None:
            nonlocal pending
            flush()  # the transactions before this one: committed, so the parts start at a commit point
            renew()
            by_table: dict[str, list[Event]] = defaultdict(list)
            for e in pending:
                by_table[e.table].append(e)
            write(by_table)
            for table, events in by_table.items():
                spilled[table] += len(events)
            log.info("tail %s: a transaction of over %d events so far: written in %d part(s) before its commit",
                     self.state.source, sum(spilled.values()), parts)
            pending = []
            collect_garbage()

        def collect_garbage() -> None:
            nonlocal last_full_gc
            if time.monotonic() - last_full_gc >= FULL_GC_EVERY_S:
                gc.collect()
                last_full_gc = time.monotonic()
            else:
                gc.collect(1)  # what was made since the last flush, the batch gone

        # events of the transaction being read: they join the batch at its commit,
        # so a flush never writes half a transaction
        pending: list[Event] = []
        pending_marks: list[tuple[str, Position]] = []
        stop = False
        for item in self.source.read_log(resume, lambda: stop or out_of_budget()):
            if item.__class__ is RowChange or isinstance(item, RowChange):
                pending.append(item.event)
                if len(pending) > self.config.flush_events:
                    spill()
                continue
            if isinstance(item, WatermarkSeen):
                pending_marks.append((item.value, item.pos))
                continue
            if isinstance(item, TableTruncated):   # a step of the table's history (engine/tail_shapes.py)
                self.shapes.truncated(item)
                continue
            if isinstance(item, TableBroken):   # its targets stop before it (engine/quarantine.py)
                quarantine_table(self.state, item.table, item.pos, item.why)
                continue
            if isinstance(item, SchemaChange):
                # no segment mixes two shapes of a table: what came before is written first
                if pending:
                    spill()
                else:
                    flush()
                self.shapes.change(item)
                # and what comes after goes to files named from the change on: the batch
                # before it, read in the old shape, never opens one (issue 27, case 7)
                batch_start = max(batch_start, item.pos)
                continue
            if isinstance(item, TxnEnd):
                for e in pending:
                    batch[e.table].append(e)
                    last_ts = e.source_ts or last_ts
                n_batch += len(pending) + sum(spilled.values())
                for table, n in spilled.items():
                    stats.per_table[table] += n
                spilled.clear()
                marks += pending_marks
                pending, pending_marks = [], []
                committed = (item.pos, item.resume)
                # flush on a watermark at once: a dump is waiting for its window
                if marks or n_batch >= self.config.flush_events or item.checkpoint_now:
                    flush()
            elif pending or spilled:  # Idle inside a transaction: keep reading, and the lease
                if time.monotonic() - last_renew >= self.config.lease_seconds / 3:
                    renew()
                continue
            now = time.monotonic()
            if now - last_flush >= self.config.flush_seconds:
                flush()
                last_flush = now
            progress.maybe_report(stats, batch_start)   # idle or busy: the source yields every heartbeat
            if now - last_renew >= self.config.lease_seconds / 3:
                renew()
            # on its own clock: a busy log flushes (and renews) every flush_seconds, which
            # must not keep a dead runner's window open, holding the apply frontier back
            if now - last_window_check >= self.config.lease_seconds / 3:
                self._close_abandoned_windows()
                last_window_check = now
            # no break: the reader ends at its own next stop test, after yielding the last
            # boundary it may have confirmed to the source (a PostgreSQL slot confirms a
            # keepalive's position by itself: a checkpoint behind it would be a gap)
            stop = stop or out_of_budget()
        stop = True
        flush()
