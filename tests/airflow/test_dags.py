"""The DAGs: every file imports, the factory builds what the config says, and the
whole flow runs through Airflow (``dag.test()``, SQLite metadata) on real servers:
tail + dump + apply under a concurrent writer, a repair for a key list triggered
with params, and a repair with bad params that fails and writes nothing."""
from __future__ import annotations

import os
import runpy
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"
if str(DAGS) not in sys.path:
    sys.path.insert(0, str(DAGS))

TABLES = {
    "items": "id BIGINT PRIMARY KEY, name VARCHAR(40), price DECIMAL(10,2) NOT NULL, "
             "updated {datetime} NOT NULL, doc {json} NULL, blob_col {blob} NULL",
    "order_lines": "order_id INT NOT NULL, line VARCHAR(8) NOT NULL, qty INT NOT NULL, PRIMARY KEY (order_id, line)",
}


def tables_for(sdb) -> dict[str, str]:
    return {name: ddl.format(**sdb.types) for name, ddl in TABLES.items()}


def test_every_dag_file_imports_without_errors(airflow_db):
    from airflow.dag_processing.dagbag import DagBag
    bag = DagBag(dag_folder=str(DAGS))
    assert bag.import_errors == {}
    ids = set(bag.dag_ids)
    for expected in ("dblog_tail__shop", "dblog_dump__shop__shop__orders", "dblog_dump__shop__shop__order_items",
                     "dblog_dump__shop__shop__customers", "dblog_repair__shop", "dblog_dump_control__shop",
                     "dblog_apply__warehouse", "example_orders_report"):
        assert expected in ids, sorted(ids)


def test_factory_builds_the_dags_the_config_describes(tmp_path):
    from airflow_provider_dblog.assets import apply_alias
    from dblog_factory import build_dags
    cfg = {
        "sources": {"a": {"kind": "mysql", "host": "h", "port": 1, "user": "u", "tables": ["d.t1", "d.t2"]},
                    "b": {"kind": "mysql", "conn_id": "b_db", "tables": ["e.t3"]}},
        "targets": {"wh": {"kind": "postgres", "source": "a", "host": "h", "port": 2, "user": "u"}},
        "state": {"redis_url": "redis://r"}, "storage": {"root": str(tmp_path)},
        "airflow": {"tail_run_seconds": 30, "apply_schedule": "*/5 * * * *"},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    dags = build_dags(str(path))  # b_db is not resolvable at parse time, and need not be
    assert set(dags) == {"dblog_tail__a", "dblog_tail__b", "dblog_dump__a__d__t1", "dblog_dump__a__d__t2",
                         "dblog_dump__b__e__t3", "dblog_repair__a", "dblog_repair__b",
                         "dblog_dump_control__a", "dblog_dump_control__b", "dblog_apply__wh",
                         "dblog_verify__a"}   # b feeds no target: nothing to verify
    tail = dags["dblog_tail__a"]
    assert tail.max_active_runs == 1 and tail.tasks[0].max_seconds == 30
    assert type(tail.timetable).__name__ == "ContinuousTimetable"
    repair = dags["dblog_repair__a"]
    assert repair.params.get_param("table").schema["enum"] == ["d.t1", "d.t2"]
    assert [t.task_id for t in repair.topological_sort()] == ["create_request", "dump", "apply__wh"]
    for dag in dags.values():   # the DAG list shows what each is for
        assert dag.description, dag.dag_id
    dump = dags["dblog_dump__a__d__t1"]
    assert dump.params.validate()["request_id"] is None   # the form submits with its defaults: a new dump
    assert all(dump.params.get_param(k).schema.get("title") for k in dump.params)
    # the default dump DAG: a task group per chunk (select, deferrable HW sensor, reconcile), in order
    order = [t.task_id for t in dump.topological_sort()]
    groups = [f"chunk_{i:02d}.{step}" for i in range(1, 11) for step in ("select", "wait_hw", "reconcile")]
    assert order == ["create_request", *groups, "chunks_left", "next_run"], order
    assert dump.get_task("chunk_01.wait_hw").deferrable
    assert dump.get_task("chunk_02.select").upstream_task_ids == {"chunk_01.reconcile"}
    assert dump.get_task("chunks_left").trigger_rule == "none_failed"  # runs when the last groups skipped
    assert dump.get_task("next_run").trigger_dag_id == dump.dag_id
    # the verification: scheduled daily and from a form (issue 29), a task per target of the source
    from airflow_provider_dblog.assets import verify_asset
    from airflow_provider_dblog.operators.verify import DBLogVerifyOperator
    verify = dags["dblog_verify__a"]
    assert verify.schedule == "@daily" and verify.max_active_runs == 1
    assert verify.params.validate() == {"scope": "all", "table": "d.t1", "keys": None, "where": None,
                                        "repair": False}
    assert all(verify.params.get_param(k).schema.get("title") for k in verify.params)
    assert [t.task_id for t in verify.topological_sort()] == ["verify__wh", "equal__wh"]
    task = verify.get_task("verify__wh")
    assert isinstance(task, DBLogVerifyOperator) and task.target == "wh" and not task.fail_on_difference
    assert task.outlets == [verify_asset("wh")]
    apply = dags["dblog_apply__wh"].get_task("apply")
    assert apply.outlets == [apply_alias("wh")]   # events for the changed tables only
    with pytest.raises(ValueError, match="unknown airflow option"):
        cfg["airflow"]["tail_seconds"] = 1
        path.write_text(yaml.safe_dump(cfg))
        build_dags(str(path))
    del cfg["airflow"]["tail_seconds"]


@pytest.mark.parametrize("options, words", [
    ({"dump_dag": "mapped"}, "dump_dag must be one of"),
    ({"chunks_per_run": 0}, "chunks_per_run must be a whole number"),
    ({"chunks_per_run": "3"}, "chunks_per_run must be a whole number"),
    ({"verify_schedule": "sometimes"}, "verify_schedule must be"),
])
def test_factory_refuses_bad_airflow_options(tmp_path, options, words):
    from dblog_factory import build_dags
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(factory_config(tmp_path) | {"airflow": options}))
    with pytest.raises(ValueError, match=words):
        build_dags(str(path))


