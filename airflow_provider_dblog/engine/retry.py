"""Riding out a server that went away: the backoff, the time budget and the count (issue 15).

A step of the dump or the apply that meets a connection error (the source, the target or
Redis down, restarting, or the connection cut) is run again after a pause, 0.5 s doubling
to 15 s (the tail's own loop, engine/tail.py, pauses alike), for up to ``retry_for_s`` since
the outage began: the first failure after a step that went through. Then a clear error
naming what was retried, the attempts, the seconds and the last error. Any other error
(a SQL error with a SQLSTATE, a bug) is raised at once: retrying would not help.

The steps are safe to run again by construction: a chunk is redone in a new window (its
progress moves only when it completes), a table's batch is staged and merged again (the
merge moves the rows and the target's checkpoint in one transaction).
"""
from __future__ import annotations

import logging
import time
from typing import Callable, TypeVar

import redis

log = logging.getLogger(__name__)

T = TypeVar("T")
RETRY_FIRST_PAUSE_S, RETRY_MAX_PAUSE_S = 0.5, 15.0


def redis_is_transient(error: BaseException) -> bool:
    """Redis away: refused, cut, timed out, or still loading its data after a restart."""
    return isinstance(error, (redis.ConnectionError, redis.TimeoutError, redis.exceptions.BusyLoadingError))


def pause_s(failures: int) -> float:
    """The pause after the ``failures``-th failure in a row."""
    return min(RETRY_MAX_PAUSE_S, RETRY_FIRST_PAUSE_S * 2 ** (failures - 1))


class Retrier:
    """``Retrier(...).run(step, what)``: ``step()`` again after each transient failure.

    ``what`` names the thing retried in the log and the final error, ``setting`` the config
    key of ``retry_for_s`` (``apply.retry_for_s``). ``on_retry(error)`` runs before each
    pause (drop dead connections, count in Redis); ``error`` is the class of the final
    error. ``retries`` counts every failed attempt of the run."""

    def __init__(self, setting: str, retry_for_s: float, is_transient: Callable[[BaseException], bool],
                 error: type[Exception], on_retry: Callable[[BaseException], None] = lambda e: None):
        self.setting, self.retry_for_s, self.is_transient = setting, retry_for_s, is_transient
        self.error, self.on_retry = error, on_retry
        self.retries = 0
        self._since: float | None = None  # when the outage began (None: the last step went through)
        self._failures = 0

    def run(self, step: Callable[[], T], what: str) -> T:
        while True:
            try:
                result = step()
            except Exception as e:
                if not self.is_transient(e):   # the server answered: any outage is over
                    self._since, self._failures = None, 0
                    raise
                self._failed(e, what)
                continue
            self._since, self._failures = None, 0
            return result

    def _failed(self, e: Exception, what: str) -> None:
        now = time.monotonic()
        if self._since is None:
            self._since, self._failures = now, 0
        self._failures += 1
        self.retries += 1
        down = now - self._since
        if down >= self.retry_for_s:
            raise self.error(
                f"{what}: gave up after {self._failures} failed attempt(s) over {down:.0f}s "
                f"({self.setting} {self.retry_for_s:g}): {type(e).__name__}: {str(e).strip()}") from e
        # the last attempt falls on the deadline, not up to a whole pause past it
        pause = min(pause_s(self._failures), self.retry_for_s - down)
        log.warning("%s: %s: %s; attempt %d failed, %.0fs into the outage (%s %g); retrying in %.1fs",
                    what, type(e).__name__, str(e).strip(), self._failures, down, self.setting,
                    self.retry_for_s, pause)
        self.on_retry(e)
        time.sleep(pause)


def count_retry(state, counter: str) -> None:
    """``counter`` + 1 in the source's Redis counters (``dblog status``), unless Redis is the one away."""
    try:
        state.incr(counter)
    except redis.RedisError:
        pass
