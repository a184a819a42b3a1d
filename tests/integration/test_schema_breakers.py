"""Schema changes that try to make a target silently differ from its source, or make one
table's DDL stop every table (a review of issues 16 and 27).

The rule each test checks: after the DDL, either the target equals the source (every
row, every value), or the changed table is quarantined (a dump releases it), or the tail
stops with a clear error; never silently different, and the other table (``u``) flows.

Tests marked ``xfail(strict=True)`` show a bug in the current code (the reason says what
is wrong); the others are classes of changes verified to hold.
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

_SAME_LOGICAL = pytest.mark.xfail(strict=True, reason="MariaDB: a type change that keeps the logical type "
                                  "(fsp shrunk, VARCHAR->CHAR, DOUBLE(M,D)) rewrites values without row events; "
                                  "the tail sees no change of the logical shape and the target keeps the old "
                                  "values")


@MARIADB
@pytest.mark.parametrize("column, value, ddl", [
    pytest.param("d DATETIME(6)", "'2024-01-01 10:00:00.987654'", "ALTER TABLE t MODIFY d DATETIME",
                 marks=_SAME_LOGICAL, id="datetime-6-to-0"),
    pytest.param("d TIMESTAMP(6) NULL", "'2024-01-01 10:00:00.987654'", "ALTER TABLE t MODIFY d TIMESTAMP(2) NULL",
                 marks=_SAME_LOGICAL, id="timestamp-6-to-2"),
    pytest.param("d TIME(6)", "'10:00:00.900000'", "ALTER TABLE t MODIFY d TIME", marks=_SAME_LOGICAL,
                 id="time-6-to-0"),
    pytest.param("d VARCHAR(10)", "'ab  '", "ALTER TABLE t MODIFY d CHAR(10)", marks=_SAME_LOGICAL,
                 id="varchar-to-char-strips-spaces"),
    pytest.param("d DOUBLE", "1.23456", "ALTER TABLE t MODIFY d DOUBLE(6,1)", marks=_SAME_LOGICAL,
                 id="double-to-double-m-d"),
    pytest.param("d FLOAT", "1.23456", "ALTER TABLE t MODIFY d FLOAT(5,2)", id="float-to-float-m-d"),
    pytest.param("d DATETIME(0)", "'2024-01-01 10:00:00'", "ALTER TABLE t MODIFY d DATETIME(6)",
                 id="datetime-0-to-6"),
])
def test_mariadb_a_type_change_that_rewrites_values_in_the_same_logical_type(src_db, make_cdc, column, value,
                                                                              ddl):
    """Tail running, rows written before the ALTER, none after: quarantined or equal."""
    cdc = _setup(src_db, make_cdc, f"id INT PRIMARY KEY, {column}", f"(1, {value})")
    res = _after(cdc, src_db, ddl)
    _equal_or_quarantined(cdc, res)


@MARIADB
@pytest.mark.parametrize("ddl", [
    "ALTER TABLE t ENGINE=Aria", "ALTER TABLE t ORDER BY v", "ALTER TABLE t FORCE",
    "ALTER TABLE t CONVERT TO CHARACTER SET latin1 COLLATE latin1_swedish_ci",
    "ALTER TABLE t MODIFY note VARCHAR(20) COLLATE utf8mb4_bin",
    "ALTER TABLE t CHARACTER SET latin1",
], ids=["engine-aria", "order-by", "force", "convert-to-latin1", "collate-bin", "table-default-charset"])
def test_mariadb_table_options_that_keep_rows(src_db, make_cdc, ddl):
    """Tail running; rows before and after, one update of an old row: equal or quarantined."""
    cdc = _setup(src_db, make_cdc, "id INT PRIMARY KEY, v INT, note VARCHAR(20)", "(1, 1, 'caf\u00e9 ab  ')",
                 "(2, 2, NULL)")
    res = _after(cdc, src_db, ddl, "INSERT INTO t VALUES (3, 3, 'na\u00efve')", "UPDATE t SET v = 20 WHERE id = 2")
    _equal_or_quarantined(cdc, res)


@MARIADB
@pytest.mark.parametrize("stopped", [False, True], ids=["tail-running", "tail-stopped"])
def test_mariadb_rename_table_swap_of_two_captured_tables(src_db, make_cdc, stopped):
    """RENAME TABLE a TO tmp, b TO a, tmp TO b (and as three statements): both quarantined
    (their rows swapped names without row events), never silently swapped."""
    _run(src_db, "CREATE TABLE a (id INT PRIMARY KEY, v INT)", "CREATE TABLE b (id INT PRIMARY KEY, v INT)",
         "CREATE TABLE u (id INT PRIMARY KEY, v INT)")
    cdc = make_cdc(["a", "b", "u"])
    cdc.start_tail()
    _run(src_db, "INSERT INTO a VALUES (1, 100)", "INSERT INTO b VALUES (1, 200), (2, 201)",
         "INSERT INTO u VALUES (1, 1)")
    cdc.drain()
    cdc.apply_local()
    cdc.assert_equal("a", "b", "u")
    if stopped:
        cdc.stop_tail()
    _run(src_db, "RENAME TABLE a TO tmp, b TO a, tmp TO b", "INSERT INTO a VALUES (3, 300)",
         "UPDATE b SET v = 101 WHERE id = 1", "INSERT INTO u VALUES (2, 2)")
    if stopped:
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
    "ALTER TABLE t CHANGE id id BIGINT",
    "ALTER TABLE t DROP PRIMARY KEY, ADD PRIMARY KEY (id, v)",
    "ALTER TABLE t MODIFY id VARCHAR(10)",
], ids=["rename-key", "widen-key", "key-changed", "key-retyped"])
def test_mariadb_primary_key_changes(src_db, make_cdc, ddl):
    cdc = _setup(src_db, make_cdc, "id INT PRIMARY KEY, v INT NOT NULL", "(1, 1)", "(2, 2)")
    res = _after(cdc, src_db, ddl, "UPDATE t SET v = 10 WHERE v = 1")
    _equal_or_quarantined(cdc, res)


@MARIADB
@pytest.mark.parametrize("stopped", [False, True], ids=["tail-running", "tail-stopped"])
@pytest.mark.parametrize("steps", [
    ["ALTER TABLE t ADD COLUMN c INT NOT NULL DEFAULT 1, ADD COLUMN d VARCHAR(5) DEFAULT 'x', DROP COLUMN note"],
    ["ALTER TABLE t ALTER COLUMN v SET DEFAULT 9", "ALTER TABLE t ADD COLUMN c INT NOT NULL DEFAULT 3"],
    ["ALTER TABLE t ADD COLUMN c DECIMAL(6,2) NOT NULL DEFAULT 1.5", "INSERT INTO t (id, v) VALUES (5, 5)",
     "ALTER TABLE t ADD COLUMN d INT DEFAULT 4"],
    ["ALTER TABLE t ADD COLUMN e ENUM('p', 'q') NOT NULL"],
    ["ALTER TABLE t ADD COLUMN s INT NOT NULL AUTO_INCREMENT UNIQUE"],
    ["ALTER TABLE t ADD COLUMN c INT DEFAULT 1", "ALTER TABLE t MODIFY c INT DEFAULT 2"],
], ids=["multi-clause", "set-default-then-add", "add-write-add", "enum-not-null-implicit", "auto-increment",
        "add-then-redefault"])
def test_mariadb_added_columns_with_defaults(src_db, make_cdc, steps, stopped):
    cdc = _setup(src_db, make_cdc, "id INT PRIMARY KEY, v INT, note VARCHAR(20)", "(1, 1, 'a')", "(2, NULL, NULL)")
    if stopped:
        cdc.stop_tail()
        _run(src_db, *steps)
        cdc.start_tail()
        res = _after(cdc, src_db)
    else:
        res = _after(cdc, src_db, *steps)
    _equal_or_quarantined(cdc, res)


_NON_STRICT = pytest.mark.xfail(strict=True, reason="MariaDB, a session without STRICT_TRANS_TABLES: the ALTER "
                                "converts values (NULL to '', truncation, enum label to '', negative to 0) "
                                "without row events; NOT NULL, VARCHAR(n), ENUM labels and INT->INT UNSIGNED "
                                "(read as a widening) are no change of the logical shape, so the target keeps "
                                "the old values")


@MARIADB
@pytest.mark.parametrize("ddl", [
    pytest.param("ALTER TABLE t MODIFY note VARCHAR(20) NOT NULL", marks=_NON_STRICT, id="not-null-over-nulls"),
    pytest.param("ALTER TABLE t MODIFY note VARCHAR(3)", marks=_NON_STRICT, id="varchar-narrowed"),
    pytest.param("ALTER TABLE t MODIFY e ENUM('a')", marks=_NON_STRICT, id="enum-value-removed"),
    pytest.param("ALTER TABLE t MODIFY v INT UNSIGNED", marks=_NON_STRICT, id="signed-to-unsigned"),
    pytest.param("ALTER TABLE t MODIFY v TINYINT", id="int-narrowed"),
])
def test_mariadb_non_strict_session_alters(src_db, make_cdc, ddl):
    """A session without STRICT_TRANS_TABLES: the server converts values (NULL to '',
    truncation, clamping) with warnings only, no row events."""
    cdc = _setup(src_db, make_cdc, "id INT PRIMARY KEY, v INT, note VARCHAR(20), e ENUM('a', 'b')",
                 "(1, -1000, NULL, 'b')", "(2, 2, 'abcdef', 'a')")
    with src_db.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")
        cur.execute(ddl)
    res = _after(cdc, src_db)
    _equal_or_quarantined(cdc, res)


@MARIADB
@pytest.mark.parametrize("ddl", [
    "ALTER TABLE t ADD COLUMN x INT AS (v + 1) VIRTUAL",
    "ALTER TABLE t ADD COLUMN x INT AS (v + 1) PERSISTENT",
    "ALTER TABLE t ADD COLUMN x INT INVISIBLE DEFAULT 4",
], ids=["virtual", "persistent", "invisible"])
def test_mariadb_generated_and_invisible_columns(src_db, make_cdc, ddl):
    cdc = _setup(src_db, make_cdc, "id INT PRIMARY KEY, v INT", "(1, 1)")
    res = _after(cdc, src_db, ddl, "INSERT INTO t (id, v) VALUES (2, 2)", "UPDATE t SET v = 3 WHERE id = 1")
    _equal_or_quarantined(cdc, res)


@MARIADB
@pytest.mark.parametrize("ddl", [
    "ALTER TABLE t ADD COLUMN x UUID",
    "ALTER TABLE t ADD COLUMN x INET6",
    "ALTER TABLE t ADD COLUMN x VARCHAR(5) CHARACTER SET utf16",
], ids=["uuid", "inet6", "utf16"])
@pytest.mark.xfail(strict=True, reason="a column of a type the engine refuses, added to one captured table: the "
                                       "tail quarantines that table, but every apply then fails for every table "
                                       "(apply_plan.load_schemas lets the SourceSetupError of table_schema(t) "
                                       "escape)")
def test_mariadb_a_column_of_an_unsupported_type_stops_only_its_table(src_db, make_cdc, ddl):
    cdc = _setup(src_db, make_cdc, "id INT PRIMARY KEY, v INT", "(1, 1)")
    _run(src_db, ddl, "INSERT INTO t (id, v) VALUES (2, 2)", "INSERT INTO u VALUES (2, 2)")
    cdc.drain()
    cdc.stop_tail()          # and a restart reads on
    cdc.start_tail()
    _run(src_db, "INSERT INTO u VALUES (3, 3)")
    cdc.drain()
    assert cdc.tail_error is None
    res = cdc.apply_local()
    assert res[f"{cdc.db}.u"]["status"] == "applied", res
    assert res[f"{cdc.db}.t"]["status"] == "quarantined", res
    cdc.assert_equal("u")


@MARIADB
@pytest.mark.xfail(strict=True, reason="MariaDB: the value existing rows hold in a column added with a literal "
                                       "DEFAULT is asked of the live server (SELECT DEFAULT(c)) when the tail "
                                       "records the change, after the catalog check; a SET DEFAULT committed in "
                                       "between (quick successive ALTERs, tail slightly behind) is recorded as "
                                       "the fill value: every old row differs, silently")
def test_mariadb_a_default_changed_while_the_tail_records_an_added_column(src_db, make_cdc, monkeypatch):
    """ADD COLUMN c INT DEFAULT 1, then ALTER COLUMN c SET DEFAULT 2 at once; the tail
    keeps up but the second ALTER commits between the reader's catalog read and the
    tail's fill query (the flush of the batch before the change lies between them; the
    same test without the patch fails about one run in four)."""
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


# -- PostgreSQL ------------------------------------------------------------------------
# (a change reaches the log with the table's next row change: each case writes one)

@POSTGRES
@pytest.mark.parametrize("setup, ddl", [
    pytest.param("CREATE DOMAIN dd AS int DEFAULT 42", "ALTER TABLE t ADD COLUMN c dd",
                 marks=pytest.mark.xfail(strict=True, reason="PostgreSQL: ADD COLUMN of a domain type with a "
                                         "DEFAULT fills existing rows with the domain's default (a rewrite, no "
                                         "row events); the column has no default of its own, so it is read as a "
                                         "nullable column without default and the target's old rows hold NULL"),
                 id="domain-with-default"),
    pytest.param("", "ALTER TABLE t ADD COLUMN c int[] DEFAULT '{1,2}'",
                 marks=pytest.mark.xfail(strict=True, reason="PostgreSQL: an array column added with a constant "
                                         "default: attmissingval of an array column is 2-D, "
                                         "(attmissingval::text::text[])[1] is NULL, so the fill value recorded "
                                         "is NULL and the target's old rows hold NULL"),
                 id="array-default"),
    pytest.param("", "ALTER TABLE t ADD COLUMN c text DEFAULT 'a,\"b\" {c}'", id="text-default-odd-chars"),
    pytest.param("", "ALTER TABLE t ADD COLUMN c timestamptz DEFAULT now()", id="stable-default-now"),
    pytest.param("", "ALTER TABLE t ADD COLUMN c float8 DEFAULT random()", id="volatile-default"),
    pytest.param("", "ALTER TABLE t ADD COLUMN c bigint GENERATED ALWAYS AS IDENTITY", id="identity"),
    pytest.param("", "ALTER TABLE t ADD COLUMN c serial", id="serial"),
    pytest.param("", "ALTER TABLE t ADD COLUMN c int GENERATED ALWAYS AS (v * 2) STORED", id="generated"),
    pytest.param("CREATE DOMAIN dn AS int NOT NULL DEFAULT 5", "ALTER TABLE t ADD COLUMN c dn",
                 id="domain-not-null-default"),
    pytest.param("", "ALTER TABLE t ALTER COLUMN v SET DEFAULT 9; ALTER TABLE t ADD COLUMN c int DEFAULT 3",
                 id="set-default-then-add"),
    pytest.param("CREATE TYPE mood AS ENUM ('sad', 'ok')", "ALTER TABLE t ADD COLUMN c mood DEFAULT 'ok'",
                 id="enum-default"),
])
@pytest.mark.parametrize("stopped", [False, True], ids=["tail-running", "tail-stopped"])
def test_postgres_added_columns(src_db, make_cdc, setup, ddl, stopped):
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
@pytest.mark.parametrize("steps", [
    ["ALTER TABLE t ALTER COLUMN note SET NOT NULL", "INSERT INTO t VALUES (3, 3, 'x')",
     "ALTER TABLE t ALTER COLUMN note DROP NOT NULL", "INSERT INTO t VALUES (4, 4, NULL)"],
    ["ALTER TABLE t ALTER COLUMN note DROP NOT NULL", "INSERT INTO t VALUES (4, 4, NULL)"],
    ["ALTER TABLE t ALTER COLUMN note DROP NOT NULL; UPDATE t SET note = NULL WHERE id = 1"],
    ["ALTER TABLE t ADD COLUMN c int DEFAULT 7", "ALTER TABLE t ALTER COLUMN c SET DEFAULT 8",
     "INSERT INTO t (id, v, note) VALUES (5, 5, 'e')"],
    ["ALTER TABLE t ADD COLUMN c int DEFAULT 7", "ALTER TABLE t ALTER COLUMN v TYPE bigint",
     "INSERT INTO t (id, v, note) VALUES (5, 5, 'e')"],
    ["ALTER TABLE t ADD COLUMN c int DEFAULT 7; ALTER TABLE t DROP COLUMN c; "
     "ALTER TABLE t ADD COLUMN c int DEFAULT 8", "INSERT INTO t (id, v, note) VALUES (5, 5, 'e')"],
    ["ALTER TABLE t RENAME COLUMN id TO pk", "INSERT INTO t VALUES (6, 6, 'f')"],
    ["ALTER TABLE t DROP CONSTRAINT t_pkey, ADD PRIMARY KEY (id, v)", "INSERT INTO t VALUES (6, 6, 'f')"],
    ["ALTER TABLE t ALTER COLUMN v TYPE bigint, ALTER COLUMN note TYPE text", "INSERT INTO t VALUES (6, 6, 'f')"],
], ids=["not-null-set-and-dropped", "not-null-dropped", "not-null-dropped-same-txn", "add-then-redefault",
        "add-then-rewrite", "add-drop-add-one-txn", "rename-key", "key-changed", "multi-clause-retype"])
@pytest.mark.parametrize("stopped", [False, True], ids=["tail-running", "tail-stopped"])
def test_postgres_successive_alters(src_db, make_cdc, steps, stopped):
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
@pytest.mark.parametrize("ddl", ["ALTER TABLE t ADD COLUMN m money", "ALTER TABLE t ADD COLUMN r int4range",
                                 "ALTER TABLE t ADD COLUMN p point"], ids=["money", "range", "point"])
def test_postgres_a_column_of_an_unsupported_type_stops_only_its_table(src_db, make_cdc, ddl):
    cdc = _setup(src_db, make_cdc, "id INT PRIMARY KEY, v INT", "(1, 1)")
    _run(src_db, ddl, "INSERT INTO t (id, v) VALUES (2, 2)", "INSERT INTO u VALUES (2, 2)")
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
