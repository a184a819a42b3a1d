"""Run (or resume) one dump request: chunk selects over Spark JDBC inside LW/HW windows.

    spark-submit ... dump_job.py --config dblog.yaml --source shop --request ID [--max-chunks N]

The request must exist (``dblog dump`` / the trigger operator creates it). Each
chunk is Algorithm 1 steps 2-4 then 6-7 (engine.dump.DumpRunner); the chunk
select is ``spark.read.jdbc`` with one partition per key sub-range, all inside
the chunk's window. Its result (the job result protocol, ``spark_jobs/common.py``) is
the run's summary; on failure the request is marked failed in Redis too.
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(1, _ROOT)

from spark_jobs.common import (SparkChunkReader, close_job, job_parser, load, log_to_stderr, ran_on,  # noqa: E402
                               run_job, spark_session)


def main(argv: list[str] | None = None) -> dict:
    from airflow_provider_dblog.engine.wiring import Wiring

    log_to_stderr()
    p = job_parser("dump_job", __doc__)
    p.add_argument("--request", required=True, help="dump request id")
    p.add_argument("--max-chunks", type=int, default=None,
                   help="stop (status paused) after this many chunks; resume with another run")
    p.add_argument("--wait-lease", type=float, default=None, metavar="SECONDS",
                   help="another runner holds the request: wait this long for it (default: dump.lease_seconds)")
    args = p.parse_args(argv)
    cfg = load(args.config)
    parts = Wiring(cfg, args.source)
    scfg, state = parts.source_config, parts.state
    source = parts.open_source()
    spark = None
    try:
        spark = spark_session(f"dblog-dump-{scfg.name}")
        reader = SparkChunkReader(spark, source)
        summary = parts.runner(reader, source).run(args.request, args.max_chunks, args.wait_lease)
        req = state.request(args.request) or {}
        out = dataclasses.asdict(summary)
        out.update({"source": scfg.name, "status": req.get("status", ""), **ran_on(spark),
                    "chunks": summary.total("chunks"), "rows": summary.total("rows"),
                    "dropped": summary.total("dropped")})
        return out
    finally:
        close_job(source, spark)


if __name__ == "__main__":
    sys.exit(run_job(main))