def test_the_application_dump_dag_runs_the_whole_dump_in_one_task(tmp_path):
    from dblog_factory import build_dags
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(factory_config(tmp_path) | {"airflow": {"dump_dag": "application",
                                                                           "chunks_per_run": 5}}))
    dump = build_dags(str(path))["dblog_dump__a__d__t1"]
    assert [t.task_id for t in dump.topological_sort()] == ["create_request", "dump"]
    assert dump.get_task("dump").max_chunks == 5


def test_the_control_form_proposes_the_open_requests_and_takes_a_typed_id(tmp_path, redis_prefix):
    from airflow_provider_dblog.engine.state import RedisState
    from dblog_factory import build_dags
    from helpers import REDIS_PORT
    url = f"redis://127.0.0.1:{REDIS_PORT}/0"
    state = RedisState(url, redis_prefix, "a")
    running, done = (state.create_request({"scope": "table", "tables": ["d.t1"], "keys": []}) for _ in range(2))
    state.set_request_status(running, "running")
    state.set_request_status(done, "done")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(factory_config(tmp_path) | {"state": {"redis_url": url, "prefix": redis_prefix}}))
    param = build_dags(str(path))["dblog_dump_control__a"].params.get_param("request_id")
    assert param.schema["examples"] == [running], param.schema   # read when the DAG is parsed
    assert param.schema["values_display"] == {running: f"{running} — running, table of d.t1"}
    assert "enum" not in param.schema and param.resolve("typed-id") == "typed-id"

    # Redis unreachable at parse time: no proposals, the DAG still builds
    path.write_text(yaml.safe_dump(factory_config(tmp_path) | {"state": {"redis_url": "redis://127.0.0.1:1/0"}}))
    param = build_dags(str(path))["dblog_dump_control__a"].params.get_param("request_id")
    assert "examples" not in param.schema


def factory_config(tmp_path) -> dict:
    return {"sources": {"a": {"kind": "mysql", "host": "h", "port": 1, "user": "u", "tables": ["d.t1"]}},
            "targets": {"wh": {"kind": "postgres", "source": "a", "host": "h", "port": 2, "user": "u"}},
            "state": {"redis_url": "redis://r"}, "storage": {"root": str(tmp_path)}}


