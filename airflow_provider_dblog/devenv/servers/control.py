"""Start, stop and report the private servers together, under one lock per base directory."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path
from typing import Iterable, Iterator

from .base import PrivateServer, resolve_base
from .mariadb import MARIADB
from .postgres import POSTGRES
from .redis import REDIS

SERVERS = ("mariadb", "postgres", "redis")
SERVER_BY_NAME: dict[str, PrivateServer] = {server.name: server for server in (MARIADB, POSTGRES, REDIS)}
_ALIASES = {"mysql": "mariadb", "pg": "postgres", "postgresql": "postgres"}


def normalise(which: str | Iterable[str] | None) -> tuple[str, ...]:
    """Server names from a comma-separated string or names (aliases allowed), in order, once each."""
    if which is None:
        return SERVERS
    if isinstance(which, str):
        which = which.split(",")
    names = tuple(dict.fromkeys(w.strip().lower() for w in which if w and w.strip()))
    names = tuple(_ALIASES.get(n, n) for n in names)
    unknown = [n for n in names if n not in SERVERS]
    if unknown:
        raise ValueError(f"unknown server(s) {unknown}; choose from {', '.join(SERVERS)}")
    return names


@contextlib.contextmanager
def _locked(base: Path) -> Iterator[None]:
    """Serialise start/stop of the servers of one base directory."""
    with open(base / ".servers.lock", "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def start(
    which: str | Iterable[str] = SERVERS, base: str | os.PathLike[str] | None = None
) -> dict[str, dict]:
    """Start (or just check) the private servers; return their connection info.

    Each entry has at least ``host``, ``port``, ``url``, ``pid`` and
    ``already_running``; MariaDB/PostgreSQL also ``user``, ``password``,
    ``jdbc_url``, ``jdbc_driver`` and ``jdbc_jar``; plus ``seconds``.
    """
    names = normalise(which)
    resolved = resolve_base(base)
    out: dict[str, dict] = {}
    with _locked(resolved):
        for name in names:
            t0 = time.monotonic()
            info = SERVER_BY_NAME[name].start(resolved)
            info["seconds"] = round(time.monotonic() - t0, 3)
            out[name] = info
    return out


def stop(which: str | Iterable[str] = SERVERS, base: str | os.PathLike[str] | None = None) -> dict[str, bool]:
    """Stop the private servers; ``{name: True if it was running}``."""
    names = normalise(which)
    resolved = resolve_base(base)
    with _locked(resolved):
        return {name: SERVER_BY_NAME[name].stop(resolved) for name in names}


def status(base: str | os.PathLike[str] | None = None) -> dict[str, dict]:
    """``{name: {running, answering, pid, port, ...}}`` without starting anything."""
    resolved = resolve_base(base)
    return {name: SERVER_BY_NAME[name].status(resolved) for name in SERVERS}
