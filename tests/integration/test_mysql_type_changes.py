"""A property on the server (issue 27): for random MODIFY type changes of a MariaDB column
holding random values, run in strict mode or not, whenever the engine lets the change
flow (the tail's own decision: ``schema_evolution.version_evolution`` of the versions the
source describes before and after, with the statement's strictness), every value the
column held is unchanged by the server. A change that rounded, clamped, stripped or
emptied a value must quarantine the table instead.

Values are compared as the server prints them, normalised only where the type's print
form differs for the same value (0.50 / 0.5, trailing fraction zeros).
"""
from __future__ import annotations

import random
from decimal import Decimal, InvalidOperation

import pymysql
import pytest

from airflow_provider_dblog.engine.config import Endpoint, SourceConfig
from airflow_provider_dblog.engine.errors import DBLogError
from airflow_provider_dblog.engine.schema_history import as_stored
from airflow_provider_dblog.engine.schema_evolution import version_evolution
from airflow_provider_dblog.engine.sources.mysql.source import MySQLSource
from helpers import MARIADB_PORT, mysql_connect

# a type and values it holds (SQL literals)
POOL = {
    "tinyint": ["0", "127", "-128", "5"], "smallint": ["300", "-300", "0"], "int": ["-1000", "70000", "0"],
    "int unsigned": ["0", "4000000000", "7"], "bigint": ["-5000000000", "12"],
    "decimal(10,2)": ["12.34", "-0.50", "99999999.99"], "decimal(12,3)": ["1.234", "-123456789.123"],
    "decimal(8,1)": ["1.5", "-1234567.8"], "float": ["1.5", "-2.25"], "double": ["1.23456", "-1e10"],
    "double(6,1)": ["12.5", "-3.0"], "float(5,2)": ["1.25", "-99.5"],
    "varchar(5)": ["'ab'", "'abcde'", "'ab  '"], "varchar(20)": ["'hello world'", "'x  '", "''"],
    "char(10)": ["'abc'", "'  lead'"], "char(3)": ["'xyz'"], "text": ["'long text here'", "'t  '"],
    "tinytext": ["'tiny'"], "datetime": ["'2024-01-01 10:00:00'"], "datetime(3)": ["'2024-01-01 10:00:00.123'"],
    "datetime(6)": ["'2024-01-01 10:00:00.987654'", "'2024-01-01 10:00:00.5'"],
    "time": ["'10:00:00'", "'-838:59:59'"], "time(6)": ["'10:00:00.900000'"],
    "timestamp(6) null": ["'2024-01-01 10:00:00.987654'"], "timestamp(2) null": ["'2024-01-01 10:00:00.25'"],
    "enum('a','b')": ["'a'", "'b'"], "enum('a','b','c')": ["'c'", "'a'"], "set('x','y')": ["'x,y'", "'y'"],
    "varbinary(8)": ["'ab'"], "binary(8)": ["'ab'"],
}


FAMILIES = [["tinyint", "smallint", "int", "int unsigned", "bigint"], ["decimal(10,2)", "decimal(12,3)", "decimal(8,1)"],
            ["float", "double", "double(6,1)", "float(5,2)"],
            ["varchar(5)", "varchar(20)", "char(10)", "char(3)", "text", "tinytext", "enum('a','b','c')"],
            ["datetime", "datetime(3)", "datetime(6)"], ["time", "time(6)"], ["timestamp(6) null", "timestamp(2) null"],
            ["enum('a','b')", "enum('a','b','c')", "set('x','y')"], ["varbinary(8)", "binary(8)"]]


def _norm(text):
    if text is None:
        return None
    if isinstance(text, bytes):
        return text
    try:
        return Decimal(text).normalize()
    except InvalidOperation:
        pass
    if len(text) > 19 and text[19:20] == "." or (":" in text and "." in text):
        text = text.rstrip("0").rstrip(".")   # 10:00:00.500000 / 10:00:00.5
    return text


def _source(db: str, ns: str) -> MySQLSource:
    return MySQLSource(SourceConfig(name="src", kind="mysql", endpoint=Endpoint("127.0.0.1", MARIADB_PORT, "root", ""),
                                    tables=(f"{db}.t",), server_id=4242, watermark_namespace=ns))


@pytest.mark.parametrize("seed", range(3))
def test_a_type_change_the_engine_lets_flow_kept_every_value(mysql_db, seed):
    rng = random.Random(seed)
    conn = mysql_connect(mysql_db)
    flowed = quarantined = failed = 0
    types = list(POOL)
    try:
        for i in range(80):
            old = rng.choice(types)
            # mostly within a kind of type (where changes may flow), sometimes across
            near = [t for f in FAMILIES if old in f for t in f]
            new = rng.choice(near if rng.random() < 0.7 else types)
            strict = rng.random() < 0.5
            with conn.cursor() as cur:
                cur.execute("DROP TABLE IF EXISTS t")
                cur.execute(f"CREATE TABLE t (id INT PRIMARY KEY, c {old})")
                values = rng.sample(POOL[old], min(len(POOL[old]), 3))
                for k, v in enumerate(values):
                    cur.execute(f"INSERT INTO t VALUES ({k}, {v})")
                cur.execute("SELECT id, CAST(c AS CHAR) FROM t ORDER BY id")
                before = {k: _norm(v) for k, v in cur.fetchall()}
            src = _source(mysql_db, "wm_unused")
            try:
                previous = as_stored(src.describe_table(f"{mysql_db}.t"))
            except DBLogError:
                continue   # a type the engine refuses to carry at all
            with conn.cursor() as cur:
                cur.execute("SET SESSION sql_mode = %s", ("STRICT_TRANS_TABLES" if strict else "",))
                try:
                    cur.execute(f"ALTER TABLE t MODIFY c {new}")
                except pymysql.MySQLError:
                    failed += 1      # the server refused: nothing changed
                    continue
                finally:
                    cur.execute("SET SESSION sql_mode = DEFAULT")
                cur.execute("SELECT id, CAST(c AS CHAR) FROM t ORDER BY id")
                after = {k: _norm(v) for k, v in cur.fetchall()}
            try:
                src.refresh_schema(f"{mysql_db}.t")
                version = as_stored(src.describe_table(f"{mysql_db}.t"))
            except DBLogError:
                quarantined += 1   # the new type is refused: the table stops (tested elsewhere)
                continue
            version |= {} if strict else {"non_strict": True}
            ev = version_evolution(previous, version)
            changed = {k: (before[k], after.get(k)) for k in before if before[k] != after.get(k)}
            if ev.compatible:
                flowed += 1
                # a flowing change to another logical type converts values; the same value
                # must come out (as the server prints it, normalised)
                assert not changed, (old, new, "strict" if strict else "non-strict", changed, ev.describe())
            else:
                quarantined += 1
    finally:
        conn.close()
    assert flowed > 5 and quarantined > 5, (flowed, quarantined, failed)
