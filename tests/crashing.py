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
    python tests/crashing.py apply --config dblog.yaml --target lake --at before-commit --commit 1 --marker FILE
        # the real `dblog apply --target lake --via local` dies at its Nth target commit made by
        # a merge (1: a batch's merge; 2: the change-of-shape commit of a batch that ends at one):
        # before-commit: the commit's files are written and the commit not made (Delta: delta-rs
        #   wrote the data files and its log commit was refused; Iceberg: the data files, manifests
        #   and the new metadata file are written, the catalog's pointer not moved);
        # after-commit: just after the commit returned, before the apply records anything else;
        # random (--seed S --max-delay SECONDS [--clock run|merge]): a thread SIGKILLs it a seeded
        #   random delay after the run starts (--clock merge: after its first merge begins), or
        #   at the run's end if it finishes first.
        # FILE gets JSON: the point, the phase reached, the commit number, the files the
        # table's directory gained since its merge began or its previous commit returned
        # ("new_files": the killed, or just made, commit's), seconds since the run began
        # ("elapsed") and since the merge began ("in_merge")
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
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


class _ApplyCrash:
    """The hooks of the ``apply`` mode: which merge commit the run is at, and dying there."""

    def __init__(self, at: str, commit: int, marker: Path, delay: float = 0.0, clock: str = "run"):
        self.at, self.commit, self.marker, self.delay, self.clock = at, commit, marker, delay, clock
        self.killer: threading.Thread | None = None
        self.phase, self.commits, self.in_merge = "start", 0, False
        self.dir: Path | None = None
        self.before: set[str] = set()
        self.t0 = self.t_merge = time.monotonic()

    def files(self) -> set[str]:
        if self.dir is None or not self.dir.is_dir():
            return set()
        return {str(p.relative_to(self.dir)) for p in self.dir.rglob("*") if p.is_file()}

    def die_here(self, **more) -> None:
        try:   # (a file renamed away while listed must not keep it alive)
            self.marker.write_text(json.dumps({"point": self.at, "phase": self.phase, "commit": self.commits,
                                               "new_files": sorted(self.files() - self.before),
                                               "elapsed": round(time.monotonic() - self.t0, 4),
                                               "in_merge": round(time.monotonic() - self.t_merge, 4)} | more))
        finally:
            die()

    # a commit made inside a merge: counted; ``run`` makes it, or is where it dies
    def committing(self, run, blocked=None):
        if not self.in_merge:
            return run()
        self.commits += 1
        n, self.phase = self.commits, f"commit {self.commits}"
        if self.at == "before-commit" and n == self.commit and blocked is not None:
            blocked(run)   # dies inside
        out = run()
        self.phase = f"committed {n}"
        if self.at == "after-commit" and n == self.commit:
            self.die_here()
        self.before = self.files()   # the next commit's files are new from here
        return out

    def start_killer(self) -> None:
        """The random kill: a thread that dies the process ``delay`` seconds from now."""
        def kill() -> None:
            time.sleep(self.delay)
            self.die_here(delay=self.delay, clock=self.clock)
        self.killer = threading.Thread(target=kill, daemon=True)
        self.killer.start()

    def install(self) -> None:
        from deltalake.table import TableMerger
        from pyiceberg.catalog.sql import SqlCatalog
        from pyiceberg.table import Transaction
        from airflow_provider_dblog.engine.targets import delta, iceberg
        hooks = self

        def merging(cls, where):
            real = cls.merge_batch

            def merge_batch(target, table, *args, **kwargs):
                hooks.dir = Path(where(target, table))
                hooks.before, hooks.in_merge, hooks.phase = hooks.files(), True, "merge"
                hooks.t_merge = time.monotonic()
                if hooks.at == "random" and hooks.clock == "merge" and hooks.killer is None:
                    hooks.start_killer()
                try:
                    return real(target, table, *args, **kwargs)
                finally:
                    hooks.in_merge, hooks.phase = False, "merged"
            cls.merge_batch = merge_batch
        merging(delta.DeltaTarget, lambda t, table: t.table_path(table))
        merging(iceberg.IcebergTarget, lambda t, table: t._load(table).location().removeprefix("file://"))

        def delta_blocked(run) -> None:
            # delta-rs writes the data files, then its commit: a directory where the next log
            # entry goes makes that commit fail, so we die with the files written and no commit
            from deltalake import DeltaTable
            entry = hooks.dir / "_delta_log" / f"{DeltaTable(str(hooks.dir)).version() + 1:020d}.json"
            entry.mkdir()
            try:
                run()
            except Exception as e:   # noqa: BLE001 - the refused commit, as wanted
                entry.rmdir()
                hooks.die_here(refused=type(e).__name__)
            entry.rmdir()
            print("crashing.py: the Delta commit went through past the blocked log entry", file=sys.stderr)
            os._exit(4)

        real_execute = TableMerger.execute
        TableMerger.execute = lambda merger: hooks.committing(lambda: real_execute(merger), delta_blocked)
        real_write = delta.write_deltalake
        delta.write_deltalake = lambda *a, **kw: hooks.committing(lambda: real_write(*a, **kw), delta_blocked)

        def iceberg_blocked(run) -> None:
            run()   # dies once the new metadata file is written, before the catalog's pointer moves
            print("crashing.py: the Iceberg commit wrote no metadata file", file=sys.stderr)
            os._exit(4)

        real_commit = Transaction.commit_transaction
        Transaction.commit_transaction = lambda txn: hooks.committing(lambda: real_commit(txn), iceberg_blocked)
        real_meta = SqlCatalog._write_metadata

        def write_metadata(*args, **kwargs):
            real_meta(*args, **kwargs)
            if hooks.in_merge and hooks.at == "before-commit" and hooks.commits == hooks.commit:
                hooks.die_here()
        SqlCatalog._write_metadata = staticmethod(write_metadata)


