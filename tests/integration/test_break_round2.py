"""Break-this, round 2 (real servers): MariaDB schema changes read late (the shape after
an ALTER computed on a scratch copy, engine/sources/mysql/shape_replay.py; type changes
judged by COLUMN_TYPE, engine/mysql_widening.py) and the Delta Lake target
(engine/targets/delta.py, delta_evolve.py).

Tests marked xfail(strict=True) show a defect of the current code (the reason says what);
the others pin behaviour verified to be right.
"""
from __future__ import annotations

import pytest

from airflow_provider_dblog.engine.dump import DumpRunner
from airflow_provider_dblog.engine.local_chunks import LocalChunkReader
from airflow_provider_dblog.engine.requests import DumpSpec
from airflow_provider_dblog.engine.schema import TableSchema
from airflow_provider_dblog.engine.targets import open_target, target_table_name
from airflow_provider_dblog.engine.verify import compare_source_target
from helpers import mysql_connect

from test_type_fidelity import MARIADB_COLUMNS, MARIADB_ROWS, PG_COLUMNS, PG_ROWS, PG_SETUP

MARIADB = pytest.mark.parametrize("src_db", ["mariadb"], indirect=True)
POSTGRES = pytest.mark.parametrize("src_db", ["postgres"], indirect=True)


def _run(src_db, *sql: str) -> None:
    with src_db.cursor() as cur:
        for s in sql:
            cur.execute(s)


def _key_dump(cdc, table: str, keys) -> None:
    rid = cdc.request(DumpSpec("keys", [f"{cdc.db}.{table}"], keys=[[k] for k in keys]))
    DumpRunner(cdc.source, cdc.state, cdc.store, None, cdc.cfg.dump).run(rid)


def _full_dump(cdc, table: str) -> None:
    rid = cdc.request(DumpSpec("table", [f"{cdc.db}.{table}"]))
    DumpRunner(cdc.source, cdc.state, cdc.store, LocalChunkReader(cdc.source), cdc.cfg.dump).run(rid)
    assert cdc.state.request(rid)["status"] == "done", cdc.state.request(rid)


def _scratch_tables(cdc) -> list:
    with mysql_connect() as conn, conn.cursor() as cur:
        cur.execute("SHOW TABLES FROM `{}` LIKE '\\_dblog\\_shape\\_%'".format(cdc.wm_ns))
        return list(cur.fetchall())


# == A. MariaDB: ALTERs read with the catalog already past them ========================
def _mariadb_tu(src_db, make_cdc, t_cols: str = "id INT PRIMARY KEY, a INT, note VARCHAR(20)",
                rows: str = "(1, 10, 'one'), (2, 11, 'two')"):
    _run(src_db, "CREATE TABLE u (id INT PRIMARY KEY, v INT)", f"CREATE TABLE t ({t_cols})",
         f"INSERT INTO t VALUES {rows}")
    cdc = make_cdc(["t", "u"])
    cdc.start_tail()
    _run(src_db, "INSERT INTO u (id, v) VALUES (1, 1)")
    cdc.drain()
    _key_dump(cdc, "t", [1, 2])
    cdc.drain()
    res = cdc.apply_local()
    assert res[f"{cdc.db}.t"]["status"] == "applied", res
    cdc.assert_equal("t", "u")
    return cdc


def _late(cdc, src_db, *steps: str) -> dict:
    """The steps with the tail stopped, a row of u after them, then the tail drains; every
    apply until t's batches are through: the last result of each table."""
    cdc.stop_tail()
    _run(src_db, *steps, "INSERT INTO u (id, v) VALUES (2, 2)")
    cdc.start_tail()
    cdc.drain()
    assert cdc.tail_error is None, cdc.tail_error
    return _applies(cdc, len(steps) + 2)


def _applies(cdc, n: int, target: str = "tgt") -> dict:
    """``n`` applies; per table the last result, or the first quarantine seen."""
    last: dict = {}
    for _ in range(n):
        for t, r in cdc.apply_local(target).items():
            if last.get(t, {}).get("status") != "quarantined":
                last[t] = r
    return last


