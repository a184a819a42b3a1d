"""Break round (helper) of the Arrow-to-driver chunk select: a key-range chunk read by
``SparkChunkReader.read(schema, preds, uri, keep_file=False)`` (``toArrow``, nothing written)
must equal the same chunk read through Parquet (``keep_file``) and the source's own key-list select
(``select_keys``, the reference path), table, types and values alike, on both sources, for
every column type, all-NULL columns, empty chunks, odd column names and composite keys.
"""
from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

pytest.importorskip("pyspark")

from airflow_provider_dblog.engine.arrow_values import from_arrow  # noqa: E402
from airflow_provider_dblog.engine.config import parse_config  # noqa: E402
from airflow_provider_dblog.engine.sources import open_source  # noqa: E402
from spark_jobs.common import SparkChunkReader, spark_session  # noqa: E402

from helpers import MARIADB_PORT, POSTGRES_PORT, drop_pg_database, mysql_connect, pg_connect  # noqa: E402
from test_type_fidelity import (MARIADB_COLUMNS, MARIADB_ROWS, PG_COLUMNS, PG_ROWS,  # noqa: E402
                                PG_SETUP)

MY_TABLES = ["types", "allnull", "odd", "comp", "chars", "empty", "decs", "many"]
PG_TABLES = ["types", "allnull", "odd", "comp", "empty"]
MAX_RESULT = "16m"
JARS = "/usr/share/java/mariadb-java-client.jar,/usr/share/java/postgresql.jar"

# odd column names: case, spaces, dots, quotes of the other dialect, non-ASCII
ODD = ["Id Key", "UPPER", "a.b", "sp ace", "ä€", 'q"uote', "semi;colon", "eq=ual", "{brace}", "tab\tnl"]


def my_q(c: str) -> str:
    return "`" + c.replace("`", "``") + "`"


def pg_q(c: str) -> str:
    return '"' + c.replace('"', '""') + '"'


@pytest.fixture(scope="module")
def spark():
    s = spark_session("dblog-test-arrow-chunks-break", conf={
        "spark.jars": JARS, "spark.master": "local[2]",
        # the default (1g) scaled down, so that a chunk past it is small enough for a test
        "spark.driver.maxResultSize": MAX_RESULT})
    yield s
    s.stop()


def _cfg(kind: str, tmp: str, **src):
    return parse_config({"sources": {"s": {"kind": kind, "host": "127.0.0.1", "user": "root" if kind == "mysql"
                                           else "postgres", **src}},
                         "state": {"redis_url": "redis://127.0.0.1:1/0"}, "storage": {"root": tmp}}).source("s")


