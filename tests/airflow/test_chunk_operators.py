"""The one-chunk path: DBLogChunkDumpOperator -> DBLogHighWatermarkSensor -> DBLogReconcileOperator,
against the real MariaDB, Redis and Spark, with the real log tail running in a thread."""
from __future__ import annotations

import asyncio
import json
import random
import threading
import time

import pytest
import yaml
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException, TaskDeferred

from airflow_provider_dblog.engine.requests import DumpSpec, validate_spec
from airflow_provider_dblog.engine.errors import ChunkInFlightError
from airflow_provider_dblog.exceptions import DBLogWindowFailed
from airflow_provider_dblog.operators.chunk import DBLogChunkDumpOperator
from airflow_provider_dblog.operators.reconcile import DBLogReconcileOperator
from airflow_provider_dblog.sensors.watermark import DBLogHighWatermarkSensor
from helpers import TailThread, mysql_connect

TABLE_DDL = {"t": "id INT PRIMARY KEY, v INT NOT NULL"}


@pytest.fixture
def setup(dblog_setup):
    s = dblog_setup(TABLE_DDL)
    s.execute("INSERT INTO t SELECT seq, 0 FROM seq_1_to_300")
    return s


@pytest.fixture
def tail(setup):
    t = TailThread(setup).start()
    yield t
    t.stop()


def submit(setup, spec: DumpSpec) -> str:
    source = setup.source()
    try:
        spec = validate_spec(source, spec, setup.config.dump)
    finally:
        source.close()
    return setup.state().create_request(spec.to_dict())


def wait_hw(setup, out: dict, context) -> dict:
    """The sensor as Airflow runs it: execute, or defer and run the trigger inline, then resume."""
    sensor = DBLogHighWatermarkSensor(task_id="wait_hw", config_path=str(setup.path), window=out,
                                      poll_interval=0.1, timeout=60)
    try:
        return sensor.execute(context)
    except TaskDeferred as deferred:
        trigger, method = deferred.trigger, deferred.method_name

    async def first():
        gen = trigger.run()
        try:
            return (await gen.__anext__()).payload
        finally:
            await gen.aclose()
    return getattr(sensor, method)(context, asyncio.run(first()))


def one_chunk(setup, rid: str, context, **chunk_kw) -> tuple[dict, dict, dict]:
    out = DBLogChunkDumpOperator(task_id="chunk", config_path=str(setup.path), request_id=rid,
                                 **chunk_kw).execute(context)
    seen = wait_hw(setup, out, context)
    detail = DBLogReconcileOperator(task_id="reconcile", config_path=str(setup.path),
                                    chunk=out).execute(context)
    return out, seen, detail


def test_chunk_sensor_reconcile_dump_a_three_chunk_table_under_concurrent_writes(setup, tail, context):
    table = setup.tables[0]
    rid = submit(setup, DumpSpec("table", [table], chunk_size=100, parallelism=2))
    stop = threading.Event()
    writes = []

    def writer():  # updates all over the table while the chunks are read
        rnd = random.Random(7)
        with mysql_connect(setup.db) as conn, conn.cursor() as cur:
            while not stop.is_set():
                i = rnd.randint(1, 300)
                cur.execute("UPDATE t SET v = v + 1 WHERE id = %s", (i,))
                writes.append(i)
                time.sleep(0.01)
    w = threading.Thread(target=writer, daemon=True)
    w.start()
    details, outs = [], []
    try:
        for _ in range(5):
            try:
                out, seen, detail = one_chunk(setup, rid, context)
            except AirflowSkipException as e:
                assert "done" in str(e)
                break
            assert seen["window"] == out["window"]["id"] and seen["hw"] == detail["hw"]
            outs.append(out)
            details.append(detail)
        else:
            pytest.fail("the request did not finish in 3 chunks")
    finally:
        stop.set()
        w.join(10)
    state = setup.state()
    assert len(details) == 3
    assert [d["selected"] for d in details] == [100, 100, 100]
    assert [o["chunk"]["last"] for o in outs] == [False, False, True]
    assert [d["request_done"] for d in details] == [False, False, True]
    assert state.request(rid)["status"] == "done"
    assert not state.open_windows()
    closed = [json.loads(x) for x in state.r.lrange(state.k("windows_closed"), 0, -1)]
    assert sorted(c["id"] for c in closed if c["outcome"] == "done") == sorted(o["window"]["id"] for o in outs)
    progress = state.progress(rid, table)
    assert progress["done"] and progress["chunks"] == 3
    assert progress["rows"] + progress["dropped"] == 300
    assert sum(d["dropped"] for d in details) > 0, "no chunk row was dropped as stale: the writer missed every window"
    assert writes

    # the event log converges to the source: each key's latest event is its current row
    tail.drain()
    schema = setup.source().table_schema(table)
    from airflow_provider_dblog.engine.store import EventStore
    events = EventStore(setup.config.storage_root, "src").read_events(schema, None, state.checkpoint().pos)
    snap_keys = {e.key for e in events if e.op == "snapshot"}
    assert len(snap_keys) == progress["rows"]
    latest = {}
    for e in events:
        latest[e.key] = e
    with mysql_connect(setup.db) as conn, conn.cursor() as cur:
        cur.execute("SELECT id, v FROM t")
        source_rows = dict(cur.fetchall())
    assert {k[0] for k in latest} == set(source_rows)  # every row is in the log: snapshot or change
    assert {k[0]: e.after["v"] for k, e in latest.items()} == source_rows


