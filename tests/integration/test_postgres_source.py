"""PostgresSource against the private PostgreSQL 15 (wal_level=logical): set-up
checks, table shapes, chunk plans and their Spark predicates, key lookups, user
conditions and watermarks. The WAL reader is tested in test_postgres_log.py."""
from __future__ import annotations

import datetime as dt
import decimal
import time

import pyarrow as pa
import pytest
from psycopg2 import sql

from airflow_provider_dblog.engine.config import Endpoint, SourceConfig
from airflow_provider_dblog.engine.errors import (NoPrimaryKeyError, SourceSetupError,
                                                  UnknownTableError, WatermarkError)
from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.sources.base import ChunkPlan
from airflow_provider_dblog.engine.sources.postgres import PostgresSource, int_to_lsn, lsn_to_int, quote_ident
from airflow_provider_dblog.engine.sources.postgres.checks import role_problems, server_problems
from airflow_provider_dblog.engine.sources.postgres.column_types import to_logical
from airflow_provider_dblog.engine.sources.postgres.sql import pg_literal

from airflow_provider_dblog.engine.events import rows_of
from airflow_provider_dblog.engine.reconcile import ERROR_COLUMN
from airflow_provider_dblog.engine.values import pg_set_statements

from helpers import POSTGRES_PORT, drop_pg_database, pg_connect, unique


# -- one database per module ----------------------------------------------------
@pytest.fixture(scope="module")
def pgdb(servers):
    name = unique("pgsrc")
    admin = pg_connect()
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    admin.close()
    yield name
    drop_pg_database(name)


@pytest.fixture(scope="module")
def conn(pgdb):
    c = pg_connect(pgdb)
    yield c
    c.close()


@pytest.fixture
def schema(conn):
    """A fresh schema for one test."""
    name = unique("s")
    with conn.cursor() as cur:
        cur.execute(f'CREATE SCHEMA "{name}"')
    yield name
    with conn.cursor() as cur:
        cur.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture
def make_source(pgdb, conn):
    made = []

    def make(tables, ns=None, **kw) -> PostgresSource:
        ns = ns or unique("wm")
        cfg = SourceConfig(name="pg", kind="postgres",
                           endpoint=Endpoint("127.0.0.1", POSTGRES_PORT, "postgres", "", pgdb),
                           tables=tuple(tables), watermark_namespace=ns, **kw)
        src = PostgresSource(cfg)
        made.append(src)
        return src
    yield make
    for src in made:
        src.close()
        with conn.cursor() as cur:
            cur.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
                sql.Identifier(src.namespace)))


def run(conn, text, args=None):
    with conn.cursor() as cur:
        cur.execute(text, args)
        return cur.fetchall() if cur.description else None


# -- pure functions ---------------------------------------------------------------
def test_server_problems_decision_logic():
    assert server_problems({"wal_level": "logical", "max_replication_slots": "10",
                            "max_wal_senders": "10"}) == []
    probs = server_problems({"wal_level": "replica", "max_replication_slots": "10"})
    assert len(probs) == 1 and "wal_level is replica" in probs[0].what
    assert "wal_level = logical" in probs[0].fix and "restart" in probs[0].fix
    probs = server_problems({"wal_level": "logical", "max_replication_slots": "0",
                             "max_wal_senders": "0"})
    assert [p.what.split()[0] for p in probs] == ["max_replication_slots", "max_wal_senders"]
    assert "not logical" in server_problems({})[0].what


def test_role_problems():
    assert role_problems(True, False) == []
    assert role_problems(False, True) == []
    (p,) = role_problems(False, False)
    assert "REPLICATION" in p.what and p.fix == "ALTER ROLE <user> REPLICATION"


