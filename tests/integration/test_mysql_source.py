"""MySQLSource against a real MariaDB (the private server of tests/conftest.py).

Every test works in its own database and its own watermark namespace, and gives
each binlog reader its own server_id, so tests (and other people's tests on the
same server) do not see each other's rows.
"""
from __future__ import annotations

from decimal import Decimal

import datetime as dt
import decimal
import os
import random
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pymysql
import pytest

from airflow_provider_dblog.engine.config import Endpoint, SourceConfig
from airflow_provider_dblog.engine.errors import (NoPrimaryKeyError, SourceSetupError, UnknownTableError)
from airflow_provider_dblog.engine.events import events_to_arrow, rows_of
from airflow_provider_dblog.engine.reconcile import ERROR_COLUMN
from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.sources.base import (ChunkPlan, Idle, Problem, RowChange,
                                                        SchemaChange, TableBroken, TableTruncated, TxnEnd,
                                                        WatermarkSeen)
from airflow_provider_dblog.engine.sources.mysql import (MySQLSource, binlog_problems,
                                                         global_privileges, privilege_problems,
                                                         sql_literal, to_logical)

PORT = int(os.environ.get("DBLOG_TEST_MARIADB_PORT", 13306))  # as tests/conftest.py
REPO = Path(__file__).resolve().parents[2]


def connect(user: str = "root", password: str = "") -> pymysql.connections.Connection:
    return pymysql.connect(host="127.0.0.1", port=PORT, user=user, password=password,
                           autocommit=True, charset="utf8mb4")


_shared: list[pymysql.connections.Connection] = []


def run(sql: str, args=None) -> list[tuple]:
    """One statement as root, autocommit, on a connection kept for the module."""
    if not _shared or not _shared[0].open:
        _shared[:] = [connect()]
    with _shared[0].cursor() as cur:
        cur.execute(sql, args)
        return list(cur.fetchall())


def new_server_id() -> int:
    return random.randint(100_000, 2**31 - 1)


@pytest.fixture(scope="module", autouse=True)
def _close_shared():
    yield
    for conn in _shared:
        conn.close()
    _shared.clear()


@pytest.fixture
def ns(servers):
    """A watermark namespace (database) of the test's own."""
    name = f"wm_{uuid.uuid4().hex[:10]}"
    yield name
    run(f"DROP DATABASE IF EXISTS `{name}`")


@pytest.fixture
def make_source(ns):
    made = []

    def make(tables, user="root", password="", namespace=None) -> MySQLSource:
        cfg = SourceConfig(name="src", kind="mysql",
                           endpoint=Endpoint("127.0.0.1", PORT, user, password),
                           tables=tuple(tables), server_id=new_server_id(),
                           watermark_namespace=namespace or ns)
        src = MySQLSource(cfg)
        made.append(src)
        return src

    yield make
    for s in made:
        s.close()


def read_until(source: MySQLSource, resume, done, timeout: float = 20.0, server_id=None):
    """Items of read_log until ``done(items)`` is true (checked after each item)."""
    items = []
    deadline = time.monotonic() + timeout
    gen = source.read_log(resume, lambda: time.monotonic() > deadline,
                          server_id=server_id or new_server_id())
    try:
        for it in gen:
            items.append(it)
            if done(items):
                return items
    finally:
        gen.close()
    raise AssertionError(f"read_log timed out; got {items[-20:]}")


def until_mark(mark: str):
    """Done at the TxnEnd that follows the watermark ``mark``."""
    def done(items):
        seen = False
        for it in items:
            if isinstance(it, WatermarkSeen) and it.value == mark:
                seen = True
            elif seen and isinstance(it, TxnEnd):
                return True
        return False
    return done


def no_idle(items):
    return [i for i in items if not isinstance(i, Idle)]


def assert_positions_ordered(items):
    """Row/watermark positions strictly increase; a TxnEnd is above everything before
    it and not above anything after it."""
    last = Position(0, 0, 0)
    last_end = None
    for it in items:
        if isinstance(it, (RowChange, WatermarkSeen)):
            pos = it.event.pos if isinstance(it, RowChange) else it.pos
            assert pos > last, (pos, last)
            if last_end is not None:
                assert pos >= last_end
            last = pos
        elif isinstance(it, TxnEnd):
            assert it.pos > last
            if last_end is not None:
                assert it.pos >= last_end
            last_end = it.pos


# -- pure decision logic ----------------------------------------------------------
def test_binlog_problems_decision_logic():
    ok = {"log_bin": "ON", "binlog_format": "ROW", "binlog_row_image": "FULL",
          "binlog_row_metadata": "FULL"}
    assert binlog_problems(ok) == []
    assert binlog_problems({k: v for k, v in ok.items() if k != "binlog_row_metadata"}) == []
    off = binlog_problems({**ok, "log_bin": "OFF"})
    assert len(off) == 1 and "log_bin" in off[0].what and "--log-bin" in off[0].fix
    stmt = binlog_problems({**ok, "binlog_format": "STATEMENT"})
    assert len(stmt) == 1 and "STATEMENT" in stmt[0].what and "ROW" in stmt[0].fix
    assert "MIXED" in binlog_problems({**ok, "binlog_format": "MIXED"})[0].what
    minimal = binlog_problems({**ok, "binlog_row_image": "MINIMAL"})
    assert len(minimal) == 1 and "binlog_row_image" in minimal[0].what
    meta = binlog_problems({**ok, "binlog_row_metadata": "MINIMAL"})
    assert len(meta) == 1 and "binlog_row_metadata" in meta[0].what
    assert len(binlog_problems({**ok, "binlog_format": "MIXED", "binlog_row_image": "NOBLOB",
                                "binlog_row_metadata": "NO_LOG"})) == 3
    # compressed events cannot be decoded; out-of-order commits break the watermarks' premise
    (compressed,) = binlog_problems({**ok, "log_bin_compress": "ON"})
    assert "log_bin_compress" in compressed.what and "OFF" in compressed.fix
    (unordered,) = binlog_problems({**ok, "binlog_order_commits": "OFF"})
    assert "binlog_order_commits" in unordered.what
    assert binlog_problems({**ok, "log_bin_compress": "OFF", "binlog_order_commits": "ON"}) == []
    # the compiled decoder reads MariaDB 10.11+ and MySQL 8.4+ only; the library, older ones too
    for version, refused in (("10.6.12-MariaDB-log", True), ("10.11.19-MariaDB-0+deb12u1-log", False),
                             ("8.0.36", True), ("8.4.3", False), ("9.1.0", False)):
        problems = binlog_problems({**ok, "version": version}, "mysql-event-stream")
        assert bool(problems) is refused, version
        assert not refused or "decoder: mysql-replication" in problems[0].fix
        assert binlog_problems({**ok, "version": version}, "mysql-replication") == []


