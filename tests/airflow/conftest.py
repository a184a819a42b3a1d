"""Airflow set-up for the provider's tests: a private AIRFLOW_HOME with SQLite metadata.

The environment is set by tests/conftest.py, before anything imports Airflow
(Airflow reads its configuration once, at import). Tests that need the
metadata database (``dag.test()``) ask for the ``airflow_db`` fixture, which runs
``airflow db migrate`` once per session.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

_HOME = os.environ["AIRFLOW_HOME"]  # set by tests/conftest.py before Airflow is imported

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def airflow_db():
    """The metadata database, migrated once (about 4 s with SQLite)."""
    airflow = str(Path(sys.executable).parent / "airflow")
    subprocess.run([airflow, "db", "migrate"], check=True, env=os.environ.copy(),
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=300)
    return _HOME


class DBLogSetup:
    """A dblog config for one test: a fresh source namespace (tests/sourcedb.py: MariaDB
    by default) with the given tables, a PostgreSQL target database, a Redis prefix and
    a storage root (all removed afterwards)."""

    def __init__(self, sdb, tables: dict[str, str], tmp_path: Path, redis_prefix: str):
        import time

        import yaml

        from helpers import POSTGRES_PORT, REDIS_PORT, unique

        self.sdb = sdb
        self.db = sdb.name
        self.wm_ns = unique("wm")
        self.target_db = unique("tgt")
        with sdb.cursor() as cur:
            for name, ddl in tables.items():
                sdb.create_table(cur, name, ddl)
        raw = {
            "sources": {"src": sdb.source_config(list(tables), self.wm_ns,
                                                 7000 + int(time.time() * 1000) % 100000)},
            "targets": {"tgt": {"kind": "postgres", "source": "src", "host": "127.0.0.1",
                                "port": POSTGRES_PORT, "user": "postgres", "database": self.target_db}},
            "state": {"redis_url": f"redis://127.0.0.1:{REDIS_PORT}/0", "prefix": redis_prefix},
            "storage": {"root": str(tmp_path / "storage")},
            "spark": {"master": "local[2]"},
            "dump": {"chunk_size": 1000, "parallelism": 2, "window_timeout_s": 60},
            "tail": {"flush_events": 1000, "flush_seconds": 0.2, "lease_seconds": 10},
        }
        self.path = tmp_path / "dblog.yaml"
        self.path.write_text(yaml.safe_dump(raw))
        self.tables = [f"{self.db}.{t}" for t in tables]

    @property
    def config(self):
        from airflow_provider_dblog.engine.config import load_config
        return load_config(self.path)

    def state(self):
        from airflow_provider_dblog.engine.state import RedisState
        cfg = self.config
        return RedisState(cfg.redis_url, cfg.state_prefix, "src")

    def source(self):
        from airflow_provider_dblog.engine.sources import open_source
        return open_source(self.config.source())

    def target(self, name: str | None = None):
        from airflow_provider_dblog.engine.targets import open_target
        return open_target(self.config.target(name))

    def execute(self, sql: str, args=None) -> None:
        with self.sdb.cursor() as cur:
            cur.execute(sql, args)

    def close(self) -> None:
        from helpers import pg_connect
        self.sdb.drop_namespace(self.wm_ns)
        conn = pg_connect()
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{self.target_db}" WITH (FORCE)')
        conn.close()


@pytest.fixture
def setup_kind():
    """The source kind of ``dblog_setup`` (override with parametrize("setup_kind", [...]))."""
    return "mariadb"


@pytest.fixture
def dblog_setup(setup_kind, servers, tmp_path, redis_prefix):
    """``make(tables={"items": "id INT PRIMARY KEY, v VARCHAR(20)"})`` -> DBLogSetup."""
    from sourcedb import KINDS
    sdb = KINDS[setup_kind]()
    made: list[DBLogSetup] = []

    def make(tables: dict[str, str]) -> DBLogSetup:
        s = DBLogSetup(sdb, tables, tmp_path, redis_prefix)
        made.append(s)
        return s
    yield make
    try:
        for s in made:
            s.close()
    finally:
        sdb.close()


class FakeTI:
    """The little of a task instance that ``operator.execute(context)`` uses here."""

    def __init__(self, dag_id: str = "test_dag", task_id: str = "task"):
        self.dag_id, self.task_id = dag_id, task_id
        self.xcom: dict[str, object] = {}

    def xcom_push(self, key: str, value) -> None:
        self.xcom[key] = value


@pytest.fixture
def context():
    """A minimal task context for ``operator.execute(context)``."""
    from airflow.sdk.execution_time.context import OutletEventAccessors
    return {"ti": FakeTI(), "outlet_events": OutletEventAccessors()}


# -- a running Airflow (airflow_provider_dblog/devenv/running_airflow.py) with dblog's DAGs for one test set-up ----------
RUNNING_TABLES = {"items": "id BIGINT PRIMARY KEY, name VARCHAR(40), price DECIMAL(10,2) NOT NULL",
                  "chunked": "id INT PRIMARY KEY, v INT NOT NULL"}
TAIL_RUN_SECONDS = 20  # each run of the continuous tail DAG; a paused tail stops within this

DBLOG_DAGS = '''# an airflow DAG file (safe mode parses files naming both): the factory's DAGs for the test config
import sys
sys.path.insert(0, {dags!r})
from dblog_factory import build_dags
globals().update(build_dags({config!r}))
'''

CHUNK_DAG = '''# an airflow DAG: one chunk of a key-list dump, the HW sensor deferring to the triggerer
import datetime as dt
from airflow.sdk import DAG
from airflow_provider_dblog.operators.chunk import DBLogChunkDumpOperator
from airflow_provider_dblog.operators.dump import DBLogCreateDumpOperator
from airflow_provider_dblog.operators.reconcile import DBLogReconcileOperator
from airflow_provider_dblog.sensors.watermark import DBLogHighWatermarkSensor

with DAG("dblog_test_chunk", schedule=None, start_date=dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc),
         catchup=False):
    create = DBLogCreateDumpOperator(task_id="create_request", config_path={config!r}, scope="keys",
                                     table={table!r}, keys="1\\n2\\n3")
    chunk = DBLogChunkDumpOperator(task_id="chunk", config_path={config!r}, request_id=create.output)
    hw = DBLogHighWatermarkSensor(task_id="wait_hw", config_path={config!r}, window=chunk.output,
                                  poll_interval=0.5, deferrable=True)
    reconcile = DBLogReconcileOperator(task_id="reconcile", config_path={config!r}, chunk=chunk.output)
    create >> chunk >> hw >> reconcile
'''

CONSUMER_DAG = '''# an airflow DAG scheduled on dblog's Asset of one table (as dags/example_downstream.py)
import datetime as dt
from airflow.sdk import DAG, task
from airflow_provider_dblog.assets import table_asset

with DAG("dblog_test_consumer", schedule=[table_asset("src", {table!r})],
         start_date=dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc), catchup=False):
    @task
    def consume():
        pass
    consume()
'''


class Deployment:
    """A running Airflow (``api``: its REST client) serving dblog's DAGs for ``setup``."""

    def __init__(self, airflow, setup: DBLogSetup):
        self.airflow, self.api, self.setup = airflow, airflow.api, setup
        self.items, self.chunked = setup.tables
        self.tail_run_seconds = TAIL_RUN_SECONDS

    def drain(self, timeout: float = 120) -> None:
        """Wait until the tail's checkpoint is at the source's log head (as of now)."""
        from helpers import wait_until
        source = self.setup.source()
        try:
            head, _ = source.current_resume()
        finally:
            source.close()
        state = self.setup.state()
        wait_until(lambda: state.checkpoint() and state.checkpoint().pos >= head, timeout,
                   f"the tail DAG read the log up to {head}", poll=0.2)

    def target_items(self) -> str:
        """The quoted target table of ``items``."""
        from airflow_provider_dblog.engine.targets import target_table_name
        source = self.setup.source()
        try:
            return f'"public"."{target_table_name(source.table_schema(self.items))}"'
        finally:
            source.close()

    def damage_items(self, corrupt_id: int, delete_id: int) -> None:
        """Damage the target behind the source's back: one row changed, one deleted."""
        table, target = self.target_items(), self.setup.target("tgt")
        try:
            with target.conn.cursor() as cur:
                cur.execute(f"UPDATE {table} SET name = 'corrupt' WHERE id = %s", (corrupt_id,))
                cur.execute(f"DELETE FROM {table} WHERE id = %s", (delete_id,))
            target.conn.commit()
        finally:
            target.conn.close()

    def compare(self, table: str, target: str = "tgt"):
        from airflow_provider_dblog.engine.targets import target_table_name
        from airflow_provider_dblog.engine.verify import compare_source_target
        cfg = self.setup.config
        source = self.setup.source()
        try:
            schema = source.table_schema(table)
        finally:
            source.close()
        return compare_source_target(cfg.source(), cfg.target(target), schema, target_table_name(schema))


