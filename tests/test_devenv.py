"""Fast checks of the private dev servers (airflow_provider_dblog.devenv.servers).

Uses the real servers; start() is idempotent, so this only starts what is not
running yet and leaves everything running for the other tests.
"""

from __future__ import annotations

import os
import socket
import time
import uuid

import psycopg2
import pymysql
import pytest
import redis

from airflow_provider_dblog.devenv import servers

pytestmark = pytest.mark.skipif(
    os.environ.get("DBLOG_TEST_EXTERNAL_SERVERS") == "1",
    reason="tests of the private dev servers; DBLOG_TEST_EXTERNAL_SERVERS=1 uses other servers",
)

@pytest.fixture(scope="module")
def info() -> dict:
    return servers.start()


@pytest.fixture()
def mysql_conn(info):
    m = info["mariadb"]
    conn = pymysql.connect(host=m["host"], port=m["port"], user=m["user"], password=m["password"], autocommit=True)
    yield conn
    conn.close()


def test_ports_are_private(info):
    assert {name: i["port"] for name, i in info.items()} == {
        "mariadb": servers.MARIADB_PORT,
        "postgres": servers.POSTGRES_PORT,
        "redis": servers.REDIS_PORT,
    }
    assert {servers.MARIADB_PORT, servers.POSTGRES_PORT, servers.REDIS_PORT}.isdisjoint({3306, 5432, 6379})
    assert all(i["host"] == "127.0.0.1" for i in info.values())


def test_mariadb_binlog_settings(mysql_conn):
    with mysql_conn.cursor() as cur:
        cur.execute("SHOW VARIABLES WHERE Variable_name IN "
                    "('log_bin', 'binlog_format', 'binlog_row_image', 'binlog_row_metadata', 'time_zone')")
        variables = dict(cur.fetchall())
        cur.execute("SHOW MASTER STATUS")
        status = cur.fetchone()
    assert variables == {
        "log_bin": "ON",
        "binlog_format": "ROW",
        "binlog_row_image": "FULL",
        "binlog_row_metadata": "FULL",
        "time_zone": "+00:00",
    }
    assert status is not None and status[0].startswith("binlog.")


def test_binlog_readable_as_root(info, mysql_conn):
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.row_event import WriteRowsEvent

    schema = f"devenv_{uuid.uuid4().hex[:8]}"
    m = info["mariadb"]
    with mysql_conn.cursor() as cur:
        cur.execute("SHOW MASTER STATUS")
        log_file, log_pos = cur.fetchone()[:2]
        cur.execute(f"CREATE DATABASE {schema}")
        try:
            cur.execute(f"CREATE TABLE {schema}.t (id INT PRIMARY KEY, name VARCHAR(20), payload BLOB)")
            cur.execute(f"INSERT INTO {schema}.t VALUES (1, 'héllo', x'00ff')")
            stream = BinLogStreamReader(
                connection_settings={"host": m["host"], "port": m["port"], "user": "root", "password": ""},
                server_id=4000 + uuid.uuid4().int % 1000,
                log_file=log_file,
                log_pos=log_pos,
                resume_stream=True,
                blocking=False,
                is_mariadb=False,
                only_events=[WriteRowsEvent],
                only_schemas=[schema],
            )
            try:
                rows = [row["values"] for event in stream for row in event.rows]
            finally:
                stream.close()
        finally:
            cur.execute(f"DROP DATABASE IF EXISTS {schema}")
    # binlog_row_metadata=FULL gives real column names and typed values
    assert rows == [{"id": 1, "name": "héllo", "payload": b"\x00\xff"}]


def test_postgres_wal_level_logical(info):
    p = info["postgres"]
    conn = psycopg2.connect(host=p["host"], port=p["port"], user=p["user"], dbname=p["dbname"])
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW wal_level")
            assert cur.fetchone()[0] == "logical"
            cur.execute("SHOW max_replication_slots")
            assert int(cur.fetchone()[0]) >= 10
            cur.execute("SHOW TimeZone")
            assert cur.fetchone()[0] == "UTC"
    finally:
        conn.close()


def test_redis_appendonly(info):
    r = redis.Redis.from_url(info["redis"]["url"])
    try:
        assert r.ping()
        assert r.config_get("appendonly") == {"appendonly": "yes"}
        assert r.config_get("save") == {"save": ""}
    finally:
        r.close()


def test_start_is_idempotent_and_fast(info):
    t0 = time.monotonic()
    again = servers.start()
    elapsed = time.monotonic() - t0
    assert elapsed < 5, f"second start took {elapsed:.2f}s"
    assert all(i["already_running"] for i in again.values())
    for name in servers.SERVERS:
        assert again[name]["port"] == info[name]["port"]
        assert again[name]["pid"] == servers.status()[name]["pid"]


def test_status_reports_running(info):
    st = servers.status()
    for name in servers.SERVERS:
        assert st[name]["running"] and st[name]["answering"], st[name]
        with socket.create_connection(("127.0.0.1", st[name]["port"]), timeout=2):
            pass


def test_stop_of_unknown_server_is_rejected():
    with pytest.raises(ValueError):
        servers.stop(["nosuchserver"])
