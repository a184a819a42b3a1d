"""PollingTrigger: what the dblog triggers share, a look every ``poll_interval`` seconds
until the goal is reached, an error says waiting cannot help, or ``timeout`` runs out.

A look must never block the triggerer's event loop (async clients, or a synchronous
read in ``asyncio.to_thread``), and a trigger only reads: it never writes to Redis, the
source or a target. ``started_at`` is kept in the serialized kwargs, so the timeout
does not start over when the triggerer restarts; those kwargs hold no secret.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

class PollingTrigger(BaseTrigger):
    """The shared part of a polling trigger.

    A subclass serializes its goal with ``goal_kwargs()`` (this class adds the polling
    kwargs) and, in ``run()``, yields ``await self.poll(...)``: the one event it fires.

    :param poll_interval: seconds between two looks.
    :param timeout: seconds from ``started_at`` after which a timeout event fires.
    :param started_at: epoch seconds the wait began (default: now).
    """

    def __init__(self, *, poll_interval: float, timeout: float, started_at: float | None) -> None:
        super().__init__()
        self.poll_interval = float(poll_interval)
        self.timeout = float(timeout)
        self.started_at = float(started_at) if started_at is not None else time.time()

    def goal_kwargs(self) -> dict[str, Any]:
        """The subclass's own ``__init__`` kwargs, as they are to be serialized."""
        raise NotImplementedError

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            **self.goal_kwargs(), "poll_interval": self.poll_interval, "timeout": self.timeout,
            "started_at": self.started_at})

    def event(self, status: str, **payload: Any) -> TriggerEvent:
        return TriggerEvent({"status": status, **payload})

    def waited_s(self) -> float:
        return round(time.time() - self.started_at, 3)

    async def poll(self, look: Callable[[], Awaitable[Any]], settle: Callable[[Any], TriggerEvent | None],
                   timed_out: Callable[[Any, str], TriggerEvent], *,
                   transient: tuple[type[BaseException], ...], reading_what: str,
                   fatal: tuple[type[BaseException], ...] = ()) -> TriggerEvent:
        """Look until ``settle`` makes an event of a reading, a ``fatal`` error is raised (an
        error event), or the timeout (``timed_out`` of the last good reading and the last
        error). A ``transient`` error (a server away for a moment) is logged and polled again."""
        deadline = self.started_at + self.timeout
        last = None
        last_error = ""
        while True:
            try:
                reading = await look()
            except fatal as e:  # waiting cannot help
                return self.event("error", message=str(e))
            except transient as e:
                if str(e) != last_error:
                    self.log.warning("reading %s failed (%s: %s); still polling", reading_what, type(e).__name__, e)
                last_error = str(e)
            else:
                last, last_error = reading, ""
                done = settle(reading)
                if done is not None:
                    return done
            if time.time() >= deadline:
                return timed_out(last, last_error)
            await asyncio.sleep(max(0.01, min(self.poll_interval, deadline - time.time())))