@contextlib.contextmanager
def deployed(tmp_path_factory, apply_schedule, name: str = "running-airflow", extra_dags=True, lake=False):
    """A running Airflow serving dblog's DAGs for a fresh MariaDB set-up with ``RUNNING_TABLES`` (tail runs
    of ``TAIL_RUN_SECONDS``, the apply DAGs on ``apply_schedule``), with ``lake`` a Delta target ``lake`` (and
    changelog tables) beside ``tgt``, with ``extra_dags`` a chunk DAG with the deferrable HW sensor and a DAG
    scheduled on the ``items`` Asset. Every DAG starts paused. Everything is removed afterwards."""
    import redis
    import yaml

    from airflow_provider_dblog.devenv.running_airflow import RunningAirflow
    from helpers import REDIS_PORT, unique
    from sourcedb import MariaDB

    root = tmp_path_factory.mktemp(name)
    prefix = unique("dblogtest")
    sdb = MariaDB()
    setup = DBLogSetup(sdb, RUNNING_TABLES, root, prefix)
    airflow = None
    try:
        raw = yaml.safe_load(setup.path.read_text())
        # chunked dump DAGs (the default) with two chunk groups per run, to show a run continue
        raw["airflow"] = {"tail_run_seconds": TAIL_RUN_SECONDS, "apply_schedule": apply_schedule,
                          "chunks_per_run": 2, "maintain_schedule": None,   # maintenance and
                          "verify_schedule": None}   # verification only when triggered
        if lake:
            raw["targets"]["lake"] = {"kind": "delta", "source": "src", "path": str(root / "lake"), "changelog": True}
        raw["dump"]["window_timeout_s"] = 300  # the deferral test holds the tail back a while
        setup.path.write_text(yaml.safe_dump(raw))
        setup.execute("INSERT INTO chunked SELECT seq, 0 FROM seq_1_to_50")
        dags = root / "dags"
        dags.mkdir()
        config, (items, chunked) = str(setup.path), setup.tables
        (dags / "dblog_dags.py").write_text(DBLOG_DAGS.format(dags=str(Path(__file__).parents[2] / "dags"),
                                                              config=config))
        if extra_dags:
            (dags / "dblog_chunk.py").write_text(CHUNK_DAG.format(config=config, table=chunked))
            (dags / "dblog_consumer.py").write_text(CONSUMER_DAG.format(table=items))
        home = root / "home"
        home.mkdir()
        airflow = RunningAirflow(home, dags)
        airflow.start()
        yield Deployment(airflow, setup)
    finally:
        if airflow is not None:
            airflow.stop()  # before the databases go: the tail task reads the source to the end
        try:
            setup.close()
        finally:
            sdb.close()
            r = redis.Redis(host="127.0.0.1", port=REDIS_PORT)
            keys = list(r.scan_iter(match=f"{prefix}:*"))
            if keys:
                r.delete(*keys)


