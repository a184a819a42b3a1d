"""The apply end to end: synthetic events in the store, real PG + Redis, over both paths.

The scenario runs twice (the module's ``env`` fixture is parametrized): ``spark``, where
each apply is a real ``spark-submit`` of ``apply_job`` (about 12-20 s), and ``local``,
the in-process applier of ``engine/apply.py``. Each is one sequence of runs over shared
state, checked after each step against a model: the latest event per key among those
below the frontier.
"""
from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import random
import threading
import time
import uuid

import psycopg2
import pytest
import yaml
from psycopg2 import sql

from airflow_provider_dblog.engine.apply import run_apply  # noqa: E402
from airflow_provider_dblog.engine.config import parse_config  # noqa: E402
from airflow_provider_dblog.engine.errors import ConfigError  # noqa: E402
from airflow_provider_dblog.engine.events import (DELETE, INSERT, SNAPSHOT, UPDATE, Event,  # noqa: E402
                                                 events_to_arrow, rows_of)
from airflow_provider_dblog.engine.jobs import SparkJobError, run_spark_job, spark_submit_args  # noqa: E402
from airflow_provider_dblog.engine.positions import Position  # noqa: E402
from airflow_provider_dblog.engine.schema import Column, TableSchema  # noqa: E402
from airflow_provider_dblog.engine.state import RedisState  # noqa: E402
from airflow_provider_dblog.engine.store import EventStore  # noqa: E402
from airflow_provider_dblog.engine.targets import PostgresTarget  # noqa: E402

PG_PORT = int(os.environ.get("DBLOG_TEST_POSTGRES_PORT", "15432"))
REDIS_PORT = int(os.environ.get("DBLOG_TEST_REDIS_PORT", "16379"))
MARIADB_PORT = int(os.environ.get("DBLOG_TEST_MARIADB_PORT", "13306"))
SOURCE = "shop"

ORDERS = TableSchema("shop", "orders", (
    Column("id", "int64", False), Column("qty", "int32"), Column("small", "int16"), Column("tiny", "int8"),
    Column("amount", "decimal(12,2)"), Column("big", "decimal(30,10)"), Column("note", "string"),
    Column("created", "timestamp"), Column("day", "date"), Column("payload", "binary"),
    Column("doc", "json"), Column("flag", "bool"), Column("ratio", "float64"),
), ("id",))

LINES = TableSchema("shop", "lines", (
    Column("order_id", "int64", False), Column("line", "int32", False), Column("sku", "string"),
    Column("price", "decimal(10,2)"), Column("shipped", "timestamp"),
), ("order_id", "line"))


def P(offset: int, seq: int = 0) -> Position:
    return Position(1, offset, seq)


def order(i: int, v: int = 0) -> dict:
    if i % 11 == 0:  # NULLs everywhere but the key
        return {c: None for c in ORDERS.column_names} | {"id": i}
    created = dt.datetime(2024, 3, 10, 2, 30) + dt.timedelta(seconds=i * 61, microseconds=(i * 7919 + v) % 1_000_000)
    if i % 13 == 0:
        created = dt.datetime(1900, 1, 1, 0, 0, 0, 1)
    return {"id": i, "qty": i * 1000 + v, "small": (i % 500) - 250, "tiny": (i % 200) - 100,
            "amount": decimal.Decimal(i * 100 + v) / 100 - 5000,
            "big": decimal.Decimal(f"{12345678901234567890 + i}.{v:010d}"),
            "note": f"note {i} v{v} é✓ \"q\"", "created": created,
            "day": dt.date(1500, 3, 1) if i == 7 else dt.date(2000, 1, 1) + dt.timedelta(days=i),
            "payload": bytes([i % 256, v % 256, 0, 255, 10]),
            "doc": json.dumps({"i": i, "v": v, "s": "x\ny"}), "flag": (i + v) % 2 == 0, "ratio": i / 7}


def line(o: int, n: int, v: int = 0) -> dict:
    return {"order_id": o, "line": n, "sku": f"sku-{o}-{n}-{v}", "price": decimal.Decimal(o * 10 + n + v) / 4,
            "shipped": dt.datetime(2023, 12, 31, 23, 59, 59, 999999) if n % 2 else None}


def ev(schema: TableSchema, op: str, pos: Position, before: dict | None = None, after: dict | None = None) -> Event:
    image = after if after is not None else before
    return Event(schema.qualified, op, schema.key_of(image), before, after, pos, 1_700_000_000_000)


