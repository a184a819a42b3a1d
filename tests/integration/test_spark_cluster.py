"""The Spark jobs on a real Spark cluster (issue 12): a standalone master and two workers of
the installed pyspark on loopback (tests/spark_cluster.py), shared by the session (tests/conftest.py).

With ``spark.master`` pointing at it, every job must run where spark-submit sends it: the
application registers with the master (its JSON status page), executors of the workers
run it (the workers' status pages), and its tasks run on those executors, not in the
driver (the application's own event log, ``spark.eventLog``). On both sources: a full
dump under a concurrent writer, the apply on Spark, and the dump's orphan sweep, after
which the target equals the source. ``dblog check --spark`` says where a probe ran.
"""
from __future__ import annotations

import sys
import threading
import time

import pytest

from airflow_provider_dblog.cli import check_spark
from airflow_provider_dblog.engine.requests import DumpSpec
from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.targets import target_table_name

ROWS = 3_000


@pytest.fixture
def on_cluster(spark_cluster, tmp_path):
    """The events directory and the config's ``spark`` section for the cluster."""
    events = tmp_path / "spark-events"
    events.mkdir()
    return events, spark_cluster.spark_conf(events)


class Writer(threading.Thread):
    """Inserts above the max key and updates and deletes below it, while the dump runs."""

    def __init__(self, sdb):
        super().__init__(daemon=True)
        self.sdb, self.n, self.error = sdb, 0, None
        self.stop = threading.Event()

    def run(self):
        try:
            with self.sdb.cursor() as cur:
                while not self.stop.is_set():
                    self.n += 1
                    cur.execute("INSERT INTO items VALUES (%s, %s)", (ROWS + self.n, f"new{self.n}"))
                    cur.execute("UPDATE items SET name = %s WHERE id = %s", (f"upd{self.n}", self.n * 7))
                    if self.n % 5 == 0:
                        cur.execute("DELETE FROM items WHERE id = %s", (self.n * 3,))
                    time.sleep(0.005)
        except BaseException as e:  # noqa: BLE001 - surfaced by the test
            self.error = e


@pytest.mark.parametrize("src_db", ["mariadb"], indirect=True)
def test_the_probe_says_where_the_jobs_run(spark_cluster, on_cluster, make_cdc, src_db, capsys):
    events, spark = on_cluster
    with src_db.cursor() as cur:
        src_db.create_table(cur, "items", "id BIGINT PRIMARY KEY, name VARCHAR(40)")
    cdc = make_cdc(["items"], spark=spark)
    probe = check_spark(cdc.cfg)
    out = capsys.readouterr().out
    assert probe is not None, out
    assert f"on {spark_cluster.url} (client mode), 2 executor(s)" in out, out
    assert "seen alike by the executors and the driver" in out
    assert {p["python"] for p in probe["executor_python"]} == {sys.executable}, probe
    spark_cluster.assert_ran_here(events, probe["app_id"], "dblog-probe_job")


def test_dump_apply_and_sweep_run_on_the_cluster(spark_cluster, on_cluster, make_cdc, src_db):
    events, spark = on_cluster
    db = src_db.name
    with src_db.cursor() as cur:
        src_db.create_table(cur, "items", "id BIGINT PRIMARY KEY, name VARCHAR(40)")
        cur.execute(f"INSERT INTO items SELECT seq, CONCAT('item', seq) FROM {src_db.series(ROWS)}")
    cdc = make_cdc(["items"], spark=spark, dump={"chunk_size": 1_000, "parallelism": 2},
                   apply={"local_max_events": 0})
    schema = cdc.source.table_schema(f"{db}.items")
    # orphans: rows only the target has (as if an old event wrote them)
    with cdc.target() as t:
        t.ensure_table(schema)
        with t.conn, t.conn.cursor() as cur:
            cur.executemany(f'INSERT INTO "public"."{target_table_name(schema)}" VALUES (%s, %s, %s)',
                            [(10**9 + i, "ghost", Position(0, 1, 0).encode()) for i in range(3)])
    cdc.start_tail()
    writer = Writer(src_db)
    writer.start()
    rid = cdc.request(DumpSpec("table", [f"{db}.items"]))
    try:
        dumped = cdc.dump_spark(rid)
    finally:
        writer.stop.set()
        writer.join()
    assert writer.error is None and writer.n > 10, writer.error
    assert dumped["status"] == "done" and dumped["chunks"] >= 3, dumped
    assert dumped["spark_master"] == spark_cluster.url, dumped
    spark_cluster.assert_ran_here(events, dumped["app_id"], "dblog-dump_job")

    cdc.drain()
    applied = cdc.apply_spark("tgt")
    assert applied["via"] == "spark", applied
    assert applied["spark_master"] == spark_cluster.url, applied
    spark_cluster.assert_ran_here(events, applied["app_id"], "dblog-apply_job")
    assert applied["tables"][f"{db}.items"]["orphans_deleted"] == 3, applied
    diff = cdc.compare("items")
    assert diff.equal, diff.describe()
