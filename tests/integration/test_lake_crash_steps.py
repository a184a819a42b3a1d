"""SIGKILL of the real ``dblog apply`` into a lake table (issue 28) inside the commit
sequences that test_lake_crash.py does not reach (tests/crashing.py ``apply --in SCOPE``):

- a changelog table (``changelog: true``), one run of two batches, the first ending at a
  TRUNCATE: killed just after the changelog's commit and before the current-state table's
  merge (in each batch), inside the changelog's commit (its data files written, the commit
  not made), inside the TRUNCATE's change-of-shape commit, and at seeded random instants.
  At the kill the changelog holds every event below its own position once, in position
  order (and the ``truncate`` row at or below it), never behind the current-state table;
  the rerun leaves it holding every event once, the current-state table equal to the
  source, and a replay of the batch appends nothing and commits nothing;
- the rebuild of a quarantined table (a column narrowed, released by a full dump): killed
  inside and just after drop_table's emptying commit, just after the position's reset,
  just after it is set at the break, inside the first merge after, and at a random instant
  from the rebuild's first step; the rerun ends equal to the source, rebuilt once;
- the orphan sweep of a full dump (rows only the lake holds): killed inside the sweep's
  commit, just after it (before the sweep is recorded) and at a random instant of it; the
  orphans go exactly once, no live row with them.

Each kill has its own lake target of the same kind (an apply, a rebuild and a sweep are
per target), so one batch, quarantine or dump serves them all, and the killed applies run
two at a time (one per core). The tail is stopped for good before them, so the frontier
stays put. The reruns are the real apply in this process. Delta and Iceberg, each on one
source per sequence (the other source on the next): small tables, the set-up dumps in
this process. The master seed (DBLOG_LAKE_CRASH_SEED, else random) is in every message.
"""
from __future__ import annotations

import json
import os
import random
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake

from airflow_provider_dblog.engine.apply_batch import LocalApplier
from airflow_provider_dblog.engine.apply_plan import plan_table
from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.quarantine import breaks, rebuilt_at
from airflow_provider_dblog.engine.targets import open_target
from airflow_provider_dblog.engine.targets.changelog import POSITION_KEY, changelog_name
from helpers import crash, lake_target

SEED = int(os.environ.get("DBLOG_LAKE_CRASH_SEED") or random.SystemRandom().randrange(10**6))
APPLIED = "dblog.applied.src"
NARROW = {"mysql": "ALTER TABLE t MODIFY v SMALLINT", "postgres": "ALTER TABLE t ALTER COLUMN v TYPE smallint"}