class Model:
    """What the target must hold: the latest event per key, among events below the frontier."""

    def __init__(self):
        self.events: dict[str, list[Event]] = {ORDERS.qualified: [], LINES.qualified: []}

    def add(self, events: list[Event]) -> None:
        for e in events:
            self.events[e.table].append(e)

    def expected(self, schema: TableSchema, frontier: Position) -> list[dict]:
        latest: dict[tuple, Event] = {}
        for e in sorted(self.events[schema.qualified], key=lambda e: e.pos):
            if e.pos < frontier:
                latest[e.key] = e
        return [latest[k].after for k in sorted(latest) if latest[k].op != DELETE]


@pytest.fixture(scope="module", params=["spark", "local"])
def env(request, servers, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"apply_{request.param}")
    run = uuid.uuid4().hex[:8]
    raw = {
        "sources": {SOURCE: {"kind": "mysql", "host": "127.0.0.1", "port": MARIADB_PORT, "user": "root",
                             "tables": [ORDERS.qualified, LINES.qualified]}},
        "targets": {"wh": {"kind": "postgres", "host": "127.0.0.1", "port": PG_PORT, "user": "postgres",
                           "database": f"dblog_apply_{run}", "source": SOURCE, "schema": "lake"}},
        "state": {"redis_url": f"redis://127.0.0.1:{REDIS_PORT}/0", "prefix": f"dblogtest{run}"},
        "storage": {"root": str(tmp / "store")},
        "spark": {"master": "local[2]", "driver_memory": "1g"},
    }
    path = tmp / "dblog.yaml"
    path.write_text(yaml.safe_dump(raw))
    schema_file = tmp / "schemas.json"
    schema_file.write_text(json.dumps({t.qualified: t.to_dict() for t in (ORDERS, LINES)}))
    cfg = parse_config(raw, str(path))
    state = RedisState(cfg.redis_url, cfg.state_prefix, SOURCE)
    target = PostgresTarget(cfg.target("wh"))
    yield {"via": request.param, "cfg": cfg, "path": str(path), "schemas": str(schema_file), "state": state,
           "store": EventStore(cfg.storage_root, SOURCE), "target": target,
           "token": state.acquire_lease("test", 3600), "model": Model(), "done": set()}
    state.reset()
    target.close()
    admin = psycopg2.connect(host="127.0.0.1", port=PG_PORT, user="postgres", dbname="postgres")
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(target.database)))
    admin.close()


def step(env, name: str, needs: str | None = None) -> None:
    """The scenario's tests build on each other in file order; run alone, a later one skips."""
    if needs is not None and needs not in env["done"]:
        pytest.skip(f"needs the earlier step {needs!r} of this module's scenario in the same run")
    env["done"].add(name)


def apply(env, *extra: str) -> dict:
    """One apply run on the scenario's path (``--tables a,b`` as for the job)."""
    if env["via"] == "local":
        tables = extra[extra.index("--tables") + 1] if "--tables" in extra else None
        res = run_apply(env["cfg"], "wh", tables, schema_file=env["schemas"], via="local")
    else:
        res = run_spark_job(env["cfg"], "apply_job",
                            ["--config", env["path"], "--target", "wh", "--schema-file", env["schemas"], *extra],
                            timeout_s=300)
    assert res["via"] == env["via"] and {r["via"] for r in res["tables"].values()} == {env["via"]}
    return res


def log_segment(env, schema: TableSchema, start: Position, events: list[Event]) -> None:
    env["store"].write_log_segment(schema, start, events, "1")
    env["model"].add(events)


def snapshot(env, schema: TableSchema, hw: Position, rows: list[dict]) -> list[Event]:
    events = [ev(schema, SNAPSHOT, hw.with_seq(i + 1), after=r) for i, r in enumerate(rows)]
    env["store"].write_snapshot(schema, hw, events_to_arrow(schema, events))
    env["model"].add(events)
    return events


def checkpoint(env, pos: Position) -> None:
    env["state"].commit(env["token"], pos, {"file": "x", "pos": pos.offset}, [], 0)


def check(env, frontier: Position) -> None:
    for schema in (ORDERS, LINES):
        got = env["target"].rows(schema)
        want = env["model"].expected(schema, frontier)
        assert len(got) == len(want), schema.qualified
        for g, w in zip(got, want):
            assert g == w, (schema.qualified, g, w)


