"""One table of a verification compared (issue 29): the source's rows, read chunk by chunk
inside watermark windows, against one consistent read of the target, while both change.

The window argument. A verification chunk is a dump chunk (Algorithm 1: LW, one select,
HW, engine/dump.py) whose reconciled rows are kept instead of written to the log: each
row is the source's row as of the chunk's HW, every key changed inside (LW, HW) already
left out (reconcile.py), and a requested key the source lacks is a delete. The target is
read once its applied position P is at or past every chunk's HW, rows and P in one
consistent read (``Target.read_at``): the target then holds exactly the events below P
(invariant: an applied position moves with the rows). For a key ``k`` of a chunk with no
log event in (LW, P), the source's row at the select (between LW and HW) is its row at P,
so the target must hold that row: a difference is the target's. A key with such an event
is left out on both sides (``skipped``: the log carries its newer state; the next
verification covers it). A target-only key is extra unless it has an event after the
table's ``floor`` (the log head read before the dump's max key: any key the source held
then without a later event is in some chunk). So a table verifies under concurrent writes
with no false positives, and the source sees only the dump's short selects.

Values compare in the exact form of ``values.comparable`` (the fidelity tests' form), each
row through a 16-byte digest (a count goes with it: ``compared``); the rows of the keys
that differ are read again to name the columns. No Spark and no Airflow here.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from .arrow_values import arrow_rows, to_arrow
from .events import DELETE
from .positions import Position
from .requests import MAX_KEYS
from .schema import TableSchema
from .values import comparable

SHOWN = MAX_KEYS   # keys kept per kind of difference (a repair dumps them; the counts are exact)


@dataclass
class TableReport:
    """What the comparison of one table found; keys as lists of values (a key-list dump's form)."""
    table: str
    target: str
    at: str | None = None    # the target's applied position P the comparison read
    source_rows: int = 0     # rows the chunks kept (as of their HW)
    target_rows: int = 0     # target rows read (in the verification's scope)
    compared: int = 0        # keys compared on both sides
    skipped: int = 0         # keys with a log event after their chunk's LW: left out on both sides
    missing: int = 0         # in the source, not in the target
    extra: int = 0           # in the target, not in the source
    different: int = 0       # on both sides, some value differs
    ahead: int = 0           # target rows written past ``at`` (a lake batch between its two commits): read again
    note: str = ""           # why keys were left out wholesale (a change of shape meanwhile)
    keys: dict = field(default_factory=lambda: {"missing": [], "extra": [], "different": []})

    @property
    def equal(self) -> bool:
        return not (self.missing or self.extra or self.different)

    def differing_keys(self) -> list[list]:
        return self.keys["missing"] + self.keys["extra"] + [d["key"] for d in self.keys["different"]]

    def to_dict(self) -> dict:
        return asdict(self) | {"equal": self.equal}

    def describe(self) -> str:
        head = f"{self.table} on {self.target} at {self.at}: "
        if self.equal:
            return head + f"equal ({self.compared} rows compared, {self.skipped} changing keys left out)"
        return head + (f"{self.missing} missing {self.keys['missing'][:5]}, {self.extra} extra "
                       f"{self.keys['extra'][:5]}, {self.different} different {self.keys['different'][:5]} "
                       f"({self.compared} compared, {self.skipped} left out; {self.source_rows} source rows, "
                       f"{self.target_rows} target rows read)")


def key_strings(table: TableSchema, keys: list[tuple]) -> list[str]:
    """The log's key strings (the events' ``key``: Schema.key_array) of key tuples of logical values."""
    return table.key_array([to_arrow(t, [k[i] for k in keys]) for i, t in enumerate(table.key_types)]).to_pylist()


def keys_of(table: TableSchema, rows: list[tuple]) -> list[str]:
    """The log's key strings of rows of logical values (in column order)."""
    idx = [table.column_names.index(k) for k in table.key]
    return key_strings(table, [tuple(r[i] for i in idx) for r in rows])


def _digest(types: list[str], row: tuple) -> bytes:
    return hashlib.blake2b(repr(tuple(comparable(t, v) for t, v in zip(types, row))).encode(),
                           digest_size=16).digest()


def _batches(rows: Iterable[tuple], size: int = 20_000) -> Iterator[list[tuple]]:
    batch: list[tuple] = []
    for r in rows:
        batch.append(r)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _images(table: TableSchema, struct: pa.ChunkedArray | pa.Array) -> list[tuple]:
    struct = struct.combine_chunks() if isinstance(struct, pa.ChunkedArray) else struct
    return list(arrow_rows(table, pa.Table.from_struct_array(struct))) if len(struct) else []


def last_changes(table: TableSchema, events: pa.Table) -> dict[str, str]:
    """Each key's newest event position among ``events`` (its own key, and the key a
    key-changing update moved the row away from)."""
    out: dict[str, str] = {}
    if not events.num_rows:
        return out
    keys, pos = events["key"].to_pylist(), events["pos"].to_pylist()
    before = events["before"].combine_chunks()
    moved = table.key_array([before.field(k) for k in table.key]).to_pylist() if before.null_count < len(before) \
        else [None] * len(pos)
    for k, b, p in zip(keys, moved, pos):
        for key in (k, b):
            if key is not None and out.get(key, "") < p:
                out[key] = p
    return out


def compare_table(table: TableSchema, target: str, chunks: list[tuple[Position, Position, pa.Table]],
                  target_rows: Iterable[tuple], at: Position, changes: dict[str, str], floor: Position,
                  scope: set[str] | None = None, upto: Position | None = None) -> TableReport:
    """``chunks``: the verification's reconciled chunks (LW, HW, events); ``target_rows``:
    the target's rows read at applied position ``at`` (each ending with its ``_dblog_pos``);
    ``changes``: last_changes of the
    table's events in (floor, at); ``scope``: the requested keys (a key-list verification),
    else every target row is in scope (verify_run leaves a table whose shape changed in
    (floor, at) out before this); ``upto``: the rows may hold every event below it (default
    ``at``), ``changes`` run up to it; a row written at or past it is ``ahead``."""
    types = [c.type for c in table.columns]
    report = TableReport(table.qualified, target, at.encode())
    bound = (upto or at).encode()
    present: dict[str, tuple[str, bytes]] = {}   # key -> (its chunk's LW, digest of its row)
    absent: dict[str, str] = {}                   # requested keys the source lacks -> LW
    for lw, _, events in chunks:
        after = _images(table, events.filter(pc.not_equal(events["op"], DELETE))["after"])
        for k, r in zip(keys_of(table, after), after):
            present[k] = (lw.encode(), _digest(types, r))
        gone = events.filter(pc.equal(events["op"], DELETE))["before"].combine_chunks()   # (their key in the image)
        for k in table.key_array([gone.field(c) for c in table.key]).to_pylist() if len(gone) else []:
            absent[k] = lw.encode()
    report.source_rows = len(present)
    if scope is not None:   # and the rows the source found for them (a key it spells otherwise: a collation)
        scope = scope | present.keys() | absent.keys()

    def moved(k: str, since: str) -> bool:
        return changes.get(k, "") > since

    differs: dict[str, tuple] = {}
    seen: set[str] = set()
    for batch in _batches(target_rows):   # each row: its values, then its _dblog_pos (Target.read_at)
        for k, row in zip(keys_of(table, batch), batch):
            if scope is not None and k not in scope:
                continue
            if row[-1] >= bound:   # merged past where this read can be: read again
                report.ahead += 1
            report.target_rows += 1
            if k in seen:   # the key held twice (a lake table can): that row is extra, writes or not
                report.extra += 1
                _show(report, "extra", k)
                continue
            seen.add(k)
            since = present[k][0] if k in present else absent.get(k, floor.encode())
            if moved(k, since):
                report.skipped += 1
            elif k not in present:
                report.extra += 1
                _show(report, "extra", k)
            else:
                report.compared += 1
                if present[k][1] != _digest(types, row):
                    differs[k] = row
    for k, (lw, _) in present.items():
        if k not in seen:
            if moved(k, lw):
                report.skipped += 1
            else:
                report.missing += 1
                _show(report, "missing", k)
    report.compared += sum(1 for k in absent if k not in seen)   # absent on both sides
    if differs:
        _name_columns(table, report, chunks, differs)
    return report


def _show(report: TableReport, kind: str, key: str) -> None:
    if len(report.keys[kind]) < SHOWN:
        report.keys[kind].append(json.loads(key))


def _name_columns(table: TableSchema, report: TableReport, chunks, differs: dict[str, tuple]) -> None:
    """The columns each differing key differs in (its source row found again in the chunks)."""
    types, names = [c.type for c in table.columns], table.column_names
    report.different = len(differs)
    for _, _, events in chunks:
        after = _images(table, events.filter(pc.not_equal(events["op"], DELETE))["after"])
        for k, src in zip(keys_of(table, after), after):
            dst = differs.get(k)
            if dst is None or len(report.keys["different"]) >= SHOWN:
                continue
            cols = [n for n, t, a, b in zip(names, types, src, dst) if comparable(t, a) != comparable(t, b)]
            report.keys["different"].append({"key": json.loads(k), "columns": cols})
