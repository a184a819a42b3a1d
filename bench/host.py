"""Phase ``host``: what this host's CPU contention alone costs the application's writes.

The writer (bench.workload, the same as the lag and verify phases) runs against a small
table while nothing else runs, while one CPU-bound process runs, and while one per core
runs, each at the run's ``spark.nice``; the intervals alternate twice. It touches no table
of the other phases and needs no Spark. The write-impact ratios of the dump and the
verification are read against it: on a 2-core VM whose commits slow down 4x under two
niced busy processes, no job that keeps both cores busy can stay under 1.3x, however
gentle its source queries are.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
import time
from pathlib import Path

from .metrics import ratio, summary
from .workload import Writer

log = logging.getLogger("bench")
TABLE, ROWS, INTERVAL_S = "host_rows", 100_000, 15.0


def _busy(nice: int, stop) -> None:
    os.nice(nice)
    x = 0
    while not stop.is_set():
        for i in range(100_000):
            x += i


def host(a, src, workdir: Path) -> dict:
    src.create_table(TABLE)
    src.seed(TABLE, ROWS)
    nice = a.spark.get("nice", 0)
    cores = os.cpu_count() or 2
    loads = (0, 1, cores, 0, 1, cores)
    ctx = mp.get_context("fork")
    writer = Writer(src, TABLE, a.write_rate, ROWS + 1_000_000, ROWS, workdir / "host_writes.json")
    workdir.mkdir(parents=True, exist_ok=True)
    spans: list[tuple[int, float, float]] = []
    writer.start()
    try:
        time.sleep(2)   # the writer's first connection and warm-up
        for n in loads:
            stop = ctx.Event()
            procs = [ctx.Process(target=_busy, args=(nice, stop), daemon=True) for _ in range(n)]
            for p in procs:
                p.start()
            time.sleep(1)   # the busy processes running
            t0 = time.time()
            time.sleep(INTERVAL_S)
            spans.append((n, t0, time.time()))
            stop.set()
            for p in procs:
                p.join(10)
        writes = writer.finish()
    finally:
        if writer.proc.is_alive():
            writer.proc.kill()
    by_load = {n: summary([lat for _, t, lat, _ in writes
                           if any(m == n and t0 <= t <= t1 for m, t0, t1 in spans)]) for n in sorted(set(loads))}
    quiet = by_load[0]
    log.info("host: write latency by busy processes at nice %s: %s", nice, by_load)
    return {"nice": nice, "cores": cores, "interval_s": INTERVAL_S, "write_rate": a.write_rate,
            "by_busy_processes": {str(n): s for n, s in by_load.items()},
            "ratio_p99": {str(n): ratio(s["p99"], quiet["p99"]) for n, s in by_load.items() if n},
            "ratio_p50": {str(n): ratio(s["p50"], quiet["p50"]) for n, s in by_load.items() if n}}