def test_command_line(env):
    cmd = spark_submit_args(env["cfg"], "/x/apply_job.py", ["--a", "b"])
    assert cmd[0].endswith("spark-submit") and cmd[-3:] == ["/x/apply_job.py", "--a", "b"]
    joined = " ".join(cmd)
    for part in ("--master local[2]", "--driver-memory 1g", "spark.sql.session.timeZone=UTC",
                 "spark.sql.parquet.outputTimestampType=TIMESTAMP_MICROS", "spark.ui.enabled=false",
                 "-Duser.timezone=UTC", "spark.pyspark.python="):
        assert part in joined
    assert cmd[cmd.index("--jars") + 1] == "/usr/share/java/mariadb-java-client.jar,/usr/share/java/postgresql.jar"


def test_nothing_to_apply_before_the_first_checkpoint(env):
    step(env, "no_checkpoint")
    res = apply(env)
    assert {t: r["status"] for t, r in res["tables"].items()} == {ORDERS.qualified: "no_frontier",
                                                                   LINES.qualified: "no_frontier"}


def test_first_batch_types_round_trip(env):
    step(env, "first")
    # the log from checkpoint 100: inserts, an update, a composite-key table
    events = [ev(ORDERS, INSERT, P(100 + i), after=order(i)) for i in range(1, 301)]
    events.append(ev(ORDERS, UPDATE, P(500), before=order(5), after=order(5, 1)))
    log_segment(env, ORDERS, P(100), events)
    log_segment(env, LINES, P(100), [ev(LINES, INSERT, P(600 + o * 10 + n), after=line(o, n))
                                     for o in range(1, 21) for n in range(1, 4)])
    # a dump window's snapshot rows for keys the log does not touch
    snapshot(env, ORDERS, P(700), [order(i, 2) for i in range(1000, 1100)])
    checkpoint(env, P(1000))
    res = apply(env)
    o, li = res["tables"][ORDERS.qualified], res["tables"][LINES.qualified]
    assert o["status"] == "applied" and o["events"] == 401 and o["rows"] == 400 and o["inserted"] == 400
    assert li["inserted"] == 60 and li["to"] == P(1000).encode()
    check(env, P(1000))
    row = {r["id"]: r for r in env["target"].rows(ORDERS)}
    assert row[5]["created"].microsecond == (5 * 7919 + 1) % 1_000_000
    assert row[5]["amount"] == decimal.Decimal("-4994.99") and row[5]["big"] == decimal.Decimal(
        "12345678901234567895.0000000001")
    assert row[7]["day"] == dt.date(1500, 3, 1) and row[13]["created"] == dt.datetime(1900, 1, 1, 0, 0, 0, 1)
    assert row[22]["note"] is None and row[22]["payload"] is None
    assert env["target"].applied_pos(SOURCE, ORDERS) == P(1000)


def test_deletes_and_an_older_snapshot(env):
    step(env, "second", "first")
    events = [
        ev(ORDERS, UPDATE, P(1100), before=order(1), after=order(1, 5)),
        ev(ORDERS, DELETE, P(1200), before=order(2)),
        ev(ORDERS, DELETE, P(1300), before=order(3)),
        ev(ORDERS, INSERT, P(1400), after=order(3, 7)),                  # deleted, then back
        ev(ORDERS, UPDATE, P(1500), before=order(1000, 2), after=order(1000, 9)),
        ev(ORDERS, DELETE, P(1600), before=order(1001, 2)),
        ev(ORDERS, UPDATE, P(1700), before=order(4), after=order(4, 3)),
        ev(ORDERS, UPDATE, P(1710), before=order(4, 3), after=order(4, 4)),
    ]
    log_segment(env, ORDERS, P(1000), events)
    log_segment(env, LINES, P(1000), [ev(LINES, DELETE, P(1800), before=line(1, 1)),
                                      ev(LINES, UPDATE, P(1810), before=line(2, 2), after=line(2, 2, 1))])
    # a snapshot whose window closed before those log events (older positions), written later:
    # it must lose to the newer log events, and must not bring deleted rows back
    snapshot(env, ORDERS, P(1050), [order(1, 8), order(2, 8), order(1001, 8), order(1200, 8)])
    checkpoint(env, P(2000))
    res = apply(env)
    o = res["tables"][ORDERS.qualified]
    assert o["events"] == 12 and o["deleted"] == 2 and o["inserted"] == 1  # 1200 is new
    check(env, P(2000))
    ids = {r["id"] for r in env["target"].rows(ORDERS)}
    assert {2, 1001} & ids == set() and {1, 3, 4, 1000, 1200} <= ids
    assert res["tables"][LINES.qualified]["deleted"] == 1


