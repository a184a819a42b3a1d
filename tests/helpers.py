"""Connections and names shared by the tests (importable as ``helpers``)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psycopg2
import pymysql

MARIADB_PORT = int(os.environ.get("DBLOG_TEST_MARIADB_PORT", 13306))
POSTGRES_PORT = int(os.environ.get("DBLOG_TEST_POSTGRES_PORT", 15432))
REDIS_PORT = int(os.environ.get("DBLOG_TEST_REDIS_PORT", 16379))


def mysql_connect(database: str | None = None, **kw):
    return pymysql.connect(host="127.0.0.1", port=MARIADB_PORT, user="root", password="",
                           database=database, autocommit=True, **kw)


def pg_connect(database: str = "postgres"):
    conn = psycopg2.connect(host="127.0.0.1", port=POSTGRES_PORT, user="postgres", dbname=database)
    conn.autocommit = True
    return conn


def wait_until(predicate, timeout: float, what: str, poll: float = 0.05):
    """Poll ``predicate`` until it returns something truthy (returned), or fail saying ``what``
    did not happen within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f}s"
        time.sleep(poll)


CRASHING = Path(__file__).resolve().parent / "crashing.py"


def crash(what: str, config, marker: Path, *args: str, timeout: float = 120) -> str:
    """Run ``tests/crashing.py`` (a tail or a dump that SIGKILLs itself at a chosen point),
    wait for its death by SIGKILL, and return what it wrote to ``marker`` just before."""
    proc = subprocess.Popen([sys.executable, str(CRASHING), what, "--config", str(config),
                             "--marker", str(marker), *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"the {what} did not reach its crash point within {timeout:.0f}s") from None
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, err.decode()[-3000:])
    return marker.read_text()


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def drop_pg_database(name: str) -> None:
    """Drop a PostgreSQL database and the replication slots that would keep it alive."""
    conn = pg_connect()
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                        "WHERE database = %s AND active_pid IS NOT NULL", (name,))
            for _ in range(50):
                cur.execute("SELECT slot_name, active_pid FROM pg_replication_slots WHERE database = %s",
                            (name,))
                slots = cur.fetchall()
                if not any(pid for _, pid in slots):
                    break
                time.sleep(0.1)
            for slot, _ in slots:
                cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        conn.close()


class TailThread:
    """The real log tail in a thread of the test process (as tests/integration's CDC runs it),
    for a test set-up (``setup.config``, ``setup.state()``, ``setup.source()``)."""

    def __init__(self, setup):
        self.setup = setup
        self.cfg = setup.config
        self.state = setup.state()
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None

    def start(self) -> "TailThread":
        from airflow_provider_dblog.engine.sources import open_source
        from airflow_provider_dblog.engine.store import EventStore
        from airflow_provider_dblog.engine.tail import Tail

        def run():
            try:
                Tail(open_source(self.cfg.source()), self.state, EventStore(self.cfg.storage_root, "src"),
                     self.cfg.tail, dump=self.cfg.dump).run(should_stop=self.stop_event.is_set)
            except BaseException as e:  # surfaced by stop()
                self.error = e
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while self.state.checkpoint() is None:
            assert self.error is None, self.error
            assert time.monotonic() < deadline, "the tail did not checkpoint its start"
            time.sleep(0.05)
        return self

    def drain(self, timeout: float = 60) -> None:
        source = self.setup.source()
        head, _ = source.current_resume()
        source.close()
        deadline = time.monotonic() + timeout
        while not (self.state.checkpoint() and self.state.checkpoint().pos >= head):
            assert self.error is None, self.error
            assert time.monotonic() < deadline, f"the tail did not reach {head}"
            time.sleep(0.05)

    def stop(self) -> None:
        self.stop_event.set()
        if self.thread:
            self.thread.join(60)
        if self.error:
            raise self.error


# -- triggers --------------------------------------------------------------------------
async def first_event(trigger, timeout: float = 30):
    """The payload of a trigger's first event (the generator is closed after it)."""
    import asyncio

    gen = trigger.run()
    try:
        return (await asyncio.wait_for(gen.__anext__(), timeout)).payload
    finally:
        await gen.aclose()


