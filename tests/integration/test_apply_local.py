"""The in-process applier (engine/apply.py) against the Spark one, and the choice between them.

Real PostgreSQL and Redis; the Spark side is a real ``spark-submit`` of ``apply_job``.
The scenario over both paths is tests/integration/test_apply.py (its ``env`` fixture
is parametrized); here: the same events applied both ways give the same rows and
counts, the position guard with strictly older events, and the threshold.
"""
from __future__ import annotations

import dataclasses
import json
import uuid

import psycopg2
import pytest
import yaml
from psycopg2 import sql

from airflow_provider_dblog.engine.apply import choose_via, run_apply
from airflow_provider_dblog.engine.apply_plan import LOCAL, SPARK
from airflow_provider_dblog.engine.config import ApplyConfig, parse_config
from airflow_provider_dblog.engine.errors import ConfigError
from airflow_provider_dblog.engine.events import DELETE, INSERT, SNAPSHOT, UPDATE, events_to_arrow
from airflow_provider_dblog.engine.jobs import run_spark_job
from airflow_provider_dblog.engine.state import RedisState
from airflow_provider_dblog.engine.store import EventStore
from airflow_provider_dblog.engine.targets import PostgresTarget

from test_apply import LINES, MARIADB_PORT, ORDERS, PG_PORT, REDIS_PORT, SOURCE, Model, P, ev, line, order

COUNTS = ("status", "from", "to", "files", "events", "rows", "inserted", "updated", "deleted", "stale")


class Env:
    """One source's store and state, one target database with a schema per target."""

    def __init__(self, tmp, targets: tuple[str, ...], **raw_more):
        run = uuid.uuid4().hex[:8]
        self.db = f"dblog_applyloc_{run}"
        raw = {
            "sources": {SOURCE: {"kind": "mysql", "host": "127.0.0.1", "port": MARIADB_PORT, "user": "root",
                                 "tables": [ORDERS.qualified, LINES.qualified]}},
            "targets": {t: {"kind": "postgres", "host": "127.0.0.1", "port": PG_PORT, "user": "postgres",
                            "database": self.db, "source": SOURCE, "schema": f"s_{t}"} for t in targets},
            "state": {"redis_url": f"redis://127.0.0.1:{REDIS_PORT}/0", "prefix": f"dblogtest{run}"},
            "storage": {"root": str(tmp / "store")},
            "spark": {"master": "local[2]", "driver_memory": "1g"},
        } | raw_more
        self.path = tmp / "dblog.yaml"
        self.path.write_text(yaml.safe_dump(raw))
        self.schemas = tmp / "schemas.json"
        self.schemas.write_text(json.dumps({t.qualified: t.to_dict() for t in (ORDERS, LINES)}))
        self.cfg = parse_config(raw, str(self.path))
        self.state = RedisState(self.cfg.redis_url, self.cfg.state_prefix, SOURCE)
        self.store = EventStore(self.cfg.storage_root, SOURCE)
        self.targets = {t: PostgresTarget(self.cfg.target(t)) for t in targets}
        self.token = self.state.acquire_lease("test", 3600)
        self.model = Model()

    def log(self, schema, start, events) -> None:
        self.store.write_log_segment(schema, start, events, "1")
        self.model.add(events)

    def checkpoint(self, pos) -> None:
        self.state.commit(self.token, pos, {"file": "x", "pos": pos.offset}, [], 0)

    def apply(self, via: str, target: str, cfg=None) -> dict:
        if via == SPARK:
            return run_spark_job(cfg or self.cfg, "apply_job", ["--config", str(self.path), "--target", target,
                                                                "--schema-file", str(self.schemas)], timeout_s=300)
        return run_apply(cfg or self.cfg, target, schema_file=str(self.schemas), via="local")

    def rows(self, target: str, schema) -> list[dict]:
        return self.targets[target].rows(schema, with_pos=True)

    def close(self) -> None:
        self.state.reset()
        for t in self.targets.values():
            t.close()
        admin = psycopg2.connect(host="127.0.0.1", port=PG_PORT, user="postgres", dbname="postgres")
        admin.autocommit = True
        with admin.cursor() as cur:
            cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.db)))
        admin.close()


@pytest.fixture
def make_env(servers, tmp_path):
    made = []

    def make(*targets: str, **raw_more) -> Env:
        (tmp_path / f"e{len(made)}").mkdir()
        e = Env(tmp_path / f"e{len(made)}", targets, **raw_more)
        made.append(e)
        return e
    yield make
    for e in made:
        e.close()


