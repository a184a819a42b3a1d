"""``python -m airflow_provider_dblog.devenv.servers start|stop|restart|status``."""

from __future__ import annotations

import argparse
import sys

from .control import SERVERS, normalise, start, status, stop
from .processes import HOST, ServerError


def _where(info: dict) -> str:
    return info.get("datadir") or info.get("dir") or ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m airflow_provider_dblog.devenv.servers",
        description="Private MariaDB/PostgreSQL/Redis servers for airflow-provider-dblog.",
    )
    parser.add_argument("command", choices=("start", "stop", "restart", "status"))
    parser.add_argument("--only", default=",".join(SERVERS), help="comma-separated subset of " + ",".join(SERVERS))
    parser.add_argument("--base", default=None, help="base directory (default: $DBLOG_LOCAL_DIR or <repo>/.dblog-local)")
    args = parser.parse_args(argv)
    try:
        names = normalise(args.only)
        if args.command in ("stop", "restart"):
            for name, was in stop(names, args.base).items():
                print(f"{name:<9} {'stopped' if was else 'not running'}")
        if args.command in ("start", "restart"):
            for name, info in start(names, args.base).items():
                state = "already running" if info["already_running"] else "started"
                print(
                    f"{name:<9} {state:<16} {HOST}:{info['port']:<6} pid={info['pid']} "
                    f"({info['seconds']:.2f}s) {_where(info)}"
                )
        if args.command == "status":
            for name, info in status(args.base).items():
                if name not in names:
                    continue
                state = "running" if info["running"] else ("port busy (not ours)" if info["answering"] else "stopped")
                extra = info.get("error") or _where(info)
                print(f"{name:<9} {state:<16} {HOST}:{info['port']:<6} pid={info['pid']} {extra}")
    except (ServerError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
