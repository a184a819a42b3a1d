"""The lake targets (issue 28), Delta Lake and Iceberg, through the same apply as the
PostgreSQL target: the current-state table equals the source row for row under concurrent
writes and a full dump, a replayed batch changes neither the rows nor the table version,
the applied position moves in the same commit as the rows, schema changes flow, a
quarantine is released by a dump, and an earlier table version still shows the rows
before a repair. Both sources x both kinds, real servers, the tables read back with
``deltalake`` / ``pyiceberg`` (the Iceberg catalog in the private PostgreSQL).
"""
from __future__ import annotations

import random
import threading

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from airflow_provider_dblog.engine.apply_batch import LocalApplier
from airflow_provider_dblog.engine.apply_plan import plan_table
from airflow_provider_dblog.engine.dump import DumpRunner
from airflow_provider_dblog.engine.local_chunks import LocalChunkReader
from airflow_provider_dblog.engine.requests import DumpSpec
from airflow_provider_dblog.engine.targets import open_target
from helpers import lake_append_behind, wait_until


@pytest.fixture(params=["delta", "iceberg"])
def lake(request) -> str:
    return request.param


# what each kind shows of its commits, read with its own library
def _version(target, schema):
    if target.config.kind == "delta":
        return DeltaTable(target.table_path(schema)).version()
    t = target._load(schema)
    return t.metadata_location, t.current_snapshot().snapshot_id


def _commit_position(target, schema, source: str = "src") -> str:
    """The applied position the table's newest commit carries."""
    if target.config.kind == "delta":
        return DeltaTable(target.table_path(schema)).history(1)[0]["dblog.applied." + source]
    t = target._load(schema)
    assert t.current_snapshot().summary["dblog.applied." + source] == t.properties["dblog.applied." + source]
    return t.properties["dblog.applied." + source]


def _as_of(target, schema, version) -> pa.Table:
    if target.config.kind == "delta":
        return DeltaTable(target.table_path(schema), version=version).to_pyarrow_table()
    return target.read(schema, snapshot_id=version[1])




class Churn:
    """Random inserts, updates and deletes of ``t`` in a thread until stopped."""

    def __init__(self, src_db, seed: int):
        self.src_db, self.rng = src_db, random.Random(seed)
        self.stop, self.error, self.writes = threading.Event(), None, 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with self.src_db.cursor() as cur:
                while not self.stop.is_set():
                    k = self.rng.randint(1, 400)
                    op = self.rng.random()
                    if op < 0.4:
                        cur.execute("DELETE FROM t WHERE id = %s", (k,))
                        cur.execute("INSERT INTO t (id, v, s, d) VALUES (%s, %s, %s, %s)",
                                    (k, k, f"s-{k}-{self.writes}", f"{k}.25"))
                    elif op < 0.8:
                        cur.execute("UPDATE t SET v = v + 1, s = %s WHERE id = %s", (f"u{self.writes}", k))
                    else:
                        cur.execute("DELETE FROM t WHERE id = %s", (k,))
                    self.writes += 1
        except BaseException as e:  # surfaced by __exit__
            self.error = e

    def __enter__(self) -> "Churn":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(60)
        assert self.error is None, self.error


def _setup(src_db, make_cdc, lake, rows: int = 300):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT, s VARCHAR(40), d DECIMAL(10,2)")
        cur.execute("INSERT INTO t (id, v, s, d) VALUES " + ", ".join(
            f"({i}, {i}, 'row {i}', {i}.5)" for i in range(1, rows + 1)))
    cdc = make_cdc(["t"], lake=lake)
    cdc.start_tail()
    return cdc


def _dump(cdc, spec: DumpSpec) -> None:
    rid = cdc.request(spec)
    DumpRunner(cdc.source, cdc.state, cdc.store, LocalChunkReader(cdc.source), cdc.cfg.dump).run(rid)
    assert cdc.state.request(rid)["status"] == "done", cdc.state.request(rid)


