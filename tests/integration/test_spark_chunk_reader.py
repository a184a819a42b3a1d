"""SparkChunkReader against a real MariaDB: exactly the rows of the predicates, typed right.

A SparkSession runs in the test process (one per module). In-process, the JDBC
jars go in through ``spark.jars`` on the builder: the builder's settings reach
the JVM's launch. (Inside a script started by spark-submit they would not: there
the JVM is already up, hence ``--jars`` on the command line.)
"""
from __future__ import annotations

import datetime as dt
import decimal
import os
import uuid

import pyarrow as pa
import pytest

pymysql = pytest.importorskip("pymysql")
pytest.importorskip("pyspark")

from airflow_provider_dblog.engine.events import rows_of  # noqa: E402
from airflow_provider_dblog.engine.reconcile import conform_rows  # noqa: E402
from airflow_provider_dblog.engine.schema import Column, TableSchema  # noqa: E402
from spark_jobs.common import SparkChunkReader, spark_session  # noqa: E402

MARIADB_PORT = int(os.environ.get("DBLOG_TEST_MARIADB_PORT", "13306"))
JARS = "/usr/share/java/mariadb-java-client.jar,/usr/share/java/postgresql.jar"
N = 1000

ITEMS_DDL = """CREATE TABLE {db}.items (
  id BIGINT PRIMARY KEY, i INT, si SMALLINT, ti TINYINT, amt DECIMAL(12,2), name VARCHAR(50),
  body TEXT, created DATETIME(6), ts TIMESTAMP(6) NULL DEFAULT NULL, day DATE, data BLOB, doc JSON,
  dbl DOUBLE, flag BOOLEAN)"""

ITEMS = TableSchema("?", "items", (
    Column("id", "int64", False), Column("i", "int32"), Column("si", "int16"), Column("ti", "int8"),
    Column("amt", "decimal(12,2)"), Column("name", "string"), Column("body", "string"),
    Column("created", "timestamp"), Column("ts", "timestamp"), Column("day", "date"),
    Column("data", "binary"), Column("doc", "json"), Column("dbl", "float64"), Column("flag", "bool"),
), ("id",))

PAIRS = TableSchema("?", "pairs", (
    Column("a", "int32", False), Column("b", "string", False), Column("v", "int64"),
), ("a", "b"))


def item(i: int) -> tuple:
    if i % 10 == 0:  # every tenth row: all NULLs but the key
        return (i,) + (None,) * 13
    return (i, i * 7 - 3000, (i % 600) - 300, (i % 200) - 100, decimal.Decimal(i * 13) / 100 - 50,
            f"name-{i}", "x" * (i % 50) + "é✓", dt.datetime(2024, 3, 10, 2, 30, 0) + dt.timedelta(seconds=i * 3601,
                                                                                    microseconds=i * 37),
            dt.datetime(2021, 1, 1) + dt.timedelta(minutes=i, microseconds=i), dt.date(2000, 1, 1) + dt.timedelta(days=i),
            bytes([i % 256, 0, 255]) * (i % 5), f'{{"i": {i}, "s": "q\\"uote"}}', i / 3, i % 3 == 0)


class StubSource:
    """What the reader needs from a source, with Spark's own JDBC types: every column read
    as itself (no text columns), the rows only cast to the table's types."""

    def __init__(self, port: int):
        self.port = port

    def native_columns(self, qualified: str) -> dict:
        return {c: None for c in (ITEMS.column_names + PAIRS.column_names)}

    def text_parsed(self, native) -> bool:
        return False

    def conform_chunk(self, table: TableSchema, data: pa.Table) -> pa.Table:
        return data.select(table.column_names).cast(pa.schema(list(table.row_struct())))

    def jdbc(self) -> tuple[str, dict[str, str]]:
        return f"jdbc:mysql://127.0.0.1:{self.port}/", {
            "driver": "org.mariadb.jdbc.Driver", "user": "root", "password": "",
            "sessionInitStatement": "SET SESSION time_zone = '+00:00', SESSION tx_isolation = 'READ-COMMITTED'",
            "fetchsize": "10000"}

    def jdbc_table(self, qualified: str) -> str:
        db, name = qualified.split(".")
        return f"`{db}`.`{name}`"


