"""spark_jobs/dump_job.py with timers around each step of a chunk and cProfile on the
driver, for the profile of where a dump's time goes (a few chunks are enough).

    spark-submit ... dump_profiled.py --config dblog.yaml --request ID --max-chunks K
"""
from __future__ import annotations

import argparse
import cProfile
import functools
import io
import pstats
import sys
import time
from collections import defaultdict
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(1, _ROOT)

from spark_jobs.common import SparkChunkReader, load, run_job, spark_session  # noqa: E402

TIMES: dict[str, float] = defaultdict(float)
CALLS: dict[str, int] = defaultdict(int)
PER_CALL: dict[str, list] = defaultdict(list)  # the first chunk also pays the JVM's warm-up


def timed(obj, name: str, label: str) -> None:
    fn = getattr(obj, name)

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            dt = time.perf_counter() - t0
            TIMES[label] += dt
            CALLS[label] += 1
            PER_CALL[label].append(round(dt, 3))
    setattr(obj, name, wrapper)


def top(prof: cProfile.Profile, key: str, n: int = 18) -> list[str]:
    s = io.StringIO()
    pstats.Stats(prof, stream=s).strip_dirs().sort_stats(key).print_stats(n)
    return [ln for ln in s.getvalue().splitlines() if ln.strip()][-n - 1:]


def main(argv=None) -> dict:
    import airflow_provider_dblog.engine.dump as dump_mod
    from airflow_provider_dblog.engine.wiring import Wiring

    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--request", required=True)
    p.add_argument("--max-chunks", type=int, default=None)
    args = p.parse_args(argv)
    cfg = load(args.config)
    parts = Wiring(cfg)
    state, store = parts.state, parts.store
    source = parts.open_source()
    t0 = time.monotonic()
    spark = spark_session("bench-dump-profiled")
    session_s = time.monotonic() - t0
    reader = SparkChunkReader(spark, source)
    spark_s = conform_s = 0.0
    runner = parts.runner(reader, source)
    # the steps of a chunk (dump.py), and the costs inside finish_chunk
    for obj, names, group in ((runner, ("next_chunk", "open_chunk", "select_chunk", "write_hw",
                                        "finish_chunk"), "step"),
                              (state, ("wait_window", "complete_chunk", "checkpoint", "open_exclusive_window"), "state"),
                              (store, ("read_range", "write_snapshot", "remove_chunk"), "store"),
                              (source, ("write_watermark", "plan_chunk", "max_key"), "source")):
        for n in names:
            timed(obj, n, f"{group}.{n}")
    orig_reconcile = dump_mod.reconcile

    def reconcile(*a, **kw):
        t = time.perf_counter()
        try:
            return orig_reconcile(*a, **kw)
        finally:
            TIMES["reconcile"] += time.perf_counter() - t
            CALLS["reconcile"] += 1
    dump_mod.reconcile = reconcile
    orig_read = reader.read

    def read(*a, **kw):
        nonlocal spark_s, conform_s
        out = orig_read(*a, **kw)
        spark_s += reader.last_stats["spark_s"]
        conform_s += reader.last_stats["conform_s"]
        return out
    reader.read = read
    prof = cProfile.Profile()
    t1 = time.monotonic()
    prof.enable()
    summary = runner.run(args.request, args.max_chunks)
    prof.disable()
    run_s = time.monotonic() - t1
    source.close()
    spark.stop()
    times = {k: round(v, 3) for k, v in sorted(TIMES.items(), key=lambda kv: -kv[1])}
    times["select.spark_jdbc_to_driver"] = round(spark_s, 3)
    times["select.conform"] = round(conform_s, 3)
    return {"session_s": round(session_s, 3), "run_s": round(run_s, 3), "rows": summary.total("rows"),
            "chunks": summary.total("chunks"), "times": times, "calls": dict(CALLS),
            "per_call": {k: v for k, v in PER_CALL.items() if k.startswith("step.") and len(v) <= 200},
            "profile_cumulative": top(prof, "cumulative"), "profile_tottime": top(prof, "tottime")}


if __name__ == "__main__":
    sys.exit(run_job(main))
