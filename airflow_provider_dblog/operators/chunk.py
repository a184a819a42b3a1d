"""DBLogChunkDumpOperator: Algorithm 1 steps 2-4 for the next chunk of a dump request.

One task opens the chunk's window and writes its low watermark (LW), selects the
chunk (Spark JDBC through the Spark provider's SparkSubmitHook for a key range;
bound parameters in-process for a key list), and writes the high watermark (HW).
Waiting for the HW in the log is the sensor's job (``sensors/watermark.py``,
deferrable), reconciling and writing the snapshot the reconcile operator's
(``operators/reconcile.py``). Chained::

    chunk = DBLogChunkDumpOperator(task_id="chunk", request_id="{{ params.request_id }}")
    hw = DBLogHighWatermarkSensor(task_id="hw", window=chunk.output)
    done = DBLogReconcileOperator(task_id="reconcile", chunk=chunk.output)
    chunk >> hw >> done

When the request has no chunk left, the task marks the request done and is
skipped, and so are the tasks after it.
"""
from __future__ import annotations

import ast
import json
import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowSkipException

from ..engine.dump import ChunkTask, DumpRunner, fail_window
from ..engine.errors import DumpCancelledError, DumpPausedError
from ..engine.jobs import JobReport
from ..engine.requests import UnknownRequestError
from ..engine.windows import Window
from ..exceptions import DBLogInvalidRequest
from ..hooks.dblog import DBLogHook, DBLogHookMixin
from .spark import check_spark_connection, job_settings, submit_and_report

if TYPE_CHECKING:
    from airflow.sdk import Context

SPARK_JOB = "chunk_select_job"


def _mapping(value: Any, what: str) -> dict:
    """A dict, from itself or the text a template rendered it to (JSON, or Python's repr
    when the DAG does not render templates as native objects)."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = json.loads(text)
        except ValueError:
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                raise DBLogInvalidRequest(f"{what} is neither JSON nor a dict: {text[:200]!r}") from None
    if not isinstance(value, dict):
        raise DBLogInvalidRequest(f"{what} must be a dict (the chunk operator's XCom), not {type(value).__name__}")
    return value


def window_from_xcom(value: Any) -> Window:
    """The window of a chunk: the chunk operator's whole XCom, or its ``window`` part."""
    d = _mapping(value, "window")
    if "chunk" in d and "window" in d:
        d = _mapping(d["window"], "window")
    try:
        return Window.from_json(json.dumps(d))
    except (KeyError, TypeError, ValueError) as e:
        raise DBLogInvalidRequest(f"not a dblog window: {e}") from None


def chunk_xcom(value: Any, chunk_task_id: str | None, context: Context, wanted: str) -> Any:
    """The chunk operator's XCom: ``value`` when the task was given it (``chunk.output``),
    else pulled from ``chunk_task_id``; ``wanted`` says what for, in the error."""
    if value is None:
        value = context["ti"].xcom_pull(task_ids=chunk_task_id)
        if value is None:
            raise DBLogInvalidRequest(f"no XCom from {chunk_task_id!r}: no {wanted}")
    return value


def chunk_from_xcom(value: Any) -> tuple[ChunkTask, Window]:
    """The chunk task and its window from the chunk operator's XCom."""
    d = _mapping(value, "chunk")
    if "chunk" not in d or "window" not in d:
        raise DBLogInvalidRequest(f"chunk must be the chunk operator's XCom with 'chunk' and 'window', "
                                  f"got keys {sorted(d)}")
    try:
        task = ChunkTask.from_dict(_mapping(d["chunk"], "chunk"))
    except TypeError as e:
        raise DBLogInvalidRequest(f"not a dblog chunk task: {e}") from None
    return task, window_from_xcom(d["window"])


