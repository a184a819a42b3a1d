"""Every value exact on every path: a type-fidelity matrix on the real servers (issue 11).

One table per source kind, one column per supported type, rows of each type's edge
values (and a row of NULLs). Every cell travels every path, and after each one the
target must hold what the source holds:

* a log insert, then a log update (each row takes another row's values; PostgreSQL's
  large ``big`` column is left alone, so the log carries it as an unchanged TOAST value);
* a full dump (Spark JDBC range chunks) of table ``dumped`` and a key-list dump (bound
  selects) of table ``keyed``: both filled before the tail started, so the log carries none
  of their rows and every value in a target can only have come from the dump's snapshot;
* after every step, both apply paths: target ``local`` (in-process, COPY) and target
  ``spark`` (spark-submit of apply_job). The dumps run with the log update, so one apply
  per path takes all three tables (apply_job runs the same ``apply_table`` per table):
  two Spark applies instead of four, each table's target rows written by one path only.

The comparison is in each database's own text form, read with SQL on both sides
(``SOURCE_TEXT`` / ``TARGET_TEXT``): PostgreSQL to PostgreSQL, ``format('%s', col)``
(the type's output function) on both; MariaDB to PostgreSQL, a pair of expressions per
type that print the same value the same way (e.g. ``DATE_FORMAT`` / ``to_char`` with
microseconds). Two are compared as numbers, exactly: FLOAT by its float32 bits and DOUBLE
by its float64 bits (MariaDB prints a float with 6 digits), TIME and interval as total
microseconds.
"""
from __future__ import annotations

import re
import struct
import threading

import pyarrow as pa
import pytest
from psycopg2 import sql

from airflow_provider_dblog.engine.apply import run_apply
from airflow_provider_dblog.engine.dump import DumpRunner
from airflow_provider_dblog.engine.requests import DumpSpec
from airflow_provider_dblog.engine.targets import target_table_name
from airflow_provider_dblog.engine.targets.pg_tables import POS_COLUMN, from_row, json_as_text, read_list
from airflow_provider_dblog.engine.verify_rows import rows_to_batches
from airflow_provider_dblog.engine.verify_run import run_verify

from helpers import POSTGRES_PORT, pg_connect, unique

