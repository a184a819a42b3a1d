"""The dump baseline: one raw partitioned Spark JDBC read of the whole table, written
to Parquet. Same JDBC URL and driver settings as the engine's chunk reader, same
parallelism, submitted the same way; no watermarks, chunks, reconcile or output log.

    spark-submit ... baseline_read.py --config dblog.yaml --table db.t --key id
        --lower 1 --upper N --partitions P --out file:///...
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(1, _ROOT)

from spark_jobs.common import load, read_parquet_arrow, run_job, spark_session  # noqa: E402


def main(argv=None) -> dict:
    from airflow_provider_dblog.engine.sources import open_source

    p = argparse.ArgumentParser()
    for a in ("--config", "--table", "--key", "--out"):
        p.add_argument(a, required=True)
    for a in ("--lower", "--upper", "--partitions"):
        p.add_argument(a, type=int, required=True)
    args = p.parse_args(argv)
    source = open_source(load(args.config).source())
    url, props = source.jdbc()
    jdbc_table = source.jdbc_table(args.table)
    source.close()
    t0 = time.monotonic()
    spark = spark_session("bench-baseline-read")
    t1 = time.monotonic()
    df = spark.read.jdbc(url, jdbc_table, column=args.key, lowerBound=args.lower,
                         upperBound=args.upper, numPartitions=args.partitions,
                         properties={k: str(v) for k, v in props.items()})
    df.write.mode("overwrite").parquet(args.out)
    t2 = time.monotonic()
    rows = read_parquet_arrow(args.out).num_rows  # a check, outside the timing
    spark.stop()
    return {"rows": rows, "session_s": round(t1 - t0, 3), "work_s": round(t2 - t1, 3)}


if __name__ == "__main__":
    sys.exit(run_job(main))
