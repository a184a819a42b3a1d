"""The verification baseline: one raw partitioned Spark JDBC read of a source table and
one of its copy in a PostgreSQL target, each written to Parquet. Same JDBC settings and
parallelism as the engine's chunk reader, submitted the same way; no watermarks, chunks,
log or comparison.

    spark-submit ... baseline_read_both.py --config dblog.yaml --table db.t --target tgt
        --key id --lower 1 --upper N --partitions P --out file:///...
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
    from airflow_provider_dblog.engine.targets import open_target
    from airflow_provider_dblog.engine.targets.pg_tables import target_table_name

    p = argparse.ArgumentParser()
    for a in ("--config", "--table", "--target", "--key", "--out"):
        p.add_argument(a, required=True)
    for a in ("--lower", "--upper", "--partitions"):
        p.add_argument(a, type=int, required=True)
    args = p.parse_args(argv)
    cfg = load(args.config)
    source = open_source(cfg.source())
    src_url, src_props = source.jdbc()
    src_table = source.jdbc_table(args.table)
    source.close()
    with open_target(cfg.target(args.target)) as target:
        tgt_url, tgt_props = target.jdbc()
        tgt_table = f'"{target.schema}"."{target_table_name(args.table)}"'
    t0 = time.monotonic()
    spark = spark_session("bench-baseline-read-both")
    t1 = time.monotonic()
    for name, url, table, props in (("source", src_url, src_table, src_props),
                                    ("target", tgt_url, tgt_table, tgt_props)):
        df = spark.read.jdbc(url, table, column=args.key, lowerBound=args.lower, upperBound=args.upper,
                             numPartitions=args.partitions, properties={k: str(v) for k, v in props.items()})
        df.write.mode("overwrite").parquet(f"{args.out}/{name}")
    t2 = time.monotonic()
    rows = {n: read_parquet_arrow(f"{args.out}/{n}").num_rows for n in ("source", "target")}   # outside the timing
    spark.stop()
    return {"rows": rows["source"], "target_rows": rows["target"], "session_s": round(t1 - t0, 3),
            "work_s": round(t2 - t1, 3)}


if __name__ == "__main__":
    sys.exit(run_job(main))
