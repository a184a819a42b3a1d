"""PostgresTarget merge semantics against a real PostgreSQL, with hand-made stage tables.

PostgreSQL is the project's private one (127.0.0.1:15432, user postgres, trust)
unless DBLOG_TEST_POSTGRES_PORT says otherwise.
"""
from __future__ import annotations

import datetime as dt
import decimal
import os
import threading
import uuid

import psycopg2
import pytest
from psycopg2 import sql

from airflow_provider_dblog.engine.config import Endpoint, TargetConfig
from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.schema import Column, TableSchema
from airflow_provider_dblog.engine.targets import PostgresTarget, stage_table_name, target_table_name

from helpers import wait_until

PG_PORT = int(os.environ.get("DBLOG_TEST_POSTGRES_PORT", "15432"))
SOURCE = "src"

ORDERS = TableSchema("shop", "orders", (
    Column("id", "int64", False),
    Column("amount", "decimal(12,2)"),
    Column("note", "string"),
    Column("created", "timestamp"),
    Column("day", "date"),
    Column("blob", "binary"),
    Column("flag", "bool"),
    Column("small", "int16"),
    Column("doc", "json"),
), ("id",))

LINES = TableSchema("shop", "order_lines", (
    Column("order_id", "int32", False),
    Column("sku", "string", False),
    Column("qty", "int32"),
), ("order_id", "sku"))


def P(n: int) -> Position:
    return Position(1, n, 0)


@pytest.fixture(scope="module")
def pg_endpoint(servers):
    return Endpoint("127.0.0.1", PG_PORT, "postgres", "", f"dblog_t_{uuid.uuid4().hex[:8]}")


@pytest.fixture(scope="module")
def database(pg_endpoint):
    yield pg_endpoint.database
    admin = psycopg2.connect(host="127.0.0.1", port=PG_PORT, user="postgres", dbname="postgres")
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(pg_endpoint.database)))
    admin.close()


@pytest.fixture
def target(pg_endpoint, database):
    schema = f"s_{uuid.uuid4().hex[:8]}"
    t = PostgresTarget(TargetConfig("pg", "postgres", pg_endpoint, SOURCE, schema))
    yield t
    with t.conn, t.conn.cursor() as cur:
        cur.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
    t.close()


def stage(target: PostgresTarget, table: TableSchema, rows: list[dict]) -> str:
    """A stage table filled by hand: each row has the columns plus _dblog_op / _dblog_pos."""
    name = stage_table_name(table, uuid.uuid4().hex[:8])
    target.create_stage(table, name)
    cols = table.column_names + ["_dblog_op", "_dblog_pos"]
    with target.conn, target.conn.cursor() as cur:
        for r in rows:
            vals = [r.get(c) for c in table.column_names] + [r["op"], r["pos"].encode()]
            cur.execute(sql.SQL("INSERT INTO {}.{} ({}) VALUES ({})").format(
                sql.Identifier(target.schema), sql.Identifier(name),
                sql.SQL(", ").join(sql.Identifier(c) for c in cols),
                sql.SQL(", ").join(sql.Placeholder() * len(cols))), vals)
    return name


def order(i: int, pos: int, op: str = "update", **kw) -> dict:
    return {"id": i, "amount": decimal.Decimal(kw.pop("amount", f"{i}.50")), "note": kw.pop("note", f"n{i}"),
            "op": op, "pos": P(pos), **kw}


def merge(target, table, rows, new_pos):
    return target.merge_from_stage(table, stage(target, table, rows), SOURCE, new_pos, drop_stage=True)


def notes(target, table=ORDERS):
    return {r["id"]: (r["note"], r["_dblog_pos"]) for r in target.rows(table, with_pos=True)}


def test_names():
    assert target_table_name(ORDERS) == "shop__orders"
    assert target_table_name("a.b") == "a__b"
    assert stage_table_name(ORDERS) == "_dblog_stage__shop__orders"
    long = "x" * 60 + ".y" + "z" * 60
    n1, n2 = target_table_name(long), target_table_name(long[:-1] + "q")
    assert len(n1) <= 63 and len(n2) <= 63 and n1 != n2
    assert len(stage_table_name(long, "abcd1234")) <= 63