@pytest.mark.parametrize("src_db,lake", [("mariadb", "delta"), ("postgres", "iceberg")], indirect=True)  # (CI time)
def test_a_lake_table_converges_under_writes_and_a_full_dump(src_db, make_cdc, lake):
    cdc = _setup(src_db, make_cdc, lake)
    with Churn(src_db, seed=7) as churn:
        wait_until(lambda: churn.writes > 200, 60, "writes before the dump")
        _dump(cdc, DumpSpec("table", [f"{cdc.db}.t"]))
        for _ in range(3):   # applies while the writes go on
            cdc.drain()
            assert cdc.apply_local("lake")[f"{cdc.db}.t"]["status"] == "applied"
        wait_until(lambda: churn.writes > 600, 60, "writes after the dump")
    cdc.drain()
    cdc.apply_local("lake")
    cdc.assert_equal("t", target="lake")
    # the PostgreSQL target from the same log agrees
    cdc.apply_local("tgt")
    cdc.assert_equal("t")


@pytest.mark.parametrize("src_db,lake", [("mariadb", "delta"), ("postgres", "iceberg")], indirect=True)  # (CI time)
def test_a_replayed_batch_changes_neither_rows_nor_version_and_the_position_moves_with_the_rows(src_db, make_cdc,
                                                                                               lake):
    cdc = _setup(src_db, make_cdc, lake, rows=50)
    _dump(cdc, DumpSpec("table", [f"{cdc.db}.t"]))
    with src_db.cursor() as cur:
        cur.execute("UPDATE t SET v = -1 WHERE id <= 10")
        cur.execute("DELETE FROM t WHERE id > 40")
    cdc.drain()
    target = open_target(cdc.cfg.target("lake"))
    schema = cdc.source.table_schema(f"{cdc.db}.t")
    applier = LocalApplier(target, cdc.store, cdc.state, "src")
    batch = plan_table(target, cdc.store, cdc.state, "src", schema)
    first = applier.apply_batch(batch)
    assert first["status"] == "applied" and first["deleted"] == 0, first   # dump rows and changes at once
    version, rows = _version(target, schema), target.rows(schema, with_pos=True)
    assert _commit_position(target, schema) == batch.frontier.encode()   # in the rows' own commit
    again = applier.apply_batch(batch)     # the same batch after a crash past its commit
    assert again["inserted"] == again["updated"] == again["deleted"] == 0, again
    assert _version(target, schema) == version and target.rows(schema, with_pos=True) == rows
    cdc.assert_equal("t", target="lake")


def test_schema_changes_flow_into_a_lake_table(src_db, make_cdc, lake):
    cdc = _setup(src_db, make_cdc, lake, rows=20)
    _dump(cdc, DumpSpec("table", [f"{cdc.db}.t"]))
    cdc.drain()
    cdc.apply_local("lake")
    mysql = src_db.kind == "mysql"
    steps = [("ALTER TABLE t ADD COLUMN note VARCHAR(20) NULL", "UPDATE t SET note = 'n' WHERE id <= 5"),
             ("ALTER TABLE t ADD COLUMN flag INT NOT NULL DEFAULT 7",
              "INSERT INTO t (id, v, note) VALUES (100, 100, 'new')"),
             ("ALTER TABLE t RENAME COLUMN s TO label", "UPDATE t SET label = 'renamed' WHERE id = 2"),
             ("ALTER TABLE t MODIFY v BIGINT" if mysql else "ALTER TABLE t ALTER COLUMN v TYPE bigint",
              "UPDATE t SET v = 5000000000 WHERE id = 3"),
             ("ALTER TABLE t DROP COLUMN d", "DELETE FROM t WHERE id = 4")]
    for ddl, write in steps:   # the tail reads each ALTER before the next (its catalog is the ALTER's)
        with src_db.cursor() as cur:
            cur.execute(ddl)
            cur.execute(write)
        cdc.drain()
    res = cdc.apply_local("lake")[f"{cdc.db}.t"]
    assert res["status"] == "applied", res
    cdc.assert_equal("t", target="lake")
    target = open_target(cdc.cfg.target("lake"))
    assert target.columns(cdc.source.table_schema(f"{cdc.db}.t"))[:5] == ["id", "v", "label", "note", "flag"]


