"""The demo: seed a shop database, write to it concurrently, and prove the target converges.

Once per source of the config (MariaDB, PostgreSQL; devenv/shop.py has each one's SQL).
Flow: reset -> seed (>= 1M rows, DECIMAL, DATETIME(6), JSON, NULLs, BLOB, a
composite key) -> start the log tail (own process) -> start writers (inserts,
updates, deletes, many aimed just past the chunk being read) -> full dump on
Spark -> stop writers -> drain the log -> apply on Spark -> compare every row.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

from ..engine.config import Config, SourceConfig, TargetConfig
from ..engine.apply import run_apply
from ..engine.jobs import run_spark_job
from ..engine.sources import open_source
from ..engine.wiring import Wiring
from ..engine.verify import compare_source_target
from .shop import SHOPS

def reset(cfg: Config, shop, src: SourceConfig, tgt: TargetConfig) -> None:
    shop.reset()
    Wiring(cfg, src.name).state.reset()
    for kind in ("events", "chunks"):   # this source's files only
        shutil.rmtree(os.path.join(cfg.storage_root, kind, src.name), ignore_errors=True)
    from ..engine.targets import open_target
    with open_target(tgt) as target:
        target.drop_all()


class Writers:
    """Concurrent application writes; about half aimed at keys just past the chunk in progress."""

    def __init__(self, cfg: Config, shop, src: SourceConfig, sizes: dict[str, int], n: int,
                 rate: float = 150.0):
        self.cfg, self.shop, self.sizes, self.n, self.rate = cfg, shop, sizes, n, rate
        self.stop = threading.Event()
        self.ops = {"insert": 0, "update": 0, "delete": 0, "near_chunk": 0}
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.next_id = {t: sizes[t] + 1 for t in ("shop.customers", "shop.orders")}
        self.state = Wiring(cfg, src.name).state
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(n)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def finish(self) -> dict:
        self.stop.set()
        for t in self.threads:
            t.join()
        return dict(self.ops)

    def _near_chunk(self, table: str) -> int | None:
        """A key just past the last completed chunk of a running dump, if any."""
        for rid in self.state.requests(1):
            prog = self.state.progress(rid, table)
            if prog.get("last_key"):
                return json.loads(prog["last_key"])[0] + random.randint(1, 2000)
        return None

    def _id(self, table: str, rng: random.Random) -> tuple[int, bool]:
        near = self._near_chunk(table) if rng.random() < 0.5 else None
        if near is not None:
            return near, True
        with self.lock:
            top = self.next_id.get(table, self.next_id["shop.orders"])  # items hang off orders
        return rng.randint(1, top), False

    def _run(self, i: int) -> None:
        rng = random.Random(i)
        conn = self.shop.connect()
        cur = conn.cursor()
        period = self.n / self.rate
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                self._one(cur, rng)
            except self.shop.integrity_errors:
                pass  # a racing writer took the key; the op simply did not happen
            except Exception as e:  # keep writing; the demo reports it
                self.errors.append(f"{type(e).__name__}: {e}")
            time.sleep(max(0.0, period - (time.monotonic() - t0)))
        conn.close()

    def _count(self, op: str, near: bool) -> None:
        with self.lock:
            self.ops[op] += 1
            self.ops["near_chunk"] += near

    def _one(self, cur, rng: random.Random) -> None:
        table = rng.choice(["shop.customers", "shop.orders", "shop.order_items"])
        op = rng.choices(["insert", "update", "delete"], [3, 5, 2])[0]
        if table == "shop.order_items":
            oid, near = self._id("shop.order_items", rng)
            line = rng.randint(1, 5)
            if op == "insert":
                cur.execute(self.shop.upsert_item, (oid, line, f"SKU-{rng.randint(1, 999)}", rng.randint(1, 9), f"{rng.uniform(1, 99):.2f}"))
            elif op == "update":
                cur.execute("UPDATE order_items SET qty=qty+1, price=price+0.01 WHERE order_id=%s", (oid,))
            else:
                cur.execute("DELETE FROM order_items WHERE order_id=%s AND line_no=%s", (oid, line))
            self._count(op, near)
            return
        if op == "insert":
            with self.lock:
                key = self.next_id[table]
                self.next_id[table] += 1
            near = False
        else:
            key, near = self._id(table, rng)
        if table == "shop.customers":
            if op == "insert":
                cur.execute(self.shop.insert_customer, (key, f"new {key}", None, f"{rng.uniform(0, 999):.2f}",
                             json.dumps({"tier": rng.randint(0, 3), "new": True}), os.urandom(16), "inserted"))
            elif op == "update":
                cur.execute(self.shop.update_customer, (rng.randint(0, 10**6), key))
            else:
                cur.execute("DELETE FROM customers WHERE id=%s", (key,))
        else:
            if op == "insert":
                cur.execute(self.shop.insert_order, (key, rng.randint(1, 1000), f"{rng.uniform(1, 500):.2f}"))
            elif op == "update":
                # a multi-row transaction: the order and its items move together
                cur.execute("BEGIN")
                cur.execute("UPDATE orders SET status='paid', total=total+1 WHERE id=%s", (key,))
                cur.execute("UPDATE order_items SET qty=qty+1 WHERE order_id=%s", (key,))
                cur.execute("COMMIT")
            else:
                cur.execute("DELETE FROM orders WHERE id=%s", (key,))
        self._count(op, near)


def _wait_drained(cfg: Config, src_cfg: SourceConfig, timeout: float = 300) -> None:
    src = open_source(src_cfg)
    head, _ = src.current_resume()
    src.close()
    state = Wiring(cfg, src_cfg.name).state
    deadline = time.monotonic() + timeout
    while True:
        cp = state.checkpoint()
        if cp and cp.pos >= head:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the tail did not reach the log head {head} in {timeout}s (at {cp.pos if cp else None})")
        time.sleep(0.2)


class EngineFlow:
    """The flow with the ``dblog`` command and spark-submit, outside Airflow."""
    name = "engine"

    def __init__(self, cfg: Config, src: SourceConfig, tgt: TargetConfig):
        self.cfg, self.src, self.tgt = cfg, src, tgt

    def start_tail(self) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "airflow_provider_dblog.cli", "--config", self.cfg.path,
               "--source", self.src.name, "tail", "--seconds", "86400"]
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL)

    def full_dump_and_apply(self, state) -> str:
        from ..engine.requests import DumpSpec, validate_spec
        with open_source(self.src) as source:
            spec = validate_spec(source, DumpSpec("all", []), self.cfg.dump)
        rid = state.create_request(spec.to_dict())
        run_spark_job(self.cfg, "dump_job", ["--config", self.cfg.path, "--source", self.src.name,
                                             "--request", rid])
        self.apply()
        return rid

    def apply(self) -> None:
        # in-process for the log's trickle, on Spark for a dump's snapshot (apply.local_max_events)
        run_apply(self.cfg, self.tgt.name)


class AirflowFlow:
    """The same flow through the provider's DAGs (``airflow dags test``, SQLite metadata):
    the continuous tail DAG, the repair DAG's form with scope "all" (create, dump on Spark,
    apply), and the apply DAG."""
    name = "airflow"

    def __init__(self, cfg: Config, src: SourceConfig, tgt: TargetConfig):
        from .airflow_local import LocalAirflow
        self.cfg, self.tgt = cfg, tgt
        self.source = src.name
        self.main = LocalAirflow(cfg.path, "airflow")
        self.tail_home = LocalAirflow(cfg.path, "airflow-tail")  # SQLite: one writer per home

    def start_tail(self) -> subprocess.Popen:
        from .servers import default_base
        return self.tail_home.start_dag_test(f"dblog_tail__{self.source}",
                                             log_path=default_base() / "airflow-tail" / "demo-tail.log")

    def _run(self, dag_id: str, conf: dict | None = None) -> None:
        ok, out = self.main.dag_test(dag_id, conf)
        if not ok:
            raise RuntimeError(f"DAG {dag_id} failed:\n{out[-4000:]}")

    def full_dump_and_apply(self, state) -> str:
        before = set(state.requests(1000))
        self._run(f"dblog_repair__{self.source}", {"scope": "all"})
        new = [r for r in state.requests(1000) if r not in before]
        if len(new) != 1 or state.request(new[0])["status"] != "done":
            raise RuntimeError(f"the repair DAG did not complete a dump request: {new}")
        return new[0]

    def apply(self) -> None:
        self._run(f"dblog_apply__{self.tgt.name}")


def run_demo(cfg: Config, rows: int = 1_000_000, writers: int = 2, via: str = "airflow",
             sources: list[str] | None = None, target_kind: str = "postgres") -> int:
    """The demo for each named source (default: every source of the config), in turn, into
    its target of ``target_kind`` (postgres, delta or iceberg)."""
    failed = 0
    for name in sources or list(cfg.sources):
        failed += run_demo_source(cfg, cfg.source(name), rows, writers, via, target_kind)
    return 1 if failed else 0


def run_demo_source(cfg: Config, src_cfg: SourceConfig, rows: int, writers: int, via: str,
                    target_kind: str = "postgres") -> int:
    t_start = time.monotonic()
    tgt_cfg = next((t for t in cfg.targets.values() if t.source == src_cfg.name and t.kind == target_kind), None)
    if tgt_cfg is None:
        print(f"[demo] the config has no {target_kind} target of source {src_cfg.name}")
        return 1
    shop = SHOPS[src_cfg.kind](src_cfg)
    print(f"[demo] source {src_cfg.name} ({src_cfg.kind}) -> target {tgt_cfg.name}: resetting "
          f"and seeding {rows:,} rows ...", flush=True)
    reset(cfg, shop, src_cfg, tgt_cfg)
    t0 = time.monotonic()
    sizes = shop.seed(rows)
    print(f"[demo] seeded {sizes} in {time.monotonic() - t0:.1f}s", flush=True)
    source = open_source(src_cfg)
    problems = source.check()
    if problems:
        print("[demo] source set-up problems:\n  " + "\n  ".join(map(str, problems)))
        return 1
    flow = (AirflowFlow if via == "airflow" else EngineFlow)(cfg, src_cfg, tgt_cfg)
    state = Wiring(cfg, src_cfg.name).state
    tail = flow.start_tail()
    try:
        while state.checkpoint() is None:  # the tail starts at the log's end
            if tail.poll() is not None:
                print("[demo] the tail exited early")
                return 1
            time.sleep(0.1)
        w = Writers(cfg, shop, src_cfg, sizes, writers)
        w.start()
        print(f"[demo] tail running ({flow.name}); {writers} writers running; full dump on Spark "
              "and apply ...", flush=True)
        t_dump = time.monotonic()
        try:
            rid = flow.full_dump_and_apply(state)
        finally:
            ops = w.finish()
        dump_s = time.monotonic() - t_dump
        print(f"[demo] dump + apply done in {dump_s:.1f}s; writers stopped: {ops}", flush=True)
        _wait_drained(cfg, src_cfg)
    finally:
        tail.send_signal(signal.SIGTERM)  # finishes the transaction in hand, flushes, checkpoints
        tail.wait(timeout=180)
    print("[demo] log drained; applying the rest ...", flush=True)
    t_apply = time.monotonic()
    flow.apply()
    apply_s = time.monotonic() - t_apply
    print("[demo] verifying target == source, row for row ...", flush=True)
    from ..engine.targets import target_table_name
    diffs = [compare_source_target(src_cfg, tgt_cfg, source.table_schema(t),
                                   target_table_name(source.table_schema(t))) for t in src_cfg.tables]
    counters = state.counters()
    progress = {t: state.progress(rid, t) for t in src_cfg.tables}
    dumped = sum(p.get("rows", 0) for p in progress.values())
    summary = {
        "source": f"{src_cfg.name} ({src_cfg.kind})",
        "via": flow.name,
        "rows_dumped": dumped,
        "chunks": counters.get("chunks", 0),
        "windows": counters.get("chunks", 0),
        "chunk_rows_dropped_as_stale": counters.get("stale_rows_dropped", 0),
        "events_tailed": counters.get("events_tailed", 0),
        "writes": ops,
        "writer_errors": len(w.errors),
        "dump_and_apply_seconds": round(dump_s, 1),
        "dump_rows_per_s": round(dumped / dump_s) if dump_s else None,
        "final_apply_seconds": round(apply_s, 1),
        "total_seconds": round(time.monotonic() - t_start, 1),
        "source_rows_now": sum(d.source_rows for d in diffs),
        "target_equals_source": all(d.equal for d in diffs),
    }
    print("[demo] " + "\n[demo] ".join(d.describe() for d in diffs))
    print("[demo] summary " + json.dumps(summary, indent=2))
    if w.errors:
        print(f"[demo] writer errors (first 3): {w.errors[:3]}")
    return 0 if summary["target_equals_source"] else 1
