"""When a target has something to apply: what the event-driven apply DAG's trigger decides on.

An apply run takes every event below the frontier (``RedisState.frontier()``: the tail's
checkpoint, held back by open dump windows) that the target's checkpoint has not passed.
So the target is *behind* while ``frontier > min(applied)`` over its tables (or a table has
nothing applied yet).

:class:`ApplyGate` decides, look after look, when to say so:

* at once when new work reached the frontier: the Redis ``counters`` the tail's commit
  (``events_tailed``) and a dump chunk's close (``chunks``) move in the same transaction as
  what they count, so a new *generation* of those counters means new events below a new
  frontier;
* but once per apply run: after an event, nothing more until the target's checkpoint has
  moved (the run that event started took everything below the frontier it read; what came
  after it fires as soon as that run has moved the target). Under a steady stream of
  commits that is one Asset event per apply run, not one per tail flush;
* else at most every ``refire_s`` while still behind: the checkpoint also moves over log
  with none of the source's tables (PostgreSQL follows the WAL of other tables), which
  only moves the target's checkpoint; and a run that failed is retried.

The target (a database round trip) is read only when that could fire; Redis is read with
``redis.asyncio`` in one MULTI (checkpoint, windows and counters as of one moment).
No Airflow here, and nothing is ever written.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .positions import Position
from .windows import Window, state_key

Generation = tuple[int, int]   # (events_tailed, chunks)


@dataclass(frozen=True)
class ApplyLook:
    """One look at Redis: the frontier (None before the tail's first checkpoint) and the
    generation of work behind it."""
    frontier: Position | None
    generation: Generation


def lowest_applied(applied: dict[str, Position | None]) -> Position | None:
    """The target's position as a whole: None while any table has nothing applied."""
    if not applied or any(p is None for p in applied.values()):
        return None
    return min(applied.values())


@dataclass
class ApplyGate:
    """Turns looks into "apply now" decisions (module documentation)."""
    refire_s: float
    applied_low: Position | None = None    # the target as last read
    read_once: bool = False
    handled: Generation | None = None      # the generation last fired for (or found applied)
    fired_at: float = -math.inf
    fired_applied: Position | None = None  # the target when the last event fired

    def worth_reading_target(self, look: ApplyLook, now: float) -> bool:
        if look.frontier is None:
            return False
        # the target's checkpoint only moves forward (but inside an apply run, which then
        # moves it to the frontier): at or past the frontier, it still is
        if self.read_once and self.applied_low is not None and look.frontier <= self.applied_low:
            return False
        return look.generation != self.handled or now - self.fired_at >= self.refire_s

    def decide(self, look: ApplyLook, applied: dict[str, Position | None], now: float) -> bool:
        """True: fire (the target is behind the frontier)."""
        self.applied_low, self.read_once = lowest_applied(applied), True
        if self.applied_low is not None and look.frontier <= self.applied_low:
            self.handled = look.generation
            return False
        if self._run_pending(now):
            return False  # (handled unchanged: the target is read again at the next look)
        self.handled, self.fired_at, self.fired_applied = look.generation, now, self.applied_low
        return True

    def _run_pending(self, now: float) -> bool:
        """The last event's run has not moved the target yet (and refire_s has not passed)."""
        return self.fired_at > -math.inf and self.applied_low == self.fired_applied \
            and now - self.fired_at < self.refire_s


class AsyncApplyReader:
    """The frontier and its generation, read with ``redis.asyncio`` (never blocks the loop)."""

    def __init__(self, url: str, prefix: str, source: str):
        import redis.asyncio as aioredis

        self.prefix, self.source = prefix, source
        self.client = aioredis.Redis.from_url(url, decode_responses=True)

    def k(self, *parts: str) -> str:
        return state_key(self.prefix, self.source, *parts)

    async def look(self) -> ApplyLook:
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hget(self.k("checkpoint"), "pos")
            pipe.hvals(self.k("windows"))
            pipe.hmget(self.k("counters"), "events_tailed", "chunks")
            pos, windows, counts = await pipe.execute()
        generation = tuple(int(c or 0) for c in counts)
        if pos is None:
            return ApplyLook(None, generation)
        floors = [Window.from_json(w).floor for w in windows]
        return ApplyLook(min([Position.decode(pos), *floors]), generation)

    async def close(self) -> None:
        await self.client.aclose()