def strip_pos(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "_dblog_pos"} for r in rows]


def test_local_and_spark_apply_the_same_events_alike(make_env):
    """Every column type, NULLs, deletes, an older snapshot, a replayed flush's duplicates,
    two batches: both paths leave the same rows (with positions) and report the same counts."""
    e = make_env("via_spark", "via_local")
    first = [ev(ORDERS, INSERT, P(100 + i), after=order(i)) for i in range(1, 301)]
    first += [ev(ORDERS, UPDATE, P(450 + i), before=order(i), after=order(i, 1)) for i in range(1, 40)]
    first += [ev(ORDERS, DELETE, P(500 + i), before=order(i, 1)) for i in range(20, 30)]
    e.log(ORDERS, P(100), first)
    # a replayed flush: the tail re-read from 420 and wrote the same events again, under its own name
    e.store.write_log_segment(ORDERS, P(420), [x for x in first if x.pos >= P(420)], "2")
    e.log(LINES, P(100), [ev(LINES, INSERT, P(600 + o * 10 + n), after=line(o, n))
                          for o in range(1, 21) for n in range(1, 4)])
    snap = [ev(ORDERS, SNAPSHOT, P(300).with_seq(i + 1), after=order(i, 7)) for i in (1, 2, 25, 500, 501)]
    e.store.write_snapshot(ORDERS, P(300), events_to_arrow(ORDERS, snap))
    e.model.add(snap)
    e.checkpoint(P(1000))
    second = [ev(ORDERS, UPDATE, P(1100 + i), before=order(i, 1), after=order(i, 2)) for i in range(1, 10)]
    second += [ev(ORDERS, DELETE, P(1200), before=order(500, 7)), ev(ORDERS, INSERT, P(1300), after=order(25, 9))]

    results = []
    for batch in (1, 2):
        if batch == 2:
            e.log(ORDERS, P(1000), second)
            e.log(LINES, P(1000), [ev(LINES, DELETE, P(1400), before=line(1, 1)),
                                   ev(LINES, UPDATE, P(1410), before=line(2, 2), after=line(2, 2, 1))])
            e.checkpoint(P(2000))
        spark = e.apply(SPARK, "via_spark")
        local = e.apply(LOCAL, "via_local")
        results.append((spark, local))
        assert spark["via"] == SPARK and local["via"] == LOCAL
        for table in (ORDERS, LINES):
            s, lo = spark["tables"][table.qualified], local["tables"][table.qualified]
            assert {k: s[k] for k in COUNTS} == {k: lo[k] for k in COUNTS}, table.qualified
            assert e.rows("via_spark", table) == e.rows("via_local", table), table.qualified
            frontier = P(1000) if batch == 1 else P(2000)
            assert strip_pos(e.rows("via_local", table)) == e.model.expected(table, frontier)
        assert spark["changed"] == local["changed"]
    o = results[0][1]["tables"][ORDERS.qualified]
    # 300 inserts, 39 updates, 10 deletes, 5 snapshot rows, and the 49 replayed (counted, staged once)
    assert o["events"] == 300 + 39 + 10 + 5 + sum(1 for x in first if x.pos >= P(420)) and o["files"] == 3
    assert o["rows"] == 302 and o["deleted"] == 0 and o["inserted"] == 292
    print("apply seconds: spark", [r[0]["tables"][ORDERS.qualified]["seconds"] for r in results],
          "submit", [r[0].get("submit_seconds") for r in results],
          "local", [r[1]["tables"][ORDERS.qualified]["seconds"] for r in results],
          "local run", [r[1]["seconds"] for r in results])


@pytest.mark.parametrize("via", [LOCAL, SPARK])
def test_older_events_never_overwrite_newer_rows(make_env, via):
    """The checkpoint forgotten and the frontier held back by a window: the batch holds only
    events older than the target's rows, and the merge's position guard keeps the rows."""
    e = make_env("wh")
    e.log(ORDERS, P(100), [ev(ORDERS, INSERT, P(100 + i), after=order(i)) for i in range(1, 51)]
          + [ev(ORDERS, UPDATE, P(300 + i), before=order(i), after=order(i, 1)) for i in range(1, 51)])
    e.checkpoint(P(400))
    e.apply(LOCAL, "wh")  # the set-up, either way
    before = e.rows("wh", ORDERS)
    assert [r["_dblog_pos"] for r in before] == [P(300 + i).encode() for i in range(1, 51)]
    target = e.targets["wh"]
    target.reset_applied(SOURCE, ORDERS)
    window = e.state.open_window("req", ORDERS.qualified, P(200))
    assert e.state.frontier() == P(200)
    res = e.apply(via, "wh")["tables"][ORDERS.qualified]
    assert res["via"] == via and res["events"] == 50 and res["rows"] == 50
    assert res["inserted"] == res["updated"] == res["deleted"] == 0 and res["stale"] == 50
    assert e.rows("wh", ORDERS) == before
    assert target.applied_pos(SOURCE, ORDERS) == P(200)
    e.state.close_window(window, "done")
    res = run_apply(e.cfg, "wh", schema_file=str(e.schemas), via="local")["tables"][ORDERS.qualified]
    assert res["from"] == P(200).encode() and res["stale"] == 50 and res["updated"] == 0
    assert e.rows("wh", ORDERS) == before and target.applied_pos(SOURCE, ORDERS) == P(400)