class Lake:
    """One lake target's table ``t`` (and its changelog table), read with the kind's own library."""

    def __init__(self, cdc, name: str = "lake"):
        self.cdc, self.name, self.table = cdc, name, f"{cdc.db}.t"
        self.target = open_target(cdc.cfg.target(name))
        self.kind = self.target.config.kind

    def _delta(self, log: bool) -> DeltaTable:
        return DeltaTable(f"{self.target.root}/{changelog_name(self.table)}" if log else
                          self.target.table_path(self.table))

    def _ice(self, log: bool):
        return (self.target.catalog.load_table((self.target.namespace, changelog_name(self.table))) if log
                else self.target._load(self.table))

    def read(self, log: bool = False) -> pa.Table:
        data = self._delta(log).to_pyarrow_table() if self.kind == "delta" else self._ice(log).scan().to_arrow()
        return data.sort_by("_dblog_pos" if log else "id")

    def rows(self) -> list[dict]:
        return self.read().to_pylist()

    def version(self, log: bool = False):
        if self.kind == "delta":
            return self._delta(log).version()
        return self._ice(log).metadata_location

    def applied(self) -> str | None:
        pos = self.target.applied_pos("src", self.table)
        return pos.encode() if pos else None

    def log_pos(self) -> str:
        """The changelog's own position ("" if none), as each kind keeps it."""
        key = POSITION_KEY + "src"
        if self.kind == "iceberg":
            return self._ice(True).properties.get(key, "")
        return next((c[key] for c in self._delta(True).history() if key in c), "")

    def live_files(self, log: bool = False) -> set[str]:
        if self.kind == "delta":
            uris = self._delta(log).file_uris()
        else:
            uris = [task.file.file_path for task in self._ice(log).scan().plan_files()]
        return {os.path.basename(u) for u in uris}

    def metadata_file(self, log: bool = False) -> str | None:
        return os.path.basename(self._ice(log).metadata_location) if self.kind == "iceberg" else None

    def check(self, where: str, newest: bool = True) -> None:
        """No duplicate key, no delete stored as a row; ``newest``: the position is the one
        the newest commit carries (a rebuild's emptying commit carries none)."""
        data = self.read()
        assert pc.count_distinct(data["id"]).as_py() == data.num_rows, f"{where}: duplicate keys in {self.name}"
        assert "d" not in set(data["_dblog_op"].to_pylist()), f"{where}: a delete stored as a row"
        if newest:
            if self.kind == "delta":
                carried = self._delta(False).history(1)[0].get(APPLIED) or None
            else:
                carried = self._ice(False).properties.get(APPLIED) or None
            assert self.applied() == carried, f"{where}: applied {self.applied()}, newest commit {carried}"

    def not_live(self, info: dict, where: str, log: bool = False) -> None:
        """The data files (and Iceberg metadata) a killed commit wrote: on disk, none of them read."""
        written = {os.path.basename(f) for f in info["new_files"] if f.endswith(".parquet")}
        assert not written & self.live_files(log), f"{where}: a data file of the killed commit is read as rows"
        names = {os.path.basename(f) for f in info["new_files"]}
        assert self.metadata_file(log) not in names, f"{where}: the killed commit's metadata is the table's"


def _setup(src_db, make_cdc, targets: dict, rows: int = 30):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT, s VARCHAR(40)")
        cur.execute("INSERT INTO t (id, v, s) VALUES " + ", ".join(f"({i}, {i}, 'row {i}')"
                                                                   for i in range(1, rows + 1)))
    cdc = make_cdc(["t"], targets=targets)
    cdc.start_tail()
    cdc.dump_local("t")
    for name in targets:
        assert cdc.apply_local(name)[f"{cdc.db}.t"]["status"] == "applied"
    return cdc


def _writes(src_db, n: int, truncate: bool = False) -> None:
    """Updates (one key three times), a delete and re-insert of a key, an insert, a delete;
    ``truncate``: then a TRUNCATE, and rows again after it."""
    with src_db.cursor() as cur:
        cur.execute("UPDATE t SET v = v + 1 WHERE id %% 4 = %s", (n % 4,))
        for i in range(3):
            cur.execute("UPDATE t SET s = %s WHERE id = 1", (f"u{n}-{i}",))
        cur.execute("DELETE FROM t WHERE id = 2")
        cur.execute("INSERT INTO t (id, v, s) VALUES (2, %s, 'again')", (200 + n,))
        cur.execute("INSERT INTO t (id, v, s) VALUES (%s, 7, 'new')", (1000 + n,))
        cur.execute("DELETE FROM t WHERE id = %s", (3 + n,))
        if truncate:
            cur.execute("TRUNCATE TABLE t")
            cur.execute("INSERT INTO t (id, v, s) VALUES " + ", ".join(f"({i}, {i}, 'after')" for i in range(1, 21)))


def _kill(cdc, tmp_path, target: str, what: str, at: str, scope: str = "merge", commit: int = 1,
          seed: int = 0, max_delay: float = 1.0, clock: str = "run") -> dict:
    marker = tmp_path / f"marker-{target}-{abs(hash(what))}"
    return json.loads(crash("apply", cdc.path, marker, "--target", target, "--in", scope, "--at", at,
                            "--commit", str(commit), "--seed", str(seed), "--max-delay", f"{max_delay:.4f}",
                            "--clock", clock, timeout=120))


def _kill_all(cdc, tmp_path, kills: list[tuple]) -> list[dict]:
    """Each kill (``_kill``'s arguments: a target each) at once, two at a time (one per core)."""
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda k: _kill(cdc, tmp_path, *k[:-1], **k[-1]), kills))


