"""The chaos loop's moving parts (bench/chaos.py drives them): the tables, the writer, the
tail as a supervised ``dblog tail`` process, the dump runners (processes), the applies.

Every child is a real process in its own session (process group), so a SIGKILL of it
kills what it started too (spark-submit and its JVM); ``kill_group`` is the one way the
harness ends a child.
"""
from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from airflow_provider_dblog.engine.jobs import job_env

log = logging.getLogger("bench.chaos")

TABLES = ("acct", "line", "evt")  # line has a composite key (order_id, line_no)
_DDL = {
    "acct": "id BIGINT PRIMARY KEY, v INT NOT NULL, note VARCHAR(64)",
    "line": "order_id BIGINT NOT NULL, line_no INT NOT NULL, qty INT NOT NULL, price {decimal}(12,2), "
            "PRIMARY KEY (order_id, line_no)",
    "evt": "id BIGINT PRIMARY KEY, kind VARCHAR(16) NOT NULL, at {ts}(6) NULL",
}
DDL = {kind: {t: ddl.format(decimal=d, ts=ts) for t, ddl in _DDL.items()}
       for kind, d, ts in (("mysql", "DECIMAL", "DATETIME"), ("postgres", "NUMERIC", "TIMESTAMP"))}
ORDERS = 300  # line.order_id in 1..ORDERS, line_no in 1..8