def test_replay_from_the_start_changes_nothing(env):
    """The checkpoint forgotten, the whole log is applied again, with a late snapshot of
    older positions among it: every stage row is at or below its target row's position,
    so nothing changes (the merge's position guard), and the checkpoint comes back."""
    step(env, "replay_all", "second")
    # a dump window closed at 1060, its snapshot written only now: older than the rows
    snapshot(env, ORDERS, P(1060), [order(1, 99), order(4, 99), order(1000, 99), order(3, 99)])
    before = {s.qualified: env["target"].rows(s, with_pos=True) for s in (ORDERS, LINES)}
    env["target"].reset_applied(SOURCE, ORDERS)
    res = apply(env, "--tables", ORDERS.qualified)
    o = res["tables"][ORDERS.qualified]
    assert o["from"] is None and o["status"] == "applied" and o["events"] == 401 + 12 + 4
    assert o["inserted"] == o["updated"] == o["deleted"] == 0 and o["stale"] == o["rows"] > 0
    assert res["changed"] == []
    assert {s.qualified: env["target"].rows(s, with_pos=True) for s in (ORDERS, LINES)} == before
    assert env["target"].applied_pos(SOURCE, ORDERS) == P(2000)
    check(env, P(2000))


def test_second_run_changes_nothing(env):
    step(env, "replay", "replay_all")
    before = {s.qualified: env["target"].rows(s, with_pos=True) for s in (ORDERS, LINES)}
    res = apply(env)
    assert {r["status"] for r in res["tables"].values()} == {"up_to_date"}
    assert res["inserted"] == res["updated"] == res["deleted"] == 0 and res["changed"] == []
    assert {s.qualified: env["target"].rows(s, with_pos=True) for s in (ORDERS, LINES)} == before


def test_open_window_holds_the_frontier(env):
    step(env, "window", "replay")
    state = env["state"]
    window = state.open_window("req-1", ORDERS.qualified, P(2500))  # its LW comes after 2500
    events = [ev(ORDERS, UPDATE, P(2100), before=order(10), after=order(10, 1)),
              ev(ORDERS, UPDATE, P(2400), before=order(12), after=order(12, 1)),
              ev(ORDERS, UPDATE, P(2600), before=order(10, 1), after=order(10, 2)),
              ev(ORDERS, DELETE, P(2700), before=order(12, 1))]
    log_segment(env, ORDERS, P(2000), events)
    checkpoint(env, P(3000))
    assert state.frontier() == P(2500)
    res = apply(env, "--tables", ORDERS.qualified)
    assert list(res["tables"]) == [ORDERS.qualified]
    o = res["tables"][ORDERS.qualified]
    assert o["to"] == P(2500).encode() and o["events"] == 2 and o["updated"] == 2
    check(env, P(2500))
    assert env["target"].applied_pos(SOURCE, ORDERS) == P(2500)
    # the window's snapshot lands above its floor, then the window closes
    snapshot(env, ORDERS, P(2550), [order(12, 4), order(14, 4)])
    state.close_window(window, "done")
    assert state.frontier() == P(3000)
    res = apply(env)
    o = res["tables"][ORDERS.qualified]
    assert o["from"] == P(2500).encode() and o["events"] == 4 and o["deleted"] == 1 and o["updated"] == 2
    assert res["tables"][LINES.qualified]["status"] == "empty"  # no new events: checkpoint moves on
    check(env, P(3000))
    assert env["target"].applied_pos(SOURCE, LINES) == P(3000)


def test_recreated_target_table_is_reapplied(env):
    step(env, "recreated", "window")
    target = env["target"]
    with target.conn, target.conn.cursor() as cur:
        cur.execute(sql.SQL("DROP TABLE {}.{}").format(sql.Identifier("lake"), sql.Identifier("shop__lines")))
    res = apply(env, "--tables", LINES.qualified)
    assert res["tables"][LINES.qualified]["from"] is None
    check(env, P(3000))


