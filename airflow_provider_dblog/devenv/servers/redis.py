"""The private Redis: append-only file, no snapshots."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

from .base import PrivateServer, ServerPaths
from .processes import HOST, ServerError, which

REDIS_PORT = 16379
# The settings the state store depends on; docker/compose.yaml must match them (tests/test_docker_compose.py).
REDIS_SETTINGS = ("--appendonly", "yes", "--appendfsync", "everysec", "--save", "")


class RedisServer(PrivateServer[ServerPaths]):
    name = "redis"
    title = "Redis"
    poll_interval = 0.05

    def paths(self, base: Path) -> ServerPaths:
        root = base / "redis"
        return ServerPaths(root=root, data=root, pid=root / "redis.pid", log=root / "redis.log")

    def url(self, db: int = 0) -> str:
        return f"redis://{HOST}:{self.port}/{db}"

    def details(self, p: ServerPaths) -> dict:
        return {"dir": str(p.data)}

    def needle(self, p: ServerPaths) -> bytes:
        # redis-server rewrites its title to "redis-server 127.0.0.1:16379"
        return f"redis-server {HOST}:{self.port}".encode()

    def launch(self, p: ServerPaths) -> None:
        cmd = [
            which("redis-server"),
            "--port", str(self.port),
            "--bind", HOST,
            "--daemonize", "yes",
            "--dir", str(p.data),
            "--pidfile", str(p.pid),
            "--logfile", str(p.log),
            *REDIS_SETTINGS,
        ]  # fmt: skip
        res = subprocess.run(
            cmd, cwd=p.root, capture_output=True, text=True, start_new_session=True, check=False, timeout=30
        )
        if res.returncode != 0:
            raise ServerError(
                f"redis-server failed (exit {res.returncode}): {res.stdout.strip()} {res.stderr.strip()}\n"
                f"{self.logs(p)}"
            )
        # daemonized: the pid file may not be written yet, so no pid to watch

    def probe(self, p: ServerPaths) -> str | None:
        try:
            with socket.create_connection((HOST, self.port), timeout=1.0) as s:
                s.sendall(b"PING\r\n")
                return None if s.recv(64).startswith(b"+PONG") else "no PONG to PING"
        except OSError as exc:
            return str(exc)

    # SIGTERM (the default shut_down): redis fsyncs the AOF and exits


REDIS = RedisServer(REDIS_PORT)


def redis_url(db: int = 0) -> str:
    return REDIS.url(db)