def test_lsn_round_trip():
    assert lsn_to_int("16/B374D848") == 0x16B374D848
    assert int_to_lsn(0x16B374D848) == "16/B374D848"
    assert lsn_to_int("0/0") == 0 and int_to_lsn(0) == "0/0"
    for v in (1, 0xFFFFFFFF, 1 << 32, (1 << 64) - 1):
        assert lsn_to_int(int_to_lsn(v)) == v
    for bad in ("", "16", "16/", "x/1", "1/2/3", "123456789/0"):
        with pytest.raises(ValueError):
            lsn_to_int(bad)
    # the order of LSNs is the order of their ints (and of Positions built from them)
    assert Position(0, lsn_to_int("1/0")) > Position(0, lsn_to_int("0/FFFFFFFF"))


def test_pg_literal_rendering():
    assert pg_literal(True) == "TRUE" and pg_literal(-5) == "-5"
    assert pg_literal(decimal.Decimal("1E-7")) == "0.0000001"
    assert pg_literal("it's") == "'it''s'"
    assert pg_literal("back\\slash") == "'back\\slash'"  # standard_conforming_strings
    assert pg_literal(dt.date(2024, 2, 29)) == "'2024-02-29'::date"
    assert pg_literal(dt.datetime(2024, 1, 2, 3, 4, 5, 6)) == "'2024-01-02 03:04:05.000006'::timestamp"
    assert (pg_literal(dt.datetime(2024, 1, 2), "timestamptz")
            == "'2024-01-02 00:00:00.000000+00'::timestamptz")
    assert pg_literal(b"\x00\xff'") == "'\\x00ff27'::bytea"
    assert pg_literal(1.5, "float4") == "'1.5'::float4"
    with pytest.raises(ValueError):
        pg_literal(dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc))
    with pytest.raises(ValueError):
        pg_literal("nul\x00")
    with pytest.raises(TypeError):
        pg_literal(object())
    assert quote_ident('we"ird') == '"we""ird"'


def test_literals_read_back_as_the_same_values(conn):
    """Every literal form, evaluated by the server, gives the value it was rendered from."""
    values = [(7, "int8"), (decimal.Decimal("-12.340"), "numeric"), ("a'b\\c\u00e9", "text"),
              (dt.date(2024, 2, 29), "date"), (dt.datetime(2024, 1, 2, 3, 4, 5, 6), "timestamp"),
              (b"\x00\x01'\\", "bytea"), (True, "bool"), (0.1, "float8")]
    for value, t in values:
        (got,), = run(conn, f"SELECT {pg_literal(value, t)}")
        got = bytes(got) if isinstance(got, memoryview) else got
        assert got == value and type(got) is type(value), (value, got)
    run(conn, "SET TIME ZONE 'America/New_York'")
    try:
        (got,), = run(conn, f"SELECT {pg_literal(dt.datetime(2024, 1, 2, 3), 'timestamptz')} "
                            "AT TIME ZONE 'UTC'")
        assert got == dt.datetime(2024, 1, 2, 3)
    finally:
        run(conn, "SET TIME ZONE 'UTC'")


