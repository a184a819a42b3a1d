"""Issue 28, break round 3 findings, fixed: a value a lake refuses whose row is fixed at the
source past a change of shape (engine/apply_hold.py: ``released``), and a key a Delta table
holds twice, collapsed after the MERGE that sees it (engine/targets/delta_keys.py).

The collapse tests drive ``DeltaTarget.merge_batch`` on a Delta table of a temporary
directory (no server); the held-value tests run the whole CDC against the private
PostgreSQL (both lake kinds, and the PostgreSQL target beside them, which holds every
value)."""
from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from airflow_provider_dblog.engine.config import TargetConfig
from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.schema import Column, TableSchema
from airflow_provider_dblog.engine.targets import open_target
from airflow_provider_dblog.engine.targets.delta_keys import COLLAPSED
from airflow_provider_dblog.engine.targets.delta_maintain import APPLIED
from helpers import lake_append_behind, lake_target

SOURCE = "src"
T = TableSchema("app", "t", (Column("id", "int32", False), Column("v", "int64")), ("id",))
POSTGRES = pytest.mark.parametrize("src_db", ["postgres"], indirect=True)


def _flat(rows: list[tuple]) -> pa.Table:
    """A batch as the apply hands it to merge_batch: (id, v, op, position) rows."""
    return pa.table({"id": pa.array([r[0] for r in rows], pa.int32()), "v": pa.array([r[1] for r in rows], pa.int64()),
                     "_dblog_op": [r[2] for r in rows], "_dblog_pos": [r[3].encode() for r in rows]})


@pytest.fixture
def delta(tmp_path):
    target = open_target(TargetConfig("lake", "delta", None, SOURCE, path=str(tmp_path / "lake")))
    target.ensure_table(T)
    first = Position(1, 10, 0)
    target.merge_batch(T, _flat([(i, i, "insert", Position(1, 1, i)) for i in range(1, 6)]), SOURCE, first, "r1")
    return target


def _rows(dt: DeltaTable) -> list[tuple]:
    return sorted((r["id"], r["v"], r["_dblog_pos"]) for r in dt.to_pyarrow_table().to_pylist())


def test_a_merge_without_a_duplicate_makes_one_commit(delta):
    before = delta.version(T)
    res = delta.merge_batch(T, _flat([(2, 20, "update", Position(1, 11, 0)), (7, 7, "insert", Position(1, 11, 1)),
                                      (4, 0, "delete", Position(1, 11, 2))]), SOURCE, Position(1, 20, 0), "r2")
    assert (res.inserted, res.updated, res.deleted) == (1, 1, 1), res
    assert delta.version(T) == before + 1   # the MERGE's commit only: no collapse, no extra scan's commit


def test_a_key_held_twice_is_collapsed_in_a_commit_that_keeps_the_position_and_time_travel(delta, caplog):
    """A second row of key 3 written behind the apply (an older position): the next batch's
    MERGE updates both (delta-rs), touching more rows than the batch has; one more commit
    keeps key 3 once, carrying the position the MERGE's commit carried; every earlier
    version still reads as it was."""
    path = delta.table_path(T)
    lake_append_behind(delta, T, pa.table({"id": [3], "v": [-3], "_dblog_pos": [Position(0, 1, 0).encode()],
                                           "_dblog_op": ["insert"]}))
    damaged = delta.version(T)
    new_pos = Position(1, 20, 0)
    with caplog.at_level(logging.WARNING):
        res = delta.merge_batch(T, _flat([(3, 30, "update", Position(1, 11, 0)), (9, 9, "insert", Position(1, 11, 1))]),
                                SOURCE, new_pos, "r2")
    assert res.checkpoint_moved and res.inserted == 1, res
    assert any("1 key(s) held twice" in r.getMessage() and "app__t" in r.getMessage() for r in caplog.records), \
        caplog.text
    dt = DeltaTable(path)
    assert dt.version() == damaged + 2   # the MERGE, then the collapse
    assert _rows(dt) == [(1, 1, Position(1, 1, 1).encode()), (2, 2, Position(1, 1, 2).encode()),
                         (3, 30, Position(1, 11, 0).encode()), (4, 4, Position(1, 1, 4).encode()),
                         (5, 5, Position(1, 1, 5).encode()), (9, 9, Position(1, 11, 1).encode())]
    assert delta.applied_pos(SOURCE, T) == new_pos
    collapse, merge = dt.history(2)
    assert collapse["operationParameters"]["predicate"] and collapse[APPLIED + SOURCE] == new_pos.encode(), collapse
    assert merge["operation"] == "MERGE" and merge[APPLIED + SOURCE] == new_pos.encode(), merge
    # time travel: the damaged version, and the MERGE's (both rows of key 3 updated)
    ids = lambda v: sorted(r["id"] for r in DeltaTable(path, version=v).to_pyarrow_table().to_pylist())  # noqa: E731
    assert ids(damaged) == [1, 2, 3, 3, 4, 5]
    assert ids(damaged + 1) == [1, 2, 3, 3, 4, 5, 9]
    # a replay of the batch changes nothing (the position guard), the key stays single
    delta.merge_batch(T, _flat([(3, 30, "update", Position(1, 11, 0))]), SOURCE, new_pos, "r3")
    assert DeltaTable(path).version() == damaged + 2 and delta.count(T) == 6


