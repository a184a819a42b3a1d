"""An in-memory source database, change log and target for testing the reconciler.

Nothing here touches a real database, Redis, Spark or the files of the event
store: it is the smallest world in which the DBLog algorithm (the paper's
Algorithm 1, steps 2-7) can run against the real ``engine.reconcile``:

* ``SimSource`` holds each table's current state (``db``: key tuple -> row) and
  one change log shared by all tables, shaped like a MySQL binlog: each committed
  transaction is one rows event at a growing offset, and its rows take the row
  index in the event as ``seq`` -> ``Position(file, offset, row_index)``. A
  watermark write is a single-row event alone at the next offset (a marker in the
  log, not a row of any captured table). ``rotate()`` starts the next binlog file.
  Reads are non-stale: a select sees every transaction committed before it.
* ``RangeDump`` / ``KeyDump`` run a dump one step at a time (plan, LW, one or more
  partition reads, HW + reconcile), so a test can interleave writes between any two
  steps. ``Window`` records what each window saw and what the reconciler emitted.
* The log tail is modelled by how many log entries it has made durable
  (``tail``) and its checkpoint (the position of the transaction end after the
  last of them, like a binlog XID event). A window's floor is the checkpoint when
  it opens (engine/dump.py); ``frontier()`` is min(checkpoint, open floors), as
  RedisState.frontier(): below it no snapshot can still land.
* ``Target`` is the model of the apply: per key it takes an event only if its
  position is greater than the position it holds for that key; deletes remove the
  row. A batch is first reduced to the latest event per key, as the real apply
  does. ``tombstones=True`` keeps a deleted key's position (idempotent per key even
  without a checkpoint); ``apply_up_to(frontier)`` is the real apply's shape: the
  events with applied <= pos < frontier, then the checkpoint moves to the frontier.
"""
from __future__ import annotations

import bisect
import decimal
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import pyarrow as pa

from airflow_provider_dblog.engine.events import (
    DELETE, INSERT, SNAPSHOT, UPDATE, Event, events_from_arrow, events_to_arrow)
from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.reconcile import ReconcileResult, reconcile
from airflow_provider_dblog.engine.schema import Column, TableSchema

# -- tables ----------------------------------------------------------------------
ITEMS = TableSchema("shop", "items", (
    Column("id", "int64", False), Column("v", "int64"), Column("note", "string")), ("id",))
LINES = TableSchema("shop", "lines", (
    Column("a", "int32", False), Column("b", "string", False),
    Column("v", "int64"), Column("note", "string")), ("a", "b"))
RATES = TableSchema("shop", "rates", (
    Column("day", "date", False), Column("code", "decimal(6,2)", False),
    Column("v", "int64"), Column("note", "string")), ("day", "code"))
SCHEMAS = {t.name: t for t in (ITEMS, LINES, RATES)}


def make_row(table: TableSchema, key: tuple, version: int) -> dict:
    """A row image: the key plus values that are unique per write (so a stale image shows)."""
    row = dict(zip(table.key, key))
    row["v"] = version
    row["note"] = None if version % 3 == 0 else f"n{version}"
    return row


def normalize_key(table: TableSchema, key: Sequence[Any]) -> tuple:
    """A key as the database stores it (a DECIMAL has no negative zero)."""
    out = []
    for col, v in zip(table.key_columns, key):
        if isinstance(v, decimal.Decimal) and v == 0:
            v = abs(v)
        out.append(v)
    return tuple(out)


def arrow_rows(table: TableSchema, rows: Iterable[dict]) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema=pa.schema(list(table.row_struct())))


# -- the source and its log ---------------------------------------------------------
@dataclass(frozen=True)
class Watermark:
    value: str
    pos: Position


LogEntry = Event | Watermark

BINLOG_START = 4  # a binlog file's first event sits at offset 4
EVENT_SIZE = 100  # a transaction: its rows event at offset X, its XID event at X + 50
TAIL_START = Position(1, 0, 0)  # where the tail started: before the first logged write


