"""Issue 11's silent corruptions, each on the real servers, each failing on the code before
its fix (tests/integration/test_type_fidelity.py carries every type through every path;
here each defect has its own test):

* DECIMAL keys past 28 digits: two keys became one (``Decimal.normalize`` rounds).
* MySQL FLOAT / PostgreSQL real keys in a key-list dump: reported missing, then deleted.
* A transaction that also wrote a non-transactional table and rolled back, and a
  ROLLBACK TO SAVEPOINT: the rolled-back rows of transactional tables were kept.
* MariaDB ``log_bin_compress=ON``: compressed row events were skipped, silently.
* PostgreSQL: a key swap under a DEFERRABLE primary key lost rows.
* One value that no target can hold (a MySQL zero date, a PostgreSQL timestamp past
  Arrow's range) stopped the tail of the whole source; now ``dblog check`` names it, the
  tail goes on, that table's apply holds before it with a message, the other tables
  flow, and a fix at the source releases it.
"""
from __future__ import annotations

import pytest

from airflow_provider_dblog.cli import status
from airflow_provider_dblog.engine.apply import run_apply
from airflow_provider_dblog.engine.dump import DumpRunner
from airflow_provider_dblog.engine.requests import DumpSpec
from airflow_provider_dblog.engine.errors import SourceSetupError
from airflow_provider_dblog.engine.keys import encode_key

from helpers import mysql_connect

MARIADB = pytest.mark.parametrize("src_db", ["mariadb"], indirect=True)
POSTGRES = pytest.mark.parametrize("src_db", ["postgres"], indirect=True)


def target_rows(cdc, table: str, order: str = "1") -> list[tuple]:
    schema = cdc.source.table_schema(f"{cdc.db}.{table}")
    with cdc.target() as t, t.conn.cursor() as cur:
        cur.execute(f'SELECT {", ".join(schema.column_names)} FROM "{t.schema}"."{cdc.db}__{table}" '
                    f"ORDER BY {order}")
        return cur.fetchall()


def applied(cdc) -> dict:
    return run_apply(cdc.cfg, "tgt", via="local")["tables"]


# -- keys ---------------------------------------------------------------------------------
def test_decimal_keys_past_28_digits_stay_apart():
    import decimal
    a, b = decimal.Decimal("1234567890123456789012345678901"), decimal.Decimal("1234567890123456789012345678902")
    assert encode_key([a]) != encode_key([b])
    assert encode_key([decimal.Decimal("1.50")]) == encode_key([decimal.Decimal("1.5")])
    assert encode_key([decimal.Decimal("-0.00")]) == encode_key([decimal.Decimal("0")])


@MARIADB
def test_decimal_keys_past_28_digits_reach_the_target(make_cdc, src_db):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "k DECIMAL(38,0) PRIMARY KEY, v INT")
    cdc = make_cdc(["t"])
    cdc.start_tail()
    with src_db.cursor() as cur:
        cur.execute("INSERT INTO t VALUES (12345678901234567890123456789012345678, 1), "
                    "(12345678901234567890123456789012345677, 2)")
    cdc.drain()
    assert applied(cdc)[f"{cdc.db}.t"]["inserted"] == 2
    assert len(target_rows(cdc, "t")) == 2
    assert cdc.compare("t").equal


@pytest.mark.parametrize("src_db", ["mariadb", "postgres"], indirect=True)
def test_float_keys_of_a_key_list_are_found(make_cdc, src_db):
    ftype = "FLOAT" if src_db.kind == "mysql" else "real"
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", f"k {ftype} PRIMARY KEY, v INT")
        cur.execute("INSERT INTO t VALUES (0.1, 1), (-2.5, 2), (3.3, 3)")
    cdc = make_cdc(["t"])
    cdc.start_tail()
    table = f"{cdc.db}.t"
    rid = cdc.request(DumpSpec("keys", [table], keys=[[0.1], [3.3], ["-2.5"], [7.0]]))
    DumpRunner(cdc.source, cdc.state, cdc.store, None, cdc.cfg.dump).run(rid)
    progress = cdc.state.progress(rid, table)
    assert progress["missing_count"] == 1 and [float(v) for (v,) in progress["missing"]] == [7.0]
    # a WHERE dump picks the keys the database holds, and finds every one of them
    rid = cdc.request(DumpSpec("where", [table], where="k < 1"))
    DumpRunner(cdc.source, cdc.state, cdc.store, None, cdc.cfg.dump).run(rid)
    assert cdc.state.progress(rid, table)["missing_count"] == 0
    cdc.drain()
    applied(cdc)
    assert [r[1] for r in target_rows(cdc, "t", "v")] == [1, 2, 3]
    assert cdc.compare("t").equal