class SharedAirflow:
    """The one ``running_airflow`` of the session, started when a test first asks for it and
    stopped as soon as the next test does not (``pytest_runtest_teardown`` below): the modules
    that use it run one after the other (``pytest_collection_modifyitems``), so it runs only
    while they do, and the rest of the suite's timings are not disturbed by it."""

    def __init__(self, tmp_path_factory):
        self.tmp_path_factory = tmp_path_factory
        self._cm = None
        self.deployment: Deployment | None = None
        self.module = None
        self.error: BaseException | None = None  # a start that failed: not tried again by every test

    def get(self, module) -> Deployment:
        if self.error is not None:
            pytest.fail(f"the shared running Airflow did not start: {self.error!r}", pytrace=False)
        if self.deployment is None:
            cm = deployed(self.tmp_path_factory, apply_schedule=None, lake=True)
            try:
                self.deployment = cm.__enter__()  # (a failed start has cleaned up after itself)
            except BaseException as e:
                self.error = e
                raise
            self._cm, self.module = cm, module
        elif module is not self.module:
            self.module = module
            self.hand_over()
        return self.deployment

    def hand_over(self) -> None:
        """Between two modules: the Airflow is healthy, and nothing the last module triggered
        still runs (a run a failed test left going must not act in the next module's tests);
        the tail DAG (each module unpauses it when it needs it) goes on."""
        from helpers import wait_until
        d = self.deployment
        # a component starved of CPU for a while reports unhealthy until its next heartbeat
        # (the triggerer skips one on purpose): healthy again within the deadline is healthy
        try:
            wait_until(d.airflow._healthy, 180, "Airflow's components report healthy", poll=1)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{d.airflow.logs()}") from None
        dags = [x["dag_id"] for x in d.api.get("/dags", limit=100)["dags"] if x["dag_id"] != "dblog_tail__src"]

        def settled():
            return all(not d.api.runs(dag_id, state=["queued", "running"]) for dag_id in dags)
        wait_until(settled, 300, "the previous module's DAG runs ended", poll=0.5)

    def stop(self) -> None:
        cm, self._cm, self.deployment, self.module, self.error = self._cm, None, None, None, None
        if cm is not None:
            cm.__exit__(None, None, None)


