"""Schema changes that try to make a target silently differ from its source, or make one
table's DDL stop every table (a review of issues 16 and 27).

The rule each test checks: after the DDL, either the target equals the source (every
row, every value), or the changed table is quarantined (a dump releases it), or the tail
stops with a clear error; never silently different, and the other table (``u``) flows.

The tests that failed when a helper wrote them ("break this", issue 27) are the findings
fixed since: MariaDB type changes that keep the logical type but round or strip values,
ALTERs run without strict mode, a default changed before an added column's fill was
read; PostgreSQL columns added of a domain with a default, a table inheriting from a
captured one; and a column of a refused type stopping every table's apply. The others
are classes of changes verified to hold.
"""
from __future__ import annotations

import pytest

from airflow_provider_dblog.engine.dump import DumpRunner
from airflow_provider_dblog.engine.local_chunks import LocalChunkReader
from airflow_provider_dblog.engine.requests import DumpSpec
from airflow_provider_dblog.engine.sources import open_source

MARIADB = pytest.mark.parametrize("src_db", ["mariadb"], indirect=True)
POSTGRES = pytest.mark.parametrize("src_db", ["postgres"], indirect=True)


def _run(src_db, *statements: str) -> None:
    with src_db.cursor() as cur:
        for s in statements:
            cur.execute(s)


def _setup(src_db, make_cdc, columns: str, *rows: str):
    """Tables t (``columns``) and u (id, v); the tail started; ``rows`` inserted into t
    through the log, and one row into u; applied (the target holds every row)."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", columns)
        src_db.create_table(cur, "u", "id INT PRIMARY KEY, v INT")
    cdc = make_cdc(["t", "u"])
    cdc.start_tail()
    _run(src_db, *[f"INSERT INTO t VALUES {r}" for r in rows], "INSERT INTO u VALUES (1, 1)")
    cdc.drain()
    res = cdc.apply_local()
    assert res[f"{cdc.db}.t"]["status"] == "applied", res
    cdc.assert_equal("t", "u")
    return cdc


def _dump(cdc, table: str = "t") -> None:
    """A full dump of ``table`` in this process (the tail running closes its windows)."""
    source = open_source(cdc.src_cfg)    # a fresh process's view of the catalog, as `dblog dump` has
    try:
        rid = DumpRunner(source, cdc.state, cdc.store, None, cdc.cfg.dump).submit(
            DumpSpec("table", [f"{cdc.db}.{table}"]))
        DumpRunner(source, cdc.state, cdc.store, LocalChunkReader(source), cdc.cfg.dump).run(rid)
    finally:
        source.close()
    assert cdc.state.request(rid)["status"] == "done", cdc.state.request(rid)
    cdc.drain()


def _after(cdc, src_db, *statements: str) -> dict:
    """Run ``statements``, write to u, drain, apply: the apply's result per table; u flowed."""
    _run(src_db, *statements, "INSERT INTO u VALUES (2, 2)")
    cdc.drain()
    assert cdc.tail_error is None, cdc.tail_error
    res = cdc.apply_local()
    assert res[f"{cdc.db}.u"]["status"] == "applied", res
    cdc.assert_equal("u")
    return res


def _equal_or_quarantined(cdc, res: dict, table: str = "t") -> None:
    """The rule: equal, or quarantined and then released by a dump (equal)."""
    r = res[f"{cdc.db}.{table}"]
    if r["status"] == "quarantined":
        assert r["quarantined"]["why"], r
        _dump(cdc, table)
        assert cdc.apply_local()[f"{cdc.db}.{table}"]["status"] == "applied"
    else:
        assert r["status"] in ("applied", "empty"), r
    cdc.assert_equal(table, "u")


# -- MariaDB: type changes whose logical type stays the same but whose values change ----