def first_event_while_ticking(trigger, meanwhile) -> tuple[dict, float, int]:
    """Run ``trigger`` to its first event while ``meanwhile()`` (a coroutine function: the
    other side, e.g. the tail) runs and a ticker counts 10 ms sleeps on the same loop.
    Returns (payload, seconds waited, ticks): a loop the trigger never blocked ticks about
    ``seconds / 0.01`` times."""
    import asyncio

    async def scenario():
        ticks = 0
        stop = asyncio.Event()

        async def ticker():
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        t_tick, t_other = asyncio.create_task(ticker()), asyncio.create_task(meanwhile())
        t0 = time.monotonic()
        event = await first_event(trigger)
        waited = time.monotonic() - t0
        stop.set()
        await asyncio.gather(t_tick, t_other)
        return event, waited, ticks

    return asyncio.run(scenario())


class StuckCommit:
    """A PostgreSQL commit that is in the log but not yet visible, for as long as a test
    wants: the server waits for a synchronous standby that never answers, for the writer's
    session only (every other session of ``databases`` commits with synchronous_commit =
    local). ``start(sql, args)`` runs the statement in a thread; ``release()`` lets it
    finish (the standby requirement is dropped); always ``close()`` (or use ``with``)."""

    def __init__(self, database: str, other_databases: tuple[str, ...] = ()):
        self.database = database
        self.admin = pg_connect()
        self.thread: threading.Thread | None = None
        self.committed = threading.Event()
        with self.admin.cursor() as cur:
            for db in (database, *other_databases):
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db,))
                if not cur.fetchone():
                    cur.execute(f'CREATE DATABASE "{db}"')
                cur.execute(f'ALTER DATABASE "{db}" SET synchronous_commit = local')
            cur.execute("ALTER SYSTEM SET synchronous_standby_names = 'dblog_test_nobody'")
            cur.execute("SELECT pg_reload_conf()")

    def start(self, statement: str, args=()) -> None:
        def run():
            conn = pg_connect(self.database)
            try:
                with conn.cursor() as cur:
                    cur.execute("SET synchronous_commit = on")
                    cur.execute(statement, args)
                self.committed.set()
            finally:
                conn.close()
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def release(self) -> None:
        with self.admin.cursor() as cur:
            cur.execute("ALTER SYSTEM RESET synchronous_standby_names")
            cur.execute("SELECT pg_reload_conf()")
        if self.thread is not None:
            self.thread.join(30)
            assert self.committed.is_set(), "the stuck commit did not finish once released"

    def close(self) -> None:
        try:
            self.release()
        finally:
            self.admin.close()

    def __enter__(self) -> "StuckCommit":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def lake_target(kind: str, path, source: str = "src", **extra) -> dict:
    """A lake target's config (issue 28): a Delta table directory, or an Iceberg warehouse
    with its SQL catalog in a fresh database of the private PostgreSQL."""
    if kind == "delta":
        return {"kind": "delta", "source": source, "path": str(path), **extra}
    assert kind == "iceberg", kind
    return {"kind": "iceberg", "source": source, "path": str(path), "host": "127.0.0.1", "port": POSTGRES_PORT,
            "user": "postgres", "database": unique("ice"), "schema": "cdc", **extra}


# -- the tests' spark-submits start faster (tests/conftest.py sets SPARK_SUBMIT_OPTS) ------
# Every spark-submit of the suite is a short job on a few rows whose wall time is mostly the
# JVM starting: loading and verifying thousands of Spark classes, and compiling them twice
# (C1, then C2). For the driver JVM of the tests' jobs only (SPARK_SUBMIT_OPTS is read by
# spark-submit; the product's own settings, engine/jobs.py, are unchanged):
# - C1 only (no C2 recompiles) and the serial GC (no GC threads competing on two cores);
# - a class-data-sharing archive (JDK CDS) of the classes a job loads, mapped instead of
#   parsed: made once per JDK and Spark install by a warm-up job that does what the jobs do
#   (JDBC reads and a JDBC write, Parquet, a window, a Python worker), kept in a cache
#   directory. The JVM checks the archive against its own build and the classpath's jars and
#   ignores it on any mismatch, so it only changes how fast a class loads, never which.
# DBLOG_TEST_SPARK_CDS=0 turns the archive off; DBLOG_TEST_SPARK_JVM_OPTS replaces the flags.
SPARK_TEST_JVM_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