@MARIADB
def test_an_uncarried_type_added_and_dropped_while_the_tail_was_stopped_stops_only_its_table(src_db, make_cdc):
    cdc = _mariadb_tu(src_db, make_cdc)
    cdc.stop_tail()
    _run(src_db, "ALTER TABLE t ADD COLUMN w VARCHAR(10) CHARACTER SET utf16 NULL",
         "INSERT INTO t (id, a, w) VALUES (3, 3, 'x')", "ALTER TABLE t DROP COLUMN w",
         "INSERT INTO u (id, v) VALUES (2, 2)")
    cdc.start_tail()
    try:
        cdc.drain(timeout=20)
    finally:
        error, cdc.tail_error = cdc.tail_error, None   # (the fixture's stop_tail would raise it again)
    assert error is None, error
    last = _applies(cdc, 4)
    assert last[f"{cdc.db}.u"]["status"] != "quarantined", last
    assert last[f"{cdc.db}.t"]["status"] == "quarantined", last
    cdc.assert_equal("u")


@MARIADB
def test_an_uncarried_type_added_with_the_tail_running_quarantines_only_its_table(src_db, make_cdc):
    """The reference behaviour for the test above: the catalog path catches the error."""
    cdc = _mariadb_tu(src_db, make_cdc)
    _run(src_db, "ALTER TABLE t ADD COLUMN w VARCHAR(10) CHARACTER SET utf16 NULL",
         "INSERT INTO t (id, a, w) VALUES (3, 3, 'x')",
         "INSERT INTO u (id, v) VALUES (2, 2)")
    cdc.drain()
    assert cdc.tail_error is None
    res = cdc.apply_local()
    assert res[f"{cdc.db}.u"]["status"] == "applied", res
    assert res[f"{cdc.db}.t"]["status"] == "quarantined", res


@MARIADB
def test_a_timestamp_added_under_implicit_defaults_while_the_tail_was_stopped_is_not_silently_null(src_db, make_cdc):
    cdc = _mariadb_tu(src_db, make_cdc)
    cdc.stop_tail()
    with mysql_connect(src_db.name) as conn, conn.cursor() as cur:
        cur.execute("SET SESSION explicit_defaults_for_timestamp = OFF")
        cur.execute("ALTER TABLE t ADD COLUMN ts TIMESTAMP")
        cur.execute("ALTER TABLE t ADD COLUMN z INT NULL")
        cur.execute("INSERT INTO u (id, v) VALUES (2, 2)")
    cdc.start_tail()
    cdc.drain()
    assert cdc.tail_error is None, cdc.tail_error
    last = _applies(cdc, 4)
    t = last[f"{cdc.db}.t"]
    if t["status"] == "quarantined":
        return   # fail closed: right
    cdc.assert_equal("t", "u")


@MARIADB
def test_a_timestamp_added_under_implicit_defaults_with_the_tail_running_is_not_silently_null(src_db, make_cdc):
    """With the tail keeping up, the catalog is exact: NOT NULL with a non-constant default."""
    cdc = _mariadb_tu(src_db, make_cdc)
    with mysql_connect(src_db.name) as conn, conn.cursor() as cur:
        cur.execute("SET SESSION explicit_defaults_for_timestamp = OFF")
        cur.execute("ALTER TABLE t ADD COLUMN ts TIMESTAMP")
        cur.execute("INSERT INTO t (id, a) VALUES (3, 3)")
    cdc.drain()
    res = _applies(cdc, 3)
    if res[f"{cdc.db}.t"]["status"] == "quarantined":
        return   # fail closed: right
    cdc.assert_equal("t")


@MARIADB
def test_an_added_foreign_key_while_the_tail_was_stopped_flows(src_db, make_cdc):
    """An ALTER naming another table unqualified (REFERENCES u) on the scratch copy: flows."""
    cdc = _mariadb_tu(src_db, make_cdc)
    last = _late(cdc, src_db, "ALTER TABLE t ADD COLUMN p INT NULL, ADD CONSTRAINT fk_p FOREIGN KEY (p) REFERENCES u(id)",
                 "UPDATE t SET p = 1 WHERE id = 1",
                 "ALTER TABLE t ADD COLUMN z INT NULL")
    assert last[f"{cdc.db}.t"]["status"] != "quarantined", last[f"{cdc.db}.t"]
    cdc.assert_equal("t", "u")


