"""A full-table dump deletes target rows whose key the source no longer has (engine/sweep.py),
on both source kinds, on both apply paths, and never a row the source still has, even while
a writer inserts and deletes during the dump."""
from __future__ import annotations

import threading
import time

import pytest

from airflow_provider_dblog.cli import status
from airflow_provider_dblog.engine.apply import run_apply
from airflow_provider_dblog.engine.requests import DumpSpec
from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.state import RedisState
from airflow_provider_dblog.engine.sweep import orphan_sweep
from airflow_provider_dblog.engine.targets import target_table_name

from helpers import REDIS_PORT, StuckCommit

ROWS = 6_000


def ghost(cdc, table: str, values: dict) -> None:
    """A row only the target has, written as if by an old event (position 0-1-0, before any)."""
    rel = target_table_name(cdc.source.table_schema(f"{cdc.db}.{table}"))
    cols = list(values) + ["_dblog_pos"]
    with cdc.target() as target, target.conn.cursor() as cur:
        cur.execute(f'INSERT INTO "public"."{rel}" ({", ".join(cols)}) VALUES ({", ".join(["%s"] * len(cols))})',
                    [*values.values(), Position(0, 1, 0).encode()])
        target.conn.commit()


class NewRows(threading.Thread):
    """Inserts keys above the table's max and deletes a few old rows, while the dump runs."""

    def __init__(self, sdb):
        super().__init__(daemon=True)
        self.sdb, self.stop, self.n, self.error = sdb, threading.Event(), 0, None

    def run(self):
        try:
            with self.sdb.cursor() as cur:
                while not self.stop.is_set():
                    self.n += 1
                    cur.execute("INSERT INTO items VALUES (%s, %s)", (ROWS + self.n, f"new{self.n}"))
                    if self.n % 10 == 0:
                        cur.execute("DELETE FROM items WHERE id = %s", (self.n,))
                    time.sleep(0.01)  # writes all through the dump, not more than the applies need to merge
        except BaseException as e:  # noqa: BLE001 - surfaced by the test
            self.error = e


@pytest.mark.parametrize("via", ["spark", "local"])
def test_full_dump_deletes_orphans_and_nothing_else(src_db, make_cdc, via):
    db = src_db.name
    with src_db.cursor() as cur:
        src_db.create_table(cur, "items", "id BIGINT PRIMARY KEY, name VARCHAR(40)")
        cur.execute(f"INSERT INTO items SELECT seq, CONCAT('item', seq) FROM {src_db.series(ROWS)}")
        src_db.create_table(cur, "olines", "o INT NOT NULL, line VARCHAR(8) NOT NULL, qty INT, PRIMARY KEY (o, line)")
        cur.execute(f"INSERT INTO olines SELECT seq, 'L1', seq FROM {src_db.series(500)}")
        src_db.create_table(cur, "empty_t", "id INT PRIMARY KEY")
    cdc = make_cdc(["items", "olines", "empty_t"], dump={"chunk_size": 2_000})
    cdc.start_tail()
    # the set-up's dump reads its chunks in-process and its two applies run in-process, on
    # both params: they only bring the target to the dump's state (the same runner, windows,
    # stage and merge: engine/dump.py, engine/apply_batch.py; test_end_to_end and
    # test_type_fidelity dump and apply on Spark); the dump under test, below, runs on
    # Spark, and the applies that sweep take ``via`` (three spark-submits fewer per source)
    cdc.dump_local("items", cdc.request(DumpSpec("all", [])))
    run_apply(cdc.cfg, "tgt", via="local")
    assert all(cdc.compare(t).equal for t in ("items", "olines", "empty_t"))

    # rows the source lost without a log event (or that someone put into the target)
    ghost(cdc, "items", {"id": 10**9, "name": "ghost"})
    ghost(cdc, "olines", {"o": 7, "line": "L9", "qty": 0})
    ghost(cdc, "empty_t", {"id": 42})
    with src_db.cursor() as cur:  # id 3 really leaves the source, so its ghost is an orphan
        cur.execute("DELETE FROM items WHERE id = 3")
    cdc.drain()
    run_apply(cdc.cfg, "tgt", via="local")  # the delete of 3 is applied; the ghost re-added below
    ghost(cdc, "items", {"id": 3, "name": "ghost"})  # between real keys
    assert not cdc.compare("items").equal

    writer = NewRows(src_db)
    writer.start()
    rid = cdc.request(DumpSpec("all", []))
    try:
        assert cdc.dump_spark(rid)["status"] == "done"
        # a sweep waits for the apply to pass the dump's last window
        sweep = cdc.state.sweep(f"{db}.items")
        assert sweep["request"] == rid
        assert Position.decode(sweep["below"]) < Position.decode(sweep["until"])
    finally:
        writer.stop.set()
        writer.join()
    assert writer.error is None, writer.error
    assert writer.n > 20
    cdc.drain()
    result = run_apply(cdc.cfg, "tgt", via=via)
    assert result["orphans_deleted"] == 4, result
    assert result["tables"][f"{db}.items"]["orphans_deleted"] == 2
    assert result["tables"][f"{db}.empty_t"]["orphans_deleted"] == 1
    for t in ("items", "olines", "empty_t"):
        diff = cdc.compare(t)
        assert diff.equal, diff.describe()
    assert cdc.compare("items").source_rows == ROWS - 1 + writer.n - writer.n // 10
    swept = cdc.state.request(rid)[f"swept:{db}.items:tgt"]
    assert '"orphans_deleted": 2' in swept
    shown = status(cdc.cfg)["orphan_sweeps"][f"{db}.items"]  # `dblog status`
    assert shown["request"] == rid and shown["done_by"]["tgt"]["orphans_deleted"] == 2
    # done once per target: a later apply sweeps nothing, and a later ghost stays until the next dump
    ghost(cdc, "items", {"id": 10**9 + 1, "name": "late"})
    again = run_apply(cdc.cfg, "tgt", via=via)
    assert again["orphans_deleted"] == 0 and cdc.state.pending_sweep(f"{db}.items", "tgt") is None
    assert not cdc.compare("items").equal