@pytest.fixture(scope="module")
def my(tmp_path_factory):
    """A MariaDB database of edge tables, and a MySQLSource on them."""
    db = f"brk_arrow_{uuid.uuid4().hex[:8]}"
    with mysql_connect() as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{db}` CHARACTER SET utf8mb4")
    try:
        src = _my_setup(db, tmp_path_factory)
        yield src, db
        src.close()
    finally:
        with mysql_connect() as conn, conn.cursor() as cur:
            cur.execute(f"DROP DATABASE `{db}`")


def _my_setup(db, tmp_path_factory):
    cols = ", ".join(f"`{c}` {t}" for c, t in MARIADB_COLUMNS)
    with mysql_connect() as conn, conn.cursor() as cur:
        cur.execute(f"USE `{db}`")
        cur.execute("SET time_zone = '+00:00'")
        cur.execute(f"CREATE TABLE types (id INT PRIMARY KEY, {cols})")
        for row in MARIADB_ROWS:
            cur.execute(f"INSERT INTO types VALUES ({', '.join(row)})".replace("%", "%%"), ())
        # every value of every column NULL, in every row
        cur.execute(f"CREATE TABLE allnull (id INT PRIMARY KEY, {cols})")
        cur.execute("INSERT INTO allnull (id) VALUES (1), (2), (3)")
        cur.execute("CREATE TABLE odd (" + ", ".join(f"{my_q(c)} INT" for c in ODD) + ", PRIMARY KEY (`Id Key`))")
        cur.execute("INSERT INTO odd VALUES " + ", ".join(
            "(" + ", ".join(str(i * 10 + j) for j in range(len(ODD))) + ")" for i in range(1, 6)))
        # composite key over text read through an expression (CHAR) and a signed int
        cur.execute("CREATE TABLE comp (c CHAR(4), i BIGINT, v VARCHAR(40), PRIMARY KEY (c, i))")
        cur.executemany("INSERT INTO comp VALUES (%s, %s, %s)",
                        [(c, i, f"{c}{i}") for c in ("", "a", "a b", "é", "😀") for i in (-2**63, 0, 2**63 - 1)])
        # charsets, NUL bytes, empty strings, NULL bytes in text, 4-byte characters
        cur.execute("CREATE TABLE chars (id INT PRIMARY KEY, l1 VARCHAR(20) CHARACTER SET latin1, "
                    "u4 VARCHAR(20) CHARACTER SET utf8mb4, u3 VARCHAR(20) CHARACTER SET utf8mb3, "
                    "b VARBINARY(20), bl LONGBLOB, t LONGTEXT)")
        cur.executemany("INSERT INTO chars VALUES (%s, %s, %s, %s, %s, %s, %s)", [
            (1, "", "", "", b"", b"", ""),
            (2, "àéî€", "😀𝄞", "€", b"\x00\x00", b"\x00" * 5, "a\x00b"),
            (3, None, None, None, None, None, None),
            (4, "x", "\u00e9e\u0301", "e\u0301", b"\xff\x00\xfe", b"\x80\x81", "\U0010FFFF")])
        cur.execute("CREATE TABLE empty (id INT PRIMARY KEY, d DATE, n DECIMAL(65,30), s VARCHAR(3))")
        cur.execute("CREATE TABLE decs (id INT PRIMARY KEY, d1 DECIMAL(1,0), d38 DECIMAL(38,0), "
                    "d3838 DECIMAL(38,38), du DECIMAL(10,2) UNSIGNED, dz DECIMAL(5,2) ZEROFILL, iz INT(5) ZEROFILL, "
                    "fu FLOAT UNSIGNED, dbu DOUBLE UNSIGNED, tb TINYINT(1), tbu TINYINT(1) UNSIGNED, b BOOLEAN, "
                    "mu MEDIUMINT UNSIGNED, f0 FLOAT(7,3), bit5 BIT(5))")
        nines = "9" * 38
        cur.execute(f"INSERT INTO decs VALUES (1, -9, -{nines}, -0.{nines}, 0, 0, 0, 0, 0, -128, 0, 0, 0, "
                    "-9999.999, b'0'),"
                    f"(2, 9, {nines}, 0.{nines}, 99999999.99, 999.99, 4294967295, 3.4e38, 1.7976931348623157e308, "
                    "127, 255, 1, 16777215, 9999.999, b'11111'), (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
                    "NULL, NULL, NULL, NULL, NULL, NULL), (4, 0, 1, 0.00000000000000000000000000000000000001, "
                    "0.01, 1.5, 7, 1.17549435e-38, 4.9e-324, 2, 2, 2, 1, 0.001, b'10101')")
        # past one Arrow batch (10,000 rows) and one JDBC fetch, with text-parsed columns
        cur.execute("CREATE TABLE many (id INT PRIMARY KEY, dt DATETIME(6), n DECIMAL(65,30), s VARCHAR(20), "
                    "d DOUBLE)")
        cur.execute("INSERT INTO many SELECT seq, TIMESTAMP '1000-01-01 00:00:00' + INTERVAL seq * 1234567 SECOND "
                    "+ INTERVAL seq MICROSECOND, seq / 7, IF(seq % 3 = 0, NULL, CONCAT('s', seq)), seq / 3 "
                    "FROM seq_1_to_25000")
        # 40 rows of 1 MiB: a chunk of 40 MiB
        cur.execute("CREATE TABLE wide (id INT PRIMARY KEY, doc LONGBLOB)")
        cur.executemany("INSERT INTO wide VALUES (%s, %s)", [(i, os.urandom(1 << 20)) for i in range(1, 41)])
    return open_source(_cfg("mysql", str(tmp_path_factory.mktemp("my")), port=MARIADB_PORT,
                            tables=[f"{db}.{t}" for t in MY_TABLES + ["wide"]]))


@contextlib.contextmanager
def _pg_cursor(db: str):
    conn = pg_connect(db)
    try:
        with conn.cursor() as cur:
            cur.execute("SET search_path TO app")
            yield cur
    finally:
        conn.close()


@pytest.fixture(scope="module")
def pg(tmp_path_factory):
    """A PostgreSQL database of edge tables, and a PostgresSource on them."""
    db = f"brk_arrow_{uuid.uuid4().hex[:8]}"
    conn = pg_connect()
    with conn.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{db}"')
    conn.close()
    try:
        src = _pg_setup(db, tmp_path_factory)
        yield src, "app"
        src.close()
    finally:
        drop_pg_database(db)


def _pg_setup(db, tmp_path_factory):
    cols = ", ".join(f'"{c}" {t}' for c, t in PG_COLUMNS)
    with _pg_cursor(db) as cur:
        cur.execute("CREATE SCHEMA app")
        cur.execute("SET search_path TO app")
        for stmt in PG_SETUP:
            cur.execute(stmt)
        cur.execute(f"CREATE TABLE types (id integer PRIMARY KEY, {cols})")
        for row in PG_ROWS:
            cur.execute(f"INSERT INTO types VALUES ({', '.join(row)})".replace("%", "%%"), ())
        cur.execute(f"CREATE TABLE allnull (id integer PRIMARY KEY, {cols})")
        cur.execute("INSERT INTO allnull (id) SELECT generate_series(1, 3)")
        # PostgreSQL names are case-sensitive: "a" and "A" are two columns
        cur.execute("CREATE TABLE odd (" + ", ".join(f'{pg_q(c)} int' for c in ODD) + ', PRIMARY KEY ("Id Key"))')
        cur.execute("INSERT INTO odd VALUES " + ", ".join(
            "(" + ", ".join(str(i * 10 + j) for j in range(len(ODD))) + ")" for i in range(1, 6)))
        # names Spark once could not tell apart or parse (conform_columns' F.col): tests below
        cur.execute('CREATE TABLE cased (id int PRIMARY KEY, "a" int, "A" int)')
        cur.execute("INSERT INTO cased VALUES (1, 2, 3)")
        cur.execute('CREATE TABLE tick (id int PRIMARY KEY, "b`tick" int)')
        cur.execute("INSERT INTO tick VALUES (1, 2)")
        cur.execute("CREATE TABLE comp (t text, ts timestamptz, n numeric, v int, PRIMARY KEY (t, ts, n))")
        cur.execute("INSERT INTO comp VALUES ('', '-infinity', 'NaN', 1), ('a', '4713-01-01 BC', '-1e-30', 2), "
                    "('😀', 'infinity', '1e30', 3), ('b', '2024-01-01 00:00:00.000001+00', 0, 4)")
        cur.execute("CREATE TABLE empty (id int PRIMARY KEY, d date, n numeric, b bytea)")
        for t in PG_TABLES + ["cased", "tick"]:
            cur.execute(f"ALTER TABLE {t} REPLICA IDENTITY FULL")
    return open_source(_cfg("postgres", str(tmp_path_factory.mktemp("pg")), port=POSTGRES_PORT, database=db,
                            tables=[f"app.{t}" for t in PG_TABLES + ["cased", "tick"]]))


