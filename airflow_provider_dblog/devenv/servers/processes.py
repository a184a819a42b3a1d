"""Process and port helpers of the private servers: finding programs, pid files,
telling our process from a reused pid, detaching, terminating, reading logs."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

# The servers listen on loopback only: they have an empty root password / trust authentication.
HOST = "127.0.0.1"
STOP_TIMEOUT = 60.0


class ServerError(RuntimeError):
    """A private server could not be started or stopped."""


def which(name: str) -> str:
    """The path of program *name*, also where a non-root PATH does not look (sbin)."""
    found = shutil.which(name)
    if found:
        return found
    for d in ("/usr/sbin", "/usr/local/sbin", "/sbin", "/usr/bin"):
        cand = Path(d) / name
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    raise ServerError(
        f"{name!r} not found. Run airflow_provider_dblog/devenv/bootstrap.sh, "
        "which installs the Debian packages (mariadb-server, postgresql-15, redis-server)."
    )


def is_root() -> bool:
    return os.geteuid() == 0


def current_user() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


def port_open(port: int, host: str = HOST, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def read_pid(path: Path) -> int | None:
    try:
        first = path.read_text().split("\n", 1)[0].strip()
        return int(first) if first else None
    except (OSError, ValueError):
        return None


def proc_alive(pid: int | None, needle: bytes | None = None) -> bool:
    """True if *pid* runs (not a zombie) and its command line contains *needle*."""
    if not pid or pid <= 0:
        return False
    proc = Path("/proc") / str(pid)
    if Path("/proc/self").exists():
        try:
            stat = (proc / "stat").read_text()
            state = stat.rsplit(")", 1)[1].split()[0]
            if state in ("Z", "X", "x"):
                return False
            if needle is not None and needle not in (proc / "cmdline").read_bytes():
                return False
            return True
        except (OSError, IndexError):
            return False
    try:  # no /proc: best effort
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def tail(path: Path, lines: int = 25) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 16384))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(data.splitlines()[-lines:])


def terminate(pid: int, needle: bytes, timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM *pid*, wait for it to go, SIGKILL after *timeout*."""
    if not proc_alive(pid, needle):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc_alive(pid, needle):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and proc_alive(pid, needle):
        time.sleep(0.05)


def spawn_detached(cmd: list[str], out_path: Path, cwd: Path) -> int:
    """Start *cmd* in its own session, fully detached (double fork via sh).

    The intermediate shell exits at once, so the server is re-parented and never
    becomes a zombie of (or gets a signal from) the calling process.
    """
    script = 'out=$1; shift; "$@" </dev/null >>"$out" 2>&1 & echo $!'
    res = subprocess.run(
        ["/bin/sh", "-c", script, "sh", str(out_path), *cmd],
        cwd=cwd,
        capture_output=True,
        text=True,
        start_new_session=True,
        check=False,
        timeout=30,
    )
    if res.returncode != 0 or not res.stdout.strip().isdigit():
        raise ServerError(f"could not spawn {cmd[0]}: {res.stderr.strip() or res.stdout.strip()}")
    return int(res.stdout.strip())
