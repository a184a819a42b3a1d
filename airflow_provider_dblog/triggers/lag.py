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
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from ..engine.errors import ConfigError, UnknownTableError
from ..engine.lag import target_progress
from ..engine.positions import Position
from .config import load_config_async


class TargetLagTrigger(BaseTrigger):
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
        super().__init__()
        if (position is None) == (max_lag_seconds is None):
            raise ValueError("TargetLagTrigger: set exactly one of position and max_lag_seconds")
        self.config_path = config_path
        self.target = target
        self.tables = list(tables) if tables else None
        self.position = position
        self.max_lag_seconds = None if max_lag_seconds is None else float(max_lag_seconds)
        self.poll_interval = float(poll_interval)
        self.timeout = float(timeout)
        self.started_at = float(started_at) if started_at is not None else time.time()

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "config_path": self.config_path, "target": self.target, "tables": self.tables,
            "position": self.position, "max_lag_seconds": self.max_lag_seconds,
            "poll_interval": self.poll_interval, "timeout": self.timeout, "started_at": self.started_at})

    def _goal(self) -> str:
        return f"position {self.position}" if self.position else f"lag <= {self.max_lag_seconds:g} s"

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            want = Position.decode(self.position) if self.position else None
            cfg = await load_config_async(self.config_path)
            cfg.target(self.target)
        except (ConfigError, ValueError, OSError) as e:
            yield TriggerEvent({"status": "error", "message": f"cannot use config {self.config_path}: "
                                                              f"{type(e).__name__}: {e}"})
            return
        deadline = self.started_at + self.timeout
        self.log.info("waiting for target %s to reach %s, up to %.0fs", self.target or "(default)",
                      self._goal(), self.timeout)
        last = None
        last_error = ""
        while True:
            try:
                last = await asyncio.to_thread(target_progress, cfg, self.target, self.tables,
                                               want is None)
            except (ConfigError, UnknownTableError) as e:  # a table or target the config does not name: waiting cannot help
                yield TriggerEvent({"status": "error", "message": str(e)})
                return
            except Exception as e:  # noqa: BLE001 - a server away for a moment: keep polling
                if str(e) != last_error:
                    self.log.warning("reading the target's progress failed (%s: %s); still polling",
                                     type(e).__name__, e)
                last_error = str(e)
            else:
                last_error = ""
                if last.reached(want, self.max_lag_seconds):
                    yield TriggerEvent({"status": "success", **last.to_xcom(),
                                        "waited_s": round(time.time() - self.started_at, 3)})
                    return
            if time.time() >= deadline:
                shown = last.to_xcom() if last else {}
                yield TriggerEvent({"status": "timeout", **shown, "message": (
                    f"target {self.target or '(default)'} did not reach {self._goal()} within "
                    f"{self.timeout:.0f}s (applied: {shown.get('applied')}, lag: {shown.get('lag_s')}"
                    f"{', last error: ' + last_error if last_error else ''})")})
                return
            await asyncio.sleep(max(0.01, min(self.poll_interval, deadline - time.time())))