_SHARED: list[SharedAirflow] = []  # the session's, for the hooks below


@pytest.fixture(scope="session")
def _shared_airflow(servers, tmp_path_factory):
    shared = SharedAirflow(tmp_path_factory)
    _SHARED.append(shared)
    try:
        yield shared
    finally:
        _SHARED.remove(shared)
        shared.stop()


@pytest.fixture
def running_airflow(_shared_airflow, request):
    """One running Airflow for every test that asks for it, in any module (test_browser_forms.py,
    test_running_*.py): api-server, scheduler, dag-processor, triggerer; started for the first
    such test and stopped after the last of a run of them (``SharedAirflow``), so it never runs
    beside the rest of the suite, whose timings it would disturb. Its dags folder holds the
    factory's DAGs for a MariaDB set-up with ``RUNNING_TABLES``, targets ``tgt`` (PostgreSQL) and
    ``lake`` (Delta), tail runs of ``TAIL_RUN_SECONDS``, apply only when triggered; a chunk DAG
    with the deferrable HW sensor and a DAG scheduled on the ``items`` Asset. Every DAG starts
    paused. The tests share the set-up, each on rows of its own; between two modules, every run
    the first triggered has ended before the second's tests start."""
    return _shared_airflow.get(request.module)


def pytest_collection_modifyitems(session, config, items):
    """The tests that use ``running_airflow`` run one after another, from where the first of
    them was (each module's own order kept), so the one Airflow serves them all in one go."""
    users = [i for i in items if "running_airflow" in getattr(i, "fixturenames", ())]
    if not users:
        return
    first = items.index(users[0])
    rest = [i for i in items if "running_airflow" not in getattr(i, "fixturenames", ())]
    items[:] = rest[:first] + users + rest[first:]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After the last test of a run of ``running_airflow`` users (its own fixtures torn down),
    stop the shared Airflow: the tests after it run without it."""
    yield
    if _SHARED and "running_airflow" in getattr(item, "fixturenames", ()) and (
            nextitem is None or "running_airflow" not in getattr(nextitem, "fixturenames", ())):
        _SHARED[-1].stop()


@pytest.fixture(scope="module")
def event_airflow(servers, tmp_path_factory):
    """As ``running_airflow``, but with the shipped default ``apply_schedule: event`` (the apply
    DAG scheduled on its AssetWatcher's Asset) and only dblog's own DAGs."""
    with deployed(tmp_path_factory, apply_schedule="event", name="event-airflow", extra_dags=False) as d:
        yield d


@pytest.fixture
def deployment(running_airflow):
    """The running Airflow with its tail DAG unpaused and past its first checkpoint."""
    from helpers import wait_until
    d = running_airflow
    d.api.set_paused("dblog_tail__src", False)
    state = d.setup.state()
    wait_until(state.checkpoint, 180, "the tail DAG's first checkpoint", poll=0.5)
    return d