# -- 1. changelog tables ------------------------------------------------------------------
def _cuts(cdc, upto: str) -> list[str]:
    """The positions of the TRUNCATEs of ``t`` at or below ``upto``."""
    return [p.encode() for p, v in cdc.store.schema_versions(f"{cdc.db}.t") if v.get("truncated")
            and p.encode() <= upto]


def _assert_log(cdc, lake: Lake, upto: str, where: str) -> None:
    """The changelog holds every event of ``t`` below ``upto`` once, in position order, its
    images exact, and a ``truncate`` row at each TRUNCATE at or below ``upto``."""
    log = lake.read(log=True)
    schema = cdc.source.table_schema(f"{cdc.db}.t")
    events = cdc.store.read_range(schema, None, Position.decode(upto))
    want = sorted([*zip(events["pos"].to_pylist(), events["op"].to_pylist()),
                   *((c, "truncate") for c in _cuts(cdc, upto))])
    got = list(zip(log["_dblog_pos"].to_pylist(), log["op"].to_pylist()))
    assert got == want, f"{where}: the changelog up to {upto} is not the events once each: " \
                        f"{len(got)} rows, {len(want)} wanted; first difference " \
                        f"{next((g, w) for g, w in zip(got + [None] * len(want), want + [None] * len(got)) if g != w)}"
    rows = log.filter(pc.not_equal(log["op"], "truncate"))
    for image in ("before", "after"):
        assert rows[image].to_pylist() == events[image].to_pylist(), f"{where}: {image} images differ"


CHANGELOG_POINTS = (   # one run of two batches (the first ends at a TRUNCATE): (what, at, scope, commit)
    ("the TRUNCATE batch, just after the changelog's commit, before the merge", "after-commit", "changelog", 1),
    ("the TRUNCATE batch, inside the changelog's commit", "before-commit", "changelog", 1),
    ("the TRUNCATE batch, inside its emptying commit (no rows merged)", "before-commit", "advance", 1),
    ("the next batch, just after the changelog's commit, before the merge", "after-commit", "changelog", 2),
    ("a random instant from the changelog's first append on", "random", "changelog", 0),   # scope: the clock
    ("a random instant of the run", "random", "run", 0))


def _changelog_kill(cdc, lake: Lake, pre: tuple, cut: str, frontier: str, point: tuple, info: dict,
                    where: str) -> None:
    """At the kill: each table consistent, the changelog every event below its position
    once, never behind the current state; then the rerun, and a replay appends nothing."""
    (_, at, scope, commit), (pre_rows, pre_pos, pre_log, planned) = point, pre
    lake.check(where)
    log_pos, pos = lake.log_pos(), lake.applied()
    _assert_log(cdc, lake, log_pos, where)
    assert log_pos in (pre_log, cut, frontier) and pos in (pre_pos, cut, frontier), where
    assert log_pos >= pos, f"{where}: the changelog ({log_pos}) is behind the current state ({pos})"
    if log_pos == pre_log:
        assert pos == pre_pos and lake.rows() == pre_rows, f"{where}: rows changed, the changelog did not"
    if scope == "changelog" and at == "after-commit":   # between the two tables' commits
        assert (log_pos, pos) == ((cut, pre_pos) if commit == 1 else (frontier, cut)), where
        assert lake.rows() == (pre_rows if commit == 1 else []), f"{where}: the merge is in"
        assert {os.path.basename(f) for f in info["new_files"] if f.endswith(".parquet")} \
            <= lake.live_files(log=True), f"{where}: the changelog's commit is not the table's"
    if scope == "changelog" and at == "before-commit":
        assert log_pos == pre_log and pos == pre_pos, where
        assert any(f.endswith(".parquet") for f in info["new_files"]), f"{where}: no data file written"
        lake.not_live(info, where, log=True)
    if scope == "advance":   # the TRUNCATE's emptying commit: the changelog has the TRUNCATE, the table not
        assert log_pos == cut and pos == pre_pos and lake.rows() == pre_rows, where
        lake.not_live(info, where)
    # the rerun, to the end
    res = cdc.apply_local(lake.name)[lake.table]
    assert res["status"] in ("applied", "up_to_date"), f"{where}: {res}"
    lake.check(f"{where} after the rerun")
    assert lake.log_pos() == lake.applied() == frontier, where
    _assert_log(cdc, lake, frontier, f"{where} after the rerun")
    cdc.assert_equal("t", target=lake.name)
    # the killed run's first batch replayed (a run that did not see its commits): nothing appended, no commit
    versions = lake.version(), lake.version(log=True)
    again = LocalApplier(lake.target, cdc.store, cdc.state, "src").apply_batch(planned)
    assert again.get("changelog_rows") == 0 and again["inserted"] == again["updated"] == 0, f"{where}: {again}"
    again = cdc.apply_local(lake.name)[lake.table]
    assert again["status"] == "up_to_date" and not again.get("changelog_rows"), f"{where}: {again}"
    assert (lake.version(), lake.version(log=True)) == versions, f"{where}: a replay made a commit"
    print(f"{where[1:-1]}: phase {info['phase']}")