def test_database_and_tables_created(target, pg_endpoint):
    assert target.ensure_table(ORDERS) is True
    assert target.ensure_table(ORDERS) is False
    with target.conn, target.conn.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (pg_endpoint.database,))
        assert cur.fetchone()
        cur.execute("SELECT column_name, data_type, numeric_precision, numeric_scale, is_nullable, "
                    "datetime_precision, collation_name FROM information_schema.columns "
                    "WHERE table_schema = %s AND table_name = 'shop__orders' ORDER BY ordinal_position",
                    (target.schema,))
        cols = {r[0]: r[1:] for r in cur.fetchall()}
        cur.execute("SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
                    "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary",
                    (f'"{target.schema}"."shop__orders"',))
        pk = [r[0] for r in cur.fetchall()]
    assert pk == ["id"]
    assert cols["id"][:1] == ("bigint",) and cols["id"][3] == "NO"
    assert cols["amount"][:3] == ("numeric", 12, 2)
    assert cols["created"][0] == "timestamp without time zone" and cols["created"][4] == 6
    assert cols["day"][0] == "date" and cols["blob"][0] == "bytea" and cols["flag"][0] == "boolean"
    assert cols["small"][0] == "smallint" and cols["doc"][0] == "json" and cols["note"][3] == "YES"
    assert cols["_dblog_pos"][0] == "text" and cols["_dblog_pos"][3] == "NO" and cols["_dblog_pos"][5] == "C"
    assert target.applied_pos(SOURCE, ORDERS) is None
    assert target.count(ORDERS) == 0


def test_values_round_trip(target):
    target.ensure_table(ORDERS)
    row = order(1, 10, op="insert", created=dt.datetime(2024, 2, 29, 23, 59, 58, 123456),
                day=dt.date(1999, 12, 31), blob=b"\x00\xffbin", flag=True, small=-7, doc='{"a": [1, 2]}',
                amount="-1234567890.12")
    r = merge(target, ORDERS, [row, order(2, 11, op="insert")], P(20))
    assert (r.inserted, r.updated, r.deleted) == (2, 0, 0)
    got = target.rows(ORDERS)[0]
    assert got == {"id": 1, "amount": decimal.Decimal("-1234567890.12"), "note": "n1",
                   "created": dt.datetime(2024, 2, 29, 23, 59, 58, 123456), "day": dt.date(1999, 12, 31),
                   "blob": b"\x00\xffbin", "flag": True, "small": -7, "doc": '{"a": [1, 2]}'}
    assert target.rows(ORDERS)[1]["created"] is None  # NULLs stay NULL
    assert target.applied_pos(SOURCE, ORDERS) == P(20)


def test_newer_wins_older_loses(target):
    target.ensure_table(ORDERS)
    merge(target, ORDERS, [order(1, 10, note="v10"), order(2, 12, note="v12")], P(20))
    r = merge(target, ORDERS, [order(1, 25, note="v25")], P(30))
    assert (r.inserted, r.updated) == (0, 1)
    assert notes(target)[1] == ("v25", P(25).encode())
    # an older event (below the checkpoint) is ignored by the checkpoint guard
    r = merge(target, ORDERS, [order(1, 15, note="v15"), order(2, 11, note="v11")], P(40))
    assert (r.inserted, r.updated, r.stale, r.staged) == (0, 0, 0, 0)
    # with the checkpoint forgotten, the per-row position guard still keeps the newer row
    target.reset_applied(SOURCE, ORDERS)
    r = merge(target, ORDERS, [order(1, 15, note="v15"), order(2, 11, note="v11"), order(2, 13, note="v13")],
              P(40))
    assert (r.inserted, r.updated, r.stale) == (0, 1, 1)
    assert notes(target) == {1: ("v25", P(25).encode()), 2: ("v13", P(13).encode())}


def test_latest_per_key_within_a_batch(target):
    target.ensure_table(ORDERS)
    r = merge(target, ORDERS, [order(1, 12, note="b"), order(1, 10, op="insert", note="a"),
                               order(1, 14, note="c"), order(2, 10, op="insert"), order(2, 11, op="delete")],
              P(20))
    assert (r.inserted, r.updated, r.deleted, r.staged) == (1, 0, 0, 2)
    assert notes(target) == {1: ("c", P(14).encode())}


def test_delete_applies_only_when_newer(target):
    target.ensure_table(ORDERS)
    merge(target, ORDERS, [order(1, 20, op="insert"), order(2, 20, op="insert")], P(21))
    target.reset_applied(SOURCE, ORDERS)  # let older positions reach the row guard
    r = merge(target, ORDERS, [{"id": 1, "op": "delete", "pos": P(15)}], P(22))
    assert r.deleted == 0 and target.count(ORDERS) == 2
    r = merge(target, ORDERS, [{"id": 1, "op": "delete", "pos": P(30)},
                               {"id": 3, "op": "delete", "pos": P(31)}], P(40))
    assert (r.deleted, r.stale) == (1, 1)
    assert set(notes(target)) == {2}
    # a delete followed by a re-insert in the same batch: the insert is newer
    r = merge(target, ORDERS, [{"id": 2, "op": "delete", "pos": P(41)}, order(2, 42, op="insert", note="back")],
              P(50))
    assert (r.updated, r.deleted) == (1, 0)
    assert notes(target) == {2: ("back", P(42).encode())}


