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
        # the real `dblog apply --target lake --via local` dies at the Nth target commit made
        # inside one kind of target operation, --in SCOPE (counted over the run):
        #   merge (default: a batch's merge_batch; 1: its merge, 2: the change-of-shape commit of
        #     a batch that ends at one), changelog (append_changelog: a changelog table's append;
        #     a widening's rewrite first), drop / reset / advance (drop_table, reset_applied,
        #     advance_applied: a quarantine's rebuild, an empty batch's position), sweep
        #     (delete_orphans: a full dump's orphan sweep);
        # before-commit: the commit's files are written and the commit not made (Delta: delta-rs
        #   wrote the data files and its log commit was refused; Iceberg: the data files, manifests
        #   and the new metadata file are written, the catalog's pointer not moved);
        # after-commit: just after the commit returned, before the apply records anything else;
        # random (--seed S --max-delay SECONDS [--clock run|SCOPE]): a thread SIGKILLs it a seeded
        #   random delay after the run starts (--clock SCOPE: after that operation first begins),
        #   or at the run's end if it finishes first.
        # FILE gets JSON: the point, the counted scope, the phase reached (the operation the run
        # is in, "commit N"/"committed N" of the counted one, "merged"/"<scope> done" after), the
        # commit number, the files the table's directory gained since the counted operation began
        # or its previous commit returned ("new_files": the killed, or just made, commit's),
        # seconds since the run began ("elapsed") and since the counted operation began
        # ("in_scope"; "in_merge" is the same number), and when each operation first began
        # ("began": {scope: seconds into the run})
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
        def read(self, table, predicates, dest, keep_file=True):
            (window,) = [w for w in state.open_windows() if w.request == request]
            marker.write_text(window.id)
            die()
    DumpRunner(open_source(scfg), state, EventStore(cfg.storage_root, scfg.name), DyingReader(),
               cfg.dump).run(request)


# the target operations an ``apply`` run's commits are made in (``--in``): the method that
# is the operation, and which of its arguments is the table
SCOPES = {"merge": ("merge_batch", 0), "changelog": ("append_changelog", 0), "drop": ("drop_table", 0),
          "reset": ("reset_applied", 1), "advance": ("advance_applied", 1), "sweep": ("delete_orphans", 0)}