def test_select_failure_closes_the_window_as_failed(setup, context):
    raw = yaml.safe_load(setup.path.read_text())
    raw["spark"]["jars"] = []  # no JDBC driver: the Spark select fails
    setup.path.write_text(yaml.safe_dump(raw))
    rid = submit(setup, DumpSpec("table", [setup.tables[0]], chunk_size=100))
    op = DBLogChunkDumpOperator(task_id="chunk", config_path=str(setup.path), request_id=rid)
    with pytest.raises(Exception, match="chunk_select_job") as e:
        op.execute(context)
    state = setup.state()
    assert not state.open_windows()  # nothing holds the apply frontier back
    closed = json.loads(state.r.lindex(state.k("windows_closed"), 0))
    assert closed["outcome"] == "failed" and closed["step"] == "select", closed
    req = state.request(rid)
    assert req["status"] == "failed" and req["error"], req
    assert state.progress(rid, setup.tables[0]).get("chunks", 0) == 0
    assert "Driver" in str(e.value) or "driver" in str(e.value), e.value


def test_missing_spark_connection_fails_before_the_window_opens(setup, context):
    rid = submit(setup, DumpSpec("table", [setup.tables[0]], chunk_size=100))
    op = DBLogChunkDumpOperator(task_id="chunk", config_path=str(setup.path), request_id=rid,
                                spark_conn_id="no_such_spark")
    with pytest.raises(AirflowFailException, match="no_such_spark"):
        op.execute(context)
    state = setup.state()
    assert not state.open_windows() and not state.r.exists(state.k("windows_closed"))


def test_key_list_chunk_selects_in_process_and_reports_missing_keys(setup, tail, context, monkeypatch):
    def no_spark(*a, **kw):
        raise AssertionError("a key-list chunk must not go to Spark")
    monkeypatch.setattr(DBLogChunkDumpOperator, "_select_on_spark", no_spark)
    monkeypatch.setattr("airflow_provider_dblog.operators.chunk.check_spark_connection", no_spark)
    table = setup.tables[0]
    rid = submit(setup, DumpSpec("keys", [table], keys=[[5], [6], [999]]))
    out, seen, detail = one_chunk(setup, rid, context)
    assert out["chunk"]["keys"] == [[5], [6], [999]] and out["selected"] == 2
    assert detail["rows"] == 2 and detail["missing"] == 1 and detail["request_done"]
    state = setup.state()
    assert state.request(rid)["status"] == "done"
    with pytest.raises(AirflowSkipException, match="done"):
        DBLogChunkDumpOperator(task_id="chunk", config_path=str(setup.path), request_id=rid).execute(context)
    assert state.progress(rid, table)["missing"] == [[999]]


