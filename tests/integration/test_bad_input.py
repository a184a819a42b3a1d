"""Bad input gets a clear error and writes nothing: not to the source, not to Redis
(on each source kind)."""
from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from airflow_provider_dblog.engine.conditions import ConditionError
from airflow_provider_dblog.engine.requests import DumpSpec
from airflow_provider_dblog.engine.errors import (ConfigError, InvalidKeyError, NoPrimaryKeyError,
                                                  SourceSetupError, UnknownTableError)
from helpers import mysql_connect


@pytest.fixture
def cdc(src_db, make_cdc):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "good", "id INT PRIMARY KEY, v INT")
        src_db.create_table(cur, "nopk", "id INT, v INT")
        cur.execute("INSERT INTO good VALUES (1, 1), (2, 2)")
    return make_cdc(["good", "nopk", "gone"])


def source_written(cdc):
    """A mark of the source's state, equal before and after only if nothing was written
    to the test's databases: the binlog events since a head that touch them (MariaDB);
    the watermark schema's tables and rows and the database's replication slots
    (PostgreSQL). Other tests' writes elsewhere on the server do not count."""
    if cdc.sdb.kind == "mysql":
        with mysql_connect() as conn, conn.cursor() as cur:
            if not hasattr(cdc, "_binlog_mark"):
                cur.execute("SHOW MASTER STATUS")
                cdc._binlog_mark = cur.fetchone()[:2]
            cur.execute("SHOW BINLOG EVENTS IN %s FROM %s", cdc._binlog_mark)
            return [e for e in cur.fetchall() if cdc.db in str(e[-1]) or cdc.wm_ns in str(e[-1])]
    with cdc.sdb.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_tables WHERE schemaname = %s", (cdc.wm_ns,))
        tables = cur.fetchall()
        cur.execute("SELECT slot_name FROM pg_replication_slots WHERE database = current_database()")
        slots = cur.fetchall()
        rows = []
        if tables[0][0]:
            cur.execute(f'SELECT * FROM "{cdc.wm_ns}".watermark')
            rows = cur.fetchall()
    return tables, slots, rows


def redis_keys(cdc) -> list:
    return list(cdc.state.r.scan_iter(match=f"{cdc.state.p}:*"))


@pytest.mark.parametrize("spec, error, words", [
    (DumpSpec("table", ["{db}.nopk"]), NoPrimaryKeyError, "no primary key"),
    (DumpSpec("table", ["{db}.gone"]), UnknownTableError, "does not exist"),
    (DumpSpec("table", ["{db}.other"]), UnknownTableError, "not configured"),
    (DumpSpec("keys", ["{db}.good"], ["abc"]), InvalidKeyError, "not an integer"),
    (DumpSpec("keys", ["{db}.good"], [[1, 2]]), InvalidKeyError, "expected 1 value"),
    (DumpSpec("keys", ["{db}.good"], []), InvalidKeyError, "at least one"),
    (DumpSpec("table", ["{db}.good"], chunk_size=0), ConfigError, "chunk_size"),
    (DumpSpec("drop", ["{db}.good"]), ConfigError, "scope"),
    (DumpSpec("all", []), NoPrimaryKeyError, "no primary key"),
    (DumpSpec("where", ["{db}.good"], where="v = 1; DROP TABLE good"), ConditionError, "unexpected ';'"),
    (DumpSpec("where", ["{db}.good"], where="v = (SELECT 1)"), ConditionError, "quoted string"),
    (DumpSpec("where", ["{db}.good"], where="nope = 1"), ConditionError, "has no column"),
    (DumpSpec("where", ["{db}.good"], where="v = 12345"), ConfigError, "no row"),
])
def test_bad_dump_requests_are_refused_before_anything_is_written(cdc, spec, error, words):
    spec = dataclasses.replace(spec, tables=[t.format(db=cdc.db) for t in spec.tables])
    head = source_written(cdc)
    with pytest.raises(error) as info:
        cdc.request(spec)
    assert words in str(info.value)
    assert source_written(cdc) == head  # no watermark, nothing else written to the source
    assert redis_keys(cdc) == []  # no request recorded


def test_cli_reports_bad_input_with_exit_code_2(cdc):
    head = source_written(cdc)
    for keys, words in (("[1, 'x']", "'x' is not an integer"),      # typed against the key
                        ("[1, 2", "the keys are not a valid JSON list")):  # not a list at all
        out = subprocess.run([sys.executable, "-m", "airflow_provider_dblog.cli", "--config", str(cdc.path),
                              "dump", "--table", f"{cdc.db}.good", "--keys", keys],
                             capture_output=True, text=True)
        assert out.returncode == 2 and words in out.stderr, out.stderr
    out = subprocess.run([sys.executable, "-m", "airflow_provider_dblog.cli", "--config", str(cdc.path),
                          "dump", "--table", f"{cdc.db}.nopk"], capture_output=True, text=True)
    assert out.returncode == 2 and "no primary key" in out.stderr
    assert source_written(cdc) == head and redis_keys(cdc) == []


def test_check_reports_each_problem_and_tail_refuses_a_bad_log_set_up(cdc):
    problems = [str(p) for p in cdc.source.check()]
    assert any("nopk" in p and "primary key" in p for p in problems), problems
    assert any("gone" in p for p in problems), problems
    if cdc.sdb.kind == "postgres":  # updates would lack their old row
        with cdc.sdb.cursor() as cur:
            cur.execute("ALTER TABLE good REPLICA IDENTITY DEFAULT")
        problems = [str(p) for p in cdc.source.check()]
        assert any("good" in p and "REPLICA IDENTITY is DEFAULT" in p for p in problems), problems
        out = subprocess.run([sys.executable, "-m", "airflow_provider_dblog.cli", "--config",
                              str(cdc.path), "tail", "--seconds", "1"], capture_output=True, text=True)
        assert out.returncode == 2 and "REPLICA IDENTITY" in out.stderr
        assert cdc.state.checkpoint() is None  # the refused tail recorded nothing
        return
    with mysql_connect() as conn, conn.cursor() as cur:
        cur.execute("SET GLOBAL binlog_format = 'STATEMENT'")
        try:
            problems = [str(p) for p in cdc.source.check()]
            assert any("binlog_format" in p and "ROW" in p for p in problems), problems
            with pytest.raises(SourceSetupError, match="binlog_format"):
                cdc.source.check_or_raise()
            out = subprocess.run([sys.executable, "-m", "airflow_provider_dblog.cli", "--config",
                                  str(cdc.path), "tail", "--seconds", "1"], capture_output=True, text=True)
            assert out.returncode == 2 and "binlog_format" in out.stderr
        finally:
            cur.execute("SET GLOBAL binlog_format = 'ROW'")
    assert cdc.state.checkpoint() is None  # the refused tail recorded nothing
