"""Run (or resume) one dump request: chunk selects over Spark JDBC inside LW/HW windows.

    spark-submit ... dump_job.py --config dblog.yaml --source shop --request ID [--max-chunks N]

The request must exist (``dblog dump`` / the trigger operator creates it). Each
chunk is Algorithm 1 steps 2-4 then 6-7 (engine.dump.DumpRunner); the chunk
select is ``spark.read.jdbc`` with one partition per key sub-range, all inside
the chunk's window. Its result (the job result protocol, ``spark_jobs/common.py``) is
the run's summary; on failure the request is marked failed in Redis too.

The source or Redis away during a chunk: the chunk is redone in a new window with
backoff for up to ``dump.retry_for_s`` (``DumpRunner.run``). A chunk select that failed on
Spark is judged by its Java exception (:func:`jvm_connection_error`), which the source's
own ``is_transient`` cannot read.
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

# the JVM's own errors of a connection refused or cut (a JDBC driver's may wrap them)
JVM_CONNECTION_ERRORS = frozenset({
    "java.net.ConnectException", "java.net.SocketException", "java.net.SocketTimeoutException",
    "java.io.EOFException", "java.sql.SQLTransientConnectionException",
    "java.sql.SQLNonTransientConnectionException"})


def jvm_connection_error(error: BaseException) -> bool:
    """Whether a Spark error was caused by a server being away: somewhere in its Java
    exception's cause chain, a connection error (JVM_CONNECTION_ERRORS) or an SQLException
    with a SQLSTATE of class 08 (connection exception). A SQL error (a bad column, a type)
    is not: it would fail again."""
    from py4j.protocol import Py4JError

    java = getattr(error, "java_exception", None) or getattr(error, "_origin", None)
    for _ in range(30):  # a cause chain is short; a cycle must not hang us
        if java is None:
            return False
        try:
            if java.getClass().getName() in JVM_CONNECTION_ERRORS:
                return True
            try:
                state = java.getSQLState()  # only an SQLException has one
            except Py4JError:
                state = None
            if state and str(state).startswith("08"):
                return True
            java = java.getCause()
        except Py4JError:  # the JVM is gone too: nothing to read
            return False
    return False


class RetryingChunkReader(SparkChunkReader):
    """SparkChunkReader whose failures ``DumpRunner`` can judge (``is_transient``)."""

    def is_transient(self, error: BaseException) -> bool:
        return jvm_connection_error(error)


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
        reader = RetryingChunkReader(spark, source)
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