# -- checks -------------------------------------------------------------------------
def test_check_reports_table_problems(conn, schema, make_source):
    run(conn, f'CREATE TABLE "{schema}".good (id int PRIMARY KEY, v text)')
    run(conn, f'ALTER TABLE "{schema}".good REPLICA IDENTITY FULL')
    run(conn, f'CREATE TABLE "{schema}".nokey (id int, v text)')
    run(conn, f'CREATE TABLE "{schema}".ident (id int PRIMARY KEY, v text)')  # DEFAULT
    run(conn, f'CREATE TABLE "{schema}".badtype (id int PRIMARY KEY, p point)')
    run(conn, f'CREATE VIEW "{schema}".v AS SELECT * FROM "{schema}".good')
    tables = [f"{schema}.{t}" for t in ("good", "nokey", "ident", "gone", "badtype", "v")]
    src = make_source(tables)
    problems = src.check()
    by_table = {}
    for p in problems:
        by_table.setdefault(p.table, []).append(p)
    assert set(by_table) == {f"{schema}.{t}" for t in ("nokey", "ident", "gone", "badtype", "v")}, problems
    assert "no primary key" in by_table[f"{schema}.nokey"][0].what
    (ident,) = by_table[f"{schema}.ident"]
    assert "REPLICA IDENTITY is DEFAULT" in ident.what
    assert ident.fix == f'ALTER TABLE "{schema}"."ident" REPLICA IDENTITY FULL'
    assert "does not exist" in by_table[f"{schema}.gone"][0].what
    assert "not supported" in by_table[f"{schema}.badtype"][0].what
    assert "view" in by_table[f"{schema}.v"][0].what
    # the server (wal_level=logical) and the user (superuser) are fine
    assert not [p for p in problems if not p.table]
    with pytest.raises(SourceSetupError, match="REPLICA IDENTITY"):
        src.check_or_raise()

    run(conn, f'ALTER TABLE "{schema}".ident REPLICA IDENTITY FULL')
    ok = make_source([f"{schema}.good", f"{schema}.ident"])
    assert ok.check() == []
    ok.check_or_raise()


def test_check_reports_role_and_watermark_problems(conn, schema, pgdb, make_source):
    run(conn, f'CREATE TABLE "{schema}".t (id int PRIMARY KEY)')
    run(conn, f'ALTER TABLE "{schema}".t REPLICA IDENTITY FULL')
    role = unique("r")
    run(conn, f'CREATE ROLE "{role}" LOGIN')
    run(conn, f'GRANT USAGE ON SCHEMA "{schema}" TO "{role}"')
    run(conn, f'GRANT SELECT ON ALL TABLES IN SCHEMA "{schema}" TO "{role}"')
    try:
        cfg = SourceConfig(name="pg", kind="postgres",
                           endpoint=Endpoint("127.0.0.1", POSTGRES_PORT, role, "", pgdb),
                           tables=(f"{schema}.t",), watermark_namespace=unique("wm"))
        src = PostgresSource(cfg)
        try:
            problems = src.check()
        finally:
            src.close()
        whats = " | ".join(p.what for p in problems)
        assert "REPLICATION attribute" in whats
        assert "cannot create or write the watermark table" in whats
        assert len(problems) == 2, problems
    finally:
        run(conn, f'DROP OWNED BY "{role}"')
        run(conn, f'DROP ROLE "{role}"')


def test_check_reports_bad_connection(servers):
    cfg = SourceConfig(name="pg", kind="postgres",
                       endpoint=Endpoint("127.0.0.1", POSTGRES_PORT, "postgres", "", unique("nodb")),
                       tables=("public.t",))
    (p,) = PostgresSource(cfg).check()
    assert "cannot connect" in p.what


# -- table shapes ---------------------------------------------------------------
def test_table_schema_types_and_composite_key(conn, schema, make_source):
    run(conn, f'CREATE DOMAIN "{schema}".posint AS int4 CHECK (VALUE > 0)')
    run(conn, f"CREATE TYPE \"{schema}\".mood AS ENUM ('sad', 'ok')")
    run(conn, f'''CREATE TABLE "{schema}".t (
        a int2, b int4 NOT NULL, c int8, d numeric(12,3), e numeric, f float4, g float8,
        h bool, i text, j varchar(10), k char(3), l json, m jsonb, n bytea, o date,
        p timestamp(6), q timestamptz, r uuid, s time, u int4[], v "{schema}".posint,
        w "{schema}".mood, x numeric(50,2),
        PRIMARY KEY (c, b))''')
    src = make_source([f"{schema}.t"])
    ts = src.table_schema(f"{schema}.t")
    assert ts.key == ("c", "b")
    assert ts.database == schema and ts.name == "t"
    assert [(c.name, c.type) for c in ts.columns] == [
        ("a", "int16"), ("b", "int32"), ("c", "int64"), ("d", "numeric(12,3)"), ("e", "numeric"),
        ("f", "float32"), ("g", "float64"), ("h", "bool"), ("i", "string"), ("j", "string"),
        ("k", "string"), ("l", "json"), ("m", "text:jsonb"), ("n", "binary"), ("o", "date"),
        ("p", "timestamp"), ("q", "timestamptz"), ("r", "text:uuid"),
        ("s", "text:time without time zone"), ("u", "text:integer[]"),
        ("v", "int32"), ("w", "string"), ("x", "numeric(50,2)")]
    assert not ts.column("b").nullable and not ts.column("c").nullable
    assert ts.column("a").nullable
    assert src.replica_identity(f"{schema}.t") == "d"