_CDS_WARMUP = '''
import os, sys
from pyspark.sql import SparkSession, Window, functions as F
mysql_url, pg_url, pg_table, out = sys.argv[1:5]
spark = (SparkSession.builder.appName("dblog-cds-warmup").config("spark.ui.enabled", "false")
         .config("spark.sql.session.timeZone", "UTC").config("spark.sql.shuffle.partitions", "4")
         .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS").getOrCreate())
spark.sparkContext.setLogLevel("WARN")
steps = []
def step(name, fn):
    try:
        fn()
        steps.append(name)
    except Exception as e:  # noqa: BLE001 - a step that fails only loads fewer classes
        print(f"cds warm-up step {name} failed: {e}", file=sys.stderr)
props = {"user": "root", "password": "", "driver": "org.mariadb.jdbc.Driver", "fetchsize": "100",
         "preferTimestampNTZ": "true"}
pg_props = {"user": "postgres", "password": "", "driver": "org.postgresql.Driver", "fetchsize": "100",
            "preferTimestampNTZ": "true"}
q = "(SELECT seq AS id, CONCAT('v', seq) AS v, NOW(6) AS ts, CAST(seq AS DECIMAL(38,10)) AS d FROM seq_1_to_100) AS t"
pq = "(SELECT n AS id, 'v' || n AS v, now() AS ts, n::numeric(38,10) AS d FROM generate_series(1, 100) n) AS t"
step("mysql", lambda: spark.read.jdbc(mysql_url, q, predicates=["id <= 50", "id > 50"], properties=props)
     .write.mode("overwrite").parquet(out + "/m"))
step("postgres", lambda: spark.read.jdbc(pg_url, pq, predicates=["id <= 50", "id > 50"], properties=pg_props)
     .coalesce(1).write.mode("overwrite").parquet(out + "/p"))
def window():
    df = spark.read.parquet(out + "/m").withColumn("image", F.struct("v", "d", "ts"))
    w = Window.partitionBy(F.col("id") % 7).orderBy(F.col("id").desc())
    latest = df.withColumn("rn", F.row_number().over(w)).where("rn = 1")
    latest.select(F.col("image").getField("v").alias("v"), "id").write.mode("overwrite").parquet(out + "/w")
    latest.select("id", "v").write.jdbc(pg_url, pg_table, mode="overwrite", properties=pg_props)
step("window", window)
step("python", lambda: spark.sparkContext.parallelize(range(4), 2).mapPartitions(lambda it: [sum(it)]).collect())
step("rows", lambda: spark.createDataFrame([(1, "a")], "id long, v string").collect())
spark.stop()
print("cds warm-up steps: " + ",".join(steps))
'''