# -- MariaDB ---------------------------------------------------------------------------
MARIADB_COLUMNS = [
    ("ti", "TINYINT"), ("tiu", "TINYINT UNSIGNED"), ("si", "SMALLINT"), ("siu", "SMALLINT UNSIGNED"),
    ("mi", "MEDIUMINT"), ("miu", "MEDIUMINT UNSIGNED"), ("i", "INT"), ("iu", "INT UNSIGNED"),
    ("bi", "BIGINT"), ("biu", "BIGINT UNSIGNED"),
    ("d65", "DECIMAL(65,30)"), ("d38", "DECIMAL(38,10)"), ("d10", "DECIMAL(10,2)"),
    ("f", "FLOAT"), ("db", "DOUBLE"),
    ("b1", "BIT(1)"), ("b8", "BIT(8)"), ("b64", "BIT(64)"),
    ("dt", "DATE"), ("dt0", "DATETIME"), ("dt3", "DATETIME(3)"), ("dt6", "DATETIME(6)"),
    ("ts0", "TIMESTAMP NULL DEFAULT NULL"), ("ts6", "TIMESTAMP(6) NULL DEFAULT NULL"),
    ("tm0", "TIME"), ("tm6", "TIME(6)"), ("yr", "YEAR"),
    ("ch", "CHAR(10)"), ("vc", "VARCHAR(40)"), ("tx", "TEXT"),
    ("bn", "BINARY(4)"), ("vb", "VARBINARY(16)"), ("bl", "BLOB"),
    ("en", "ENUM('a','b','c')"), ("st", "SET('x','y','z')"), ("js", "JSON"),
]
_D65 = "99999999999999999999999999999999999.999999999999999999999999999999"
MARIADB_ROWS = [
    # the low ends
    ("1", "-128", "0", "-32768", "0", "-8388608", "0", "-2147483648", "0", "-9223372036854775808", "0",
     f"-{_D65}", "-9999999999999999999999999999.9999999999", "-99999999.99",
     "-3.40282e38", "-1.7976931348623157e308", "b'0'", "b'0'", "b'0'",
     "'1000-01-01'", "'1000-01-01 00:00:00'", "'1582-10-10 12:00:00.123'", "'1000-01-01 00:00:00.000001'",
     "'1970-01-01 00:00:01'", "'1970-01-01 00:00:01.000001'", "'-838:59:59'", "'-838:59:58.999999'",
     "0", "'a'", "'trail  '", "'😀 e\u0301 ñ'", "x'00'", "x'00ff'", "x'00'", "'a'", "''",
     "'{\"a\": [1, 2.50, \"é\"]}'"),
    # the high ends
    ("2", "127", "255", "32767", "65535", "8388607", "16777215", "2147483647", "4294967295",
     "9223372036854775807", "18446744073709551615",
     _D65, "9999999999999999999999999999.9999999999", "99999999.99",
     "3.40282e38", "1.7976931348623157e308", "b'1'", "b'11111111'", f"b'{'1' * 64}'",
     "'9999-12-31'", "'9999-12-31 23:59:59'", "'9999-12-31 23:59:59.999'", "'9999-12-31 23:59:59.999999'",
     "'2038-01-19 03:14:07'", "'2038-01-19 03:14:07.999999'", "'838:59:59'", "'838:59:59'",
     "2155", "'zzzzzzzzzz'", "''", "REPEAT('long text ', 2000)", "x'ffffffff'", "x'ff'",
     "REPEAT(x'ff', 3000)", "'c'", "'x,y,z'", "'[]'"),
    # the odd ones: Julian-calendar dates, -0, tiny values, COPY's special characters
    ("3", "0", "1", "-1", "1", "0", "1", "0", "1", "0", "1",
     "0.000000000000000000000000000001", "0.0000000001", "0.00",
     "-0.0e0", "-0.0e0", "b'1'", "b'10000000'", f"b'1{'0' * 63}'",
     "'1582-10-10'", "'0001-01-01 00:00:00'", "'1500-06-01 23:59:59.5'", "'1582-10-04 12:00:00.5'",
     "'2000-02-29 12:00:00'", "'1999-12-31 23:59:59.5'", "'00:00:00'", "'-00:00:00.000001'",
     "1901", "'ab  '", "'tab\\tnl\\nbs\\\\\\\\ q''\"'", "'e\u0301\u0301'", "x'01'", "x''", "x''",
     "'b'", "'y'", "'{\"k\": \"\\\\u00e9\", \"n\": 1.0e10}'"),
    # ordinary values
    ("4", "-7", "7", "-300", "300", "-70000", "70000", "-7", "7", "-7", "7",
     "1.5", "-123.4567890123", "1.50", "0.1", "0.1", "b'0'", "b'101'", "b'101'",
     "'1500-06-01'", "'1582-10-15 00:00:00'", "'2024-02-29 01:02:03.004'", "'2024-02-29 01:02:03.000004'",
     "'2024-02-29 01:02:03'", "'2024-02-29 01:02:03.000004'", "'12:34:56'", "'-12:34:56.789'",
     "2024", "'x'", "'x'", "'x'", "x'0a0b'", "x'0a'", "x'0a'", "'a'", "'x,z'", "'{}'"),
    ("5",) + ("NULL",) * len(MARIADB_COLUMNS),
]

