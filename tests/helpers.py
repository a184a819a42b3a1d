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