def _cds_key(opts: str) -> str:
    """What an archive depends on: the JDK, the Spark jars, the flags."""
    import hashlib
    import shutil

    import importlib.util
    h = hashlib.sha256(opts.encode())
    java = os.path.realpath(shutil.which("java", path=os.path.join(os.environ["JAVA_HOME"], "bin"))
                            if os.environ.get("JAVA_HOME") else shutil.which("java") or "java")
    spec = importlib.util.find_spec("pyspark")  # (not imported: only where its jars are)
    jars = Path(spec.origin).parent / "jars" if spec and spec.origin else Path("/nonexistent")
    for p in [Path(java), *sorted(jars.glob("*.jar"))]:
        st = p.stat() if p.exists() else None
        h.update(f"{p}:{st and st.st_size}:{st and st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def spark_cds_archive(opts: str = SPARK_TEST_JVM_OPTS, build: bool = True, timeout: float = 300) -> str | None:
    """The CDS archive for spark-submit's driver JVM with ``opts`` (its path), made now if
    ``build`` and it is missing; None if it cannot be had (the tests then run without it).
    Made under a file lock (test runs side by side build it once) into a temporary file,
    renamed into place when complete. Needs the private servers (the warm-up's JDBC)."""
    import fcntl
    import tempfile

    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dblog-tests"
    archive = cache / f"spark-cds-{_cds_key(opts)}.jsa"
    if archive.exists() or not build:
        return str(archive) if archive.exists() else None
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "spark-cds.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if archive.exists():
            return str(archive)
        for part in cache.glob("spark-cds-*.jsa.part"):  # a build that died (the lock is ours now)
            part.unlink(missing_ok=True)
        # other installs' archives (another checkout's .venv, an older JDK): the newest two stay
        for old in sorted(cache.glob("spark-cds-*.jsa"), key=lambda p: p.stat().st_mtime)[:-2]:
            old.unlink(missing_ok=True)
        part = archive.with_suffix(".jsa.part")
        work = Path(tempfile.mkdtemp(prefix="dblog-cds-"))
        table = unique("dblog_cds_warmup")
        try:
            (work / "warmup.py").write_text(_CDS_WARMUP)
            from airflow_provider_dblog.engine.jobs import spark_submit_binary
            cmd = [spark_submit_binary(), "--master", "local[2]", "--driver-memory", "1g",
                   "--jars", "/usr/share/java/mariadb-java-client.jar,/usr/share/java/postgresql.jar",
                   "--conf", "spark.driver.extraJavaOptions=-Duser.timezone=UTC", str(work / "warmup.py"),
                   f"jdbc:mysql://127.0.0.1:{MARIADB_PORT}/mysql", f"jdbc:postgresql://127.0.0.1:{POSTGRES_PORT}/postgres",
                   table, str(work / "out")]
            env = {**os.environ, "SPARK_SUBMIT_OPTS": f"{opts} -XX:ArchiveClassesAtExit={part}",
                   "SPARK_LOCAL_IP": "127.0.0.1", "TZ": "UTC",
                   "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
            run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
            if run.returncode == 0 and part.exists() and part.stat().st_size > 0:
                os.replace(part, archive)
                if "cds warm-up step " in run.stderr:  # made, of fewer classes: say which steps failed
                    import warnings
                    warnings.warn("Spark CDS warm-up: " + " | ".join(
                        ln for ln in run.stderr.splitlines() if "cds warm-up step " in ln), stacklevel=2)
            else:
                import warnings
                warnings.warn(f"no Spark CDS archive (exit {run.returncode}): {run.stderr[-2000:]}", stacklevel=2)
        except (OSError, subprocess.SubprocessError) as e:
            import warnings
            warnings.warn(f"no Spark CDS archive: {e}", stacklevel=2)
        finally:
            part.unlink(missing_ok=True)
            import shutil
            shutil.rmtree(work, ignore_errors=True)
            try:
                conn = pg_connect()
                with conn.cursor() as cur:
                    cur.execute(f'DROP TABLE IF EXISTS "{table}"')
                conn.close()
            except psycopg2.Error:
                pass
    return str(archive) if archive.exists() else None


def spark_submit_opts(build_cds: bool = True) -> str:
    """SPARK_SUBMIT_OPTS for the tests' spark-submits: the flags above, plus the CDS archive
    (made if missing and ``build_cds``) unless DBLOG_TEST_SPARK_CDS=0."""
    opts = os.environ.get("DBLOG_TEST_SPARK_JVM_OPTS", SPARK_TEST_JVM_OPTS)
    archive = None
    if os.environ.get("DBLOG_TEST_SPARK_CDS") != "0":
        try:
            archive = spark_cds_archive(opts, build=build_cds)
        except Exception as e:  # noqa: BLE001 - only slower without it (an unwritable cache, no java)
            import warnings
            warnings.warn(f"no Spark CDS archive: {type(e).__name__}: {e}", stacklevel=2)
    return f"{opts} -XX:SharedArchiveFile={archive}" if archive else opts


def lake_append_behind(target, schema, rows) -> None:
    """Rows written into a lake target's table by someone else, bypassing the apply (cast to
    the table's own column types)."""
    import pyarrow as pa
    if target.config.kind == "delta":
        from deltalake import DeltaTable, write_deltalake
        dt = DeltaTable(target.table_path(schema))
        arrow = pa.schema(dt.schema().to_arrow())
        write_deltalake(dt, rows.cast(pa.schema([arrow.field(n) for n in rows.column_names])), mode="append")
    else:
        t = target._load(schema)
        arrow = t.scan().to_arrow().schema
        t.append(rows.cast(pa.schema([arrow.field(n) for n in rows.column_names])))