def three_ways(spark, src, qualified: str, tmp_path, parts: int = 2):
    """The table's chunk (every row) read to the driver, through Parquet, and by key list."""
    schema = src.table_schema(qualified)
    upto = src.max_key(schema)
    reader = SparkChunkReader(spark, src)
    if upto is None:
        preds = [src.bound_predicate(schema, src._predicate_columns(schema), "<=", (0,) * len(schema.key))]
        keys = []
    else:
        plan = src.plan_chunk(schema, None, upto, 100_000, parts)
        preds = src.range_predicates(schema, plan)
    arrow = reader.read(schema, preds, f"file://{tmp_path}/{uuid.uuid4().hex}", keep_file=False)
    parquet = reader.read(schema, preds, f"file://{tmp_path}/{uuid.uuid4().hex}")
    if upto is not None:
        keys = list(zip(*[from_arrow(t, arrow[k]) for k, t in zip(schema.key, schema.key_types)]))
    by_keys = src.select_keys(schema, keys)
    return schema, arrow, parquet, by_keys


def _sorted(schema, t: pa.Table) -> pa.Table:
    return t.sort_by([(k, "ascending") for k in schema.key]).combine_chunks()


def assert_same(schema, got: pa.Table, want: pa.Table, what: str) -> None:
    assert got.schema == want.schema, (what, got.schema, want.schema)
    g, w = _sorted(schema, got), _sorted(schema, want)
    assert g.num_rows == w.num_rows, (what, g.num_rows, w.num_rows)
    wrong = [(c, g[c].to_pylist(), w[c].to_pylist()) for c in g.column_names if not g[c].equals(w[c])]
    assert not wrong, (what, wrong[:5])


@pytest.mark.parametrize("name", MY_TABLES)
def test_mariadb_chunk_three_ways(spark, my, tmp_path, name):
    src, db = my
    schema, arrow, parquet, by_keys = three_ways(spark, src, f"{db}.{name}", tmp_path)
    assert_same(schema, arrow, parquet, "arrow vs parquet")
    assert_same(schema, arrow, by_keys, "arrow vs select_keys")


