"""The verification's read of a PostgreSQL target through ADBC (pg_read.read_at: binary COPY into
Arrow in a transaction importing the snapshot the applied position was read in) against psycopg2's
per-value read (read_list / from_row / verify_rows.rows_to_batches, the read it replaced), and the
comparison's integer-key path (verify_compare._match) against the key-string path. Break round 4.

Held: every logical type the target maps, with edge values (NULL, '', NaN/Infinity/-0, numeric NaN,
BC dates, infinity and year > 9999 timestamps, astral text, quotes, backslashes, newlines, json,
arrays, intervals, a smallint of logical int8 holding 300), in a database whose own settings are
hostile (DateStyle, IntervalStyle, TimeZone, extra_float_digits, bytea_output); odd identifiers;
a password and a database name with ' \\ @ : space; > 50,000 rows with values the type cannot hold
near the batch boundaries; the snapshot; integer keys (extremes, tinyint, damaged NULL keys,
duplicates, key-list scopes, moved keys) report as key strings do.
Found, fixed: a target column whose type is not the one dblog made read otherwise than before:
a decimal column ALTERed to text holding a non-number stopped the whole verification
(decimal.InvalidOperation, every table), and money / oid columns of an integer logical type read
as wrong integers (cents; oid wrapped) where psycopg2's read marked them as values the type
cannot hold. Such a table is now read value by value (pg_read._as_made).
"""
from __future__ import annotations

import contextlib
from unittest import mock

import numpy as np
import psycopg2.extensions
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from psycopg2 import sql

from airflow_provider_dblog.engine import verify_compare
from airflow_provider_dblog.engine.config import Endpoint, TargetConfig
from airflow_provider_dblog.engine.events import DELETE, INSERT, SNAPSHOT, UPDATE, Event, events_to_arrow
from airflow_provider_dblog.engine.logical_types import postgres_type
from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.schema import Column, TableSchema
from airflow_provider_dblog.engine.targets.pg_tables import POS_COLUMN, from_row, json_as_text, read_list, target_table_name
from airflow_provider_dblog.engine.targets.postgres import PostgresTarget
from airflow_provider_dblog.engine.verify_compare import compare_table, key_strings, last_changes
from airflow_provider_dblog.engine.verify_rows import rows_to_batches

from helpers import POSTGRES_PORT, drop_pg_database, pg_connect, unique

HOSTILE = {"DateStyle": "SQL, DMY", "IntervalStyle": "sql_standard", "TimeZone": "Asia/Kathmandu",
           "extra_float_digits": "-3", "bytea_output": "escape"}
POS = "00000001-0000000000000001-00000000"
N = "NULL"
MATRIX = {
    "bool": ["true", "false"], "int8": ["-128", "127", "300", "-32768"], "int16": ["32767", "-32768"],
    "int32": ["2147483647", "-2147483648"], "int64": ["9223372036854775807", "-9223372036854775808"],
    "float32": ["'NaN'", "'Infinity'", "'-Infinity'", "'-0'", "0.1", "3.4028235e38", "1e-45", "0.3333333"],
    "float64": ["'NaN'", "'-Infinity'", "'-0'", "0.1+0.2", "1.7976931348623157e308", "5e-324"],
    "string": ["''", "'a''b'", r"E'b\\s\n\t\r'", "'𝄞😀 ñ 中'", "repeat('x', 70000)"],
    "json": ["'{}'", "'{\"a\": \"𝄞\", \"b\": [1, 2.50, 1e400]}'", "'  [ 1 , 2 ]  '"],
    "binary": ["''::bytea", r"'\x00ff5c27'::bytea"],
    "date": ["'4713-01-01 BC'", "'0001-01-01 BC'", "'10000-01-01'", "'5874897-12-31'", "'infinity'", "'-infinity'"],
    "timestamp": ["'4713-01-01 00:00:00 BC'", "'294246-12-31 23:59:59.999999'", "'infinity'", "'1969-12-31 23:59:59.999999'"],
    "timestamptz": ["'2024-01-01 12:34:56.789012+05:45'", "'10000-01-01 00:00:00+00'", "'-infinity'", "'0001-01-01 00:00:00+00'"],
    "decimal(10,2)": ["-0", "12345678.99", "-0.01", "'NaN'"],
    "decimal(38,10)": ["9999999999999999999999999999.9999999999", "'NaN'"],
    "decimal(3,3)": ["-0.999"], "numeric": ["'NaN'", "'-Infinity'", "-0.000", "1e-300", "123.4500"],
    "numeric(20,5)": ["'NaN'", "-0"], "text:inet": ["'192.168.0.1/32'", "'::ffff:1.2.3.4'"],
    "text:jsonb": ["'{\"b\":1,\"a\":[1.50]}'"],
    "text:interval": ["'1 year 2 mons -3 days 04:05:06.789'", "'-178000000 years'"], "text:interval(3)": ["'1.23456 seconds'"],
    "text:time with time zone": ["'24:00:00-15:59'"], "text:real": ["'-0'", "3.4028235e38"], "text:numeric": ["'Infinity'"],
    "text:character(3)": ["'a'"], "text:timestamp": ["'infinity'"], "text:bit varying": ["B''"],
    "text:integer[]": ["'[0:1]={1,2}'"], "text:text[]": [r"""ARRAY['a"b', 'c,d', NULL, '', 'NULL', E'x\\y']"""],
}


