"""SIGKILL of the real ``dblog apply`` into a lake table (issue 28), Delta Lake and Iceberg
(one source each; both sources meet both kinds in test_lake_crash_steps.py): at fixed points (a merge's commit refused after its data files are
written, just after a commit, between a batch's merge and its change-of-shape commit,
inside that second commit) and at seeded random instants (tests/crashing.py ``apply``).

Each crash runs on its own batch of a 3000-row table (a full dump with writes going on,
then batches of updates, deletes, inserts, a delete and re-insert of the same key, an
insert deleted again, and ADD COLUMNs). At the crash the table holds no duplicate key,
its applied position is the one its newest commit carries, the files the killed commit
wrote are on disk but none of them is a row, and a batch is in or out whole; the run
then finishes, the table equals the source row for row, a replay of the batch makes no
commit, and one more apply changes neither the version nor the rows. The lake tables are
read with ``deltalake`` / ``pyiceberg`` themselves.

The master seed (DBLOG_LAKE_CRASH_SEED, else random) is in every assertion message;
DBLOG_LAKE_CRASH_RANDOM sets how many random kills each case runs (default 2).
"""
from __future__ import annotations

import json
import os
import random
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from airflow_provider_dblog.engine.apply_batch import LocalApplier
from airflow_provider_dblog.engine.apply_plan import plan_table
from airflow_provider_dblog.engine.targets import open_target
from helpers import crash

ROWS = 3000
SEED = int(os.environ.get("DBLOG_LAKE_CRASH_SEED") or random.SystemRandom().randrange(10**6))
RANDOM_KILLS = int(os.environ.get("DBLOG_LAKE_CRASH_RANDOM", "2"))
KEY = "dblog.applied.src"


class Writes:
    """The source's writes, with the set of keys it holds (all writes go through here)."""

    def __init__(self, src_db, seed: int):
        self.src_db, self.rng = src_db, random.Random(seed)
        self.alive, self.next_id, self.n = set(range(1, ROWS + 1)), ROWS + 1, 0

    def _row(self, k: int) -> tuple:
        return k, self.rng.randint(-10**6, 10**6), f"b{self.n}-{k}", f"{k % 1000}.{self.rng.randint(0, 99):02d}"

    def batch(self, updates: int = 40, deletes: int = 10, inserts: int = 10, reinserts: int = 3) -> None:
        self.n += 1
        ins = "INSERT INTO t (id, v, s, d) VALUES (%s, %s, %s, %s)"
        with self.src_db.cursor() as cur:
            for k in self.rng.sample(sorted(self.alive), updates):
                cur.execute("UPDATE t SET v = v + 1, s = %s WHERE id = %s", (f"u{self.n}-{k}", k))
            for k in self.rng.sample(sorted(self.alive), deletes):
                cur.execute("DELETE FROM t WHERE id = %s", (k,))
                self.alive.discard(k)
            for _ in range(inserts):
                cur.execute(ins, self._row(self.next_id))
                self.alive.add(self.next_id)
                self.next_id += 1
            for k in self.rng.sample(sorted(self.alive), reinserts):   # the same key gone and back
                cur.execute("DELETE FROM t WHERE id = %s", (k,))
                cur.execute(ins, self._row(k))
            k, self.next_id = self.next_id, self.next_id + 1   # a key that never reaches the target
            cur.execute(ins, self._row(k))
            cur.execute("DELETE FROM t WHERE id = %s", (k,))
            k = self.rng.choice(sorted(self.alive))   # gone, back, changed
            cur.execute("DELETE FROM t WHERE id = %s", (k,))
            cur.execute(ins, self._row(k))
            cur.execute("UPDATE t SET s = 'again' WHERE id = %s", (k,))