class _ApplyCrash:
    """The hooks of the ``apply`` mode: which target operation (scope) the run is in, which
    commit of the counted scope it is at, and dying there."""

    def __init__(self, at: str, commit: int, marker: Path, delay: float = 0.0, clock: str = "run",
                 scope: str = "merge"):
        self.at, self.commit, self.marker, self.delay, self.clock = at, commit, marker, delay, clock
        self.scope, self.active = scope, None   # the counted scope; the one the run is in
        self.killer: threading.Thread | None = None
        self.phase, self.commits = "start", 0
        self.began: dict[str, float] = {}   # seconds into the run each scope first began
        self.dir: Path | None = None
        self.before: set[str] = set()
        self.t0 = self.t_scope = time.monotonic()
        self.dying = threading.Lock()

    def files(self) -> set[str]:
        if self.dir is None or not self.dir.is_dir():
            return set()
        return {str(p.relative_to(self.dir)) for p in self.dir.rglob("*") if p.is_file()}

    def die_here(self, **more) -> None:
        # the random killer thread and the run's end can both get here: one writes the marker and
        # dies, the other waits for that (two writes at once left the marker holding both, mixed)
        self.dying.acquire()
        try:   # (a file renamed away while listed must not keep it alive)
            in_scope = round(time.monotonic() - self.t_scope, 4)
            self.marker.write_text(json.dumps({"point": self.at, "scope": self.scope, "phase": self.phase,
                                               "commit": self.commits,
                                               "new_files": sorted(self.files() - self.before),
                                               "elapsed": round(time.monotonic() - self.t0, 4),
                                               "in_scope": in_scope, "in_merge": in_scope,
                                               "began": dict(self.began)} | more))
        finally:
            die()

    # a commit made inside the counted scope: counted; ``run`` makes it, or is where it dies
    def committing(self, run, blocked=None):
        if self.active != self.scope:
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

    def scoped(self, cls, name: str, where) -> None:
        """``cls``'s method of scope ``name`` marks the run as in it (``where(target, table)``:
        the directory of the table whose files the counted scope's commits write)."""
        method, arg = SCOPES[name]
        real, hooks = getattr(cls, method), self

        def operation(target, *args, **kwargs):
            outer, hooks.active, hooks.phase = hooks.active, name, name
            hooks.began.setdefault(name, round(time.monotonic() - hooks.t0, 4))
            if name == hooks.scope:
                hooks.dir = where(target, args[arg])
                hooks.before, hooks.t_scope = hooks.files(), time.monotonic()
            if hooks.at == "random" and hooks.clock == name and hooks.killer is None:
                hooks.start_killer()
            try:
                return real(target, *args, **kwargs)
            finally:
                hooks.active, hooks.phase = outer, "merged" if name == "merge" else f"{name} done"
        setattr(cls, method, operation)

    def install(self, kind: str) -> None:
        """The hooks of a ``kind`` target (the other kind's library is never imported: a
        Delta run starts about a second sooner without pyiceberg)."""
        from airflow_provider_dblog.engine.targets.changelog import changelog_name
        from airflow_provider_dblog.engine.targets.pg_tables import target_table_name
        named = {name: changelog_name if name == "changelog" else target_table_name for name in SCOPES}
        if kind == "delta":
            self._install_delta(named)
        else:
            assert kind == "iceberg", kind
            self._install_iceberg(named)

    def _install_delta(self, named: dict) -> None:
        from deltalake import DeltaTable
        from deltalake.table import TableMerger
        from airflow_provider_dblog.engine.targets import delta, delta_changelog
        hooks = self
        for name in SCOPES:
            self.scoped(delta.DeltaTarget, name, lambda t, table, n=named[name]: Path(f"{t.root}/{n(table)}"))

        def blocked(run) -> None:
            # delta-rs writes the data files, then its commit: a directory where the next log
            # entry goes makes that commit fail, so we die with the files written and no commit
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
        TableMerger.execute = lambda merger: hooks.committing(lambda: real_execute(merger), blocked)
        for module in (delta, delta_changelog):   # each binds its own write_deltalake
            module.write_deltalake = (lambda real: lambda *a, **kw: hooks.committing(
                lambda: real(*a, **kw), blocked))(module.write_deltalake)

    def _install_iceberg(self, named: dict) -> None:
        from pyiceberg.catalog.sql import SqlCatalog
        from pyiceberg.exceptions import NoSuchTableError
        from pyiceberg.table import Transaction
        from airflow_provider_dblog.engine.targets import iceberg
        hooks = self

        def where(t, table, n):
            try:
                loaded = t.catalog.load_table((t.namespace, n(table)))
            except NoSuchTableError:   # (created inside the operation: its files are not listed)
                return None
            return Path(loaded.location().removeprefix("file://"))
        for name in SCOPES:
            self.scoped(iceberg.IcebergTarget, name, lambda t, table, n=named[name]: where(t, table, n))

        def blocked(run) -> None:
            run()   # dies once the new metadata file is written, before the catalog's pointer moves
            print("crashing.py: the Iceberg commit wrote no metadata file", file=sys.stderr)
            os._exit(4)

        real_commit = Transaction.commit_transaction
        Transaction.commit_transaction = lambda txn: hooks.committing(lambda: real_commit(txn), blocked)
        real_meta = SqlCatalog._write_metadata

        def write_metadata(*args, **kwargs):
            real_meta(*args, **kwargs)
            if hooks.active == hooks.scope and hooks.at == "before-commit" and hooks.commits == hooks.commit:
                hooks.die_here()
        SqlCatalog._write_metadata = staticmethod(write_metadata)


def apply(config: str, target: str, at: str, commit: int, marker: Path, seed: int, max_delay: float,
          clock: str, scope: str = "merge") -> None:
    import random
    from airflow_provider_dblog import cli
    from airflow_provider_dblog.engine import apply as engine_apply
    from airflow_provider_dblog.engine.config import load_config

    hooks = _ApplyCrash(at, commit, marker, random.Random(seed).uniform(0, max_delay), clock, scope)
    hooks.install(load_config(config).target(target).kind)
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
    p.add_argument("--clock", choices=("run", *SCOPES), default="run")
    p.add_argument("--in", dest="scope", choices=tuple(SCOPES), default="merge")
    a = p.parse_args()
    if a.what == "tail":
        code = tail(a.config, a.at_commit, a.marker, a.pause_at_write, a.after_tmp)
        if a.pause_at_write:
            sys.exit(code)  # a zombie that went on: what the command said
    elif a.what == "apply":
        apply(a.config, a.target, a.at, a.commit, a.marker, a.seed, a.max_delay, a.clock, a.scope)
    else:
        dump(a.config, a.request, a.marker)
    sys.exit(3)  # reaching here means the crash point was never reached (or the tail paused and went on)