@MARIADB
@pytest.mark.parametrize("column, value, ddl", [
    pytest.param("d DATETIME(6)", "'2024-01-01 10:00:00.987654'", "ALTER TABLE t MODIFY d DATETIME",
                 id="datetime-6-to-0"),
    pytest.param("d TIME(6)", "'10:00:00.900000'", "ALTER TABLE t MODIFY d TIME",
                 id="time-6-to-0"),
    pytest.param("d VARCHAR(10)", "'ab  '", "ALTER TABLE t MODIFY d CHAR(10)",
                 id="varchar-to-char-strips-spaces"),
    pytest.param("d DOUBLE", "1.23456", "ALTER TABLE t MODIFY d DOUBLE(6,1)",
                 id="double-to-double-m-d"),
    pytest.param("d DATETIME(0)", "'2024-01-01 10:00:00'", "ALTER TABLE t MODIFY d DATETIME(6)",
                 id="datetime-0-to-6"),
    pytest.param("d TIMESTAMP(6) NULL", "'2024-01-01 10:00:00.987654'", "ALTER TABLE t MODIFY d TIMESTAMP(2) NULL",
                 id="timestamp-6-to-2"),
    pytest.param("d FLOAT", "1.5", "ALTER TABLE t MODIFY d FLOAT(5,2)", id="float-to-float-m-d"),
    pytest.param("d VARCHAR(10)", "'abc'", "ALTER TABLE t MODIFY d VARCHAR(40)", id="varchar-longer"),
])
def test_mariadb_a_type_change_that_rewrites_values_in_the_same_logical_type(src_db, make_cdc, column, value,
                                                                              ddl):
    """Tail running, rows written before the ALTER, none after: quarantined or equal.
    (Also TIMESTAMP(6) -> TIMESTAMP(2) fails the same way; FLOAT -> FLOAT(5,2) holds.)"""
    cdc = _setup(src_db, make_cdc, f"id INT PRIMARY KEY, {column}", f"(1, {value})")
    res = _after(cdc, src_db, ddl)
    _equal_or_quarantined(cdc, res)


@MARIADB
def test_mariadb_table_options_that_keep_rows_flow(src_db, make_cdc):
    """ENGINE=, ORDER BY, FORCE, a column's CHARACTER SET / COLLATE, the table's default
    character set, one after another with the tail running and a write after each: they
    flow. Then CONVERT TO CHARACTER SET: quarantined (the parser cannot read it; a
    re-dump for a change that keeps every value), released by a dump."""
    cdc = _setup(src_db, make_cdc, "id INT PRIMARY KEY, v INT, note VARCHAR(20)", "(1, 1, 'caf\u00e9 ab  ')",
                 "(2, 2, NULL)")
    for i, ddl in enumerate(["ALTER TABLE t ENGINE=Aria", "ALTER TABLE t ENGINE=InnoDB", "ALTER TABLE t ORDER BY v",
                             "ALTER TABLE t FORCE", "ALTER TABLE t MODIFY note VARCHAR(20) CHARACTER SET latin1",
                             "ALTER TABLE t MODIFY note VARCHAR(20) COLLATE latin1_bin",
                             "ALTER TABLE t CHARACTER SET utf8mb4"], start=10):
        _run(src_db, ddl, f"INSERT INTO t VALUES ({i}, {i}, 'na\u00efve {i}')", f"UPDATE t SET v = {i} WHERE id = 2")
    res = _after(cdc, src_db)
    assert res[f"{cdc.db}.t"]["status"] == "applied", res
    cdc.assert_equal("t")
    _run(src_db, "DELETE FROM u WHERE id = 2")
    res = _after(cdc, src_db, "ALTER TABLE t CONVERT TO CHARACTER SET utf8mb4", "UPDATE t SET v = 0 WHERE id = 1")
    _equal_or_quarantined(cdc, res)


@MARIADB
def test_mariadb_rename_table_swap_of_two_captured_tables_with_the_tail_stopped(src_db, make_cdc):
    """RENAME TABLE a TO tmp, b TO a, tmp TO b with the tail stopped across it and writes
    after: both quarantined (their rows swapped names without row events), a dump of each
    releases it. (With the tail running: the same.)"""
    _run(src_db, "CREATE TABLE a (id INT PRIMARY KEY, v INT)", "CREATE TABLE b (id INT PRIMARY KEY, v INT)",
         "CREATE TABLE u (id INT PRIMARY KEY, v INT)")
    cdc = make_cdc(["a", "b", "u"])
    cdc.start_tail()
    _run(src_db, "INSERT INTO a VALUES (1, 100)", "INSERT INTO b VALUES (1, 200), (2, 201)",
         "INSERT INTO u VALUES (1, 1)")
    cdc.drain()
    cdc.apply_local()
    cdc.assert_equal("a", "b", "u")
    cdc.stop_tail()
    _run(src_db, "RENAME TABLE a TO tmp, b TO a, tmp TO b", "INSERT INTO a VALUES (3, 300)",
         "UPDATE b SET v = 101 WHERE id = 1", "INSERT INTO u VALUES (2, 2)")
    cdc.start_tail()
    cdc.drain()
    assert cdc.tail_error is None
    res = cdc.apply_local()
    assert res[f"{cdc.db}.u"]["status"] == "applied", res
    for t in ("a", "b"):
        assert res[f"{cdc.db}.{t}"]["status"] == "quarantined", res
    for t in ("a", "b"):
        _dump(cdc, t)
    res = cdc.apply_local()
    assert all(res[f"{cdc.db}.{t}"]["status"] == "applied" for t in ("a", "b")), res
    cdc.assert_equal("a", "b", "u")