def test_grant_parsing():
    assert global_privileges(["GRANT ALL PRIVILEGES ON *.* TO `root`@`localhost` WITH GRANT OPTION"]) == {"ALL"}
    assert privilege_problems(["GRANT ALL PRIVILEGES ON *.* TO `root`@`localhost`"]) == []
    mariadb = ["GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO `cdc`@`%` IDENTIFIED BY PASSWORD '*AB'",
               "GRANT SELECT, INSERT, UPDATE, CREATE ON `dblog`.* TO `cdc`@`%`"]
    assert privilege_problems(mariadb) == []
    mysql = ["GRANT SELECT, RELOAD, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO `cdc`@`%`"]
    assert privilege_problems(mysql) == []
    # privileges on a database (or on columns) are not global
    scoped = ["GRANT USAGE ON *.* TO `u`@`%`",
              "GRANT ALL PRIVILEGES ON `app`.* TO `u`@`%`",
              "GRANT SELECT (`a`, `b`), REPLICATION SLAVE ON `app`.`t` TO `u`@`%`"]
    assert global_privileges(scoped) == {"USAGE"}
    probs = privilege_problems(scoped)
    assert len(probs) == 2
    assert any("REPLICATION SLAVE" in p.what for p in probs)
    assert any("REPLICATION CLIENT" in p.what for p in probs)
    only_slave = privilege_problems(["GRANT REPLICATION SLAVE ON *.* TO 'u'@'%'"])
    assert len(only_slave) == 1 and "BINLOG MONITOR" in only_slave[0].what


def test_sql_literal_rendering():
    assert sql_literal(5) == "5"
    assert sql_literal(True) == "1"
    assert sql_literal(decimal.Decimal("1E+2")) == "100"
    assert sql_literal("it's a \\ test") == "'it''s a \\\\ test'"
    assert sql_literal(b"\x00\xff") == "X'00ff'"
    assert sql_literal(dt.datetime(2024, 1, 2, 3, 4, 5, 6)) == "'2024-01-02 03:04:05.000006'"
    assert sql_literal(dt.date(2024, 1, 2)) == "'2024-01-02'"
    assert sql_literal(1.5) == "1.5" and sql_literal(0.10000000149011612) == "0.10000000149011612"
    for bad in (float("nan"), float("inf"), None, [1], decimal.Decimal("NaN"),
                dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)):
        with pytest.raises((TypeError, ValueError)):
            sql_literal(bad)


# -- check() ----------------------------------------------------------------------------
def test_check_reports_table_problems(mysql_db, make_source):
    run(f"CREATE TABLE `{mysql_db}`.good (id INT PRIMARY KEY, v TEXT)")
    run(f"CREATE TABLE `{mysql_db}`.nopk (id INT, v TEXT)")
    src = make_source([f"{mysql_db}.good", f"{mysql_db}.nopk", f"{mysql_db}.missing"])
    problems = src.check()
    assert all(isinstance(p, Problem) for p in problems)
    by_table = {p.table: p for p in problems}
    assert set(by_table) == {f"{mysql_db}.nopk", f"{mysql_db}.missing"}, problems
    assert "primary key" in by_table[f"{mysql_db}.nopk"].what
    assert "PRIMARY KEY" in by_table[f"{mysql_db}.nopk"].fix
    assert "does not exist" in by_table[f"{mysql_db}.missing"].what
    with pytest.raises(SourceSetupError) as e:
        src.check_or_raise()
    assert "nopk" in str(e.value) and "missing" in str(e.value)

    ready = make_source([f"{mysql_db}.good"])
    assert ready.check() == []
    ready.check_or_raise()


def test_check_reports_missing_privileges(mysql_db, make_source):
    user, password = f"u{uuid.uuid4().hex[:12]}", "pw-" + uuid.uuid4().hex[:8]
    run(f"CREATE TABLE `{mysql_db}`.t (id INT PRIMARY KEY)")
    run(f"CREATE USER '{user}'@'%%' IDENTIFIED BY %s", (password,))
    try:
        run(f"GRANT SELECT ON `{mysql_db}`.* TO '{user}'@'%'")
        src = make_source([f"{mysql_db}.t"], user=user, password=password)
        problems = src.check()
        whats = " | ".join(p.what for p in problems)
        assert "REPLICATION SLAVE" in whats
        assert "REPLICATION CLIENT" in whats
        assert "watermark" in whats
        assert not [p for p in problems if p.table], problems  # the table itself is fine
        assert all(p.fix for p in problems)
    finally:
        run(f"DROP USER IF EXISTS '{user}'@'%'")


def test_check_reports_bad_connection(servers):
    cfg = SourceConfig(name="bad", kind="mysql", endpoint=Endpoint("127.0.0.1", PORT, "nobody_x", "x"),
                       tables=("a.b",))
    problems = MySQLSource(cfg).check()
    assert len(problems) == 1 and "cannot connect" in problems[0].what


# -- table_schema ----------------------------------------------------------------------
def test_table_schema_types_and_composite_key(mysql_db, make_source):
    run(f"""CREATE TABLE `{mysql_db}`.t (
        a INT NOT NULL, b VARCHAR(20) NOT NULL,
        ti TINYINT, tu TINYINT UNSIGNED, t1 TINYINT(1), si SMALLINT, su SMALLINT UNSIGNED,
        mi MEDIUMINT, i INT, iu INT UNSIGNED, bi BIGINT, bu BIGINT UNSIGNED,
        d DECIMAL(12,3), f FLOAT, db DOUBLE, b1 BIT(1), b9 BIT(9),
        c CHAR(3), tx TEXT, e ENUM('x','y'), s SET('p','q'), j JSON, lt LONGTEXT,
        bn BINARY(4), vb VARBINARY(9), bl BLOB,
        dte DATE, dtm DATETIME(6), ts TIMESTAMP(3) NULL, tm TIME, yr YEAR,
        PRIMARY KEY (b, a))""")
    src = make_source([f"{mysql_db}.t"])
    schema = src.table_schema(f"{mysql_db}.t")
    types = {c.name: c.type for c in schema.columns}
    assert types == {
        "a": "int32", "b": "string", "ti": "int8", "tu": "int16", "t1": "int8", "si": "int16",
        "su": "int32", "mi": "int32", "i": "int32", "iu": "int64", "bi": "int64",
        "bu": "decimal(20,0)", "d": "decimal(12,3)", "f": "float32", "db": "float64",
        "b1": "bool", "b9": "int64", "c": "string", "tx": "string", "e": "string",
        "s": "string", "j": "json", "lt": "string", "bn": "binary", "vb": "binary",
        "bl": "binary", "dte": "date", "dtm": "timestamp", "ts": "timestamptz", "tm": "text:interval",
        "yr": "int16"}
    assert schema.column_names[:3] == ["a", "b", "ti"]  # ordinal order
    assert schema.key == ("b", "a")                       # primary-key order
    assert not schema.column("a").nullable and schema.column("ti").nullable
    schema.row_struct()  # every type maps to Arrow
    assert src.table_schema(f"{mysql_db}.t") is schema  # cached
    assert src.refresh_schema(f"{mysql_db}.t") == schema


