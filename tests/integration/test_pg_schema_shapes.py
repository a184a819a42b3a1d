"""PostgreSQL: a table's shape as the log gives it (issue 27, cases 1, 2 and 4).

- A column's shape includes its type modifier (numeric(p,s), varchar(n), char(n),
  timestamp(p), ...): a change of it records a version; a widening flows (the target
  column takes the new type exactly), anything else quarantines the table naming the
  column, the old and the new type.
- A column dropped and added again under the same name holds NULL in every row at the
  source: the target follows (drop and add) when the log shows both steps, and the table
  is quarantined where the log cannot tell when it happened; never silent.
- A captured table renamed away and created again: quarantined there, the new table
  added to the publication and a full dump of it requested, which releases it; the
  renamed-away table's rows never reach the target under the old name.
"""
from __future__ import annotations

import pytest

from airflow_provider_dblog.engine.dump import DumpRunner
from airflow_provider_dblog.engine.local_chunks import LocalChunkReader
from airflow_provider_dblog.engine.requests import DumpSpec
from airflow_provider_dblog.engine.targets import target_table_name
from helpers import wait_until

pytestmark = pytest.mark.parametrize("src_db", ["postgres"], indirect=True)


def _run(src_db, *statements: str) -> None:
    with src_db.cursor() as cur:
        for s in statements:
            cur.execute(s)


def _setup(src_db, make_cdc, columns: str):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", columns)
        src_db.create_table(cur, "u", "id INT PRIMARY KEY, v INT")
    return make_cdc(["t", "u"])


def _target_type(cdc, table: str, column: str) -> str | None:
    schema = cdc.source.table_schema(f"{cdc.db}.{table}")
    with cdc.target() as tgt, tgt.conn.cursor() as cur:
        cur.execute("SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = to_regclass(%s) "
                    "AND attname = %s AND NOT attisdropped", (tgt.qualified_stage(target_table_name(schema)), column))
        row = cur.fetchone()
        return row[0] if row else None


def _dump(cdc, table: str, rid: str | None = None) -> None:
    """A full dump of ``table`` in this process (the tail running closes its windows)."""
    rid = rid or cdc.request(DumpSpec("table", [f"{cdc.db}.{table}"]))
    DumpRunner(cdc.source, cdc.state, cdc.store, LocalChunkReader(cdc.source), cdc.cfg.dump).run(rid)
    assert cdc.state.request(rid)["status"] == "done", cdc.state.request(rid)
    cdc.drain()


# -- case 1: type modifiers ------------------------------------------------------------

def test_a_numeric_widened_in_precision_and_scale_flows_exactly(src_db, make_cdc):
    cdc = _setup(src_db, make_cdc, "id INT PRIMARY KEY, amount numeric(10,2)")
    cdc.start_tail()
    _run(src_db, "INSERT INTO t VALUES (1, 10.55)")
    cdc.drain()
    assert cdc.apply_local()[f"{cdc.db}.t"]["status"] == "applied"
    assert _target_type(cdc, "t", "amount") == "numeric(10,2)"
    _run(src_db, "ALTER TABLE t ALTER COLUMN amount TYPE numeric(12,3)",
         "INSERT INTO t VALUES (2, 1234.567), (3, 123456789.123)", "UPDATE t SET amount = 10.555 WHERE id = 1",
         "INSERT INTO u VALUES (1, 1)")
    cdc.drain()
    assert cdc.tail_error is None
    versions = cdc.store.schema_versions(f"{cdc.db}.t")
    assert len(versions) == 2 and "quarantined" not in versions[-1][1], versions
    res = cdc.apply_local()
    assert res[f"{cdc.db}.t"]["status"] == "applied", res
    assert _target_type(cdc, "t", "amount") == "numeric(12,3)"
    with cdc.target() as tgt, tgt.conn.cursor() as cur:
        cur.execute(f"SELECT id, amount::text FROM {tgt.qualified_stage(target_table_name(cdc.source.table_schema(f'{cdc.db}.t')))} "
                    "ORDER BY id")
        assert cur.fetchall() == [(1, "10.555"), (2, "1234.567"), (3, "123456789.123")]
    cdc.assert_equal("t", "u")