class SimSource:
    def __init__(self, tables: Sequence[TableSchema]):
        self.tables = {t.qualified: t for t in tables}
        self.db: dict[str, dict[tuple, dict]] = {q: {} for q in self.tables}
        self.initial: dict[str, dict[tuple, dict]] = {q: {} for q in self.tables}
        self.history: dict[str, dict[tuple, list[tuple[Position, dict | None]]]] = {
            q: defaultdict(list) for q in self.tables}
        self.log: list[LogEntry] = []
        self.file, self.offset = 1, BINLOG_START
        self.version = 0
        self.clock = 1_700_000_000_000  # source timestamps, ms
        self.watermarks = 0
        self.tail = 0  # log entries the tail has made durable and acknowledged
        self.dumps: list["_Dump"] = []

    # -- writes ----------------------------------------------------------------------
    def _next_version(self) -> int:
        self.version += 1
        return self.version

    def preload(self, table: TableSchema, keys: Iterable[tuple]) -> None:
        """Rows that exist before the log tail starts: in the state, not in the log."""
        assert not self.log, "preload before anything is logged"
        for key in keys:
            key = normalize_key(table, key)
            row = make_row(table, key, self._next_version())
            self.db[table.qualified][key] = row
            self.initial[table.qualified][key] = dict(row)

    def _take_offset(self) -> int:
        off = self.offset
        self.offset += EVENT_SIZE
        self.clock += 7
        return off

    def commit(self, writes: Sequence[tuple]) -> list[Event]:
        """One transaction, committed atomically, logged as one rows event.

        ``writes``: ("put", table, key) inserts the key or updates it if it exists;
        ("delete", table, key) deletes it if it exists (else nothing);
        ("move", table, old, new) changes a row's primary key (if old exists and new does not):
        logged as a delete of ``old`` and an insert of ``new``.
        """
        staged: list[tuple[str, str, tuple, dict | None, dict | None]] = []
        db = {q: dict(rows) for q, rows in self.db.items()}  # the transaction's view
        for w in writes:
            op, table = w[0], w[1]
            q, rows = table.qualified, db[table.qualified]
            if op == "put":
                key = normalize_key(table, w[2])
                new = make_row(table, key, self._next_version())
                old = rows.get(key)
                staged.append((q, UPDATE if old else INSERT, key, old, new))
                rows[key] = new
            elif op == "delete":
                key = normalize_key(table, w[2])
                old = rows.pop(key, None)
                if old is not None:
                    staged.append((q, DELETE, key, old, None))
            elif op == "move":
                old_key, new_key = normalize_key(table, w[2]), normalize_key(table, w[3])
                if old_key in rows and new_key not in rows and old_key != new_key:
                    old = rows.pop(old_key)
                    new = dict(old) | dict(zip(table.key, new_key)) | {"v": self._next_version()}
                    rows[new_key] = new
                    # as the sources log a primary-key change: the old key's delete, then
                    # the new key's insert (MySQL's binlog and pgoutput alike)
                    staged.append((q, DELETE, old_key, old, None))
                    staged.append((q, INSERT, new_key, None, new))
            else:
                raise ValueError(op)
        if not staged:
            return []
        off = self._take_offset()
        events = []
        for i, (q, op, key, before, after) in enumerate(staged):
            pos = Position(self.file, off, i)
            e = Event(q, op, key, before, after, pos, self.clock)
            events.append(e)
            self.log.append(e)
            self.history[q][key].append((pos, after if op != DELETE else None))
        self.db = db
        return events

    def write_watermark(self, value: str) -> Position:
        pos = Position(self.file, self._take_offset(), 0)
        self.log.append(Watermark(value, pos))
        self.watermarks += 1
        return pos

    def rotate(self) -> None:
        """The next binlog file: offsets start again, positions still grow."""
        self.file += 1
        self.offset = BINLOG_START

    # -- reads (non-stale: the state right now) -----------------------------------------
    def keys(self, table: TableSchema) -> list[tuple]:
        return sorted(self.db[table.qualified])

    def max_key(self, table: TableSchema) -> tuple | None:
        keys = self.db[table.qualified]
        return max(keys) if keys else None

    def select_range(self, table: TableSchema, after: tuple | None, end: tuple) -> list[dict]:
        """``SELECT * WHERE after < key <= end``, in no particular order."""
        rows = [dict(r) for k, r in self.db[table.qualified].items()
                if (after is None or k > after) and k <= end]
        return rows[::-1]  # not key order: the reconciler must sort

    def select_keys(self, table: TableSchema, keys: Sequence[tuple]) -> list[dict]:
        rows = self.db[table.qualified]
        found = {normalize_key(table, k) for k in keys}
        return [dict(rows[k]) for k in found if k in rows]

    def head(self) -> Position:
        """The current end of the log (SHOW MASTER STATUS): every entry so far is below it,
        every later one above; a tail that has read everything checkpoints exactly here."""
        if not self.log:
            return TAIL_START
        last = self.log[-1].pos
        return Position(last.log, last.offset + EVENT_SIZE // 2, 0)

    # -- the tail ----------------------------------------------------------------------
    def checkpoint(self) -> Position:
        """Every log event below this position is durable (the XID after the last entry read)."""
        if not self.tail:
            return TAIL_START
        last = self.log[self.tail - 1].pos
        return Position(last.log, last.offset + EVENT_SIZE // 2, 0)

    def tail_advance(self, lag: int = 0) -> None:
        """The tail reads on, up to ``lag`` entries behind the end of the log (never back)."""
        t = max(0, len(self.log) - lag)
        while 0 < t < len(self.log) and self.log[t].pos[:2] == self.log[t - 1].pos[:2]:
            t -= 1  # the tail flushes whole transactions only
        self.tail = max(self.tail, t)

    def frontier(self) -> Position:
        """RedisState.frontier(): min(checkpoint, the floors of the open windows)."""
        return min([self.checkpoint()] + [d.floor for d in self.dumps if d.floor is not None])

    def durable(self, table: TableSchema) -> list[Event]:
        """The output event log as written so far: durable log events and snapshots."""
        events = [e for e in self.log[:self.tail] if isinstance(e, Event) and e.table == table.qualified]
        events += [e for d in self.dumps for w in d.windows if w.table == table for e in w.out]
        return sorted(events, key=lambda e: e.pos)

    # -- the log ------------------------------------------------------------------------
    def events(self, table: TableSchema, lo: Position | None = None,
               hi: Position | None = None) -> list[Event]:
        """The table's log events with lo < pos < hi."""
        return [e for e in self.log if isinstance(e, Event) and e.table == table.qualified
                and (lo is None or e.pos > lo) and (hi is None or e.pos < hi)]

    def entry_after(self, pos: Position) -> LogEntry | None:
        positions = [e.pos for e in self.log]
        i = bisect.bisect_right(positions, pos)
        return self.log[i] if i < len(self.log) else None

    def state_after(self, table: TableSchema, key: tuple, pos: Position) -> dict | None:
        """The key's row once every log event at or before ``pos`` committed."""
        row = self.initial[table.qualified].get(key)
        for p, image in self.history[table.qualified].get(key, ()):
            if p <= pos:
                row = image
        return row


# -- dumps ------------------------------------------------------------------------
ReconcileFn = Callable[..., ReconcileResult]


@dataclass
class Window:
    """One LW/HW window of a dump and what the reconciler made of it."""
    table: TableSchema
    kind: str  # "range" | "keys"
    lw: Position
    hw: Position
    selected: list[dict]  # the chunk rows, as read
    requested: list[tuple] | None  # a key list's keys
    window_events: list[Event]  # the table's log events with LW < pos < HW
    result: ReconcileResult
    out: list[Event]  # the reconciler's events, decoded
    reads: int = 1  # how many partition reads ran inside the window
    floor: Position | None = None  # the tail checkpoint when the window opened

    @property
    def changed(self) -> set[tuple]:
        out = set()
        for e in self.window_events:
            out.add(e.key)
            if e.before is not None:
                out.add(self.table.key_of(e.before))
        return out


class _Dump:
    """Algorithm 1 steps 2-4, one step per call, then steps 6-7 once the tail passed the HW."""

    def __init__(self, sim: SimSource, table: TableSchema, reconcile_fn: ReconcileFn = reconcile):
        self.sim, self.table, self.reconcile_fn = sim, table, reconcile_fn
        self.windows: list[Window] = []
        self.done = False
        self.started = False
        self._lw: Position | None = None
        self._hw: Position | None = None
        self._rows: list[dict] = []
        self._reads = 0
        self.planned: list[tuple] = []  # the keys the current chunk is about to read
        self.floor: Position | None = None  # an open window's floor (holds the frontier back)
        sim.dumps.append(self)

    @property
    def open_keys(self) -> list[tuple]:
        """The planned keys of a window that is open (LW written, not yet reconciled)."""
        return list(self.planned) if self._lw is not None else []

    def _open(self) -> None:
        self.floor = self.sim.checkpoint()  # open_window(floor=checkpoint), before the LW
        self._lw = self.sim.write_watermark(f"lw-{self.sim.watermarks}")  # step 2
        self._rows, self._reads = [], 0

    def _write_hw(self) -> None:
        self._hw = self.sim.write_watermark(f"hw-{self.sim.watermarks}")  # step 4

    def _close(self, requested: list[tuple] | None, kind: str) -> Window:
        """wait_window, reconcile, write the snapshot, close the window. Other steps (writes,
        the tail, an apply) may have run between the HW and this."""
        hw = self._hw
        hw_index = next(i for i, e in enumerate(self.sim.log) if e.pos == hw)
        self.sim.tail_advance(len(self.sim.log) - hw_index - 1)  # the tail passed the HW
        window_events = self.sim.events(self.table, self._lw, hw)
        chunk = arrow_rows(self.table, self._rows)
        result = self.reconcile_fn(self.table, chunk, events_to_arrow(self.table, window_events), hw,
                                   requested_keys=requested)  # steps 6-7
        w = Window(self.table, kind, self._lw, hw, list(self._rows), requested, window_events,
                   result, events_from_arrow(self.table, result.events), self._reads, self.floor)
        self.windows.append(w)  # the snapshot file is written ...
        self._lw, self.floor = None, None  # ... then the window closes (complete_chunk)
        return w

    def step(self) -> bool:
        raise NotImplementedError

    def finish(self) -> None:
        while not self.done:
            self.step()


class RangeDump(_Dump):
    """A whole table in key order, ``after < key <= end`` per chunk, up to the max key
    captured at the dump's start; each chunk read as ``parts`` partitions, each at its
    own moment inside the window (Spark's parallel JDBC read)."""

    def __init__(self, sim: SimSource, table: TableSchema, chunk_sizes: Sequence[int], parts: int = 1,
                 reconcile_fn: ReconcileFn = reconcile):
        super().__init__(sim, table, reconcile_fn)
        assert chunk_sizes and all(s >= 1 for s in chunk_sizes) and parts >= 1
        self.chunk_sizes, self.parts = list(chunk_sizes), parts
        self.upto: tuple | None = None
        self.after: tuple | None = None
        self.phase = "start"
        self.bounds: list[tuple | None] = []
        self.end: tuple | None = None
        self.chunks = 0
        self.head_before: Position | None = None
        self.head_end: Position | None = None  # after a read that found no more rows

    def sweep(self) -> dict | None:
        """The orphan sweep this dump registers once done (engine.sweep.orphan_sweep)."""
        from airflow_provider_dblog.engine.sweep import orphan_sweep

        if not self.done or self.head_before is None:
            return None
        return orphan_sweep("r", self.table.qualified, {
            "done": True, "head_before": self.head_before.encode(),
            "head_end": self.head_end.encode() if self.head_end else None,
            "last_hw": self.windows[-1].hw.encode() if self.windows else None})

    def step(self) -> bool:
        if self.done:
            return True
        if self.phase == "start":  # the key range is captured once, when the dump starts
            self.started = True
            self.head_before = self.sim.head()  # the orphan sweep's bounds (engine/sweep.py)
            self.upto = self.sim.max_key(self.table)
            if self.upto is None:
                self.head_end = self.sim.head()
                self.done = True
            else:
                self.phase = "plan"
        elif self.phase == "plan":  # plan_chunk: the next `size` keys after `after`
            size = self.chunk_sizes[self.chunks % len(self.chunk_sizes)]
            keys = [k for k in self.sim.keys(self.table)
                    if (self.after is None or k > self.after) and k <= self.upto][:size]
            if not keys:  # the rows up to the max key are gone
                self.head_end = self.sim.head()
                self.done = True
                return True
            self.end = keys[-1]
            self.planned = keys
            parts = min(self.parts, len(keys))
            cuts = [keys[(i * len(keys)) // parts - 1] for i in range(1, parts)]
            self.bounds = [self.after] + cuts + [self.end]
            self.phase = "lw"
        elif self.phase == "lw":
            self._open()
            self.phase = "read"
        elif self.phase == "read":  # one partition per step, in the window
            i = self._reads
            self._rows += self.sim.select_range(self.table, self.bounds[i], self.bounds[i + 1])
            self._reads += 1
            if self._reads == len(self.bounds) - 1:
                self.phase = "hw"
        elif self.phase == "hw":
            self._write_hw()
            self.phase = "reconcile"
        elif self.phase == "reconcile":
            self._close(None, "range")
            self.chunks += 1
            self.after = self.end
            if self.end == self.upto:
                self.done = True
            else:
                self.phase = "plan"
        return self.done


class KeyDump(_Dump):
    """A list of primary keys (a repair), in batches; keys that are absent at the HW
    come out as deletes."""

    def __init__(self, sim: SimSource, table: TableSchema, keys: Sequence[tuple],
                 batch_sizes: Sequence[int], reconcile_fn: ReconcileFn = reconcile):
        super().__init__(sim, table, reconcile_fn)
        self.keys = list(dict.fromkeys(tuple(k) for k in keys))  # as the user gave them
        self.batch_sizes = list(batch_sizes)
        self.next = 0
        self.batches = 0
        self.phase = "lw"
        self.batch: list[tuple] = []
        if not self.keys:
            self.done = True

    def step(self) -> bool:
        if self.done:
            return True
        self.started = True
        if self.phase == "lw":
            size = self.batch_sizes[self.batches % len(self.batch_sizes)]
            self.batch = self.keys[self.next:self.next + size]
            self.planned = [normalize_key(self.table, k) for k in self.batch]
            self._open()
            self.phase = "read"
        elif self.phase == "read":
            self._rows = self.sim.select_keys(self.table, self.batch)
            self._reads = 1
            self.phase = "hw"
        elif self.phase == "hw":
            self._write_hw()
            self.phase = "reconcile"
        elif self.phase == "reconcile":
            self._close(list(self.batch), "keys")
            self.next += len(self.batch)
            self.batches += 1
            self.phase = "lw"
            self.done = self.next >= len(self.keys)
        return self.done


# -- the output stream and the target -----------------------------------------------
def merged_stream(sim: SimSource, table: TableSchema, dumps: Iterable[_Dump]) -> list[Event]:
    """The output event log of one table: log events and snapshot events, by position."""
    events = sim.events(table) + [e for d in dumps for w in d.windows if w.table == table for e in w.out]
    return sorted(events, key=lambda e: e.pos)


def effects(table: TableSchema, e: Event) -> list[tuple[tuple, dict | None]]:
    """What an event does to the target, per key, as the real apply does it: a delete removes
    its key's row, anything else upserts its after image (a key move is logged as a delete
    of the old key and an insert of the new one)."""
    if e.op == DELETE:
        return [(table.key_of(e.before) if e.before is not None else e.key, None)]
    return [(table.key_of(e.after), e.after)]


@dataclass
class Target:
    """The apply's model: an event changes a key only if it is newer than the key's row."""
    table: TableSchema
    rows: dict[tuple, dict] = field(default_factory=dict)
    positions: dict[tuple, Position] = field(default_factory=dict)  # the _dblog_pos column
    tombstones: bool = False  # keep a deleted key's position
    applied: Position | None = None  # the apply checkpoint: every event below it is applied
    delivered: dict[tuple, list[Position]] = field(default_factory=lambda: defaultdict(list))

    def copy(self) -> "Target":
        t = Target(self.table, {k: dict(v) for k, v in self.rows.items()}, dict(self.positions),
                   self.tombstones, self.applied)
        t.delivered = defaultdict(list, {k: list(v) for k, v in self.delivered.items()})
        return t

    def _put(self, key: tuple, row: dict | None, pos: Position) -> bool:
        held = self.positions.get(key)
        if held is not None and pos <= held:
            return False
        self.delivered[key].append(pos)
        if row is None:
            self.rows.pop(key, None)
            if self.tombstones:
                self.positions[key] = pos
            else:
                self.positions.pop(key, None)
        else:
            self.rows[key] = dict(row)
            self.positions[key] = pos
        return True

    def apply_up_to(self, events: Iterable[Event], frontier: Position) -> list[Event]:
        """One run of the real apply: the batch applied <= pos < frontier, then the checkpoint."""
        if self.applied is not None and frontier <= self.applied:
            return []
        batch = [e for e in events if (self.applied is None or e.pos >= self.applied) and e.pos < frontier]
        self.apply_batch(batch)
        self.applied = frontier
        return batch

    def apply_event(self, e: Event) -> None:
        for key, row in effects(self.table, e):
            self._put(key, row, e.pos)

    def apply(self, events: Iterable[Event]) -> "Target":
        for e in events:
            self.apply_event(e)
        return self

    def apply_batch(self, events: Sequence[Event]) -> "Target":
        """One apply batch: reduce to the latest event per key, then apply each."""
        latest: dict[tuple, tuple[Position, dict | None]] = {}
        for e in events:
            for key, row in effects(self.table, e):
                if key not in latest or e.pos > latest[key][0]:
                    latest[key] = (e.pos, row)
        for key, (pos, row) in sorted(latest.items(), key=lambda kv: kv[1][0]):
            self._put(key, row, pos)
        return self

    def state(self) -> tuple[dict, dict]:
        return dict(self.rows), dict(self.positions)

    def sweep(self, sweep: dict, snapshot_keys: set[tuple]) -> list[tuple] | None:
        """``PostgresTarget.delete_orphans``: once every event below ``until`` is applied,
        delete the rows below ``below`` whose key is not in ``snapshot_keys``."""
        below, until = Position.decode(sweep["below"]), Position.decode(sweep["until"])
        if self.applied is None or self.applied < until:
            return None
        gone = [k for k, p in self.positions.items()
                if p < below and k in self.rows and k not in snapshot_keys]
        for k in gone:
            self.rows.pop(k)
            self.positions.pop(k)
        return gone


def random_split(events: Sequence[Event], cuts: Iterable[int]) -> list[list[Event]]:
    """Batches of a position-ordered stream, cut before the given indexes."""
    idx = sorted({c for c in cuts if 0 < c < len(events)})
    bounds = [0] + idx + [len(events)]
    return [list(events[a:b]) for a, b in zip(bounds, bounds[1:])]


__all__ = [
    "ITEMS", "LINES", "RATES", "SCHEMAS", "SimSource", "Watermark", "Window", "RangeDump", "KeyDump",
    "Target", "merged_stream", "effects", "random_split", "arrow_rows", "make_row", "normalize_key",
    "SNAPSHOT", "DELETE", "INSERT", "UPDATE",
]
