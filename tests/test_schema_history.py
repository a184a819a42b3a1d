"""engine/schema_history.py: which changes between two schema versions flow into the
targets, and which version holds at a position."""
from __future__ import annotations

from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.schema import Column, TableSchema
from airflow_provider_dblog.engine.schema_history import as_stored, classify, version_at


def table(*columns: tuple, key=("id",)) -> TableSchema:
    return TableSchema("db", "t", tuple(Column(*c) for c in columns), key)


BASE = table(("id", "int32", False), ("v", "string"))


def test_a_nullable_column_added_without_default_flows():
    diff = classify(BASE, table(("id", "int32", False), ("v", "string"), ("note", "string")))
    assert diff.compatible and diff.added == ("note",) and diff.describe() == "added note"


def test_the_same_logical_schema_is_no_change():
    diff = classify(BASE, table(("id", "int32", False), ("v", "string")))
    assert diff.compatible and not diff.changed


def test_changes_the_targets_cannot_follow_are_named():
    cases = {
        "the primary key changed from (id) to (v)": table(("id", "int32", False), ("v", "string", False), key=("v",)),
        "column(s) v dropped or renamed": table(("id", "int32", False), ("w", "string")),
        "column v changed type from string to int64": table(("id", "int32", False), ("v", "int64")),
        "column n was added NOT NULL": table(("id", "int32", False), ("v", "string"), ("n", "int32", False)),
        "columns were reordered": TableSchema("db", "t", (Column("v", "string"), Column("id", "int32", False)), ("id",)),
    }
    for named, new in cases.items():
        diff = classify(BASE, new)
        assert not diff.compatible and named in diff.describe(), (named, diff)


def test_a_column_added_with_a_default_or_generated_does_not_flow():
    new = table(("id", "int32", False), ("v", "string"), ("d", "string"))
    assert not classify(BASE, new, {"d": "'x'"}).compatible
    assert "added with a default ('x')" in classify(BASE, new, {"d": "'x'"}).describe()
    assert classify(BASE, new, {"other": "1"}).compatible


def test_the_version_that_holds_at_a_position():
    versions = [(Position(1, 10, 0), {"v": 1}), (Position(1, 50, 0), {"v": 2})]
    assert version_at(versions, Position(1, 5, 0)) is None
    assert version_at(versions, Position(1, 10, 0)) == {"v": 1}
    assert version_at(versions, Position(1, 50, 0)) == {"v": 2}
    assert version_at(versions, Position(1, 50, 0), inclusive=False) == {"v": 1}
    assert version_at(versions, Position(2, 0, 0)) == {"v": 2}


def test_a_version_compares_equal_to_itself_read_back():
    import json
    described = {"schema": BASE.to_dict(), "native": [{"name": "v", "set_values": ("a", "b")}], "extra": {}}
    assert as_stored(described) == json.loads(json.dumps(described)) != described