# -- end to end through Airflow ----------------------------------------------------
class Flow:
    """A dblog set-up run through its DAGs: the tail DAG in its own `airflow dags test`
    process (it runs continuously in production), the rest with dag.test() here."""

    def __init__(self, setup, tail_seconds: int, airflow_home: str):
        self.setup = setup
        raw = yaml.safe_load(setup.path.read_text())
        raw["airflow"] = {"tail_run_seconds": tail_seconds}
        setup.path.write_text(yaml.safe_dump(raw))
        # dag.test() runs DAGs of the dags folder: put one file there, as a user would
        self.dag_file = Path(airflow_home) / "dags" / f"dblog_flow_{setup.db}.py"
        self.dag_file.write_text(f"# an airflow DAG file (safe mode parses files naming both)\nimport sys\nsys.path.insert(0, {str(DAGS)!r})\n"
                                 f"from dblog_factory import build_dags\n"
                                 f"globals().update(build_dags({str(setup.path)!r}))\n")
        self.dags = {k: v for k, v in runpy.run_path(str(self.dag_file)).items() if k.startswith("dblog_")}
        self.tail: subprocess.Popen | None = None

    def start_tail(self, tmp_path: Path, metadata: Path) -> None:
        """The tail DAG in its own process and Airflow home, whose metadata database is a copy
        of ``metadata`` (the ``tail_metadata`` fixture's, migrated once)."""
        home = tmp_path / "tail-home"
        home.mkdir()
        shutil.copyfile(metadata, home / "airflow.db")
        env = tail_env(home) | {"DBLOG_CONFIG": str(self.setup.path)}
        self.tail_log = open(tmp_path / "tail.log", "w")
        self.tail = subprocess.Popen([AIRFLOW, "dags", "test", "dblog_tail__src"], env=env,
                                     stdout=self.tail_log, stderr=subprocess.STDOUT)
        state = self.setup.state()
        deadline = time.monotonic() + 120
        while state.checkpoint() is None:
            assert self.tail.poll() is None, (tmp_path / "tail.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the tail DAG did not start"
            time.sleep(0.2)

    def drain(self) -> None:
        head, _ = self.setup.source().current_resume()
        state = self.setup.state()
        deadline = time.monotonic() + 120
        while not (state.checkpoint() and state.checkpoint().pos >= head):
            assert self.tail.poll() is None, "the tail DAG ended before the log was drained"
            assert time.monotonic() < deadline
            time.sleep(0.2)

    def run(self, dag_id: str, conf: dict | None = None):
        # a dump waits for its HW in the log: the tail must outlive every run (see tail_seconds)
        assert self.tail is None or self.tail.poll() is None, "the tail DAG run ended too early"
        dr = self.dags[dag_id].test(run_conf=conf or {})
        return dr, {ti.task_id: ti.state for ti in dr.get_task_instances()}

    def close(self) -> None:
        self.dag_file.unlink(missing_ok=True)
        if self.tail and self.tail.poll() is None:
            self.tail.terminate()  # the operator's on_kill: flush, checkpoint, exit
            self.tail.wait(timeout=120)

    def compare(self, table: str):
        from airflow_provider_dblog.engine.targets import target_table_name
        from airflow_provider_dblog.engine.verify import compare_source_target
        cfg = self.setup.config
        schema = self.setup.source().table_schema(f"{self.setup.db}.{table}")
        return compare_source_target(cfg.source(), cfg.target(), schema, target_table_name(schema))


AIRFLOW = str(Path(sys.executable).parent / "airflow")


def tail_env(home: Path) -> dict:
    """The environment of the tail's own Airflow (its home, SQLite metadata, the repo's DAGs)."""
    return os.environ | {"AIRFLOW_HOME": str(home), "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
                         "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db"}


@pytest.fixture(scope="module")
def tail_metadata(tmp_path_factory) -> Path:
    """A migrated metadata database for the tail processes, made once (``airflow db migrate``
    takes seconds); each test's tail home gets a fresh copy of it."""
    home = tmp_path_factory.mktemp("tail-home-template")
    subprocess.run([AIRFLOW, "db", "migrate"], env=tail_env(home), check=True, capture_output=True, timeout=300)
    return home / "airflow.db"


# rows: the dump (chunks of 1000, DBLogSetup) makes several windows per table under the writer
ITEMS, LINES = 5_000, 1_500


def fill(setup, rows: int = ITEMS) -> None:
    sdb = setup.sdb
    setup.execute(f"""INSERT INTO items SELECT seq, CONCAT('item', seq), (seq % 1000) / 4.0,
                      {sdb.ts_plus_seconds('seq')},
                      CASE WHEN seq % 3 = 0 THEN NULL ELSE {sdb.json_object('n', 'seq')} END,
                      CASE WHEN seq % 2 = 0 THEN NULL ELSE {sdb.md5_bytes('seq')} END
                      FROM {sdb.series(rows)}""")
    setup.execute("INSERT INTO order_lines SELECT FLOOR(seq / 3), CONCAT('L', seq % 3), seq % 7 "
                  f"FROM {sdb.series(LINES)}")


def writer(setup, stop: threading.Event, count: list) -> None:
    import random
    sdb = setup.sdb
    rng = random.Random(3)
    with sdb.cursor() as cur:
        while not stop.is_set():
            k = rng.randint(1, ITEMS + ITEMS // 20)
            op = rng.random()
            if op < 0.5:
                cur.execute(f"UPDATE items SET price = price + 1, updated = {sdb.now} WHERE id = %s", (k,))
            elif op < 0.7:
                cur.execute("DELETE FROM items WHERE id = %s", (k,))
            elif op < 0.9:  # replace the row
                cur.execute("BEGIN")
                cur.execute("DELETE FROM items WHERE id = %s", (k,))
                cur.execute(f"INSERT INTO items VALUES (%s, 'again', 2.5, {sdb.now}, '{{\"x\": 1}}', NULL)", (k,))
                cur.execute("COMMIT")
            else:
                cur.execute("UPDATE order_lines SET qty = qty + 1 WHERE order_id = %s", (k % (LINES // 3),))
            count[0] += 1
            time.sleep(0.003)


@pytest.mark.parametrize("setup_kind", ["mariadb", "postgres"])
def test_tail_dump_apply_repair_through_airflow(airflow_db, tail_metadata, dblog_setup, setup_kind, tmp_path):
    from sourcedb import KINDS
    setup = dblog_setup(tables_for(KINDS[setup_kind]))
    fill(setup)
    # one tail run must cover the whole flow (about 5 min on a loaded 2-core CI machine);
    # close() stops it early through the operator's on_kill
    flow = Flow(setup, tail_seconds=3600, airflow_home=airflow_db)
    try:
        run_flow(flow, setup, tmp_path, tail_metadata)
    finally:
        flow.close()


def watermark_row(setup) -> list:
    with setup.sdb.cursor() as cur:
        cur.execute(f"SELECT value, updated_at FROM {setup.wm_ns}.watermark")
        return cur.fetchall()


def run_flow(flow, setup, tmp_path, metadata):
    flow.start_tail(tmp_path, metadata)
    stop, count = threading.Event(), [0]
    w = threading.Thread(target=writer, args=(setup, stop, count), daemon=True)
    w.start()
    try:
        # a full dump of both tables, through the repair DAG's form (scope: all)
        dr, states = flow.run("dblog_repair__src", {"scope": "all", "table": f"{setup.db}.items"})
        assert states == {"create_request": "success", "dump": "success", "apply__tgt": "success"}, states
    finally:
        stop.set()
        w.join()
    assert count[0] > 50
    flow.drain()
    dr, states = flow.run("dblog_apply__tgt")
    assert states == {"apply": "success"}
    for table in TABLES:
        diff = flow.compare(table)
        assert diff.equal, diff.describe()

    # corrupt rows in the target; repair exactly those keys from the form
    from airflow_provider_dblog.engine.targets import target_table_name
    target = setup.target()
    items = target_table_name(setup.source().table_schema(f"{setup.db}.items"))
    lines = target_table_name(setup.source().table_schema(f"{setup.db}.order_lines"))
    with target.conn.cursor() as cur:
        # two rows that exist (the writer deletes rows at random, thousands on a fast source)
        cur.execute(f'SELECT id FROM "public"."{items}" ORDER BY id LIMIT 2')
        keys = [r[0] for r in cur.fetchall()]
        cur.execute(f'UPDATE "public"."{items}" SET name = \'corrupt\' WHERE id IN (%s, %s)', keys)
        cur.execute(f'DELETE FROM "public"."{lines}" WHERE order_id = 5 AND line = \'L1\'')
    target.conn.commit()
    assert not flow.compare("items").equal and not flow.compare("order_lines").equal
    dr, states = flow.run("dblog_repair__src", {"scope": "keys", "table": f"{setup.db}.items",
                                                "keys": "\n".join(map(str, keys))})
    assert states["apply__tgt"] == "success", states
    dr, states = flow.run("dblog_repair__src", {"scope": "keys", "table": f"{setup.db}.order_lines",
                                                "keys": "5, L1"})
    assert states["apply__tgt"] == "success", states
    flow.drain()
    for table in TABLES:
        diff = flow.compare(table)
        assert diff.equal, diff.describe()

    # bad params: a clear failure, and nothing written to the source or Redis
    state = setup.state()
    head = setup.source().current_resume()[0]
    watermark_before = watermark_row(setup)
    requests_before = state.requests(100)
    for conf, words in (({"scope": "keys", "table": f"{setup.db}.items", "keys": "abc"}, "not an integer"),
                        ({"scope": "where", "table": f"{setup.db}.items", "where": "id = 1; DROP TABLE items"},
                         "unexpected ';'")):
        dr, states = flow.run("dblog_repair__src", conf)
        assert states["create_request"] == "failed", states
        assert states["dump"] in ("upstream_failed", "skipped", None), states
        # the message the task failed with, as the task log shows it
        from airflow_provider_dblog.exceptions import DBLogInvalidRequest
        create = flow.dags["dblog_repair__src"].get_task("create_request")
        with pytest.raises(DBLogInvalidRequest, match=words):
            create.execute({"params": {"chunk_size": None, "parallelism": None, "where": "", "keys": ""} | conf})
    if setup.sdb.kind == "mysql":  # (PostgreSQL's WAL is shared by the whole cluster)
        assert setup.source().current_resume()[0] == head
    assert watermark_row(setup) == watermark_before
    assert state.requests(100) == requests_before