def test_a_truncate_and_a_quarantine_release_on_a_lake_table_keep_time_travel(src_db, make_cdc, lake):
    cdc = _setup(src_db, make_cdc, lake, rows=30)
    _dump(cdc, DumpSpec("table", [f"{cdc.db}.t"]))
    cdc.drain()
    cdc.apply_local("lake")
    target = open_target(cdc.cfg.target("lake"))
    schema = cdc.source.table_schema(f"{cdc.db}.t")
    before = _version(target, schema)
    with src_db.cursor() as cur:
        cur.execute("TRUNCATE TABLE t")
        cur.execute("INSERT INTO t (id, v) VALUES (1, 11), (2, 22)")
        # a change the targets cannot follow: quarantined until a dump
        cur.execute("ALTER TABLE t MODIFY v SMALLINT" if src_db.kind == "mysql"
                    else "ALTER TABLE t ALTER COLUMN v TYPE smallint")
        cur.execute("INSERT INTO t (id, v) VALUES (3, 33)")
    cdc.drain()
    for _ in range(3):   # a batch ends at each change: the TRUNCATE, then the rows up to the break
        res = cdc.apply_local("lake")[f"{cdc.db}.t"]
    assert res["status"] == "quarantined" and res["events"] == 0, res
    assert sorted(r["id"] for r in target.rows(schema)) == [1, 2]   # truncated, then the rows before the break
    _dump(cdc, DumpSpec("table", [f"{cdc.db}.t"]))
    cdc.drain()
    assert cdc.apply_local("lake")[f"{cdc.db}.t"]["status"] == "applied"
    cdc.assert_equal("t", target="lake")
    # the version before the truncate still reads the 30 rows (time travel)
    assert _as_of(target, schema, before).num_rows == 30


def _damage(target, schema) -> None:
    """A hand edit of the lake table: keys 5 and 6 deleted, key 8's value changed, an extra
    key the source never had."""
    from pyiceberg.expressions import In
    if target.config.kind == "delta":
        DeltaTable(target.table_path(schema)).delete("id IN (5, 6, 8)")
    else:
        target._load(schema).delete(In("id", [5, 6, 8]))
    rows = pa.table({"id": [8, 10**6], "v": [-8, 0], "s": ["edited", "extra"], "d": [None, None],
                     "_dblog_pos": ["00000000-0000000000000001-00000000"] * 2, "_dblog_op": ["update", "insert"]})
    lake_append_behind(target, schema, rows)


@pytest.mark.parametrize("src_db,lake", [("mariadb", "delta"), ("postgres", "iceberg")], indirect=True)  # (CI time)
def test_a_resumed_dump_then_a_key_list_repair_with_deletes_keep_time_travel(src_db, make_cdc, lake):
    """A full dump stopped after two chunks and resumed (writes between) converges; then a
    hand-damaged lake table (rows deleted, a value changed, an extra key) is repaired by a
    key-list dump of exactly those keys (the extra one deleted by it), and the version
    before the repair still shows the damage (time travel)."""
    cdc = _setup(src_db, make_cdc, lake, rows=300)
    rid = cdc.request(DumpSpec("table", [f"{cdc.db}.t"], chunk_size=60))
    runner = DumpRunner(cdc.source, cdc.state, cdc.store, LocalChunkReader(cdc.source), cdc.cfg.dump)
    runner.run(rid, max_chunks=2)
    assert cdc.state.request(rid)["status"] != "done"
    with src_db.cursor() as cur:
        cur.execute("UPDATE t SET v = -v WHERE id % 5 = 0")
        cur.execute("DELETE FROM t WHERE id IN (250, 251)")
    cdc.drain()
    assert cdc.apply_local("lake")[f"{cdc.db}.t"]["status"] == "applied"   # a part of the dump applied
    runner.run(rid)
    assert cdc.state.request(rid)["status"] == "done", cdc.state.request(rid)
    cdc.drain()
    cdc.apply_local("lake")
    cdc.assert_equal("t", target="lake")

    target = open_target(cdc.cfg.target("lake"))
    schema = cdc.source.table_schema(f"{cdc.db}.t")
    _damage(target, schema)
    assert not cdc.compare("t", "lake").equal
    damaged = _version(target, schema)
    _dump(cdc, DumpSpec("keys", [f"{cdc.db}.t"], keys=[[5], [6], [8], [10**6]]))
    cdc.drain()
    res = cdc.apply_local("lake")[f"{cdc.db}.t"]
    assert res["status"] == "applied" and res["deleted"] == 1 and res["inserted"] == 2, res
    cdc.assert_equal("t", target="lake")
    old = {r["id"]: r for r in _as_of(target, schema, damaged).to_pylist()}
    assert 10**6 in old and 5 not in old and 6 not in old and old[8]["s"] == "edited"