def test_one_chunk_of_a_request_at_a_time(setup, tail, context):
    """A second chunk task of the same request does not race the one in flight; an old open
    window is taken over, and its late reconcile cannot move progress."""
    table = setup.tables[0]
    rid = submit(setup, DumpSpec("keys", [table], keys=[[1], [2], [3], [4]], chunk_size=2))
    state = setup.state()
    first = DBLogChunkDumpOperator(task_id="chunk", config_path=str(setup.path), request_id=rid).execute(context)
    with pytest.raises(ChunkInFlightError, match="in flight"):
        DBLogChunkDumpOperator(task_id="chunk", config_path=str(setup.path), request_id=rid).execute(context)
    assert state.window_is_open(first["window"]["id"])
    # a crashed run's window: taken over after `abandon_after`
    second = DBLogChunkDumpOperator(task_id="chunk", config_path=str(setup.path), request_id=rid,
                                    abandon_after=0).execute(context)
    assert second["chunk"]["keys"] == first["chunk"]["keys"] == [[1], [2]]  # the same chunk, redone
    assert not state.window_is_open(first["window"]["id"])
    with pytest.raises(DBLogWindowFailed, match="not open"):
        DBLogReconcileOperator(task_id="reconcile", config_path=str(setup.path), chunk=first).execute(context)
    with pytest.raises(DBLogWindowFailed, match="was closed"):
        wait_hw(setup, first, context)
    assert state.progress(rid, table)["done_keys"] == 0
    wait_hw(setup, second, context)
    DBLogReconcileOperator(task_id="reconcile", config_path=str(setup.path), chunk=second).execute(context)
    assert state.progress(rid, table)["done_keys"] == 2
    _, _, detail = one_chunk(setup, rid, context)
    assert detail["request_done"] and state.progress(rid, table)["done_keys"] == 4


def test_a_late_finish_of_an_abandoned_window_moves_nothing(setup, tail, context):
    """The engine guard under the operators: complete_chunk refuses a window closed meanwhile."""
    from airflow_provider_dblog.engine.dump import ChunkTask
    from airflow_provider_dblog.engine.errors import WatermarkError
    from airflow_provider_dblog.engine.windows import Window

    table = setup.tables[0]
    rid = submit(setup, DumpSpec("keys", [table], keys=[[1], [2]]))
    out = DBLogChunkDumpOperator(task_id="chunk", config_path=str(setup.path), request_id=rid).execute(context)
    wait_hw(setup, out, context)
    state = setup.state()
    window = Window.from_json(json.dumps(out["window"]))
    from airflow_provider_dblog.hooks.dblog import DBLogHook
    runner = DBLogHook(config_path=str(setup.path)).runner()
    wait = runner.state.wait_window

    def wait_then_taken_over(w, *a, **kw):  # a newer run takes over while this one reconciles
        pair = wait(w, *a, **kw)
        state.close_window(w, "abandoned")
        return pair
    runner.state.wait_window = wait_then_taken_over
    with pytest.raises(WatermarkError, match="closed before its chunk completed"):
        runner.finish_chunk(ChunkTask.from_dict(out["chunk"]), window)
    assert state.progress(rid, table)["done_keys"] == 0


def test_pause_and_cancel_skip_the_chunk(setup, context):
    rid = submit(setup, DumpSpec("table", [setup.tables[0]], chunk_size=100))
    state = setup.state()
    op = DBLogChunkDumpOperator(task_id="chunk", config_path=str(setup.path), request_id=rid)
    state.set_flag(rid, "pause")
    with pytest.raises(AirflowSkipException, match="paused"):
        op.execute(context)
    assert state.request(rid)["status"] == "paused" and not state.open_windows()
    state.set_flag(rid, "pause", False)
    state.set_flag(rid, "cancel")
    with pytest.raises(AirflowSkipException, match="cancelled"):
        op.execute(context)
    assert state.request(rid)["status"] == "cancelled"
    with pytest.raises(AirflowSkipException, match="cancelled"):
        op.execute(context)


def test_cancel_closes_the_requests_open_windows_in_either_driver(setup, context):
    """One rule for the chunk task and the dump job (DumpRunner.run): a cancelled request
    leaves no window open to hold the apply frontier back, and ends as cancelled."""
    from airflow_provider_dblog.engine.errors import DumpCancelledError
    table = setup.tables[0]
    state = setup.state()
    for driver in ("chunk task", "dump job"):
        rid = submit(setup, DumpSpec("keys", [table], keys=[[1], [2], [3]], chunk_size=1))
        out = DBLogChunkDumpOperator(task_id="chunk", config_path=str(setup.path), request_id=rid).execute(context)
        assert state.window_is_open(out["window"]["id"])  # a chunk in flight (or left by a crash)
        state.set_flag(rid, "cancel")
        if driver == "chunk task":
            with pytest.raises(AirflowSkipException, match="cancelled"):
                DBLogChunkDumpOperator(task_id="chunk", config_path=str(setup.path), request_id=rid).execute(context)
        else:
            from airflow_provider_dblog.hooks.dblog import DBLogHook
            runner = DBLogHook(config_path=str(setup.path)).runner()
            try:
                with pytest.raises(DumpCancelledError):
                    runner.run(rid)
            finally:
                runner.source.close()
        assert not [w for w in state.open_windows() if w.request == rid], driver
        assert state.request(rid)["status"] == "cancelled", driver
        assert state.progress(rid, table)["done_keys"] == 0