def pos(i: int) -> Position:
    return Position(1, 1000 + i, 0)


@pytest.fixture(scope="module")
def db():
    name = unique("brk4")
    admin = pg_connect()
    with admin.cursor() as cur:
        cur.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        for k, v in HOSTILE.items():
            cur.execute(sql.SQL("ALTER DATABASE {} SET {} = %s").format(sql.Identifier(name), sql.Identifier(k)), (v,))
    admin.close()
    yield name
    drop_pg_database(name)


def _target(database: str, schema: str = "public", password: str = "") -> PostgresTarget:
    return PostgresTarget(TargetConfig("tgt", "postgres", Endpoint("127.0.0.1", POSTGRES_PORT, "postgres", password, database),
                                       "src", schema))


def _make(database: str, t: TableSchema, pg_types: list[str], rows, schema: str = "public") -> None:
    conn = pg_connect(database)
    try:
        with conn.cursor() as cur:
            tid = sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(target_table_name(t)))
            cur.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
            cur.execute(sql.SQL("CREATE TABLE {} ({}, _dblog_pos text)").format(tid, sql.SQL(", ").join(
                sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(p)) for c, p in zip(t.columns, pg_types))))
            if isinstance(rows, str):
                cur.execute(sql.SQL("INSERT INTO {} ").format(tid) + sql.SQL(rows))
            else:
                cur.execute(sql.SQL("INSERT INTO {} VALUES ").format(tid) + sql.SQL(", ").join(
                    sql.SQL("(" + ", ".join(r) + f", '{POS}')") for r in rows))
    finally:
        conn.close()


def _reference(tgt: PostgresTarget, t: TableSchema) -> pa.Table:
    """psycopg2's per-value read (the read ADBC replaced): read_list / from_row / rows_to_batches."""
    conn = tgt._connect(tgt.database)
    try:
        json_as_text(conn)
        with conn.cursor() as cur:
            cur.execute(sql.SQL("SELECT {}, {} FROM {}").format(read_list(t, t.column_names), sql.Identifier(POS_COLUMN),
                                                              tgt._tid(target_table_name(t))))
            rows = [from_row(t, t.column_names, r[:-1]) + (r[-1],) for r in cur.fetchall()]
    finally:
        conn.close()
    return pa.concat_tables(list(rows_to_batches(t, rows))).sort_by(t.key[0])


def _read(tgt: PostgresTarget, t: TableSchema) -> pa.Table:
    _, batches = tgt.read_at(t, "src")
    return pa.concat_tables(list(batches)).sort_by(t.key[0])


def _same(got: pa.Table, want: pa.Table) -> list:
    """The columns that differ (floats: NaN equals NaN whatever its sign bit, else by bits)."""
    assert got.num_rows == want.num_rows, (got.num_rows, want.num_rows)
    out = []
    for i, name in enumerate(want.column_names):
        a, b = got.column(i).combine_chunks(), want.column(i).combine_chunks()
        if pa.types.is_floating(a.type) and a.type == b.type and a.is_null().equals(b.is_null()):
            x, y = a.fill_null(0).to_numpy(), b.fill_null(0).to_numpy()
            if ((x.view(f"u{x.itemsize}") == y.view(f"u{y.itemsize}")) | (np.isnan(x) & np.isnan(y))).all():
                continue
        if not a.equals(b):
            out.append((name, a.to_pylist()[:6], b.to_pylist()[:6]))
    return out


def test_every_type_reads_as_psycopg2_reads_it_in_a_hostile_database(db):
    types = list(MATRIX)
    t = TableSchema("brk", "matrix", (Column("id", "int32", False),)
                    + tuple(Column(f"c{i}", lt) for i, lt in enumerate(types)), ("id",))
    width = max(len(v) for v in MATRIX.values()) + 1   # (one row of NULLs in every column)
    rows = [[str(r)] + [(MATRIX[lt] + [N] * width)[r] for lt in types] for r in range(width)]
    _make(db, t, ["integer"] + [postgres_type(lt) for lt in types], rows)
    tgt = _target(db)
    got, want = _read(tgt, t), _reference(tgt, t)
    # values the types cannot hold: int8's 300 and -32768 (column 2), decimal NaN (columns 14, 15)
    assert want.column("_dblog_bad").drop_null().to_pylist() == ["15", "2", "2,14"]
    assert _same(got, want) == []