@pytest.mark.parametrize("name", PG_TABLES)
def test_postgres_chunk_three_ways(spark, pg, tmp_path, name):
    src, ns = pg
    schema, arrow, parquet, by_keys = three_ways(spark, src, f"{ns}.{name}", tmp_path)
    assert_same(schema, arrow, parquet, "arrow vs parquet")
    assert_same(schema, arrow, by_keys, "arrow vs select_keys")


def test_large_var_types(spark, my, tmp_path):
    """spark.sql.execution.arrow.useLargeVarTypes on: the same chunk (plain_var_types)."""
    src, db = my
    was = spark.conf.get("spark.sql.execution.arrow.useLargeVarTypes")
    spark.conf.set("spark.sql.execution.arrow.useLargeVarTypes", "true")
    try:
        schema, arrow, parquet, by_keys = three_ways(spark, src, f"{db}.chars", tmp_path)
    finally:
        spark.conf.set("spark.sql.execution.arrow.useLargeVarTypes", was)
    assert_same(schema, arrow, parquet, "arrow vs parquet")
    assert_same(schema, arrow, by_keys, "arrow vs select_keys")


class _Away:
    """A source whose JDBC URL names a port nothing listens on (the server away)."""

    def __init__(self, src, port: int):
        self._src, self._port = src, port

    def __getattr__(self, name):
        return getattr(self._src, name)

    def jdbc(self):
        url, props = self._src.jdbc()
        return url.replace(f":{self._src.config.endpoint.port}", f":{self._port}"), props


@pytest.mark.parametrize("to_file", [True, False], ids=["via-parquet", "arrow-to-driver"])
def test_server_away_is_transient(spark, my, tmp_path, to_file):
    """A chunk select that meets the server away is judged transient by the dump job's reader
    (its retry), on both ways alike."""
    from spark_jobs.dump_job import RetryingChunkReader

    src, db = my
    schema = src.table_schema(f"{db}.types")
    reader = RetryingChunkReader(spark, _Away(src, 1))
    with pytest.raises(Exception) as e:
        reader.read(schema, ["`id` <= 5"], f"file://{tmp_path}/away", keep_file=to_file)
    assert reader.is_transient(e.value), repr(e.value)


@pytest.mark.parametrize("to_file", [True, False], ids=["via-parquet", "arrow-to-driver"])
def test_chunk_past_max_result_size(spark, my, tmp_path, to_file):
    """A chunk larger than spark.driver.maxResultSize (ours 256m; 16m in this module): the
    Parquet way never brings it through the JVM driver; the Arrow way is aborted by Spark
    (found by the break round: the request failed on it every time) and the chunk read through
    Parquet instead, as the table's later chunks are."""
    src, db = my
    schema = src.table_schema(f"{db}.wide")
    reader = SparkChunkReader(spark, src)
    preds = src.range_predicates(schema, src.plan_chunk(schema, None, (40,), 1000, 2))
    data = reader.read(schema, preds, f"file://{tmp_path}/wide", keep_file=to_file)
    assert data.num_rows == 40 and (tmp_path / "wide").exists()
    assert reader.via_file == (set() if to_file else {schema.qualified})
    expected = src.select_keys(schema, [(i,) for i in range(1, 41)])
    assert_same(schema, data, expected, "past maxResultSize")


@pytest.mark.parametrize("to_file", [True, False], ids=["via-parquet", "arrow-to-driver"])
def test_column_name_with_backtick(spark, pg, tmp_path, to_file):
    src, ns = pg
    schema = src.table_schema(f"{ns}.tick")
    # found by the break round (older than it): F.col(`b`tick`) did not parse
    data = SparkChunkReader(spark, src).read(schema, ['"id" <= 5'], f"file://{tmp_path}/t", keep_file=to_file)
    assert data.num_rows == 1 and data["b`tick"].to_pylist() == [2]


@pytest.mark.parametrize("to_file", [True, False], ids=["via-parquet", "arrow-to-driver"])
def test_columns_differing_in_case(spark, pg, tmp_path, to_file):
    src, ns = pg
    schema = src.table_schema(f"{ns}.cased")
    # found by the break round (older than it): ambiguous to Spark until spark.sql.caseSensitive
    data = SparkChunkReader(spark, src).read(schema, ['"id" <= 5'], f"file://{tmp_path}/c", keep_file=to_file)
    assert data.num_rows == 1 and (data["a"].to_pylist(), data["A"].to_pylist()) == ([2], [3])


