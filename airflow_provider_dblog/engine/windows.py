"""Dump windows: one LW/HW window of a chunk, and how a look at it in Redis is judged.

Shared by the engine (``RedisState.wait_window``), the Airflow sensor and the deferrable
trigger, so each applies the same fail-closed checks to the same keys. ``RedisState``
(``engine/state.py``) opens and closes windows; this module only describes and reads them.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from .errors import WatermarkError
from .positions import Position


@dataclass
class Window:
    """One LW/HW window of a dump chunk, as the dump registered it."""
    id: str
    request: str
    table: str
    lw: str
    hw: str
    floor: Position  # tail checkpoint when the window opened: the LW comes after it
    opened_at: float = field(default_factory=time.time)

    def to_json(self) -> str:
        d = self.__dict__ | {"floor": self.floor.encode()}
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> "Window":
        d = json.loads(text)
        d["floor"] = Position.decode(d["floor"])
        return cls(**d)


def state_key(prefix: str, source: str, *parts: str) -> str:
    """The Redis key of one piece of a source's state (``RedisState.k``), for readers that
    hold no RedisState (the Airflow trigger reads with redis.asyncio)."""
    return ":".join((prefix, source, *parts))


def check_window_positions(window: Window, lw: Position | None, hw: Position | None,
                           conflicts: list[str]) -> tuple[Position, Position] | None:
    """The fail-closed checks on a window's watermark positions, as the tail recorded them.

    ``(lw, hw)`` once both are seen and in order (the tail records a watermark only with
    the checkpoint that covers it, so a seen HW is durable); ``None`` while one is still
    missing. Raises WatermarkError for a watermark seen twice at different positions
    (``conflicts``: the ``watermark_conflicts`` values of the window's LW and HW), an HW
    not after the LW, or an LW before the window opened (its floor). Pure: shared by
    ``RedisState.wait_window`` and the Airflow sensor and trigger.
    """
    conflicts = [c for c in conflicts if c]
    if conflicts:
        raise WatermarkError(f"window {window.id}: a watermark was seen twice at different "
                             f"positions ({'; '.join(conflicts)}); the window's chunk is not trusted")
    if lw is None or hw is None:
        return None
    if not lw < hw:
        raise WatermarkError(f"window {window.id}: HW {hw} is not after LW {lw}")
    if lw < window.floor:
        raise WatermarkError(f"window {window.id}: LW {lw} is before the window opened ({window.floor})")
    return lw, hw


@dataclass(frozen=True)
class WindowLook:
    """One look at a window's state in Redis (``RedisState.look_window`` or
    ``AsyncWindowReader.look``): its watermarks as the tail recorded them, whether it is still
    open, and the tail's checkpoint."""
    window: Window
    lw: Position | None
    hw: Position | None
    conflicts: tuple[str, ...]
    is_open: bool
    checkpoint: str | None

    def positions(self) -> tuple[Position, Position] | None:
        """``(lw, hw)`` once the log is durable through the HW; raises WatermarkError
        (``check_window_positions``)."""
        return check_window_positions(self.window, self.lw, self.hw, list(self.conflicts))

    def timeout_message(self, timeout_s: float, redis_error: str = "") -> str:
        return (f"window {self.window.id} of {self.window.table} did not close within {timeout_s:.0f}s "
                f"(LW seen: {self.lw is not None}, HW seen: {self.hw is not None}, tail checkpoint: "
                f"{self.checkpoint or 'none'}{', Redis error: ' + redis_error if redis_error else ''}). "
                "Is the log tail running?")

    def closed_message(self) -> str:
        return (f"window {self.window.id} of {self.window.table} was closed before its HW was seen "
                "(abandoned by a newer run of the request, cancelled, or failed)")


def window_look_commands(pipe, k, window: Window) -> None:
    pipe.hmget(k("watermarks"), [window.lw, window.hw])
    pipe.hmget(k("watermark_conflicts"), [window.lw, window.hw])
    pipe.hexists(k("windows"), window.id)
    pipe.hget(k("checkpoint"), "pos")


def window_look(window: Window, replies: list) -> WindowLook:
    (lw, hw), conflicts, is_open, checkpoint = replies
    return WindowLook(window, Position.decode(lw) if lw else None, Position.decode(hw) if hw else None,
                      tuple(c for c in conflicts if c), bool(is_open), checkpoint)


class AsyncWindowReader:
    """Looks at windows with ``redis.asyncio`` (the Airflow trigger's event loop is never
    blocked): the same keys and checks as ``RedisState.look_window``, read-only."""

    def __init__(self, url: str, prefix: str, source: str):
        import redis.asyncio as aioredis

        self.prefix, self.source = prefix, source
        self.client = aioredis.Redis.from_url(url, decode_responses=True)

    def k(self, *parts: str) -> str:
        return state_key(self.prefix, self.source, *parts)

    async def look(self, window: Window) -> WindowLook:
        async with self.client.pipeline(transaction=False) as pipe:
            window_look_commands(pipe, self.k, window)
            return window_look(window, await pipe.execute())

    async def close(self) -> None:
        await self.client.aclose()
