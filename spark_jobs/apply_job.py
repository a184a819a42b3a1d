"""Apply the final part of the event log to a SQL target, table by table, in position order.

    spark-submit ... apply_job.py --config dblog.yaml --target warehouse [--tables db.t,db.u]

For each table: the batch is every event with ``applied <= pos < frontier``, where
``applied`` is the target's checkpoint for the table (every event below it is
applied) and ``frontier`` is RedisState.frontier() (below it the log is final: no
snapshot can still land there). Spark reads the table's Parquet files of that
range, keeps the latest event per key, flattens it to the table's columns plus
``_dblog_op`` / ``_dblog_pos`` and writes that as Parquet; the driver streams the
files into a stage table with ``COPY`` (engine/targets/pg_copy.py, the formatter the
in-process apply uses: no value crosses JDBC as a Java date or timestamp, whose
hybrid Julian calendar would shift dates before 1582), and
PostgresTarget.merge_from_stage merges it and moves the checkpoint to the
frontier in one transaction. Batches follow each other in position order, so a
delete is never undone by an older snapshot, and a replayed batch changes nothing.

The batch planning (engine/apply_plan.py) and the stage and merge
(engine/apply_batch.py) are shared with the local (in-process) applier that takes
small batches: ``engine.apply.run_apply`` (the ``dblog apply`` command,
DBLogApplyOperator) only runs this job when a run holds more events than
``apply.local_max_events``.

The target or Redis away: a table's step is run again with backoff for up to
``apply.retry_for_s`` (``apply_run.apply_tables``, shared with the local path; the Spark
reduce is redone and its stage files rewritten), then TargetUnavailableError.

Prints ``DBLOG_RESULT {per-table counts}``; exits 1 with ``DBLOG_ERROR <message>``.
"""
from __future__ import annotations

import argparse
import logging
import posixpath
import sys
import time
import uuid
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(1, _ROOT)

from airflow_provider_dblog.engine.apply_batch import held, ordered_events, stage_and_merge  # noqa: E402
from airflow_provider_dblog.engine.errors import TargetValueError  # noqa: E402
from airflow_provider_dblog.engine.apply_plan import SPARK, load_schemas, plan_table, resolve_tables  # noqa: E402
from airflow_provider_dblog.engine.apply_run import apply_tables, run_result  # noqa: E402
from airflow_provider_dblog.engine.events import event_arrow_schema  # noqa: E402
from spark_jobs.common import event_spark_schema, job_parser, load, log_to_stderr, run_job, spark_session  # noqa: E402

log = logging.getLogger("dblog.apply")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = job_parser("apply_job", __doc__, source=False)
    p.add_argument("--target", default=None, help="target name (optional with one target)")
    p.add_argument("--tables", default="", help="comma-separated db.table list (default: all of the source's)")
    p.add_argument("--schema-file", default="",
                   help="JSON {db.table: TableSchema.to_dict()} to use instead of asking the source")
    return p.parse_args(argv)


def read_events(spark, schema, uris: list[str], lo: str, hi: str):
    """The table's events with ``lo <= pos < hi`` from its Parquet files (typed by the schema:
    a file whose columns do not match fails the job instead of being misread)."""
    from pyspark.sql import functions as F

    return (spark.read.schema(event_spark_schema(schema)).parquet(*uris)
            .where((F.col("pos") >= F.lit(lo)) & (F.col("pos") < F.lit(hi))))


