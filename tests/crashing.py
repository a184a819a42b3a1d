"""Processes that die by SIGKILL at a chosen point, for the crash tests (a crash test crashes:
no exception, no ``finally``, no handler runs). Run as a script::

    python tests/crashing.py tail --config dblog.yaml --at-commit 4 --marker FILE
        # the tail dies inside its 4th checkpoint commit: that segment's files are written,
        # its checkpoint never moves; FILE gets the position it was about to commit
    python tests/crashing.py tail --config dblog.yaml --pause-at-write 1 --marker FILE
        # the tail stops itself (SIGSTOP) inside its first segment write, after its lease
        # renewal: a zombie once continued (SIGCONT); FILE gets the segment's start
        # (--after-tmp: once the file's temporary copy is written, before its rename)
    python tests/crashing.py dump --config dblog.yaml --request ID --marker FILE
        # a dump dies inside its next chunk's select, between the LW and the HW;
        # FILE gets the window's id
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def tail(config: str, at_commit: int, marker: Path, pause_at_write: int = 0, after_tmp: bool = False) -> int:
    from airflow_provider_dblog.cli import main
    from airflow_provider_dblog.engine import store
    from airflow_provider_dblog.engine.state import RedisState

    if pause_at_write:
        real_write, writes = store.EventStore.write_log_segment, [0]
        real_parquet = store.pq.write_table

        def write_then_pause(*args, **kwargs):
            real_parquet(*args, **kwargs)
            os.kill(os.getpid(), signal.SIGSTOP)  # the temporary file written, not renamed

        def write_log_segment(self, table, checkpoint, *args, **kwargs):
            writes[0] += 1
            if writes[0] != pause_at_write:
                return real_write(self, table, checkpoint, *args, **kwargs)
            marker.write_text(checkpoint.encode())
            if not after_tmp:
                os.kill(os.getpid(), signal.SIGSTOP)  # here until SIGCONT
                return real_write(self, table, checkpoint, *args, **kwargs)
            store.pq.write_table = write_then_pause
            try:
                return real_write(self, table, checkpoint, *args, **kwargs)
            finally:
                store.pq.write_table = real_parquet
        store.EventStore.write_log_segment = write_log_segment
        at_commit = 0

    real, calls = RedisState.commit, [0]

    def commit(self, token, pos, *args, **kwargs):
        calls[0] += 1
        if at_commit and calls[0] == at_commit:
            marker.write_text(pos.encode())
            die()
        return real(self, token, pos, *args, **kwargs)
    RedisState.commit = commit
    return main(["--config", config, "tail", "--seconds", "600"])


def dump(config: str, request: str, marker: Path) -> None:
    from airflow_provider_dblog.engine.config import load_config
    from airflow_provider_dblog.engine.dump import DumpRunner
    from airflow_provider_dblog.engine.sources import open_source
    from airflow_provider_dblog.engine.state import RedisState
    from airflow_provider_dblog.engine.store import EventStore

    cfg = load_config(config)
    scfg = cfg.source()
    state = RedisState(cfg.redis_url, cfg.state_prefix, scfg.name)

    class DyingReader:
        def read(self, table, predicates, dest):
            (window,) = [w for w in state.open_windows() if w.request == request]
            marker.write_text(window.id)
            die()
    DumpRunner(open_source(scfg), state, EventStore(cfg.storage_root, scfg.name), DyingReader(),
               cfg.dump).run(request)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=("tail", "dump"))
    p.add_argument("--config", required=True)
    p.add_argument("--marker", required=True, type=Path)
    p.add_argument("--at-commit", type=int, default=4)
    p.add_argument("--pause-at-write", type=int, default=0)
    p.add_argument("--after-tmp", action="store_true")
    p.add_argument("--request")
    a = p.parse_args()
    if a.what == "tail":
        code = tail(a.config, a.at_commit, a.marker, a.pause_at_write, a.after_tmp)
        if a.pause_at_write:
            sys.exit(code)  # a zombie that went on: what the command said
    else:
        dump(a.config, a.request, a.marker)
    sys.exit(3)  # reaching here means the crash point was never reached (or the tail paused and went on)
