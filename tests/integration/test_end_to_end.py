"""The engine end to end on real servers, once per source kind (MariaDB binlog,
PostgreSQL logical replication): the log tail, Spark chunk dumps inside LW/HW
windows, reconciliation, and Spark apply into PostgreSQL.

Invariants proved here: 1 (positions only grow per key in the target, across
applies made while the dump runs), 2 (the target equals the source after the
log drains, whatever the concurrent writer did), 5 (resume and restart lose
and duplicate nothing).
"""
from __future__ import annotations

import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from airflow_provider_dblog.engine.apply import run_apply
from airflow_provider_dblog.engine.dump import DumpRunner
from airflow_provider_dblog.engine.requests import DumpSpec
from airflow_provider_dblog.engine.targets import target_table_name
from helpers import crash

# sizes: enough rows for five chunks of ``items`` and two of ``order_lines`` (what the test
# counts); more rows only make each chunk longer, not the windows more numerous
ROWS = 20_000
CHUNK = 4_000
LINES = 6_000


def create_items(sdb, rows: int, lines: int = LINES) -> None:
    t = sdb.types
    with sdb.cursor() as cur:
        sdb.create_table(cur, "items", f"""
            id BIGINT PRIMARY KEY, name VARCHAR(40), price DECIMAL(10,2) NOT NULL,
            updated {t['datetime']} NOT NULL, doc {t['json']} NULL, blob_col {t['blob']} NULL""")
        cur.execute(f"""INSERT INTO items SELECT seq, CONCAT('item', seq), (seq % 1000) / 4.0,
                        {sdb.ts_plus_seconds('seq')},
                        CASE WHEN seq % 3 = 0 THEN NULL ELSE {sdb.json_object('n', 'seq')} END,
                        CASE WHEN seq % 2 = 0 THEN NULL ELSE {sdb.md5_bytes('seq')} END
                        FROM {sdb.series(rows)}""")
        sdb.create_table(cur, "order_lines", """
            order_id INT NOT NULL, line VARCHAR(8) NOT NULL, qty INT NOT NULL,
            PRIMARY KEY (order_id, line)""")
        cur.execute(f"INSERT INTO order_lines SELECT FLOOR(seq / 3), CONCAT('L', seq % 3), seq % 7 "
                    f"FROM {sdb.series(lines)}")