class Applier:
    via = SPARK

    def __init__(self, spark_factory, target, store, state, source_name: str):
        self._spark_factory = spark_factory
        self._spark = None
        self.target, self.store, self.state, self.source_name = target, store, state, source_name
        self.run_id = uuid.uuid4().hex[:8]
        self.spark_start_s = 0.0

    @property
    def spark(self):
        if self._spark is None:  # only when some table has work
            t0 = time.monotonic()
            self._spark = self._spark_factory()
            self.spark_start_s = round(time.monotonic() - t0, 3)
        return self._spark

    @property
    def where(self) -> dict:
        """The Spark application the run used (none when no table had work)."""
        if self._spark is None:
            return {"spark_master": None, "app_id": None}
        sc = self._spark.sparkContext
        return {"spark_master": sc.master, "app_id": sc.applicationId}

    def stop(self) -> None:
        if self._spark is not None:
            self._spark.stop()

    def file_uris(self, table: str, files: list[str]) -> list[str]:
        base = self.store.table_uri(table)
        return [posixpath.join(base, posixpath.basename(f)) for f in files]

    def apply_table(self, schema) -> dict:
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        try:
            batch = plan_table(self.target, self.store, self.state, self.source_name, schema)
        except TargetValueError as e:   # a shape or value this target refuses: this table held, as in-process
            return held({}, e) | {"via": SPARK}
        if batch.result is not None:
            return batch.result | {"via": SPARK}
        schema = batch.schema   # the shape of its events (engine/schema_history.py)
        table, files, lo, hi = schema.qualified, batch.files, batch.lo, batch.hi
        self.spark  # noqa: B018 - start the session outside the batch's timings
        t0 = time.monotonic()
        uris = self.file_uris(table, files)
        # The latest event per key, in one shuffle. A replayed flush may hold an event
        # twice: both copies have the same key and position and the same images, so
        # row_number keeps one of them; no separate dropDuplicates pass is needed.
        by_key = Window.partitionBy("key").orderBy(F.col("pos").desc())
        latest = (read_events(self.spark, schema, uris, lo, hi)
                  .withColumn("_rn", F.row_number().over(by_key))
                  .where((F.col("_rn") == 1) & F.col("error").isNull()))   # see apply_batch.flatten
        image = F.when(F.col("op") == "delete", F.col("before")).otherwise(F.col("after"))
        flat = latest.select(*[image.getField(c).alias(c) for c in batch.write_schema.column_names],
                             F.col("op").alias("_dblog_op"), F.col("pos").alias("_dblog_pos"))
        stage_uri = self.store.stage_uri(table, self.run_id)
        t1 = time.monotonic()
        flat.write.mode("overwrite").parquet(stage_uri)
        t_spark = time.monotonic() - t1
        try:
            # a changelog table takes every event of the batch, read here in position order a
            # page at a time (pyarrow in the driver, never collected: apply_batch.ordered_events)
            events = ordered_events(self.store.fs, files, event_arrow_schema(schema), lo, hi)
            out = stage_and_merge(self.target, batch, self.store.read_stage(table, self.run_id),
                                  self.source_name, self.run_id, t0, events=events)
        finally:
            self.store.remove_stage(table, self.run_id)
        out.update(spark_s=round(t_spark, 3), via=SPARK)
        log.info("%s: applied %s", table, out)
        return out


def main(argv: list[str] | None = None) -> dict:
    from airflow_provider_dblog.engine.targets import open_target
    from airflow_provider_dblog.engine.wiring import Wiring

    log_to_stderr()
    started = time.monotonic()
    args = parse_args(argv)
    cfg = load(args.config)
    tcfg = cfg.target(args.target)
    scfg = cfg.source(tcfg.source)
    tables = resolve_tables(scfg, args.tables)
    parts = Wiring(cfg, scfg.name)
    state, store = parts.state, parts.store
    def schemas_of(names: list[str]) -> dict:   # (of the tables with something to apply)
        return load_schemas(scfg, names, args.schema_file, cfg.apply.retry_for_s, store) if names else {}
    target = open_target(tcfg)
    applier = Applier(lambda: spark_session(f"dblog-apply-{tcfg.name}"), target, store, state, scfg.name)
    try:
        # the target or Redis away: each table's step is retried as on the local path
        results, retries = apply_tables(applier, target, tcfg, scfg, store, state, schemas_of, tables,
                                        cfg.apply.retry_for_s)
        where = applier.where
    finally:
        applier.stop()
        target.close()
    return run_result(tcfg, scfg, applier.run_id, results, started, SPARK,
                      spark_start_s=applier.spark_start_s, retries=retries, **where)


if __name__ == "__main__":
    sys.exit(run_job(main))
