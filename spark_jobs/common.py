"""What the Spark jobs share: the arguments, the session, the config, the result, the chunk reader.

The job result protocol. The launcher (``airflow_provider_dblog.engine.jobs``: the
``dblog`` command's ``run_spark_job`` and the operators, through ``JobReport``) creates
an empty JSON file and names it on the job's command line, ``--result-file PATH``. A
job is a ``main(argv) -> dict`` run by ``run_job``, which takes that argument off
before ``main`` sees the others and then

* on success writes ``{"result": <the dict>}`` to the file, prints one last stdout line
  ``DBLOG_RESULT <the dict as JSON>`` and exits 0;
* on any error prints the traceback to stderr, writes ``{"error": "<Type>: <message>"}``,
  prints ``DBLOG_ERROR <Type>: <message>`` (on one line) and exits 1. ``SystemExit`` (a
  bad argument: argparse's usage, exit 2) passes through without a report.

The file is written once, through a ``.part`` file renamed into place, so the launcher
never reads half of it; it is what the launcher believes (``JobReport.outcome``: no
report, or a non-zero exit, is a failure too). The two stdout lines are for people
reading the job's log. Positions, decimals, dates and bytes in a result are written as
text (``_json_default``). Only this package imports pyspark.
"""
from __future__ import annotations

import argparse
import datetime as dt
import decimal
import json
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

# spark-submit puts this file's directory on sys.path, not the project's root
_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
    sys.path.insert(1, _ROOT)

import pyarrow as pa  # noqa: E402
import pyarrow.fs as pafs  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from airflow_provider_dblog.engine.config import Config, load_config  # noqa: E402
from airflow_provider_dblog.engine.jobs import (ERROR_PREFIX, RESULT_FILE_ARG, RESULT_PREFIX, SHUFFLE_PARTITIONS,  # noqa: E402
                                                 die_with_parent)
from airflow_provider_dblog.engine.positions import Position  # noqa: E402
from airflow_provider_dblog.engine.schema import TableSchema  # noqa: E402

log = logging.getLogger(__name__)

# the jobs' settings when nothing set them: spark-submit passes engine.jobs.spark_conf
# (and the user's spark.conf) as --conf, and those win. Never the master: a job runs where
# spark-submit sends it.
DEFAULT_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": str(SHUFFLE_PARTITIONS),
    "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
    "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
    # columns are named as the source names them: "a" and "A" are two columns
    "spark.sql.caseSensitive": "true",
    # a chunk collected to the driver (SparkChunkReader) well inside its 1g default heap;
    # a larger one goes through Parquet instead
    "spark.driver.maxResultSize": "256m",
}


def submitted_conf() -> dict[str, str]:
    """The settings spark-submit gave this driver (``--master``, ``--conf``, ``--jars``, ...):
    the driver JVM's ``spark.*`` properties, read through the gateway spark-submit opened
    for this Python process. Empty when nothing launched us (Spark started in-process)."""
    from pyspark import SparkConf, SparkContext

    if SparkContext._jvm is None:
        if not os.environ.get("PYSPARK_GATEWAY_PORT"):
            return {}
        SparkContext._ensure_initialized()   # connects to spark-submit's JVM; starts none
    return dict(SparkConf().getAll())


def spark_session(app_name: str, conf: dict[str, str] | None = None):
    """getOrCreate a session: what spark-submit set stays as it is; the project's defaults
    fill only what nothing set; ``conf`` (in-process callers, tests) is applied as given."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("TZ", "UTC")
    have = submitted_conf()
    builder = SparkSession.builder
    if "spark.app.name" not in have:
        builder = builder.appName(app_name)
    for k, v in DEFAULT_CONF.items():
        if k not in have:
            builder = builder.config(k, v)
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("DBLOG_SPARK_LOG_LEVEL", "WARN"))
    return spark


def load(config_path: str) -> Config:
    return load_config(config_path)


def _json_default(v: Any) -> Any:
    if isinstance(v, Position):
        return v.encode()
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, (dt.datetime, dt.date)):
        return v.isoformat()
    if isinstance(v, (bytes, bytearray)):
        return "0x" + bytes(v).hex()
    if hasattr(v, "__dataclass_fields__"):
        import dataclasses
        return dataclasses.asdict(v)
    raise TypeError(f"not JSON serialisable: {type(v).__name__}")


def _report(path: str | None, report: dict) -> None:
    """Write the job's report (engine.jobs.JobReport) in one step: a reader never sees half."""
    if path:
        tmp = f"{path}.part"
        with open(tmp, "w") as f:
            json.dump(report, f, default=_json_default)
        os.replace(tmp, path)