@MARIADB
def test_late_alters_of_many_forms_flow_exactly(src_db, make_cdc):
    """Qualified names from another default database, comments, ALGORITHM/LOCK, IF [NOT] EXISTS,
    IGNORE, a CHECK constraint, an INVISIBLE column, a virtual generated column, AUTO_INCREMENT
    and an existing foreign key (to another table): computed on the scratch copy, flowing, none
    left behind."""
    cdc = _mariadb_tu(src_db, make_cdc,
                      "id INT AUTO_INCREMENT PRIMARY KEY, a INT, note VARCHAR(20), "
                      "g INT AS (a * 2) VIRTUAL, CONSTRAINT chk_a CHECK (a < 1000), "
                      "p INT NULL, CONSTRAINT fk_u FOREIGN KEY (p) REFERENCES u (id)",
                      "(1, 10, 'one', DEFAULT, NULL), (2, 11, 'two', DEFAULT, NULL)")
    db = src_db.name
    cdc.stop_tail()
    with mysql_connect() as conn, conn.cursor() as cur:   # no default database, then another one
        cur.execute(f"ALTER TABLE `{db}`.t ADD COLUMN x INT NULL AFTER a, ALGORITHM=COPY, LOCK=SHARED")
        cur.execute("USE mysql")
        cur.execute(f"ALTER /* a comment */ TABLE `{db}` . `t` /* here too */ ADD COLUMN IF NOT EXISTS x INT, "
                    "ADD COLUMN IF NOT EXISTS y VARCHAR(5) NULL")
        cur.execute(f"INSERT INTO `{db}`.t (a, note, x, y) VALUES (3, 'three', 30, 'y')")
    _run(src_db, "ALTER IGNORE TABLE t DROP COLUMN IF EXISTS nothing_here, RENAME COLUMN note TO label",
         "ALTER TABLE t ADD COLUMN h INT NULL INVISIBLE",
         "UPDATE t SET h = 5, x = 31 WHERE id = 1",
         "ALTER TABLE t MODIFY x BIGINT, ALGORITHM=COPY",
         "INSERT INTO t (a, label, x) VALUES (4, 'four', 5000000000)",
         "ALTER TABLE t DROP COLUMN y",
         "INSERT INTO u (id, v) VALUES (2, 2)")
    cdc.start_tail()
    cdc.drain()
    assert cdc.tail_error is None
    last = _applies(cdc, 8)
    assert last[f"{cdc.db}.t"]["status"] != "quarantined", last[f"{cdc.db}.t"]
    cdc.assert_equal("t", "u")
    assert _scratch_tables(cdc) == []


@MARIADB
def test_a_restart_in_the_middle_of_a_late_sequence_carries_the_create_text(src_db, make_cdc):
    """The tail stopped across ALTERs twice, with a restart between: the versions written by
    the first session carry the table's create text into the second (no quarantine)."""
    cdc = _mariadb_tu(src_db, make_cdc)
    for steps in (["ALTER TABLE t RENAME COLUMN a TO b", "INSERT INTO t (id, b, note) VALUES (3, 3, 'x')",
                   "ALTER TABLE t ADD COLUMN c INT NULL"],
                  ["ALTER TABLE t RENAME COLUMN b TO a2", "UPDATE t SET a2 = 7, c = 8 WHERE id = 3",
                   "ALTER TABLE t MODIFY c BIGINT", "INSERT INTO t (id, a2, c) VALUES (4, 4, 5000000000)",
                   "ALTER TABLE t DROP COLUMN note"]):
        last = _late(cdc, src_db, *steps)
        assert last[f"{cdc.db}.t"]["status"] != "quarantined", last[f"{cdc.db}.t"]
        _run(src_db, "DELETE FROM u WHERE id = 2")
        cdc.drain()
        cdc.apply_local()
        cdc.assert_equal("t", "u")