@pytest.mark.parametrize("column, ddl, value, widened", [
    ("note varchar(10)", "ALTER TABLE t ALTER COLUMN note TYPE varchar(40)", "'" + "x" * 40 + "'", "text"),
    ("ts timestamp(0)", "ALTER TABLE t ALTER COLUMN ts TYPE timestamp(3)", "'2024-01-02 03:04:05.678'",
     "timestamp(6) without time zone"),
], ids=["varchar-grown", "timestamp-precision-grown"])
def test_other_widenings_of_a_type_modifier_flow(src_db, make_cdc, column, ddl, value, widened):
    cdc = _setup(src_db, make_cdc, f"id INT PRIMARY KEY, {column}")
    name = column.split()[0]
    cdc.start_tail()
    _run(src_db, "INSERT INTO t VALUES (1, NULL)")
    cdc.drain()
    cdc.apply_local()
    _run(src_db, ddl, f"INSERT INTO t VALUES (2, {value})")
    cdc.drain()
    assert cdc.tail_error is None
    versions = cdc.store.schema_versions(f"{cdc.db}.t")
    assert len(versions) == 2 and "quarantined" not in versions[-1][1], versions   # the typmod change is seen
    res = cdc.apply_local()
    assert res[f"{cdc.db}.t"]["status"] == "applied", res
    assert _target_type(cdc, "t", name) == widened
    cdc.assert_equal("t")


@pytest.mark.parametrize("column, steps, versions, final", [
    ("amount numeric(10,2)", ["ALTER TABLE t ALTER COLUMN amount TYPE numeric(12,3)",
                              "INSERT INTO t VALUES (2, 1234.567)",
                              "ALTER TABLE t ALTER COLUMN amount TYPE numeric(14,4)",
                              "INSERT INTO t VALUES (3, 12345.6789)"], 3, "numeric(14,4)"),
    ("v int", ["ALTER TABLE t ADD COLUMN note varchar(20)", "INSERT INTO t VALUES (2, 2, 'twenty')",
               "ALTER TABLE t ALTER COLUMN note TYPE varchar(40)",
               "INSERT INTO t VALUES (3, 3, '" + "x" * 40 + "')"], 3, "text"),
    ("amount numeric(10,2)", ["ALTER TABLE t ALTER COLUMN amount TYPE numeric(12,3)",
                              "INSERT INTO t VALUES (2, 1.5)",
                              "ALTER TABLE t ALTER COLUMN amount TYPE numeric(10,2)",
                              "INSERT INTO t VALUES (3, 2.25)"], 3, None),
], ids=["numeric-widened-twice", "added-then-widened", "widened-then-narrowed"])
def test_type_modifiers_changed_twice_while_the_tail_was_behind_are_read_as_the_log_gives_them(
        src_db, make_cdc, column, steps, versions, final):
    """The tail meets each Relation message after the catalog moved on (stopped across
    both ALTERs): a message that differs from the catalog only in type modifiers is read
    with the message's (what its rows were written with), not broken as "catalog past"."""
    cdc = _setup(src_db, make_cdc, f"id INT PRIMARY KEY, {column}")
    cdc.start_tail()
    _run(src_db, "INSERT INTO t VALUES (1, 1)")
    cdc.drain()
    assert cdc.apply_local()[f"{cdc.db}.t"]["status"] == "applied"
    cdc.stop_tail()
    _run(src_db, *steps, "INSERT INTO u VALUES (1, 1)")
    cdc.start_tail()
    cdc.drain()
    assert cdc.tail_error is None
    recorded = cdc.store.schema_versions(f"{cdc.db}.t")
    assert len(recorded) == versions, recorded
    assert not any("quarantined" in v for _, v in recorded[:2]), recorded
    res = cdc.apply_local()
    assert res[f"{cdc.db}.u"]["status"] == "applied", res
    if final is None:    # narrowed back: may have rounded values, so the table waits for a dump
        assert "quarantined" in recorded[-1][1], recorded
        assert res[f"{cdc.db}.t"]["status"] == "quarantined", res
        _dump(cdc, "t")
        assert cdc.apply_local()[f"{cdc.db}.t"]["status"] == "applied"
    else:
        assert "quarantined" not in recorded[-1][1], recorded
        assert res[f"{cdc.db}.t"]["status"] == "applied", res
        assert _target_type(cdc, "t", steps[0].split()[5]) == final
    cdc.assert_equal("t", "u")