@pytest.mark.parametrize("src_db,kind", [("mariadb", "delta"), ("postgres", "iceberg")], indirect=["src_db"])
def test_a_killed_apply_leaves_every_event_once_in_the_changelog(src_db, make_cdc, kind, tmp_path):
    names = [f"lake{i}" for i in range(len(CHANGELOG_POINTS))]   # one target per kill, all on one run's batches
    cdc = _setup(src_db, make_cdc, {n: lake_target(kind, tmp_path / n, changelog=True) for n in names})
    lakes = [Lake(cdc, n) for n in names]
    _writes(src_db, 0, truncate=True)
    _writes(src_db, 1)
    cdc.drain()
    cdc.stop_tail()   # for good: the frontier stays put (the killed runs and the reruns see the same batches)
    frontier = cdc.state.frontier().encode()
    schema = cdc.source.table_schema(f"{cdc.db}.t")
    pre = [(lake.rows(), lake.applied(), lake.log_pos(),   # and the first batch, as the killed run plans it
            plan_table(lake.target, cdc.store, cdc.state, "src", schema)) for lake in lakes]
    (cut,) = [c for c in _cuts(cdc, frontier) if c > pre[0][2]]
    assert pre[0][3].frontier.encode() == cut, "the first batch does not end at the TRUNCATE"
    fixed = [(n, what, at, scope, commit, {}) for n, (what, at, scope, commit) in zip(names, CHANGELOG_POINTS[:4])]
    infos = _kill_all(cdc, tmp_path, fixed)
    # the random kills' windows (one run's times): from the first append's start past the second batch's
    # merge; the run to there
    second = infos[3]
    windows = {"changelog": 1.5 * (second["elapsed"] - second["began"]["changelog"]),
               "run": second["elapsed"] + 2 * second["in_scope"]}
    rng = random.Random(SEED)
    infos += _kill_all(cdc, tmp_path, [(n, what, at, "changelog", 1, {"clock": clock, "seed": rng.randrange(10**9),
                                                                       "max_delay": windows[clock]})
                                       for n, (what, at, clock, _) in zip(names[4:], CHANGELOG_POINTS[4:])])
    for lake, p, point, info in zip(lakes, pre, CHANGELOG_POINTS, infos):
        where = f"[{kind} {src_db.kind}, target {lake.name}: {point[0]}; seed {SEED}; killed at {info}]"
        _changelog_kill(cdc, lake, p, cut, frontier, point, info, where)


# -- 2. the rebuild of a quarantined table -------------------------------------------------
REBUILD_POINTS = (   # (what, at, scope): the rebuild's steps (engine/quarantine.settle), then its merge
    ("inside drop_table's emptying commit", "before-commit", "drop"),
    ("just after the emptying commit", "after-commit", "drop"),
    ("just after the position's reset", "after-commit", "reset"),
    ("just after the position is set at the break", "after-commit", "advance"),
    ("inside the first merge after the rebuild", "before-commit", "merge"),
    ("a random instant of the rebuild", "random", "merge"))