@MARIADB
@pytest.mark.parametrize("name", ["t" * 64, "select"])
def test_late_alters_of_tables_with_odd_names_flow(src_db, make_cdc, name):
    q = "`" + name.replace("`", "``") + "`"
    _run(src_db, f"CREATE TABLE {q} (id INT PRIMARY KEY, a INT, note VARCHAR(20))",
         "CREATE TABLE u (id INT PRIMARY KEY, v INT)", f"INSERT INTO {q} VALUES (1, 10, 'one')")
    cdc = make_cdc([name, "u"])
    cdc.start_tail()
    _run(src_db, "INSERT INTO u (id, v) VALUES (1, 1)")
    cdc.drain()
    _key_dump(cdc, name, [1])
    cdc.drain()
    cdc.apply_local()
    cdc.stop_tail()
    _run(src_db, f"ALTER TABLE {q} RENAME COLUMN a TO b", f"INSERT INTO {q} (id, b) VALUES (2, 2)",
         f"ALTER TABLE {q} ADD COLUMN c INT NULL", "INSERT INTO u (id, v) VALUES (2, 2)")
    cdc.start_tail()
    cdc.drain()
    assert cdc.tail_error is None
    last = _applies(cdc, 4)
    assert last[f"{cdc.db}.{name}"]["status"] != "quarantined", last[f"{cdc.db}.{name}"]
    cdc.assert_equal(name, "u")
    assert _scratch_tables(cdc) == []


@MARIADB
@pytest.mark.parametrize("strict", [True, False])
def test_a_late_narrowing_in_either_mode_is_never_silent(src_db, make_cdc, strict):
    """VARCHAR(20) -> VARCHAR(3) and INT -> INT UNSIGNED, later statements after: in a
    non-strict session values were cut at the source without row events."""
    cdc = _mariadb_tu(src_db, make_cdc, rows="(1, -10, 'long text here'), (2, 11, 'ab')")
    cdc.stop_tail()
    with mysql_connect(src_db.name) as conn, conn.cursor() as cur:
        cur.execute("SET SESSION sql_mode = %s", ("STRICT_ALL_TABLES" if strict else "",))
        if strict:
            cur.execute("UPDATE t SET note = 'abc', a = 10 WHERE id = 1")
        cur.execute("ALTER TABLE t MODIFY note VARCHAR(3), MODIFY a INT UNSIGNED")
        cur.execute("ALTER TABLE t ADD COLUMN z INT NULL")
        cur.execute("INSERT INTO u (id, v) VALUES (2, 2)")
    cdc.start_tail()
    cdc.drain()
    assert cdc.tail_error is None
    last = _applies(cdc, 4)
    t = last[f"{cdc.db}.t"]
    if t["status"] == "quarantined":
        assert not strict, t   # strict: every value was checked by the server, it flows
        return
    cdc.assert_equal("t", "u")


# == B. The Delta Lake target ===========================================================
def _lake(src_db, make_cdc, tables: list[str]):
    cdc = make_cdc(tables, lake=True)
    cdc.start_tail()
    return cdc


def _apply_both(cdc, table: str) -> None:
    for target in ("tgt", "lake"):
        res = cdc.apply_local(target)
        assert res[f"{cdc.db}.{table}"]["status"] in ("applied", "up_to_date", "empty"), (target, res)


def _held(res: dict, table: str, column: str, value: str) -> None:
    """The table's apply to the Delta target is held, its message naming the table, the
    column, the value and Delta's range (engine/targets/lake_values.py)."""
    r = res[table]
    assert r["status"] == "held", res
    error = r["held"]["error"]
    assert f"{table}.{column} = {value!r}" in error and "0001-01-01 to 9999-12-31" in error, error
    assert "never clamped" in error.lower(), error