@pytest.fixture(scope="module")
def mariadb(servers):
    conn = pymysql.connect(host="127.0.0.1", port=MARIADB_PORT, user="root", password="",
                           autocommit=True, connect_timeout=3, charset="utf8mb4")
    db = f"dblog_reader_{uuid.uuid4().hex[:8]}"
    with conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
        cur.execute(f"CREATE DATABASE {db} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        cur.execute(ITEMS_DDL.format(db=db))
        cur.executemany(f"INSERT INTO {db}.items VALUES ({', '.join(['%s'] * 14)})", [item(i) for i in range(1, N + 1)])
        cur.execute(f"CREATE TABLE {db}.pairs (a INT, b VARCHAR(10), v BIGINT, PRIMARY KEY (a, b))")
        cur.executemany(f"INSERT INTO {db}.pairs VALUES (%s, %s, %s)",
                        [(a, b, a * 100 + i) for a in range(1, 21) for i, b in enumerate("abcde")])
    yield conn, db
    with conn.cursor() as cur:
        cur.execute(f"DROP DATABASE {db}")
    conn.close()


@pytest.fixture(scope="module")
def spark():
    s = spark_session("dblog-test-chunk-reader", conf={"spark.jars": JARS, "spark.master": "local[2]"})
    yield s
    s.stop()


def select(conn, db: str, table: TableSchema, where: str) -> list[dict]:
    with conn.cursor(pymysql.cursors.DictCursor) as cur:
        cur.execute("SET time_zone = '+00:00'")
        cur.execute(f"SELECT * FROM {db}.{table.name} WHERE {where} ORDER BY {', '.join(table.key)}")
        rows = cur.fetchall()
    for r in rows:  # pymysql gives BOOLEAN (TINYINT(1)) as 0/1
        if "flag" in r and r["flag"] is not None:
            r["flag"] = bool(r["flag"])
    return rows


def schema_for(db: str, table: TableSchema) -> TableSchema:
    return TableSchema(db, table.name, table.columns, table.key)


@pytest.mark.parametrize("to_file", [True, False], ids=["via-parquet", "arrow-to-driver"])
def test_ranges_read_exactly(mariadb, spark, tmp_path, to_file):
    """Both ways of a chunk's rows: Parquet read back (a finish in another process) and Arrow
    batches to the driver (a runner's: written once, as the snapshot)."""
    conn, db = mariadb
    table = schema_for(db, ITEMS)
    reader = SparkChunkReader(spark, StubSource(MARIADB_PORT))
    preds = ["`id` <= 250", "`id` > 250 AND `id` <= 500", "`id` > 500 AND `id` <= 750",
             "`id` > 750 AND `id` <= 1000"]
    dest = f"file://{tmp_path}/chunk"
    data = reader.read(table, preds, dest, keep_file=to_file)
    assert reader.last_stats["partitions"] == 4 and data.num_rows == N
    # Spark's own types: DATETIME naive micros; TIMESTAMP cast to naive too; exact decimals
    types = {f.name: f.type for f in data.schema}
    assert types["created"] == pa.timestamp("us") and types["ts"] == pa.timestamp("us")
    assert types["amt"] == pa.decimal128(12, 2) and types["id"] == pa.int64()
    assert types["ti"] == pa.int8() and types["si"] == pa.int16() and types["flag"] == pa.bool_()
    assert types["data"] == pa.binary() and types["doc"] == pa.string() and types["day"] == pa.date32()
    got = rows_of(table, conform_rows(table, data))
    assert got == select(conn, db, table, "1=1")
    assert got[11]["created"].microsecond == 12 * 37 % 1_000_000  # microseconds kept

    # gaps and an empty range: only the rows of the predicates
    data = reader.read(table, ["`id` > 100 AND `id` <= 200", "`id` > 600 AND `id` <= 650",
                               "`id` > 5000 AND `id` <= 6000"], dest, keep_file=to_file)
    got = rows_of(table, conform_rows(table, data))
    assert got == select(conn, db, table, "(id > 100 AND id <= 200) OR (id > 600 AND id <= 650)")
    assert len(got) == 150  # the same destination was overwritten, not added to
    assert to_file == (tmp_path / "chunk").exists()

    data = reader.read(table, ["`id` > 5000"], dest, keep_file=to_file)
    assert data.num_rows == 0 and set(data.column_names) == set(table.column_names)


def test_composite_key_ranges(mariadb, spark, tmp_path):
    conn, db = mariadb
    table = schema_for(db, PAIRS)
    reader = SparkChunkReader(spark, StubSource(MARIADB_PORT))
    preds = ["(`a`, `b`) <= (5, 'c')", "(`a`, `b`) > (5, 'c') AND (`a`, `b`) <= (12, 'a')",
             "(`a`, `b`) > (12, 'a') AND (`a`, `b`) <= (17, 'e')"]
    data = reader.read(table, preds, f"file://{tmp_path}/pairs")
    got = rows_of(table, conform_rows(table, data))
    assert got == select(conn, db, table, "(a, b) <= (17, 'e')")
    assert len(got) == 85


def test_real_mysql_source(mariadb, spark, tmp_path):
    """The same with MySQLSource's own jdbc(), jdbc_table(), plan and predicates."""
    from airflow_provider_dblog.engine.config import parse_config
    from airflow_provider_dblog.engine.sources.mysql import MySQLSource

    conn, db = mariadb
    cfg = parse_config({
        "sources": {"m": {"kind": "mysql", "host": "127.0.0.1", "port": MARIADB_PORT, "user": "root",
                          "tables": [f"{db}.items", f"{db}.pairs"]}},
        "state": {"redis_url": "redis://127.0.0.1:1/0"}, "storage": {"root": str(tmp_path)}})
    src = MySQLSource(cfg.source("m"))
    try:
        reader = SparkChunkReader(spark, src)
        for name in ("items", "pairs"):
            schema = src.table_schema(f"{db}.{name}")
            plan = src.plan_chunk(schema, None, src.max_key(schema), 10_000, 3)
            preds = src.range_predicates(schema, plan)
            data = reader.read(schema, preds, f"file://{tmp_path}/{name}")
            # to the driver as Arrow: the same table, column types and values alike
            in_memory = reader.read(schema, preds, f"file://{tmp_path}/{name}-not-kept", keep_file=False)
            assert not (tmp_path / f"{name}-not-kept").exists()
            assert in_memory.schema == data.schema
            assert in_memory.sort_by([(k, "ascending") for k in schema.key]).equals(
                data.sort_by([(k, "ascending") for k in schema.key]))
            expected = select(conn, db, schema, "1=1")
            got = rows_of(schema, conform_rows(schema, data))
            if name == "items":
                for r in expected:  # whatever the source maps BOOLEAN to, compare as Python values
                    if r["flag"] is not None and schema.column("flag").type != "bool":
                        r["flag"] = int(r["flag"])
            assert got == expected
    finally:
        src.close()