def test_table_schema_errors(mysql_db, make_source):
    run(f"CREATE TABLE `{mysql_db}`.nopk (x INT)")
    run(f"CREATE TABLE `{mysql_db}`.other (x INT PRIMARY KEY)")
    run(f"CREATE VIEW `{mysql_db}`.v AS SELECT * FROM `{mysql_db}`.other")
    src = make_source([f"{mysql_db}.nopk", f"{mysql_db}.gone", f"{mysql_db}.v"])
    with pytest.raises(NoPrimaryKeyError):
        src.table_schema(f"{mysql_db}.nopk")
    with pytest.raises(UnknownTableError):
        src.table_schema(f"{mysql_db}.gone")
    with pytest.raises(UnknownTableError):
        src.table_schema(f"{mysql_db}.v")
    with pytest.raises(UnknownTableError):  # exists, but not configured
        src.table_schema(f"{mysql_db}.other")


# -- chunk planning ----------------------------------------------------------------
def walk_chunks(src, schema, upto, size, parts, after=None):
    plans = []
    while True:
        plan = src.plan_chunk(schema, after, upto, size, parts)
        if plan is None:
            return plans
        plans.append(plan)
        after = plan.end
        assert len(plans) < 10_000


def keys_by_predicate(src, schema, pred: str) -> list[tuple]:
    """The keys a range predicate selects from the Spark table expression, in key order."""
    cols = ", ".join(f"`{k}`" for k in schema.key)
    order = ", ".join(f"`{k}`" for k in src._predicate_columns(schema))
    rows = run(f"SELECT {cols} FROM {src.jdbc_table(schema)} WHERE {pred} ORDER BY {order}")
    native = src.native_columns(schema.qualified)
    return [tuple(to_logical(native[k], v) for k, v in zip(schema.key, r)) for r in rows]


def check_plans_cover(src, schema, plans, expected_keys, size, parts, after=None):
    seen = []
    prev_end = after
    for plan in plans:
        assert isinstance(plan, ChunkPlan)
        assert plan.after == prev_end and plan.bounds[0] == prev_end
        assert plan.bounds[-1] == plan.end
        assert 1 <= plan.rows <= size
        preds = src.range_predicates(schema, plan)
        assert len(preds) == len(plan.bounds) - 1 <= parts
        counts = []
        chunk = []
        for pred in preds:
            got = keys_by_predicate(src, schema, pred)
            counts.append(len(got))
            chunk += got
        assert len(chunk) == plan.rows
        assert chunk[-1] == plan.end
        assert max(counts) - min(counts) <= 1, counts  # near-equal partitions
        seen += chunk
        prev_end = plan.end
    assert seen == expected_keys  # every key once, in order, none past upto


def test_plan_chunk_int_key(mysql_db, make_source):
    run(f"CREATE TABLE `{mysql_db}`.t (id BIGINT PRIMARY KEY, v INT)")
    ids = [i for i in range(1, 1200) if i % 7 and i % 11]
    conn = connect()
    with conn.cursor() as cur:
        cur.executemany(f"INSERT INTO `{mysql_db}`.t VALUES (%s, %s)", [(i, i) for i in ids])
    conn.close()
    src = make_source([f"{mysql_db}.t"])
    schema = src.table_schema(f"{mysql_db}.t")
    top = src.max_key(schema)
    assert top == (max(ids),)
    for size, parts in ((97, 4), (1000, 3), (5000, 64)):
        plans = walk_chunks(src, schema, top, size, parts)
        check_plans_cover(src, schema, plans, [(i,) for i in ids], size, parts)
    for size, parts in ((5, 8), (1, 1), (2, 3)):  # tiny chunks over the first keys
        plans = walk_chunks(src, schema, (60,), size, parts)
        check_plans_cover(src, schema, plans, [(i,) for i in ids if i <= 60], size, parts)
    # an upto inside the table: nothing past it, and it is itself included
    plans = walk_chunks(src, schema, (500,), 50, 4)
    check_plans_cover(src, schema, plans, [(i,) for i in ids if i <= 500], 50, 4)
    # resuming after a key (1000 itself is not in the table)
    plans = walk_chunks(src, schema, top, 100, 2, after=(1001,))
    check_plans_cover(src, schema, plans, [(i,) for i in ids if i > 1001], 100, 2, after=(1001,))
    assert plans[-1].end == top
    assert src.plan_chunk(schema, top, top, 10, 2) is None


