"""Building and running the spark-submit commands of the Spark jobs (``spark_jobs/``).

Shared by the ``dblog`` command and the Airflow operators, so a job runs with the
same jars, settings and environment wherever it is started. A job reports its
result, or its error, in one JSON file its launcher names (``JobReport``: the one
owner of that protocol); ``run_spark_job`` returns the result. No Airflow and no
pyspark import here: only a subprocess.
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
import tempfile
import threading
import time
from pathlib import Path

from .config import Config
from .errors import DBLogError

log = logging.getLogger(__name__)

# the job's result and error lines in its log (for people; launchers read the JobReport)
RESULT_PREFIX = "DBLOG_RESULT "
ERROR_PREFIX = "DBLOG_ERROR "
RESULT_FILE_ARG = "--result-file"
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
    """The ``preexec_fn`` of spark-submit: it dies with the process that started it (SIGKILL
    from the kernel when that thread ends: a killed `dblog dump` or Airflow task must not
    leave a driver running on, racing a resumed run of the same request), and it gets the
    config's ``spark.nice``. Applied in the child only: the caller keeps its priority.

    Call it in the thread that starts the job and waits for it (the kernel watches the
    starting thread, not the process)."""
    nice, parent = config.spark.nice, os.getpid()

    def preexec() -> None:
        die_with_parent(parent)
        if nice:
            os.nice(nice)
    return preexec


def die_with_parent(parent: int) -> None:
    """In a child before exec: ask Linux for SIGKILL when the parent dies (prctl
    PR_SET_PDEATHSIG, kept across exec), and exit now if it already has."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the prctl
        os._exit(1)


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


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


class JobReport:
    """Where a Spark job reports: a JSON file the launcher creates and names on the job's
    command line (``--result-file PATH``); the job writes it once, at its end
    (``spark_jobs/common.run_job``): ``{"result": {...}}`` or ``{"error": "Type: message"}``.
    The driver runs on the launcher's host (client mode only), so the file is local to both.
    ``outcome`` turns it, with the process's exit code, into the result or a SparkJobError."""

    def __init__(self, job: str):
        self.job = job
        fd, self.path = tempfile.mkstemp(prefix=f"dblog-{job}-", suffix=".json")
        os.close(fd)

    def args(self) -> list[str]:
        return [RESULT_FILE_ARG, self.path]

    def read(self) -> dict:
        try:
            with open(self.path) as f:
                text = f.read()
            return json.loads(text) if text.strip() else {}
        except (OSError, ValueError) as e:
            raise SparkJobError(f"Spark job {self.job} wrote an unreadable report {self.path}: {e}") from None

    def outcome(self, returncode: int | None = None, seconds: float | None = None, tail: str = "",
                failed: bool = False) -> dict:
        """The job's result; SparkJobError with its own message when it failed (a non-zero
        ``returncode``, or ``failed`` when the launcher knows no code), or when it exited
        without reporting (killed, or not a dblog job)."""
        report = self.read()
        detail = ""
        if returncode is not None:
            detail = f" (exit {returncode}{f', {seconds:.1f}s' if seconds is not None else ''})"
        more = f"\n--- last lines of output ---\n{tail}" if tail else ""
        if "error" in report:
            raise SparkJobError(f"Spark job {self.job} failed{detail}: {report['error']}{more}", returncode, tail)
        if returncode or failed:
            raise SparkJobError(f"Spark job {self.job} failed{detail} without reporting why{more}", returncode, tail)
        if "result" not in report:
            raise SparkJobError(f"Spark job {self.job} exited 0 without reporting a result{more}", returncode, tail)
        return report["result"]

    def close(self) -> None:
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def __enter__(self) -> "JobReport":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_spark_job(config: Config, name: str, app_args: list[str], env: dict | None = None,
                  timeout_s: float | None = None, echo=None) -> dict:
    """spark-submit ``spark_jobs/<name>.py`` and return the dict it reported.

    Output is streamed to this module's logger at INFO (log4j's INFO lines at
    DEBUG) or to ``echo(line)`` if given. Raises SparkJobError with the job's own
    error message (its ``JobReport``) and the last 40 lines of its output.
    """
    with JobReport(name) as report:
        cmd = spark_submit_args(config, application_path(name), [*app_args, *report.args()])
        log.info("running %s", " ".join(cmd))
        started = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=job_env(env), bufsize=1, errors="replace",
                                preexec_fn=spark_preexec(config))
        # spark-submit passes the Python driver's stderr (tracebacks, logging) on to its own
        # stdout, so the tail shown on failure is of both streams, without log4j's INFO lines
        tail: collections.deque[str] = collections.deque(maxlen=40)
        lock = threading.Lock()

        def pump(stream):
            for raw in stream:
                line = raw.rstrip("\n")
                if _NOISE.match(line):
                    log.debug("%s", line)
                    continue
                with lock:
                    if not line.startswith(RESULT_PREFIX):
                        tail.append(line)
                if echo is not None:
                    echo(line)
                else:
                    log.info("[%s] %s", name, line)

        threads = [threading.Thread(target=pump, args=(s,), daemon=True) for s in (proc.stdout, proc.stderr)]
        for t in threads:
            t.start()
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise SparkJobError(f"Spark job {name} did not finish within {timeout_s:.0f}s; killed",
                                None, "\n".join(tail)) from None
        for t in threads:
            t.join(10)
        seconds = time.monotonic() - started
        result = report.outcome(rc, seconds, "\n".join(tail) if rc else "")
    result.setdefault("submit_seconds", round(seconds, 3))
    return result
