"""DBLogHighWatermarkSensor: waits until the log tail has made a chunk's window durable.

After the chunk operator wrote a window's HW, the chunk can be reconciled once the
tail has recorded the HW's position (with the checkpoint that covers it). By default
the sensor defers to :class:`~airflow_provider_dblog.triggers.watermark.HighWatermarkTrigger`
(no worker slot while it waits); with ``deferrable=False`` it pokes Redis with the same
checks. A failed or timed-out window is closed as failed in Redis, so it no longer holds
the apply frontier back, and the task fails with
:class:`~airflow_provider_dblog.exceptions.DBLogWindowFailed`.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowSensorTimeout, TaskDeferralError, TaskDeferralTimeout

from ..engine.dump import fail_window
from ..engine.errors import WatermarkError
from ..engine.state import RedisState
from ..engine.windows import Window
from ..exceptions import DBLogWindowFailed
from ..hooks.dblog import DBLogHook, DBLogHookMixin
from ..operators.chunk import chunk_xcom, window_from_xcom
from ..triggers.watermark import HighWatermarkTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context

# Airflow's own deferral timeout is only a backstop: the trigger times out first and
# reports it, so the window is closed as failed with a message that says why
DEFERRAL_MARGIN_S = 300.0


class DBLogHighWatermarkSensor(DBLogHookMixin, BaseSensorOperator):
    """Succeeds when the window's LW and HW are both in the log, durably and in order.

    :param window: the window (templated): the chunk operator's XCom (``chunk.output``),
        or its ``window`` part; or give ``chunk_task_id`` instead.
    :param chunk_task_id: the chunk operator's task id, to pull the window from its XCom.
    :param config_path: the dblog YAML (templated); default: the ``dblog`` connection, else
        ``$DBLOG_CONFIG``. With ``deferrable=True`` the triggerer reads it too.
    :param source: the source name (optional when the config has one).
    :param dblog_conn_id: an optional ``dblog`` connection holding ``config_path``.
    :param timeout: seconds to wait for the window; default: the config's
        ``dump.window_timeout_s``.
    :param poll_interval: seconds between two looks at Redis (trigger and poke mode).
    :param deferrable: wait in the triggerer (default) instead of a worker slot.

    Returns (XCom) ``{"window": id, "lw": position, "hw": position}``.
    """

    template_fields: Sequence[str] = ("config_path", "window")
    ui_color = "#f5ecd8"

    def __init__(self, *, window: Any = None, chunk_task_id: str | None = None,
                 config_path: str | None = None, source: str | None = None,
                 dblog_conn_id: str | None = None, timeout: float | timedelta | None = None,
                 poll_interval: float = 1.0, deferrable: bool = True, **kwargs: Any) -> None:
        if window is None and chunk_task_id is None:
            raise ValueError("give the window (e.g. window=chunk.output) or chunk_task_id")
        if isinstance(timeout, timedelta):
            timeout = timeout.total_seconds()
        self.window_timeout = float(timeout) if timeout is not None else None
        kwargs.setdefault("poke_interval", poll_interval)
        super().__init__(timeout=timeout if timeout is not None else 7 * 24 * 3600, **kwargs)
        self.use_dblog_config(config_path, dblog_conn_id, source)
        self.window = window
        self.chunk_task_id = chunk_task_id
        self.poll_interval = float(poll_interval)
        self.deferrable = deferrable
        self._state: RedisState | None = None
        self._window: Window | None = None

    # -- parts -------------------------------------------------------------------------
    def _resolve_window(self, context: Context) -> Window:
        return window_from_xcom(chunk_xcom(self.window, self.chunk_task_id, context, "window to wait for"))

    def _setup(self, context: Context) -> tuple[DBLogHook, RedisState, Window]:
        hook = self.dblog_hook()
        state = hook.state(self.source)
        window = self._resolve_window(context)
        self._state, self._window = state, window
        if self.window_timeout is None:
            self.window_timeout = float(hook.config.dump.window_timeout_s)
        return hook, state, window

    def _fail(self, state: RedisState, window: Window, message: str) -> NoReturn:
        """Close the window as failed (unless closed already), mark the request, raise."""
        try:
            if fail_window(state, window, message, "wait_hw"):
                self.log.error("window %s closed as failed", window.id)
        except Exception:  # the window's failure is what the task reports
            self.log.exception("could not close window %s", window.id)
        raise DBLogWindowFailed(message)

    def _check(self, state: RedisState, window: Window) -> dict | None:
        """One synchronous look (the same checks as the trigger's): the positions, or None."""
        look = state.look_window(window)
        try:
            pair = look.positions()
        except WatermarkError as e:
            self._fail(state, window, str(e))
        if pair is not None:
            lw, hw = pair
            return {"window": window.id, "lw": lw.encode(), "hw": hw.encode()}
        if not look.is_open:
            self._fail(state, window, look.closed_message())
        return None

    # -- the run -----------------------------------------------------------------------
    def execute(self, context: Context) -> Any:
        hook, state, window = self._setup(context)
        seen = self._check(state, window)
        if seen is not None:
            self.log.info("window %s of %s is durable through its HW: LW %s, HW %s", window.id,
                          window.table, seen["lw"], seen["hw"])
            return seen
        if not self.deferrable:
            self.timeout = self.window_timeout
            try:
                return super().execute(context)
            except AirflowSensorTimeout:
                self._fail(state, window, self._timeout_message(state, window))
        self.log.info("deferring: waiting up to %.0fs for HW %s of window %s (%s)", self.window_timeout,
                      window.hw, window.id, window.table)
        self.defer(trigger=HighWatermarkTrigger(
            config_path=os.path.abspath(hook.resolve_config_path()), window=json.loads(window.to_json()),
            source=hook.config.source(self.source).name, poll_interval=self.poll_interval,
            timeout=self.window_timeout, started_at=time.time()),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.window_timeout + DEFERRAL_MARGIN_S))

    def poke(self, context: Context) -> bool | PokeReturnValue:
        seen = self._check(self._state, self._window)
        return PokeReturnValue(True, seen) if seen is not None else False

    def _timeout_message(self, state: RedisState, window: Window) -> str:
        return state.look_window(window).timeout_message(self.window_timeout)

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> dict:
        """Back from the trigger: the positions, or the window closed as failed and an error."""
        event = event or {}
        if event.get("status") == "success":
            self.log.info("window %s is durable through its HW: LW %s, HW %s (waited %ss)",
                          event.get("window"), event.get("lw"), event.get("hw"), event.get("waited_s"))
            return {"window": event.get("window"), "lw": event["lw"], "hw": event["hw"]}
        hook = self.dblog_hook()
        state = hook.state(self.source)
        window = self._resolve_window(context)
        message = event.get("message") or f"the HW trigger ended without a result: {event!r}"
        self.log.error("window %s: %s (%s)", window.id, event.get("status"), message)
        self._fail(state, window, message)

    def resume_execution(self, next_method: str, next_kwargs: dict[str, Any] | None, context: Context):
        """A trigger that crashed or hit Airflow's deferral timeout: close the window too."""
        try:
            return super().resume_execution(next_method, next_kwargs, context)
        except (AirflowSensorTimeout, TaskDeferralError, TaskDeferralTimeout) as e:
            hook = self.dblog_hook()
            self._fail(hook.state(self.source), self._resolve_window(context),
                       f"waiting for the HW failed in the triggerer: {type(e).__name__}: {e}")