# (source expression, target expression) per column: the same value printed the same way
_MY_INT = ("CAST({c} AS CHAR)", "{c}::text")
_MY_UNSIGNED = ("CAST(CAST({c} AS UNSIGNED) AS CHAR)", "{c}::text")
_MY_TS = ("DATE_FORMAT({c}, '%Y-%m-%d %H:%i:%s.%f')", "to_char({c}, 'YYYY-MM-DD HH24:MI:SS.US')")
MARIADB_TEXT = {
    **{c: _MY_INT for c in ("ti", "tiu", "si", "siu", "mi", "miu", "i", "iu", "bi", "biu",
                            "d65", "d38", "d10")},
    "yr": _MY_UNSIGNED,
    "f": ("CAST({c} AS DOUBLE)", "{c}"),            # compared by float32 bits (below)
    "db": ("{c}", "{c}"),                           # compared by float64 bits (below)
    "b1": ("CAST(CAST({c} AS UNSIGNED) AS CHAR)", "{c}::int::text"),
    "b8": _MY_UNSIGNED, "b64": _MY_UNSIGNED,
    "dt": ("DATE_FORMAT({c}, '%Y-%m-%d')", "to_char({c}, 'YYYY-MM-DD')"),
    "dt0": _MY_TS, "dt3": _MY_TS, "dt6": _MY_TS, "ts0": _MY_TS, "ts6": _MY_TS,
    "tm0": ("CAST({c} AS CHAR)", "(extract(epoch FROM {c}) * 1000000)::bigint"),  # microseconds
    "tm6": ("CAST({c} AS CHAR)", "(extract(epoch FROM {c}) * 1000000)::bigint"),
    **{c: ("{c}", "{c}") for c in ("ch", "vc", "tx", "en", "st")},
    **{c: ("LOWER(HEX({c}))", "encode({c}, 'hex')") for c in ("bn", "vb", "bl")},
    "js": ("{c}", "{c}::text"),
}

# -- PostgreSQL ------------------------------------------------------------------------
PG_SETUP = [
    "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')",
    "CREATE DOMAIN money2 AS numeric(10,2)",
    "CREATE DOMAIN label AS varchar(20)",
]
PG_COLUMNS = [
    ("i2", "smallint"), ("i4", "integer"), ("i8", "bigint"),
    ("n", "numeric"), ("n10", "numeric(10,2)"), ("n38", "numeric(38,10)"),
    ("r", "real"), ("d", "double precision"),
    ("t", "text"), ("vc", "varchar(10)"), ("c", "char(5)"), ("by", "bytea"), ("bo", "boolean"),
    ("dt", "date"), ("ts", "timestamp"), ("ts3", "timestamp(3)"), ("tz", "timestamptz"),
    ("tm", "time"), ("tmtz", "timetz"), ("iv", "interval"),
    ("u", "uuid"), ("j", "json"), ("jb", "jsonb"),
    ("ai", "integer[]"), ("at", "text[]"), ("an", "numeric[]"),
    ("e", "mood"), ("dm", "money2"), ("dl", "label"),
    ("ip", "inet"), ("cd", "cidr"), ("mac", "macaddr"), ("bits", "bit(8)"), ("vbits", "varbit(16)"),
    ("big", "text"),
]
PG_ROWS = [
    ("1", "-32768", "-2147483648", "-9223372036854775808", "'NaN'", "'NaN'",
     "'-9999999999999999999999999999.9999999999'", "'-Infinity'", "'-Infinity'",
     "'😀 e\u0301'", "''", "'ab'", "'\\x00ff'", "false",
     "'4713-01-01 BC'", "'4713-01-01 00:00:00 BC'", "'0044-03-15 12:00:00.123 BC'", "'-infinity'",
     "'00:00:00'", "'00:00:00+15:59'", "'-178000000 years'",
     "'00000000-0000-0000-0000-000000000000'", "'{\"a\" : 1,  \"a\": 2}'", "'{\"b\": 1, \"a\": [1, 2.50]}'",
     "'{1,NULL,3}'", "'{\"a b\",\"c\\\"d\",NULL}'", "'{1.50,NaN}'", "'sad'", "'-99999999.99'", "''",
     "'192.168.0.1/24'", "'10.0.0.0/8'", "'08:00:2b:01:02:03'", "B'00000000'", "B'1'",
     "repeat('toasted ', 100000)"),
    ("2", "32767", "2147483647", "9223372036854775807", "'Infinity'", "'99999999.99'",
     "'9999999999999999999999999999.9999999999'", "'Infinity'", "'1.7976931348623157e308'",
     "repeat('x', 3000)", "'0123456789'", "'abcde'", "'\\xff'", "true",
     "'infinity'", "'infinity'", "'99999-12-31 23:59:59.999'", "'infinity'",
     "'24:00:00'", "'24:00:00-15:59'", "'178000000 years'",
     "'ffffffff-ffff-ffff-ffff-ffffffffffff'", "'[]'", "'[]'",
     "'{}'", "'{}'", "'{}'", "'happy'", "'99999999.99'", "'zzzzzzzzzzzzzzzzzzzz'",
     "'::1'", "'2001:db8::/32'", "'ff:ff:ff:ff:ff:ff'", "B'11111111'", "B'1111111111111111'",
     "repeat('big ', 50000)"),
    ("3", "0", "0", "0", "'-Infinity'", "'-0.00'", "'0.0000000001'", "'-0'", "'-0'",
     "E'tab\\tnl\\nbs\\\\ q''\"'", "'a  '", "'a'", "''", "false",
     "'1582-10-10'", "'1582-10-04 12:00:00.5'", "'1500-06-01 23:59:59.999'", "'1582-10-10 12:00:00+05:30'",
     "'23:59:59.999999'", "'12:00:00.5+05:30'", "'1 year 2 mons -3 days 04:05:06.789'",
     "'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'", "'{\"k\": \"\\u00e9\", \"n\": 1.0e10}'",
     "'{\"k\": \"\\u00e9\", \"n\": 1.0e10}'",
     "'[0:1]={7,8}'", "'{{a,b},{c,d}}'", "'{1e-20}'", "'ok'", "'0.00'", "'with space'",
     "'10.1.2.3'", "'10.1.2.0/24'", "'01-02-03-04-05-06'", "B'10000000'", "B''",
     "''"),
    ("4", "-7", "7", "-7", "'0.000000000000000000000000000000000000000001'", "'1.50'", "'1.5'",
     "'0.1'", "'0.1'", "'x'", "'x'", "'x'", "'\\x0a'", "true",
     "'2024-02-29'", "'2024-02-29 01:02:03.000004'", "'2024-02-29 01:02:03.004'",
     "'2024-02-29 01:02:03.000004+00'", "'01:02:03.000004'", "'01:02:03+00'", "'-00:00:00.000001'",
     "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", "'1'", "'1'", "'{7}'", "'{x}'", "'{7}'", "'ok'",
     "'1.50'", "'x'", "'1.2.3.4'", "'1.2.3.4/32'", "'00:00:00:00:00:00'", "B'00000111'", "B'0101'",
     "'small'"),
    ("5",) + ("NULL",) * len(PG_COLUMNS),
]
PG_TEXT = {c: ("format('%s', {c})", "format('%s', {c})") for c, _ in PG_COLUMNS}
# one way to print on both sides (the test's own: not the engine's settings)
PG_SESSION = ("SET DateStyle = 'ISO, YMD'; SET IntervalStyle = 'postgres'; SET TimeZone = 'UTC'; "
              "SET extra_float_digits = 1; SET bytea_output = 'hex'")

