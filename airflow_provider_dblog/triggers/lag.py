"""TargetLagTrigger: waits, in the triggerer, until a target has caught up.

Each look is ``engine.lag.target_progress``: reads of the target's apply checkpoints,
Redis and (for a lag in seconds) the source's log head. Those clients are synchronous,
so the look runs in a worker thread (``asyncio.to_thread``) and the event loop is never
blocked; the trigger never writes anywhere. It fires one event:

* ``{"status": "success", "target": ..., "applied": {table: pos}, "lag_s": ..., "waited_s": ...}``;
* ``{"status": "error", "message": ...}``: the config unreadable in the triggerer, or it no
  longer names the target or a table;
* ``{"status": "timeout", "message": ..., "applied": ..., "lag_s": ...}``: the last look.

A target or Redis that is away for a moment is logged and polled again, as the poke is.
Its serialized kwargs hold no secret: connections are resolved in ``run()``.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import TriggerEvent

from ..engine.errors import ConfigError, UnknownTableError
from ..engine.lag import TargetProgress, target_progress
from ..engine.positions import Position
from .config import load_config_async
from .polling import PollingTrigger


class TargetLagTrigger(PollingTrigger):
    """Fires when every watched table of ``target`` is applied below ``position``, or when
    the target's lag is at most ``max_lag_seconds`` (exactly one is set).

    :param config_path: the dblog YAML (readable by the triggerer).
    :param target: the target name (None: the config's only target).
    :param tables: the tables to watch (None: every table of the target's source).
    :param position: an encoded position to wait for.
    :param max_lag_seconds: the lag to wait for.
    :param poll_interval: seconds between two looks.
    :param timeout: seconds from ``started_at`` after which a timeout event fires.
    :param started_at: epoch seconds the wait began (kept across triggerer restarts).
    """

    def __init__(self, *, config_path: str, target: str | None = None, tables: list[str] | None = None,
                 position: str | None = None, max_lag_seconds: float | None = None,
                 poll_interval: float = 30.0, timeout: float = 7 * 24 * 3600.0,
                 started_at: float | None = None) -> None:
        super().__init__(poll_interval=poll_interval, timeout=timeout, started_at=started_at)
        if (position is None) == (max_lag_seconds is None):
            raise ValueError("TargetLagTrigger: set exactly one of position and max_lag_seconds")
        self.config_path = config_path
        self.target = target
        self.tables = list(tables) if tables else None
        self.position = position
        self.max_lag_seconds = None if max_lag_seconds is None else float(max_lag_seconds)

    def goal_kwargs(self) -> dict[str, Any]:
        return {"config_path": self.config_path, "target": self.target, "tables": self.tables,
                "position": self.position, "max_lag_seconds": self.max_lag_seconds}

    def _goal(self) -> str:
        return f"position {self.position}" if self.position else f"lag <= {self.max_lag_seconds:g} s"

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            want = Position.decode(self.position) if self.position else None
            cfg = await load_config_async(self.config_path)
            cfg.target(self.target)
        except (ConfigError, ValueError, OSError) as e:
            yield self.event("error", message=f"cannot use config {self.config_path}: {type(e).__name__}: {e}")
            return
        self.log.info("waiting for target %s to reach %s, up to %.0fs", self.target or "(default)",
                      self._goal(), self.timeout)

        def settle(progress: TargetProgress) -> TriggerEvent | None:
            if progress.reached(want, self.max_lag_seconds):
                return self.event("success", **progress.to_xcom(), waited_s=self.waited_s())
            return None

        def timed_out(last: TargetProgress | None, last_error: str) -> TriggerEvent:
            shown = last.to_xcom() if last else {}
            return self.event("timeout", **shown, message=(
                f"target {self.target or '(default)'} did not reach {self._goal()} within "
                f"{self.timeout:.0f}s (applied: {shown.get('applied')}, lag: {shown.get('lag_s')}"
                f"{', last error: ' + last_error if last_error else ''})"))

        yield await self.poll(
            lambda: asyncio.to_thread(target_progress, cfg, self.target, self.tables, want is None),
            settle, timed_out, reading_what="the target's progress",
            transient=(Exception,),  # a server away for a moment: keep polling
            fatal=(ConfigError, UnknownTableError))  # a table or target the config does not name
