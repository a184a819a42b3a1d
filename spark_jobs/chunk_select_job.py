"""Select one planned chunk (Algorithm 1 step 3) over Spark JDBC, inside an open LW/HW window.

    spark-submit ... chunk_select_job.py --config dblog.yaml --source shop \\
        --chunk '{"request": ..., "table": ..., "predicates": [...], ...}' --window-id ID
    (or --chunk-file PATH: a file holding that JSON)

The chunk is ``engine.dump.ChunkTask.to_dict()`` as the Airflow chunk operator planned
it; the window (its LW already written) belongs to the operator too: this job only
reads the key range, one JDBC partition per predicate, and writes the rows as Parquet
to the window's chunk location (``EventStore.chunk_uri``), where the reconcile step
reads them. It touches neither Redis nor the watermark table. Its result (the job
result protocol, ``spark_jobs/common.py``) is ``{"rows": n, ...}``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(1, _ROOT)

from spark_jobs.common import (SparkChunkReader, close_job, job_parser, load, log_to_stderr, ran_on,  # noqa: E402
                               run_job, spark_session)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = job_parser("chunk_select_job", __doc__)
    task = p.add_mutually_exclusive_group(required=True)
    task.add_argument("--chunk", help="the chunk task as JSON (ChunkTask.to_dict())")
    task.add_argument("--chunk-file", help="a file holding the chunk task's JSON")
    p.add_argument("--window-id", required=True, help="the id of the chunk's open window")
    return p.parse_args(argv)


def load_task(args: argparse.Namespace):
    from airflow_provider_dblog.engine.dump import ChunkTask
    from airflow_provider_dblog.engine.errors import ConfigError

    text = args.chunk if args.chunk is not None else Path(args.chunk_file).read_text()
    try:
        task = ChunkTask.from_dict(json.loads(text))
    except (ValueError, TypeError) as e:
        raise ConfigError(f"--chunk is not a chunk task: {e}") from None
    if task.keys is not None:
        raise ConfigError("a key-list chunk is selected with bound parameters, not on Spark")
    if not task.predicates:
        raise ConfigError(f"the chunk of {task.table} has no key-range predicates")
    return task


def main(argv: list[str] | None = None) -> dict:
    from airflow_provider_dblog.engine.wiring import Wiring

    log_to_stderr()
    args = parse_args(argv)
    task = load_task(args)  # bad input fails before Spark starts
    cfg = load(args.config)
    parts = Wiring(cfg, args.source)
    scfg = parts.source_config
    scfg.table(task.table)  # a configured table
    store = parts.store
    source = parts.open_source()
    spark = None
    try:
        schema = source.table_schema(task.table)
        spark = spark_session(f"dblog-chunk-{scfg.name}")
        reader = SparkChunkReader(spark, source)
        dest = store.chunk_uri(task.request, task.table, args.window_id)
        rows = reader.read(schema, task.predicates, dest)
        return {"rows": rows.num_rows, "source": scfg.name, "table": task.table, **ran_on(spark),
                "request": task.request, "window": args.window_id, "dest": dest, **reader.last_stats}
    finally:
        close_job(source, spark)


if __name__ == "__main__":
    sys.exit(run_job(main))