def test_table_schema_key_in_index_order_after_dropped_column(conn, schema, make_source):
    run(conn, f'CREATE TABLE "{schema}".t (gone int, x text, y int, z int, PRIMARY KEY (z, x))')
    run(conn, f'ALTER TABLE "{schema}".t DROP COLUMN gone')
    ts = make_source([f"{schema}.t"]).table_schema(f"{schema}.t")
    assert ts.column_names == ["x", "y", "z"] and ts.key == ("z", "x")


def test_table_schema_errors(conn, schema, make_source):
    run(conn, f'CREATE TABLE "{schema}".nokey (id int)')
    run(conn, f'CREATE TABLE "{schema}".other (id int PRIMARY KEY)')
    run(conn, f'CREATE VIEW "{schema}".v AS SELECT 1 AS id')
    src = make_source([f"{schema}.nokey", f"{schema}.gone", f"{schema}.v"])
    with pytest.raises(NoPrimaryKeyError):
        src.table_schema(f"{schema}.nokey")
    with pytest.raises(UnknownTableError):
        src.table_schema(f"{schema}.gone")
    with pytest.raises(UnknownTableError):
        src.table_schema(f"{schema}.v")
    with pytest.raises(UnknownTableError):  # exists, but not configured
        src.table_schema(f"{schema}.other")


# -- chunk planning ----------------------------------------------------------------
def walk_chunks(src, ts, upto, size, parts, after=None):
    plans = []
    while True:
        plan = src.plan_chunk(ts, after, upto, size, parts)
        if plan is None:
            return plans
        plans.append(plan)
        after = plan.end
        assert len(plans) < 10_000


def keys_by_predicate(conn, src, ts, pred: str) -> list[tuple]:
    """The keys a range predicate selects from the Spark table expression, in key order."""
    native = src.native_columns(ts.qualified)
    cols = ", ".join(quote_ident(k) for k in ts.key)
    order = ", ".join(quote_ident(k) for k in src._predicate_columns(ts))
    rows = run(conn, f"SELECT {cols} FROM {src.jdbc_table(ts)} WHERE {pred} ORDER BY {order}")
    return [tuple(to_logical(native[k], v) for k, v in zip(ts.key, r)) for r in rows]


def check_plans_cover(conn, src, ts, plans, expected_keys, size, parts, after=None):
    seen = []
    prev_end = after
    for plan in plans:
        assert isinstance(plan, ChunkPlan)
        assert plan.after == prev_end and plan.bounds[0] == prev_end
        assert plan.bounds[-1] == plan.end
        assert 1 <= plan.rows <= size
        preds = src.range_predicates(ts, plan)
        assert len(preds) == len(plan.bounds) - 1 <= parts
        counts, chunk = [], []
        for pred in preds:
            got = keys_by_predicate(conn, src, ts, pred)
            counts.append(len(got))
            chunk += got
        assert len(chunk) == plan.rows
        assert chunk[-1] == plan.end
        assert max(counts) - min(counts) <= 1, counts  # near-equal partitions
        seen += chunk
        prev_end = plan.end
    assert seen == expected_keys  # every key once, in order, none past upto