CHUNK_DAG = """
from airflow.sdk import DAG, Param

from airflow_provider_dblog.operators.chunk import DBLogChunkDumpOperator
from airflow_provider_dblog.operators.reconcile import DBLogReconcileOperator
from airflow_provider_dblog.sensors.watermark import DBLogHighWatermarkSensor

with DAG("{dag_id}", schedule=None, params={{"request_id": Param("{rid}", type="string")}}) as dag:
    chunk = DBLogChunkDumpOperator(task_id="chunk", config_path="{path}",
                                   request_id="{{{{ params.request_id }}}}")
    hw = DBLogHighWatermarkSensor(task_id="wait_hw", config_path="{path}", window=chunk.output,
                                  poll_interval=0.2, timeout=60)
    reconcile = DBLogReconcileOperator(task_id="reconcile", config_path="{path}", chunk=chunk.output)
    chunk >> hw >> reconcile
"""


def test_chained_in_a_dag_with_dag_test(setup, airflow_db, monkeypatch):
    """The three tasks wired as a DAG would: templated request id, the chunk task's XCom into
    the sensor and the reconcile, the sensor deferred and its trigger run by dag.test().

    The tail is stopped while the chunk is read, so the HW is not in the log when the sensor
    looks: it defers, and the tail comes back only once the trigger runs."""
    import runpy
    from pathlib import Path

    from airflow_provider_dblog.triggers.watermark import HighWatermarkTrigger

    TailThread(setup).start().stop()  # a checkpoint before the chunk: the restarted tail reads on from it
    tail = TailThread(setup)
    triggered = []
    run = HighWatermarkTrigger.run

    async def run_with_the_tail_back(self):
        triggered.append(self.window["id"])
        await asyncio.to_thread(tail.start)
        async for event in run(self):
            yield event
    monkeypatch.setattr(HighWatermarkTrigger, "run", run_with_the_tail_back)

    rid = submit(setup, DumpSpec("table", [setup.tables[0]], chunk_size=1000))
    dag_id = f"dblog_chunk_{setup.db}"
    dag_file = Path(airflow_db) / "dags" / f"{dag_id}.py"
    dag_file.write_text(CHUNK_DAG.format(dag_id=dag_id, rid=rid, path=str(setup.path)))
    try:
        dr = runpy.run_path(str(dag_file))["dag"].test()
    finally:
        tail.stop()
    states = {ti.task_id: ti.state for ti in dr.get_task_instances()}
    assert states == {"chunk": "success", "wait_hw": "success", "reconcile": "success"}, states
    state = setup.state()
    assert len(triggered) == 1  # the sensor deferred, and its trigger fired
    progress = state.progress(rid, setup.tables[0])
    assert progress["done"] and progress["chunks"] == 1 and progress["rows"] == 300
    assert state.request(rid)["status"] == "done" and not state.open_windows()


def test_the_chunk_select_runs_on_the_spark_connections_cluster(setup, tail, context, spark_cluster,
                                                                 tmp_path, monkeypatch):
    """The Airflow path to a cluster (issue 12): the Spark connection names a standalone
    master, and the chunk select's application registers there and runs on its executors."""
    events = tmp_path / "spark-events"
    events.mkdir()
    raw = yaml.safe_load(setup.path.read_text())
    raw["spark"] = spark_cluster.spark_conf(events)
    setup.path.write_text(yaml.safe_dump(raw))
    host, port = spark_cluster.url.rsplit(":", 1)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": host,
                                                                  "port": int(port)}))
    rid = submit(setup, DumpSpec("table", setup.tables, chunk_size=300, parallelism=2))
    out, seen, detail = one_chunk(setup, rid, context)
    assert out["spark"]["master"] == spark_cluster.url, out
    spark_cluster.assert_ran_here(events, out["spark"]["app_id"], "dblog-chunk_select_job")
    assert detail["selected"] == 300 and detail["request_done"], detail
    assert setup.state().request(rid)["status"] == "done"