@pytest.mark.parametrize("src_db", ["mariadb"], indirect=True)
def test_the_spark_apply_path_merges_into_a_lake_table_as_the_local_one_does(src_db, make_cdc, lake):
    """A big batch (a full dump's snapshot) goes through spark-submit: Spark reduces it to
    the latest event per key and the driver hands the pages to the same merge."""
    cdc = _setup(src_db, make_cdc, lake, rows=2000)
    _dump(cdc, DumpSpec("table", [f"{cdc.db}.t"]))
    with src_db.cursor() as cur:
        cur.execute("UPDATE t SET v = -v WHERE id % 3 = 0")
        cur.execute("DELETE FROM t WHERE id % 7 = 0")
    cdc.drain()
    res = cdc.apply_spark("lake")
    assert res["tables"][f"{cdc.db}.t"]["status"] == "applied", res
    cdc.assert_equal("t", target="lake")


@pytest.mark.parametrize("src_db,lake", [("mariadb", "delta"), ("postgres", "iceberg")], indirect=True)  # (CI time)
def test_a_full_dump_sweeps_orphans_from_a_lake_table_and_nothing_else(src_db, make_cdc, lake):
    """Rows only the lake table holds (lost by the source without a log event, or put
    there by someone) leave it with a full dump's sweep (engine/sweep.py), one commit;
    a composite key too; the source's rows stay."""
    from airflow_provider_dblog.engine.positions import Position
    from airflow_provider_dblog.engine.apply import run_apply
    with src_db.cursor() as cur:
        src_db.create_table(cur, "ol", "o INT NOT NULL, line VARCHAR(8) NOT NULL, qty INT, PRIMARY KEY (o, line)")
        cur.execute("INSERT INTO ol VALUES (1, 'L1', 1), (1, 'L2', 2), (2, 'L1', 3)")
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT, s VARCHAR(40), d DECIMAL(10,2)")
        cur.execute("INSERT INTO t (id, v, s, d) VALUES " + ", ".join(f"({i}, {i}, 'row {i}', {i}.5)"
                                                                   for i in range(1, 41)))
    cdc = make_cdc(["t", "ol"], lake=lake)
    cdc.start_tail()
    _dump(cdc, DumpSpec("all", []))
    cdc.drain()
    with src_db.cursor() as cur:
        cur.execute("DELETE FROM t WHERE id = 7")   # its ghost below comes back after its delete
    cdc.drain()
    run_apply(cdc.cfg, "lake", via="local")
    target = open_target(cdc.cfg.target("lake"))
    old = Position(0, 1, 0).encode()
    for table, ghost in (("t", {"id": [10**6, 7], "v": [0, 0], "s": ["ghost", "ghost"], "d": [None, None]}),
                         ("ol", {"o": [1], "line": ["L9"], "qty": [0]})):
        schema = cdc.source.table_schema(f"{cdc.db}.{table}")
        rows = pa.table(ghost | {"_dblog_pos": [old] * len(ghost[next(iter(ghost))]),
                                 "_dblog_op": ["insert"] * len(ghost[next(iter(ghost))])})
        lake_append_behind(target, schema, rows)
    assert not cdc.compare("t", "lake").equal
    _dump(cdc, DumpSpec("all", []))
    cdc.drain()
    result = run_apply(cdc.cfg, "lake", via="local")
    assert result["tables"][f"{cdc.db}.t"]["orphans_deleted"] == 2, result
    assert result["tables"][f"{cdc.db}.ol"]["orphans_deleted"] == 1, result
    cdc.assert_equal("t", "ol", target="lake")