class Lake:
    """The lake table, read with its own library (never through the apply)."""

    def __init__(self, cdc, kind: str):
        self.kind, self.table = kind, f"{cdc.db}.t"
        self.target = open_target(cdc.cfg.target("lake"))

    def exists(self) -> bool:
        return self.target.exists(self.table)

    def _ice(self):
        return self.target._load(self.table)   # pyiceberg's Table from the SQL catalog

    def read(self) -> pa.Table:
        if self.kind == "delta":
            return DeltaTable(self.target.table_path(self.table)).to_pyarrow_table()
        return self._ice().scan().to_arrow()

    def rows(self) -> list[dict]:
        return self.read().sort_by("id").to_pylist() if self.exists() else []

    def version(self):
        if self.kind == "delta":
            return DeltaTable(self.target.table_path(self.table)).version()
        t = self._ice()
        return t.metadata_location, t.current_snapshot() and t.current_snapshot().snapshot_id

    def applied(self) -> str | None:
        pos = self.target.applied_pos("src", self.table) if self.exists() else None
        return pos.encode() if pos else None

    def commit_position(self) -> str | None:
        """The applied position the table's newest commit carries."""
        if self.kind == "delta":
            return DeltaTable(self.target.table_path(self.table)).history(1)[0].get(KEY) or None
        t = self._ice()
        prop, snap = t.properties.get(KEY) or None, t.current_snapshot()
        if snap is not None:   # the snapshot of the rows says the same
            assert (snap.summary.get(KEY) or None) == prop, (prop, snap.summary)
        return prop

    def location(self) -> Path:
        if self.kind == "delta":
            return Path(self.target.table_path(self.table))
        return Path(self._ice().location().removeprefix("file://"))

    def live_files(self) -> set[str]:
        """The names of the data files the table's current version reads."""
        if self.kind == "delta":
            uris = DeltaTable(self.target.table_path(self.table)).file_uris()
        else:
            uris = [task.file.file_path for task in self._ice().scan().plan_files()]
        return {os.path.basename(u) for u in uris}

    def metadata_file(self) -> str | None:
        return os.path.basename(self._ice().metadata_location) if self.kind == "iceberg" else None

    def check(self, where: str) -> None:
        """No duplicate key, no delete stored as a row, the position that of the newest commit."""
        if not self.exists():
            return
        data = self.read()
        assert pc.count_distinct(data["id"]).as_py() == data.num_rows, f"{where}: duplicate keys in the lake table"
        assert "d" not in set(data["_dblog_op"].to_pylist()), f"{where}: a delete stored as a row"
        assert self.applied() == self.commit_position(), (f"{where}: applied position {self.applied()} is not "
                                                          f"the newest commit's {self.commit_position()}")


def _crash_one(cdc, lake: Lake, tmp_path: Path, what: str, at: str, commit: int = 1, evolve: bool = False,
               seed: int = 0, max_delay: float = 1.0, clock: str = "run") -> dict:
    """One batch (already written and drained), the apply killed at ``at``, then finished."""
    where = f"[{lake.kind} {cdc.sdb.kind}: {what}; seed {SEED}]"
    started = time.monotonic()
    cdc.drain()
    cdc.stop_tail()   # the frontier stays put: the killed run and the run after it see one batch
    try:
        frontier = cdc.state.frontier().encode()
        pre_rows, pre_pos = lake.rows(), lake.applied()
        schema = cdc.source.refresh_schema(f"{cdc.db}.t")
        planned = plan_table(lake.target, cdc.store, cdc.state, "src", schema) if lake.exists() else None
        marker = tmp_path / f"marker-{what.replace(' ', '_')}"
        info = json.loads(crash("apply", cdc.path, marker, "--target", "lake", "--at", at, "--commit", str(commit),
                                "--seed", str(seed), "--max-delay", f"{max_delay:.4f}", "--clock", clock,
                                timeout=180))
        where = f"{where[:-1]}; killed at {info}]"
        # at the crash: consistent, and the batch in or out whole
        lake.check(f"{where} after the kill")
        written = sorted(f for f in info["new_files"] if f.endswith(".parquet"))   # by the commit killed or made
        if at == "before-commit":
            assert written, f"{where}: the killed commit wrote no data file"
            assert lake.applied() == pre_pos, f"{where}: the position moved without its commit"
            assert not evolve or lake.rows() != pre_rows, f"{where}: the merge before the change is not in"
        crashed_pos = lake.applied()
        if not evolve:
            assert crashed_pos in (pre_pos, frontier), f"{where}: position {crashed_pos}, not {pre_pos} or {frontier}"
            if crashed_pos == pre_pos:
                assert lake.rows() == pre_rows, f"{where}: rows changed, the position did not"
        if at == "after-commit" and not evolve:
            assert crashed_pos == frontier, f"{where}: the commit did not move the position to the batch's end"
        if at == "after-commit" and evolve and commit == 1:   # the merge in, the position where it was
            assert crashed_pos == pre_pos and lake.rows() != pre_rows, f"{where}: not between the two commits"
        location = lake.location()
        for f in written:
            assert (location / f).is_file(), f"{where}: {f} is gone"
        if at == "after-commit":   # the hook's commit is the table's: its files are read
            assert written and {os.path.basename(f) for f in written} <= lake.live_files(), \
                f"{where}: the commit just made is not the table's"
        # the files of a commit that was not made (a random kill inside one included) are no rows
        uncommitted = at == "before-commit" or (not evolve and crashed_pos == pre_pos)
        if uncommitted:
            assert not {os.path.basename(f) for f in written} & lake.live_files(), \
                f"{where}: a data file of the killed commit is read as rows"
            assert lake.metadata_file() not in {os.path.basename(f) for f in info["new_files"]}, \
                f"{where}: the killed commit's metadata is the table's"
        crashed_version, crashed_rows = lake.version(), lake.rows()
        if planned is not None and planned.result is None and crashed_pos == frontier:
            # the same batch again, as a run that did not see its commit would: nothing changes
            again = LocalApplier(lake.target, cdc.store, cdc.state, "src").apply_batch(planned)
            assert again["inserted"] == again["updated"] == again["deleted"] == 0, f"{where}: replay {again}"
            assert lake.version() == crashed_version and lake.rows() == crashed_rows, \
                f"{where}: the replayed batch changed the table"
        # the run again, to the end
        res = cdc.apply_local("lake")[f"{cdc.db}.t"]
        assert res["status"] in ("applied", "up_to_date"), f"{where}: {res}"
        if crashed_pos == frontier:
            assert res["status"] == "up_to_date" and lake.version() == crashed_version, \
                f"{where}: a batch applied before the crash was applied again: {res}"
        cdc.assert_equal("t", target="lake")
        lake.check(f"{where} after the run")
        assert lake.applied() == frontier, f"{where}: applied {lake.applied()}, frontier {frontier}"
        if uncommitted:
            assert not {os.path.basename(f) for f in written} & lake.live_files(), \
                f"{where}: a data file of the killed commit became rows"
        version, rows = lake.version(), lake.rows()
        again = cdc.apply_local("lake")[f"{cdc.db}.t"]
        assert again["status"] == "up_to_date", f"{where}: {again}"
        assert lake.version() == version and lake.rows() == rows, f"{where}: one more apply changed the table"
        print(f"{what}: {time.monotonic() - started:.1f}s (the killed run {info['elapsed']:.2f}s)")
        return info
    finally:
        cdc.start_tail()