@pytest.mark.parametrize("column, ddl, named", [
    ("amount numeric(10,2)", "ALTER TABLE t ALTER COLUMN amount TYPE numeric(10,1)", "amount changed type from numeric(10,2) to numeric(10,1)"),
    ("amount numeric(10,2)", "ALTER TABLE t ALTER COLUMN amount TYPE numeric(8,2)", "amount changed type from numeric(10,2) to numeric(8,2)"),
    ("note varchar(20)", "ALTER TABLE t ALTER COLUMN note TYPE varchar(10)",
     "note changed type from character varying(20) to character varying(10)"),
    ("note char(5)", "ALTER TABLE t ALTER COLUMN note TYPE char(8)", "note changed type from character(5) to character(8)"),
    ("ts timestamp(6)", "ALTER TABLE t ALTER COLUMN ts TYPE timestamp(0)",
     "ts changed type from timestamp(6) without time zone to timestamp(0) without time zone"),
    ("b bit(4)", "ALTER TABLE t ALTER COLUMN b TYPE bit(6) USING b || B'00'", "b changed type from bit(4) to bit(6)"),
], ids=["numeric-scale-shrunk", "numeric-narrowed", "varchar-narrowed", "char-grown", "timestamp-rounded",
        "bit-length"])
def test_a_type_modifier_change_that_may_rewrite_values_quarantines_the_table(src_db, make_cdc, column, ddl, named):
    cdc = _setup(src_db, make_cdc, f"id INT PRIMARY KEY, {column}")
    value = {"amount": "12.34", "note": "'abc'", "ts": "'2024-01-02 03:04:05.678'", "b": "B'1010'"}[column.split()[0]]
    cdc.start_tail()
    _run(src_db, f"INSERT INTO t VALUES (1, {value})")
    cdc.drain()
    cdc.apply_local()
    _run(src_db, ddl, "INSERT INTO t (id) VALUES (2)", "INSERT INTO u VALUES (1, 1)")
    cdc.drain()
    assert cdc.tail_error is None
    res = cdc.apply_local()
    t = res[f"{cdc.db}.t"]
    assert t["status"] == "quarantined" and named in t["quarantined"]["why"], t
    assert res[f"{cdc.db}.u"]["status"] == "applied"
    _dump(cdc, "t")
    assert cdc.apply_local()[f"{cdc.db}.t"]["status"] == "applied"
    cdc.assert_equal("t", "u")


# -- case 2: a column dropped and added again under the same name -------------------------

