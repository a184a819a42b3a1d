"""Dump requests: create one (validated), run it on Spark, pause / resume / cancel it.

A dump is a request in Redis (``engine.state``) that the engine runs chunk after
chunk, each chunk in its own LW/HW watermark window, and that resumes from its
last completed chunk. Typical DAG::

    create = DBLogCreateDumpOperator(task_id="create_dump", config_path=CONFIG,
                                     scope="table", table="shop.orders")
    dump = DBLogDumpOperator(task_id="dump", config_path=CONFIG, request_id=create.output)
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowSkipException
from airflow.sdk.observability.stats import Stats

from ..engine.errors import ConfigError, DumpCancelledError, InvalidKeyError, NoPrimaryKeyError, UnknownTableError
from ..engine.requests import (ACTIONS, DumpSpec, UnknownRequestError, blank, control_request,
                               parse_int, parse_spec, runnable_request)
from ..engine.jobs import SparkJobError
from ..exceptions import DBLogInvalidRequest
from ..hooks.dblog import DBLogHook, DBLogHookMixin
from ..params import spec_from_params
from .spark import DBLogSparkSubmitOperator

if TYPE_CHECKING:
    from airflow.sdk import Context

# what makes a request invalid: the user's input, not the infrastructure (no retry)
INVALID_REQUEST_ERRORS = (ConfigError, InvalidKeyError, UnknownTableError, NoPrimaryKeyError)
PROGRESS_FIELDS = ("chunks", "rows", "dropped", "missing_count")


def int_argument(value: Any, name: str) -> int | None:
    """An operator's integer argument, or the text a template rendered it to; None when
    blank (``engine.requests.parse_int``). Not an integer: the request is invalid."""
    try:
        return parse_int(value, name)
    except ConfigError as e:
        raise DBLogInvalidRequest(str(e)) from None


class DBLogCreateDumpOperator(DBLogHookMixin, BaseOperator):
    """Validate a dump request and create it in Redis; returns the request id (XCom).

    Every field is checked against the config and the table's primary key before anything
    is written to the source or to Redis. A bad request (unknown table, a table without a
    primary key, a key of the wrong arity or type, a bad WHERE condition, scope, chunk size
    or parallelism) fails the task at once with
    :class:`~airflow_provider_dblog.exceptions.DBLogInvalidRequest` (no retry), saying what
    is wrong.

    With ``resume_request`` set (e.g. from a DAG param), no request is created: that request
    is checked (it exists, is not cancelled, dumps this table), its pause flag is cleared,
    and its id returned, so the following ``DBLogDumpOperator`` continues it from its last
    completed chunk.

    :param config_path: the dblog YAML config (templated); default: the ``dblog``
        connection's ``config_path``, else ``$DBLOG_CONFIG``.
    :param source: the source name (templated); optional when the config has one source.
    :param scope: ``all`` (every configured table), ``table`` (one table), ``keys`` (a list
        of primary keys of one table) or ``where`` (the rows of one table matching a plain
        condition, resolved to their keys now) (templated).
    :param table: the table, as ``db.table``, for the scopes but ``all`` (templated).
    :param keys: for scope ``keys``: a list of keys, ``[1, 2]`` or ``[[1, "a"], [2, "b"]]``
        for a composite key, that list as JSON text, or one key per line with
        comma-separated values (templated).
    :param where: for scope ``where``: the condition, e.g. ``status = 'new'`` (templated).
    :param chunk_size: rows per chunk (default: the config's ``dump.chunk_size``) (templated).
    :param parallelism: JDBC read partitions per chunk (default: the config's) (templated).
    :param resume_request: a request id to resume instead of creating one; empty: create
        (templated).
    :param from_params: take scope, table, keys, where, chunk_size and parallelism from the
        DAG run's params (the repair form, ``airflow_provider_dblog.params.repair_params``)
        instead of the arguments.
    :param dblog_conn_id: an optional ``dblog`` connection holding ``config_path``.

    Example::

        create = DBLogCreateDumpOperator(
            task_id="create_dump", config_path="/opt/dblog/dblog.yaml",
            scope="keys", table="shop.orders", keys="{{ params.keys }}")
    """

    template_fields: Sequence[str] = ("config_path", "source", "scope", "table", "keys", "where",
                                      "chunk_size", "parallelism", "resume_request")
    template_fields_renderers = {"keys": "json"}
    ui_color = "#fde9c8"

    def __init__(self, *, config_path: str | None = None, source: str | None = None,
                 scope: str = "table", table: str | None = None, keys: list | str | None = None,
                 where: str | None = None, chunk_size: int | str | None = None,
                 parallelism: int | str | None = None, resume_request: str | None = None,
                 from_params: bool = False, dblog_conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.use_dblog_config(config_path, dblog_conn_id, source)
        self.scope = scope
        self.table = table
        self.keys = keys
        self.where = where
        self.chunk_size = chunk_size
        self.parallelism = parallelism
        self.resume_request = resume_request
        self.from_params = from_params

    def build_spec(self, context: Context | None = None) -> DumpSpec:
        """The request from the form's params or the operator's arguments, with the rules of
        every front end (``engine.requests.parse_spec``)."""
        try:
            if self.from_params:
                return spec_from_params(dict((context or {}).get("params") or {}))
            return parse_spec(self.scope, self.table, self.keys, self.where, self.chunk_size, self.parallelism)
        except INVALID_REQUEST_ERRORS as e:
            raise DBLogInvalidRequest(str(e)) from None

    def execute(self, context: Context) -> str:
        hook = self.dblog_hook()
        source = None if blank(self.source) else self.source
        if not blank(self.resume_request):
            return self.resume(hook, source, str(self.resume_request).strip())
        spec = self.build_spec(context)
        try:
            runner = hook.runner(source)
        except ConfigError as e:  # e.g. an unknown source name
            raise DBLogInvalidRequest(str(e)) from e
        try:
            rid = runner.submit(spec)  # validate_spec first: nothing written when invalid
        except INVALID_REQUEST_ERRORS as e:
            raise DBLogInvalidRequest(str(e)) from e
        finally:
            runner.source.close()
        stored = runner.state.request(rid)["spec"]
        self.log.info("dump request %s created on source %s: %s %s (chunk size %s, parallelism %s%s)",
                      rid, runner.state.source, stored["scope"], ", ".join(stored["tables"]),
                      stored["chunk_size"], stored["parallelism"],
                      f", {len(stored['keys'])} keys" if stored["scope"] in ("keys", "where") else "")
        return rid

    def resume(self, hook: DBLogHook, source: str | None, rid: str) -> str:
        try:
            state = hook.state(source)
        except ConfigError as e:
            raise DBLogInvalidRequest(str(e)) from e
        try:
            req = runnable_request(state, rid)
        except UnknownRequestError as e:
            raise DBLogInvalidRequest(f"{e}: leave the request id empty to start a new dump") from None
        except DumpCancelledError as e:
            raise DBLogInvalidRequest(str(e)) from None
        table = None if self.from_params or blank(self.table) else str(self.table).strip()
        if table and table not in req["spec"]["tables"]:
            raise DBLogInvalidRequest(f"dump request {rid} dumps {', '.join(req['spec']['tables'])}, "
                                      f"not {table}")
        if state.flag(rid, "pause"):
            control_request(state, rid, "resume")
            self.log.info("dump request %s: pause flag cleared", rid)
        self.log.info("resuming dump request %s (%s, %s) from its last completed chunk", rid,
                      req["status"], ", ".join(req["spec"]["tables"]))
        return rid


class DBLogDumpOperator(DBLogSparkSubmitOperator):
    """Run (or resume) a dump request on Spark: ``spark_jobs/dump_job.py`` via ``spark-submit``.

    Each chunk is written between a low and a high watermark in the source and
    reconciled with the log events of its window; a run resumes from the request's
    last completed chunk. The log tail must be running (a ``DBLogTailOperator`` or the
    ``dblog tail`` command), or each window times out.

    Returns the dump's summary (XCom ``return_value``: per-table progress, ``status``,
    ``chunks``, ``rows``, ``dropped``), and pushes XCom ``progress``: the request's
    totals ``chunks``, ``rows``, ``dropped`` (chunk rows dropped as stale), ``windows``
    (one LW/HW window per completed chunk), ``missing`` (requested keys the source does
    not have) and ``status``. Emits the metrics ``dblog.dump.rows``, ``dblog.dump.chunks``,
    ``dblog.dump.dropped`` (counters of this run), ``dblog.dump.seconds`` (this run),
    ``dblog.dump.request_chunks`` and ``dblog.dump.request_rows`` (the request's totals)
    (gauges), tagged with the source.

    * status ``paused`` (its pause flag, or ``max_chunks`` reached): the task is skipped (a
      paused dump is not a finished one), its summary still in XCom; the next run continues
      from the last completed chunk (clear the pause flag first:
      ``DBLogDumpControlOperator(action="resume")`` or ``DBLogCreateDumpOperator(resume_request=...)``);
    * ``cancelled`` (before or during the run): the task is skipped, not failed;
    * ``done``: success;
    * an unknown request id: :class:`~airflow_provider_dblog.exceptions.DBLogInvalidRequest`.

    :param request_id: the dump request (templated), typically ``create_task.output``.
    :param config_path: the dblog YAML config (templated).
    :param source: the source name (templated); optional with one source.
    :param max_chunks: stop (status ``paused``) after this many chunks (templated).
    :param conn_id: the Spark connection (default ``spark_default``).
    :param kwargs: :class:`DBLogSparkSubmitOperator` / ``SparkSubmitOperator`` arguments.

    Example::

        DBLogDumpOperator(task_id="dump", config_path="/opt/dblog/dblog.yaml",
                          request_id="{{ ti.xcom_pull(task_ids='create_dump') }}")
    """

    template_fields: Sequence[str] = (*DBLogSparkSubmitOperator.template_fields,
                                      "request_id", "source", "max_chunks")
    ui_color = "#f9d49b"

    def __init__(self, *, request_id: str, config_path: str | None = None, source: str | None = None,
                 max_chunks: int | str | None = None, **kwargs: Any) -> None:
        super().__init__(job="dump_job", config_path=config_path, **kwargs)
        self.request_id = request_id
        self.source = source
        self.max_chunks = max_chunks
        self._before: dict[str, int] = {}
        self._started = 0.0

    def _source_name(self) -> str | None:
        return None if blank(self.source) else str(self.source)

    def _state(self, hook: DBLogHook):
        try:
            return hook.state(self._source_name())
        except ConfigError as e:
            raise DBLogInvalidRequest(str(e)) from e

    def job_arguments(self, hook: DBLogHook, context: Context) -> list[str]:
        rid = str(self.request_id or "").strip()
        if blank(rid):
            raise DBLogInvalidRequest("request_id is empty: pass the id DBLogCreateDumpOperator returned")
        max_chunks = int_argument(self.max_chunks, "max_chunks")
        if max_chunks is not None and max_chunks < 1:
            raise DBLogInvalidRequest(f"max_chunks must be at least 1, not {max_chunks}")
        state = self._state(hook)
        try:
            req = runnable_request(state, rid)
        except UnknownRequestError as e:
            raise DBLogInvalidRequest(str(e)) from None
        except DumpCancelledError as e:
            raise AirflowSkipException(f"{e}: nothing to run") from None
        if state.flag(rid, "pause"):
            self.log.info("dump request %s has its pause flag set: the run stops before its next chunk "
                          "(resume it with DBLogDumpControlOperator(action='resume'))", rid)
        self._before = self._totals(state, rid, req["spec"]["tables"])
        self._started = time.monotonic()
        args = ["--source", state.source, "--request", rid]
        if max_chunks is not None:
            args += ["--max-chunks", str(max_chunks)]
        return args

    @staticmethod
    def _totals(state, rid: str, tables: list[str]) -> dict[str, int]:
        progress = [state.progress(rid, t) for t in tables]
        return {f: sum(int(p.get(f, 0) or 0) for p in progress) for f in PROGRESS_FIELDS}

    def handle_failure(self, error: SparkJobError, hook: DBLogHook, context: Context) -> None:
        rid = str(self.request_id).strip()
        req = self._state(hook).request(rid) or {}
        if req.get("status") == "cancelled":
            raise AirflowSkipException(f"dump request {rid} was cancelled during the run")

    def handle_result(self, result: dict, hook: DBLogHook, context: Context) -> dict:
        rid = str(self.request_id).strip()
        state = self._state(hook)
        tables = list(result.get("tables") or {})
        after = self._totals(state, rid, tables)
        status = result.get("status") or (state.request(rid) or {}).get("status", "")
        progress = {"request": rid, "source": state.source, "status": status,
                    "chunks": after["chunks"], "rows": after["rows"], "dropped": after["dropped"],
                    "windows": after["chunks"], "missing": after["missing_count"],
                    "tables": {t: {f: p.get(f) for f in ("chunks", "rows", "dropped", "missing_count", "done")
                                   if f in p} for t, p in (result.get("tables") or {}).items()}}
        context["ti"].xcom_push(key="progress", value=progress)
        run = {f: max(0, after[f] - self._before.get(f, 0)) for f in PROGRESS_FIELDS}
        tags = {"source": state.source}
        Stats.incr("dblog.dump.rows", run["rows"], tags=tags)
        Stats.incr("dblog.dump.chunks", run["chunks"], tags=tags)
        Stats.incr("dblog.dump.dropped", run["dropped"], tags=tags)
        Stats.gauge("dblog.dump.seconds", round(time.monotonic() - self._started, 3), tags=tags)
        Stats.gauge("dblog.dump.request_chunks", progress["chunks"], tags=tags)
        Stats.gauge("dblog.dump.request_rows", progress["rows"], tags=tags)
        from ..engine.dump import missing_note  # pyarrow: not at DAG parse time
        missing = [k for p in (result.get("tables") or {}).values() for k in p.get("missing") or []]
        self.log.info("dump %s %s: this run %d chunks, %d rows, %d dropped as stale; request total "
                      "%d chunks/windows, %d rows, %d dropped as stale, %d missing keys%s",
                      rid, status, run["chunks"], run["rows"], run["dropped"], progress["chunks"],
                      progress["rows"], progress["dropped"], progress["missing"], missing_note(missing))
        if status == "cancelled":
            raise AirflowSkipException(f"dump request {rid} is cancelled")
        if status == "paused":
            # not done: the run must not look like a finished dump (Success), nor like a failure;
            # its summary stays in XCom for whoever resumes it
            context["ti"].xcom_push(key="return_value", value=result)
            raise AirflowSkipException(
                f"dump request {rid} is paused after {progress['chunks']} chunk(s), {progress['rows']} rows: "
                "resume it (the control DAG's 'resume', then run the dump again with this request id); "
                "it continues from its last completed chunk")
        return result


class DBLogDumpControlOperator(DBLogHookMixin, BaseOperator):
    """Pause, resume or cancel a dump request through its flags in Redis.

    * ``pause``: the running dump stops at its next chunk boundary (status ``paused``);
    * ``resume``: clears the pause flag; the next ``DBLogDumpOperator`` run of the request
      continues from its last completed chunk;
    * ``cancel``: the running dump stops at its next chunk boundary (status ``cancelled``),
      and later runs of the request are skipped.

    :param request_id: the dump request (templated).
    :param action: ``pause``, ``resume`` or ``cancel`` (templated).
    :param config_path: the dblog YAML config (templated).
    :param source: the source name (templated); optional with one source.
    :param dblog_conn_id: an optional ``dblog`` connection holding ``config_path``.

    Returns ``{"request", "action", "status", "pause", "cancel"}``.

    Example::

        DBLogDumpControlOperator(task_id="pause_dump", config_path="/opt/dblog/dblog.yaml",
                                 request_id="{{ params.request_id }}", action="pause")
    """

    template_fields: Sequence[str] = ("config_path", "request_id", "action", "source")
    ui_color = "#f5c6a5"

    def __init__(self, *, request_id: str, action: str, config_path: str | None = None,
                 source: str | None = None, dblog_conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if isinstance(action, str) and "{{" not in action and action.strip() not in ACTIONS:
            raise DBLogInvalidRequest(f"action must be one of {ACTIONS}, not {action!r}")
        self.use_dblog_config(config_path, dblog_conn_id, source)
        self.request_id = request_id
        self.action = action

    def execute(self, context: Context) -> dict:
        action = str(self.action or "").strip()
        if action not in ACTIONS:
            raise DBLogInvalidRequest(f"action must be one of {ACTIONS}, not {self.action!r}")
        rid = str(self.request_id or "").strip()
        hook = self.dblog_hook()
        try:
            state = hook.state(None if blank(self.source) else self.source)
        except ConfigError as e:
            raise DBLogInvalidRequest(str(e)) from e
        try:
            out = control_request(state, rid, action)
        except ConfigError as e:  # unknown, or finished: nothing to pause or cancel
            raise DBLogInvalidRequest(str(e)) from None
        self.log.info("dump request %s (%s): %s set; a running dump %s", rid, out["status"],
                      {"pause": "pause flag", "resume": "pause flag cleared", "cancel": "cancel flag"}[action],
                      {"pause": "stops at its next chunk boundary",
                       "resume": "is not started by this: run the dump task again",
                       "cancel": "stops at its next chunk boundary, as cancelled"}[action])
        return out
