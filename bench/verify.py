"""Phase ``verify`` (issue 29): ``dblog verify`` of a whole table on Spark against a raw
partitioned Spark read of the source table and of its copy in the target (the baseline,
in the same run), and the source's write latency while a verification runs vs while none
does (the same niceness for both).

The table is seeded, dumped and applied to a PostgreSQL target first (not timed); then,
with the tail running and a writer updating and inserting rows of that table, an
in-process apply runs every second (a verification waits for the target to pass its last
chunk's HW) and the verification runs; it must find the table equal.
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from airflow_provider_dblog.engine.apply import run_apply
from airflow_provider_dblog.engine.requests import DumpSpec
from airflow_provider_dblog.engine.verify_run import run_verify

from .env import Env, TailProcess, run_bench_app
from .metrics import Timeline, ratio, summary
from .phases import _dump_job, _submit
from .workload import Writer

log = logging.getLogger("bench")
TABLE = "verify_rows"


class _Applier:
    """In-process applies back to back (1 s apart) while writes go on."""

    def __init__(self, env: Env):
        self.env, self.stop, self.errors = env, threading.Event(), []
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                run_apply(self.env.cfg, "tgt", via="local")
            except Exception as e:   # noqa: BLE001 - reported, the phase fails below
                self.errors.append(repr(e))
            self.stop.wait(1.0)

    def __enter__(self) -> "_Applier":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(120)


def verify(a, src, workdir: Path) -> dict:
    q = src.qualified(TABLE)
    t0 = time.monotonic()
    src.create_table(TABLE)
    src.seed(TABLE, a.verify_rows)
    seed_s = time.monotonic() - t0
    env = Env(src, "verify", [TABLE], workdir, target=True, spark=a.spark,
              dump={"chunk_size": a.chunk_size, "parallelism": a.parallelism})
    tail = None
    writer = Writer(src, TABLE, a.write_rate, a.verify_rows + 1_000_000, a.verify_rows, env.dir / "writes.json")
    try:
        tail = TailProcess(env)
        log.info("verify: loading the target (a dump of %d rows and its apply on Spark)", a.verify_rows)
        t1 = time.monotonic()
        _dump_job(env, _submit(env, q))
        run_apply(env.cfg, "tgt", via="spark")
        load_s = time.monotonic() - t1
        log.info("verify: baseline raw JDBC reads of %s and its copy (%d partitions)", q, a.parallelism)
        base = run_bench_app(env, "baseline_read_both", [
            "--config", str(env.path), "--table", q, "--target", "tgt", "--key", "id", "--lower", "1",
            "--upper", str(a.verify_rows), "--partitions", str(a.parallelism),
            "--out", "file://" + str(env.dir / "baseline")])
        writer.start()
        with _Applier(env) as applier:
            time.sleep(2)   # the writer's first connection and warm-up
            t_quiet = time.time()
            time.sleep(a.baseline_seconds)
            t_v0 = time.time()
            log.info("verify: dblog verify of %s on Spark during writes at %.0f/s", q, a.write_rate)
            m0 = time.monotonic()
            out = run_verify(env.cfg, "tgt", DumpSpec("table", [q]), via=a.verify_via,
                             run_spark=lambda rid: _dump_job(env, rid), wait_s=600)
            ours_s = time.monotonic() - m0
            t_v1 = time.time()
        writes = writer.finish()
        samples, windows = env.samples(), [w for w in env.closed_windows() if w["at"] >= t_v0]
    finally:
        if tail:
            tail.stop()
        if writer.proc.is_alive():
            writer.proc.kill()
        env.close(a.keep)
    rep = out["tables"][q]
    # "during": from the first LW to the last window's close (the chunk selects, as the lag phase's
    # dump); before it the dump job's JVM starts, after it the driver reads the target and compares
    cp = Timeline(samples)
    d0 = min((t for t in (cp.covered_at(w["lw"]) for w in windows) if t), default=t_v0)
    d1 = max((w["at"] for w in windows), default=t_v1)
    lat = lambda a, b: [x for _, t, x, _ in writes if a <= t <= b]   # noqa: E731
    w_q, w_v = summary(lat(t_quiet, t_v0 - 1e-6)), summary(lat(d0, d1))
    w_start, w_compare, w_all = summary(lat(t_v0, d0)), summary(lat(d1, t_v1)), summary(lat(t_v0, t_v1))
    base_s = base["submit_seconds"]
    return {
        "rows": a.verify_rows, "via": a.verify_via, "seed_s": round(seed_s, 1), "load_s": round(load_s, 1),
        "equal": out["equal"], "compared": rep["compared"], "skipped": rep["skipped"],
        "source_rows": rep["source_rows"], "target_rows": rep["target_rows"], "apply_errors": applier.errors,
        "baseline": {"seconds": base_s, "work_s": base["work_s"], "rows": base["rows"],
                     "target_rows": base["target_rows"], "rows_per_s": round(2 * a.verify_rows / base_s, 1)},
        "ours": {"seconds": round(ours_s, 3), "rows_per_s": round(2 * a.verify_rows / ours_s, 1)},
        "ratio": ratio(base_s, ours_s), "goal": 0.5,
        "windows": len(windows), "windows_s": round(d1 - d0, 1),
        "impact": {"no_verify": w_q, "verify": w_v, "ratio_p99": ratio(w_v["p99"], w_q["p99"]),
                   "ratio_p50": ratio(w_v["p50"], w_q["p50"]), "goal": 1.3,
                   "jvm_start": w_start, "target_read_and_compare": w_compare, "whole_verification": w_all,
                   "ratio_p99_whole": ratio(w_all["p99"], w_q["p99"])},
    }
