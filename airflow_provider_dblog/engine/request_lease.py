"""One runner per dump request: the request's lease, held while a runner works on it.

A runner (``DumpRunner.run``, or one Airflow chunk task) takes the request's lease
(``RedisState.acquire_lease(..., request=rid)``) and a thread renews it every
``ttl/3``. A second runner of the same request waits up to ``wait_s`` for it, then
refuses (RequestBusyError naming the holder and when its lease expires). The runners
wait one TTL by default: long enough for a dead runner's lease to lapse (a resume right
after a crash goes on), never long enough to get a live one's (it renews it). A runner
that stalls past the TTL (SIGSTOP, GC, a frozen VM) loses it: its next ``check()``
raises LeaseLostError, and its chunk completion, fenced by the token in Redis
(``RedisState.complete_chunk``), moves nothing. What such a zombie may still do
between a check and its next write is harmless by the algorithm: a watermark it
writes belongs to a window the new runner closed, so the tail drains it unrecorded,
and a snapshot it writes is reconciled against its own (LW, HW) window, as valid as
any other.
"""
from __future__ import annotations

import logging
import os
import socket
import threading

from .errors import LeaseLostError, RequestBusyError
from .state import RedisState

log = logging.getLogger(__name__)


def runner_owner() -> str:
    """This process, as a lease owner (host:pid; ``|`` separates the fencing counter)."""
    return f"{socket.gethostname()}:{os.getpid()}".replace("|", "_")


def busy_error(request: str, holder: str | None, expires: float | None, ttl_s: float) -> RequestBusyError:
    return RequestBusyError(
        f"dump request {request} is being run by {holder or 'another runner'}"
        + (f"; its lease expires in {expires:.1f}s unless that runner renews it (a live one renews it "
           f"every {ttl_s / 3:.0f}s)" if expires is not None else "")
        + ". One runner per request: wait for it to finish (dblog dump --request ID --wait-lease SECONDS), "
          "or pause or cancel the request")


def wait_until_free(state: RedisState, request: str, ttl_s: float, wait_s: float) -> None:
    """Return once no runner holds the request, waiting up to ``wait_s``; else RequestBusyError
    (a check before a Spark start-up: the runner in the job takes the lease itself)."""
    if not state.wait_for_lease(lambda: state.lease_holder(request) is None, wait_s, request):
        raise busy_error(request, state.lease_holder(request), state.lease_expires_in(request), ttl_s)


class RequestLease:
    """``with RequestLease(state, rid, ttl_s, wait_s) as lease:`` holds the request's lease
    for the block; ``lease.check()`` before each write, ``lease.token`` for fenced ones."""

    def __init__(self, state: RedisState, request: str, ttl_s: float, wait_s: float = 0.0,
                 owner: str | None = None):
        self.state, self.request, self.ttl_s, self.wait_s = state, request, ttl_s, wait_s
        self.owner = owner or runner_owner()
        self.token: str | None = None
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "RequestLease":
        self.token = self.state.wait_for_lease(
            lambda: self.state.acquire_lease(self.owner, self.ttl_s, request=self.request), self.wait_s,
            self.request, lambda holder, expires: log.warning(
                "dump request %s is being run by %s; waiting up to %.0fs for its lease",
                self.request, holder, self.wait_s))
        if self.token is None:
            raise busy_error(self.request, self.state.lease_holder(self.request),
                             self.state.lease_expires_in(self.request), self.ttl_s)
        self._thread = threading.Thread(target=self._renew_loop, name=f"lease-{self.request}", daemon=True)
        self._thread.start()
        return self

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                self.state.renew_lease(self.token, self.ttl_s, request=self.request)
            except LeaseLostError as e:
                self._lost = str(e)
                return
            except Exception as e:  # Redis away: try again; the TTL decides
                log.warning("could not renew the lease of dump request %s: %s", self.request, e)

    def check(self) -> None:
        """Raise LeaseLostError if this runner no longer holds the request."""
        if self._lost is None and self.state.lease_holder(self.request) != self.token:
            self._lost = (f"lease of dump request {self.request} {self.token} lost: it expired "
                          f"(this runner stalled past {self.ttl_s:.0f}s?) and another runner may have taken over")
        if self._lost is not None:
            raise LeaseLostError(self._lost + "; this runner stops without writing")

    def holds(self) -> bool:
        """Whether this runner still holds the request (``check`` without raising)."""
        try:
            self.check()
            return True
        except LeaseLostError:
            return False

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.token is not None:
            try:
                self.state.release_lease(self.token, request=self.request)
            except Exception as e:  # the TTL releases it anyway
                log.warning("could not release the lease of dump request %s: %s", self.request, e)