def test_odd_identifiers_a_password_and_a_database_name_with_quotes(db):
    names = ["id", 'Q"q', "a b", "ü𝄞", "%s", "$1", "?", "x'y", "UPPER", "back\\slash", "select"]
    types = ["int32", "string", "int64", "timestamp", "decimal(10,2)", "float64", "date", "binary", "text:interval",
             "numeric", "json"]
    t = TableSchema('Brk"X', "a b'c ü𝄞 $1 %s ?", tuple(Column(n, ty, n != "id") for n, ty in zip(names, types)), ("id",))
    schema = 'Odd "Sch" é\\'
    _make(db, t, [postgres_type(ty) for ty in types], [
        ["1", "'x'", "2", "'2020-01-01'", "1.5", "0.5", "'2020-01-01'", r"'\x01'::bytea", "'1 day'", "'NaN'", "'{}'"],
        ["2"] + [N] * 10], schema=schema)
    password = "p'a\\ss @:w\"ord\\'=x #é"
    tgt = _target(db, schema, password)
    import adbc_driver_postgresql.dbapi as adbc
    seen, real = [], adbc.connect
    with mock.patch.object(adbc, "connect", lambda uri, **kw: seen.append(uri) or real(uri, **kw)):
        got = _read(tgt, t)
    assert _same(got, _reference(tgt, t)) == [] and got.num_rows == 2
    parsed = psycopg2.extensions.parse_dsn(seen[-1])   # (libpq's own parser: trust auth would not check it)
    assert (parsed["password"], parsed["dbname"], parsed["user"]) == (password, db, "postgres")


def test_past_the_batch_size_with_values_the_type_cannot_hold_at_the_boundaries(db):
    t = TableSchema("brk", "big", (Column("id", "int64", False), Column("n", "int8"), Column("d", "decimal(6,2)"),
                                   Column("ts", "timestamp"), Column("s", "string"), Column("f", "float32")), ("id",))
    _make(db, t, ["bigint", "smallint", "numeric(6,2)", "timestamp(6)", "text", "real"], f"""
        SELECT s, CASE WHEN s IN (49999, 50000, 50001, 60000) THEN 300 WHEN s % 7 = 0 THEN NULL ELSE s % 100 END,
               CASE WHEN s IN (50000, 50001) THEN 'NaN'::numeric WHEN s % 5 = 0 THEN NULL ELSE (s % 9999) / 100.0 END,
               CASE WHEN s = 50000 THEN 'infinity' WHEN s % 3 = 0 THEN NULL
                    ELSE timestamp '2024-01-01' + s * interval '1.5 s' END,
               CASE WHEN s % 11 = 0 THEN '' ELSE 'r' || s || '𝄞' END, (s / 7.0)::real, '{POS}'
        FROM generate_series(1, 60001) s""")
    tgt = _target(db)
    got = _read(tgt, t)
    assert got.num_rows == 60001 and got.column("_dblog_bad").drop_null().to_pylist() == ["1", "1,2", "1,2", "1"]
    assert _same(got, _reference(tgt, t)) == []


def test_the_rows_are_those_of_the_position_read(db):
    t = TableSchema("brk", "snap", (Column("id", "int32", False), Column("v", "string")), ("id",))
    _make(db, t, ["integer", "text"], [[str(i), "'a'"] for i in range(5)])
    conn = pg_connect(db)
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE dblog_apply_state (source text, table_name text, pos text, "
                        "PRIMARY KEY (source, table_name))")
            cur.execute("INSERT INTO dblog_apply_state VALUES ('src', 'brk.snap', %s)", (pos(5).encode(),))
            at, batches = _target(db).read_at(t, "src")
            cur.execute("INSERT INTO brk__snap VALUES (99, 'new', 'p'); UPDATE brk__snap SET v = 'b' WHERE id = 0; "
                        "DELETE FROM brk__snap WHERE id = 1; UPDATE dblog_apply_state SET pos = %s", (pos(9).encode(),))
            got = pa.concat_tables(list(batches)).sort_by("id")
    finally:
        conn.close()
    assert at == pos(5) and got.select(["id", "v"]).to_pylist() == [{"id": i, "v": "a"} for i in range(5)]


def test_a_decimal_column_holding_text_is_a_row_that_differs_not_a_crash(db):
    t = TableSchema("brk", "dectext", (Column("id", "int32", False), Column("v", "decimal(10,2)")), ("id",))
    _make(db, t, ["integer", "text"], [["1", "'1.50'"], ["2", "'abc'"], ["3", "'$1.00'"], ["4", N]])
    tgt = _target(db)
    want = _reference(tgt, t)
    assert want.column("_dblog_bad").to_pylist() == ["1", "1", "1", None]   # (text in a decimal column: not its type)
    assert _same(_read(tgt, t), want) == []