# filled before the tail starts, then dumped: by Spark range chunks, by a key list
DUMPED = ("dumped", "keyed")

MATRIX = {
    "mariadb": (MARIADB_COLUMNS, MARIADB_ROWS, MARIADB_TEXT),
    "postgres": (PG_COLUMNS, PG_ROWS, PG_TEXT),
}


def _bits(kind: str, value) -> str | None:
    """A float compared by its bits: float32 (FLOAT, real) or float64."""
    if value is None:
        return None
    return struct.pack(">f" if kind == "f" else ">d", float(value)).hex()


def _micros(value) -> int | None:
    """MySQL TIME text ('-838:59:58.999999') in microseconds."""
    if value is None:
        return None
    if not isinstance(value, str):
        return int(value)
    sign = -1 if value.startswith("-") else 1
    h, m, s = value.lstrip("-").split(":")
    whole, _, frac = s.partition(".")
    return sign * (((int(h) * 60 + int(m)) * 60 + int(whole)) * 1_000_000 + int(frac.ljust(6, "0") or 0))


# The defaults a PostgreSQL database may have, each printing or reading some value
# otherwise: the engine's sessions must not depend on them (log, dump and target alike)
HOSTILE = {"DateStyle": "SQL, DMY", "IntervalStyle": "sql_standard", "extra_float_digits": "-3",
           "TimeZone": "America/St_Johns", "bytea_output": "escape"}


def _hostile_database(name: str) -> None:
    conn = pg_connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if not cur.fetchone():
                cur.execute(f'CREATE DATABASE "{name}"')
            for k, v in HOSTILE.items():
                cur.execute(f'ALTER DATABASE "{name}" SET {k} = %s', (v,))
    finally:
        conn.close()