@MARIADB
def test_mariadb_gh_ost_style_shadow_table_swap(src_db, make_cdc):
    """gh-ost / pt-osc: a shadow table filled with a new column, then swapped in with one
    RENAME TABLE: the captured table quarantined, a dump releases it, equal."""
    cdc = _setup(src_db, make_cdc, "id INT PRIMARY KEY, v INT", "(1, 1)", "(2, 2)")
    _run(src_db, "CREATE TABLE _t_gho LIKE t", "ALTER TABLE _t_gho ADD COLUMN c INT NOT NULL DEFAULT 7",
         "INSERT INTO _t_gho (id, v) SELECT id, v FROM t", "UPDATE _t_gho SET c = 8 WHERE id = 2")
    res = _after(cdc, src_db, "RENAME TABLE t TO _t_del, _t_gho TO t", "INSERT INTO t VALUES (3, 3, 3)",
                 "DROP TABLE _t_del")
    assert res[f"{cdc.db}.t"]["status"] == "quarantined", res
    _equal_or_quarantined(cdc, res)


@MARIADB
@pytest.mark.parametrize("ddl", [
    "ALTER TABLE t RENAME COLUMN id TO pk",
    "ALTER TABLE t DROP PRIMARY KEY, ADD PRIMARY KEY (id, v)",
], ids=["rename-key", "key-changed"])
def test_mariadb_primary_key_changes(src_db, make_cdc, ddl):
    """Quarantined, released by a dump (run by a fresh source, as `dblog dump` is: a
    DumpRunner over a source object that cached the old key fails on the new one).
    (Also CHANGE id id BIGINT and MODIFY id VARCHAR(10) hold.)"""
    cdc = _setup(src_db, make_cdc, "id INT PRIMARY KEY, v INT NOT NULL", "(1, 1)", "(2, 2)")
    res = _after(cdc, src_db, ddl, "UPDATE t SET v = 10 WHERE v = 1")
    _equal_or_quarantined(cdc, res)


@MARIADB
@pytest.mark.parametrize("steps", [
    ["ALTER TABLE t ADD COLUMN c INT NOT NULL DEFAULT 1, ADD COLUMN d VARCHAR(5) DEFAULT 'x', DROP COLUMN note"],
    ["ALTER TABLE t ALTER COLUMN v SET DEFAULT 9", "ALTER TABLE t ADD COLUMN c INT NOT NULL DEFAULT 3"],
], ids=["multi-clause", "set-default-then-add"])
def test_mariadb_added_columns_with_defaults_across_a_stopped_tail(src_db, make_cdc, steps):
    """The tail stopped across the ALTERs. (The same with the tail running, ADD / write /
    ADD with DECIMAL defaults, ENUM NOT NULL
    without a default and AUTO_INCREMENT columns added: hold too, quarantined or equal.)"""
    cdc = _setup(src_db, make_cdc, "id INT PRIMARY KEY, v INT, note VARCHAR(20)", "(1, 1, 'a')", "(2, NULL, NULL)")
    cdc.stop_tail()
    _run(src_db, *steps)
    cdc.start_tail()
    res = _after(cdc, src_db)
    _equal_or_quarantined(cdc, res)