@MARIADB
@pytest.mark.parametrize("ddl", ["ENUM('zulu','alpha','mike','bravo')", "SET('zulu','alpha','mike')",
                                 "DECIMAL(65,30)"])
def test_enum_set_and_wide_decimal_keys_are_chunked_in_their_own_order(make_cdc, src_db, ddl):
    """The chunk plan orders by the column (ENUM and SET by number), and its range predicates
    must compare the same way: not as text (an ENUM), not as a double (65 digits)."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", f"k {ddl}, k2 INT, PRIMARY KEY (k, k2)")
        if ddl.startswith("DECIMAL"):
            cur.execute("INSERT INTO t SELECT CONCAT('1234567890123456789012345678901234.', seq % 7), seq "
                        "FROM seq_1_to_40")
        else:
            labels = "'zulu','alpha','mike','bravo'" if ddl.startswith("ENUM") else "'zulu','alpha,mike','mike'"
            cur.execute(f"INSERT INTO t SELECT ELT(seq % 3 + 1, {labels}), seq FROM seq_1_to_40")
    cdc = make_cdc(["t"])
    src, schema = cdc.source, cdc.source.table_schema(f"{cdc.db}.t")
    with src_db.cursor() as cur:
        cur.execute("SELECT k, k2 FROM t ORDER BY k, k2")
        want = [src._typed_key(schema, r) for r in cur.fetchall()]
    got, after = [], None
    while (plan := src.plan_chunk(schema, after, src.max_key(schema), 5, 2)) is not None:
        for pred in src.range_predicates(schema, plan):
            with src_db.cursor() as cur:
                order = ", ".join(src._predicate_columns(schema))   # the raw columns
                cur.execute(f"SELECT k, k2 FROM {src.jdbc_table(schema)} WHERE {pred} ORDER BY {order}"
                            .replace("%", "%%"), ())
                got += [src._typed_key(schema, r) for r in cur.fetchall()]
        after = plan.end
    assert got == want


@POSTGRES
def test_a_type_without_an_exact_carrier_is_refused_by_check(make_cdc, src_db):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id int PRIMARY KEY, price money")
    cdc = make_cdc(["t"])
    (problem,) = [p for p in cdc.source.check() if p.table]
    assert problem.table == f"{cdc.db}.t" and "t.price" in problem.what
    assert "money" in problem.what and "lc_monetary" in problem.what


# -- transactions ---------------------------------------------------------------------------
@MARIADB
def test_rolled_back_rows_of_transactional_tables_are_not_emitted(make_cdc, src_db):
    with src_db.cursor() as cur:
        cur.execute("CREATE TABLE inno (id INT PRIMARY KEY, v INT) ENGINE=InnoDB")
        cur.execute("CREATE TABLE mem (id INT PRIMARY KEY, v INT) ENGINE=MyISAM")
    cdc = make_cdc(["inno", "mem"])
    cdc.start_tail()
    with mysql_connect(src_db.name) as conn, conn.cursor() as cur:
        conn.autocommit(False)
        # the binlog gets both tables' rows and a ROLLBACK: MyISAM's rows stay written
        cur.execute("INSERT INTO inno VALUES (1, 1)")
        cur.execute("INSERT INTO mem VALUES (1, 1)")
        conn.rollback()
        # rows rolled back to a savepoint are in the binlog too, before ROLLBACK TO
        cur.execute("INSERT INTO inno VALUES (2, 2)")
        cur.execute("SAVEPOINT sp")
        cur.execute("INSERT INTO inno VALUES (3, 3)")
        cur.execute("INSERT INTO mem VALUES (2, 2)")
        cur.execute("ROLLBACK TO SAVEPOINT sp")
        cur.execute("INSERT INTO inno VALUES (4, 4)")
        conn.commit()
    with src_db.cursor() as cur:
        cur.execute("SELECT id FROM inno ORDER BY id")
        assert [r[0] for r in cur.fetchall()] == [2, 4]
    cdc.drain()
    applied(cdc)
    assert [r[0] for r in target_rows(cdc, "inno")] == [2, 4]
    assert [r[0] for r in target_rows(cdc, "mem")] == [1, 2]
    assert cdc.compare("inno").equal and cdc.compare("mem").equal


@MARIADB
def test_compressed_binlog_is_refused(make_cdc, src_db):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, body TEXT")
    cdc = make_cdc(["t"])
    with mysql_connect() as admin, admin.cursor() as cur:
        cur.execute("SET GLOBAL log_bin_compress = ON")
        try:
            problems = cdc.source.check(scan_values=True)
            assert any("log_bin_compress" in p.what for p in problems), problems
            cdc.start_tail()
            with src_db.cursor() as w:   # a row event past log_bin_compress_min_len (256 bytes)
                w.execute("INSERT INTO t VALUES (1, REPEAT('compressible ', 100))")
        finally:
            cur.execute("SET GLOBAL log_bin_compress = OFF")
    with pytest.raises(AssertionError, match="compressed event"):
        cdc.drain(timeout=30)
    assert isinstance(cdc.tail_error, SourceSetupError)
    cdc.tail_error = None


@POSTGRES
def test_key_swaps_under_a_deferrable_key_keep_every_row(make_cdc, src_db):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id int PRIMARY KEY DEFERRABLE INITIALLY IMMEDIATE, v text")
        cur.execute("INSERT INTO t SELECT x, 'v' || x FROM generate_series(1, 50) AS x")
    cdc = make_cdc(["t"])
    cdc.start_tail()
    with src_db.cursor() as cur:
        for i in range(6):    # permutations of the keys: each row passes through taken keys
            cur.execute("UPDATE t SET id = 51 - id")
            cur.execute("UPDATE t SET id = (id - 1 + %s) %% 50 + 1", (i + 3,))
            cur.execute("UPDATE t SET id = CASE WHEN id %% 2 = 0 THEN id - 1 ELSE id + 1 END", ())
    cdc.drain()
    rid = cdc.request(DumpSpec("keys", [f"{cdc.db}.t"], keys=[[i] for i in range(1, 52)]))
    applied(cdc)       # before the key-list dump: from the log alone
    with src_db.cursor() as cur:
        cur.execute("SELECT id, v FROM t ORDER BY id")
        want = cur.fetchall()
    assert target_rows(cdc, "t", "id") == want
    DumpRunner(cdc.source, cdc.state, cdc.store, None, cdc.cfg.dump).run(rid)
    cdc.drain()
    applied(cdc)
    assert target_rows(cdc, "t", "id") == want


@POSTGRES
def test_a_large_transaction_given_out_early_beside_a_netted_key_swap(make_cdc, src_db):
    """One transaction larger than STREAM_TXN_AFTER on two tables: rows into a table with
    an ordinary key (given out early, in parts) and a key swap of every row of a table
    under a DEFERRABLE key, itself larger than STREAM_TXN_AFTER. The swap's changes must
    be held to the commit and netted: given out early, the first part would say "insert
    key k" with row n+1-k's values and a later part "delete key k" (the row leaving it),
    and the target would lose rows."""
    from airflow_provider_dblog.engine.sources.postgres.changes import STREAM_TXN_AFTER
    rows = STREAM_TXN_AFTER * 2 + 500
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id int PRIMARY KEY DEFERRABLE INITIALLY IMMEDIATE, v text")
        src_db.create_table(cur, "big", "id int PRIMARY KEY, v text")
        cur.execute(f"INSERT INTO t SELECT x, 'v' || x FROM generate_series(1, {rows}) AS x")
    cdc = make_cdc(["t", "big"])
    cdc.start_tail()
    with src_db.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute(f"INSERT INTO big SELECT x, 'b' || x FROM generate_series(1, {rows}) AS x")
        cur.execute(f"UPDATE t SET id = {rows + 1} - id")
        cur.execute("COMMIT")
    cdc.drain()
    res = applied(cdc)     # no dump: every row of t was moved, so the log alone holds them
    assert res[f"{cdc.db}.big"]["inserted"] == rows, res
    for table in ("t", "big"):
        diff = cdc.compare(table)
        assert diff.equal, (table, diff.describe())


# -- one bad value, one table ------------------------------------------------------------------
@MARIADB
def test_a_zero_date_holds_its_table_only_until_it_is_fixed(make_cdc, src_db):
    with src_db.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")
        src_db.create_table(cur, "bad", "id INT PRIMARY KEY, d DATE, ts TIMESTAMP NULL DEFAULT NULL")
        src_db.create_table(cur, "good", "id INT PRIMARY KEY, v INT")
        cur.execute("INSERT INTO bad VALUES (1, '2024-01-01', '2024-01-01 00:00:00'), "
                    "(2, '0000-00-00', '2024-01-01 00:00:00')")
    cdc = make_cdc(["bad", "good"])
    # dblog check names the column and the fix before anything is captured
    problems = [p for p in cdc.source.check(scan_values=True) if p.table == f"{cdc.db}.bad"]
    assert len(problems) == 1 and "column d" in problems[0].what and "zero" in problems[0].what
    assert "zero_dates: null" in problems[0].fix

    cdc.start_tail()
    with src_db.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")
        cur.execute("INSERT INTO bad VALUES (3, '2024-03-03', '0000-00-00 00:00:00'), (4, '2024-04-04', NULL)")
        cur.execute("INSERT INTO good VALUES (1, 1), (2, 2)")
    cdc.drain()
    assert cdc.tail_error is None       # the tail went on
    res = applied(cdc)
    bad, good = res[f"{cdc.db}.bad"], res[f"{cdc.db}.good"]
    assert good["status"] == "applied" and good["inserted"] == 2
    assert bad["status"] == "held" and f"{cdc.db}.bad.ts" in bad["held"]["error"]
    assert "zero TIMESTAMP" in bad["held"]["error"]
    assert target_rows(cdc, "bad") == []     # nothing past the held event, and not it
    held = status(cdc.cfg, "src")["held"]    # what `dblog status` shows
    assert list(held) == ["tgt"] and list(held["tgt"]) == [f"{cdc.db}.bad"], held
    assert "zero TIMESTAMP" in held["tgt"][f"{cdc.db}.bad"]["error"]

    # a key-list dump of the old rows: row 2's zero date is held the same way
    rid = cdc.request(DumpSpec("keys", [f"{cdc.db}.bad"], keys=[[1], [2]]))
    DumpRunner(cdc.source, cdc.state, cdc.store, None, cdc.cfg.dump).run(rid)
    cdc.drain()
    assert applied(cdc)[f"{cdc.db}.bad"]["status"] == "held"

    # fixed at the source: every held row gets a later event, and the table flows again
    with src_db.cursor() as cur:
        cur.execute("UPDATE bad SET ts = '2024-03-03 00:00:00' WHERE id = 3")
        cur.execute("UPDATE bad SET d = NULL WHERE id = 2")
    cdc.drain()
    res = applied(cdc)[f"{cdc.db}.bad"]
    assert res["status"] == "applied", res
    assert [r[0] for r in target_rows(cdc, "bad")] == [1, 2, 3, 4]
    assert cdc.compare("bad").equal and cdc.compare("good").equal
    assert status(cdc.cfg, "src")["held"] == {}


@MARIADB
def test_zero_dates_as_null_when_the_user_says_so(make_cdc, src_db):
    with src_db.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, d DATE, dt DATETIME, ts TIMESTAMP NULL DEFAULT NULL")
        cur.execute("INSERT INTO t VALUES (1, '0000-00-00', '0000-00-00 00:00:00', '0000-00-00 00:00:00')")
    cdc2 = make_cdc(["t"], source={"zero_dates": "null"})
    assert not [p for p in cdc2.source.check(scan_values=True) if p.table], cdc2.source.check(scan_values=True)
    cdc2.start_tail()
    with src_db.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")
        cur.execute("INSERT INTO t VALUES (2, '2020-00-01', '0000-00-00 00:00:00', '0000-00-00 00:00:00')")
    cdc2.drain()
    rid = cdc2.request(DumpSpec("keys", [f"{cdc2.db}.t"], keys=[[1]]))
    DumpRunner(cdc2.source, cdc2.state, cdc2.store, None, cdc2.cfg.dump).run(rid)
    cdc2.drain()
    assert run_apply(cdc2.cfg, "tgt", via="local")["tables"][f"{cdc2.db}.t"]["status"] == "applied"
    assert target_rows(cdc2, "t", "id") == [(1, None, None, None), (2, None, None, None)]


@POSTGRES
def test_a_timestamp_past_arrows_range_holds_its_table_only(make_cdc, src_db):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "far", "id int PRIMARY KEY, ts timestamp")
        src_db.create_table(cur, "near", "id int PRIMARY KEY, v int")
    cdc = make_cdc(["far", "near"])
    cdc.start_tail()
    with src_db.cursor() as cur:
        cur.execute("INSERT INTO far VALUES (1, '2024-01-01'), (2, '294276-12-31 23:59:59'), "
                    "(3, 'infinity')")
        cur.execute("INSERT INTO near VALUES (1, 1)")
    cdc.drain()
    assert cdc.tail_error is None
    problems = [p for p in cdc.source.check(scan_values=True) if p.table == f"{cdc.db}.far"]
    assert len(problems) == 1 and "294246" in problems[0].what
    res = applied(cdc)
    assert res[f"{cdc.db}.near"]["status"] == "applied"
    far = res[f"{cdc.db}.far"]
    assert far["status"] == "held", far
    assert f"{cdc.db}.far.ts" in far["held"]["error"] and "294276-12-31 23:59:59" in far["held"]["error"]
    with src_db.cursor() as cur:
        cur.execute("UPDATE far SET ts = 'infinity' WHERE id = 2")
    cdc.drain()
    assert applied(cdc)[f"{cdc.db}.far"]["status"] == "applied"
    assert cdc.compare("far").equal and cdc.compare("near").equal


@MARIADB
def test_a_large_transaction_rolled_back_whole_or_to_a_savepoint(make_cdc, src_db):
    """Review item of issue 27 ("a ROLLBACK of a large mixed-engine transaction forces a
    full reset"). A transaction of over 10,000 changes is given out early (written in parts,
    invisible until its end). Rolled back to a savepoint set after that, only the changes
    after the savepoint go (before, the tail stopped and asked for `dblog reset`: it took
    the savepoint for the transaction's start). Rolled back whole with a MyISAM table in it:
    MariaDB logs only the MyISAM changes, so there is nothing to take back."""
    with src_db.cursor() as cur:
        cur.execute("CREATE TABLE inno (id INT PRIMARY KEY, v INT) ENGINE=InnoDB")
        cur.execute("CREATE TABLE mem (id INT PRIMARY KEY, v INT) ENGINE=MyISAM")
    cdc = make_cdc(["inno", "mem"])
    cdc.start_tail()
    with mysql_connect(src_db.name) as conn, conn.cursor() as cur:
        conn.autocommit(False)
        for i in range(100, 10_100):   # one rows event each: given out at the 10,000th, none held
            cur.execute("INSERT INTO inno VALUES (%s, %s)", (i, i))
        cur.execute("SAVEPOINT sp")   # set with nothing held
        cur.execute("INSERT INTO inno SELECT seq, seq FROM seq_20000_to_20099")
        cur.execute("INSERT INTO mem VALUES (1, 1)")
        cur.execute("ROLLBACK TO SAVEPOINT sp")
        cur.execute("INSERT INTO inno VALUES (1, 1)")
        conn.commit()
        cur.execute("INSERT INTO inno SELECT seq, seq FROM seq_30000_to_42000")
        cur.execute("INSERT INTO mem SELECT seq, seq FROM seq_2_to_3000")
        conn.rollback()
    cdc.drain()
    assert cdc.tail_error is None
    applied(cdc)
    assert len(target_rows(cdc, "inno")) == 10_001 and len(target_rows(cdc, "mem")) == 3000
    assert cdc.compare("inno").equal and cdc.compare("mem").equal