# the target column types (PostgreSQL's format_type) a user computes with
MARIADB_TARGET_TYPES = {
    "biu": "numeric(20,0)", "d65": "numeric(65,30)", "d38": "numeric(38,10)", "f": "real",
    "db": "double precision", "b1": "boolean", "b64": "numeric(20,0)", "dt": "date",
    "dt6": "timestamp(6) without time zone", "ts6": "timestamp(6) with time zone", "tm6": "interval",
    "yr": "smallint", "js": "json", "bl": "bytea", "en": "text",
}


def _pg_target_type(source_type: str) -> str:
    """Text kinds are text in a target (their values are exactly the source's); timestamps
    keep microseconds; everything else is the source's own type."""
    if re.match(r"^(character varying|character)(\(\d+\))?$", source_type):
        return "text"
    return re.sub(r"^timestamp(\(\d\))? ", "timestamp(6) ", source_type)


class Matrix:
    """The matrix table on one source, two targets, and the comparison."""

    def __init__(self, make_cdc, src_db):
        self.kind = "mariadb" if src_db.kind == "mysql" else "postgres"
        self.columns, self.rows, self.text = MATRIX[self.kind]
        self.sdb = src_db
        if self.kind == "postgres":
            _hostile_database(src_db.database)
        with src_db.cursor() as cur:
            if self.kind == "postgres":
                for stmt in PG_SETUP:
                    cur.execute(stmt)
            cols = ", ".join(f"{c} {t}" for c, t in self.columns)
            for name in ("m", *DUMPED, "vals"):
                src_db.create_table(cur, name, f"id integer PRIMARY KEY, {cols}")
            for row in self.rows:
                cur.execute(f"INSERT INTO vals VALUES ({', '.join(row)})".replace("%", "%%"), ())
            # before any tail: the log never carries these rows, only a dump can
            for name in DUMPED:
                cur.execute(f"INSERT INTO {name} SELECT * FROM vals")
        spark_db = unique("tgt")
        _hostile_database(spark_db)
        self.cdc = make_cdc(["m", *DUMPED], targets={"spark_tgt": {
            "kind": "postgres", "source": "src", "host": "127.0.0.1", "port": POSTGRES_PORT,
            "user": "postgres", "database": spark_db}})
        _hostile_database(self.cdc.cfg.target("tgt").endpoint.database)
        self.tables = {name: f"{self.cdc.db}.{name}" for name in ("m", *DUMPED)}
        self.schemas = {name: self.cdc.source.table_schema(t) for name, t in self.tables.items()}

    # -- the paths ------------------------------------------------------------------------
    def apply_both(self, *names: str) -> None:
        """Both apply paths, each over every table; ``names`` must each have been applied."""
        local = run_apply(self.cdc.cfg, "tgt", via="local")
        spark = self.cdc.apply_spark("spark_tgt")
        assert spark["via"] == "spark", spark
        for name in names:
            assert local["tables"][self.tables[name]]["status"] == "applied", local
            assert spark["tables"][self.tables[name]]["status"] == "applied", spark

    # -- the comparison -------------------------------------------------------------------
    def source_text(self, name: str) -> dict:
        exprs = ", ".join(self.text[c][0].format(c=self._quote_src(c)) for c, _ in self.columns)
        with self.sdb.cursor() as cur:
            if self.kind == "postgres":
                cur.execute(PG_SESSION)
            else:
                cur.execute("SET time_zone = '+00:00'")
            cur.execute(f"SELECT id, {exprs} FROM {name} ORDER BY id")
            return {r[0]: self._norm(r[1:]) for r in cur.fetchall()}

    def target_text(self, target: str, name: str) -> dict:
        tcfg = self.cdc.cfg.target(target)
        exprs = ", ".join(self.text[c][1].format(c=f'"{c}"') for c, _ in self.columns)
        conn = pg_connect(tcfg.endpoint.database)
        try:
            with conn.cursor() as cur:
                cur.execute(PG_SESSION)
                cur.execute(f'SELECT id, {exprs} FROM "{tcfg.schema}"."{target_table_name(self.schemas[name])}" '
                            "ORDER BY id")
                return {r[0]: self._norm(r[1:]) for r in cur.fetchall()}
        finally:
            conn.close()

    def check_verify_read(self, target: str, name: str) -> None:
        """Target.read_at's rows (verify_rows' batches) equal the rows psycopg2 reads with
        read_list and from_row, the per-value parsers, column by column."""
        schema = self.schemas[name]
        with self.cdc.target(target) as tgt:
            _, batches = tgt.read_at(schema, "src")
            got = pa.concat_tables(list(batches)).sort_by("id")
        tcfg = self.cdc.cfg.target(target)
        conn = pg_connect(tcfg.endpoint.database)
        try:
            with conn.cursor() as cur:
                cur.execute(PG_SESSION)
                json_as_text(conn)
                cur.execute(sql.SQL("SELECT {}, {} FROM {}.{}").format(
                    read_list(schema, schema.column_names), sql.Identifier(POS_COLUMN),
                    sql.Identifier(tcfg.schema), sql.Identifier(target_table_name(schema))))
                rows = [from_row(schema, schema.column_names, r[:-1]) + (r[-1],) for r in cur.fetchall()]
        finally:
            conn.close()
        want = pa.concat_tables(list(rows_to_batches(schema, rows))).sort_by("id")
        assert got.num_rows == want.num_rows == len(self.rows), (got.num_rows, want.num_rows)
        for c in got.column_names:
            assert got[c].equals(want[c]), (name, c, got[c].to_pylist(), want[c].to_pylist())

    def target_rows(self, target: str, name: str) -> int:
        """Rows of the table in the target (0 when the apply made no table for it)."""
        tcfg = self.cdc.cfg.target(target)
        rel = f'"{tcfg.schema}"."{target_table_name(self.schemas[name])}"'
        conn = pg_connect(tcfg.endpoint.database)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT to_regclass(%s)", (rel,))
                if cur.fetchone()[0] is None:
                    return 0
                cur.execute(f"SELECT count(*) FROM {rel}")
                return cur.fetchone()[0]
        finally:
            conn.close()

    def _quote_src(self, c: str) -> str:
        return f"`{c}`" if self.kind == "mariadb" else f'"{c}"'

    def _norm(self, values) -> tuple:
        out = []
        for (c, _), v in zip(self.columns, values):
            if self.kind == "mariadb" and c in ("f", "db"):
                v = _bits(c, v)
            elif self.kind == "mariadb" and c in ("tm0", "tm6"):
                v = _micros(v)
            elif isinstance(v, (bytes, bytearray, memoryview)):
                v = bytes(v).decode("utf-8")
            out.append(v)
        return tuple(out)

    def target_types(self, target: str, name: str) -> dict[str, str]:
        tcfg = self.cdc.cfg.target(target)
        conn = pg_connect(tcfg.endpoint.database)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
                            "WHERE a.attrelid = %s::regclass AND a.attnum > 0",
                            (f'"{tcfg.schema}"."{target_table_name(self.schemas[name])}"',))
                return dict(cur.fetchall())
        finally:
            conn.close()

    def source_types(self, name: str) -> dict[str, str]:
        with self.sdb.cursor() as cur:
            cur.execute("SELECT a.attname, format_type(t.typbasetype, t.typtypmod) FROM pg_attribute a "
                        "JOIN pg_type t ON t.oid = a.atttypid WHERE a.attrelid = %s::regclass "
                        "AND a.attnum > 0 AND t.typtype = 'd' UNION ALL "
                        "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
                        "JOIN pg_type t ON t.oid = a.atttypid WHERE a.attrelid = %s::regclass "
                        "AND a.attnum > 0 AND t.typtype IN ('b', 'e')", (name, name))
            return dict(cur.fetchall())

    def check_types(self, name: str) -> None:
        """Each column keeps a type users compute with: the source's own (PostgreSQL; an enum
        becomes text, a domain its base type), or its counterpart (MARIADB_TARGET_TYPES)."""
        for target in ("tgt", "spark_tgt"):
            got = self.target_types(target, name)
            if self.kind == "mariadb":
                want = MARIADB_TARGET_TYPES
            else:
                want = {c: _pg_target_type(t) for c, t in self.source_types(name).items()}
                want["e"] = "text"
            wrong = {c: (t, got.get(c)) for c, t in want.items() if got.get(c) != t}
            assert not wrong, f"{self.kind} target {target}, table {name}: column types (want, got): {wrong}"

    def check(self, path: str, name: str) -> None:
        want = self.source_text(name)
        assert len(want) == len(self.rows), want.keys()
        for target in ("tgt", "spark_tgt"):
            got = self.target_text(target, name)
            wrong = [(row_id, c, w, g)
                     for row_id in sorted(set(want) | set(got))
                     for (c, _), w, g in zip(self.columns, want.get(row_id, (None,) * len(self.columns)),
                                             got.get(row_id, ("<missing>",) * len(self.columns)))
                     if w != g]
            assert not wrong, (f"{self.kind} after {path}, target {target}: "
                               + "; ".join(f"row {i} {c}: source {w!r} target {g!r}"
                                           for i, c, w, g in wrong[:20]))


