"""What every private server shares: the base directory, a server's paths, and its
life cycle (start, stop, status, waiting until it answers, pid files), written once
in :class:`PrivateServer`; the subclasses say what differs."""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from .processes import HOST, ServerError, port_open, proc_alive, read_pid, tail, terminate

START_TIMEOUT = 60.0
# Unix socket paths are limited to 108 bytes (including the NUL).
MAX_SOCKET_PATH = 100

# <repo>/airflow_provider_dblog/devenv/servers/base.py -> <repo>
_REPO_ROOT = Path(__file__).resolve().parents[3]


def default_base() -> Path:
    """``$DBLOG_LOCAL_DIR`` or ``<repo>/.dblog-local`` (absolute)."""
    env = os.environ.get("DBLOG_LOCAL_DIR")
    if env:
        return Path(env).expanduser().resolve()
    if (_REPO_ROOT / "setup.cfg").exists():
        return _REPO_ROOT / ".dblog-local"
    return Path.cwd().resolve() / ".dblog-local"


def resolve_base(base: str | os.PathLike[str] | None) -> Path:
    """*base* (or the default) as an existing absolute directory."""
    resolved = default_base() if base is None else Path(base).expanduser().resolve()
    resolved.mkdir(parents=True, exist_ok=True)
    return resolved


def base_hash(base: Path) -> str:
    """A short name for *base*, for the files that cannot live under it (long socket paths)."""
    return hashlib.sha256(str(base).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class ServerPaths:
    """Where one server keeps its files."""

    root: Path  # the server's own directory
    data: Path  # its data directory
    pid: Path  # the pid file the server writes
    log: Path

    @property
    def marker(self) -> Path:
        """Written once the data directory is fully initialised."""
        return self.root / ".initialized"


PathsT = TypeVar("PathsT", bound=ServerPaths)


class PrivateServer(Generic[PathsT]):
    """One private server on ``HOST:port`` with its files under a base directory."""

    name: str  # as in the command line's --only
    title: str  # in messages
    # a file (under data) only an initialised data directory has; "" if the server needs no initialisation
    init_sentinel = ""
    poll_interval = 0.1

    def __init__(self, port: int):
        self.port = port

    # ------------------------------------------------------------------ #
    # What a subclass says
    # ------------------------------------------------------------------ #

    def paths(self, base: Path) -> PathsT:
        raise NotImplementedError

    def url(self) -> str:
        raise NotImplementedError

    def details(self, p: PathsT) -> dict:
        """The server's own entries of :meth:`info`."""
        return {}

    def needle(self, p: PathsT) -> bytes:
        """Bytes of the command line that only our process has (a reused pid does not match)."""
        raise NotImplementedError

    def init_command(self, p: PathsT) -> list[str]:
        """The command that creates the data directory (servers with an ``init_sentinel``)."""
        raise NotImplementedError

    def launch(self, p: PathsT) -> int | None:
        """Start the server process; its pid when known already."""
        raise NotImplementedError

    def probe(self, p: PathsT) -> str | None:
        """None if the server answers, else what went wrong."""
        raise NotImplementedError

    def stale_files(self, p: PathsT) -> list[Path]:
        """Files a killed server leaves behind that would stop a new one."""
        return [p.pid]

    def shut_down(self, p: PathsT, pid: int) -> None:
        terminate(pid, self.needle(p))

    def logs(self, p: PathsT) -> str:
        """The end of the server's logs, for error messages."""
        return f"Tail of {p.log}:\n{tail(p.log)}"

    # ------------------------------------------------------------------ #
    # The life cycle
    # ------------------------------------------------------------------ #

    def info(self, p: PathsT) -> dict:
        """How to reach the server and where its files are."""
        return {"host": HOST, "port": self.port, **self.details(p), "log": str(p.log),
                "pid": read_pid(p.pid), "url": self.url()}

    def running_pid(self, p: PathsT) -> int | None:
        pid = read_pid(p.pid)
        return pid if proc_alive(pid, self.needle(p)) else None

    def start(self, base: Path) -> dict:
        """Start the server unless it runs; wait until it answers; its :meth:`info`."""
        p = self.paths(base)
        p.root.mkdir(parents=True, exist_ok=True)
        pid = self.running_pid(p)
        if pid:
            self.wait_ready(p, pid)
            return {**self.info(p), "already_running": True}
        if port_open(self.port):
            raise ServerError(
                f"{self.name}: port {self.port} on {HOST} is already in use by a process that is not the "
                f"private {self.name} under {base}. Stop that process (or the private servers of "
                "another checkout / DBLOG_LOCAL_DIR) and try again."
            )
        # Not running and the port is free: files left by a killed server are stale
        # (their pid may have been reused, or be a not-yet-reaped zombie).
        self.remove_stale_files(p)
        initialised = self.initialise(p)
        pid = self.launch(p)
        self.wait_ready(p, pid)
        started = {**self.info(p), "already_running": False}
        if pid:
            started["pid"] = pid
        if initialised is not None:
            started["initialised"] = initialised
        return started

    def stop(self, base: Path) -> bool:
        """Stop the server; True if it was running."""
        p = self.paths(base)
        pid = self.running_pid(p)
        if pid:
            self.shut_down(p, pid)
        p.pid.unlink(missing_ok=True)
        return bool(pid)

    def status(self, base: Path) -> dict:
        """:meth:`info` plus ``running`` and ``answering``, without starting anything."""
        try:
            p = self.paths(base)
            pid = self.running_pid(p)
            entry = self.info(p)
        except ServerError as exc:
            pid, entry = None, {"host": HOST, "port": self.port, "error": str(exc)}
        entry.update(running=bool(pid), pid=pid, answering=port_open(self.port))
        return entry

    def wait_ready(self, p: PathsT, pid: int | None, timeout: float = START_TIMEOUT) -> None:
        """Until the server answers; fails early if process *pid* (when known) exits."""
        deadline = time.monotonic() + timeout
        while True:
            problem = self.probe(p)
            if problem is None:
                return
            if pid is not None and not proc_alive(pid, self.needle(p)):
                raise ServerError(f"{self.title} (pid {pid}) exited before it answered. {self.logs(p)}")
            if time.monotonic() >= deadline:
                raise ServerError(
                    f"{self.title} on {HOST}:{self.port} did not answer within "
                    f"{timeout:.0f}s ({problem}). {self.logs(p)}"
                )
            time.sleep(self.poll_interval)

    def remove_stale_files(self, p: PathsT) -> None:
        for stale in self.stale_files(p):
            stale.unlink(missing_ok=True)

    def initialise(self, p: PathsT) -> bool | None:
        """Create the data directory unless done: True if this call did, None if the
        server needs no initialisation."""
        if not self.init_sentinel:
            return None
        if p.marker.exists() or (p.data / self.init_sentinel).exists():
            p.marker.touch()  # also for data directories from before the marker
            return False
        if p.data.exists():
            shutil.rmtree(p.data)  # a previous initialisation was interrupted
        cmd = self.init_command(p)
        res = subprocess.run(cmd, cwd=p.root, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise ServerError(
                f"{shlex.join(cmd)} failed (exit {res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
            )
        p.marker.write_text(time.strftime("%Y-%m-%dT%H:%M:%S\n"))
        return True