def test_the_threshold_picks_the_path(make_env):
    e = make_env("wh")
    e.log(ORDERS, P(100), [ev(ORDERS, INSERT, P(100 + i), after=order(i)) for i in range(1, 31)])
    e.log(LINES, P(100), [ev(LINES, INSERT, P(200 + n), after=line(1, n)) for n in range(1, 6)])

    def limit(n: int):
        return dataclasses.replace(e.cfg, apply=ApplyConfig(local_max_events=n))

    # no checkpoint yet: nothing is pending, the local path reports no_frontier at once
    assert choose_via(e.cfg, "wh", None) | {"choose_s": 0} == {
        "via": LOCAL, "pending_events": 0, "local_max_events": 200_000, "choose_s": 0}
    e.checkpoint(P(1000))
    assert choose_via(limit(35), "wh", None)["via"] == LOCAL
    assert choose_via(limit(35), "wh", None)["pending_events"] == 35
    assert choose_via(limit(34), "wh", None)["via"] == SPARK
    assert choose_via(limit(30), "wh", ORDERS.qualified)["via"] == LOCAL   # only the requested tables count
    assert choose_via(limit(0), "wh", None) | {"choose_s": 0} == {
        "via": SPARK, "pending_events": -1, "local_max_events": 0, "choose_s": 0}

    spark_runs = []

    def run_spark() -> dict:  # stands in for spark-submit: only which path was taken matters here
        spark_runs.append(1)
        return {"via": SPARK, "tables": {}}

    res = run_apply(limit(34), "wh", None, run_spark=run_spark, schema_file=str(e.schemas))
    assert spark_runs == [1] and res["pending_events"] > 34 and res["local_max_events"] == 34
    res = run_apply(limit(0), "wh", None, run_spark=run_spark, schema_file=str(e.schemas))
    assert spark_runs == [1, 1] and res["via"] == SPARK
    res = run_apply(limit(35), "wh", None, run_spark=run_spark, schema_file=str(e.schemas))
    assert spark_runs == [1, 1] and res["via"] == LOCAL and res["events"] == 35 and res["pending_events"] == 35
    assert res["tables"][ORDERS.qualified]["inserted"] == 30 and res["changed"] == [ORDERS.qualified,
                                                                                    LINES.qualified]
    # applied: nothing pending; a dropped target table counts from the start of the log again
    assert choose_via(limit(1), "wh", None) | {"choose_s": 0} == {
        "via": LOCAL, "pending_events": 0, "local_max_events": 1, "choose_s": 0}
    target = e.targets["wh"]
    with target.conn, target.conn.cursor() as cur:
        cur.execute(sql.SQL("DROP TABLE {}.{}").format(sql.Identifier("s_wh"), sql.Identifier("shop__orders")))
    assert choose_via(limit(100), "wh", None)["pending_events"] == 30


def test_apply_config_section():
    base = {"sources": {"s": {"kind": "mysql", "port": 1, "user": "u", "tables": ["a.b"]}},
            "state": {"redis_url": "redis://x"}, "storage": {"root": "/tmp/x"}}
    assert parse_config(base).apply.local_max_events == 200_000
    assert parse_config(base | {"apply": {"local_max_events": 0}}).apply.local_max_events == 0
    assert parse_config(base | {"apply": {"local_max_events": 5}}).apply.local_max_events == 5
    for bad in (-1, "10", 1.5, True):
        with pytest.raises(ConfigError, match="apply.local_max_events"):
            parse_config(base | {"apply": {"local_max_events": bad}})
    with pytest.raises(ConfigError, match="unknown field"):
        parse_config(base | {"apply": {"max_events": 5}})