def test_every_value_of_the_type_matrix_reaches_a_delta_table(src_db, make_cdc):
    """The fidelity matrix of test_type_fidelity.py on the log path, into Delta. PostgreSQL's
    dates past what Delta holds (4713 BC, infinity) hold the table on the Delta target only,
    with the message; once they change at the source, the rest of the matrix (BC, infinite
    and year-99999 timestamps included) arrives exactly."""
    columns, rows = (MARIADB_COLUMNS, MARIADB_ROWS) if src_db.kind == "mysql" else (PG_COLUMNS, PG_ROWS)
    with src_db.cursor() as cur:
        if src_db.kind != "mysql":
            for stmt in PG_SETUP:
                cur.execute(stmt)
        src_db.create_table(cur, "m", "id integer PRIMARY KEY, " + ", ".join(f"{c} {t}" for c, t in columns))
    cdc = _lake(src_db, make_cdc, ["m"])
    with src_db.cursor() as cur:
        for row in rows:
            cur.execute(f"INSERT INTO m VALUES ({', '.join(row)})".replace("%", "%%"), ())
    cdc.drain()
    if src_db.kind != "mysql":
        _held(cdc.apply_local("lake"), f"{cdc.db}.m", "dt", "4713-01-01 BC")
        assert cdc.apply_local("tgt")[f"{cdc.db}.m"]["status"] == "applied"
        cdc.assert_equal("m")   # the PostgreSQL target holds them: only the Delta target stops
        with src_db.cursor() as cur:
            cur.execute("UPDATE m SET dt = '0001-01-01' WHERE id = 1")
            cur.execute("UPDATE m SET dt = '9999-12-31' WHERE id = 2")
        cdc.drain()
    _apply_both(cdc, "m")
    cdc.assert_equal("m", target="lake")
    cdc.assert_equal("m")


@POSTGRES
def test_an_inet_reaches_a_delta_table_with_one_text_on_every_path(src_db, make_cdc):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "n", "id integer PRIMARY KEY, ip inet")
        cur.execute("INSERT INTO n VALUES (1, '::1'), (2, '1.2.3.4'), (3, '10.1.2.0/24')")
    cdc = _lake(src_db, make_cdc, ["n"])
    _full_dump(cdc, "n")
    with src_db.cursor() as cur:
        cur.execute("INSERT INTO n VALUES (4, '::1'), (5, '1.2.3.4')")
    cdc.drain()
    _apply_both(cdc, "n")
    with open_target(cdc.cfg.target("lake")) as t:
        lake = {r["id"]: r["ip"] for r in t.rows(cdc.source.table_schema(f"{cdc.db}.n"))}
    assert lake[1] == lake[4] and lake[2] == lake[5], lake
    cdc.assert_equal("n", target="lake")


def test_odd_column_names_reach_a_delta_table(src_db, make_cdc):
    q = (lambda n: "`" + n.replace("`", "``") + "`") if src_db.kind == "mysql" else \
        (lambda n: '"' + n.replace('"', '""') + '"')
    names = ["Mixed Case", 'q"uote', "select", "a.b", "order", "sp ace", "UPPER"]
    with src_db.cursor() as cur:
        src_db.create_table(cur, "w", f"{q('Key Col')} integer NOT NULL, {q('k.2')} varchar(10) NOT NULL, "
                            + ", ".join(f"{q(n)} integer" for n in names)
                            + f", PRIMARY KEY ({q('Key Col')}, {q('k.2')})")
    cdc = _lake(src_db, make_cdc, ["w"])
    cols = ", ".join(q(n) for n in ["Key Col", "k.2"] + names)
    with src_db.cursor() as cur:
        for i in range(1, 4):
            cur.execute(f"INSERT INTO w ({cols}) VALUES ({i}, 'k{i}', " + ", ".join(str(i * 10 + j) for j in
                                                                                range(len(names))) + ")")
        cur.execute(f"UPDATE w SET {q('a.b')} = 99, {q('select')} = -1 WHERE {q('Key Col')} = 2")
        cur.execute(f"DELETE FROM w WHERE {q('Key Col')} = 3")
    cdc.drain()
    _apply_both(cdc, "w")
    cdc.assert_equal("w", target="lake")