def apply(config: str, target: str, at: str, commit: int, marker: Path, seed: int, max_delay: float,
          clock: str) -> None:
    import random
    from airflow_provider_dblog import cli
    from airflow_provider_dblog.engine import apply as engine_apply

    hooks = _ApplyCrash(at, commit, marker, random.Random(seed).uniform(0, max_delay), clock)
    hooks.install()
    real_run = engine_apply.run_apply

    def run_apply(*args, **kwargs):
        hooks.t0 = time.monotonic()
        if at == "random" and clock == "run":
            hooks.start_killer()
        out = real_run(*args, **kwargs)
        hooks.phase = "done"
        if at == "random":   # finished before the delay: it dies at its end
            hooks.die_here(delay=hooks.delay, clock=clock)
        return out
    engine_apply.run_apply = run_apply
    cli.main(["--config", config, "apply", "--target", target, "--via", "local"])


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=("tail", "dump", "apply"))
    p.add_argument("--config", required=True)
    p.add_argument("--marker", required=True, type=Path)
    p.add_argument("--at-commit", type=int, default=4)
    p.add_argument("--pause-at-write", type=int, default=0)
    p.add_argument("--after-tmp", action="store_true")
    p.add_argument("--request")
    p.add_argument("--target", default="lake")
    p.add_argument("--at", choices=("before-commit", "after-commit", "random"), default="before-commit")
    p.add_argument("--commit", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-delay", type=float, default=1.0)
    p.add_argument("--clock", choices=("run", "merge"), default="run")
    a = p.parse_args()
    if a.what == "tail":
        code = tail(a.config, a.at_commit, a.marker, a.pause_at_write, a.after_tmp)
        if a.pause_at_write:
            sys.exit(code)  # a zombie that went on: what the command said
    elif a.what == "apply":
        apply(a.config, a.target, a.at, a.commit, a.marker, a.seed, a.max_delay, a.clock)
    else:
        dump(a.config, a.request, a.marker)
    sys.exit(3)  # reaching here means the crash point was never reached (or the tail paused and went on)