def test_replay_changes_nothing(target):
    target.ensure_table(ORDERS)
    rows = [order(1, 10, op="insert"), order(2, 11, op="insert"), order(3, 12, op="insert")]
    merge(target, ORDERS, rows, P(20))
    batch = [order(1, 21, note="x"), {"id": 2, "op": "delete", "pos": P(22)}, order(4, 23, op="insert")]
    first = merge(target, ORDERS, batch, P(30))
    assert (first.inserted, first.updated, first.deleted) == (1, 1, 1)
    before = target.rows(ORDERS, with_pos=True)
    again = merge(target, ORDERS, batch, P(30))
    assert (again.inserted, again.updated, again.deleted, again.checkpoint_moved) == (0, 0, 0, False)
    # an older batch replayed after a delete cannot bring the deleted row back
    old = merge(target, ORDERS, rows, P(20))
    assert (old.inserted, old.updated) == (0, 0)
    assert target.rows(ORDERS, with_pos=True) == before
    assert target.applied_pos(SOURCE, ORDERS) == P(30)


def test_checkpoint_never_moves_back(target):
    target.ensure_table(ORDERS)
    assert merge(target, ORDERS, [order(1, 5, op="insert")], P(50)).checkpoint_moved
    assert not merge(target, ORDERS, [], P(40)).checkpoint_moved
    assert target.applied_pos(SOURCE, ORDERS) == P(50)
    assert not target.advance_applied(SOURCE, ORDERS, P(45))
    assert target.advance_applied(SOURCE, ORDERS, P(60))
    assert target.applied_pos(SOURCE, ORDERS) == P(60)
    # checkpoints are per (source, table)
    assert target.applied_pos("other", ORDERS) is None
    assert target.applied_pos(SOURCE, LINES) is None


def test_composite_keys(target):
    target.ensure_table(LINES)

    def line(o, s, q, pos, op="update"):
        return {"order_id": o, "sku": s, "qty": q, "op": op, "pos": P(pos)}

    merge(target, LINES, [line(1, "a", 1, 10, "insert"), line(1, "b", 2, 11, "insert"),
                          line(2, "a", 3, 12, "insert")], P(20))
    r = merge(target, LINES, [line(1, "a", 5, 21), line(1, "b", None, 22, "delete"),
                              line(2, "a", 9, 19), line(2, "b", 7, 23, "insert")], P(30))
    assert (r.inserted, r.updated, r.deleted) == (1, 1, 1)
    got = [(x["order_id"], x["sku"], x["qty"]) for x in target.rows(LINES)]
    assert got == [(1, "a", 5), (2, "a", 3), (2, "b", 7)]


def _waiting_on_advisory_lock(conn) -> bool:
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                    "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())")
        return cur.fetchone()[0] == 1


def test_merge_waits_for_the_table_lock(target, pg_endpoint):
    """Two applies of the same table never interleave: the merge waits for the advisory lock."""
    target.ensure_table(ORDERS)
    name = stage(target, ORDERS, [order(1, 10, op="insert")])
    other = psycopg2.connect(host="127.0.0.1", port=PG_PORT, user="postgres", dbname=pg_endpoint.database)
    cur = other.cursor()
    target._lock(cur, ORDERS)  # holds it until commit
    done = threading.Event()
    t = threading.Thread(target=lambda: (target.merge_from_stage(ORDERS, name, SOURCE, P(20)), done.set()))
    t.start()
    watcher = psycopg2.connect(host="127.0.0.1", port=PG_PORT, user="postgres", dbname=pg_endpoint.database)
    watcher.autocommit = True
    try:   # the merge's session is seen queued on the advisory lock (not a sleep: an observation)
        wait_until(lambda: _waiting_on_advisory_lock(watcher), 10, "the merge did not queue on the table lock")
    finally:
        watcher.close()
    assert not done.is_set()
    other.commit()
    t.join(10)
    assert done.is_set() and target.count(ORDERS) == 1
    other.close()


def test_drop_all(target):
    target.ensure_table(ORDERS)
    target.ensure_table(LINES)
    name = stage_table_name(ORDERS, "zz")
    target.create_stage(ORDERS, name)
    with target.conn, target.conn.cursor() as cur:
        cur.execute(sql.SQL("CREATE TABLE {}.unrelated (x int)").format(sql.Identifier(target.schema)))
    dropped = set(target.drop_all())
    assert dropped == {"shop__orders", "shop__order_lines", "dblog_apply_state", name}
    assert not target.exists(ORDERS)