@MARIADB
def test_mariadb_a_default_changed_while_the_tail_records_an_added_column(src_db, make_cdc, monkeypatch):
    """ADD COLUMN c INT DEFAULT 1, then ALTER COLUMN c SET DEFAULT 2 right after, the tail
    running: the second ALTER commits between the reader's catalog read and the tail's
    fill query (the flush of the batch before the change lies between them). The patch
    only pins that timing: run without it, as two statements back to back, the same
    divergence showed in about one run in four."""
    from airflow_provider_dblog.engine.sources.mysql.source import MySQLSource
    cdc = _setup(src_db, make_cdc, "id INT PRIMARY KEY, v INT", "(1, 1)", "(2, 2)")
    original, ran = MySQLSource.added_column_fill, []

    def late_fill(self, table, column):
        if not ran:
            ran.append(True)
            _run(src_db, "ALTER TABLE t ALTER COLUMN c SET DEFAULT 2")
        return original(self, table, column)
    monkeypatch.setattr(MySQLSource, "added_column_fill", late_fill)
    res = _after(cdc, src_db, "ALTER TABLE t ADD COLUMN c INT DEFAULT 1")
    assert ran
    _equal_or_quarantined(cdc, res)



@MARIADB
@pytest.mark.parametrize("ddl", [
    pytest.param("ALTER TABLE t MODIFY note VARCHAR(20) NOT NULL", id="not-null-over-nulls"),
    pytest.param("ALTER TABLE t MODIFY v INT UNSIGNED", id="signed-to-unsigned"),
    pytest.param("ALTER TABLE t MODIFY v TINYINT", id="int-narrowed"),
    pytest.param("ALTER TABLE t MODIFY note VARCHAR(3)", id="varchar-shortened"),
])
def test_mariadb_non_strict_session_alters(src_db, make_cdc, ddl):
    """A session without STRICT_TRANS_TABLES: the server converts values with warnings
    only, no row events. (MODIFY note VARCHAR(3) and MODIFY e ENUM('a') over 'b' fail the
    same way.)"""
    cdc = _setup(src_db, make_cdc, "id INT PRIMARY KEY, v INT, note VARCHAR(20)", "(1, -1000, NULL)",
                 "(2, 2, 'abcdef')")
    with src_db.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")
        cur.execute(ddl)
    res = _after(cdc, src_db)
    _equal_or_quarantined(cdc, res)


@MARIADB
def test_mariadb_a_column_of_an_unsupported_type_stops_only_its_table(src_db, make_cdc):
    cdc = _setup(src_db, make_cdc, "id INT PRIMARY KEY, v INT", "(1, 1)")
    _run(src_db, "ALTER TABLE t ADD COLUMN x UUID", "INSERT INTO t (id, v) VALUES (2, 2)",
         "INSERT INTO u VALUES (2, 2)")
    cdc.drain()
    cdc.stop_tail()          # a restart reads on (this part holds)
    cdc.start_tail()
    _run(src_db, "INSERT INTO u VALUES (3, 3)")
    cdc.drain()
    assert cdc.tail_error is None
    res = cdc.apply_local()
    assert res[f"{cdc.db}.u"]["status"] == "applied", res
    assert res[f"{cdc.db}.t"]["status"] == "quarantined", res
    cdc.assert_equal("u")


# -- PostgreSQL ------------------------------------------------------------------------
# (a change reaches the log with the table's next row change: each case writes one)


@POSTGRES
@pytest.mark.parametrize("stopped, setup, ddl", [
    pytest.param(False, "CREATE DOMAIN dd AS int DEFAULT 42", "ALTER TABLE t ADD COLUMN c dd",
                 id="domain-with-default-tail-running"),
    pytest.param(True, "CREATE DOMAIN dn AS int NOT NULL DEFAULT 5", "ALTER TABLE t ADD COLUMN c dn",
                 id="domain-not-null-default-tail-stopped"),
    pytest.param(True, "", "ALTER TABLE t ADD COLUMN c int[] DEFAULT '{1,2}'", id="array-default-tail-stopped"),
    pytest.param(False, "", "ALTER TABLE t ADD COLUMN c timestamptz DEFAULT now()", id="stable-now-tail-running"),
    pytest.param(False, "", "ALTER TABLE t ADD COLUMN c float8 DEFAULT random()", id="volatile-tail-running"),
    pytest.param(True, "", "ALTER TABLE t ADD COLUMN c bigint GENERATED ALWAYS AS IDENTITY",
                 id="identity-tail-stopped"),
    pytest.param(True, "", "ALTER TABLE t ALTER COLUMN v SET DEFAULT 9; ALTER TABLE t ADD COLUMN c int DEFAULT 3",
                 id="set-default-then-add-tail-stopped"),
])
def test_postgres_added_columns(src_db, make_cdc, stopped, setup, ddl):
    """(Also hold, both ways: a text default with commas, quotes and braces, serial, a
    STORED generated column, an enum default, the domain/array/now/random cases the other way.)"""
    cdc = _setup(src_db, make_cdc, "id INT PRIMARY KEY, v INT", "(1, 1)", "(2, NULL)")
    if setup:
        _run(src_db, setup)
    if stopped:
        cdc.stop_tail()
    _run(src_db, ddl, "UPDATE t SET v = 10 WHERE id = 1")
    if stopped:
        cdc.start_tail()
    res = _after(cdc, src_db)
    _equal_or_quarantined(cdc, res)