def create_tables(src) -> None:
    conn = src.connect()
    try:
        cur = conn.cursor()
        for t in TABLES:
            cur.execute(f"CREATE TABLE {src.qualified(t)} ({DDL[src.kind][t]})")
            if src.kind == "postgres":  # old rows of updates and deletes
                cur.execute(f"ALTER TABLE {src.qualified(t)} REPLICA IDENTITY FULL")
    finally:
        conn.close()


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    """Signal a child's whole process group (it was started in its own session)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass


def spawn(cmd: list[str], logfile: Path) -> subprocess.Popen:
    """A child in its own session, from the repository root (``-m bench.chaos`` resolves there)."""
    with open(logfile, "ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=job_env(), start_new_session=True,
                                cwd=Path(__file__).resolve().parents[1])


def log_tail(path: Path, lines: int = 8) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class Writer(threading.Thread):
    """Small transactions of inserts, updates and deletes on the three tables, an occasional
    larger one; a lost connection (the source restarted) is counted and reconnected."""

    def __init__(self, src, rng: random.Random, pause_s: float = 0.03):
        super().__init__(daemon=True, name="chaos-writer")
        self.src, self.rng, self.pause_s = src, rng, pause_s
        self.stop = threading.Event()
        self.next_acct = self.next_evt = 1
        self.txns = self.rows = self.big_txns = self.errors = 0
        self.last_error = ""
        q = src.qualified
        ignore = "INSERT IGNORE INTO" if src.kind == "mysql" else "INSERT INTO"
        tail = "" if src.kind == "mysql" else " ON CONFLICT DO NOTHING"
        now = "NOW(6)" if src.kind == "mysql" else "clock_timestamp()"
        self.sql = {
            "acct_ins": f"INSERT INTO {q('acct')} (id, v, note) VALUES (%s, %s, %s)",
            "acct_upd": f"UPDATE {q('acct')} SET v = v + 1, note = %s WHERE id = %s",
            "acct_del": f"DELETE FROM {q('acct')} WHERE id = %s",
            "acct_bulk": f"UPDATE {q('acct')} SET v = v + 3 WHERE id %% 13 = %s",
            "line_ins": f"{ignore} {q('line')} (order_id, line_no, qty, price) VALUES (%s, %s, %s, %s){tail}",
            "line_upd": f"UPDATE {q('line')} SET qty = qty + 1, price = price + 0.01 WHERE order_id = %s",
            "line_del": f"DELETE FROM {q('line')} WHERE order_id = %s AND line_no = %s",
            "evt_ins": f"INSERT INTO {q('evt')} (id, kind, at) VALUES (%s, %s, {now})",
            "evt_del": f"DELETE FROM {q('evt')} WHERE id < %s AND id %% 5 = 0",
        }

    def _statement(self, cur) -> int:
        r, sql = self.rng, self.sql
        op = r.random()
        if op < 0.30:
            cur.execute(sql["acct_ins"], (self.next_acct, r.randint(0, 1000), f"n{self.next_acct}"))
            self.next_acct += 1
        elif op < 0.45:
            cur.execute(sql["acct_upd"], (f"u{r.randint(0, 99)}", r.randint(1, self.next_acct)))
        elif op < 0.52:
            cur.execute(sql["acct_del"], (r.randint(1, self.next_acct),))
        elif op < 0.70:
            cur.execute(sql["line_ins"], (r.randint(1, ORDERS), r.randint(1, 8), r.randint(1, 9),
                                          f"{r.randint(1, 9999) / 100:.2f}"))
        elif op < 0.80:
            cur.execute(sql["line_upd"], (r.randint(1, ORDERS),))
        elif op < 0.86:
            cur.execute(sql["line_del"], (r.randint(1, ORDERS), r.randint(1, 8)))
        elif op < 0.98:
            cur.execute(sql["evt_ins"], (self.next_evt, r.choice(("click", "view", "buy"))))
            self.next_evt += 1
        else:
            cur.execute(sql["evt_del"], (max(1, self.next_evt - 50),))
        return max(cur.rowcount, 0)

    def _transaction(self, conn) -> None:
        cur = conn.cursor()
        big = self.rng.random() < 0.02
        cur.execute("BEGIN")
        rows = 0
        if big:  # a larger transaction: a few hundred inserts and a bulk update
            for _ in range(self.rng.randint(100, 400)):
                cur.execute(self.sql["acct_ins"], (self.next_acct, self.rng.randint(0, 1000), "bulk"))
                self.next_acct += 1
                rows += 1
            cur.execute(self.sql["acct_bulk"], (self.rng.randint(0, 12),))
            rows += max(cur.rowcount, 0)
        else:
            for _ in range(self.rng.randint(1, 4)):
                rows += self._statement(cur)
        cur.execute("COMMIT")
        self.txns += 1
        self.big_txns += big
        self.rows += rows

    def run(self) -> None:
        conn = None
        while not self.stop.is_set():
            try:
                if conn is None:
                    conn = self.src.connect()
                self._transaction(conn)
            except Exception as e:  # the source away: reconnect (an unknown commit outcome is fine:
                self.errors += 1     # the compare is against the source itself)
                self.last_error = f"{type(e).__name__}: {e}"[:200]
                with contextlib.suppress(Exception):
                    conn and conn.close()
                conn = None
                self.stop.wait(0.5)
                continue
            self.stop.wait(self.rng.uniform(0, 2 * self.pause_s))
        conn is not None and conn.close()


class TailSupervisor(threading.Thread):
    """``dblog tail --wait-lease`` as a process, started again whenever it exits or is killed.
    ``detach()`` hands the running tail over (a zombie to be) and lets a new one start."""

    def __init__(self, cfg_path: Path, workdir: Path, seconds: int, wait_lease: float):
        super().__init__(daemon=True, name="chaos-tail")
        self.cmd = [sys.executable, "-m", "airflow_provider_dblog.cli", "--config", str(cfg_path), "tail",
                    "--seconds", str(seconds), "--wait-lease", str(wait_lease)]
        self.workdir = workdir
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.exits: list[dict] = []  # every tail that ended: rc and its last lines when not 0

    def _start(self) -> None:
        self.starts += 1
        logf = self.workdir / f"tail-{self.starts}.log"
        self.proc = spawn(self.cmd, logf)
        self.proc.logf = logf  # type: ignore[attr-defined]

    def _reap(self, proc: subprocess.Popen, how: str) -> None:
        rc = proc.returncode
        entry = {"tail": proc.logf.name, "rc": rc, "how": how}  # type: ignore[attr-defined]
        if rc not in (0, -signal.SIGKILL):
            entry["last_lines"] = log_tail(proc.logf)  # type: ignore[attr-defined]
        self.exits.append(entry)

    def run(self) -> None:
        while not self.stop.is_set():
            with self.lock:
                if self.proc is None:
                    self._start()
                elif self.proc.poll() is not None:
                    self._reap(self.proc, "exited")
                    self._start()
            self.stop.wait(0.2)

    def current(self) -> subprocess.Popen | None:
        with self.lock:
            return self.proc if self.proc is not None and self.proc.poll() is None else None

    def detach(self) -> subprocess.Popen | None:
        with self.lock:
            p, self.proc = self.proc, None
            return p

    def reaped(self, proc: subprocess.Popen, how: str) -> None:
        with self.lock:
            self._reap(proc, how)

    def shutdown(self, timeout: float = 30) -> None:
        self.stop.set()
        self.join(5)
        with self.lock:
            p = self.proc
        if p is not None and p.poll() is None:
            kill_group(p, signal.SIGTERM)  # flushes and exits
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                kill_group(p)
                p.wait(10)
        if p is not None:
            self._reap(p, "stopped")


class Dumps(threading.Thread):
    """Requests of random scopes (full table on Spark, key lists with missing keys, conditions),
    one runner process at a time; a runner that did not finish its request is resumed later."""

    def __init__(self, harness, rng: random.Random, spark_every: int):
        super().__init__(daemon=True, name="chaos-dumps")
        self.h, self.rng, self.spark_every = harness, rng, spark_every
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.active: tuple[str, subprocess.Popen, float] | None = None  # (request, process, started)
        self.requests: dict[str, dict] = {}  # rid -> {scope, table, runs, killed, rcs}
        self.submit_errors = 0

    # -- scopes --------------------------------------------------------------------
    def random_spec(self):
        from airflow_provider_dblog.engine.requests import DumpSpec
        r, q, w = self.rng, self.h.src.qualified, self.h.writer
        n = len(self.requests)
        table = r.choice(TABLES)
        if self.spark_every and n % self.spark_every == self.spark_every - 1:
            return DumpSpec("table", [q(table)], chunk_size=r.choice((200, 1000)))
        chunk = r.randint(10, 60)
        if r.random() < 0.3:  # a condition
            hi = max(w.next_acct, 20)
            lo = r.randint(1, hi)
            where = {"acct": f"id >= {lo} AND id < {lo + r.randint(20, 300)}",
                     "line": f"order_id BETWEEN {r.randint(1, ORDERS)} AND {r.randint(1, ORDERS)} OR qty > 5",
                     "evt": f"kind = 'buy' AND id > {r.randint(0, max(w.next_evt, 1))}"}[table]
            return DumpSpec("where", [q(table)], chunk_size=chunk, where=where)
        count = r.randint(20, 400)
        if table == "line":  # composite keys, some missing (line_no 9 never exists)
            keys = [[r.randint(1, ORDERS + 20), r.randint(1, 9)] for _ in range(count)]
        else:
            top = (w.next_acct if table == "acct" else w.next_evt) + 50  # some beyond the last id
            keys = [[r.randint(1, top)] for _ in range(count)]
        keys = [list(k) for k in {tuple(k) for k in keys}]
        return DumpSpec("keys", [q(table)], keys=keys, chunk_size=chunk)

    def submit(self) -> str | None:
        spec = self.random_spec()
        try:
            rid = self.h.submit(spec)
        except Exception as e:  # the source or Redis away: try again later
            self.submit_errors += 1
            log.info("dump submit failed (%s: %s): later", type(e).__name__, str(e)[:200])
            return None
        self.requests[rid] = {"scope": spec.scope, "table": spec.tables[0], "runs": 0, "killed": 0, "rcs": []}
        return rid

    # -- runners ---------------------------------------------------------------------
    def command(self, rid: str) -> list[str]:
        if self.requests[rid]["scope"] in ("all", "table"):  # a range dump: Spark (dblog dump)
            return [sys.executable, "-m", "airflow_provider_dblog.cli", "--config", str(self.h.cfg_path),
                    "dump", "--request", rid, "--wait-lease", "30"]
        return [sys.executable, "-m", "bench.chaos", "--run-dump", rid, "--config", str(self.h.cfg_path)]

    def start_runner(self, rid: str) -> subprocess.Popen:
        req = self.requests[rid]
        req["runs"] += 1
        proc = spawn(self.command(rid), self.h.workdir / f"dump-{rid}-{req['runs']}.log")
        with self.lock:
            self.active = (rid, proc, time.monotonic())
        return proc

    def unfinished(self) -> list[str]:
        out = []
        for rid in self.requests:
            try:
                status = self.h.state.request(rid)["status"]
            except Exception:
                status = "?"
            if status not in ("done", "cancelled"):
                out.append(rid)
        return out

    def _finish_active(self) -> None:
        with self.lock:
            rid, proc, _ = self.active
            self.active = None
        self.requests[rid]["rcs"].append(proc.returncode)

    def run(self) -> None:
        while not self.stop.is_set():
            with self.lock:
                active = self.active
            if active is not None:
                if active[1].poll() is None:
                    self.stop.wait(0.2)
                    continue
                self._finish_active()
            pending = self.unfinished()
            rid = self.rng.choice(pending) if pending and self.rng.random() < 0.5 else self.submit()
            if rid is not None:
                self.start_runner(rid)
            self.stop.wait(self.rng.uniform(0.2, 2.0))

    def kill_active(self, min_age_s: float, wait_s: float) -> str | None:
        """SIGKILL the running runner (its process group) once it has run ``min_age_s``."""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            with self.lock:
                active = self.active
            if active is not None and active[1].poll() is None and time.monotonic() - active[2] >= min_age_s:
                kill_group(active[1])
                active[1].wait(10)
                self.requests[active[0]]["killed"] += 1
                return active[0]
            time.sleep(0.1)
        return None

    def finish_all(self, deadline: float) -> list[str]:
        """After the chaos: wait for the running runner, then run every unfinished request
        to its end (one more run each, up to three). Returns those still unfinished."""
        self.stop.set()
        self.join(10)
        with self.lock:
            active = self.active
        if active is not None:
            try:
                active[1].wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                kill_group(active[1])
                active[1].wait(10)
            self._finish_active()
        for _ in range(3):
            pending = self.unfinished()
            if not pending:
                break
            for rid in pending:
                proc = self.start_runner(rid)
                try:
                    proc.wait(max(1.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    kill_group(proc)
                    proc.wait(10)
                self._finish_active()
        return self.unfinished()

    def kill_all(self) -> None:
        with self.lock:
            active = self.active
        if active is not None:
            kill_group(active[1])


class Applies(threading.Thread):
    """In-process applies (``run_apply``, local path) every few seconds."""

    def __init__(self, cfg, rng: random.Random, every_s: tuple[float, float] = (1.5, 4.0)):
        super().__init__(daemon=True, name="chaos-apply")
        self.cfg, self.rng, self.every_s = cfg, rng, every_s
        self.stop = threading.Event()
        self.ok_starts: list[float] = []  # monotonic start of every run that succeeded
        self.errors: list[str] = []
        self.retries = 0

    def once(self) -> dict:
        from airflow_provider_dblog.engine.apply import run_apply
        t0 = time.monotonic()
        res = run_apply(self.cfg, "tgt", via="local")
        self.ok_starts.append(t0)
        self.retries += int(res.get("retries", 0) or 0)
        return res

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.once()
            except Exception as e:
                self.errors.append(f"{type(e).__name__}: {e}"[:300])
            self.stop.wait(self.rng.uniform(*self.every_s))
