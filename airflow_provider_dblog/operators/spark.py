"""DBLogSparkSubmitOperator: a dblog Spark job (``spark_jobs/<job>.py``) through the Spark provider.

The job's command line is the one the ``dblog`` command builds (``engine.jobs``):
the same application file, ``--jars``, ``--conf`` settings and environment. The
config is only known at run time (``config_path`` is templated), so all of it is
resolved in ``execute()``. Jobs are launched by composition: the Spark provider's
``SparkSubmitHook`` (its constructor and ``submit()``), the job's result read from its
``engine.jobs.JobReport``; the chunk operator launches its select the same way.
"""
from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowException, AirflowNotFoundException

from ..engine.jobs import (
    JobReport,
    SparkJobError,
    application_path,
    existing_jars,
    spark_conf,
    spark_preexec,
    spark_submit_binary,
)
from ..exceptions import DBLogSparkConnectionError
from ..hooks.dblog import DBLogHook, DBLogHookMixin

if TYPE_CHECKING:
    from airflow.sdk import Context

SPARK_CONN_JSON = '{"conn_type":"spark","host":"local[2]"}'

# settings that SparkSubmitOperator sets through its own arguments (--master, --jars,
# --name, --driver-memory, --deploy-mode, --queue, --packages): never passed as --conf
HANDLED_CONF = frozenset({
    "spark.master", "spark.submit.deployMode", "spark.jars", "spark.jars.packages",
    "spark.app.name", "spark.driver.memory", "spark.yarn.queue",
})