@pytest.mark.parametrize("src_db,kind", [("postgres", "delta"), ("mariadb", "iceberg")], indirect=["src_db"])
def test_a_killed_quarantine_rebuild_ends_equal_to_the_source(src_db, make_cdc, kind, tmp_path):
    names = [f"lake{i}" for i in range(len(REBUILD_POINTS))]   # one target per kill: each rebuilds once
    cdc = _setup(src_db, make_cdc, {n: lake_target(kind, tmp_path / n) for n in names})
    table = f"{cdc.db}.t"
    _writes(src_db, 0)
    with src_db.cursor() as cur:   # a change the targets cannot follow, rows on each side of it
        cur.execute(NARROW[src_db.kind])
        cur.execute("UPDATE t SET v = -v WHERE id <= 5")
    cdc.drain()
    for n in names:
        assert cdc.apply_local(n)[table]["status"] == "quarantined"
    cdc.dump_local("t")   # the release: each target rebuilds at its next apply
    _writes(src_db, 1)
    cdc.drain()
    cdc.stop_tail()   # for good: the frontier stays put
    frontier = cdc.state.frontier().encode()
    last = breaks(json.loads(cdc.state.r.hget(cdc.state.k("quarantined"), table)))[-1].encode()
    lakes = [Lake(cdc, n) for n in names]
    pre = [(lake.rows(), lake.applied()) for lake in lakes]
    assert all(pos == last and rows for rows, pos in pre), (pre, last)   # the batches stopped at the break
    infos = _kill_all(cdc, tmp_path, [(n, what, at, scope, 1, {}) for n, (what, at, scope) in
                                      zip(names, REBUILD_POINTS[:-1])])
    # the random kill's window: from the rebuild's first step to past its merge's commit (one run's times)
    merged = infos[-1]
    window = 1.25 * (merged["elapsed"] - merged["began"]["drop"])
    infos.append(_kill(cdc, tmp_path, names[-1], REBUILD_POINTS[-1][0], "random", clock="drop",
                       seed=random.Random(SEED).randrange(10**9), max_delay=window))
    for lake, (pre_rows, pre_pos), (what, at, scope), info in zip(lakes, pre, REBUILD_POINTS, infos):
        n = lake.name
        where = f"[{kind} {src_db.kind}, target {n}: {what}; seed {SEED}; killed at {info}]"
        lake.check(where, newest=False)
        rows, pos = lake.rows(), lake.applied()
        expected = {"drop": (pre_rows if at == "before-commit" else [], pre_pos), "reset": ([], None),
                    "advance": ([], last), "merge": ([], last)}.get(scope)
        if at != "random":
            assert (rows, pos) == expected, f"{where}: {len(rows)} rows at {pos}, not {expected[1]}"
            recorded = rebuilt_at(cdc.state, table, n)   # recorded once the position is at the break
            assert (recorded.encode() if recorded else None) == (last if scope == "merge" else None), where
        else:   # somewhere in the run: before the rebuild, inside it, or past it
            assert (rows, pos) in ((pre_rows, pre_pos), ([], pre_pos), ([], None), ([], last)) \
                or pos == frontier, f"{where}: {len(rows)} rows at {pos}"
        if at == "before-commit":
            lake.not_live(info, where)
        res = cdc.apply_local(n)[table]
        assert res["status"] in ("applied", "up_to_date"), f"{where}: {res}"
        lake.check(f"{where} after the rerun")
        assert lake.applied() == frontier and rebuilt_at(cdc.state, table, n).encode() == last, where
        cdc.assert_equal("t", target=n)
        version = lake.version()
        assert cdc.apply_local(n)[table]["status"] == "up_to_date" and lake.version() == version, where
        print(f"{where[1:-1]}: phase {info['phase']}")