class Writer(threading.Thread):
    """Random inserts, updates and deletes, many of them inside the chunk being read."""

    def __init__(self, sdb, cdc, rows: int, seed: int = 7):
        super().__init__(daemon=True)
        self.sdb, self.db, self.cdc, self.rows = sdb, sdb.name, cdc, rows
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.ops = 0
        self.error: BaseException | None = None

    def hot_key(self) -> int:
        for rid in self.cdc.state.requests(1):
            last = self.cdc.state.progress(rid, f"{self.db}.items").get("last_key")
            if last:
                return int(last.strip("[]")) + self.rng.randint(1, CHUNK * 5 // 4)  # the chunk being read
        return self.rng.randint(1, self.rows)

    def run(self) -> None:
        try:
            sdb = self.sdb
            with sdb.cursor() as cur:
                while not self.stop.is_set():
                    k = self.hot_key()
                    op = self.rng.random()
                    if op < 0.45:
                        cur.execute(f"UPDATE items SET price = price + 1, updated = {sdb.now}, "
                                    f"doc = {sdb.json_object('v', '%s')} WHERE id = %s", (self.ops, k))
                    elif op < 0.65:
                        cur.execute("DELETE FROM items WHERE id = %s", (k,))
                    elif op < 0.85:  # replace the row, in one transaction
                        cur.execute("BEGIN")
                        cur.execute("DELETE FROM items WHERE id = %s", (k,))
                        cur.execute(f"INSERT INTO items VALUES (%s, 'again', 1.5, {sdb.now}, NULL, %s)",
                                    (k, b"\x00\xff"))
                        cur.execute("COMMIT")
                    else:
                        o = self.rng.randint(0, LINES // 3)
                        cur.execute("BEGIN")
                        cur.execute("UPDATE order_lines SET qty = qty + 1 WHERE order_id = %s", (o,))
                        cur.execute("DELETE FROM order_lines WHERE order_id = %s AND line = 'L1'", (o + 1,))
                        cur.execute(sdb.insert_or_skip("order_lines", "%s, 'L9', 1", "order_id, line"), (o,))
                        cur.execute("COMMIT")
                    self.ops += 1
                    # a write every few ms: still hundreds inside each chunk's window, while the
                    # log the tail decodes and the applies merge stays small enough to keep pace
                    time.sleep(0.005)
        except BaseException as e:
            self.error = e


def target_positions(cdc, table: str) -> dict:
    schema = cdc.source.table_schema(f"{cdc.db}.{table}")
    with cdc.target() as target, target.conn.cursor() as cur:
        cur.execute(f'SELECT {", ".join(schema.key)}, _dblog_pos FROM "public"."{target_table_name(schema)}"')
        return {tuple(r[:-1]): r[-1] for r in cur.fetchall()}


def test_full_dump_with_concurrent_writer_converges(src_db, make_cdc):
    create_items(src_db, ROWS)
    cdc = make_cdc(["items", "order_lines"], dump={"chunk_size": CHUNK})
    cdc.start_tail()
    writer = Writer(src_db, cdc, ROWS)
    writer.start()
    rid = cdc.request(DumpSpec("all", []))
    seen: dict = {}
    regressions = []

    def check_positions():
        for table in ("items", "order_lines"):
            for key, pos in target_positions(cdc, table).items():
                before = seen.get((table, key))
                if before is not None and pos < before:
                    regressions.append((table, key, before, pos))
                seen[(table, key)] = pos

    # half the dump; then the rest of it, and meanwhile an apply (the writer going all along):
    # two spark-submits side by side, as a scheduler would run them, instead of one after
    # the other (the apply's frontier stops below any window the dump has open)
    first = cdc.dump_spark(rid, max_chunks=3)
    assert first["status"] == "paused" and first["chunks"] == 3
    with ThreadPoolExecutor(1) as pool:
        rest_of_dump = pool.submit(cdc.dump_spark, rid)
        cdc.apply()
        check_positions()
        rest = rest_of_dump.result()
    assert rest["status"] == "done"
    cdc.apply()
    check_positions()
    writer.stop.set()
    writer.join()
    assert writer.error is None, writer.error
    assert writer.ops > 100
    cdc.drain()
    cdc.apply()
    check_positions()
    assert not regressions, regressions[:5]
    for table in ("items", "order_lines"):
        diff = cdc.compare(table)
        assert diff.equal, diff.describe()
        assert diff.source_rows > 0
    counters = cdc.state.counters()
    assert counters["chunks"] == 5 + 2  # 20k items in 4k chunks, 6k lines in 4k chunks
    assert counters["snapshot_rows"] > 0
    assert not cdc.state.open_windows()


def test_key_list_dump_reports_missing_and_repairs_target(src_db, make_cdc):
    db = src_db.name
    create_items(src_db, 2_000)
    cdc = make_cdc(["items", "order_lines"])
    cdc.start_tail()
    # set-up: the target as a full dump leaves it, its chunks read and applied in-process (the
    # same runner, windows, stage and merge, engine/dump.py and engine/apply_batch.py; the full
    # dump and its apply on Spark are the test above); the repair under test, below, is
    # dumped and applied on Spark
    cdc.dump_local("items", cdc.request(DumpSpec("all", [])))
    run_apply(cdc.cfg, "tgt", via="local")
    assert cdc.compare("items").equal
    # corrupt the target: a changed row, a deleted row, a row that never existed
    schema = cdc.source.table_schema(f"{db}.items")
    rel = target_table_name(schema)
    with cdc.target() as target, target.conn.cursor() as cur:
        cur.execute(f'UPDATE "public"."{rel}" SET price = 9999 WHERE id = 10')
        cur.execute(f'DELETE FROM "public"."{rel}" WHERE id = 11')
        cur.execute(f'INSERT INTO "public"."{rel}" (id, name, price, updated, _dblog_pos) '
                    f"SELECT 999999, 'ghost', 1, now(), _dblog_pos FROM \"public\".\"{rel}\" WHERE id = 12")
        target.conn.commit()
    assert not cdc.compare("items").equal
    keys = [10, 11, "12", 999999, 123456789]
    rid = cdc.request(DumpSpec("keys", [f"{db}.items"], keys))
    out = cdc.dump_spark(rid)
    assert out["status"] == "done"
    progress = cdc.state.progress(rid, f"{db}.items")
    assert sorted(k[0] for k in progress["missing"]) == [999999, 123456789]
    assert progress["rows"] == 3
    cdc.drain()
    cdc.apply()
    diff = cdc.compare("items")
    assert diff.equal, diff.describe()


def test_interrupted_dump_resumes_from_last_completed_chunk(src_db, make_cdc, tmp_path):
    db = src_db.name
    create_items(src_db, 5_000)
    # the resume waits for the dead runner's request lease to lapse: a short one keeps the test short
    cdc = make_cdc(["items"], dump={"chunk_size": 1_000, "lease_seconds": 5})
    cdc.start_tail()
    rid = cdc.request(DumpSpec("table", [f"{db}.items"]))
    assert cdc.dump_spark(rid, max_chunks=2)["status"] == "paused"
    assert cdc.state.progress(rid, f"{db}.items")["last_key"] == "[2000]"

    # the dump process dies (SIGKILL) inside the next chunk's select, between its LW and HW
    window = crash("dump", cdc.path, tmp_path / "marker", "--request", rid)
    assert cdc.state.request(rid)["status"] == "running"  # nothing ran to say otherwise
    assert [w.id for w in cdc.state.open_windows()] == [window]  # the crashed chunk's window holds apply back
    assert cdc.state.progress(rid, f"{db}.items")["last_key"] == "[2000]"
    with src_db.cursor() as cur:
        cur.execute("UPDATE items SET price = 0 WHERE id IN (5, 2500, 4500)")
        cur.execute("DELETE FROM items WHERE id = 3000")
    out = cdc.dump_spark(rid)
    assert out["status"] == "done"
    progress = cdc.state.progress(rid, f"{db}.items")
    assert progress["chunks"] == 5  # 2 before the crash + the 3 left; none redone twice
    assert progress["rows"] == 4_999  # row 3000 deleted before its chunk was read
    assert not cdc.state.open_windows()
    closed = [json.loads(w) for w in cdc.state.r.lrange(cdc.state.k("windows_closed"), 0, -1)]
    assert sorted(w["outcome"] for w in closed).count("abandoned") == 1
    cdc.drain()
    cdc.apply()
    diff = cdc.compare("items")
    assert diff.equal, diff.describe()


def test_where_dump_picks_keys_with_bound_parameters_and_repairs_them(src_db, make_cdc):
    db = src_db.name
    create_items(src_db, 2_000)
    cdc = make_cdc(["items"], dump={"chunk_size": 500})
    cdc.start_tail()
    runner = DumpRunner(cdc.source, cdc.state, cdc.store, None, cdc.cfg.dump)  # by key: no Spark
    rid = runner.submit(DumpSpec("where", [f"{db}.items"], where="id <= 2000"))
    assert runner.run(rid).total("rows") == 2_000
    assert cdc.state.progress(rid, f"{db}.items")["chunks"] == 4
    cdc.drain()
    cdc.apply()
    assert cdc.compare("items").equal
    schema = cdc.source.table_schema(f"{db}.items")
    with cdc.target() as target, target.conn.cursor() as cur:
        cur.execute(f'UPDATE "public"."{target_table_name(schema)}" SET name = \'broken\' WHERE id IN (5, 6, 900)')
        target.conn.commit()
    assert len(cdc.compare("items").different) == 3
    # the condition's text is data: a quote in it stays a value, it never becomes SQL
    rid = runner.submit(DumpSpec("where", [f"{db}.items"],
                                 where="(id BETWEEN 5 AND 6 OR name = 'item900') AND name <> 'x'' OR 1=1 --'"))
    assert cdc.state.request(rid)["spec"]["keys"] == [[5], [6], [900]]
    assert runner.run(rid).total("rows") == 3
    cdc.drain()
    cdc.apply()
    diff = cdc.compare("items")
    assert diff.equal, diff.describe()
