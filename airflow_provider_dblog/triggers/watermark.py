"""HighWatermarkTrigger: waits, in the triggerer, until the tail has logged a window's HW.

The log tail records a watermark's position in Redis only together with the
checkpoint that covers it, so once the window's HW is recorded, the log is
durable through it and the chunk can be reconciled. The trigger polls Redis with
``redis.asyncio`` (the event loop is never blocked), reads only, and never
connects to the source database. It fires one event:

* ``{"status": "success", "window": id, "lw": pos, "hw": pos, "waited_s": s}``;
* ``{"status": "error", "window": id, "message": ...}``: a watermark seen twice, the HW
  not after the LW, the LW before the window opened (``engine.windows.WindowLook``: the
  engine's own wait and the sensor's poke make the same checks on the same keys), the
  window closed meanwhile, or the config unreadable in the triggerer;
* ``{"status": "timeout", "window": id, "message": "... Is the log tail running?"}``.

Its serialized kwargs hold no secret: the Redis URL is read from the dblog config in
``run()``. A config whose ``state`` (or any part) names an Airflow connection
(``conn_id``) has it resolved with the Task SDK's async connection access, so the
triggerer needs the config file at the same path and access to those connections.
"""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import TriggerEvent

from ..engine.errors import WatermarkError
from ..engine.windows import AsyncWindowReader, Window, WindowLook
from .config import load_config_async
from .polling import PollingTrigger


async def resolve_state(config_path: str, source: str | None) -> tuple[str, str, str]:
    """``(redis_url, state_prefix, source_name)`` from the config, without blocking the loop."""
    cfg = await load_config_async(config_path)
    return cfg.redis_url, cfg.state_prefix, cfg.source(source).name


class HighWatermarkTrigger(PollingTrigger):
    """Fires when the window's LW and HW are both in the log, durably and in order.

    :param config_path: the dblog YAML (readable by the triggerer).
    :param window: the window, as ``json.loads(Window.to_json())`` (the chunk operator's XCom).
    :param source: the source name (optional when the config has one).
    :param prefix: the Redis key prefix; default: the config's ``state.prefix``.
    :param poll_interval: seconds between two looks at Redis.
    :param timeout: seconds from ``started_at`` after which a timeout event fires.
    :param started_at: epoch seconds the wait began (set at creation, kept across
        triggerer restarts so the timeout does not start over).
    """

    def __init__(self, *, config_path: str, window: dict, source: str | None = None,
                 prefix: str | None = None, poll_interval: float = 1.0, timeout: float = 120.0,
                 started_at: float | None = None) -> None:
        super().__init__(poll_interval=poll_interval, timeout=timeout, started_at=started_at)
        self.config_path = config_path
        self.window = dict(window)
        self.source = source
        self.prefix = prefix

    def goal_kwargs(self) -> dict[str, Any]:
        return {"config_path": self.config_path, "window": self.window, "source": self.source,
                "prefix": self.prefix}

    def event(self, status: str, **payload: Any) -> TriggerEvent:
        return super().event(status, window=self.window.get("id"), **payload)

    def _settle(self, look: WindowLook) -> TriggerEvent | None:
        """The event a look decides: both watermarks in order, a broken window, or None."""
        try:
            pair = look.positions()
        except WatermarkError as e:
            return self.event("error", message=str(e))
        if pair is not None:
            lw, hw = pair
            return self.event("success", lw=lw.encode(), hw=hw.encode(), waited_s=self.waited_s())
        if not look.is_open:
            return self.event("error", message=look.closed_message())
        return None

    async def run(self) -> AsyncIterator[TriggerEvent]:
        import json

        import redis.asyncio as aioredis

        try:
            window = Window.from_json(json.dumps(self.window))
            url, prefix, source = await resolve_state(self.config_path, self.source)
        except Exception as e:  # noqa: BLE001 - reported, the sensor fails the window
            yield self.event("error", message=f"cannot read window or config {self.config_path}: "
                                              f"{type(e).__name__}: {e}")
            return
        prefix = self.prefix or prefix
        self.log.info("waiting for HW %s of window %s (%s) in %s:%s, up to %.0fs", window.hw, window.id,
                      window.table, prefix, source, self.timeout)

        def timed_out(last: WindowLook | None, last_error: str) -> TriggerEvent:
            last = last or WindowLook(window, None, None, (), True, None)
            return self.event("timeout", message=last.timeout_message(self.timeout, last_error))

        reader = AsyncWindowReader(url, prefix, source)
        try:
            event = await self.poll(lambda: reader.look(window), self._settle, timed_out,
                                    transient=(OSError, aioredis.RedisError), reading_what="Redis")
        finally:
            await reader.close()
        yield event