# -- 3. the orphan sweep of a full dump ---------------------------------------------------
def _ghosts(lake: Lake, ids: list[int]) -> None:
    """Rows written into the lake table by someone else (an old position: below any dump)."""
    old = Position(0, 1, 0).encode()
    rows = pa.table({"id": ids, "v": [0] * len(ids), "s": ["ghost"] * len(ids), "_dblog_pos": [old] * len(ids),
                     "_dblog_op": ["insert"] * len(ids)})
    if lake.kind == "delta":
        dt = lake._delta(False)
        arrow = pa.schema(dt.schema().to_arrow())
        write_deltalake(dt, rows.cast(pa.schema([arrow.field(c) for c in rows.column_names])), mode="append")
    else:
        t = lake._ice(False)
        arrow = t.scan().to_arrow().schema
        t.append(rows.cast(pa.schema([arrow.field(c) for c in rows.column_names])))


SWEEP_POINTS = (("inside the sweep's commit", "before-commit"), ("just after the sweep's commit", "after-commit"),
                ("a random instant of the sweep", "random"))


@pytest.mark.parametrize("src_db,kind", [("mariadb", "delta"), ("postgres", "iceberg")], indirect=["src_db"])
def test_a_killed_orphan_sweep_deletes_the_orphans_once_and_nothing_else(src_db, make_cdc, kind, tmp_path):
    names = [f"lake{i}" for i in range(len(SWEEP_POINTS))]   # one target per kill: each sweeps once
    cdc = _setup(src_db, make_cdc, {n: lake_target(kind, tmp_path / n) for n in names})
    table = f"{cdc.db}.t"
    with src_db.cursor() as cur:
        cur.execute("DELETE FROM t WHERE id = 7")   # its ghost below comes back after its delete
    cdc.drain()
    for n in names:
        cdc.apply_local(n)
        _ghosts(Lake(cdc, n), [10**6, 7])
        assert not cdc.compare("t", n).equal
    rid = cdc.dump_local("t")
    cdc.stop_tail()   # for good: the frontier stays put
    frontier = cdc.state.frontier().encode()
    infos = _kill_all(cdc, tmp_path, [(n, what, at, "sweep", 1, {}) for n, (what, at) in
                                      zip(names, SWEEP_POINTS[:-1])])
    window = 1.5 * infos[1]["in_scope"]   # the random kill's: the sweep's start to past its commit
    infos.append(_kill(cdc, tmp_path, names[-1], SWEEP_POINTS[-1][0], "random", "sweep", clock="sweep",
                       seed=random.Random(SEED).randrange(10**9), max_delay=window))
    for n, (what, at), info in zip(names, SWEEP_POINTS, infos):
        lake = Lake(cdc, n)
        where = f"[{kind} {src_db.kind}, target {n}: {what}; seed {SEED}; killed at {info}]"
        lake.check(where)
        assert lake.applied() == frontier, f"{where}: the dump's batch is not in"
        ids = set(lake.read()["id"].to_pylist())
        ghosts = {10**6, 7} & ids
        assert ghosts in ({10**6, 7}, set()), f"{where}: orphans {ghosts} left"   # one commit: both or none
        if at == "before-commit":
            assert ghosts == {10**6, 7}, f"{where}: the sweep's commit was made"
            lake.not_live(info, where)
        if at == "after-commit":
            assert not ghosts, f"{where}: the orphans are still there"
        pending = cdc.state.pending_sweep(table, n) is not None
        # (killed once the sweep's commit returned: its record may be cleared already)
        assert pending or info["phase"] in ("done", "sweep done"), f"{where}: the sweep is recorded as done"
        res = cdc.apply_local(n)[table]
        deleted = res.get("orphans_deleted", 0)
        # the orphans go exactly once; a rerun after the commit reports the count the killed run deleted
        assert deleted == (2 if pending else 0), f"{where}: {res}"
        assert cdc.state.pending_sweep(table, n) is None, where
        cdc.assert_equal("t", target=n)
        lake.check(f"{where} after the rerun")
        version = lake.version()
        again = cdc.apply_local(n)[table]
        assert not again.get("orphans_deleted") and lake.version() == version, f"{where}: {again}"
        print(f"{where[1:-1]}: phase {info['phase']}; request {rid} records "
              f"{cdc.state.request(rid).get(f'swept:{table}:{n}')}")
