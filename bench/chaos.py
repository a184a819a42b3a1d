"""The chaos loop (issue 15): for N minutes a writer commits, dumps of random scopes run,
applies run on a schedule, and a fault injector picks a fault at random intervals; at the
end everything is drained and every table compared row for row with its target.

    python -m bench.chaos --minutes 10 --seed 1 --source mariadb [--spark-every 4] [--out DIR]

Loopback only: the private servers of the dev environment (MariaDB 13306, PostgreSQL 15432,
Redis 16379), which the faults stop and start again (hold /tmp/dblog-tests.lock). Faults:

* ``tail_kill``      SIGKILL of the ``dblog tail`` process (a new one waits out its lease);
* ``tail_zombie``    SIGSTOP of the tail past its lease, a new tail takes over, SIGCONT;
* ``dump_kill``      SIGKILL of a dump runner mid-run (its process group; resumed later);
* ``source_restart`` the source server stopped and started again;
* ``target_restart`` PostgreSQL (the target) stopped and started again;
* ``redis_restart``  Redis stopped and started again.

Every kind is injected once first (in a seeded random order), then kinds at random. After a
fault the injector waits (bounded) for its recovery: the tail's checkpoint past the log head
taken after it, and an apply run begun after it that succeeded; then it verifies one table
(``dblog verify``, in-process) while the writer, dumps and applies go on: it must be equal. The report (JSON) says how
many of each were injected and recovered, the engine's retry counters, the dumps, the rows
written and the divergences per table (the goal: none).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import yaml

from airflow_provider_dblog.devenv import servers as devenv
from airflow_provider_dblog.engine.config import load_config

from .chaos_report import report
from .chaos_parts import TABLES, Applies, Dumps, TailSupervisor, Writer, create_tables, kill_group
from .env import Env
from .sources import open_bench_source

log = logging.getLogger("bench.chaos")

KINDS = ("tail_kill", "tail_zombie", "dump_kill", "source_restart", "target_restart", "redis_restart")
SOURCE_KIND = {"mariadb": "mysql", "mysql": "mysql", "postgres": "postgres"}
SERVER_OF = {"mysql": "mariadb", "postgres": "postgres"}
LEASE_S = 3.0


class Harness:
    def __init__(self, source: str, seed: int, workdir: Path, spark_every: int = 0,
                 fault_gap: tuple[float, float] = (5.0, 20.0), recover_s: float = 120.0):
        self.kind = SOURCE_KIND[source]
        self.seed, self.spark_every, self.fault_gap, self.recover_s = seed, spark_every, fault_gap, recover_s
        self.rng, self.verify_rng = random.Random(seed), random.Random(seed + 4)
        self.src = open_bench_source(self.kind, f"chaos{uuid.uuid4().hex[:6]}")
        self.workdir = workdir
        self.env: Env | None = None

    # -- set-up -----------------------------------------------------------------------
    def setup(self) -> None:
        self.src.setup()
        create_tables(self.src)
        self.env = Env(self.src, "chaos", list(TABLES), self.workdir, target=True,
                       dump={"chunk_size": 1000, "parallelism": 2, "window_timeout_s": 15, "lease_seconds": LEASE_S,
                             "abandon_after_s": 20, "retry_for_s": 120},
                       tail={"flush_events": 2000, "flush_seconds": 0.2, "lease_seconds": LEASE_S,
                             "retry_for_s": 120, "progress_seconds": 10})
        raw = yaml.safe_load(self.env.path.read_text())
        raw["apply"] = {"retry_for_s": 120}
        self.env.path.write_text(yaml.safe_dump(raw))
        self.env.cfg = self.cfg = load_config(self.env.path)
        self.cfg_path, self.state, self.store = self.env.path, self.env.state, self.env.store
        self.workdir = self.env.dir

    def submit(self, spec) -> str:
        from airflow_provider_dblog.engine.dump import DumpRunner
        from airflow_provider_dblog.engine.sources import open_source
        source = open_source(self.cfg.source())
        try:
            return DumpRunner(source, self.state, self.store, None, self.cfg.dump).submit(spec)
        finally:
            source.close()

    def head(self, timeout: float = 60):
        """The log's end now (the source may be coming back: retried until ``timeout``)."""
        from airflow_provider_dblog.engine.sources import open_source
        deadline = time.monotonic() + timeout
        while True:
            try:
                source = open_source(self.cfg.source())
                try:
                    return source.current_resume()[0]
                finally:
                    source.close()
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def checkpoint(self):
        try:
            cp = self.state.checkpoint()
            return cp.pos if cp else None
        except Exception:
            return None

    def wait_caught_up(self, since: float, timeout: float) -> float | None:
        """Seconds from ``since`` until the tail's checkpoint passed the log head taken now and an
        apply begun after ``since`` succeeded; None if not within ``timeout``."""
        deadline = time.monotonic() + timeout
        try:
            head = self.head(timeout)
        except Exception:
            return None
        while time.monotonic() < deadline:
            cp = self.checkpoint()
            if cp is not None and cp >= head and any(s >= since for s in self.applies.ok_starts):
                return round(time.monotonic() - since, 1)
            time.sleep(0.2)
        return None

    # -- the faults ---------------------------------------------------------------------
    def _restart(self, server: str) -> dict:
        down = self.rng.uniform(1.5, 5.0)
        devenv.stop(server)
        try:
            time.sleep(down)
        finally:
            devenv.start(server)
        return {"server": server, "down_s": round(down, 1)}

    def source_restart(self) -> dict:
        return self._restart(SERVER_OF[self.kind])

    def target_restart(self) -> dict:
        return self._restart("postgres")

    def redis_restart(self) -> dict:
        return self._restart("redis")

    def _live_tail(self, timeout: float = 60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            p = self.tail.current()
            if p is not None:
                return p
            time.sleep(0.1)
        return None

    def tail_kill(self) -> dict:
        p = self._live_tail()
        if p is None:
            return {"skipped": "no live tail"}
        kill_group(p)
        p.wait(10)
        return {"tail": p.logf.name}

    def tail_zombie(self) -> dict:
        p = self._live_tail()
        if p is None:
            return {"skipped": "no live tail"}
        os.kill(p.pid, signal.SIGSTOP)
        self.tail.detach()  # the supervisor starts a new tail: it waits out the stopped one's lease
        paused = 2 * LEASE_S + self.rng.uniform(1, 4)
        try:
            time.sleep(paused)
        finally:
            os.kill(p.pid, signal.SIGCONT)
        try:
            p.wait(45)
            by_itself = True
        except subprocess.TimeoutExpired:  # a zombie going on past its lease: a finding
            kill_group(p)
            p.wait(10)
            by_itself = False
        self.tail.reaped(p, "zombie")
        return {"tail": p.logf.name, "paused_s": round(paused, 1), "zombie_rc": p.returncode,
                "zombie_ended_by_itself": by_itself}

    def dump_kill(self) -> dict:
        rid = self.dumps.kill_active(min_age_s=self.rng.uniform(0.5, 3.0), wait_s=60)
        return {"request": rid} if rid else {"skipped": "no dump runner running"}

    def verify_one(self) -> dict:
        """``dblog verify`` of one table, chosen at random, after a fault's recovery, while the
        writer, the dumps and the applies go on (issue 29: no false positives under chaos)."""
        from airflow_provider_dblog.engine.requests import DumpSpec
        from airflow_provider_dblog.engine.verify_run import run_verify
        table = self.src.qualified(self.verify_rng.choice(TABLES))
        t0 = time.monotonic()
        try:
            out = run_verify(self.cfg, "tgt", DumpSpec("table", [table]), via="local", wait_s=self.recover_s)
        except Exception as e:
            return {"table": table, "error": f"{type(e).__name__}: {e}"[:300]}
        rep = out["tables"][table]
        return {"table": table, "equal": out["equal"], "compared": rep["compared"], "skipped": rep["skipped"],
                "seconds": round(time.monotonic() - t0, 1),
                **({} if out["equal"] else {"keys": {k: v[:5] for k, v in rep["keys"].items()}})}

    def inject(self, until: float) -> None:
        order = list(KINDS)
        self.rng.shuffle(order)
        n = 0
        while not self.stopping.is_set():
            kind = order[n] if n < len(order) else self.rng.choice(KINDS)
            if n >= len(order) and time.monotonic() >= until:
                break
            if self.stopping.wait(self.rng.uniform(*self.fault_gap)):
                break
            rec = {"kind": kind, "at_s": round(time.monotonic() - self.t0, 1)}
            log.info("fault %d: %s", n + 1, kind)
            try:
                rec.update(getattr(self, kind)())
            except Exception as e:
                rec["error"] = f"{type(e).__name__}: {e}"[:300]
            rec["injected"] = "skipped" not in rec and "error" not in rec
            since = time.monotonic()
            rec["recovery_s"] = self.wait_caught_up(since, self.recover_s)
            rec["recovered"] = rec["recovery_s"] is not None
            if rec["recovered"]:
                rec["verify"] = self.verify_one()
            log.info("fault %d: %s", n + 1, rec)
            self.faults.append(rec)
            n += 1

    # -- the run ------------------------------------------------------------------------
    def run(self, minutes: float) -> dict:
        self.t0 = time.monotonic()
        until = self.t0 + minutes * 60
        self.stopping = threading.Event()
        self.faults: list[dict] = []
        self.writer = Writer(self.src, random.Random(self.seed + 1))
        self.tail = TailSupervisor(self.cfg_path, self.workdir, seconds=int(minutes * 60) + 1800, wait_lease=60)
        self.applies = Applies(self.cfg, random.Random(self.seed + 2))
        self.dumps = Dumps(self, random.Random(self.seed + 3), self.spark_every)
        self.tail.start()
        deadline = time.monotonic() + 60
        while self.checkpoint() is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the first tail did not start: see {self.workdir}/tail-1.log")
            time.sleep(0.1)
        for part in (self.writer, self.applies, self.dumps):
            part.start()
        injector = threading.Thread(target=self.inject, args=(until,), daemon=True, name="chaos-faults")
        injector.start()
        injector.join(max(0.0, until - time.monotonic()) + 6 * (self.recover_s + 120))
        self.stopping.set()
        injector.join(self.recover_s + 120)
        chaos_s = time.monotonic() - self.t0
        log.info("chaos over after %.0fs: draining", chaos_s)
        return self.finish(minutes, chaos_s)

    def finish(self, minutes: float, chaos_s: float) -> dict:
        from airflow_provider_dblog.engine.targets import target_table_name
        from airflow_provider_dblog.engine.sources import open_source
        from airflow_provider_dblog.engine.verify import compare_source_target
        t_end = time.monotonic()
        self.writer.stop.set()
        self.writer.join(30)
        devenv.start()  # whatever a fault left down (it should not have)
        self.applies.stop.set()
        self.applies.join(self.cfg.apply.retry_for_s + 60)
        unfinished = self.dumps.finish_all(time.monotonic() + 300)
        head = self.head()
        drained = self._wait(lambda: (cp := self.checkpoint()) is not None and cp >= head, 180)
        no_windows = self._wait(lambda: not self.state.open_windows(), 60)
        apply_res, apply_error = None, None
        for _ in range(3):
            try:
                apply_res = self.applies.once()
                break
            except Exception as e:
                apply_error = f"{type(e).__name__}: {e}"[:300]
                time.sleep(2)
        divergences = {}
        source = open_source(self.cfg.source())
        try:
            for t in TABLES:
                schema = source.table_schema(self.src.qualified(t))
                d = compare_source_target(self.cfg.source(), self.cfg.target("tgt"), schema, target_table_name(schema))
                divergences[t] = {"source_rows": d.source_rows, "target_rows": d.target_rows,
                                  "missing": len(d.missing), "extra": len(d.extra), "different": len(d.different)}
                if not d.equal:
                    divergences[t]["diff"] = d.describe(limit=10)
        finally:
            source.close()
        self.tail.shutdown()
        return report(self, minutes, chaos_s, time.monotonic() - t_end, unfinished, drained, no_windows,
                           apply_res, apply_error, divergences)

    @staticmethod
    def _wait(pred, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if pred():
                    return True
            except Exception:
                pass
            time.sleep(0.2)
        return False

    # -- clean-up ----------------------------------------------------------------------
    def close(self, keep: bool = False) -> None:
        try:
            self.stopping.set() if hasattr(self, "stopping") else None
            for part in ("writer", "applies"):
                if hasattr(self, part):
                    getattr(self, part).stop.set()
            if hasattr(self, "dumps"):
                self.dumps.stop.set()
                self.dumps.kill_all()
            if hasattr(self, "tail"):
                self.tail.stop.set()
                self.tail.join(5)
                for p in (self.tail.proc,):
                    if p is not None:
                        kill_group(p, signal.SIGCONT)
                        kill_group(p)
        finally:
            devenv.start()  # never leave a private server down
            if self.env is not None:
                self.env.close(keep)
            self.src.teardown()


def run_chaos(minutes: float, seed: int, source: str = "mariadb", workdir: Path | None = None,
              spark_every: int = 0, fault_gap: tuple[float, float] = (5.0, 20.0), keep: bool = False) -> dict:
    import tempfile
    workdir = Path(workdir or tempfile.mkdtemp(prefix="dblog-chaos-"))
    h = Harness(source, seed, workdir, spark_every=spark_every, fault_gap=fault_gap)
    try:
        h.setup()
        res = h.run(minutes)
        res["workdir"] = str(h.workdir)
        return res
    finally:
        h.close(keep)


def run_dump(cfg_path: str, rid: str) -> int:
    """A dump runner process of a key-list or condition request (no Spark): ``--run-dump``."""
    from airflow_provider_dblog.engine.wiring import Wiring
    runner = Wiring(load_config(cfg_path), "src").runner(None)
    try:
        s = runner.run(rid, wait_lease=30)
        print(json.dumps(getattr(s, "__dict__", str(s)), default=str))
        return 0
    finally:
        runner.source.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--source", default="mariadb", choices=sorted(SOURCE_KIND))
    p.add_argument("--spark-every", type=int, default=4,
                   help="every Nth dump request is a full-table dump on Spark (0: key lists and conditions only)")
    p.add_argument("--fault-gap", default="5,20", help="seconds between faults: min,max (seeded random)")
    p.add_argument("--out", default=None, help="where the report and the logs go")
    p.add_argument("--keep", action="store_true", help="keep the storage and the Redis state")
    p.add_argument("--run-dump", metavar="REQUEST", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if a.run_dump:
        return run_dump(a.config, a.run_dump)
    logging.getLogger("airflow_provider_dblog").setLevel(logging.WARNING)
    repo = Path(__file__).resolve().parents[1]
    out = Path(a.out or repo / ".dblog-local" / "chaos" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    out.mkdir(parents=True, exist_ok=True)
    lo, hi = (float(x) for x in a.fault_gap.split(","))
    res = run_chaos(a.minutes, a.seed, a.source, out, spark_every=a.spark_every, fault_gap=(lo, hi), keep=a.keep)
    text = json.dumps(res, indent=2, default=str)
    (out / "chaos-report.json").write_text(text)
    print(text)
    print(f"\nwritten to {out / 'chaos-report.json'}")
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