def test_plan_chunk_int_key(conn, schema, make_source):
    run(conn, f'CREATE TABLE "{schema}".t (id bigint PRIMARY KEY, v int)')
    ids = [i for i in range(1, 1200) if i % 7 and i % 11]
    run(conn, f'INSERT INTO "{schema}".t SELECT x, x FROM unnest(%s::bigint[]) AS x', (ids,))
    src = make_source([f"{schema}.t"])
    ts = src.table_schema(f"{schema}.t")
    top = src.max_key(ts)
    assert top == (max(ids),)
    for size, parts in [(100, 4), (37, 3), (1, 1), (5000, 8), (10, 16)]:
        plans = walk_chunks(src, ts, top, size, parts)
        assert len(plans) == -(-len(ids) // size)
        check_plans_cover(conn, src, ts, plans, [(i,) for i in ids], size, parts)
    # upto cuts the walk; after resumes it
    upto = (500,)
    plans = walk_chunks(src, ts, upto, 50, 3, after=(100,))
    check_plans_cover(conn, src, ts, plans, [(i,) for i in ids if 100 < i <= 500], 50, 3, (100,))
    assert src.plan_chunk(ts, top, top, 10, 2) is None


def test_plan_chunk_composite_int_text_key(conn, schema, make_source):
    run(conn, f'CREATE TABLE "{schema}".t (a int, b text COLLATE "C", v int, PRIMARY KEY (a, b))')
    names = ["", "a", "a'b", "b", "it's", "z\\", "\u00e9", "Zed"]
    keys = sorted((a, b) for a in range(0, 40) for b in names if (a + len(b)) % 5)
    run(conn, f'INSERT INTO "{schema}".t SELECT a, b, 0 FROM unnest(%s::int[], %s::text[]) AS u(a, b)',
        ([k[0] for k in keys], [k[1] for k in keys]))
    src = make_source([f"{schema}.t"])
    ts = src.table_schema(f"{schema}.t")
    top = src.max_key(ts)
    assert top == keys[-1]
    for size, parts in [(25, 4), (7, 3), (1000, 5)]:
        plans = walk_chunks(src, ts, top, size, parts)
        check_plans_cover(conn, src, ts, plans, keys, size, parts)
    plans = walk_chunks(src, ts, keys[-20], 9, 2, after=keys[5])
    check_plans_cover(conn, src, ts, plans, keys[6:-19], 9, 2, keys[5])
    # the bounded select is an index range scan on the primary key (row comparison)
    # (the table is small: forbid the sequential scan to see that an index one is possible)
    pred = src.range_predicates(ts, plans[1])[-1]
    run(conn, "SET enable_seqscan = off")
    try:
        plan_text = "\n".join(r[0] for r in run(
            conn, f"EXPLAIN SELECT * FROM {src.jdbc_table(ts)} WHERE {pred}"))
    finally:
        run(conn, "SET enable_seqscan = on")
    assert "Index Cond: ((ROW(a, b) >" in plan_text, plan_text


def test_plan_chunk_typed_keys(conn, schema, make_source):
    """Keys of types whose literals are typed: uuid (a string read through ::text),
    timestamptz, date, bytea, numeric."""
    run(conn, f'''CREATE TABLE "{schema}".t (u uuid, ts timestamptz, d date, b bytea,
                  n numeric(10,2), v int, PRIMARY KEY (u, ts, d, b, n))''')
    run(conn, f'''INSERT INTO "{schema}".t
        SELECT md5((x % 3)::text)::uuid, timestamptz '2024-01-01 00:00+05' + (x % 4) * interval '1 h',
               date '2024-01-01' + (x % 2), decode(lpad(to_hex(x % 5), 2, '0'), 'hex'),
               (x / 7.0)::numeric(10,2), x
        FROM generate_series(1, 200) AS x ON CONFLICT DO NOTHING''')
    src = make_source([f"{schema}.t"])
    ts = src.table_schema(f"{schema}.t")
    native = src.native_columns(ts.qualified)
    run(conn, "SET TIME ZONE 'UTC'")
    keys = [tuple(to_logical(native[k], v) for k, v in zip(ts.key, r)) for r in run(
        conn, f'SELECT u::text, ts::text, d::text, b, n::text FROM "{schema}".t AS t '
              'ORDER BY t.u, t.ts, t.d, t.b, t.n')]
    assert len(keys) > 50
    assert isinstance(keys[0][1], dt.datetime) and keys[0][1].tzinfo is None
    top = src.max_key(ts)
    assert top == keys[-1]
    plans = walk_chunks(src, ts, top, 17, 3)
    check_plans_cover(conn, src, ts, plans, keys, 17, 3)
    assert "__dblog_key_u" in src.jdbc_table(ts) and "__dblog_key_ts" in src.jdbc_table(ts)


def test_plan_chunk_empty_table(conn, schema, make_source):
    run(conn, f'CREATE TABLE "{schema}".t (id int PRIMARY KEY)')
    src = make_source([f"{schema}.t"])
    ts = src.table_schema(f"{schema}.t")
    assert src.max_key(ts) is None
    assert src.plan_chunk(ts, None, (100,), 10, 2) is None
    with pytest.raises(ValueError):
        src.plan_chunk(ts, None, (100,), 0, 2)


# -- key lookups -------------------------------------------------------------------
def test_select_keys_existing_and_missing(conn, schema, make_source):
    run(conn, f'''CREATE TABLE "{schema}".t (
        id int, name text, price numeric(10,2), f4 float4, at timestamp(6), atz timestamptz,
        d date, raw bytea, doc jsonb, js json, u uuid, tm time, arr int4[], big numeric,
        ok bool, PRIMARY KEY (id, name))''')
    run(conn, "SET TIME ZONE 'America/New_York'")  # the writer's zone does not matter
    try:
        run(conn, f'''INSERT INTO "{schema}".t VALUES
            (1, 'a', 12.50, 1.1, '2024-01-02 03:04:05.123456', '2024-06-01 12:00:00.5-04',
             '2024-02-29', '\\x00ff', '{{"b": 1, "a": [1, 2]}}', '{{"b" : 1}}',
             'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '13:14:15.5', '{{1,NULL,3}}', 0.0000001, true),
            (2, 'it''s', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)''')
    finally:
        run(conn, "SET TIME ZONE 'UTC'")
    src = make_source([f"{schema}.t"])
    ts = src.table_schema(f"{schema}.t")
    got = src.select_keys(ts, [(1, "a"), (2, "it's"), (3, "a"), (1, "b"), (1, "a")])
    assert got.schema == pa.schema(list(ts.row_struct()) + [pa.field(ERROR_COLUMN, pa.string())])
    assert got[ERROR_COLUMN].null_count == got.num_rows      # every value carried
    rows = sorted(rows_of(ts, got), key=lambda r: r["id"])
    assert len(rows) == 2
    r = rows[0]
    assert r["price"] == "12.50"                  # numeric: PostgreSQL's own text, typed numeric
    assert got.schema.field("price").type == pa.string() and ts.column("price").type == "numeric(10,2)"
    assert r["f4"] == pytest.approx(1.1, rel=1e-6)
    assert r["at"] == dt.datetime(2024, 1, 2, 3, 4, 5, 123456) and r["at"].tzinfo is None
    assert got.schema.field("at").type == pa.timestamp("us")
    assert r["atz"] == dt.datetime(2024, 6, 1, 16, 0, 0, 500000)  # UTC, naive
    assert r["d"] == dt.date(2024, 2, 29)
    assert r["raw"] == b"\x00\xff"
    assert r["doc"] == '{"a": [1, 2], "b": 1}'  # jsonb's own text
    assert r["js"] == '{"b" : 1}'                # json kept verbatim
    assert r["u"] == "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
    assert r["tm"] == "13:14:15.5"
    assert r["arr"] == "{1,NULL,3}"
    assert r["big"] == "0.0000001"
    assert r["ok"] is True
    assert rows[1]["name"] == "it's" and all(v is None for k, v in rows[1].items()
                                             if k not in ("id", "name"))
    empty = src.select_keys(ts, [])
    assert empty.num_rows == 0 and empty.schema == got.schema


def test_select_keys_many_and_timestamptz_key(conn, schema, make_source):
    run(conn, f'CREATE TABLE "{schema}".t (at timestamptz PRIMARY KEY, v int)')
    run(conn, f"INSERT INTO \"{schema}\".t SELECT timestamptz '2024-01-01 00:00+00' + x * interval '1 s', x "
              "FROM generate_series(0, 1199) AS x")
    src = make_source([f"{schema}.t"])
    ts = src.table_schema(f"{schema}.t")
    base = dt.datetime(2024, 1, 1)
    keys = [(base + dt.timedelta(seconds=i),) for i in range(0, 1300, 1)]
    got = src.select_keys(ts, keys)
    assert sorted(got.column("v").to_pylist()) == list(range(1200))


def test_keys_where_binds_values(conn, schema, make_source):
    run(conn, f'CREATE TABLE "{schema}".t (id int PRIMARY KEY, note text, total numeric(8,2))')
    run(conn, f'''INSERT INTO "{schema}".t VALUES (1, 'plain', 5), (2, 'it''s', 50),
                  (3, 'x'' OR ''1''=''1', 500), (4, NULL, 5000)''')
    src = make_source([f"{schema}.t"])
    ts = src.table_schema(f"{schema}.t")
    assert src.keys_where(ts, "note = 'it''s'", 10) == [(2,)]
    assert src.keys_where(ts, "note = 'x'' OR ''1''=''1'", 10) == [(3,)]  # data, not SQL
    assert src.keys_where(ts, "note = 'nope'' OR 1=1 --'", 10) == []
    assert src.keys_where(ts, "total >= 50 AND note IS NOT NULL", 10) == [(2,), (3,)]
    assert src.keys_where(ts, "id IN (4, 1, 3) OR note LIKE 'pl%'", 10) == [(1,), (3,), (4,)]
    assert src.keys_where(ts, "id > 0", 1) == [(1,), (2,)]  # limit + 1
    from airflow_provider_dblog.engine.conditions import ConditionError
    with pytest.raises(ConditionError):
        src.keys_where(ts, "id = 1; DROP TABLE t", 10)
    assert run(conn, f'SELECT count(*) FROM "{schema}".t')[0][0] == 4


# -- watermarks --------------------------------------------------------------------
def test_watermark_table_and_single_row_updates(conn, make_source):
    ns = unique("wm")
    src = make_source([], ns=ns)
    src.ensure_watermark_table()
    src.ensure_watermark_table()  # idempotent
    wm = f'"{ns}"."watermark"'
    assert run(conn, f"SELECT id, value FROM {wm}") == [(1, "")]
    (ident,), = run(conn, "SELECT c.relreplident FROM pg_class c JOIN pg_namespace n "
                          "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = 'watermark'",
                    (ns,))
    assert ident == "f"
    cols = run(conn, "SELECT column_name, data_type FROM information_schema.columns "
                     "WHERE table_schema = %s AND table_name = 'watermark' ORDER BY ordinal_position",
               (ns,))
    assert cols == [("id", "smallint"), ("value", "text"),
                    ("updated_at", "timestamp with time zone")]

    def updates() -> int:
        run(conn, "SELECT pg_stat_clear_snapshot()")
        (n,), = run(conn, "SELECT n_tup_upd FROM pg_stat_user_tables WHERE schemaname = %s "
                          "AND relname = 'watermark'", (ns,))
        return n

    def wait_updates(n: int) -> int:
        # (PostgreSQL 15 flushes a backend's table counters lazily: ask the writer's
        # session to flush now; this SELECT updates nothing)
        with src._wm_conn.cursor() as cur:
            cur.execute("SELECT pg_stat_force_next_flush()")
        deadline = time.monotonic() + 10
        while updates() < n and time.monotonic() < deadline:
            time.sleep(0.05)
        return updates()

    before = updates()
    for i in range(1, 6):
        value = f"00000000-0000-0000-0000-00000000000{i}"
        src.write_watermark(value)
        assert wait_updates(before + i) == before + i  # exactly one row updated per write
        assert run(conn, f"SELECT id, value FROM {wm}") == [(1, value)]
    (at,), = run(conn, f"SELECT updated_at FROM {wm}")
    assert at is not None
    with pytest.raises(ValueError):
        src.write_watermark("")
    with pytest.raises(ValueError):
        src.write_watermark("x" * 37)
    run(conn, f"DELETE FROM {wm}")
    with pytest.raises(WatermarkError):
        src.write_watermark("00000000-0000-0000-0000-000000000009")


# -- JDBC, positions, the log -------------------------------------------------------
def test_jdbc_url_and_properties(conn, schema, make_source, pgdb):
    run(conn, f'CREATE TABLE "{schema}".plain (id int PRIMARY KEY, v text)')
    run(conn, f'CREATE TABLE "{schema}".mixed (id uuid PRIMARY KEY, at timestamptz, doc jsonb)')
    src = make_source([f"{schema}.plain", f"{schema}.mixed"])
    url, props = src.jdbc()
    assert url == f"jdbc:postgresql://127.0.0.1:{POSTGRES_PORT}/{pgdb}"
    assert props["driver"] == "org.postgresql.Driver"
    assert props["user"] == "postgres" and props["password"] == ""
    assert props["sessionInitStatement"].startswith(
        "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED; ")
    assert pg_set_statements() in props["sessionInitStatement"]   # one text form on every path
    assert props["preferTimestampNTZ"] == "true" and int(props["fetchsize"]) > 0
    # ONLY: never the rows of a table inheriting from it (the log does not carry them)
    assert src.jdbc_table(f"{schema}.plain") == f'(SELECT "id", "v" FROM ONLY "{schema}"."plain") AS "dblog_chunk"'
    mixed = src.jdbc_table(f"{schema}.mixed")
    # the derived table is valid SQL and gives the logical forms
    run(conn, f"INSERT INTO \"{schema}\".mixed VALUES ('a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', "
              "'2024-01-01 00:00+02', '{\"a\": 1}')")
    rows = run(conn, f"SELECT id, at, doc FROM {mixed}")
    # text forms (read in the session's UTC): parsed by values.py on every path
    assert rows == [("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "2023-12-31 22:00:00+00", '{"a": 1}')]


def test_current_resume(conn, make_source):
    src = make_source([])
    pos, resume = src.current_resume()
    assert pos.log == 0 and pos.seq == 0 and pos.offset == lsn_to_int(resume["lsn"])
    run(conn, "CREATE TEMP TABLE tmp_wal AS SELECT generate_series(1, 1000) AS x")
    later, _ = src.current_resume()
    assert later > pos


def test_odd_column_names(conn, schema, make_source):
    """Quotes, % and braces in column names stay identifiers (statements run with parameters)."""
    col = 'we"ird%s{x}'
    q = quote_ident(col)
    run(conn, f'CREATE TABLE "{schema}".t ({q} int PRIMARY KEY, "100%" text)')
    run(conn, f'INSERT INTO "{schema}".t SELECT x, x::text FROM generate_series(1, 30) AS x')
    src = make_source([f"{schema}.t"])
    ts = src.table_schema(f"{schema}.t")
    assert ts.key == (col,)
    plans = walk_chunks(src, ts, src.max_key(ts), 7, 2)
    check_plans_cover(conn, src, ts, plans, [(i,) for i in range(1, 31)], 7, 2)
    assert rows_of(ts, src.select_keys(ts, [(3,), (99,)])) == [{col: 3, "100%": "3"}]