class DBLogChunkDumpOperator(DBLogHookMixin, BaseOperator):
    """Open the window, write the LW, select the request's next chunk, write the HW.

    :param request_id: the dump request (``dblog dump`` / the dump DAGs create it). Templated.
    :param config_path: the dblog YAML; default: the ``dblog`` connection, else ``$DBLOG_CONFIG``.
        Templated.
    :param source: the source name (optional when the config has one).
    :param dblog_conn_id: an optional ``dblog`` connection holding ``config_path``.
    :param spark_conn_id: the Spark connection (master); checked to exist first.
    :param abandon_after: seconds after which another open window of the same request is
        taken to be left by a crashed run and closed as abandoned; a younger one means a
        chunk of the request is in flight, and this task fails (retriable) instead of
        racing it. Default: the config's ``dump.abandon_after_s`` (``max(900, 3 * window_timeout_s)``).

    Any error between the LW and the HW (the select failing, ``execution_timeout``, a kill)
    closes the window as failed before the task fails: an open window would hold the
    apply frontier back.

    Returns (XCom) ``{"chunk": ChunkTask.to_dict(), "window": Window as a dict,
    "selected": rows, "select_s": seconds, "spark": {"master", "app_id"} or None}``: what the
    sensor and the reconcile operator take; ``spark`` names the application that selected a
    key-range chunk (a key-list chunk is selected in the task, with bound parameters).
    """

    template_fields: Sequence[str] = ("config_path", "request_id")
    ui_color = "#d8e7f5"

    def __init__(self, *, request_id: str, config_path: str | None = None, source: str | None = None,
                 dblog_conn_id: str | None = None, spark_conn_id: str = "spark_default",
                 abandon_after: float | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.use_dblog_config(config_path, dblog_conn_id, source)
        self.request_id = request_id
        self.spark_conn_id = spark_conn_id
        self.abandon_after = abandon_after
        self._spark_hook: SparkSubmitHook | None = None  # while the select runs on Spark
        self._open: tuple[Any, Window] | None = None  # (state, window) while steps 2-4 run

    def execute(self, context: Context) -> dict:
        rid = str(self.request_id or "").strip()
        if not rid:
            raise DBLogInvalidRequest("request_id is empty")
        hook = self.dblog_hook()
        cfg = hook.config
        source_name = cfg.source(self.source).name
        runner = hook.runner(source_name)
        try:
            with runner.holding(rid):  # one runner per request: another live one holds it → fail (retriable)
                return self._chunk(hook, runner, rid, source_name, context)
        finally:
            runner.source.close()

    def _chunk(self, hook: DBLogHook, runner: DumpRunner, rid: str, source_name: str, context: Context) -> dict:
        try:
            task = runner.next_chunk_of(rid)                                    # flags, status, plan
        except UnknownRequestError as e:
            raise DBLogInvalidRequest(str(e)) from None
        except (DumpCancelledError, DumpPausedError) as e:
            raise AirflowSkipException(str(e)) from None
        if task is None:
            raise AirflowSkipException(f"dump request {rid} is done")
        if task.keys is None:
            master = check_spark_connection(self.spark_conn_id)  # before the window opens
            self.log.info("chunk select on Spark master %s (connection %s)", master, self.spark_conn_id)
        abandon_after = self.abandon_after
        if abandon_after is None:
            abandon_after = runner.config.abandon_after
        window, _ = runner.open_chunk(task, abandon_after)                      # window, step 2: LW
        what = (f"{len(task.keys)} keys" if task.keys is not None
                else f"keys up to {task.end}, {len(task.predicates)} partitions")
        self.log.info("request %s, %s: window %s opened (floor %s), LW %s written; chunk of %s%s", rid,
                      task.table, window.id, window.floor, window.lw, what, " (the table's last)" if task.last else "")
        self._open = (runner.state, window)
        t0 = time.monotonic()
        try:
            spark = None
            if task.keys is not None:                                           # step 3
                selected = runner.select_chunk(task, window, keep_file=True).num_rows
            else:
                result = self._select_on_spark(hook, source_name, task, window)
                selected = int(result["rows"])
                spark = {"master": result.get("spark_master"), "app_id": result.get("app_id")}
            runner.write_hw(window)                                             # step 4: HW
            self.log.info("HW %s written", window.hw)
        except BaseException as e:
            # an open window holds the apply frontier back: close it, then fail
            if fail_window(runner.state, window, e, "select"):
                self.log.error("chunk select failed; window %s closed as failed", window.id)
            raise
        finally:
            self._open = None
        select_s = round(time.monotonic() - t0, 3)
        self.log.info("request %s, %s: %d rows selected in %.1fs inside window %s", rid, task.table,
                      selected, select_s, window.id)
        return {"chunk": task.to_dict(), "window": json.loads(window.to_json()),
                "selected": selected, "select_s": select_s, "spark": spark}

    def _select_on_spark(self, hook: DBLogHook, source_name: str, task: ChunkTask, window: Window) -> dict:
        """The chunk select as a Spark job (``chunk_select_job``), submitted as every dblog
        job is (``operators/spark.py``): between this task's LW and HW."""
        job = job_settings(hook, SPARK_JOB)
        with JobReport(SPARK_JOB) as report:
            self._spark_hook = SparkSubmitHook(
                conn_id=self.spark_conn_id, name=f"dblog-{SPARK_JOB}", conf=job.conf,
                jars=",".join(job.jars) or None, env_vars=job.env_vars, driver_memory=job.driver_memory,
                executor_memory=job.executor_memory, executor_cores=job.executor_cores,
                application_args=["--config", os.path.abspath(hook.resolve_config_path()), "--source", source_name,
                                  "--chunk", json.dumps(task.to_dict()), "--window-id", window.id,
                                  *report.args()])
            result = submit_and_report(self._spark_hook, job.application, report, job.preexec)
        self.log.info("chunk select: %s", {k: v for k, v in result.items() if k != "dest"})
        return result

    def on_kill(self) -> None:
        if self._spark_hook is not None:
            self._spark_hook.on_kill()
        if self._open is not None:
            state, window = self._open
            fail_window(state, window, "task killed", "select")
