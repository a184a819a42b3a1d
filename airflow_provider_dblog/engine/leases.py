"""Leases in Redis: the tail's (one tail per source) and one per dump request (one runner).

A lease is a key holding a fencing token ``owner|n`` (n from a counter that only grows),
set with a TTL its holder renews: a holder that dies or stalls loses it after the TTL,
and its token, compared in the fenced writes (``RedisState.commit``,
``RedisState.complete_chunk``), lets nothing through. A mixin of ``RedisState``: it uses
its client ``r`` and key builder ``k``.
"""
from __future__ import annotations

import time
from typing import Callable, TypeVar

from .errors import LeaseLostError

T = TypeVar("T")

# KEYS: lease, fence   ARGV: owner, ttl_ms   -> token or false
_ACQUIRE = """
local cur = redis.call('GET', KEYS[1])
if cur then
  local owner = string.match(cur, '^[^|]*')
  if owner ~= ARGV[1] then return false end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return cur
end
local token = ARGV[1] .. '|' .. redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], token, 'PX', ARGV[2])
return token
"""

_RENEW = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class Leases:
    def _register_lease_scripts(self) -> None:
        self._acquire = self.r.register_script(_ACQUIRE)
        self._renew = self.r.register_script(_RENEW)
        self._release = self.r.register_script(_RELEASE)

    def _lease_keys(self, request: str | None) -> list[str]:
        if request is None:
            return [self.k("lease"), self.k("fence")]
        return [self.k("request_lease", request), self.k("request_fence", request)]

    def acquire_lease(self, owner: str, ttl_s: float, request: str | None = None) -> str | None:
        """A fencing token ``owner|n`` if this owner holds the lease (the tail's, or with
        ``request`` that dump request's), else None."""
        return self._acquire(keys=self._lease_keys(request), args=[owner, int(ttl_s * 1000)])

    def renew_lease(self, token: str, ttl_s: float, request: str | None = None) -> None:
        if not self._renew(keys=self._lease_keys(request)[:1], args=[token, int(ttl_s * 1000)]):
            who = "tail lease" if request is None else f"lease of dump request {request}"
            other = "tail" if request is None else "runner of the request"
            raise LeaseLostError(f"{who} {token} lost: it expired, and another {other} may have taken over")

    def release_lease(self, token: str, request: str | None = None) -> None:
        self._release(keys=self._lease_keys(request)[:1], args=[token])

    def lease_holder(self, request: str | None = None) -> str | None:
        """The token (``owner|n``) holding the lease (the tail's, or a request's), if any."""
        return self.r.get(self._lease_keys(request)[0])

    def lease_expires_in(self, request: str | None = None) -> float | None:
        """Seconds until the held lease expires unless its holder renews it; None: not held."""
        ms = self.r.pttl(self._lease_keys(request)[0])
        return ms / 1000 if ms is not None and ms >= 0 else None

    def wait_for_lease(self, attempt: Callable[[], T], wait_s: float, request: str | None = None,
                       on_first_wait: Callable[[str | None, float | None], None] = lambda holder, expires: None,
                       should_stop: Callable[[], bool] = lambda: False) -> T:
        """``attempt()`` (acquire the lease, or see it free) until it gives something truthy,
        ``wait_s`` has passed or ``should_stop()``; returns its last answer. Between tries it
        sleeps until the holder's lease would expire (at most 1 s); ``on_first_wait(holder,
        expires_in)`` before the first sleep (to say who is waited for)."""
        deadline = time.monotonic() + wait_s
        first = True
        while True:
            got = attempt()
            left = deadline - time.monotonic()
            if got or left <= 0 or should_stop():
                return got
            expires = self.lease_expires_in(request)
            if first:
                on_first_wait(self.lease_holder(request), expires)
                first = False
            time.sleep(max(0.05, min(1.0, left, expires if expires is not None else 1.0)))
