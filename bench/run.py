"""``python -m bench``: run the chosen phases and write results.json, results.md, lag.png."""
from __future__ import annotations

import argparse
import logging
import os
import platform
import time
import uuid
from pathlib import Path

from . import dags, host, phases, report, verify
from .sources import open_bench_source

PHASES = ("host", "dump", "tail", "lag", "fresh", "dags", "verify")
ALIASES = {"impact": "lag", "stall": "lag", "freshness": "fresh", "airflow": "dags"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--source", default="mysql", choices=("mysql", "postgres"),
                   help="source kind: mysql (MariaDB) or postgres")
    p.add_argument("--rows", type=int, default=2_000_000, help="rows of the dumped table")
    p.add_argument("--only", default=",".join(PHASES),
                   help=f"comma-separated phases: {', '.join(PHASES)} (impact is measured with lag)")
    p.add_argument("--out", default=None, help="output directory (default .dblog-local/bench/<time>)")
    p.add_argument("--chunk-size", type=int, default=500_000,
                   help="dump chunk size (500k: a Spark job per chunk amortizes its overhead)")
    p.add_argument("--parallelism", type=int, default=4, help="JDBC partitions, ours and baseline")
    p.add_argument("--tail-events", type=int, default=100_000, help="row changes in the pre-written log")
    p.add_argument("--txn-rows", type=int, default=10, help="row changes per pre-written transaction")
    p.add_argument("--write-rate", type=float, default=200, help="application writes per second")
    p.add_argument("--baseline-seconds", type=float, default=60, help="writes without a dump")
    p.add_argument("--fresh-rows", type=int, default=10_000)
    p.add_argument("--verify-rows", type=int, default=4_000_000, help="phase verify: rows of the verified table")
    p.add_argument("--verify-via", choices=("spark", "local"), default="spark",
                   help="phase verify: chunks read by the dump job on Spark, or in this process (dblog verify --via)")
    p.add_argument("--apply-runs", type=int, default=6)
    p.add_argument("--fresh-via", choices=("engine", "airflow"), default="engine",
                   help="apply through the engine's apply_job or the provider's apply DAG")
    p.add_argument("--spark-nice", type=int, default=0,
                   help="the config's spark.nice (0-19) for every Spark job, ours and the baseline's")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--spark-master", default=None,
                       help="run every Spark job, ours and the baseline's, on this master "
                            "(e.g. spark://host:7077; the storage root must be shared with its workers)")
    where.add_argument("--spark-cluster", type=int, default=0, metavar="WORKERS",
                       help="start a standalone cluster of this many workers on loopback for the run "
                            "(devenv/spark_cluster.py) and run every Spark job on it")
    p.add_argument("--executor-cores", type=int, default=1, help="with a cluster: cores per executor")
    p.add_argument("--executor-memory", default="1g", help="with a cluster: memory per executor")
    p.add_argument("--apply-interval", type=float, default=10.0,
                   help="seconds from one apply run's start to the next's (0: back to back)")
    p.add_argument("--apply-via", choices=("auto", "local", "spark"), default="auto",
                   help="the engine's apply path for --fresh-via engine (auto: by batch size)")
    p.add_argument("--dags-modes", default="event,cron",
                   help="phase dags: apply schedules to measure through a running Airflow (event, cron)")
    p.add_argument("--dags-minutes", type=float, default=3.0, help="phase dags: minutes of writes, event mode")
    p.add_argument("--dags-cron-minutes", type=float, default=4.0, help="phase dags: minutes of writes, cron mode")
    p.add_argument("--dags-cron", default="*/2 * * * *", help="phase dags: the cron mode's apply_schedule")
    p.add_argument("--dags-rate", type=float, default=2.0, help="phase dags: single-row commits per second")
    p.add_argument("--dags-tail-run-seconds", type=int, default=60,
                   help="phase dags: tail_run_seconds of the tail DAG (the shipped default: 60)")
    p.add_argument("--profile-chunks", type=int, default=5)
    p.add_argument("--no-profile", dest="profile", action="store_false")
    p.add_argument("--keep", action="store_true", help="keep storage and logs under --out/work")
    a = p.parse_args(argv)
    a.phases = [ALIASES.get(x.strip(), x.strip()) for x in a.only.split(",") if x.strip()]
    bad = [x for x in a.phases if x not in PHASES]
    if bad:
        p.error(f"unknown phase(s) {bad}; choose from {PHASES}")
    a.table = "dump_rows"
    return a


def spark_section(a, master: str | None) -> dict:
    """The config's ``spark`` section of every phase: the same for ours and the baseline."""
    spark = {"nice": a.spark_nice}
    if master:
        spark.update(master=master, executor_cores=a.executor_cores, executor_memory=a.executor_memory)
    return spark


def main(argv=None) -> int:
    a = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("airflow_provider_dblog.engine.jobs").setLevel(logging.WARNING)  # Spark chatter
    logging.getLogger("httpx").setLevel(logging.WARNING)  # the dags phase's REST polling
    log = logging.getLogger("bench")
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    repo = Path(__file__).resolve().parents[1]
    out = Path(a.out or repo / ".dblog-local" / "bench" / started.replace(":", "")).resolve()
    work = out / "work"
    run_id = uuid.uuid4().hex[:8]
    src = open_bench_source(a.source, run_id)
    res: dict = {"meta": {"source": a.source, "started": started, "run_id": run_id,
                          "args": " ".join(f"--{k.replace('_', '-')}={v}" for k, v in vars(a).items()
                                           if k not in ("phases", "table")),
                          "machine": f"{platform.node()} {os.cpu_count()} cpus, {platform.python_version()}"}}
    cluster = None
    if a.spark_cluster:
        from airflow_provider_dblog.devenv.spark_cluster import StandaloneCluster
        cluster = StandaloneCluster(out / "spark-cluster", workers=a.spark_cluster, cores=a.executor_cores,
                                    memory=a.executor_memory)
        cluster.start()
        log.info("spark: standalone cluster %s with %d worker(s)", cluster.url, a.spark_cluster)
    master = cluster.url if cluster else a.spark_master
    a.spark = spark_section(a, master)
    res["meta"]["spark_master"] = master or "local[2]"
    src.setup()
    try:
        if {"dump", "lag"} & set(a.phases):
            t0 = time.monotonic()
            src.create_table(a.table)
            src.seed(a.table, a.rows)
            res["meta"]["seed_s"] = round(time.monotonic() - t0, 1)
            log.info("seeded %s with %d rows in %.1fs", src.qualified(a.table), a.rows, time.monotonic() - t0)
        for name in PHASES:  # a fixed order: lag's writes must not change the dump's table first
            if name in a.phases:
                t0 = time.monotonic()
                log.info("phase %s", name)
                res[name] = {"dags": dags.dags, "verify": verify.verify, "host": host.host}.get(name, getattr(phases, name, None))(a, src, work)
                res[name]["phase_seconds"] = round(time.monotonic() - t0, 1)
    finally:
        src.teardown()
        if cluster:
            cluster.stop()
        md = report.write(res, out)
    print(md)
    print(f"\nwritten to {out}")
    return 0