def run_job(main: Callable[[list[str] | None], dict], argv: list[str] | None = None) -> int:
    """Run ``main`` and report (``--result-file``, taken off the arguments ``main`` sees):
    the result and exit 0, or the error and exit 1. Both are also logged, for people."""
    if "PYSPARK_GATEWAY_PORT" in os.environ:  # the driver of a spark-submit: it dies with that JVM
        die_with_parent(os.getppid())
    argv = list(sys.argv[1:] if argv is None else argv)
    path = None
    if RESULT_FILE_ARG in argv:
        i = argv.index(RESULT_FILE_ARG)
        path = argv[i + 1]
        del argv[i:i + 2]
    try:
        result = main(argv)
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 - everything is reported, then fails the job
        traceback.print_exc()
        msg = f"{type(e).__name__}: {e}".replace("\n", " | ")
        _report(path, {"error": msg})
        sys.stdout.write(ERROR_PREFIX + msg + "\n")
        sys.stdout.flush()
        return 1
    _report(path, {"result": result})
    sys.stdout.write(RESULT_PREFIX + json.dumps(result, default=_json_default) + "\n")
    sys.stdout.flush()
    return 0


def job_parser(prog: str, doc: str, *, source: bool = True) -> argparse.ArgumentParser:
    """The job's command line with what every job takes: ``--config`` (and ``--source``);
    its description is the first line of ``doc`` (the job module's docstring)."""
    p = argparse.ArgumentParser(prog=prog, description=doc.split("\n")[0])
    p.add_argument("--config", required=True, help="the dblog YAML config")
    if source:
        p.add_argument("--source", default=None, help="source name (optional with one source)")
    return p


def log_to_stderr() -> None:
    """The job's log on stderr: stdout carries the result line."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def ran_on(spark) -> dict[str, str]:
    """Where the job ran, for its result: the Spark master and the application id."""
    return {"spark_master": spark.sparkContext.master, "app_id": spark.sparkContext.applicationId}


def close_job(source, spark) -> None:
    """The end of a job that read a source: close the source, stop Spark (None: not started)."""
    try:
        source.close()
    finally:
        if spark is not None:
            spark.stop()


# -- types ----------------------------------------------------------------------
def spark_type(logical: str):
    """The Spark SQL type of a logical column type (see engine.schema)."""
    import re

    from pyspark.sql import types as T

    from airflow_provider_dblog.engine.logical_types import is_text_carried

    m = re.match(r"^decimal\((\d+),(\d+)\)$", logical)
    if m:
        return T.DecimalType(int(m.group(1)), int(m.group(2)))
    if is_text_carried(logical):
        return T.StringType()
    return {
        "bool": T.BooleanType(), "int8": T.ByteType(), "int16": T.ShortType(),
        "int32": T.IntegerType(), "int64": T.LongType(), "float32": T.FloatType(),
        "float64": T.DoubleType(), "binary": T.BinaryType(), "date": T.DateType(),
        "timestamp": T.TimestampNTZType(), "timestamptz": T.TimestampType(),
    }[logical]


def row_spark_schema(table: TableSchema):
    from pyspark.sql import types as T

    return T.StructType([T.StructField(c.name, spark_type(c.type), True) for c in table.columns])


def event_spark_schema(table: TableSchema):
    """engine.events.event_arrow_schema as Spark sees it."""
    from pyspark.sql import types as T

    row = row_spark_schema(table)
    return T.StructType([
        T.StructField("table", T.StringType(), False),
        T.StructField("op", T.StringType(), False),
        T.StructField("key", T.StringType(), False),
        T.StructField("before", row, True),
        T.StructField("after", row, True),
        T.StructField("pos", T.StringType(), False),
        T.StructField("source_ts", T.LongType(), False),
        T.StructField("error", T.StringType(), True),
    ])


def conform_columns(df, table: TableSchema, as_text: set[str] = frozenset()) -> list:
    """Columns of ``df`` cast to the table's logical types where Spark read them otherwise;
    the columns of ``as_text`` (selected as text, parsed after the read by the source's
    ``conform_chunk``) stay text. Casts run in Spark's ANSI mode, so a value that does
    not fit fails the chunk.
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    have = dict(df.dtypes)
    types = {f.name: f.dataType for f in df.schema.fields}
    out = []
    for c in table.columns:
        if c.name not in have:
            raise ValueError(f"{table.qualified}: column {c.name!r} missing from {list(have)}")
        want = T.StringType() if c.name in as_text else spark_type(c.type)
        col = F.col("`" + c.name.replace("`", "``") + "`")   # any name, quoted as Spark parses it
        out.append(col if types[c.name] == want else col.cast(want).alias(c.name))
    return out


