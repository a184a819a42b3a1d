"""DBLogReconcileOperator: Algorithm 1 steps 6-7 for one chunk, after its HW is in the log.

Reads the chunk rows the select wrote, drops every row whose key changed inside the
window (LW, HW) (the log holds a newer version), writes the survivors as snapshot
events at the HW, and only then moves the request's progress and closes the window,
together (``engine.dump.DumpRunner.finish_chunk``). Put it after
:class:`~airflow_provider_dblog.sensors.watermark.DBLogHighWatermarkSensor`; on its own
it waits for the HW itself (in the worker, up to the window timeout).
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.observability.stats import Stats

from ..exceptions import DBLogWindowFailed
from ..hooks.dblog import DBLogHookMixin
from .chunk import chunk_from_xcom, chunk_xcom

if TYPE_CHECKING:
    from airflow.sdk import Context


class DBLogReconcileOperator(DBLogHookMixin, BaseOperator):
    """Reconcile one chunk with its window's log events and write its snapshot at the HW.

    :param chunk: the chunk operator's XCom (templated; e.g. ``chunk=chunk_task.output``);
        or give ``chunk_task_id`` instead.
    :param chunk_task_id: the chunk operator's task id, to pull its XCom.
    :param config_path: the dblog YAML (templated); default: the ``dblog`` connection, else
        ``$DBLOG_CONFIG``.
    :param source: the source name (optional when the config has one).
    :param dblog_conn_id: an optional ``dblog`` connection holding ``config_path``.
    :param window_timeout: seconds to wait for the HW if it is not in the log yet (no sensor
        before this task); default: the config's ``dump.window_timeout_s``.

    Returns (XCom) the chunk's detail: ``rows`` kept, ``dropped`` as stale, ``selected``,
    ``missing`` keys, ``window_events``, ``lw``, ``hw``, ``hw_wait_s``, ``finish_s``, and ``request``,
    ``table``, ``table_done``, ``request_done``. If the window is no longer open (closed as
    failed, or abandoned by a newer run of the request) nothing moves: the task fails with
    DBLogWindowFailed and the next chunk task redoes the chunk. Any other failure leaves the
    window open, so a retry of this task can finish the chunk.
    """

    template_fields: Sequence[str] = ("config_path", "chunk")
    ui_color = "#dff5d8"

    def __init__(self, *, chunk: Any = None, chunk_task_id: str | None = None,
                 config_path: str | None = None, source: str | None = None,
                 dblog_conn_id: str | None = None, window_timeout: float | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if chunk is None and chunk_task_id is None:
            raise ValueError("give the chunk (e.g. chunk=chunk_task.output) or chunk_task_id")
        self.use_dblog_config(config_path, dblog_conn_id, source)
        self.chunk = chunk
        self.chunk_task_id = chunk_task_id
        self.window_timeout = window_timeout

    def execute(self, context: Context) -> dict:
        from ..engine.errors import WatermarkError

        value = chunk_xcom(self.chunk, self.chunk_task_id, context, "chunk to reconcile")
        task, window = chunk_from_xcom(value)
        hook = self.dblog_hook()
        source_name = hook.config.source(self.source).name
        runner = hook.runner(source_name)
        state = runner.state
        t0 = time.monotonic()
        try:
            if not state.window_is_open(window.id):
                raise DBLogWindowFailed(
                    f"window {window.id} of {window.table} is not open any more (failed, cancelled, or "
                    "abandoned by a newer run of the request): nothing to reconcile; the next chunk task "
                    "redoes the chunk")
            self.log.info("reconciling request %s, %s: window %s (%s rows selected)", task.request,
                          task.table, window.id, value.get("selected", "?") if isinstance(value, dict) else "?")
            try:
                with runner.holding(task.request):  # one runner per request
                    detail = runner.finish_chunk(task, window, timeout_s=self.window_timeout)
            except WatermarkError as e:  # the window failed (closed by the engine) or was closed meanwhile
                raise DBLogWindowFailed(str(e)) from e
            progress = state.progress(task.request, task.table)
        finally:
            runner.source.close()
        seconds = round(time.monotonic() - t0, 3)
        detail = dict(detail) | {"request": task.request, "table": task.table, "window": window.id,
                                 "reconcile_s": seconds}
        request_done = detail["request_done"]
        self.log.info(
            "%s chunk %s of request %s: %d rows selected, %d kept as snapshot at HW %s, %d dropped as "
            "stale (key changed in the window), %d window events, %d missing keys; table progress: "
            "%d chunks, %d rows%s", task.table, progress.get("chunks"), task.request, detail["selected"],
            detail["rows"], detail["hw"], detail["dropped"], detail["window_events"], detail["missing"],
            progress.get("chunks", 0), progress.get("rows", 0),
            "; the request is done" if request_done else (" (table done)" if task.last else ""))
        tags = {"source": source_name, "table": task.table}
        Stats.incr("dblog.chunk.completed", 1, tags=tags)
        Stats.incr("dblog.chunk.rows", int(detail["rows"]), tags=tags)
        Stats.incr("dblog.chunk.dropped", int(detail["dropped"]), tags=tags)
        Stats.incr("dblog.chunk.window_events", int(detail["window_events"]), tags=tags)
        Stats.timing("dblog.chunk.reconcile_seconds", timedelta(seconds=seconds), tags=tags)
        return detail
