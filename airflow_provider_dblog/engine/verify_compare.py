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

Values compare in the exact form of ``values.comparable`` (the fidelity tests' form),
column at a time in Arrow: both sides hold each column as its logical type's Arrow array
(verify_rows.py), the target's rows are matched to the source's by key (``pc.index_in``: a
single integer key as integers, another as key strings), and each column is compared over
all matched rows at once (floats by their bits' meaning: NaN equals NaN, -0.0 is not 0.0).
A count goes with every result (``compared``), and a key the target holds twice is extra. No Spark and no Airflow here.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .arrow_values import from_arrow, to_arrow
from .events import DELETE
from .keys import by_value, value_keys
from .positions import Position
from .requests import MAX_KEYS
from .schema import TableSchema
from .values import comparable
from .verify_rows import empty

KEY, LW = "_dblog_key", "_dblog_lw"   # the source side's key strings and each row's chunk LW
_BY_VALUE = {"text:interval"}   # compared through values.comparable (one interval, several texts)
_INT_TYPES = {"int8", "int16", "int32", "int64"}

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
    incomplete: str = ""     # why no verdict: every key left out (a change of shape meanwhile)
    attempts: int = 1        # verifications of the table run for this result (verify_run: after a change of shape)
    error: str = ""          # why no verdict: the table's own comparison failed (held, quarantined, a read error)
    not_carried: list = field(default_factory=list)   # source columns its `ignore` keeps off the target: not compared
    keys: dict = field(default_factory=lambda: {"missing": [], "extra": [], "different": []})

    @property
    def equal(self) -> bool:
        return not (self.incomplete or self.error or self.missing or self.extra or self.different)

    def differing_keys(self) -> list[list]:
        return self.keys["missing"] + self.keys["extra"] + [d["key"] for d in self.keys["different"]]

    def to_dict(self) -> dict:
        return asdict(self) | {"equal": self.equal}

    def describe(self) -> str:
        head = f"{self.table} on {self.target} at {self.at}: "
        if self.incomplete or self.error:
            return head + f"not verified: {self.incomplete or self.error}"
        if self.equal:
            return head + f"equal ({self.compared} rows compared, {self.skipped} changing keys left out)"
        return head + (f"{self.missing} missing {self.keys['missing'][:5]}, {self.extra} extra "
                       f"{self.keys['extra'][:5]}, {self.different} different {self.keys['different'][:5]} "
                       f"({self.compared} compared, {self.skipped} left out; {self.source_rows} source rows, "
                       f"{self.target_rows} target rows read)")


def key_strings(table: TableSchema, keys: list[tuple]) -> list[str]:
    """The log's key strings (the events' ``key``: Schema.key_array) of key tuples of logical values."""
    return table.key_array([to_arrow(t, [k[i] for k in keys]) for i, t in enumerate(table.key_types)]).to_pylist()


def _int_key(table: TableSchema) -> bool:
    return len(table.key) == 1 and table.key_types[0] in _INT_TYPES


def _match(table: TableSchema, keys: pa.Array) -> pa.Array:
    """Key strings as the values keys are matched by: a single integer key as int64 (hashing
    integers is several times faster than strings: a 4M-row table's matching), otherwise
    value_keys (an interval's texts meet as the database meets them)."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if _int_key(table):   # encode_key of one integer: "[<digits>]" (another text, "[null]": null)
        digits = pc.utf8_slice_codeunits(keys.cast(pa.string()), 1, -1)
        return pc.cast(pc.if_else(pc.match_substring_regex(digits, r"^-?\d+$"), digits, None), pa.int64())
    return value_keys(keys, table.key_types)


def _target_match(table: TableSchema, tgt: pa.Table) -> pa.Array:
    """The target rows' keys in ``_match``'s form, read from its key columns."""
    if not tgt.num_rows:
        return pa.array([], pa.int64() if _int_key(table) else pa.string())
    cols = [tgt.column(table.column_names.index(k)).combine_chunks() for k in table.key]
    return cols[0].cast(pa.int64()) if _int_key(table) else value_keys(table.key_array(cols), table.key_types)


def _shown(table: TableSchema, tgt: pa.Table, rows: pa.Array) -> list[str]:
    """The key strings of the target's ``rows`` (a mask, or indices), only for those shown."""
    if pa.types.is_boolean(rows.type):
        rows = pa.array(np.flatnonzero(rows.to_numpy(zero_copy_only=False))[:SHOWN], pa.int64())
    cols = [tgt.column(table.column_names.index(k)).combine_chunks().take(rows) for k in table.key]
    return table.key_array(cols).to_pylist() if len(rows) else []


def _first_in(values: pa.Array) -> pa.Array:
    """True where a value appears for the first time in ``values``."""
    first = pc.index_in(values, value_set=values)
    return pc.equal(first, pa.array(np.arange(len(values), dtype=np.int32)))


def _wide(data: pa.Table) -> pa.Table:
    """Strings and binaries with 64-bit offsets: a column gathered into one array may pass 2 GiB."""
    fields = [pa.field(f.name, pa.large_string() if pa.types.is_string(f.type) else
                       pa.large_binary() if pa.types.is_binary(f.type) else f.type) for f in data.schema]
    return data.cast(pa.schema(fields)) if fields != list(data.schema) else data


def _count(mask) -> int:
    return int(pc.sum(pc.cast(mask, pa.int64())).as_py() or 0) if len(mask) else 0


def _source_side(table: TableSchema, chunks) -> tuple[pa.Table, pa.Table, pa.Array]:
    """The chunks' rows (the table's columns, then their key strings and their chunk's LW, read
    by position: a source column may be named as ours; a key read twice keeps its last row)
    and the requested keys the source lacks (``KEY``, ``LW``: a key-list chunk's delete events),
    and the rows' keys in ``_match``'s form."""
    rows, gone = [], []
    for lw, _, events in chunks:
        live = events.filter(pc.not_equal(events["op"], DELETE))
        if live.num_rows:
            after = pa.Table.from_struct_array(live["after"].combine_chunks()).select(table.column_names)
            keys = live["key"].combine_chunks()   # the row's key string (the dump's key_array of its key)
            rows.append(after.append_column(KEY, keys).append_column(LW, pa.repeat(pa.scalar(lw.encode()), len(keys))))
        dead = events.filter(pc.equal(events["op"], DELETE))
        if dead.num_rows:   # (their key in the before image)
            before = dead["before"].combine_chunks()
            keys = table.key_array([before.field(c) for c in table.key])
            gone.append(pa.table({KEY: keys, LW: pa.repeat(pa.scalar(lw.encode()), len(keys))}))
    n = len(table.columns)
    present = pa.concat_tables(rows) if rows else empty(table).select(list(range(n))).append_column(
        KEY, pa.array([], pa.string())).append_column(LW, pa.array([], pa.string()))
    present = _wide(present.select(list(range(n)))).append_column(KEY, present.column(n)).append_column(
        LW, present.column(n + 1))
    keys = _match(table, present.column(n))
    if present.num_rows and not pc.all(_first_in(keys)).as_py():   # a key read twice: its last row
        last = _first_in(keys.take(pa.array(np.arange(len(keys) - 1, -1, -1)))).to_numpy(zero_copy_only=False)
        present = present.filter(pa.array(last[::-1]))
        keys = _match(table, present.column(n))
    absent = pa.concat_tables(gone) if gone else pa.table({KEY: pa.array([], pa.string()),
                                                           LW: pa.array([], pa.string())})
    absent = absent.filter(pc.invert(pc.is_in(_match(table, absent[KEY]), value_set=keys)))
    return present, absent, keys


def _equal(logical: str, a: pa.Array, b: pa.Array) -> pa.Array:
    """Per row: ``a`` and ``b`` hold equal values in the exact form of ``values.comparable``
    (nulls equal; floats by their repr: NaN equals NaN, -0.0 is not 0.0)."""
    both_null = pc.and_(pc.is_null(a), pc.is_null(b))
    if logical in _BY_VALUE:
        av, bv = from_arrow(logical, a), from_arrow(logical, b)
        return pa.array([comparable(logical, x) == comparable(logical, y) for x, y in zip(av, bv)], pa.bool_())
    eq = pc.equal(a, b)
    if pa.types.is_floating(a.type):
        an = a.to_numpy(zero_copy_only=False)
        bn = b.to_numpy(zero_copy_only=False)
        same_sign = pa.array(np.signbit(an) == np.signbit(bn))
        nans = pc.and_(pc.is_nan(a), pc.is_nan(b))
        eq = pc.or_(pc.and_(eq, same_sign), pc.fill_null(nans, False))
    return pc.or_(pc.fill_null(eq, False), both_null)


def last_changes(table: TableSchema, events: pa.Table) -> pa.Table:
    """Each key's newest event position among ``events`` (its own key, and the key a
    key-changing update moved the row away from): a table of ``KEY``, ``"pos"``."""
    if not events.num_rows:
        return pa.table({KEY: pa.array([], pa.string()), "pos": pa.array([], pa.string())})
    keys, pos = events["key"].combine_chunks(), events["pos"].combine_chunks()
    before = events["before"].combine_chunks()
    moved = table.key_array([before.field(k) for k in table.key]) if before.null_count < len(before) \
        else pa.nulls(len(pos), pa.string())
    both = pa.table({KEY: pa.concat_arrays([keys.cast(pa.string()), moved.cast(pa.string())]),
                     "pos": pa.concat_arrays([pos, pos])}).filter(pc.is_valid(pc.field(KEY)))
    return both.group_by(KEY).aggregate([("pos", "max")]).rename_columns([KEY, "pos"])


def _newest(changes: pa.Table, keys: pa.Array) -> pa.Array:
    """The newest change position of each of ``keys`` (null: none)."""
    return pc.take(changes["pos"].combine_chunks(), pc.index_in(keys, value_set=changes[KEY].combine_chunks()))


def _keyed(table: TableSchema, changes: pa.Table) -> pa.Table:
    """``changes`` keyed by ``_match`` (two texts of one key: its newest change)."""
    keyed = pa.table({KEY: _match(table, changes[KEY]), "pos": changes["pos"]}).filter(pc.is_valid(pc.field(KEY)))
    if not any(by_value(t) for t in table.key_types) or not changes.num_rows:
        return keyed
    return keyed.group_by(KEY).aggregate([("pos", "max")]).rename_columns([KEY, "pos"])


def compare_table(table: TableSchema, target: str, chunks: list[tuple[Position, Position, pa.Table]],
                  target_rows: Iterable[pa.Table], at: Position, changes: pa.Table, floor: Position,
                  scope: set[str] | None = None, upto: Position | None = None) -> TableReport:
    """``chunks``: the verification's reconciled chunks (LW, HW, events); ``target_rows``:
    the target's rows read at applied position ``at``, in batches (verify_rows.py: the
    columns in their logical type's Arrow form, ``_dblog_pos``, ``_dblog_bad``);
    ``changes``: last_changes of the table's events in (floor, upto); ``scope``: the
    requested keys (a key-list verification), else every target row is in scope
    (verify_run leaves a table whose shape changed in (floor, at) out before this);
    ``upto``: the rows may hold every event below it (default ``at``); a row written at
    or past it is ``ahead``. Column at a time in Arrow: no per-row Python but for the
    keys shown and the columns of ``_BY_VALUE`` types."""
    report = TableReport(table.qualified, target, at.encode())
    present, absent, skeys = _source_side(table, chunks)
    report.source_rows = present.num_rows
    n = len(table.columns)   # (columns by position: a source column may be named as ours)
    # keys matched as the database matches them (_match: an interval's texts; integers as integers),
    # shown as read
    slw = present.column(n + 1).combine_chunks()
    shown_s = present.column(n).combine_chunks()
    gone_keys = _match(table, absent[KEY])
    changes = _keyed(table, changes)
    batches = list(target_rows)
    tgt = _wide(pa.concat_tables(batches) if batches else empty(table))
    tkeys = _target_match(table, tgt)
    if scope is not None:   # and the rows the source found for them (a key it spells otherwise: a collation)
        wanted = pa.concat_arrays([_match(table, pa.array(sorted(scope), pa.string())), skeys, gone_keys])
        inside = pc.is_in(tkeys, value_set=wanted)
        tgt, tkeys = tgt.filter(inside), tkeys.filter(inside)
    report.target_rows = tgt.num_rows
    report.ahead = _count(pc.greater_equal(tgt.column(n), (upto or at).encode())) if tgt.num_rows else 0
    first = _first_in(tkeys)
    if tgt.num_rows and not pc.all(first).as_py():   # a key held twice (a lake table can): its later rows are extra
        dup = pc.invert(first)
        report.extra += _count(dup)
        for k in _shown(table, tgt, dup):
            _show(report, "extra", k)
        tgt, tkeys = tgt.filter(first), tkeys.filter(first)

    floor_s = floor.encode()
    src_at = pc.index_in(tkeys, value_set=skeys)   # each target row's source row
    gone_at = pc.index_in(tkeys, value_set=gone_keys)
    since = pc.coalesce(pc.take(slw, src_at),
                        pc.take(absent[LW].combine_chunks(), gone_at), pa.scalar(floor_s))
    moved = pc.fill_null(pc.greater(_newest(changes, tkeys), since), False)
    report.skipped += _count(moved)
    still = pc.invert(moved)
    extra = pc.and_(still, pc.is_null(src_at))   # (a requested key the source lacks, too)
    report.extra += _count(extra)
    for k in _shown(table, tgt, extra):
        _show(report, "extra", k)
    both = pc.and_(still, pc.is_valid(src_at))
    report.compared += _count(both)
    _compare_rows(table, report, tgt.filter(both), present.take(src_at.filter(both)))

    # source rows the target lacks, and requested keys both lack
    lacking = pc.invert(pc.is_in(skeys, value_set=tkeys))
    lack_keys = skeys.filter(lacking)
    gone = pc.fill_null(pc.greater(_newest(changes, lack_keys), slw.filter(lacking)), False)
    report.skipped += _count(gone)
    missing = shown_s.filter(lacking).filter(pc.invert(gone))
    report.missing = len(missing)
    for k in missing.to_pylist()[:SHOWN]:
        _show(report, "missing", k)
    report.compared += _count(pc.invert(pc.is_in(gone_keys, value_set=tkeys)))   # absent on both sides
    return report


def _compare_rows(table: TableSchema, report: TableReport, tgt: pa.Table, src: pa.Table) -> None:
    """Counts the rows of one key on both sides that differ and names the columns of the first ones."""
    if not tgt.num_rows:
        return
    equal, n = {}, len(table.columns)
    for i, c in enumerate(table.columns):
        equal[c.name] = _equal(c.type, tgt.column(i).combine_chunks(), src.column(i).combine_chunks())
    bad = pc.is_valid(tgt.column(n + 1))   # (BAD) a value the type cannot hold: that row differs
    same = pc.invert(bad)
    for eq in equal.values():
        same = pc.and_(same, eq)
    differ = pc.invert(same)
    report.different = _count(differ)
    rows = np.flatnonzero(differ.to_numpy(zero_copy_only=False))[:SHOWN]
    bad_names = tgt.column(n + 1).combine_chunks()
    keys = _shown(table, tgt, pa.array(rows, pa.int64()))
    for at, i in enumerate(rows):
        held = {int(j) for j in (bad_names[int(i)].as_py() or "").split(",") if j}   # (BAD: column positions)
        cols = [c for j, (c, eq) in enumerate(equal.items()) if not eq[int(i)].as_py() or j in held]
        report.keys["different"].append({"key": json.loads(keys[at]), "columns": cols})


def _show(report: TableReport, kind: str, key: str) -> None:
    if len(report.keys[kind]) < SHOWN:
        report.keys[kind].append(json.loads(key))