# -- end to end: DumpRunner (pipelined) with the Arrow way, into the PostgreSQL target --------
def test_dump_runner_into_target(spark, make_cdc, src_db):
    """Every type, all-NULL columns and odd names, dumped by ``DumpRunner.run`` (chunks of two
    rows, the next selected while one finishes) through the module's Spark: the target equals
    the source (verify's comparison), and nothing was left under the chunk files."""
    from airflow_provider_dblog.engine.dump import DumpRunner
    from airflow_provider_dblog.engine.requests import DumpSpec

    my_kind = src_db.kind == "mysql"
    columns, rows = (MARIADB_COLUMNS, MARIADB_ROWS) if my_kind else (PG_COLUMNS, PG_ROWS)
    q = my_q if my_kind else pg_q
    cols = ", ".join(f"{q(c)} {t}" for c, t in columns)
    odd = [c for c in ODD if c != "Id Key"]
    with src_db.cursor() as cur:
        if not my_kind:
            for stmt in PG_SETUP:
                cur.execute(stmt)
        src_db.create_table(cur, "types", f"id integer PRIMARY KEY, {cols}")
        src_db.create_table(cur, "allnull", f"id integer PRIMARY KEY, {cols}")
        src_db.create_table(cur, "odd", f"{q('Id Key')} integer PRIMARY KEY, "
                            + ", ".join(f"{q(c)} integer" for c in odd))
        if my_kind:
            cur.execute("SET time_zone = '+00:00'")
        for row in rows:
            cur.execute(f"INSERT INTO types VALUES ({', '.join(row)})".replace("%", "%%"), ())
        cur.execute("INSERT INTO allnull (id) VALUES (1), (2), (3)")
        cur.execute("INSERT INTO odd VALUES " + ", ".join(
            "(" + ", ".join(str(i * 10 + j) for j in range(len(odd) + 1)) + ")" for i in range(1, 6)))
    cdc = make_cdc(["types", "allnull", "odd"])
    cdc.start_tail()
    tables = [f"{cdc.db}.{t}" for t in ("types", "allnull", "odd")]
    rid = cdc.request(DumpSpec("all", [], chunk_size=2, parallelism=2))
    DumpRunner(cdc.source, cdc.state, cdc.store, SparkChunkReader(spark, cdc.source), cdc.cfg.dump).run(rid)
    assert cdc.state.request(rid)["status"] == "done", cdc.state.request(rid)
    cdc.drain()
    cdc.apply_local()
    cdc.assert_equal("types", "allnull", "odd")
    written = Path(cdc.store.chunk_uri(rid, tables[0], "x").removeprefix("file://")).parent.parent
    assert not written.exists() or not any(written.rglob("*.parquet")), list(written.rglob("*"))


class _ViaParquet(SparkChunkReader):
    """The way before the change: every chunk through Parquet (the chunk's own location)."""

    def read(self, table, predicates, dest_uri, keep_file=True):
        return super().read(table, predicates, dest_uri, keep_file=True)


@pytest.mark.parametrize("src_db", ["mariadb"], indirect=True)
@pytest.mark.parametrize("via_parquet", [True, False], ids=["via-parquet", "arrow-to-driver"])
def test_dump_of_wide_rows(spark, make_cdc, src_db, tmp_path, via_parquet):
    """The dump job's own reader (RetryingChunkReader, DumpRunner.run): 40 rows of 1 MiB in one
    chunk. Scaled: the default 1g is reached by a 50,000-row chunk (dump.chunk_size's default)
    of rows over ~21 KB (a JSON document, a TEXT, a BLOB column)."""
    from airflow_provider_dblog.engine.dump import DumpRunner
    from airflow_provider_dblog.engine.requests import DumpSpec
    from spark_jobs.dump_job import RetryingChunkReader

    with src_db.cursor() as cur:
        src_db.create_table(cur, "wide", "id INT PRIMARY KEY, doc LONGBLOB")
        cur.executemany("INSERT INTO wide VALUES (%s, %s)", [(i, os.urandom(1 << 20)) for i in range(1, 41)])
    cdc = make_cdc(["wide"])
    cdc.start_tail()
    rid = cdc.request(DumpSpec("table", [f"{cdc.db}.wide"], chunk_size=1000, parallelism=2))
    reader = (type("R", (_ViaParquet, RetryingChunkReader), {})(spark, cdc.source) if via_parquet
              else RetryingChunkReader(spark, cdc.source))
    try:
        DumpRunner(cdc.source, cdc.state, cdc.store, reader, cdc.cfg.dump).run(rid)
    finally:
        status = cdc.state.request(rid)["status"]
    assert status == "done", cdc.state.request(rid)
    cdc.drain()
    cdc.apply_local()
    cdc.assert_equal("wide")
