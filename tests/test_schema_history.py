"""engine/schema_history.py and engine/schema_evolution.py: how each kind of change
between two schema versions reaches the targets under each behaviour, and which version
holds at a position."""
from __future__ import annotations

import json

import pytest

from airflow_provider_dblog.engine.arrow_values import decode_row, encode_row, from_arrow
from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.schema import Column, TableSchema
from airflow_provider_dblog.engine.schema_evolution import (evolution, native_widens, recreated_columns, renames,
                                                            version_evolution, widens)
from airflow_provider_dblog.engine.schema_history import as_stored, same_description, version_at


def table(*columns: tuple, key=("id",)) -> TableSchema:
    return TableSchema("db", "t", tuple(Column(*c) for c in columns), key)


BASE = table(("id", "int32", False), ("v", "string"))
ADDED = table(("id", "int32", False), ("v", "string"), ("note", "string"))
DROPPED = table(("id", "int32", False))
RENAMED = table(("id", "int32", False), ("w", "string"))
WIDENED = TableSchema("db", "t", (Column("id", "int64", False), Column("v", "string")), ("id",))


@pytest.mark.parametrize("behaviour, new, renamed, fields", [
    ("evolve", ADDED, (), {"add": ("note",)}),
    ("lenient", ADDED, (), {"add": ("note",)}),
    ("ignore", ADDED, (), {"skip": ("note",)}),
    ("evolve", DROPPED, (), {"drop": ("v",)}),
    ("lenient", DROPPED, (), {"keep": ("v",)}),
    ("ignore", DROPPED, (), {"keep": ("v",)}),
    ("evolve", RENAMED, [("v", "w")], {"rename": (("v", "w"),)}),
    ("lenient", RENAMED, [("v", "w")], {"copy": (("v", "w"),), "keep": ("v",)}),
    ("ignore", RENAMED, [("v", "w")], {"keep": ("v",), "skip": ("w",)}),
    ("evolve", RENAMED, (), {"drop": ("v",), "add": ("w",)}),       # no rename said: a drop and an add
    ("evolve", WIDENED, (), {"retype": (("id", "int64"),)}),
    ("lenient", WIDENED, (), {"retype": (("id", "int64"),)}),
])
def test_each_change_under_each_behaviour(behaviour, new, renamed, fields):
    ev = evolution(BASE, new, behaviour, renamed=renamed)
    assert ev.compatible and ev.changed, ev
    got = {k: getattr(ev, k) for k in ("add", "drop", "keep", "rename", "copy", "retype", "skip") if getattr(ev, k)}
    assert got == fields


def test_the_same_logical_schema_is_no_change_under_any_behaviour():
    for behaviour in ("evolve", "lenient", "ignore", "fail"):
        ev = evolution(BASE, table(("id", "int32", False), ("v", "string")), behaviour)
        assert ev.compatible and not ev.changed and ev.describe() == "no change to its columns"


def test_fail_refuses_any_change():
    for new in (ADDED, DROPPED, RENAMED, WIDENED):
        ev = evolution(BASE, new, "fail")
        assert not ev.compatible and "schema_changes setting is 'fail'" in ev.describe()


def test_changes_no_behaviour_can_follow_are_named():
    cases = {
        "the primary key changed from (id) to (v)": table(("id", "int32", False), ("v", "string", False), key=("v",)),
        "column v changed type from string to int64": table(("id", "int32", False), ("v", "int64")),
        "column n was added NOT NULL": table(("id", "int32", False), ("v", "string"), ("n", "int32", False)),
    }
    for named, new in cases.items():
        for behaviour in ("evolve", "lenient"):
            ev = evolution(BASE, new, behaviour)
            assert not ev.compatible and named in ev.describe(), (named, ev)
    ev = evolution(BASE, WIDENED, "ignore")
    assert not ev.compatible and "keeps the target's type" in ev.describe()
    ev = evolution(BASE, RENAMED, "evolve", renamed=[("v", "x")])   # a rename the shapes do not show: ignored
    assert ev.drop == ("v",) and ev.add == ("w",)
    assert not evolution(BASE, table(("id", "int32", False), ("w", "int64")), "evolve",
                         renamed=[("v", "w")]).compatible              # renamed and retyped


def test_reordered_columns_are_a_change_without_ddl():
    ev = evolution(BASE, TableSchema("db", "t", (Column("v", "string"), Column("id", "int32", False)), ("id",)))
    assert ev.compatible and ev.changed and ev.reordered and ev.describe() == "columns reordered"


def test_a_column_added_with_a_default_or_generated_does_not_flow_unless_ignored():
    assert not evolution(BASE, ADDED, "evolve", {"note": "'x'"}).compatible
    assert "added with a default ('x')" in evolution(BASE, ADDED, "lenient", {"note": "'x'"}).describe()
    assert evolution(BASE, ADDED, "evolve", {"other": "1"}).compatible
    assert evolution(BASE, ADDED, "ignore", {"note": "'x'"}).skip == ("note",)


@pytest.mark.parametrize("old, new, wider", [
    ("int8", "int16", True), ("int32", "int64", True), ("int64", "int32", False),
    ("decimal(10,2)", "decimal(12,2)", True), ("decimal(10,2)", "decimal(12,3)", True),
    ("decimal(10,2)", "decimal(11,3)", True), ("decimal(10,2)", "decimal(11,4)", False), ("decimal(10,2)", "decimal(10,1)", False),
    ("decimal(10,2)", "numeric(40,2)", True), ("numeric(10,2)", "numeric", True), ("numeric", "numeric(10,2)", False),
    ("float32", "float64", False), ("int32", "string", False), ("int32", "decimal(20,0)", False),
])
def test_widening(old, new, wider):
    assert widens(old, new) is wider