@POSTGRES
@pytest.mark.parametrize("stopped, steps", [
    pytest.param(False, ["ALTER TABLE t ALTER COLUMN note SET NOT NULL", "INSERT INTO t VALUES (3, 3, 'x')",
                         "ALTER TABLE t ALTER COLUMN note DROP NOT NULL", "INSERT INTO t VALUES (4, 4, NULL)"],
                 id="not-null-set-and-dropped-tail-running"),
    pytest.param(True, ["ALTER TABLE t ADD COLUMN c int DEFAULT 7", "ALTER TABLE t ALTER COLUMN c SET DEFAULT 8",
                        "INSERT INTO t (id, v, note) VALUES (5, 5, 'e')"], id="add-then-redefault-tail-stopped"),
    pytest.param(True, ["ALTER TABLE t ADD COLUMN c int DEFAULT 7", "ALTER TABLE t ALTER COLUMN v TYPE bigint",
                        "INSERT INTO t (id, v, note) VALUES (5, 5, 'e')"], id="add-then-rewrite-tail-stopped"),
    pytest.param(True, ["ALTER TABLE t ADD COLUMN c int DEFAULT 7; ALTER TABLE t DROP COLUMN c; "
                        "ALTER TABLE t ADD COLUMN c int DEFAULT 8", "INSERT INTO t (id, v, note) VALUES (5, 5, 'e')"],
                 id="add-drop-add-one-txn-tail-stopped"),
    pytest.param(False, ["ALTER TABLE t DROP CONSTRAINT t_pkey, ADD PRIMARY KEY (id, v)",
                         "INSERT INTO t VALUES (6, 6, 'f')"], id="key-changed-tail-running"),
])
def test_postgres_successive_alters(src_db, make_cdc, stopped, steps):
    """(Also hold, both ways: DROP NOT NULL then a NULL in the same transaction, a key
    column renamed, two columns retyped in one statement.)"""
    cdc = _setup(src_db, make_cdc, "id INT PRIMARY KEY, v INT, note varchar(20) NOT NULL", "(1, 1, 'a')",
                 "(2, 2, 'b')")
    if stopped:
        cdc.stop_tail()
    _run(src_db, *steps)
    if stopped:
        cdc.start_tail()
    res = _after(cdc, src_db)
    _equal_or_quarantined(cdc, res)


@POSTGRES
def test_postgres_a_column_of_an_unsupported_type_stops_only_its_table(src_db, make_cdc):
    cdc = _setup(src_db, make_cdc, "id INT PRIMARY KEY, v INT", "(1, 1)")
    _run(src_db, "ALTER TABLE t ADD COLUMN m money", "INSERT INTO t (id, v) VALUES (2, 2)",
         "INSERT INTO u VALUES (2, 2)")
    cdc.drain()
    assert cdc.tail_error is None
    res = cdc.apply_local()
    assert res[f"{cdc.db}.u"]["status"] == "applied", res
    assert res[f"{cdc.db}.t"]["status"] == "quarantined", res
    cdc.assert_equal("u")


@POSTGRES
def test_postgres_a_table_inheriting_into_a_captured_table(src_db, make_cdc):
    """ALTER TABLE c INHERIT t: t's rows as the source reads them (SELECT ... FROM t) now
    include c's, whose changes the log gives as c's (not captured)."""
    cdc = _setup(src_db, make_cdc, "id INT PRIMARY KEY, v INT", "(1, 1)")
    _run(src_db, "CREATE TABLE c (id INT PRIMARY KEY, v INT)", "INSERT INTO c VALUES (100, 100)")
    res = _after(cdc, src_db, "ALTER TABLE c INHERIT t", "UPDATE t SET v = v + 1")
    _equal_or_quarantined(cdc, res)
