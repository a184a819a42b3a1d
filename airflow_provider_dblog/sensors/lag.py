"""DBLogLagSensor: wait until a target has applied the log up to a position, or to within N seconds.

The reading is ``engine.lag.target_progress`` (its module says how the lag bound is
computed). By default the sensor defers to
:class:`~airflow_provider_dblog.triggers.lag.TargetLagTrigger`, which takes the same
reading in the triggerer (no worker slot while it waits); with ``deferrable=False`` it
pokes (``mode="reschedule"`` suits long waits).
"""
from __future__ import annotations

import os
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator
from airflow.sdk.exceptions import AirflowSensorTimeout

from ..engine.errors import ConfigError, UnknownTableError
from ..engine.lag import TargetProgress, target_progress
from ..engine.positions import Position
from ..exceptions import DBLogInvalidRequest
from ..hooks.dblog import DBLogHook, DBLogHookMixin
from ..triggers.lag import TargetLagTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context

# Airflow's deferral timeout is a backstop: the trigger reports its own timeout first
DEFERRAL_MARGIN_S = 300.0


class DBLogLagSensor(DBLogHookMixin, BaseSensorOperator):
    """Wait until a target has applied the change log up to ``position``, or until it is at
    most ``max_lag_seconds`` behind (set exactly one).

    * ``position``: an encoded ``Position`` (e.g. a tail task's XCom ``end`` checkpoint):
      satisfied when, for every watched table, every event below it is applied;
    * ``max_lag_seconds``: satisfied when the lag is at most that: an upper bound, measured
      against what the tail has captured, 0 when the target has everything up to the
      source's log head (see ``engine.lag``).

    Each look reads the target's apply checkpoints, Redis and the source's log head; it
    never writes. Returns (XCom) ``{"target": ..., "applied": {table: position}, "lag_s": ...}``.

    :param config_path: the dblog YAML config (templated). With ``deferrable=True`` the
        triggerer reads it too.
    :param target: the target name (templated); optional with one target.
    :param table: a table ``db.table``, or a list of them (templated); default: every table
        of the target's source.
    :param position: the position to wait for (templated).
    :param max_lag_seconds: the lag to wait for (templated).
    :param dblog_conn_id: an optional ``dblog`` connection holding ``config_path``.
    :param deferrable: wait in the triggerer (default) instead of a worker slot; the
        trigger looks every ``poke_interval`` seconds, up to ``timeout``.

    Example::

        DBLogLagSensor(task_id="caught_up", config_path="/opt/dblog/dblog.yaml",
                       position="{{ ti.xcom_pull(task_ids='tail')['end'] }}",
                       poke_interval=30, timeout=3600)
    """

    template_fields: Sequence[str] = ("config_path", "target", "table", "position", "max_lag_seconds")
    ui_color = "#d5f5e3"

    def __init__(self, *, config_path: str | None = None, target: str | None = None,
                 table: str | list[str] | None = None, position: str | None = None,
                 max_lag_seconds: float | str | None = None, dblog_conn_id: str | None = None,
                 deferrable: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if (position is None) == (max_lag_seconds is None):
            raise DBLogInvalidRequest("DBLogLagSensor: set exactly one of position and max_lag_seconds")
        self.config_path = config_path
        self.dblog_conn_id = dblog_conn_id
        self.target = target
        self.table = table
        self.position, self.max_lag_seconds = position, max_lag_seconds  # exactly one is set
        self.deferrable = deferrable

    def _want(self) -> tuple[Position | None, float | None]:
        if self.position is not None and str(self.position).strip() not in ("", "None"):
            try:
                return Position.decode(str(self.position).strip()), None
            except ValueError:
                raise DBLogInvalidRequest(
                    f"position {self.position!r} is not an encoded position such as "
                    "'00000001-0000000000000abc-00000000' (a tail task's 'end')") from None
        if self.max_lag_seconds is not None and str(self.max_lag_seconds).strip() not in ("", "None"):
            try:
                lag = float(self.max_lag_seconds)
            except (TypeError, ValueError):
                raise DBLogInvalidRequest(f"max_lag_seconds must be a number, not {self.max_lag_seconds!r}") from None
            if lag < 0:
                raise DBLogInvalidRequest(f"max_lag_seconds must not be negative, not {lag}")
            return None, lag
        raise DBLogInvalidRequest("DBLogLagSensor: position (or max_lag_seconds) rendered empty")

    def _tables(self) -> list[str] | None:
        t = self.table
        if t is None or (isinstance(t, str) and t.strip() in ("", "None")):
            return None
        names = [x.strip() for x in t.split(",")] if isinstance(t, str) else [str(x).strip() for x in t]
        return [n for n in names if n] or None

    def _read(self, hook: DBLogHook, with_lag: bool) -> TargetProgress:
        target = None if self.target in (None, "", "None") else str(self.target)
        try:
            return target_progress(hook.config, target, self._tables(), with_lag)
        except (ConfigError, UnknownTableError) as e:
            raise DBLogInvalidRequest(str(e)) from e

    def _done(self, progress: TargetProgress, want_pos: Position | None, max_lag: float | None) -> bool:
        if progress.missing:
            self.log.info("not yet applied to %s: %s", progress.target, progress.missing)
        if want_pos is not None:
            behind = progress.behind(want_pos)
            self.log.info("waiting for %s at %s: %s", progress.target, want_pos,
                          f"behind: {behind}" if behind else "every table is there")
        elif not progress.missing:
            lag = progress.lag_s
            self.log.info("target %s: lag %s (wanted <= %.1f s)", progress.target,
                          "unknown (no checkpoint sample at or below it yet)" if lag is None else f"<= {lag:.1f} s",
                          max_lag)
        return progress.reached(want_pos, max_lag)

    def _xcom(self, progress: TargetProgress, want_pos: Position | None) -> dict:
        out = progress.to_xcom()
        if want_pos is not None:
            out["position"] = want_pos.encode()
        return out

    def poke(self, context: Context):
        from airflow.sdk import PokeReturnValue

        want_pos, max_lag = self._want()
        progress = self._read(self.dblog_hook(), want_pos is None)
        done = self._done(progress, want_pos, max_lag)
        return PokeReturnValue(is_done=done, xcom_value=self._xcom(progress, want_pos))

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        want_pos, max_lag = self._want()
        hook = self.dblog_hook()
        progress = self._read(hook, want_pos is None)  # validates the target and tables too
        if self._done(progress, want_pos, max_lag):
            return self._xcom(progress, want_pos)
        timeout = float(self.timeout)
        self.log.info("deferring: waiting up to %.0fs, a look every %.0fs", timeout, self.poke_interval)
        self.defer(trigger=TargetLagTrigger(
            config_path=os.path.abspath(hook.resolve_config_path()), target=progress.target,
            tables=list(progress.applied), position=want_pos.encode() if want_pos else None,
            max_lag_seconds=max_lag, poll_interval=float(self.poke_interval), timeout=timeout,
            started_at=time.time()),
            method_name="execute_complete", timeout=timedelta(seconds=timeout + DEFERRAL_MARGIN_S))

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> dict:
        """Back from the trigger: the target's progress, or a timeout / an error."""
        event = dict(event or {})
        status = event.pop("status", None)
        if status == "success":
            self.log.info("target %s caught up (waited %ss): %s", event.get("target"),
                          event.pop("waited_s", None), event.get("applied"))
            if self.position not in (None, "", "None"):
                event["position"] = str(self.position).strip()
            return event
        message = event.get("message") or f"the lag trigger ended without a result: {event!r}"
        if status == "timeout":
            raise AirflowSensorTimeout(message)
        raise DBLogInvalidRequest(message)
