"""Dump requests: create one (validated), run it on Spark, pause / resume / cancel it.

A dump is a request in Redis (``engine.state``) that the engine runs chunk after
chunk, each chunk in its own LW/HW watermark window, and that resumes from its
last completed chunk. Typical DAG::

    create = DBLogCreateDumpOperator(task_id="create_dump", config_path=CONFIG,
                                     scope="table", table="shop.orders")
    dump = DBLogDumpOperator(task_id="dump", config_path=CONFIG, request_id=create.output)
"""
from __future__ import annotations

import ast
import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowSkipException
from airflow.sdk.observability.stats import Stats

from ..engine.dump import SCOPES, DumpSpec
from ..engine.errors import ConfigError, InvalidKeyError, NoPrimaryKeyError, UnknownTableError
from ..engine.jobs import SparkJobError
from ..exceptions import DBLogInvalidRequest
from ..hooks.dblog import DBLogHook
from ..params import parse_keys_text, spec_from_params
from .spark import DBLogSparkSubmitOperator

if TYPE_CHECKING:
    from airflow.sdk import Context

# what makes a request invalid: the user's input, not the infrastructure (no retry)
INVALID_REQUEST_ERRORS = (ConfigError, InvalidKeyError, UnknownTableError, NoPrimaryKeyError)
PROGRESS_FIELDS = ("chunks", "rows", "dropped", "missing_count")
ACTIONS = ("pause", "resume", "cancel")


def _blank(value: Any) -> bool:
    """A value a template left empty (``{{ params.x }}`` of a None renders "None")."""
    return value is None or (isinstance(value, str) and value.strip() in ("", "None"))


def _as_int(value: Any, name: str) -> int | None:
    if _blank(value):
        return None
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise DBLogInvalidRequest(f"{name} must be an integer, not {value!r}")


def _as_keys(value: Any) -> list:
    """A key list: a list, its JSON (or Python) text as a template renders it, or one key
    per line with comma-separated values (the repair form's text box)."""
    if _blank(value):
        return []
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except json.JSONDecodeError as e:
                try:  # a list param rendered by Jinja as Python text: [[1, 'a']]
                    value = ast.literal_eval(text)
                except (ValueError, SyntaxError, MemoryError, RecursionError):
                    raise DBLogInvalidRequest(
                        f'keys must be a JSON list such as [1, 2] or [[1, "a"], [2, "b"]] for composite '
                        f"keys: {e}") from None
        else:
            try:
                value = parse_keys_text(text)
            except ValueError as e:
                raise DBLogInvalidRequest(str(e)) from None
    if not isinstance(value, (list, tuple)):
        raise DBLogInvalidRequest(f"keys must be a list of primary keys, not {type(value).__name__}")
    return list(value)