def test_a_key_list_dump_registers_no_sweep(src_db, make_cdc):
    db = src_db.name
    with src_db.cursor() as cur:
        src_db.create_table(cur, "items", "id BIGINT PRIMARY KEY, name VARCHAR(40)")
        cur.execute("INSERT INTO items VALUES (1, 'a'), (2, 'b')")
    cdc = make_cdc(["items"])
    cdc.start_tail()
    rid = cdc.request(DumpSpec("keys", [f"{db}.items"], [1, 5]))
    assert cdc.dump_spark(rid)["status"] == "done"
    assert cdc.state.sweep(f"{db}.items") is None


def test_sweep_registry_keeps_the_newest_per_table_and_tracks_each_target(servers, redis_prefix):
    state = RedisState(f"redis://127.0.0.1:{REDIS_PORT}/0", redis_prefix, "src")
    enc = lambda *p: Position(*p).encode()  # noqa: E731
    progress = {"done": True, "head_before": enc(1, 100), "last_hw": enc(1, 500)}
    old = orphan_sweep("r1", "d.t", progress)
    assert old == {"request": "r1", "table": "d.t", "below": enc(1, 100), "until": enc(1, 501)}
    assert orphan_sweep("r0", "d.t", {**progress, "last_hw": None, "head_end": enc(1, 120)})["until"] == enc(1, 120)
    assert orphan_sweep("r0", "d.t", {**progress, "head_end": enc(1, 900)})["until"] == enc(1, 900)
    assert orphan_sweep("r0", "d.t", {"done": True, "done_keys": 3}) is None                 # key list
    assert orphan_sweep("r0", "d.t", {**progress, "done": False}) is None                    # unfinished
    state.add_sweep(old)
    newer = {**old, "request": "r2", "below": enc(1, 900), "until": enc(1, 1200)}
    state.add_sweep(newer)
    state.add_sweep(old)  # finished later, but started earlier: the newer one covers it
    assert state.sweep("d.t") == newer
    assert state.pending_sweep("d.t", "a") == newer and state.pending_sweep("d.t", "b") == newer
    state.finish_sweep(newer, "a", 5)
    assert state.pending_sweep("d.t", "a") is None and state.pending_sweep("d.t", "b") == newer
    assert state.pending_sweep("d.other", "a") is None
    state.reset()


@pytest.mark.parametrize("src_db", ["postgres"], indirect=True)
def test_a_commit_logged_but_not_yet_visible_is_not_taken_for_an_orphan(src_db, make_cdc):
    """PostgreSQL writes a commit record, and only then makes the transaction visible (a
    synchronous standby's acknowledgement can stand between the two). A dump that reads its
    bounds (the log head, then the max key) in that gap does not see the row, though the log
    holds it before the sweep's lower bound: the sweep looks such a candidate up in the
    source before deleting it (engine/sweep.py). The gap is made to last with a synchronous
    standby that never answers (helpers.StuckCommit)."""
    db = src_db.name
    with src_db.cursor() as cur:
        src_db.create_table(cur, "items", "id BIGINT PRIMARY KEY, name VARCHAR(40)")
        cur.execute("INSERT INTO items SELECT s.seq, 'item' || s.seq FROM generate_series(1, 100) AS s(seq)")
    cdc = make_cdc(["items"])
    with StuckCommit(src_db.database, (cdc.cfg.target("tgt").endpoint.database,)) as stuck:
        cdc.start_tail()
        cdc.dump_local("items")  # set-up: the target as a full dump leaves it (the one under test is below)
        run_apply(cdc.cfg, "tgt", via="local")
        assert cdc.compare("items").equal

        stuck.start(f'INSERT INTO "{db}".items VALUES (1000, %s)', ("logged, not yet visible",))
        deadline = time.monotonic() + 30
        while True:   # the commit record is in the log, the row invisible to every other session
            cdc.drain()
            run_apply(cdc.cfg, "tgt", via="local")
            with cdc.target() as t, t.conn.cursor() as cur:
                cur.execute(f'SELECT count(*) FROM "public"."{db}__items" WHERE id = 1000')
                if cur.fetchone()[0] == 1:
                    break
            assert time.monotonic() < deadline, "the tail never saw the logged commit"
            time.sleep(0.2)
        with src_db.cursor() as cur:
            cur.execute("SELECT count(*) FROM items WHERE id = 1000")
            assert cur.fetchone()[0] == 0 and not stuck.committed.is_set()
        # the bounds are read now; its watermarks wait for the commit (PostgresSource
        # ._await_logged_commits), so it is released meanwhile, as a standby would answer
        rid = cdc.request(DumpSpec("table", [f"{db}.items"]))
        threading.Timer(3.0, stuck.release).start()
        assert cdc.dump_spark(rid)["status"] == "done"
    cdc.drain()
    result = run_apply(cdc.cfg, "tgt", via="local")
    assert result["tables"][f"{db}.items"].get("orphans_deleted") == 0, result
    assert cdc.compare("items").equal, cdc.compare("items").describe()