def test_failure_is_reported(env, tmp_path):
    if env["via"] == "local":
        with pytest.raises(ConfigError, match="unknown target 'nope'"):
            run_apply(env["cfg"], "nope", via="local")
        return
    with pytest.raises(SparkJobError) as e:
        run_spark_job(env["cfg"], "apply_job", ["--config", env["path"], "--target", "nope"], timeout_s=300)
    assert "ConfigError" in str(e.value) and "unknown target 'nope'" in str(e.value)


# -- end to end: tail (thread) + dump (spark-submit) under writes + apply (spark-submit) ----------
E2E_DDL = [
    """CREATE TABLE {db}.items (
         id BIGINT PRIMARY KEY, qty INT, small SMALLINT, amount DECIMAL(12,2), note VARCHAR(100),
         created DATETIME(6), day DATE, payload BLOB, doc JSON, flag BOOLEAN, ratio DOUBLE)""",
    "CREATE TABLE {db}.pairs (a INT, b VARCHAR(10), v BIGINT, PRIMARY KEY (a, b))",
]


def e2e_item(i: int, v: int) -> tuple:
    if i % 17 == 0:
        return (i,) + (None,) * 10
    return (i, i * 10 + v, i % 300 - 150, decimal.Decimal(i * 100 + v) / 100, f"item {i}/{v} é",
            dt.datetime(2024, 1, 1) + dt.timedelta(seconds=i * 7, microseconds=i * 131 + v),
            dt.date(2020, 1, 1) + dt.timedelta(days=i), bytes([i % 256, v % 256, 0]),
            json.dumps({"i": i, "v": v}), (i + v) % 2 == 0, i / 3)