@pytest.mark.parametrize("how", ["writes-between", "no-writes-between", "tail-stopped"])
def test_a_column_dropped_and_added_again_never_keeps_old_values(src_db, make_cdc, how):
    cdc = _setup(src_db, make_cdc, "id INT PRIMARY KEY, v INT, note varchar(20)")
    cdc.start_tail()
    _run(src_db, "INSERT INTO t VALUES (1, 1, 'one'), (2, 2, 'two'), (3, 3, 'three')")
    cdc.drain()
    assert cdc.apply_local()[f"{cdc.db}.t"]["status"] == "applied"
    if how == "tail-stopped":
        cdc.stop_tail()
    _run(src_db, "ALTER TABLE t DROP COLUMN note")
    if how == "writes-between":
        _run(src_db, "INSERT INTO t VALUES (4, 4)")
        cdc.drain()
    _run(src_db, "ALTER TABLE t ADD COLUMN note varchar(20)", "UPDATE t SET v = 10 WHERE id = 1",
         "INSERT INTO t VALUES (5, 5, 'five')", "INSERT INTO u VALUES (1, 1)")
    if how == "tail-stopped":
        cdc.start_tail()
    cdc.drain()
    assert cdc.tail_error is None
    res = cdc.apply_local()
    t = res[f"{cdc.db}.t"]
    assert res[f"{cdc.db}.u"]["status"] == "applied"
    if how == "writes-between":      # the log shows both steps: the target drops and adds it
        assert t["status"] == "applied", t
    else:                            # one Relation, looking as before: the log cannot tell when
        assert t["status"] == "quarantined" and "note" in t["quarantined"]["why"], t
        _dump(cdc, "t")
        assert cdc.apply_local()[f"{cdc.db}.t"]["status"] == "applied"
    cdc.assert_equal("t", "u")


# -- case 4: a captured table renamed away and created again ------------------------------

def _tail_requests(cdc, table: str) -> list[str]:
    return [rid for rid in cdc.state.requests(50)
            if (req := cdc.state.request(rid)) and req["spec"]["tables"] == [table]
            and "re-created" in req["spec"].get("requested_by", "")]


@pytest.mark.parametrize("how", ["live-old-written", "live-old-quiet", "tail-stopped"])
def test_a_table_renamed_away_and_created_again_is_quarantined_and_re_dumped(src_db, make_cdc, how):
    cdc = _setup(src_db, make_cdc, "id INT PRIMARY KEY, v INT")
    t = f"{cdc.db}.t"
    cdc.start_tail()
    _run(src_db, "INSERT INTO t VALUES (1, 1), (2, 2)")
    cdc.drain()
    assert cdc.apply_local()[t]["status"] == "applied"
    if how == "tail-stopped":
        cdc.stop_tail()
    _run(src_db, "ALTER TABLE t RENAME TO t_old", "CREATE TABLE t (LIKE t_old INCLUDING ALL)",
         "ALTER TABLE t REPLICA IDENTITY FULL", "INSERT INTO t VALUES (10, 10), (11, 11)")
    if how != "live-old-quiet":
        _run(src_db, "INSERT INTO t_old VALUES (3, 3)", "UPDATE t_old SET v = 20 WHERE id = 2")
    if how == "tail-stopped":
        cdc.start_tail()
    # the new table's rows are captured from the point the tail finds it
    wait_until(lambda: _tail_requests(cdc, t), 30, "a dump of the re-created table requested by the tail")
    _run(src_db, "INSERT INTO t VALUES (12, 12)", "INSERT INTO u VALUES (1, 1)")
    if how != "live-old-quiet":
        _run(src_db, "INSERT INTO t_old VALUES (4, 4)")
    cdc.drain()
    assert cdc.tail_error is None
    res = cdc.apply_local()
    assert res[t]["status"] == "quarantined" and "re-created" in res[t]["quarantined"]["why"], res[t]
    assert res[f"{cdc.db}.u"]["status"] == "applied"
    rids = _tail_requests(cdc, t)
    assert len(rids) == 1, rids
    _dump(cdc, "t", rids[0])
    _run(src_db, "INSERT INTO t VALUES (13, 13)", "UPDATE t SET v = 100 WHERE id = 10")
    cdc.drain()
    assert cdc.apply_local()[t]["status"] == "applied"
    cdc.assert_equal("t", "u")
    with cdc.target() as tgt:
        assert tgt.count(t) == 4    # the new table's rows only