# a column retyped by hand (not the type dblog makes): read value by value, as psycopg2 reads it (ADBC's binary
# forms of these are not the logical type's: money in cents, an oid past 2**31 wrapped, a real widened)
@pytest.mark.parametrize("logical, pg_type, value", [
    ("int32", "money", "12.34"), ("int32", "oid", "4000000000"), ("float64", "money", "1.5"),
    ("float64", "real", "0.1"), ("float32", "double precision", "1e300"), ("float32", "numeric", "0.1"),
    ("int64", "numeric", "5"), ("decimal(10,2)", "double precision", "0.1"), ("binary", "uuid", "gen_random_uuid()"),
    ("bool", "integer", "1")])
def test_a_column_of_another_type_reads_as_psycopg2_reads_it(db, logical, pg_type, value):
    name = f"other_{pg_type}_{logical}".replace(" ", "_").replace("(", "_").replace(",", "_").replace(")", "")
    t = TableSchema("brk", name, (Column("id", "int32", False), Column("v", logical)), ("id",))
    _make(db, t, ["integer", pg_type], [["1", value], ["2", N]])
    tgt = _target(db)
    got = _read(tgt, t)
    if (logical, pg_type) == ("float32", "double precision"):   # 1e300: no float32 (psycopg2's read stopped here)
        assert got.column("_dblog_bad").to_pylist() == ["1", None]
        return
    assert _same(got, _reference(tgt, t)) == []


# -- the comparison: one integer key matched as int64, as key strings match it --------------------------------
RANGES = {"int8": (-128, 127), "int16": (-2**15, 2**15 - 1), "int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1)}


@st.composite
def _cases(draw):
    kt = draw(st.sampled_from(list(RANGES)))
    lo, hi = RANGES[kt]
    t = TableSchema("app", "t", (Column("id", kt, False), Column("v", "int16")), ("id",))
    kv = st.one_of(st.sampled_from([lo, hi, lo + 1, hi - 1, -1, 0, 1]), st.integers(lo, hi))
    src = sorted(draw(st.sets(kv, max_size=8)))
    n = draw(st.integers(1, 3))
    chunks = [(pos(10 * i + 10), pos(10 * i + 12), events_to_arrow(t, [
        Event("app.t", SNAPSHOT, (k,), None, {"id": k, "v": draw(st.integers(0, 3))}, pos(10 * i + 11)) for k in src[i::n]]))
        for i in range(n)]
    gone = draw(st.sets(kv, max_size=3)) - set(src)
    if gone:
        chunks.append((pos(50), pos(52), events_to_arrow(t, [Event("app.t", DELETE, (k,), {"id": k}, None, pos(51))
                                                             for k in gone])))
    bad = st.sampled_from([None, hi + 1, lo - 1, 2**20]) if kt != "int64" else st.none()   # (a damaged key: NULL)
    tk = st.one_of(st.sampled_from(src + sorted(gone)) if src or gone else kv, kv, bad)
    rows = draw(st.lists(st.tuples(tk, st.one_of(st.none(), st.integers(0, 3), st.just(2**20)), st.integers(0, 120)), max_size=12))
    changes = []
    for _ in range(draw(st.integers(0, 5))):
        k, k2, p = draw(kv), draw(kv), pos(draw(st.integers(0, 120)))
        changes.append(draw(st.sampled_from([
            Event("app.t", INSERT, (k,), None, {"id": k, "v": 0}, p),
            Event("app.t", UPDATE, (k,), {"id": k}, {"id": k, "v": 1}, p),
            Event("app.t", UPDATE, (k2,), {"id": k}, {"id": k2, "v": 1}, p), Event("app.t", DELETE, (k,), {"id": k}, None, p)])))
    scope = set(key_strings(t, [(k,) for k in draw(st.sets(kv, max_size=4)) | set(src[:draw(st.integers(0, 3))])])) \
        if draw(st.booleans()) else None
    return t, chunks, rows, changes, scope


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=_cases())
def test_integer_keys_report_as_key_strings_do(case):
    t, chunks, rows, changes, scope = case

    def report(by_strings: bool) -> dict:
        with mock.patch.object(verify_compare, "_int_key", lambda table: False) if by_strings else contextlib.nullcontext():
            r = compare_table(t, "tgt", chunks, rows_to_batches(t, [(k, v, pos(p).encode()) for k, v, p in rows]), pos(100),
                              last_changes(t, events_to_arrow(t, changes)), pos(8), scope, pos(110))
        d = r.to_dict()
        d["keys"] = {kind: sorted(map(str, keys)) for kind, keys in d["keys"].items()}
        return d
    assert report(False) == report(True)