def test_plan_chunk_composite_key(mysql_db, make_source):
    run(f"CREATE TABLE `{mysql_db}`.t (a INT NOT NULL, b VARCHAR(30) NOT NULL, v INT, "
        "PRIMARY KEY (a, b))")
    strings = ["o'k", "back\\slash", "tail\\", "quote\"d", "pct%s", "ünïcödé", "a_b",
               "semi;colon", "--dash", "x' OR '1'='1", "nul\x00byte", "emoji😀", ""]
    rows = [(a, f"{s}{i}", i) for i, (a, s) in enumerate(
        (a, s) for a in range(-3, 9) for s in strings)]
    conn = connect()
    with conn.cursor() as cur:
        cur.executemany(f"INSERT INTO `{mysql_db}`.t VALUES (%s, %s, %s)", rows)
    conn.close()
    src = make_source([f"{mysql_db}.t"])
    schema = src.table_schema(f"{mysql_db}.t")
    assert schema.key == ("a", "b")
    all_keys = keys_by_predicate(src, schema, "1=1")
    assert len(all_keys) == len(rows)
    top = src.max_key(schema)
    assert top == all_keys[-1]
    for size, parts in ((17, 4), (7, 3), (1000, 5), (1, 2)):
        plans = walk_chunks(src, schema, top, size, parts)
        check_plans_cover(src, schema, plans, all_keys, size, parts)
    mid = all_keys[len(all_keys) // 2]
    plans = walk_chunks(src, schema, mid, 10, 3)
    check_plans_cover(src, schema, plans, all_keys[:len(all_keys) // 2 + 1], 10, 3)
    # the expanded tuple comparison is a range scan on the primary key
    plan = src.plan_chunk(schema, all_keys[5], top, 10, 2)
    explain = run(f"EXPLAIN SELECT a, b FROM `{mysql_db}`.t WHERE "
                  + src.range_predicates(schema, plan)[-1])
    assert explain[0][3] == "range" and explain[0][5] == "PRIMARY", explain


def test_plan_chunk_char_key(mysql_db, make_source):
    """A CHAR key is read through CAST in jdbc_table; predicates use its raw alias."""
    run(f"CREATE TABLE `{mysql_db}`.t (c CHAR(4) NOT NULL, e ENUM('x', 'yy', 'zzz') NOT NULL, "
        "v INT, PRIMARY KEY (c, e))")
    vals = ["", "a", "a b", "b'", "c\\", "Ö", "zz"]
    conn = connect()
    with conn.cursor() as cur:
        cur.executemany(f"INSERT INTO `{mysql_db}`.t VALUES (%s, %s, 1)",
                        [(c, e) for c in vals for e in ("x", "yy", "zzz")])
    conn.close()
    src = make_source([f"{mysql_db}.t"])
    schema = src.table_schema(f"{mysql_db}.t")
    all_keys = keys_by_predicate(src, schema, "1=1")
    assert len(all_keys) == 21 and ("a", "yy") in all_keys
    for size, parts in ((5, 2), (4, 3), (100, 4)):
        plans = walk_chunks(src, schema, src.max_key(schema), size, parts)
        check_plans_cover(src, schema, plans, all_keys, size, parts)
    plan = src.plan_chunk(schema, all_keys[3], src.max_key(schema), 6, 2)
    explain = run(f"EXPLAIN SELECT * FROM {src.jdbc_table(schema)} WHERE "
                  + src.range_predicates(schema, plan)[-1])
    assert explain[0][3] == "range" and explain[0][5] == "PRIMARY", explain


def test_plan_chunk_temporal_binary_decimal_key(mysql_db, make_source):
    run(f"CREATE TABLE `{mysql_db}`.t (d DATETIME(6) NOT NULL, k VARBINARY(8) NOT NULL, "
        "m DECIMAL(10,2) NOT NULL, dd DATE NOT NULL, v INT, PRIMARY KEY (d, k, m, dd))")
    base = dt.datetime(2024, 1, 1, 0, 0, 0, 1)
    rows = [(base + dt.timedelta(hours=i // 6, microseconds=i % 2), bytes([i % 3, 0, 39, 92]),
             decimal.Decimal(i % 4) / 4 - 1, dt.date(2020, 1, 1 + i % 5), i) for i in range(120)]
    conn = connect()
    with conn.cursor() as cur:
        cur.executemany(f"INSERT IGNORE INTO `{mysql_db}`.t VALUES (%s, %s, %s, %s, %s)", rows)
    conn.close()
    src = make_source([f"{mysql_db}.t"])
    schema = src.table_schema(f"{mysql_db}.t")
    all_keys = keys_by_predicate(src, schema, "1=1")
    assert all(isinstance(k[0], dt.datetime) and isinstance(k[1], bytes)
               and isinstance(k[2], decimal.Decimal) and isinstance(k[3], dt.date) for k in all_keys)
    plans = walk_chunks(src, schema, src.max_key(schema), 11, 3)
    check_plans_cover(src, schema, plans, all_keys, 11, 3)


def test_plan_chunk_empty_table(mysql_db, make_source):
    run(f"CREATE TABLE `{mysql_db}`.t (id INT PRIMARY KEY)")
    src = make_source([f"{mysql_db}.t"])
    schema = src.table_schema(f"{mysql_db}.t")
    assert src.max_key(schema) is None
    assert src.plan_chunk(schema, None, (100,), 10, 2) is None


# -- select_keys -------------------------------------------------------------------
def test_select_keys_existing_and_missing(mysql_db, make_source):
    run(f"CREATE TABLE `{mysql_db}`.t (a INT NOT NULL, b VARCHAR(10) NOT NULL, d DECIMAL(8,2), "
        "dtm DATETIME(6), j JSON, bl BLOB, PRIMARY KEY (a, b))")
    run(f"INSERT INTO `{mysql_db}`.t VALUES (1, 'x', 1.25, '2024-05-06 07:08:09.123456', "
        "'{\"k\": 1}', x'00ff'), (1, 'y', NULL, NULL, NULL, NULL), (2, 'it''s', -3.5, NULL, '[]', '')")
    src = make_source([f"{mysql_db}.t"])
    schema = src.table_schema(f"{mysql_db}.t")
    got = src.select_keys(schema, [(1, "x"), (2, "it's"), (9, "x"), (1, "z"), (1, "y"), (1, "x")])
    assert got.schema == pa.schema(list(schema.row_struct()) + [pa.field(ERROR_COLUMN, pa.string())])
    rows = {(r["a"], r["b"]): r for r in rows_of(schema, got)}
    assert set(rows) == {(1, "x"), (2, "it's"), (1, "y")}
    assert rows[(1, "x")] == {"a": 1, "b": "x", "d": decimal.Decimal("1.25"),
                              "dtm": dt.datetime(2024, 5, 6, 7, 8, 9, 123456),
                              "j": '{"k": 1}', "bl": b"\x00\xff"}
    assert rows[(1, "y")]["d"] is None and rows[(2, "it's")]["bl"] == b""
    assert src.select_keys(schema, []).num_rows == 0
    # batches
    run(f"CREATE TABLE `{mysql_db}`.u (id INT PRIMARY KEY)")
    conn = connect()
    with conn.cursor() as cur:
        cur.executemany(f"INSERT INTO `{mysql_db}`.u VALUES (%s)", [(i,) for i in range(0, 3000, 2)])
    conn.close()
    src2 = make_source([f"{mysql_db}.u"])
    s2 = src2.table_schema(f"{mysql_db}.u")
    got = src2.select_keys(s2, [(i,) for i in range(3000)])
    assert sorted(got["id"].to_pylist()) == list(range(0, 3000, 2))


# -- the watermark table -------------------------------------------------------------
def test_watermark_table_and_single_row_transaction(mysql_db, make_source, ns):
    run(f"CREATE TABLE `{mysql_db}`.t (id INT PRIMARY KEY)")
    src = make_source([f"{mysql_db}.t"])
    src.ensure_watermark_table()
    src.ensure_watermark_table()  # idempotent
    assert run(f"SELECT COUNT(*) FROM `{ns}`.watermark") == [(1,)]
    _, resume = src.current_resume()
    mark = str(uuid.uuid4())
    src.write_watermark(mark)
    assert run(f"SELECT id, value FROM `{ns}`.watermark") == [(1, mark)]
    items = no_idle(read_until(src, resume, until_mark(mark)))
    # the watermark write is alone in its transaction: WatermarkSeen then its TxnEnd
    i = next(n for n, it in enumerate(items) if isinstance(it, WatermarkSeen))
    assert items[i].value == mark
    assert isinstance(items[i + 1], TxnEnd) and items[i + 1].pos > items[i].pos
    assert not any(isinstance(it, RowChange) for it in items)
    with pytest.raises(ValueError):
        src.write_watermark("x" * 37)


# -- the binlog reader ----------------------------------------------------------------
def test_read_log_changes_in_order(mysql_db, make_source):
    t = f"{mysql_db}.t"
    run(f"CREATE TABLE `{mysql_db}`.t (id INT PRIMARY KEY, name VARCHAR(20), amount DECIMAL(10,2), "
        "at DATETIME(6))")
    run(f"CREATE TABLE `{mysql_db}`.ignored (id INT PRIMARY KEY)")
    src = make_source([t])
    src.ensure_watermark_table()
    start_pos, resume = src.current_resume()
    conn = connect()
    conn.autocommit(False)
    with conn.cursor() as cur:
        cur.execute(f"INSERT INTO `{mysql_db}`.t VALUES (1, 'a', 1.50, '2024-01-01 00:00:00.000001'), "
                    "(2, 'b', NULL, NULL), (3, 'c', 3, NULL)")
        cur.execute(f"INSERT INTO `{mysql_db}`.ignored VALUES (1)")
        conn.commit()
        cur.execute(f"UPDATE `{mysql_db}`.t SET name = 'bb', amount = 2.25 WHERE id = 2")
        conn.commit()
        cur.execute(f"DELETE FROM `{mysql_db}`.t WHERE id = 3")
        conn.commit()
        src.write_watermark("lw-1")
        cur.execute(f"UPDATE `{mysql_db}`.t SET id = 10 WHERE id = 1")  # a primary-key change
        conn.commit()
        cur.execute(f"UPDATE `{mysql_db}`.t SET amount = amount + 1")   # one event, two rows
        conn.commit()
    conn.close()
    src.write_watermark("hw-1")
    items = no_idle(read_until(src, resume, until_mark("hw-1")))
    assert_positions_ordered(items)
    rows = [it.event for it in items if isinstance(it, RowChange)]
    assert {e.table for e in rows} == {t}
    summary = [(e.op, e.key) for e in rows]
    assert summary == [("insert", (1,)), ("insert", (2,)), ("insert", (3,)),
                       ("update", (2,)), ("delete", (3,)),
                       ("delete", (1,)), ("insert", (10,)),
                       ("update", (2,)), ("update", (10,))]
    ins1 = rows[0]
    assert ins1.before is None
    assert ins1.after == {"id": 1, "name": "a", "amount": decimal.Decimal("1.50"),
                          "at": dt.datetime(2024, 1, 1, 0, 0, 0, 1)}
    upd = rows[3]
    assert upd.before["name"] == "b" and upd.before["amount"] is None
    assert upd.after == {"id": 2, "name": "bb", "amount": decimal.Decimal("2.25"), "at": None}
    dele = rows[4]
    assert dele.after is None and dele.before["id"] == 3
    # the PK change: delete of the old key, insert of the new one, consecutive in one event
    d, i = rows[5], rows[6]
    assert d.before["id"] == 1 and d.after is None and i.before is None and i.after["id"] == 10
    assert (d.pos.log, d.pos.offset) == (i.pos.log, i.pos.offset) and i.pos.seq == d.pos.seq + 1
    multi = rows[7:9]
    assert multi[0].pos.offset == multi[1].pos.offset and [e.pos.seq for e in multi] == [0, 1]
    # same-transaction rows share the TxnEnd that follows them
    first_end = next(it for it in items if isinstance(it, TxnEnd))
    assert all(e.pos < first_end.pos for e in rows[:3]) and rows[3].pos > first_end.pos
    marks = [it for it in items if isinstance(it, WatermarkSeen)]
    assert [m.value for m in marks] == ["lw-1", "hw-1"]
    assert rows[4].pos < marks[0].pos < rows[5].pos
    assert all(e.source_ts > 0 and abs(e.source_ts / 1000 - time.time()) < 600 for e in rows)
    assert all(e.pos > start_pos for e in rows)
    # the events build the typed changelog table
    events_to_arrow(src.table_schema(t), rows)


ALL_TYPES = """CREATE TABLE `{db}`.t (
    id INT NOT NULL, k CHAR(10) NOT NULL,
    ti TINYINT, tu TINYINT UNSIGNED, t1 TINYINT(1), su SMALLINT UNSIGNED, mi MEDIUMINT,
    iu INT UNSIGNED, bi BIGINT, bu BIGINT UNSIGNED, d DECIMAL(20,6), f FLOAT, dbl DOUBLE,
    b1 BIT(1), b9 BIT(9), c CHAR(5), tx TEXT, e ENUM('x','y'), s SET('p','q','r'),
    j JSON, bn BINARY(4), vb VARBINARY(9), bl BLOB, dte DATE, dtm DATETIME(6),
    ts TIMESTAMP(6) NULL, tm TIME(3), tm0 TIME, yr YEAR,
    PRIMARY KEY (id, k))"""

ALL_TYPES_ROWS = [
    (1, "one", -128, 255, 7, 65535, -8388608, 4294967295, -(2**63), 2**64 - 1,
     "12345678901234.123456", 123456.789, 1.0 / 3, 1, 257, "ab", "héllo wörld 😀", "y", "r,p",
     '{"a": [1, 2, {"b": null}]}', b"\x01\x02", b"\x00\xff\x00", bytes(range(256)),
     "2024-02-29", "2024-01-02 03:04:05.123456", "2024-03-31 01:30:00.5", "-12:34:56.789",
     "838:59:59", 2155),
    (2, "nulls",) + (None,) * 27,
    (3, "edge", 0, 0, 0, 0, 0, 0, 0, 0, "-0.000001", -0.0, -1e300, 0, 0, "", "", "x", "",
     "{}", b"\x00\x00\x00\x00", b"", b"", "1000-01-01", "9999-12-31 23:59:59.999999",
     "1970-01-01 00:00:01", "-00:00:00.001", "00:00:00", 1901),
]


def test_read_log_values_match_select_keys(mysql_db, make_source):
    run(ALL_TYPES.format(db=mysql_db))
    t = f"{mysql_db}.t"
    src = make_source([t])
    src.ensure_watermark_table()
    _, resume = src.current_resume()
    conn = connect()
    with conn.cursor() as cur:
        cur.executemany(f"INSERT INTO `{mysql_db}`.t VALUES ({', '.join(['%s'] * 29)})", ALL_TYPES_ROWS)
    conn.close()
    src.write_watermark("end")
    items = read_until(src, resume, until_mark("end"))
    events = [it.event for it in items if isinstance(it, RowChange)]
    assert len(events) == 3
    schema = src.table_schema(t)
    selected = rows_of(schema, src.select_keys(schema, [e.key for e in events]))
    by_key = {(r["id"], r["k"]): r for r in selected}
    for e in events:
        assert e.after == by_key[e.key], e.key
    one = by_key[(1, "one")]
    assert one["bu"] == decimal.Decimal(2**64 - 1) and one["iu"] == 4294967295
    assert one["d"] == decimal.Decimal("12345678901234.123456")
    assert one["b1"] is True and one["b9"] == 257 and one["t1"] == 7
    assert one["s"] == "p,r" and one["e"] == "y"
    assert one["j"] == '{"a": [1, 2, {"b": null}]}'
    assert one["bn"] == b"\x01\x02\x00\x00" and one["bl"] == bytes(range(256))
    assert one["dte"] == dt.date(2024, 2, 29)
    assert one["dtm"] == dt.datetime(2024, 1, 2, 3, 4, 5, 123456)
    assert one["ts"] == dt.datetime(2024, 3, 31, 1, 30, 0, 500000)
    assert one["tm"] == "-12:34:56.789" and one["tm0"] == "838:59:59" and one["yr"] == 2155
    assert all(v is None for k, v in by_key[(2, "nulls")].items() if k not in ("id", "k"))
    edge = by_key[(3, "edge")]
    assert edge["s"] == "" and edge["bn"] == b"\x00" * 4 and edge["tm"] == "-00:00:00.001"
    table = events_to_arrow(schema, events)
    assert table.num_rows == 3


def test_character_sets(mysql_db, make_source):
    charsets = ["utf8mb3", "latin1", "ucs2", "cp1251", "utf16le", "sjis", "ujis", "greek", "ascii"]
    cols = ", ".join(f"c_{cs} VARCHAR(40) CHARACTER SET {cs}" for cs in charsets)
    run(f"CREATE TABLE `{mysql_db}`.t (id INT PRIMARY KEY, {cols})")
    t = f"{mysql_db}.t"
    src = make_source([t])
    schema = src.table_schema(t)
    src.ensure_watermark_table()
    _, resume = src.current_resume()
    conn = connect()
    with conn.cursor() as cur:
        cur.execute("SET SESSION sql_mode = ''")  # characters a set lacks become '?'
        cur.execute(f"INSERT INTO `{mysql_db}`.t VALUES (1, {', '.join(['%s'] * len(charsets))})",
                    ["héllo Привет 中文 ÿ€ Ωü日本"] * len(charsets))
    conn.close()
    src.write_watermark("end")
    items = read_until(src, resume, until_mark("end"))
    [event] = [it.event for it in items if isinstance(it, RowChange)]
    assert event.after == rows_of(schema, src.select_keys(schema, [(1,)]))[0]
    assert event.after["c_ucs2"] == "héllo Привет 中文 ÿ€ Ωü日本"
    assert event.after["c_cp1251"].startswith("h?llo Привет")
    # a character set the binlog library decodes wrongly is refused up front
    run(f"CREATE TABLE `{mysql_db}`.u (id INT PRIMARY KEY, c VARCHAR(5) CHARACTER SET utf16)")
    bad = make_source([f"{mysql_db}.u"])
    with pytest.raises(SourceSetupError, match="utf16"):
        bad.table_schema(f"{mysql_db}.u")
    assert [p.table for p in bad.check()] == [f"{mysql_db}.u"]


def test_resume_mid_stream_no_loss_no_duplicates(mysql_db, make_source):
    t = f"{mysql_db}.t"
    run(f"CREATE TABLE `{mysql_db}`.t (id INT PRIMARY KEY, v INT)")
    src = make_source([t])
    src.ensure_watermark_table()
    _, resume = src.current_resume()
    conn = connect()
    with conn.cursor() as cur:
        for i in range(30):
            cur.execute(f"INSERT INTO `{mysql_db}`.t VALUES (%s, %s)", (i, i))
            if i % 3 == 0:
                cur.execute(f"UPDATE `{mysql_db}`.t SET v = v + 100 WHERE id <= %s", (i,))
    conn.close()
    src.write_watermark("end")
    full = no_idle(read_until(src, resume, until_mark("end")))
    full_rows = [it.event for it in full if isinstance(it, RowChange)]
    ends = [it for it in full if isinstance(it, TxnEnd)]
    assert len(full_rows) > 40 and len(ends) > 10
    for cut in (ends[3], ends[len(ends) // 2], ends[-2]):
        # reader 1 stops at a TxnEnd; reader 2 (another server_id) resumes from it
        first = read_until(src, resume, lambda items, c=cut: items[-1] == c)
        second = no_idle(read_until(src, cut.resume, until_mark("end")))
        assert all(i.event.pos > cut.pos for i in second if isinstance(i, RowChange))
        joined = [it.event for it in first + second if isinstance(it, RowChange)]
        assert joined == full_rows
    # the position of a TxnEnd is usable as a resume point in the other direction too
    assert all(isinstance(e.resume["pos"], int) and e.resume["file"] for e in ends)


def test_rotation(mysql_db, make_source):
    t = f"{mysql_db}.t"
    run(f"CREATE TABLE `{mysql_db}`.t (id INT PRIMARY KEY)")
    src = make_source([t])
    src.ensure_watermark_table()
    before_pos, resume = src.current_resume()
    run(f"INSERT INTO `{mysql_db}`.t VALUES (1)")
    src.write_watermark("before-rotation")
    run("FLUSH BINARY LOGS")
    run(f"INSERT INTO `{mysql_db}`.t VALUES (2)")
    run("FLUSH BINARY LOGS")
    run(f"INSERT INTO `{mysql_db}`.t VALUES (3)")
    src.write_watermark("after-rotation")
    after_pos, _ = src.current_resume()
    assert after_pos.log >= before_pos.log + 2
    items = no_idle(read_until(src, resume, until_mark("after-rotation")))
    assert_positions_ordered(items)
    rows = [it.event for it in items if isinstance(it, RowChange)]
    assert [e.key for e in rows] == [(1,), (2,), (3,)]
    assert rows[0].pos.log < rows[1].pos.log < rows[2].pos.log
    # a resume point in the old file continues into the new ones
    mark_end = items[[n for n, it in enumerate(items) if isinstance(it, WatermarkSeen)
                      and it.value == "before-rotation"][0] + 1]
    assert isinstance(mark_end, TxnEnd) and mark_end.pos.log == rows[0].pos.log
    rest = no_idle(read_until(src, mark_end.resume, until_mark("after-rotation")))
    assert [it.event.key for it in rest if isinstance(it, RowChange)] == [(2,), (3,)]
    # every TxnEnd's resume names the file its position is in
    for it in items:
        if isinstance(it, TxnEnd):
            assert int(it.resume["file"].rsplit(".", 1)[1]) == it.pos.log
            assert it.resume["pos"] == it.pos.offset


def test_idle_returns_control_and_stops_promptly(mysql_db, make_source):
    run(f"CREATE TABLE `{mysql_db}`.t (id INT PRIMARY KEY)")
    src = make_source([f"{mysql_db}.t"])
    stop = threading.Event()
    gen = src.read_log(None, stop.is_set, server_id=new_server_id())
    t0 = time.monotonic()
    idles = []
    try:
        for it in gen:
            if isinstance(it, Idle):
                idles.append(time.monotonic() - t0)
                if len(idles) == 3:
                    break
    finally:
        gen.close()
    assert idles[0] < 1.5, idles
    assert idles[2] - idles[1] < 1.5, idles
    # should_stop set from another thread while the log is idle: the reader returns soon
    stop.clear()
    gen = src.read_log(None, stop.is_set, server_id=new_server_id())
    threading.Timer(0.3, stop.set).start()
    t0 = time.monotonic()
    list(gen)
    assert time.monotonic() - t0 < 1.5


def _schema_changes(items):
    return [it for it in items if isinstance(it, SchemaChange)]


def test_alter_table_gives_a_schema_change_and_reads_on(mysql_db, make_source):
    """The reader reads the table's shape again at its ALTER TABLE and decodes the rows
    after it with that (the tail classifies and records it: engine/schema_history.py)."""
    t = f"{mysql_db}.t"
    run(f"CREATE TABLE `{mysql_db}`.t (id INT PRIMARY KEY, v INT)")
    src = make_source([t])
    src.ensure_watermark_table()
    src.table_schema(t)  # the capture's schema, taken before the ALTER
    _, resume = src.current_resume()
    run(f"INSERT INTO `{mysql_db}`.t VALUES (1, 1)")
    run(f"ALTER TABLE `{mysql_db}`.t ADD COLUMN w INT")
    run(f"INSERT INTO `{mysql_db}`.t VALUES (2, 2, 2)")
    src.write_watermark("ok")
    items = read_until(src, resume, until_mark("ok"))
    (change,) = _schema_changes(items)
    rows = [it for it in items if isinstance(it, RowChange)]
    assert [r.event.after for r in rows] == [{"id": 1, "v": 1}, {"id": 2, "v": 2, "w": 2}]
    assert change.table == t and rows[0].event.pos < change.pos < rows[1].event.pos
    assert src.table_schema(t).column_names == ["id", "v", "w"]


def test_a_type_change_and_a_key_change_are_schema_changes(mysql_db, make_source):
    t = f"{mysql_db}.t"
    run(f"CREATE TABLE `{mysql_db}`.t (id INT NOT NULL, v INT NOT NULL, PRIMARY KEY (id))")
    src = make_source([t])
    src.ensure_watermark_table()
    src.table_schema(t)
    _, resume = src.current_resume()
    run(f"ALTER TABLE `{mysql_db}`.t MODIFY v VARCHAR(10) NOT NULL")
    run(f"INSERT INTO `{mysql_db}`.t VALUES (1, 'x')")
    src.write_watermark("a")
    first = read_until(src, resume, until_mark("a"))   # read before the next ALTER
    run(f"ALTER TABLE `{mysql_db}`.t DROP PRIMARY KEY, ADD PRIMARY KEY (v)")
    run(f"INSERT INTO `{mysql_db}`.t VALUES (2, 'y')")
    src.write_watermark("b")
    second = read_until(src, [it for it in first if isinstance(it, TxnEnd)][-1].resume, until_mark("b"))
    assert len(_schema_changes(first)) == 1 and len(_schema_changes(second)) == 1
    rows = [it.event for it in first + second if isinstance(it, RowChange)]
    assert [(e.key, e.after) for e in rows] == [((1,), {"id": 1, "v": "x"}), (("y",), {"id": 2, "v": "y"})]


@pytest.mark.parametrize("kept_create", [True, False], ids=["shape-computed", "no-create-kept"])
def test_a_catalog_past_the_log_is_computed_or_breaks_only_that_table(mysql_db, make_source, kept_create):
    """Read from before two ALTERs, the catalog already has both: the shape after the first
    is computed on a scratch copy of the table as it was (shape_replay.py), and the rows
    between are read in it. Where no copy can be made (a version recorded before versions
    kept SHOW CREATE TABLE), the reader breaks the table at the first (its targets stop
    there until a re-dump), skips the rows that do not match, and reads its rows again once
    they match; another table's rows are read throughout."""
    t, o = f"{mysql_db}.t", f"{mysql_db}.o"
    run(f"CREATE TABLE `{mysql_db}`.t (id INT PRIMARY KEY, v INT)")
    run(f"CREATE TABLE `{mysql_db}`.o (id INT PRIMARY KEY)")
    src = make_source([t, o])
    src.ensure_watermark_table()
    src.table_schema(t)
    src.table_schema(o)
    if not kept_create:
        src._creates[t] = ""
    _, resume = src.current_resume()
    run(f"ALTER TABLE `{mysql_db}`.t ADD COLUMN w INT")
    run(f"INSERT INTO `{mysql_db}`.t VALUES (1, 1, 1)")
    run(f"INSERT INTO `{mysql_db}`.o VALUES (1)")
    src.write_watermark("mid")    # a dump's window between skipped rows: they break the table again
    run(f"INSERT INTO `{mysql_db}`.t VALUES (2, 2, 2)")
    run(f"ALTER TABLE `{mysql_db}`.t ADD COLUMN z INT")
    run(f"INSERT INTO `{mysql_db}`.t VALUES (3, 3, 3, 3)")
    run(f"INSERT INTO `{mysql_db}`.o VALUES (2)")
    src.write_watermark("after")
    items = read_until(src, resume, until_mark("after"))
    broken = [it for it in items if isinstance(it, TableBroken)]
    rows = [(it.event.table, it.event.key) for it in items if isinstance(it, RowChange)]
    changes = [it.pos for it in items if isinstance(it, SchemaChange)]
    if kept_create:
        assert broken == [] and len(changes) == 2
        assert rows == [(t, (1,)), (o, (1,)), (t, (2,)), (t, (3,)), (o, (2,))]
        first = next(it for it in items if isinstance(it, RowChange) and it.event.key == (1,))
        assert set(first.event.after) == {"id", "v", "w"}    # read in the shape after the first ALTER only
        return
    # broken at the first ALTER already: the catalog holds a column the statement did not add;
    # and again at the first rows skipped after a watermark (a dump that started after the
    # first break must not release the table: it may lack rows skipped after it)
    assert {b.table for b in broken} == {t} and "catalog is already past the ALTER" in broken[0].why
    assert "were skipped" in broken[-1].why and broken[-1].pos > broken[0].pos
    assert sum("were skipped" in b.why for b in broken) == 1   # once per watermark, not per rows event
    assert rows == [(o, (1,)), (t, (3,)), (o, (2,))]
    assert changes[0] == broken[0].pos


@pytest.mark.parametrize("ddl", ["TRUNCATE TABLE `{db}`.t", "DROP TABLE `{db}`.t",
                                 "RENAME TABLE `{db}`.t TO `{db}`.t_old",
                                 "CREATE OR REPLACE TABLE `{db}`.t (id INT PRIMARY KEY)"])
def test_ddl_without_row_events_breaks_the_table_and_reading_goes_on(mysql_db, make_source, ddl):
    """These statements change a captured table's rows without row events: the reader says
    so (TableBroken: its targets stop there until a re-dump; a TRUNCATE is TableTruncated,
    a step its targets follow) and reads on."""
    t = f"{mysql_db}.t"
    run(f"CREATE TABLE `{mysql_db}`.t (id INT PRIMARY KEY)")
    run(f"CREATE TABLE `{mysql_db}`.other (id INT PRIMARY KEY)")
    src = make_source([t])
    src.ensure_watermark_table()
    src.table_schema(t)
    _, resume = src.current_resume()
    run(f"INSERT INTO `{mysql_db}`.t VALUES (1)")
    run(f"TRUNCATE TABLE `{mysql_db}`.other")  # not captured: nothing to say
    run(f"DROP TABLE `{mysql_db}`.other")
    run(ddl.format(db=mysql_db))
    src.write_watermark("after")
    items = read_until(src, resume, until_mark("after"))
    (broken,) = [it for it in items if isinstance(it, (TableBroken, TableTruncated))]
    assert broken.table == t and isinstance(broken.pos, Position)
    assert isinstance(broken, TableTruncated) if ddl.startswith("TRUNCATE") else ddl.split()[0] in broken.why
    assert [it.event.key for it in items if isinstance(it, RowChange)] == [(1,)]


def test_statements_read_by_the_parser():
    """What each statement does to the captured tables (sources/mysql/ddl.py, sqlglot)."""
    from airflow_provider_dblog.engine.sources.mysql import read_statement

    def effects(q: str, tables=("x.t", "x.u", "b.c", "we`ird.t", "app.v")) -> list[tuple[str, str]]:
        return [(s.table, s.effect) for s in read_statement(q, "x", list(tables))]
    assert effects("TRUNCATE TABLE `x`.`t`") == [("x.t", "truncated")]
    assert effects("truncate t") == [("x.t", "truncated")]
    assert effects("DROP TABLE IF EXISTS `t`,`b`.`c` /* generated by server */") == [("x.t", "broken"),
                                                                                       ("b.c", "broken")]
    assert effects("RENAME TABLE t TO t_old, y.c TO b.c") == [("x.t", "broken"), ("b.c", "broken")]
    assert effects("DROP DATABASE IF EXISTS `app`") == [("app.v", "broken")]
    assert effects("DROP TABLE `we``ird`.`t`") == [("we`ird.t", "broken")]
    assert effects("ALTER TABLE t RENAME TO t2") == [("x.t", "broken")]
    assert effects("ALTER TABLE t DROP PARTITION p0") == [("x.t", "broken")]
    assert effects("ALTER TABLE t EXCHANGE PARTITION p0 WITH TABLE u") == [("x.t", "broken"), ("x.u", "broken")]
    assert effects("ALTER TABLE t DROP COLUMN a, ADD COLUMN a INT") == [("x.t", "broken")]
    assert effects("ALTER TABLE t CONVERT TO CHARACTER SET utf8mb4") == [("x.t", "broken")]   # not read: named
    for altered in ("ALTER TABLE t ADD c INT", "ALTER ONLINE TABLE t ADD c INT", "CREATE INDEX i ON t (a)",
                    "ALTER TABLE t REORGANIZE PARTITION p0 INTO (PARTITION p1 VALUES LESS THAN (9))"):
        assert effects(altered) == [("x.t", "altered")], altered
    (st,) = read_statement("ALTER TABLE t CHANGE a b INT DEFAULT 5, ADD s VARCHAR(9) DEFAULT 'it''s', "
                           "ADD d DECIMAL(5,2) DEFAULT -1.50", "x", ["x.t"])
    assert st.altered.renamed == (("a", "b"),) and st.altered.defaults == {"s": "it's", "d": Decimal("-1.50")}
    for harmless in ("CREATE TABLE t2 (a INT)", "DROP TEMPORARY TABLE IF EXISTS t", "CREATE TABLE z LIKE t",
                     "CREATE TRIGGER tr BEFORE INSERT ON t FOR EACH ROW SET NEW.a = 1", "OPTIMIZE TABLE t",
                     "GRANT SELECT ON x.t TO someone", "ALTER TABLE other ADD c INT"):
        assert effects(harmless) == [], harmless


# -- Spark JDBC ---------------------------------------------------------------------
def test_jdbc_url_and_properties(mysql_db, make_source):
    run(f"CREATE TABLE `{mysql_db}`.plain (id INT PRIMARY KEY, v TEXT)")
    run(f"CREATE TABLE `{mysql_db}`.odd (id INT PRIMARY KEY, tm TIME, f FLOAT)")
    src = make_source([f"{mysql_db}.plain", f"{mysql_db}.odd"])
    url, props = src.jdbc()
    assert url.startswith(f"jdbc:mysql://127.0.0.1:{PORT}/")
    assert props["driver"] == "org.mariadb.jdbc.Driver" and props["user"] == "root"
    assert "NO_BACKSLASH_ESCAPES" not in props["sessionVariables"]
    # every column named (an INVISIBLE one is left out of SELECT *)
    assert src.jdbc_table(f"{mysql_db}.plain") == f"(SELECT `id`, `v` FROM `{mysql_db}`.`plain`) AS `dblog_chunk`"
    odd = src.jdbc_table(f"{mysql_db}.odd")
    run(f"INSERT INTO `{mysql_db}`.odd VALUES (1, '-01:00:00', 0.1)")
    assert run(f"SELECT id, tm, f FROM {odd} WHERE id <= 1") == [(1, "-01:00:00", 0.10000000149011612)]
    explain = run(f"EXPLAIN SELECT * FROM {odd} WHERE id > 0 AND id <= 5")
    assert explain[0][3] == "range", explain  # the derived table is merged


SPARK_SCRIPT = textwrap.dedent("""
    import json, sys
    from pyspark.sql import SparkSession
    from airflow_provider_dblog.engine.config import Endpoint, SourceConfig
    from airflow_provider_dblog.engine.sources.mysql import MySQLSource
    port, table, sid = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    src = MySQLSource(SourceConfig("s", "mysql", Endpoint("127.0.0.1", port, "root", ""),
                                   (table,), server_id=sid))
    schema = src.table_schema(table)
    plan = src.plan_chunk(schema, None, src.max_key(schema), 100000, 4)
    url, props = src.jdbc()
    spark = (SparkSession.builder.master("local[2]")
             .config("spark.sql.session.timeZone", "America/New_York").getOrCreate())
    df = spark.read.jdbc(url, src.jdbc_table(schema), predicates=src.range_predicates(schema, plan),
                         properties=props)
    parts = [len(p) for p in df.rdd.glom().collect()]
    import pyarrow as pa
    from airflow_provider_dblog.engine.events import rows_of
    got = rows_of(schema, src.conform_chunk(schema, df.toArrow()))
    want = rows_of(schema, src.select_keys(schema, [(r["id"], r["k"]) for r in got]))
    key = lambda r: (r["id"], r["k"])
    same = sorted(got, key=key) == sorted(want, key=key)
    diff = [(a, b) for a, b in zip(sorted(got, key=key), sorted(want, key=key)) if a != b][:2]
    print("RESULT " + json.dumps({"rows": len(got), "parts": parts, "same": same}))
    print("DIFF", diff)
""")


@pytest.mark.skipif(not (shutil.which("java") and os.path.exists("/usr/share/java/mariadb-java-client.jar")),
                    reason="needs java and the MariaDB JDBC jar")
def test_spark_jdbc_read_matches_select_keys(mysql_db, tmp_path):
    pytest.importorskip("pyspark")
    run(ALL_TYPES.format(db=mysql_db))
    conn = connect()
    with conn.cursor() as cur:
        cur.executemany(f"INSERT INTO `{mysql_db}`.t VALUES ({', '.join(['%s'] * 29)})", ALL_TYPES_ROWS)
        cur.executemany(f"INSERT INTO `{mysql_db}`.t (id, k, c) VALUES (%s, %s, %s)",
                        [(i, k, k) for i in range(10, 20) for k in ("o'k", "b\\s", "ü")])
    conn.close()
    script = tmp_path / "spark_check.py"
    script.write_text(SPARK_SCRIPT)
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", TZ="America/New_York",
               PYSPARK_SUBMIT_ARGS="--jars /usr/share/java/mariadb-java-client.jar "
                                   "--driver-java-options -Duser.timezone=America/New_York pyspark-shell",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, str(script), str(PORT), f"{mysql_db}.t", str(new_server_id())],
                         capture_output=True, text=True, env=env, timeout=300)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert line, out.stdout[-2000:] + out.stderr[-4000:]
    import json
    result = json.loads(line[0][len("RESULT "):])
    assert result == {"rows": 33, "parts": [9, 8, 8, 8], "same": True}, out.stdout[-3000:]