def test_string_and_composite_keys_with_empty_and_odd_values_in_a_delta_table(src_db, make_cdc):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "k", "a varchar(20) NOT NULL, b integer NOT NULL, v varchar(20), "
                            "PRIMARY KEY (a, b)")
        cur.execute("INSERT INTO k VALUES ('', 0, 'empty'), ('NULL', 1, 'null text'), (' ', 2, 'space'), "
                    "('x''y', 3, 'quote'), ('é', 4, 'accent'), ('\\\\N', 5, 'copy null')")
    cdc = _lake(src_db, make_cdc, ["k"])
    _full_dump(cdc, "k")
    with src_db.cursor() as cur:
        cur.execute("UPDATE k SET v = 'upd' WHERE a = '' AND b = 0")
        cur.execute("DELETE FROM k WHERE a = 'NULL'")
        cur.execute("INSERT INTO k VALUES ('NULL', 1, 'back')")
        cur.execute("UPDATE k SET a = 'moved' WHERE a = ' '")
    cdc.drain()
    _apply_both(cdc, "k")
    cdc.assert_equal("k", target="lake")


def test_deletes_and_reinserts_of_one_key_within_and_across_delta_batches(src_db, make_cdc):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id integer PRIMARY KEY, v integer")
        cur.execute("INSERT INTO t VALUES (1, 1), (2, 2), (3, 3)")
    cdc = _lake(src_db, make_cdc, ["t"])
    _full_dump(cdc, "t")
    cdc.drain()
    _apply_both(cdc, "t")
    with src_db.cursor() as cur:   # one batch: delete, insert again, delete again; insert, delete
        cur.execute("DELETE FROM t WHERE id = 1")
        cur.execute("INSERT INTO t VALUES (1, 10)")
        cur.execute("DELETE FROM t WHERE id = 2")
        cur.execute("INSERT INTO t VALUES (2, 20)")
        cur.execute("DELETE FROM t WHERE id = 2")
        cur.execute("INSERT INTO t VALUES (4, 4)")
        cur.execute("DELETE FROM t WHERE id = 4")
        cur.execute("UPDATE t SET id = 5 WHERE id = 3")
    cdc.drain()
    _apply_both(cdc, "t")
    cdc.assert_equal("t", target="lake")
    with src_db.cursor() as cur:   # across batches
        cur.execute("INSERT INTO t VALUES (2, 200)")
    cdc.drain()
    _apply_both(cdc, "t")
    with src_db.cursor() as cur:
        cur.execute("DELETE FROM t WHERE id = 2")
    cdc.drain()
    _apply_both(cdc, "t")
    with src_db.cursor() as cur:
        cur.execute("INSERT INTO t VALUES (2, 2000)")
        cur.execute("UPDATE t SET id = 3 WHERE id = 5")
    cdc.drain()
    _apply_both(cdc, "t")
    cdc.assert_equal("t", target="lake")


