"""One isolated CDC set-up per phase (config file, Redis prefix, storage, target),
the log tail as its own process, and spark-submit of the bench's own Spark apps."""
from __future__ import annotations

import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg2
import yaml

from airflow_provider_dblog.engine.config import load_config
from airflow_provider_dblog.engine.jobs import JobReport, SparkJobError, job_env, spark_preexec, spark_submit_args
from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.wiring import Wiring

from .sources import BenchSource

log = logging.getLogger("bench")

REDIS_URL = os.environ.get("DBLOG_BENCH_REDIS_URL", "redis://127.0.0.1:16379/0")
PG = {"host": "127.0.0.1", "port": int(os.environ.get("DBLOG_BENCH_PG_PORT", "15432")), "user": "postgres"}
JOBS = Path(__file__).resolve().parent / "jobs"


class Env:
    """A config as a deployment would have it (the demo's settings unless overridden)."""

    def __init__(self, src: BenchSource, name: str, tables: list[str], workdir: Path,
                 dump: dict | None = None, tail: dict | None = None, target: bool = False,
                 spark: dict | None = None):
        self.src, self.name = src, name
        self.dir = workdir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.wm = f"bench_{src.run_id}_{name}_wm"
        self.target_db = f"bench_{src.run_id}_{name}" if target else None
        raw = {
            "sources": {"src": src.source_config(tables, random.randint(10_000, 4_000_000), self.wm)},
            "state": {"redis_url": REDIS_URL, "prefix": f"bench_{src.run_id}_{name}"},
            "storage": {"root": str(self.dir / "storage")},
            "spark": {"master": "local[2]"} | (spark or {}),
            # demo.yaml's settings: what a user starts with
            "dump": {"chunk_size": 100_000, "parallelism": 4, "window_timeout_s": 300} | (dump or {}),
            "tail": {"flush_events": 20_000, "flush_seconds": 0.5} | (tail or {}),
        }
        if target:
            raw["targets"] = {"tgt": {"kind": "postgres", "source": "src", **PG, "database": self.target_db}}
        self.path = self.dir / "dblog.yaml"
        self.path.write_text(yaml.safe_dump(raw))
        self.cfg = load_config(self.path)
        parts = Wiring(self.cfg, "src")
        self.state, self.store = parts.state, parts.store

    def samples(self) -> list[tuple[Position, float]]:
        """(checkpoint, wall time) of every tail commit: when each position became durable."""
        out = []
        for m in self.state.r.zrange(self.state.k("checkpoint_samples"), 0, -1):
            pos, at = m.split("|", 1)
            out.append((Position.decode(pos), float(at)))
        return out

    def closed_windows(self) -> list[dict]:
        return [json.loads(v) for v in reversed(self.state.r.lrange(self.state.k("windows_closed"), 0, -1))]

    def close(self, keep: bool) -> None:
        self.state.reset()
        self.src.drop_namespace(self.wm)
        if self.target_db:
            conn = psycopg2.connect(dbname="postgres", **PG)
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(f'DROP DATABASE IF EXISTS "{self.target_db}" WITH (FORCE)')
            conn.close()
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)


class TailProcess:
    """``dblog tail`` in its own process, as in production: it does not share the
    GIL with the writer whose latency we measure. SIGTERM flushes and exits."""

    def __init__(self, env: Env):
        self.env = env
        self.logf = open(env.dir / "tail.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "airflow_provider_dblog.cli", "--config", str(env.path), "tail"],
            stdout=self.logf, stderr=subprocess.STDOUT, env=job_env())
        deadline = time.monotonic() + 60
        while env.state.checkpoint() is None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the tail did not start; see {env.dir / 'tail.log'}")
            time.sleep(0.05)

    def drain(self, head: Position, timeout: float = 300) -> None:
        """Wait until the checkpoint passes ``head`` (the log's end when we stopped writing)."""
        deadline = time.monotonic() + timeout
        while True:
            cp = self.env.state.checkpoint()
            if cp and cp.pos >= head:
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the tail did not reach {head}; see {self.env.dir / 'tail.log'}")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.logf.close()


def run_bench_app(env: Env, app: str, args: list[str], timeout_s: float = 3600) -> dict:
    """spark-submit ``bench/jobs/<app>.py`` exactly as engine.jobs submits the engine's
    jobs (same jars, conf, driver memory, environment): both pay the same JVM start."""
    with JobReport(app) as report:
        cmd = spark_submit_args(env.cfg, str(JOBS / f"{app}.py"), [*args, *report.args()])
        t0 = time.monotonic()
        p = subprocess.run(cmd, capture_output=True, text=True, env=job_env(), timeout=timeout_s,
                           preexec_fn=spark_preexec(env.cfg))
        secs = time.monotonic() - t0
        (env.dir / f"{app}.log").write_text(p.stdout + "\n--- stderr ---\n" + p.stderr)
        try:
            res = report.outcome(p.returncode)
        except SparkJobError as e:
            raise RuntimeError(f"bench app {app}: {e}; see {env.dir / (app + '.log')}") from None
    res["submit_seconds"] = round(secs, 3)
    return res


def head_position(env: Env) -> Position:
    from airflow_provider_dblog.engine.sources import open_source
    s = open_source(env.cfg.source())
    try:
        return s.current_resume()[0]
    finally:
        s.close()