@pytest.mark.parametrize("old, new, wider", [
    ("character varying(10)", "character varying(40)", True), ("character varying(40)", "character varying(10)", False),
    ("character varying(10)", "character varying", True), ("character varying(10)", "text", True),
    ("character varying(10)[]", "character varying(20)[]", True), ("character(5)", "character(8)", False),
    ("bit(4)", "bit(6)", False), ("bit varying(4)", "bit varying(6)", True),
    ("timestamp(0) without time zone", "timestamp(3) without time zone", True),
    ("timestamp(6) without time zone", "timestamp(0) without time zone", False),
    ("timestamp without time zone", "timestamp(3) without time zone", False),     # no modifier: 6 digits
    ("time(3) with time zone", "time with time zone", True), ("interval(2)", "interval", True),
    ("timestamp(3) without time zone", "timestamp(3) with time zone", False),
])
def test_widening_of_a_postgresql_type_modifier(old, new, wider):
    assert native_widens(old, new) is wider
    assert widens(f"text:{old}", f"text:{new}") is wider      # time, interval, varbit: carried as text


def _pg_version(*columns, attnums=None) -> dict:
    """A PostgreSQL version: (name, logical, formatted) columns, attnums in order unless given."""
    schema = table(("id", "int32", False), *[(n, t) for n, t, _ in columns])
    native = [{"name": "id", "formatted": "integer"}] + [{"name": n, "formatted": f} for n, _, f in columns]
    ids = attnums or {c.name: i + 1 for i, c in enumerate(schema.columns)}
    return {"schema": schema.to_dict(), "native": native, "extra": {"attnums": ids}, "behaviour": "evolve"}


def test_a_type_modifier_change_widens_or_quarantines_by_the_source_types():
    old = _pg_version(("amount", "numeric(10,2)", "numeric(10,2)"), ("note", "string", "character varying(20)"))
    wider = _pg_version(("amount", "numeric(12,3)", "numeric(12,3)"), ("note", "string", "character varying(40)"))
    ev = version_evolution(old, wider)
    assert ev.compatible and ev.retype == (("amount", "numeric(12,3)"),), ev
    shrunk = _pg_version(("amount", "numeric(10,1)", "numeric(10,1)"), ("note", "string", "character varying(20)"))
    assert "amount changed type from numeric(10,2) to numeric(10,1)" in version_evolution(old, shrunk).describe()
    narrower = _pg_version(("amount", "numeric(10,2)", "numeric(10,2)"), ("note", "string", "character varying(5)"))
    ev = version_evolution(old, narrower)
    assert not ev.compatible and "note changed type from character varying(20) to character varying(5)" in ev.describe()


def test_a_column_dropped_and_added_again_under_its_name_quarantines():
    old = _pg_version(("note", "string", "text"))
    again = _pg_version(("note", "string", "text"), attnums={"id": 1, "note": 3})
    assert recreated_columns(old, again) == ("note",)
    ev = version_evolution(old, again)
    assert not ev.compatible and "note was dropped and added again" in ev.describe()
    assert version_evolution(old, old).compatible and not recreated_columns(old, old)
    assert recreated_columns({"extra": {}}, again) == ()          # MySQL: no identities recorded


def test_renames_by_identity_or_by_statement():
    pg_old = {"extra": {"attnums": {"id": 1, "v": 2}}}
    pg_new = {"extra": {"attnums": {"id": 1, "w": 2}}}
    assert renames(pg_old, pg_new, [("a", "b")]) == [("v", "w")]        # PostgreSQL: attnum, not the statement
    assert renames({"extra": {}}, {"extra": {}}, [["v", "w"]]) == [("v", "w")]   # MySQL: the statement
    assert renames(pg_old, {"extra": {"attnums": {"id": 1, "w": 3}}}) == []      # dropped, and another added


def test_the_version_that_holds_at_a_position():
    versions = [(Position(1, 10, 0), {"v": 1}), (Position(1, 50, 0), {"v": 2})]
    assert version_at(versions, Position(1, 5, 0)) is None
    assert version_at(versions, Position(1, 10, 0)) == {"v": 1}
    assert version_at(versions, Position(1, 50, 0)) == {"v": 2}
    assert version_at(versions, Position(1, 50, 0), inclusive=False) == {"v": 1}
    assert version_at(versions, Position(2, 0, 0)) == {"v": 2}


def test_a_version_compares_equal_to_itself_read_back():
    described = {"schema": BASE.to_dict(), "native": [{"name": "v", "set_values": ("a", "b")}], "extra": {}}
    assert as_stored(described) == json.loads(json.dumps(described)) != described
    assert same_description(as_stored(described) | {"behaviour": "lenient", "renamed": []}, as_stored(described))


def test_a_fill_value_is_kept_exactly_and_lets_a_column_with_a_default_flow():
    import datetime as dt
    import decimal
    from airflow_provider_dblog.engine.values import FarDate
    values = {"s": "it's\t\\", "k": decimal.Decimal("1.50"), "d": FarDate(-735_000),
              "ts": dt.datetime(2020, 1, 2, 3, 4, 5, 123456), "n": None}
    types = {"s": "string", "k": "decimal(10,2)", "d": "date", "ts": "timestamp", "n": "int32"}
    row = decode_row(encode_row(types, values))
    assert {c: from_arrow(types[c], row[c])[0] for c in types} == values
    new = table(("id", "int32", False), ("v", "string"), ("s", "string", False))
    assert not evolution(BASE, new, "evolve", {"s": "'x'"}).compatible      # no value known: quarantine
    ev = evolution(BASE, new, "evolve", {"s": "'x'"}, fill_values=encode_row({"s": "string"}, {"s": "x"}))
    assert ev.compatible and ev.add == ev.fill == ("s",) and "existing rows given the default of s" in ev.describe()