# each lake kind with one source (the kill points are the target's; each source's positions and
# events meet both kinds in test_lake_crash_steps.py's pairs, the other way round)
@pytest.mark.parametrize("src_db,lake_kind", [("mariadb", "iceberg"), ("postgres", "delta")], indirect=["src_db"])
def test_sigkill_of_a_lake_apply_neither_loses_nor_doubles_a_batch(src_db, make_cdc, lake_kind, tmp_path):
    rng = random.Random(SEED)
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT, s VARCHAR(40), d DECIMAL(10,2)")
        cur.execute("INSERT INTO t (id, v, s, d) SELECT seq, seq, CONCAT('row ', seq), seq / 4 FROM "
                    + src_db.series(ROWS))
    cdc = make_cdc(["t"], lake=lake_kind)
    cdc.start_tail()
    lake = Lake(cdc, lake_kind)
    writes = Writes(src_db, rng.randrange(10**9))

    # a full dump with writes going on; its batch killed once its data files are written
    stop, errors = threading.Event(), []

    def writing() -> None:
        try:
            while not stop.is_set():
                writes.batch(updates=5, deletes=2, inserts=2, reinserts=1)
        except BaseException as e:   # surfaced below
            errors.append(e)
    writer = threading.Thread(target=writing, daemon=True)
    writer.start()
    try:
        cdc.dump_local("t")
    finally:
        stop.set()
        writer.join(60)
    assert not errors, errors
    _crash_one(cdc, lake, tmp_path, "the dump's batch, before its commit", "before-commit")

    writes.batch()
    timing = _crash_one(cdc, lake, tmp_path, "a batch, just after its commit", "after-commit")
    writes.batch()
    _crash_one(cdc, lake, tmp_path, "a batch rewriting files, before its commit", "before-commit")

    # a batch that ends at a change of shape: its merge, then the change's commit
    for i, (at, commit, what) in enumerate((("after-commit", 1, "between a merge and its change of shape"),
                                             ("before-commit", 2, "inside a change-of-shape commit"))):
        writes.batch()
        cdc.drain()
        with src_db.cursor() as cur:
            cur.execute(f"ALTER TABLE t ADD COLUMN c{i} INT NULL")
            cur.execute(f"UPDATE t SET c{i} = id WHERE id <= 50")
        writes.batch(updates=10, deletes=3, inserts=3, reinserts=1)
        _crash_one(cdc, lake, tmp_path, what, at, commit=commit, evolve=True)

    # seeded random instants: of the merge (from its start: its writes and commits), and of a whole run
    # (the windows: how long the plain batch's run took from its start and from its merge's start to its commit's end)
    windows = {"merge": max(0.02, timing["in_merge"]), "run": max(0.05, 1.25 * timing["elapsed"])}
    phases = []
    for i in range(RANDOM_KILLS):
        clock = ("merge", "run")[i % 2]
        writes.batch()
        info = _crash_one(cdc, lake, tmp_path, f"random kill {i}", "random", seed=rng.randrange(10**9),
                          max_delay=windows[clock], clock=clock)
        phases.append((clock, info["phase"]))
    print(f"[{lake_kind} {src_db.kind}] seed {SEED}: random kills (clock, phase): {phases}, windows {windows}")
    cdc.assert_equal("t", target="lake")
