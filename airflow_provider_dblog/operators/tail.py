"""DBLogTailOperator: tail the source's change log for a bounded time, inside the task."""
from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowSkipException
from airflow.sdk.observability.stats import Stats

from ..engine.errors import ConfigError
from ..engine.requests import blank
from ..engine.tail import Tail
from ..exceptions import DBLogInvalidRequest
from ..hooks.dblog import DBLogHookMixin
from .dump import int_argument

if TYPE_CHECKING:
    from airflow.sdk import Context


class DBLogTailOperator(DBLogHookMixin, BaseOperator):
    """Read the source's change log into the event log for at most ``max_seconds`` or
    ``max_events``, then flush, checkpoint and finish.

    Runs the engine's tail (``engine.tail.Tail``) in the task: each flush writes the
    batch's events to Parquet and only then moves the checkpoint in Redis, together with
    the positions of the watermarks it saw, so a dump's windows close while it runs. The
    next run continues from the checkpoint; a run that was killed re-reads from it, and
    no event is stored twice. Schedule it back to back (e.g. ``schedule=timedelta(minutes=1)``
    with ``max_seconds=55`` and ``max_active_runs=1``) for a continuous tail.

    Before reading, the source's CDC set-up is checked (binlog format, row image,
    privileges, primary keys; ``SourceSetupError`` lists what to fix). One tail per
    source: the engine holds a leader lease in Redis with a fencing token. If another tail
    holds it, this task is skipped without touching anything.

    A SIGTERM (task stopped, marked failed or success from the UI, worker shutting down)
    or ``on_kill`` ends the run cleanly: the transaction in hand is finished, flushed and
    checkpointed.

    Returns (XCom) ``events``, ``flushes``, ``watermarks``, ``lag_s`` (now minus the source
    commit time of the last event flushed), ``start`` / ``end`` (checkpoint positions, as
    encoded ``Position`` strings: ``end`` can feed ``DBLogLagSensor(position=...)``),
    ``seconds``, ``events_per_s``, ``per_table`` and ``dump_requests``: the full dumps it
    requested of tables new to the capture (added to the config: captured from the
    checkpoint on; the dump fetches the rows they already hold; the task log names each,
    to run from the table's dump DAG with its request id). Metrics: ``dblog.tail.events``
    (counter), ``dblog.tail.lag_seconds`` and ``dblog.tail.events_per_second`` (gauges),
    tagged with the source.

    :param config_path: the dblog YAML config (templated); default: the ``dblog``
        connection's ``config_path``, else ``$DBLOG_CONFIG``.
    :param source: the source name (templated); optional when the config has one source.
    :param max_seconds: stop after this many seconds (templated; default 60).
    :param max_events: stop after this many row events (templated; default: no limit).
    :param dblog_conn_id: an optional ``dblog`` connection holding ``config_path``.

    Example::

        DBLogTailOperator(task_id="tail", config_path="/opt/dblog/dblog.yaml", max_seconds=55)
    """

    template_fields: Sequence[str] = ("config_path", "source", "max_seconds", "max_events")
    ui_color = "#c8e6f5"

    def __init__(self, *, config_path: str | None = None, source: str | None = None,
                 max_seconds: float | str | None = 60, max_events: int | str | None = None,
                 dblog_conn_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.use_dblog_config(config_path, dblog_conn_id, source)
        self.max_seconds = max_seconds
        self.max_events = max_events
        self._stopping = False  # set by on_kill (SIGTERM); a plain flag: operators are deep-copied

    def _limits(self) -> tuple[float | None, int | None]:
        seconds = None
        if not blank(self.max_seconds):
            try:
                seconds = float(self.max_seconds)
            except (TypeError, ValueError):
                raise DBLogInvalidRequest(f"max_seconds must be a number, not {self.max_seconds!r}") from None
            if seconds <= 0:
                raise DBLogInvalidRequest(f"max_seconds must be positive, not {seconds}")
        events = int_argument(self.max_events, "max_events")
        if events is not None and events < 1:
            raise DBLogInvalidRequest(f"max_events must be at least 1, not {events}")
        if seconds is None and events is None:
            raise DBLogInvalidRequest("a tail task must be bounded: set max_seconds and/or max_events")
        return seconds, events

    def lease_owner(self, context: Context) -> str:
        """Who holds the lease while this task runs (shown to a tail that finds it taken)."""
        ti = context.get("ti")
        who = f"{ti.dag_id}.{ti.task_id}" if ti is not None else self.task_id
        return f"airflow:{who}@{socket.gethostname()}:{os.getpid()}"

    def execute(self, context: Context) -> dict:
        max_seconds, max_events = self._limits()
        hook = self.dblog_hook()
        try:
            name = hook.config.source(None if blank(self.source) else str(self.source)).name
        except ConfigError as e:
            raise DBLogInvalidRequest(str(e)) from e
        state = hook.state(name)
        self._stopping = False
        source = hook.source(name)
        try:
            source.check_or_raise(captured=hook.store(name).captured_tables(source.tables))
            tail = Tail(source, state, hook.store(name), hook.config.tail, owner=self.lease_owner(context),
                        dump=hook.config.dump)
            self.log.info("tailing source %s for at most %s s / %s events", name, max_seconds, max_events)
            stats = tail.run(max_seconds=max_seconds, max_events=max_events, should_stop=lambda: self._stopping)
        finally:
            source.close()
        if stats.skipped:
            holder = (stats.lease_holder or "another tail").split("|")[0]
            expires = ("" if stats.lease_expires_in_s is None
                       else f" (its lease expires in {stats.lease_expires_in_s:.0f}s unless renewed)")
            raise AirflowSkipException(f"the tail lease of source {name} is held by {holder}{expires}: "
                                       "another tail is running; nothing done")
        rate = round(stats.events / stats.seconds, 1) if stats.seconds > 0 else 0.0
        out = {"source": name, "events": stats.events, "flushes": stats.flushes,
               "watermarks": stats.watermarks, "lag_s": round(stats.lag_s, 3), "start": stats.start,
               "end": stats.end, "seconds": round(stats.seconds, 3), "events_per_s": rate,
               "per_table": dict(stats.per_table), "stopped": self._stopping,
               "dump_requests": stats.dump_requests}
        for new in stats.dump_requests:
            self.log.warning("%s is new to the capture: its changes are captured from here, and dump request %s "
                             "fetches the rows it holds: trigger the table's dump DAG with that request id",
                             new["table"], new["request_id"])
        tags = {"source": name}
        Stats.incr("dblog.tail.events", stats.events, tags=tags)
        Stats.gauge("dblog.tail.lag_seconds", out["lag_s"], tags=tags)
        Stats.gauge("dblog.tail.events_per_second", rate, tags=tags)
        self.log.info("tail of %s: %d events, %d watermarks in %d flushes over %.1f s (%.1f events/s), "
                      "lag %.3f s, checkpoint %s -> %s%s", name, stats.events, stats.watermarks,
                      stats.flushes, stats.seconds, rate, stats.lag_s, stats.start, stats.end,
                      " (stopped by a signal)" if out["stopped"] else "")
        return out

    def on_kill(self) -> None:
        """Stop at the next transaction boundary: flush, checkpoint, return."""
        self._stopping = True