JOB_ENV_KEYS = frozenset({"SPARK_LOCAL_IP", "TZ", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH"})

# what SparkSubmitHook can resolve a connection to that spark-submit accepts
_MASTER = re.compile(r"^(local(\[[^\]]+\])?|local-cluster\[[^\]]+\]|yarn|(spark|mesos|k8s)://\S+)$")



def check_spark_connection(conn_id: str, deploy_mode: str | None = None) -> str:
    """The master the Spark connection resolves to (as the Spark provider resolves it);
    DBLogSparkConnectionError if it is missing, unusable, or asks for cluster deploy mode."""
    create = (f"create it, e.g. `airflow connections add {conn_id} --conn-json "
              f"'{SPARK_CONN_JSON}'` or set AIRFLOW_CONN_{conn_id.upper()}='{SPARK_CONN_JSON}'")
    try:
        BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        raise DBLogSparkConnectionError(
            f"Spark connection {conn_id!r} does not exist (the Spark provider would silently "
            f"submit to YARN instead): {create}") from None
    # the provider's own resolution of the connection (read, never changed)
    resolved = SparkSubmitHook(conn_id=conn_id, deploy_mode=deploy_mode)._connection
    master = str(resolved.get("master") or "")
    if not _MASTER.match(master):
        raise DBLogSparkConnectionError(
            f"Spark connection {conn_id!r} resolves to master {master!r}, which spark-submit "
            f"does not accept: put the master in the connection's host, {create}")
    if (resolved.get("deploy_mode") or "client") != "client":
        raise DBLogSparkConnectionError(
            f"Spark connection {conn_id!r} (or the operator) asks for deploy mode "
            f"{resolved['deploy_mode']!r}: dblog's jobs run in client mode only (the driver reports "
            "each job's result to the task that submitted it); drop deploy-mode from the connection")
    return master


@dataclass
class JobSettings:
    """What every dblog Spark job is submitted with, from the config (``engine.jobs``)."""
    application: str
    jars: list[str]
    conf: dict[str, str]
    env_vars: dict[str, str]
    driver_memory: str | None = None
    executor_memory: str | None = None
    executor_cores: int | None = None
    preexec: Callable[[], None] | None = field(default=None, repr=False)


def job_settings(hook: DBLogHook, job: str) -> JobSettings:
    """The job's application, jars, conf (the provider's own arguments left out), memory
    and cores, and environment: the variables the engine sets for its jobs, the connections
    the config names, and whatever else the engine changed (``hook.subprocess_env()``)."""
    cfg = hook.config
    full = hook.subprocess_env()
    env = {k: v for k, v in full.items()
           if k in JOB_ENV_KEYS or k.startswith("AIRFLOW_CONN_") and k in hook.connection_env
           or os.environ.get(k) != v}
    if not shutil.which("spark-submit", path=env.get("PATH", os.environ.get("PATH"))):
        try:  # pyspark's spark-submit next to this Python (its venv's bin)
            bindir = os.path.dirname(spark_submit_binary())
            env["PATH"] = os.pathsep.join([bindir, env.get("PATH", os.environ.get("PATH", ""))])
        except SparkJobError:
            pass  # the Spark provider reports the missing binary
    return JobSettings(
        application=application_path(job), jars=existing_jars(cfg),
        conf={k: v for k, v in spark_conf(cfg).items() if k not in HANDLED_CONF}, env_vars=env,
        driver_memory=str(cfg.spark.driver_memory) if cfg.spark.driver_memory else None,
        executor_memory=str(cfg.spark.executor_memory) if cfg.spark.executor_memory else None,
        executor_cores=int(cfg.spark.executor_cores) if cfg.spark.executor_cores else None,
        preexec=spark_preexec(cfg))


def submit_and_report(spark_hook: SparkSubmitHook, application: str, report: JobReport,
                      preexec: Callable[[], None] | None = None) -> dict:
    """Run the job through the Spark provider's hook (``submit()``; Popen arguments such as
    ``spark.nice``'s ``preexec_fn`` pass through it) and return its result: SparkJobError
    with the job's own message when it failed, the provider's error chained."""
    try:
        spark_hook.submit(application, **({"preexec_fn": preexec} if preexec else {}))
    except AirflowException as e:
        try:
            report.outcome(failed=True)
        except SparkJobError as err:
            raise err from e
    return report.outcome()


class DBLogSparkSubmitOperator(DBLogHookMixin, SparkSubmitOperator):
    """Run one of dblog's Spark jobs (``dump_job``, ``apply_job``) with ``spark-submit``.

    The base of :class:`~airflow_provider_dblog.operators.dump.DBLogDumpOperator` and
    :class:`~airflow_provider_dblog.operators.apply.DBLogApplyOperator`; usable on its own
    for a job the provider has no operator for. At run time it sets, from the dblog config:

    * ``application``: ``spark_jobs/<job>.py`` of the installed package;
    * ``jars``: the config's ``spark.jars`` that exist on the worker (JDBC drivers), plus yours;
    * ``conf``: the engine's Spark settings (UTC session and JVM, Parquet timestamps, the
      worker's Python) and the config's ``spark.conf``; yours win;
    * ``env_vars``: the connections the config names as ``AIRFLOW_CONN_*``, ``SPARK_LOCAL_IP``,
      ``PYSPARK_PYTHON`` and ``PYTHONPATH`` (credentials go by environment, never by argument);
    * ``driver_memory``, ``executor_memory``, ``executor_cores``: the config's ``spark.*``
      of the same names unless you pass them.

    Spark runs on the master of the Spark connection ``conn_id`` (the config's
    ``spark.master`` is what the ``dblog`` command uses). The connection must exist: the
    Spark provider would otherwise silently submit to YARN, so this operator fails first,
    naming the connection to create, e.g. ``{"conn_type":"spark","host":"local[2]"}``.
    Client mode only for now: the driver runs in the worker's task.

    The job's result (its ``DBLOG_RESULT <json>`` output line) is the task's return value.
    :meth:`run_job` submits and returns that result without handling it, for a subclass
    that decides itself whether to submit (the apply operator hands it to ``run_apply``).

    :param job: the Spark job, ``dump_job`` or ``apply_job``.
    :param config_path: the dblog YAML config (templated); default: the ``dblog``
        connection's ``config_path``, else ``$DBLOG_CONFIG``.
    :param dblog_conn_id: an optional ``dblog`` connection holding ``config_path``.
    :param job_args: extra arguments for the job after ``--config PATH`` (templated).
    :param conn_id: the Spark connection (default ``spark_default``).
    :param kwargs: anything else :class:`SparkSubmitOperator` takes (``conf``, ``jars``,
        ``executor_memory``, ``verbose``, ...).

    Example::

        DBLogSparkSubmitOperator(task_id="apply", job="apply_job",
                                 config_path="/opt/dblog/dblog.yaml",
                                 job_args=["--target", "warehouse"])
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "config_path", "job_args")
    ui_color = "#e8d5f5"
    ui_fgcolor = "#000000"
    # env_vars holds the resolved connections once execute() has run: never store them
    # as rendered fields (Airflow renders and stores the fields before execute)
    overwrite_rtif_after_execution = False

    def __init__(self, *, job: str, config_path: str | None = None, dblog_conn_id: str | None = None,
                 job_args: list[Any] | None = None, conn_id: str = "spark_default",
                 name: str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("application", application_path(job))  # shown in the UI; set again at run time
        super().__init__(conn_id=conn_id, name=name or f"dblog-{job}", **kwargs)
        self.job = job
        self.config_path = config_path
        self.dblog_conn_id = dblog_conn_id
        self.job_args = job_args
        self._preexec: Callable[[], None] | None = None

    # -- what subclasses change ---------------------------------------------------
    def job_arguments(self, hook: DBLogHook, context: Context) -> list[str]:
        """The job's arguments after ``--config PATH``."""
        return [str(a) for a in (self.job_args or [])]

    def handle_result(self, result: dict, hook: DBLogHook, context: Context) -> Any:
        """The task's return value (XCom) from the job's result."""
        return result

    def handle_failure(self, error: SparkJobError, hook: DBLogHook, context: Context) -> None:
        """Called when the job failed; raise something else, or return to raise ``error``."""

    # -- the run ---------------------------------------------------------------------
    def check_spark_connection(self) -> str:
        """The master the Spark connection resolves to; raises if it is missing or unusable."""
        return check_spark_connection(self._conn_id, self._deploy_mode)

    def prepare(self, hook: DBLogHook, context: Context) -> None:
        """Set application, jars, conf, env_vars and the arguments from the config (what
        you passed to the operator wins)."""
        job = job_settings(hook, self.job)
        self._preexec = job.preexec
        self.application = job.application
        jars = job.jars + [j for j in (self.jars or "").split(",") if j.strip()]
        self.jars = ",".join(dict.fromkeys(jars)) or None
        self.conf = {**job.conf, **(self.conf or {})}
        self._driver_memory = self._driver_memory or job.driver_memory
        self._executor_memory = self._executor_memory or job.executor_memory
        self._executor_cores = self._executor_cores or job.executor_cores
        self.env_vars = {**job.env_vars, **(self.env_vars or {})}
        config_path = os.path.abspath(hook.resolve_config_path())
        self.application_args = ["--config", config_path, *self.job_arguments(hook, context)]

    def run_job(self, hook: DBLogHook, context: Context) -> dict:
        """Submit the job (settings from the config) and return its result; on failure
        ``handle_failure`` runs, then the job's SparkJobError is raised."""
        master = self.check_spark_connection()
        self.prepare(hook, context)
        if master != hook.config.spark.master:
            self.log.info("Spark master %s from connection %r (the config's spark.master %s is "
                          "what the dblog command uses)", master, self._conn_id, hook.config.spark.master)
        with JobReport(self.job) as report:
            self.application_args = [*self.application_args, *report.args()]
            self._hook = self._get_hook()  # SparkSubmitOperator's: a hook from this operator's fields
            try:
                return submit_and_report(self._hook, self.application, report, self._preexec)
            except SparkJobError as err:
                self.handle_failure(err, hook, context)
                raise

    def execute(self, context: Context) -> Any:
        hook = self.dblog_hook()
        return self.handle_result(self.run_job(hook, context), hook, context)