@POSTGRES
def test_a_float_key_with_nan_in_a_delta_table_stays_one_row(src_db, make_cdc):
    """PostgreSQL's float8 has NaN = NaN (one key); SQL's = in the Delta MERGE does not."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "f", "k double precision PRIMARY KEY, v integer")
        cur.execute("INSERT INTO f VALUES ('NaN', 1), ('-0', 2), ('Infinity', 3), ('-Infinity', 4)")
    cdc = _lake(src_db, make_cdc, ["f"])
    _full_dump(cdc, "f")
    cdc.drain()
    _apply_both(cdc, "f")
    with src_db.cursor() as cur:
        cur.execute("UPDATE f SET v = 10 WHERE k = 'NaN'")
        cur.execute("UPDATE f SET v = 30 WHERE k = 'Infinity'")
    cdc.drain()
    _apply_both(cdc, "f")
    cdc.assert_equal("f", target="lake")
    cdc.assert_equal("f")


@MARIADB
def test_schema_changes_into_a_delta_table(src_db, make_cdc):
    """Add, rename, widen, drop, TRUNCATE and rows between each, applied after each and
    after all."""
    mysql = src_db.kind == "mysql"
    with src_db.cursor() as cur:
        src_db.create_table(cur, "s", "id integer PRIMARY KEY, a integer, b varchar(10), d decimal(10,2)")
        cur.execute("INSERT INTO s VALUES (1, 1, 'one', 1.50), (2, 2, 'two', 2.25)")
    cdc = _lake(src_db, make_cdc, ["s"])
    _full_dump(cdc, "s")
    cdc.drain()
    _apply_both(cdc, "s")
    steps = [
        "ALTER TABLE s ADD COLUMN c integer NULL",
        "INSERT INTO s (id, a, b, d, c) VALUES (3, 3, 'three', 3.75, 33)",
        "ALTER TABLE s RENAME COLUMN a TO a2",
        "UPDATE s SET a2 = 20 WHERE id = 2",
        ("ALTER TABLE s MODIFY b varchar(40), MODIFY d decimal(14,4)" if mysql else
         "ALTER TABLE s ALTER COLUMN b TYPE varchar(40), ALTER COLUMN d TYPE numeric(14,4)"),
        "INSERT INTO s (id, a2, b, d, c) VALUES (4, 4, 'a longer text than ten', 12345.6789, 44)",
        "ALTER TABLE s DROP COLUMN c",
        "DELETE FROM s WHERE id = 1",
    ]
    with src_db.cursor() as cur:
        for s in steps:
            cur.execute(s)
    cdc.drain()
    for _ in range(6):
        last = cdc.apply_local("lake")
    assert last[f"{cdc.db}.s"]["status"] != "quarantined", last
    cdc.assert_equal("s", target="lake")
    with src_db.cursor() as cur:
        cur.execute("TRUNCATE TABLE s")
        cur.execute("INSERT INTO s (id, a2, b, d) VALUES (9, 9, 'nine', 9.9)")
    cdc.drain()
    for _ in range(3):
        last = cdc.apply_local("lake")
    cdc.assert_equal("s", target="lake")


FAR_DATES = [("date", "infinity"), ("date", "-infinity"), ("date", "4713-01-01 BC"),
             ("date", "5874897-12-31"), ("date", "0001-01-01 BC"), ("date", "10000-01-01")]
FAR_TIMESTAMPS = [("timestamp", "-infinity"), ("timestamp", "4713-01-01 00:00:00 BC"),
                  ("timestamptz", "infinity"), ("timestamp", "99999-12-31 23:59:59.999999"),
                  ("timestamp", "0001-01-01 00:00:00"), ("timestamptz", "2262-04-12 00:00:00.000001+00"),
                  ("date", "0001-01-01"), ("date", "9999-12-31")]


@POSTGRES
@pytest.mark.parametrize("typ, value", FAR_DATES + FAR_TIMESTAMPS)
def test_far_dates_reach_a_delta_table_or_stop_only_their_table(src_db, make_cdc, typ, value):
    """A date Delta cannot hold (engine/targets/lake_values.py: deltalake reads dates of
    years 1..9999 only) holds its table on the Delta target with the message; the other
    table of the run, and the same table on the PostgreSQL target, go on; a change of the
    row at the source releases it. Timestamps of any 64-bit value arrive and verify exactly."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "f", f"id integer PRIMARY KEY, x {typ}")
        src_db.create_table(cur, "u", "id integer PRIMARY KEY, v integer")
    cdc = _lake(src_db, make_cdc, ["f", "u"])
    with src_db.cursor() as cur:
        cur.execute("INSERT INTO f VALUES (1, %s), (2, NULL)", (value,))
        cur.execute("INSERT INTO u VALUES (1, 1)")
    cdc.drain()
    res = cdc.apply_local("lake")
    f, u = f"{cdc.db}.f", f"{cdc.db}.u"
    assert res[u]["status"] == "applied", res
    cdc.assert_equal("u", target="lake")
    if (typ, value) not in FAR_DATES:
        assert res[f]["status"] == "applied", res
        cdc.assert_equal("f", target="lake")
        return
    _held(res, f, "x", value)
    with src_db.cursor() as cur:   # still held, the other table still flowing
        cur.execute("INSERT INTO u VALUES (2, 2)")
    cdc.drain()
    res = cdc.apply_local("lake")
    assert res[u]["status"] == "applied", res
    _held(res, f, "x", value)
    cdc.assert_equal("u", target="lake")
    assert cdc.apply_local("tgt")[f]["status"] == "applied"   # the PostgreSQL target holds it
    cdc.assert_equal("f", "u")
    with src_db.cursor() as cur:   # fixed at the source: released
        cur.execute("UPDATE f SET x = NULL WHERE id = 1")
    cdc.drain()
    assert cdc.apply_local("lake")[f]["status"] == "applied"
    cdc.assert_equal("f", target="lake")