# the real merge_batch in a child process that SIGKILLs itself as the collapse begins: its
# MERGE's commit is made (the applied position moved), the collapse's never is
_KILLED_BEFORE_COLLAPSE = """
import json, os, signal, sys
import pyarrow as pa
from airflow_provider_dblog.engine.config import TargetConfig
from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.schema import TableSchema
from airflow_provider_dblog.engine.targets import delta, open_target
path, schema, batch, pos = sys.argv[1:]
delta.collapse = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
target = open_target(TargetConfig("lake", "delta", None, "src", path=path))
with pa.memory_map(batch) as f:
    rows = pa.ipc.open_file(f).read_all()
target.merge_batch(TableSchema.from_dict(json.loads(schema)), rows, "src", Position.decode(pos), "killed")
"""


def test_a_crash_between_the_merge_and_its_collapse_is_settled_by_the_next_apply(delta, tmp_path):
    """SIGKILL after the MERGE's commit and before the collapse's: the key is held twice at
    the batch's position, which the table records as applied, so a replay merges nothing.
    The table's next apply (that replay) collapses it first, the position unchanged; the
    apply after that finds nothing pending (no further commit)."""
    lake_append_behind(delta, T, pa.table({"id": [3], "v": [-3], "_dblog_pos": [Position(0, 1, 0).encode()],
                                           "_dblog_op": ["insert"]}))
    new_pos, batch = Position(1, 20, 0), tmp_path / "batch.arrow"
    rows = _flat([(3, 30, "update", Position(1, 11, 0)), (9, 9, "insert", Position(1, 11, 1))])
    with pa.OSFile(str(batch), "wb") as f, pa.ipc.new_file(f, rows.schema) as w:
        w.write_table(rows)
    child = subprocess.run([sys.executable, "-c", _KILLED_BEFORE_COLLAPSE, delta.config.path, json.dumps(T.to_dict()),
                            str(batch), new_pos.encode()], capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr
    path = delta.table_path(T)
    assert sorted(r["id"] for r in DeltaTable(path).to_pyarrow_table().to_pylist()) == [1, 2, 3, 3, 4, 5, 9]
    assert delta.applied_pos(SOURCE, T) == new_pos
    killed = delta.version(T)
    delta.merge_batch(T, rows, SOURCE, new_pos, "replay")   # the batch is in: only the collapse is made
    dt = DeltaTable(path)
    assert dt.version() == killed + 1 and COLLAPSED in dt.history(1)[0], dt.history(1)
    assert _rows(dt) == [(1, 1, Position(1, 1, 1).encode()), (2, 2, Position(1, 1, 2).encode()),
                         (3, 30, Position(1, 11, 0).encode()), (4, 4, Position(1, 1, 4).encode()),
                         (5, 5, Position(1, 1, 5).encode()), (9, 9, Position(1, 11, 1).encode())]
    assert delta.applied_pos(SOURCE, T) == new_pos
    delta.merge_batch(T, _flat([(1, 10, "update", Position(1, 21, 0))]), SOURCE, Position(1, 30, 0), "r4")
    assert DeltaTable(path).version() == killed + 2   # its MERGE only: nothing was pending
    assert [(r["id"], r["v"]) for r in delta.rows(T)] == [(1, 10), (2, 2), (3, 30), (4, 4), (5, 5), (9, 9)]


def test_a_deleted_key_held_twice_leaves_no_row_and_no_extra_commit(delta):
    lake_append_behind(delta, T, pa.table({"id": [2], "v": [-2], "_dblog_pos": [Position(0, 1, 0).encode()],
                                           "_dblog_op": ["insert"]}))
    before = delta.version(T)
    res = delta.merge_batch(T, _flat([(2, 0, "delete", Position(1, 11, 0))]), SOURCE, Position(1, 20, 0), "r2")
    assert res.deleted == 2, res   # delta-rs deletes both rows of the key: nothing left to collapse
    assert delta.version(T) == before + 1
    assert sorted(r["id"] for r in delta.rows(T)) == [1, 3, 4, 5]
    assert delta.applied_pos(SOURCE, T) == Position(1, 20, 0)


def test_a_key_held_twice_before_a_change_of_shape_is_collapsed_with_the_batch_position(delta):
    """A batch that ends at a change of shape: its MERGE (and so the collapse) carries the
    position before the batch; the change's own commit then moves it."""
    from airflow_provider_dblog.engine.schema_evolution import version_evolution
    lake_append_behind(delta, T, pa.table({"id": [5], "v": [-5], "_dblog_pos": [Position(0, 1, 0).encode()],
                                           "_dblog_op": ["insert"]}))
    wider = TableSchema("app", "t", T.columns + (Column("w", "int32"),), ("id",))
    ev = version_evolution({"schema": T.to_dict()}, {"schema": wider.to_dict()})
    assert ev.changed and ev.compatible, ev
    path = delta.table_path(T)
    delta.merge_batch(T, _flat([(5, 50, "update", Position(1, 11, 0))]), SOURCE, Position(1, 20, 0), "r2",
                      evolve=(ev, wider))
    evolved, collapse = DeltaTable(path).history(2)
    assert collapse["operationParameters"]["predicate"], collapse
    assert collapse[APPLIED + SOURCE] == Position(1, 10, 0).encode(), collapse
    assert evolved[APPLIED + SOURCE] == Position(1, 20, 0).encode(), evolved
    assert [(r["id"], r["v"]) for r in delta.rows(wider)] == [(1, 1), (2, 2), (3, 3), (4, 4), (5, 50)]


# -- a value a lake refuses, around a change of shape -----------------------------------------


@POSTGRES
@pytest.mark.parametrize("lake", ["delta", "iceberg"])
def test_a_far_date_stays_held_across_a_change_of_shape_until_its_row_changes(src_db, make_cdc, tmp_path, lake):
    """A far date, then an ALTER (the batch ends there), nothing more of the row: the lake
    holds the table at the batch, with the message, its position unmoved; the PostgreSQL
    target takes it. Then the row is deleted at the source (past the change): released."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id integer PRIMARY KEY, d date")
    cdc = make_cdc(["t"], targets={"lake": lake_target(lake, tmp_path / "lake")})
    cdc.start_tail()
    with src_db.cursor() as cur:
        cur.execute("INSERT INTO t VALUES (1, '2000-01-01'), (2, 'infinity')")
        cur.execute("ALTER TABLE t ADD COLUMN x integer")
        cur.execute("UPDATE t SET x = 1 WHERE id = 1")
    cdc.drain()
    t = f"{cdc.db}.t"
    for _ in range(2):
        res = cdc.apply_local("lake")[t]
        assert res["status"] == "held", res
        assert f"{t}.d = 'infinity'" in res["held"]["error"] and "0001-01-01 to 9999-12-31" in res["held"]["error"]
    with open_target(cdc.cfg.target("lake")) as target:
        assert target.count(cdc.source.table_schema(t)) == 0   # nothing of the held batch written
    assert cdc.apply_local("tgt")[t]["status"] == "applied"
    cdc.assert_equal("t")
    with src_db.cursor() as cur:
        cur.execute("DELETE FROM t WHERE id = 2")
    cdc.drain()
    res = cdc.apply_local("lake")[t]
    assert res["status"] == "applied", res
    cdc.assert_equal("t", target="lake")
    assert cdc.apply_local("tgt")[t]["status"] == "applied"
    cdc.assert_equal("t")
