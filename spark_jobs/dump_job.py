"""Run (or resume) one dump request: chunk selects over Spark JDBC inside LW/HW windows.

    spark-submit ... dump_job.py --config dblog.yaml --source shop --request ID [--max-chunks N]

The request must exist (``dblog dump`` / the trigger operator creates it). Each
chunk is Algorithm 1 steps 2-4 then 6-7 (engine.dump.DumpRunner); the chunk
select is ``spark.read.jdbc`` with one partition per key sub-range, all inside
the chunk's window. Prints ``DBLOG_RESULT {summary}``; exits 1 with
``DBLOG_ERROR <message>`` on failure (the request is marked failed in Redis).
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(1, _ROOT)

from spark_jobs.common import SparkChunkReader, load, run_job, spark_session  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dump_job", description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="the dblog YAML config")
    p.add_argument("--source", default=None, help="source name (optional with one source)")
    p.add_argument("--request", required=True, help="dump request id")
    p.add_argument("--max-chunks", type=int, default=None,
                   help="stop (status paused) after this many chunks; resume with another run")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    from airflow_provider_dblog.engine.wiring import Wiring

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    cfg = load(args.config)
    parts = Wiring(cfg, args.source)
    scfg, state = parts.source_config, parts.state
    source = parts.open_source()
    spark = None
    try:
        spark = spark_session(f"dblog-dump-{scfg.name}")
        reader = SparkChunkReader(spark, source)
        summary = parts.runner(reader, source).run(args.request, args.max_chunks)
        req = state.request(args.request) or {}
        out = dataclasses.asdict(summary)
        out.update({"source": scfg.name, "status": req.get("status", ""),
                    "spark_master": spark.sparkContext.master, "app_id": spark.sparkContext.applicationId,
                    "chunks": summary.total("chunks"), "rows": summary.total("rows"),
                    "dropped": summary.total("dropped")})
        return out
    finally:
        source.close()
        if spark is not None:
            spark.stop()


if __name__ == "__main__":
    sys.exit(run_job(main))