def to_uri(path: str) -> str:
    return path if "://" in path else "file://" + os.path.abspath(path)


def read_parquet_arrow(uri: str) -> pa.Table:
    """A Parquet directory Spark wrote, read back with pyarrow (local path or any URI)."""
    if "://" in uri:
        fs, path = pafs.FileSystem.from_uri(uri)
    else:
        fs, path = pafs.LocalFileSystem(), uri
    return pq.read_table(path, filesystem=fs)


def plain_var_types(data: pa.Table) -> pa.Table:
    """``toArrow`` gives large_string/large_binary when Spark's ``arrow.useLargeVarTypes`` is
    on; the read-back of Parquet, and conform_chunk's text parsing, see string/binary."""
    large = {pa.large_string(): pa.string(), pa.large_binary(): pa.binary()}
    if not any(f.type in large for f in data.schema):
        return data
    return data.cast(pa.schema([f.with_type(large.get(f.type, f.type)) for f in data.schema]))


# -- the dump's chunk reader ----------------------------------------------------
class SparkChunkReader:
    """engine.dump.ChunkReader on Spark JDBC: one partition per predicate, read in parallel.

    ``source`` needs ``jdbc() -> (url, properties)`` and ``jdbc_table(qualified)``.
    ``keep_file`` (a finish in another process reads them there): the rows go to Parquet at
    ``dest_uri`` (overwritten, so a redone chunk replaces its rows) and are read back;
    otherwise they come to the driver as Arrow batches (``toArrow``: nothing written, the
    runner writes them once, as the snapshot), or through ``dest_uri`` when they are too
    large for the driver. Either way they are returned as a pyarrow table in the table's
    logical types (``source.conform_chunk``). Dates, timestamps and numerics are selected as text
    (the source's ``select_expr``) and parsed in Python by engine/values.py, as on
    every other path: no value is ever a ``java.sql`` date, so no Julian calendar.
    """

    def __init__(self, spark, source, write_partitions: int | None = None):
        self.spark = spark
        self.source = source
        self.write_partitions = write_partitions
        self.last_stats: dict = {}
        self.via_file: set[str] = set()   # tables whose chunks outgrew the driver's result limit

    def _to_driver(self, df, table: TableSchema) -> pa.Table | None:
        """The chunk as Arrow batches in the driver; None when it is larger than the driver
        takes (``spark.driver.maxResultSize``: Spark aborts the collect, nothing held), and
        from then on this table's chunks go through Parquet (rows of large documents)."""
        try:
            return plain_var_types(df.toArrow())
        except Exception as e:
            if "maxResultSize" not in str(e):
                raise
        log.warning("%s: a chunk is larger than spark.driver.maxResultSize; this table's chunks are read "
                    "through Parquet files from now on", table.qualified)
        self.via_file.add(table.qualified)
        return None

    def read(self, table: TableSchema, predicates: list[str], dest_uri: str, keep_file: bool = True) -> pa.Table:
        import time

        if not predicates:
            raise ValueError(f"no predicates for a chunk of {table.qualified}")
        url, props = self.source.jdbc()
        props = {str(k): str(v) for k, v in dict(props).items()}
        props.setdefault("preferTimestampNTZ", "true")
        t0 = time.monotonic()
        df = self.spark.read.jdbc(url, self.source.jdbc_table(table.qualified),
                                  predicates=list(predicates), properties=props)
        native = self.source.native_columns(table.qualified)
        as_text = {c for c in table.column_names if self.source.text_parsed(native[c])}
        df = df.select(*conform_columns(df, table, as_text))
        selected = None
        if not keep_file and table.qualified not in self.via_file:
            selected = self._to_driver(df, table)
        if selected is None:
            if self.write_partitions:
                df = df.coalesce(self.write_partitions)
            df.write.mode("overwrite").parquet(dest_uri)
        t1 = time.monotonic()
        data = self.source.conform_chunk(table, selected if selected is not None else read_parquet_arrow(dest_uri))
        self.last_stats = {"rows": data.num_rows, "partitions": len(predicates),
                           "spark_s": round(t1 - t0, 3), "conform_s": round(time.monotonic() - t1, 3)}
        return data