class DBLogCreateDumpOperator(BaseOperator):
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
        self.config_path = config_path
        self.source = source
        self.scope = scope
        self.table = table
        self.keys = keys
        self.where = where
        self.chunk_size = chunk_size
        self.parallelism = parallelism
        self.resume_request = resume_request
        self.from_params = from_params
        self.dblog_conn_id = dblog_conn_id

    def build_spec(self, context: Context | None = None) -> DumpSpec:
        if self.from_params:
            params = dict((context or {}).get("params") or {})
            try:
                spec = spec_from_params(params)
            except ValueError as e:
                raise DBLogInvalidRequest(str(e)) from None
            return DumpSpec(spec.scope, spec.tables, _as_keys(spec.keys) if spec.scope == "keys" else [],
                            _as_int(spec.chunk_size, "chunk_size"), _as_int(spec.parallelism, "parallelism"),
                            spec.where)
        scope = str(self.scope or "").strip()
        if scope not in SCOPES:
            raise DBLogInvalidRequest(f"scope must be one of {SCOPES}, not {self.scope!r}")
        table = None if _blank(self.table) else str(self.table).strip()
        keys = _as_keys(self.keys)
        where = None if _blank(self.where) else str(self.where).strip()
        if scope == "all" and (table or keys or where):
            raise DBLogInvalidRequest("scope 'all' dumps every configured table: leave table, keys and "
                                      "where empty")
        if scope != "all" and not table:
            raise DBLogInvalidRequest(f"scope {scope!r} needs a table (as db.table)")
        if scope != "keys" and keys:
            raise DBLogInvalidRequest(f"keys were given but the scope is {scope!r}: keys are for scope 'keys'")
        if scope != "where" and where:
            raise DBLogInvalidRequest(f"a WHERE condition was given but the scope is {scope!r}")
        if scope == "where" and not where:
            raise DBLogInvalidRequest("scope 'where' needs a condition, e.g. status = 'new'")
        return DumpSpec(scope, [table] if table else [], keys,
                        _as_int(self.chunk_size, "chunk_size"), _as_int(self.parallelism, "parallelism"),
                        where)

    def execute(self, context: Context) -> str:
        hook = DBLogHook(config_path=self.config_path, dblog_conn_id=self.dblog_conn_id)
        source = None if _blank(self.source) else self.source
        if not _blank(self.resume_request):
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
        req = state.request(rid)
        if req is None:
            raise DBLogInvalidRequest(f"unknown dump request {rid!r} on source {state.source!r}: "
                                      "leave the request id empty to start a new dump")
        if req["status"] == "cancelled" or state.flag(rid, "cancel"):
            raise DBLogInvalidRequest(f"dump request {rid} is cancelled: start a new dump instead")
        table = None if self.from_params or _blank(self.table) else str(self.table).strip()
        if table and table not in req["spec"]["tables"]:
            raise DBLogInvalidRequest(f"dump request {rid} dumps {', '.join(req['spec']['tables'])}, "
                                      f"not {table}")
        if state.flag(rid, "pause"):
            state.set_flag(rid, "pause", False)
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

    * status ``paused`` (its pause flag, or ``max_chunks`` reached): logged, success; the
      next run continues from the last completed chunk (clear the pause flag first:
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
        return None if _blank(self.source) else str(self.source)

    def _state(self, hook: DBLogHook):
        try:
            return hook.state(self._source_name())
        except ConfigError as e:
            raise DBLogInvalidRequest(str(e)) from e

    def job_arguments(self, hook: DBLogHook, context: Context) -> list[str]:
        rid = str(self.request_id or "").strip()
        if _blank(rid):
            raise DBLogInvalidRequest("request_id is empty: pass the id DBLogCreateDumpOperator returned")
        max_chunks = _as_int(self.max_chunks, "max_chunks")
        if max_chunks is not None and max_chunks < 1:
            raise DBLogInvalidRequest(f"max_chunks must be at least 1, not {max_chunks}")
        state = self._state(hook)
        req = state.request(rid)
        if req is None:
            raise DBLogInvalidRequest(f"unknown dump request {rid!r} on source {state.source!r}")
        if req["status"] == "cancelled" or state.flag(rid, "cancel"):
            raise AirflowSkipException(f"dump request {rid} is cancelled: nothing to run")
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
        self.log.info("dump %s %s: this run %d chunks, %d rows, %d dropped as stale; request total "
                      "%d chunks/windows, %d rows, %d dropped as stale, %d missing keys",
                      rid, status, run["chunks"], run["rows"], run["dropped"], progress["chunks"],
                      progress["rows"], progress["dropped"], progress["missing"])
        if status == "cancelled":
            raise AirflowSkipException(f"dump request {rid} is cancelled")
        if status == "paused":
            self.log.info("dump %s is paused after its last completed chunk; a later run resumes it", rid)
        return result


class DBLogDumpControlOperator(BaseOperator):
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
        self.request_id = request_id
        self.action = action
        self.config_path = config_path
        self.source = source
        self.dblog_conn_id = dblog_conn_id

    def execute(self, context: Context) -> dict:
        action = str(self.action or "").strip()
        if action not in ACTIONS:
            raise DBLogInvalidRequest(f"action must be one of {ACTIONS}, not {self.action!r}")
        rid = str(self.request_id or "").strip()
        hook = DBLogHook(config_path=self.config_path, dblog_conn_id=self.dblog_conn_id)
        try:
            state = hook.state(None if _blank(self.source) else self.source)
        except ConfigError as e:
            raise DBLogInvalidRequest(str(e)) from e
        req = state.request(rid) if rid else None
        if req is None:
            raise DBLogInvalidRequest(f"unknown dump request {rid!r} on source {state.source!r}")
        if action == "resume":
            state.set_flag(rid, "pause", False)
        else:
            state.set_flag(rid, action, True)
        out = {"request": rid, "action": action, "status": req["status"],
               "pause": state.flag(rid, "pause"), "cancel": state.flag(rid, "cancel")}
        if action == "resume" and out["cancel"]:
            self.log.warning("dump request %s is cancelled: resuming it does nothing", rid)
        self.log.info("dump request %s (%s): %s set; a running dump %s", rid, req["status"],
                      {"pause": "pause flag", "resume": "pause flag cleared", "cancel": "cancel flag"}[action],
                      {"pause": "stops at its next chunk boundary",
                       "resume": "is not started by this: run the dump task again",
                       "cancel": "stops at its next chunk boundary, as cancelled"}[action])
        return out
