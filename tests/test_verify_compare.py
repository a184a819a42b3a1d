"""verify_compare.compare_table, column at a time, against its specification (issue 29).

Generated: a table of every Arrow form the type matrix has, the source's reconciled chunks
(events_to_arrow, the store's shape), a target read (verify_rows.rows_to_batches, the path
the PostgreSQL target's read takes) holding the same rows with random damage (changed
values, rows deleted, added, held twice, values the type cannot hold), and log events after
some chunks' LW. The report must name exactly the keys the specification below names; the
servers' side of this (the window argument under writers) is tests/integration/test_verify.py.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import decimal
import math
from unittest import mock

import pytest
from hypothesis import given, settings, strategies as st

from airflow_provider_dblog.engine.events import DELETE, SNAPSHOT, UPDATE, Event, events_to_arrow
from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.schema import Column, TableSchema
from airflow_provider_dblog.engine.values import comparable
from airflow_provider_dblog.engine import verify_compare
from airflow_provider_dblog.engine.verify_compare import compare_table, key_strings, last_changes
from airflow_provider_dblog.engine.verify_rows import rows_to_batches

T = TableSchema("app", "t", (
    Column("id", "int32", False), Column("f", "float64"), Column("g", "float32"), Column("d", "decimal(10,2)"),
    Column("s", "string"), Column("b", "binary"), Column("ts", "timestamp"), Column("day", "date"),
    Column("iv", "text:interval"), Column("ok", "bool"), Column("n", "int16")), ("id",))

VALUES = {
    "f": st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
    "g": st.one_of(st.none(), st.floats(width=32)),
    "d": st.one_of(st.none(), st.decimals(min_value=-99999999, max_value=99999999, places=2, allow_nan=False)),
    "s": st.one_of(st.none(), st.text(max_size=5)),
    "b": st.one_of(st.none(), st.binary(max_size=4)),
    "ts": st.one_of(st.none(), st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31))),
    "day": st.one_of(st.none(), st.dates()),
    "iv": st.one_of(st.none(), st.sampled_from(["01:00:00", "-01:00:00.5", "00:00:00", "838:59:59"])),
    "ok": st.one_of(st.none(), st.booleans()),
    "n": st.one_of(st.none(), st.integers(-2**15, 2**15 - 1)),
}
# the same value in another text (the target's): equal by values.comparable
SAME_INTERVAL = {"-01:00:00.5": "-01:00:00.500000", "01:00:00": "01:00:00.000"}


def pos(i: int) -> Position:
    return Position(1, 1000 + i, 0)


def row_of(draw, k: int) -> tuple:
    return (k,) + tuple(draw(VALUES[c.name]) for c in T.columns[1:])


def _same(a: tuple, b: tuple) -> bool:
    return all(comparable(c.type, x) == comparable(c.type, y) for c, x, y in zip(T.columns, a, b))


@st.composite
def cases(draw):
    keys = sorted(draw(st.sets(st.integers(1, 60), max_size=25)))
    source = {k: row_of(draw, k) for k in keys}
    # chunks: the keys split in LW order, each chunk's LW
    cuts = sorted(draw(st.sets(st.integers(0, len(keys)), max_size=3)))
    bounds = [0, *cuts, len(keys)]
    chunks, lw_of = [], {}
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        lw = pos(10 * i + 10)
        part = keys[a:b]
        evs = [Event("app.t", SNAPSHOT, (k,), None, dict(zip(T.column_names, source[k])), pos(10 * i + 11))
               for k in part]
        chunks.append((lw, pos(10 * i + 12), events_to_arrow(T, evs)))
        lw_of.update({k: lw for k in part})
    # a requested key the source lacks: a delete event in the last chunk
    absent = draw(st.sets(st.integers(61, 70), max_size=2))
    if absent:
        lw = pos(100)
        evs = [Event("app.t", DELETE, (k,), {"id": k}, None, pos(101)) for k in absent]
        chunks.append((lw, pos(102), events_to_arrow(T, evs)))
        lw_of.update({k: lw for k in absent})
    # the target: the source's rows, then damage
    target = {k: list(r) for k, r in source.items()}
    for k in draw(st.lists(st.sampled_from(keys), max_size=4)) if keys else []:
        col = draw(st.integers(1, len(T.columns) - 1))
        name = T.columns[col].name
        if name == "iv" and target[k][col] in SAME_INTERVAL and draw(st.booleans()):
            target[k][col] = SAME_INTERVAL[target[k][col]]   # another text of the same interval: equal
        else:
            target[k][col] = draw(VALUES[name])
        if name == "n" and draw(st.integers(0, 5)) == 0:
            target[k][col] = 2**20   # a value int16 cannot hold (a damaged target can)
    for k in draw(st.lists(st.sampled_from(keys), max_size=5)) if keys else []:
        target.pop(k, None)
    extra_keys = draw(st.sets(st.integers(61, 90), max_size=3))
    for k in extra_keys:
        target[k] = list(row_of(draw, k))
    rows = [(tuple(r), pos(5).encode()) for r in target.values()]
    dups = draw(st.lists(st.sampled_from(sorted(target)), max_size=2)) if target else []
    rows += [(tuple(target[k]), pos(5).encode()) for k in dups]
    rows = draw(st.permutations(rows))
    # log events after some keys' reads (their own key, or a key-changing update's old key)
    changes = []
    known = sorted(set(source) | set(target) | absent)
    for k in draw(st.lists(st.sampled_from(known) if known else st.integers(1, 90), max_size=6)):
        p = pos(draw(st.integers(0, 120)))
        changes.append(Event("app.t", UPDATE, (k,), {"id": k}, {"id": k}, p))
    floor = pos(8)
    return keys, source, chunks, lw_of, absent, target, rows, dups, changes, floor


@pytest.mark.parametrize("matched_by", ["integers", "key strings"])   # (one integer key: its fast path)
@settings(max_examples=150, deadline=None)
@given(case=cases())
def test_the_report_names_exactly_the_keys_that_differ(case, matched_by):
    keys, source, chunks, lw_of, absent, target, rows, dups, changes, floor = case
    at = pos(200)
    with mock.patch.object(verify_compare, "_int_key", lambda table: False) if matched_by == "key strings" \
            else contextlib.nullcontext():
        got = compare_table(T, "tgt", chunks, rows_to_batches(T, [r + (p,) for r, p in rows]), at,
                            last_changes(T, events_to_arrow(T, changes)), floor)
    newest: dict[int, Position] = {}
    for e in changes:
        newest[e.key[0]] = max(newest.get(e.key[0], e.pos), e.pos)

    def moved(k: int) -> bool:
        return k in newest and newest[k] > lw_of.get(k, floor)

    want = {"missing": set(), "extra": set(), "different": set()}
    skipped = compared = 0
    for k in set(target) | set(source) | set(absent):
        if k in target and moved(k) or k not in target and k in source and moved(k):
            skipped += 1
        elif k in target and k in source:
            compared += 1
            if not _same(source[k], tuple(target[k])):
                want["different"].add(k)
        elif k in target:
            want["extra"].add(k)
        elif k in source:
            want["missing"].add(k)
        else:
            compared += 1   # requested, absent on both sides
    assert {kind: {k[0] for k in (got.keys[kind] if kind != "different" else [d["key"] for d in got.keys[kind]])}
            for kind in want} == {kind: v | ({k for k in dups} if kind == "extra" else set())
                                  for kind, v in want.items()}
    assert (got.missing, got.different) == (len(want["missing"]), len(want["different"]))
    assert got.extra == len(want["extra"]) + len(dups)
    assert (got.skipped, got.compared) == (skipped, compared)
    assert got.target_rows == len(rows) and got.source_rows == len(source)
    for d in got.keys["different"]:   # the columns named are exactly those that differ
        k = d["key"][0]
        want_cols = [c.name for c, x, y in zip(T.columns, source[k], target[k])
                     if comparable(c.type, x) != comparable(c.type, y) or (c.name == "n" and y == 2**20)]
        assert d["columns"] == want_cols, (k, source[k], target[k])


def test_floats_compare_by_repr_and_intervals_by_value():
    base = (1, 0.0, 1.5, decimal.Decimal("1.50"), "x", b"\x00", dt.datetime(2020, 1, 1), dt.date(2020, 1, 1),
            "-01:00:00.5", True, 3)
    chunk = events_to_arrow(T, [Event("app.t", SNAPSHOT, (1,), None, dict(zip(T.column_names, base)), pos(2))])
    cases = {"-0.0": (base[:1] + (-0.0,) + base[2:], ["f"]), "nan": None,
             "interval text": (base[:8] + ("-01:00:00.500000",) + base[9:], []),
             "decimal scale": (base[:3] + (decimal.Decimal("1.5"),) + base[4:], [])}
    nan_src = base[:1] + (math.nan,) + base[2:]
    for name, (tgt, cols) in {k: v for k, v in cases.items() if v}.items():
        rep = compare_table(T, "tgt", [(pos(1), pos(3), chunk)], rows_to_batches(T, [tgt + (pos(1).encode(),)]),
                            pos(9), last_changes(T, events_to_arrow(T, [])), pos(0))
        assert [d["columns"] for d in rep.keys["different"]] == ([cols] if cols else []), name
        assert rep.compared == 1
    nan_chunk = events_to_arrow(T, [Event("app.t", SNAPSHOT, (1,), None, dict(zip(T.column_names, nan_src)), pos(2))])
    rep = compare_table(T, "tgt", [(pos(1), pos(3), nan_chunk)], rows_to_batches(T, [nan_src + (pos(1).encode(),)]),
                        pos(9), last_changes(T, events_to_arrow(T, [])), pos(0))
    assert rep.equal and rep.compared == 1


def test_key_strings_match_the_logs():
    assert key_strings(T, [(1,), (22,)]) == ["[1]", "[22]"]


def test_a_key_read_in_two_chunks_compares_its_last_row():
    row = (1, 1.0, 1.5, decimal.Decimal("1.50"), "x", b"", None, None, None, None, 1)
    newer = row[:4] + ("y",) + row[5:]
    chunks = [(pos(i), pos(i + 1), events_to_arrow(T, [Event("app.t", SNAPSHOT, (1,), None,
                                                                 dict(zip(T.column_names, r)), pos(i))]))
              for i, r in ((1, row), (3, newer))]
    rep = compare_table(T, "tgt", chunks, rows_to_batches(T, [newer + (pos(0).encode(),)]), pos(9),
                        last_changes(T, events_to_arrow(T, [])), pos(0))
    assert rep.equal and (rep.compared, rep.source_rows) == (1, 1), rep


def test_columns_named_as_the_comparisons_own():
    odd = TableSchema("app", "o", (Column("_dblog_key", "int32", False), Column("_dblog_lw", "string"),
                                   Column("_dblog_bad", "string")), ("_dblog_key",))
    rows = [{"_dblog_key": k, "_dblog_lw": f"l{k}", "_dblog_bad": f"b{k}"} for k in (1, 2, 3)]
    chunk = events_to_arrow(odd, [Event("app.o", SNAPSHOT, (r["_dblog_key"],), None, r, pos(2)) for r in rows])
    target = [(1, "l1", "b1"), (2, "l2", "DAMAGED"), (4, "l4", "b4")]
    rep = compare_table(odd, "tgt", [(pos(1), pos(3), chunk)], rows_to_batches(odd, [t + (pos(0).encode(),) for t in target]),
                        pos(9), last_changes(odd, events_to_arrow(odd, [])), pos(0))
    assert (rep.keys["missing"], rep.keys["extra"], rep.keys["different"]) == (
        [[3]], [[4]], [{"key": [2], "columns": ["_dblog_bad"]}]), rep


@pytest.mark.parametrize("name", ["n", "a,b"])   # (a comma in a name: bug 4 of the break round)
def test_a_value_the_type_cannot_hold_names_its_column_whatever_its_name(name):
    """A target value its column's type cannot hold (int16: 2**20) where the source holds NULL: the
    row differs, and the column named is that column."""
    t = TableSchema("app", "t", (Column("id", "int32", False), Column(name, "int16")), ("id",))
    chunk = events_to_arrow(t, [Event("app.t", SNAPSHOT, (1,), None, {"id": 1, name: None}, pos(2))])
    rep = compare_table(t, "tgt", [(pos(1), pos(3), chunk)], rows_to_batches(t, [(1, 2**20, pos(1).encode())]),
                        pos(9), last_changes(t, events_to_arrow(t, [])), pos(0))
    assert rep.different == 1 and rep.keys["different"] == [{"key": [1], "columns": [name]}], rep