@pytest.fixture
def matrix(make_cdc, src_db):
    return Matrix(make_cdc, src_db)


def test_every_value_is_exact_on_every_path(matrix):
    m, cdc = matrix, matrix.cdc
    cdc.start_tail()
    n = len(m.rows)
    cols = [c for c, _ in m.columns]

    # 1. log insert
    with m.sdb.cursor() as cur:
        cur.execute("INSERT INTO m SELECT * FROM vals")
    cdc.drain()
    m.apply_both("m")
    m.check("a log insert", "m")
    m.check_types("m")
    for name in DUMPED:  # nothing of theirs in the log: nothing in a target yet
        for target in ("tgt", "spark_tgt"):
            assert not m.target_rows(target, name), (target, name)

    # 2. log update: every row takes the values of the next one (PostgreSQL's big column,
    # TOASTed, is not touched: the log sends it as unchanged and the tail keeps it)
    updated = [c for c in cols if c != "big"]
    with m.sdb.cursor() as cur:
        if m.kind == "mariadb":
            sets = ", ".join(f"m.`{c}` = v.`{c}`" for c in updated)
            cur.execute(f"UPDATE m JOIN vals v ON v.id = m.id % {n} + 1 SET {sets}")
        else:
            sets = ", ".join(f'"{c}" = v."{c}"' for c in updated)
            cur.execute(f"UPDATE m SET {sets} FROM vals v WHERE v.id = m.id % {n} + 1")

    # 3. a full dump on Spark of ``dumped``
    rid = cdc.request(DumpSpec("table", [m.tables["dumped"]], chunk_size=2, parallelism=2))
    out = cdc.dump_spark(rid)
    assert out["status"] == "done", out
    assert cdc.state.progress(rid, m.tables["dumped"])["rows"] == n

    # 4. a key-list dump (bound selects) of ``keyed``
    rid = cdc.request(DumpSpec("keys", [m.tables["keyed"]], keys=[[i] for i in range(1, n + 1)], chunk_size=3))
    DumpRunner(cdc.source, cdc.state, cdc.store, None, cdc.cfg.dump).run(rid)
    assert cdc.state.progress(rid, m.tables["keyed"])["rows"] == n

    cdc.drain()
    m.apply_both("m", *DUMPED)
    m.check("a log update", "m")
    m.check("a full dump", "dumped")
    m.check("a key-list dump", "keyed")
    for name in DUMPED:
        m.check_types(name)

    # 5. a verification's own read of the target (ADBC: PostgreSQL's binary COPY into Arrow)
    # holds every value as psycopg2's per-value read does, and each table verifies equal
    for name in ("m", *DUMPED):
        m.check_verify_read("tgt", name)
    stop, applies = threading.Event(), []
    applier = threading.Thread(target=lambda: [applies.append(run_apply(cdc.cfg, "tgt", via="local"))
                                               for _ in iter(lambda: stop.wait(0.2), True)], daemon=True)
    applier.start()   # (a verification waits for the target to pass its chunks' high watermarks)
    try:
        out = run_verify(cdc.cfg, "tgt", DumpSpec("all", []), wait_s=120)   # (m, dumped, keyed)
    finally:
        stop.set()
        applier.join(60)
    assert out["equal"], {t: r for t, r in out["tables"].items() if not r["equal"]}
    assert all(r["compared"] == n for r in out["tables"].values()), out["tables"]
    cdc.stop_tail()
