"""Building and running the spark-submit commands of the Spark jobs (``spark_jobs/``).

Shared by the ``dblog`` command and the Airflow operators, so a job runs with the
same jars, settings and environment wherever it is started. Each job prints one
final line ``DBLOG_RESULT <json>`` on stdout; ``run_spark_job`` returns that dict.
No Airflow and no pyspark import here: only a subprocess.
"""
from __future__ import annotations

import collections
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from .config import Config
from .errors import DBLogError

log = logging.getLogger(__name__)

RESULT_PREFIX = "DBLOG_RESULT "
ERROR_PREFIX = "DBLOG_ERROR "
SHUFFLE_PARTITIONS = 4
_JAVA_TZ = "-Duser.timezone=UTC"
# log4j lines below WARN, in both Spark layouts ("25/11/22 00:30:00 INFO X: ..." and JSON)
_NOISE = re.compile(r'^(\d\d/\d\d/\d\d \d\d:\d\d:\d\d (INFO|DEBUG|TRACE) |\{"ts":.*"level":"(INFO|DEBUG|TRACE)")')


class SparkJobError(DBLogError):
    """A Spark job failed, or finished without reporting its result."""

    def __init__(self, message: str, returncode: int | None = None, output_tail: str = ""):
        super().__init__(message)
        self.returncode = returncode
        self.output_tail = output_tail


def spark_submit_binary() -> str:
    """``spark-submit`` next to the running Python (its venv's bin) or else on PATH."""
    local = Path(sys.executable).parent / "spark-submit"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which("spark-submit")
    if found:
        return found
    raise SparkJobError(
        f"spark-submit not found next to {sys.executable} nor on PATH; install pyspark into this "
        "environment (it ships bin/spark-submit)")


def application_path(name: str) -> str:
    """The file of a Spark job: ``spark_jobs/<name>.py`` of the installed package."""
    import spark_jobs

    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        raise SparkJobError(f"not a Spark job name: {name!r}")
    path = Path(spark_jobs.__file__).resolve().parent / f"{name}.py"
    if not path.is_file():
        raise SparkJobError(f"no Spark job {name!r} ({path} does not exist)")
    return str(path)


def spark_conf(config: Config) -> dict[str, str]:
    """The settings every job runs with; the config's ``spark.conf`` wins over them."""
    conf = {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": str(SHUFFLE_PARTITIONS),
        "spark.driver.extraJavaOptions": _JAVA_TZ,
        "spark.executor.extraJavaOptions": _JAVA_TZ,
        "spark.pyspark.python": config.spark.python or sys.executable,
    }
    for k, v in (config.spark.conf or {}).items():
        v = str(v)
        if k.endswith("extraJavaOptions") and _JAVA_TZ not in v:
            v = f"{v} {_JAVA_TZ}".strip()  # the UTC JVM is not optional (timestamps)
        conf[str(k)] = v
    return conf


def existing_jars(config: Config) -> list[str]:
    jars = []
    for j in config.spark.jars:
        if os.path.exists(j):
            jars.append(j)
        else:
            log.warning("Spark jar %s does not exist: left out of --jars", j)
    return jars


def spark_submit_args(config: Config, application: str, app_args: list[str]) -> list[str]:
    """The full ``spark-submit`` command line for ``application`` (a file path)."""
    cmd = [spark_submit_binary(), "--master", config.spark.master,
           "--name", f"dblog-{Path(application).stem}"]
    jars = existing_jars(config)
    if jars:
        cmd += ["--jars", ",".join(jars)]
    if config.spark.driver_memory:
        cmd += ["--driver-memory", str(config.spark.driver_memory)]
    if config.spark.executor_memory:
        cmd += ["--executor-memory", str(config.spark.executor_memory)]
    if config.spark.executor_cores:
        cmd += ["--executor-cores", str(config.spark.executor_cores)]
    for k, v in spark_conf(config).items():
        cmd += ["--conf", f"{k}={v}"]
    return cmd + [application, *[str(a) for a in app_args]]


def spark_preexec(config: Config):
    """The ``preexec_fn`` that gives spark-submit (and the JVM it starts) the config's
    ``spark.nice``, or None. Applied in the child only: the caller keeps its priority."""
    nice = config.spark.nice
    return (lambda: os.nice(nice)) if nice else None


def project_root() -> str:
    """The directory holding ``airflow_provider_dblog`` and ``spark_jobs`` (for PYTHONPATH)."""
    return str(Path(__file__).resolve().parents[2])


def job_env(env: dict | None = None) -> dict[str, str]:
    out = dict(os.environ)
    out.update({"SPARK_LOCAL_IP": out.get("SPARK_LOCAL_IP", "127.0.0.1"), "TZ": "UTC",
                "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable})
    paths = [project_root()] + [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    out["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    out.update(env or {})
    return out


def parse_result(stdout_lines: list[str]) -> dict | None:
    for line in reversed(stdout_lines):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    return None


def run_spark_job(config: Config, name: str, app_args: list[str], env: dict | None = None,
                  timeout_s: float | None = None, echo=None) -> dict:
    """spark-submit ``spark_jobs/<name>.py`` and return the dict it reported.

    Output is streamed to this module's logger at INFO (log4j's INFO lines at
    DEBUG) or to ``echo(line)`` if given. Raises SparkJobError with the job's own
    error message (its ``DBLOG_ERROR`` line) and the last 40 lines of its output.
    """
    cmd = spark_submit_args(config, application_path(name), app_args)
    log.info("running %s", " ".join(cmd))
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=job_env(env), bufsize=1, errors="replace",
                            preexec_fn=spark_preexec(config))
    out_lines: list[str] = []
    # spark-submit passes the Python driver's stderr (tracebacks, logging) on to its own
    # stdout, so the tail shown on failure is of both streams, without log4j's INFO lines
    err_tail: collections.deque[str] = collections.deque(maxlen=40)
    lock = threading.Lock()

    def pump(stream, is_err):
        for raw in stream:
            line = raw.rstrip("\n")
            if _NOISE.match(line):
                log.debug("%s", line)
                continue
            with lock:
                if not is_err:
                    out_lines.append(line)
                if not line.startswith(RESULT_PREFIX):
                    err_tail.append(line)
            if echo is not None:
                echo(line)
            else:
                log.info("[%s] %s", name, line)

    threads = [threading.Thread(target=pump, args=(proc.stdout, False), daemon=True),
               threading.Thread(target=pump, args=(proc.stderr, True), daemon=True)]
    for t in threads:
        t.start()
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise SparkJobError(f"Spark job {name} did not finish within {timeout_s:.0f}s; killed",
                            None, "\n".join(err_tail)) from None
    for t in threads:
        t.join(10)
    seconds = time.monotonic() - started
    tail = "\n".join(err_tail)
    own_error = next((ln[len(ERROR_PREFIX):] for ln in reversed(out_lines) if ln.startswith(ERROR_PREFIX)), "")
    if rc != 0:
        what = f": {own_error}" if own_error else ""
        raise SparkJobError(f"Spark job {name} failed (exit {rc}, {seconds:.1f}s){what}\n"
                            f"--- last lines of output ---\n{tail}", rc, tail)
    try:
        result = parse_result(out_lines)
    except ValueError as e:
        raise SparkJobError(f"Spark job {name} printed an unreadable result: {e}", rc, tail) from None
    if result is None:
        raise SparkJobError(f"Spark job {name} exited 0 without a {RESULT_PREFIX.strip()} line\n"
                            f"--- last lines of output ---\n{tail}", rc, tail)
    result.setdefault("submit_seconds", round(seconds, 3))
    return result
