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
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowSkipException

from ..engine.dump import ChunkTask, DumpRunner
from ..engine.jobs import ERROR_PREFIX, RESULT_PREFIX, SparkJobError, parse_result
from ..engine.positions import ZERO
from ..engine.state import Window
from ..exceptions import DBLogInvalidRequest
from ..hooks.dblog import DBLogHook
from .spark import DBLogSparkSubmitOperator

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


class DBLogChunkDumpOperator(BaseOperator):
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
        racing it. Default: ``max(900, 3 * dump.window_timeout_s)``.

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
        self.request_id = request_id
        self.config_path = config_path
        self.source = source
        self.dblog_conn_id = dblog_conn_id
        self.spark_conn_id = spark_conn_id
        self.abandon_after = abandon_after
        self._spark_hook = None
        self._open: tuple[Any, Window] | None = None  # (state, window) while steps 2-4 run

    def execute(self, context: Context) -> dict:
        rid = str(self.request_id or "").strip()
        if not rid:
            raise DBLogInvalidRequest("request_id is empty")
        hook = DBLogHook(config_path=self.config_path, dblog_conn_id=self.dblog_conn_id)
        cfg = hook.config
        source_name = cfg.source(self.source).name
        runner = hook.runner(source_name)
        try:
            return self._chunk(hook, runner, rid, source_name, context)
        finally:
            runner.source.close()

    def _chunk(self, hook: DBLogHook, runner: DumpRunner, rid: str, source_name: str, context: Context) -> dict:
        state = runner.state
        req = state.request(rid)
        if req is None:
            raise DBLogInvalidRequest(f"unknown dump request {rid!r} for source {source_name!r}")
        if req["status"] in ("done", "cancelled"):
            raise AirflowSkipException(f"dump request {rid} is {req['status']}: no chunk to dump")
        if state.flag(rid, "cancel"):
            for w in state.open_windows():
                if w.request == rid:
                    state.close_window(w, "cancelled")
            state.set_request_status(rid, "cancelled")
            raise AirflowSkipException(f"dump request {rid} was cancelled")
        if state.flag(rid, "pause"):
            state.set_request_status(rid, "paused")
            raise AirflowSkipException(f"dump request {rid} is paused: resume it to go on")

        task = runner.next_chunk(rid)
        if task is None:
            state.set_request_status(rid, "done")
            self.log.info("dump request %s is done: every chunk of %s completed", rid,
                          ", ".join(runner.spec(rid).tables))
            raise AirflowSkipException(f"dump request {rid} is done")
        job = None
        if task.keys is None:
            job = self._spark_job(hook)
            master = job.check_spark_connection()  # before the window opens
            self.log.info("chunk select on Spark master %s (connection %s)", master, self.spark_conn_id)

        runner.source.ensure_watermark_table()
        state.set_request_status(rid, "running")
        abandon_after = self.abandon_after
        if abandon_after is None:
            abandon_after = max(900.0, 3 * runner.config.window_timeout_s)
        cp = state.checkpoint()
        if cp is None:
            self.log.warning("source %s has no tail checkpoint yet: the HW sensor waits until a "
                             "log tail runs", source_name)
        window, abandoned = state.open_exclusive_window(rid, task.table, cp.pos if cp else ZERO, abandon_after)
        for w in abandoned:
            self.log.warning("closed window %s of %s (opened %.0fs ago) as abandoned: its chunk is redone",
                             w.id, w.table, time.time() - w.opened_at)
        what = (f"{len(task.keys)} keys" if task.keys is not None
                else f"keys up to {task.end}, {len(task.predicates)} partitions")
        self.log.info("request %s, %s: window %s opened (floor %s); chunk of %s%s", rid, task.table,
                      window.id, window.floor, what, " (the table's last)" if task.last else "")
        self._open = (state, window)
        t0 = time.monotonic()
        try:
            runner.source.write_watermark(window.lw)                            # step 2: LW
            self.log.info("LW %s written", window.lw)
            spark = None
            if task.keys is not None:                                           # step 3
                selected = runner.select_chunk(task, window).num_rows
            else:
                result = self._select_on_spark(job, hook, source_name, task, window, context)
                selected = int(result["rows"])
                spark = {"master": result.get("spark_master"), "app_id": result.get("app_id")}
            runner.source.write_watermark(window.hw)                            # step 4: HW
            self.log.info("HW %s written", window.hw)
        except BaseException as e:
            # an open window holds the apply frontier back: close it, then fail
            self._fail_window(state, window, rid, e)
            raise
        finally:
            self._open = None
        select_s = round(time.monotonic() - t0, 3)
        self.log.info("request %s, %s: %d rows selected in %.1fs inside window %s", rid, task.table,
                      selected, select_s, window.id)
        return {"chunk": task.to_dict(), "window": json.loads(window.to_json()),
                "selected": selected, "select_s": select_s, "spark": spark}

    def _fail_window(self, state, window: Window, rid: str, error: BaseException) -> None:
        message = f"{type(error).__name__}: {error}"
        try:
            if state.window_is_open(window.id):  # else on_kill closed it already
                state.close_window(window, "failed", {"error": message[:2000], "step": "select"})
                self.log.error("chunk select failed; window %s closed as failed", window.id)
            state.set_request_status(rid, "failed", message[:2000])
        except Exception:  # the original error matters more
            self.log.exception("could not close window %s after a failed select", window.id)

    def _spark_job(self, hook: DBLogHook) -> DBLogSparkSubmitOperator:
        """The chunk select's spark-submit, set up as every dblog Spark job is (jars, conf and
        environment from the config; ``operators/spark.py``). Only its parts are used, not its
        ``execute``: the select runs between this task's LW and HW."""
        return DBLogSparkSubmitOperator(
            task_id=f"{self.task_id}__select", job=SPARK_JOB, config_path=hook.resolve_config_path(),
            dblog_conn_id=self.dblog_conn_id, conn_id=self.spark_conn_id)

    def _select_on_spark(self, job: DBLogSparkSubmitOperator, hook: DBLogHook, source_name: str,
                         task: ChunkTask, window: Window, context: Context) -> dict:
        job.job_args = ["--source", source_name, "--chunk", json.dumps(task.to_dict()), "--window-id", window.id]
        job.prepare(hook, context)
        self._spark_hook = job._get_hook()  # keeps the job's DBLOG_RESULT / DBLOG_ERROR lines
        try:
            self._spark_hook.submit(job.application)
        except AirflowException as e:
            own = next((ln[len(ERROR_PREFIX):] for ln in reversed(job._result_lines)
                        if ln.startswith(ERROR_PREFIX)), "")
            if own:
                raise SparkJobError(f"Spark job {SPARK_JOB} failed: {own}") from e
            raise
        result = parse_result(job._result_lines)
        if result is None:
            raise SparkJobError(f"Spark job {SPARK_JOB} exited 0 without a {RESULT_PREFIX.strip()} line")
        self.log.info("chunk select: %s", {k: v for k, v in result.items() if k != "dest"})
        return result

    def on_kill(self) -> None:
        if self._spark_hook is not None:
            self._spark_hook.on_kill()
        if self._open is not None:
            state, window = self._open
            if state.window_is_open(window.id):
                state.close_window(window, "failed", {"error": "task killed", "step": "select"})