def test_dump_tail_apply_end_to_end(servers, tmp_path):
    """A dump under concurrent writes, the tail running, then apply: the target equals the source."""
    import pymysql

    from airflow_provider_dblog.engine.dump import DumpRunner
    from airflow_provider_dblog.engine.requests import DumpSpec
    from airflow_provider_dblog.engine.sources.mysql import MySQLSource
    from airflow_provider_dblog.engine.tail import Tail

    run = uuid.uuid4().hex[:8]
    db = f"e2e_{run}"
    conn = pymysql.connect(host="127.0.0.1", port=MARIADB_PORT, user="root", password="", autocommit=True,
                           charset="utf8mb4", init_command="SET time_zone = '+00:00'")
    cur = conn.cursor()
    cur.execute(f"CREATE DATABASE {db} CHARACTER SET utf8mb4")
    for ddl in E2E_DDL:
        cur.execute(ddl.format(db=db))
    n0 = 1500
    cur.executemany(f"INSERT INTO {db}.items VALUES ({', '.join(['%s'] * 11)})", [e2e_item(i, 0) for i in range(1, n0 + 1)])
    cur.executemany(f"INSERT INTO {db}.pairs VALUES (%s, %s, %s)",
                    [(a, b, a * 10) for a in range(1, 101) for b in ("x", "y", "z")])
    raw = {
        "sources": {"src": {"kind": "mysql", "host": "127.0.0.1", "port": MARIADB_PORT, "user": "root",
                            "tables": [f"{db}.items", f"{db}.pairs"], "server_id": random.randint(10_000, 2**31 - 1),
                            "watermark_namespace": f"wm_{run}"}},
        "targets": {"wh": {"kind": "postgres", "host": "127.0.0.1", "port": PG_PORT, "user": "postgres",
                           "database": f"dblog_e2e_{run}", "source": "src", "schema": "lake"}},
        "state": {"redis_url": f"redis://127.0.0.1:{REDIS_PORT}/0", "prefix": f"dblogtest{run}"},
        "storage": {"root": str(tmp_path / "store")},
        "dump": {"chunk_size": 400, "parallelism": 3, "window_timeout_s": 60},
        "tail": {"flush_seconds": 0.2, "lease_seconds": 10},
        "spark": {"driver_memory": "1g"},
    }
    path = tmp_path / "dblog.yaml"
    path.write_text(yaml.safe_dump(raw))
    cfg = parse_config(raw, str(path))
    scfg = cfg.source("src")
    state = RedisState(cfg.redis_url, cfg.state_prefix, "src")
    store = EventStore(cfg.storage_root, "src")
    target = PostgresTarget(cfg.target("wh"))
    stop = threading.Event()
    errors: list[BaseException] = []

    def tail_loop():
        src = MySQLSource(scfg)
        try:
            tail = Tail(src, state, store, cfg.tail, owner="e2e")
            while not stop.is_set():
                tail.run(max_seconds=2)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
        finally:
            src.close()

    def writer():
        c = pymysql.connect(host="127.0.0.1", port=MARIADB_PORT, user="root", password="", autocommit=True,
                            charset="utf8mb4", init_command="SET time_zone = '+00:00'")
        rnd, nxt, v = random.Random(7), n0 + 1, 1
        try:
            with c.cursor() as w:
                while not stop.is_set() and not writes_done.is_set():
                    i = rnd.randint(1, nxt - 1)  # nxt itself is the next INSERT's id
                    op = rnd.random()
                    if op < 0.5:
                        w.execute(f"REPLACE INTO {db}.items VALUES ({', '.join(['%s'] * 11)})", e2e_item(i, v))
                    elif op < 0.7:
                        w.execute(f"DELETE FROM {db}.items WHERE id = %s", (i,))
                    elif op < 0.85:
                        w.execute(f"INSERT INTO {db}.items VALUES ({', '.join(['%s'] * 11)})", e2e_item(nxt, v))
                        nxt += 1
                    else:
                        w.execute(f"UPDATE {db}.pairs SET v = v + 1 WHERE a = %s", (rnd.randint(1, 100),))
                    v += 1
                    written[0] += 1
                    time.sleep(0.01)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
        finally:
            c.close()

    writes_done = threading.Event()
    written = [0]
    tail_thread = threading.Thread(target=tail_loop, daemon=True)
    tail_thread.start()
    try:
        deadline = time.monotonic() + 30
        while state.checkpoint() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert state.checkpoint() is not None, errors
        source = MySQLSource(scfg)
        rid = DumpRunner(source, state, store, None, cfg.dump).submit(DumpSpec("all", []))
        writer_thread = threading.Thread(target=writer, daemon=True)
        writer_thread.start()
        res = run_spark_job(cfg, "dump_job", ["--config", str(path), "--source", "src", "--request", rid],
                            timeout_s=600)
        writes_done.set()
        writer_thread.join(30)
        assert res["status"] == "done" and res["chunks"] >= 5, res
        assert written[0] > 50, "the writes must overlap the dump"
        print("dump:", {k: res[k] for k in ("chunks", "rows", "dropped", "seconds", "submit_seconds")},
              "writes:", written[0], "counters:", state.counters())
        # let the tail catch up with everything written, then apply everything below the frontier
        end, _ = source.current_resume()
        deadline = time.monotonic() + 60
        while state.checkpoint().pos < end and time.monotonic() < deadline:
            time.sleep(0.2)
        assert state.checkpoint().pos >= end and not errors, errors
        applied = run_spark_job(cfg, "apply_job", ["--config", str(path), "--target", "wh"], timeout_s=600)
        assert applied["tables"][f"{db}.items"]["status"] == "applied", applied
        print("apply:", {t: {k: r.get(k) for k in ("events", "rows", "inserted", "updated", "deleted", "seconds")}
                         for t, r in applied["tables"].items()}, "spark start:", applied["spark_start_s"],
              "submit:", applied["submit_seconds"])
        for name in ("items", "pairs"):
            schema = source.table_schema(f"{db}.{name}")
            cur.execute(f"SELECT {', '.join(schema.key)} FROM {db}.{name}")
            keys = sorted(tuple(r) for r in cur.fetchall())
            want = rows_of(schema, source.select_keys(schema, keys)) if keys else []
            want.sort(key=schema.key_of)
            got = target.rows(schema)
            assert len(got) == len(want), name
            assert got == want, name
        source.close()
    finally:
        stop.set()
        writes_done.set()
        tail_thread.join(30)
        state.reset()
        target.close()
        cur.execute(f"DROP DATABASE IF EXISTS {db}")
        cur.execute(f"DROP DATABASE IF EXISTS wm_{run}")
        conn.close()
        admin = psycopg2.connect(host="127.0.0.1", port=PG_PORT, user="postgres", dbname="postgres")
        admin.autocommit = True
        with admin.cursor() as c2:
            c2.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(f"dblog_e2e_{run}")))
        admin.close()
