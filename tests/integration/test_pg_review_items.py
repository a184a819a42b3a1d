"""PostgreSQL: issue 27's review items, each on the real server.

- A primary key made DEFERRABLE while the tail runs (PostgreSQL 15 has no ALTER CONSTRAINT
  for it: the key is dropped and added again, which changes nothing in the Relation
  message): a key swap under it keeps every row, and the version records it.
- A publication that publishes a captured partition as its root
  (``publish_via_partition_root``): ``dblog check`` and the tail's start refuse it, naming
  the publication and the option; never silent.
- A stored generated column (pgoutput v1 does not send it): not carried (not in the
  captured shape, neither by the log nor by a dump); its table flows, so do the others.
- A table altered with no row written since, then dumped: the dump's watermarks carry the
  tables' shapes into the log, so the chunk's shape is the log's at its HW; the dump ends.
"""
from __future__ import annotations

import pytest

from airflow_provider_dblog.engine.dump import DumpRunner
from airflow_provider_dblog.engine.local_chunks import LocalChunkReader
from airflow_provider_dblog.engine.errors import SourceSetupError
from airflow_provider_dblog.engine.requests import DumpSpec
from airflow_provider_dblog.engine.sources.postgres.changes import STREAM_TXN_AFTER

pytestmark = pytest.mark.parametrize("src_db", ["postgres"], indirect=True)


def _run(src_db, *statements: str) -> None:
    with src_db.cursor() as cur:
        for s in statements:
            cur.execute(s)


def _dump(cdc, table: str) -> None:
    rid = cdc.request(DumpSpec("table", [f"{cdc.db}.{table}"]))
    DumpRunner(cdc.source, cdc.state, cdc.store, LocalChunkReader(cdc.source), cdc.cfg.dump).run(rid)
    assert cdc.state.request(rid)["status"] == "done", cdc.state.request(rid)
    cdc.drain()


# -- a key made DEFERRABLE after the capture started -----------------------------------------

def test_a_key_made_deferrable_while_the_tail_runs_keeps_swapped_rows(src_db, make_cdc):
    n = STREAM_TXN_AFTER + 500      # the swap is larger than what is given out early
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id int PRIMARY KEY, v text")
        cur.execute(f"INSERT INTO t SELECT x, 'v' || x FROM generate_series(1, {n}) AS x")
    cdc = make_cdc(["t"])
    t = f"{cdc.db}.t"
    cdc.start_tail()
    _run(src_db, "UPDATE t SET v = 'w1' WHERE id = 1")    # the tail has read t's Relation
    cdc.drain()
    assert not cdc.store.schema_versions(t)[-1][1]["extra"]["deferrable"]
    _run(src_db, "ALTER TABLE t DROP CONSTRAINT t_pkey, ADD PRIMARY KEY (id) DEFERRABLE INITIALLY IMMEDIATE")
    with src_db.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute("SET CONSTRAINTS ALL DEFERRED")
        cur.execute(f"UPDATE t SET id = {n + 1} - id")          # every row passes through a taken key
        cur.execute("COMMIT")
        cur.execute("BEGIN")
        cur.execute("SET CONSTRAINTS ALL DEFERRED")
        cur.execute("UPDATE t SET id = 3 - id WHERE id IN (1, 2)")
        cur.execute("COMMIT")
    cdc.drain()
    assert cdc.tail_error is None
    res = cdc.apply_local()   # no dump: the log alone moved every row
    assert res[t]["status"] == "applied", res
    cdc.assert_equal("t")
    assert cdc.store.schema_versions(t)[-1][1]["extra"]["deferrable"], "the version does not record it"


# -- publish_via_partition_root ----------------------------------------------------------------

def test_a_publication_via_the_partition_root_is_refused_naming_the_option(src_db, make_cdc):
    with src_db.cursor() as cur:
        cur.execute("CREATE TABLE p (id int PRIMARY KEY, v int) PARTITION BY RANGE (id)")
        cur.execute("CREATE TABLE p1 PARTITION OF p FOR VALUES FROM (0) TO (1000)")
        cur.execute("ALTER TABLE p1 REPLICA IDENTITY FULL")
        cur.execute("INSERT INTO p VALUES (1, 1)")
    cdc = make_cdc(["p1"])
    pub = cdc.src_cfg.publication
    _run(src_db, f"CREATE PUBLICATION {pub} FOR TABLE p WITH (publish_via_partition_root = true)")
    problems = [str(p) for p in cdc.source.check()]
    assert any(pub in p and "publish_via_partition_root" in p for p in problems), problems
    with pytest.raises(SourceSetupError, match="publish_via_partition_root"):
        cdc.source.prepare_log()
    # the fix it names: the partition's changes are then published as its own
    _run(src_db, f"ALTER PUBLICATION {pub} SET (publish_via_partition_root = false)")
    assert not cdc.source.check()
    cdc.start_tail()
    _dump(cdc, "p1")
    _run(src_db, "INSERT INTO p VALUES (2, 2), (3, 3)", "UPDATE p SET v = 10 WHERE id = 1")
    cdc.drain()
    assert cdc.apply_local()[f"{cdc.db}.p1"]["status"] == "applied"
    cdc.assert_equal("p1")


def test_a_publication_set_via_the_partition_root_while_the_tail_runs_breaks_its_partitions(src_db, make_cdc):
    with src_db.cursor() as cur:
        cur.execute("CREATE TABLE p (id int PRIMARY KEY, v int) PARTITION BY RANGE (id)")
        cur.execute("CREATE TABLE p1 PARTITION OF p FOR VALUES FROM (0) TO (1000)")
        cur.execute("ALTER TABLE p1 REPLICA IDENTITY FULL")
        src_db.create_table(cur, "u", "id int PRIMARY KEY, v int")
    cdc = make_cdc(["p1", "u"])
    pub = cdc.src_cfg.publication
    cdc.start_tail()
    _run(src_db, "INSERT INTO p VALUES (1, 1)")
    cdc.drain()
    _run(src_db, f"ALTER PUBLICATION {pub} ADD TABLE p",
         f"ALTER PUBLICATION {pub} SET (publish_via_partition_root = true)",
         "INSERT INTO p VALUES (2, 2)", "INSERT INTO u VALUES (1, 1)")
    cdc.drain()
    assert cdc.tail_error is None
    res = cdc.apply_local()
    p1 = res[f"{cdc.db}.p1"]
    assert p1["status"] == "quarantined" and "publish_via_partition_root" in p1["quarantined"]["why"], p1
    assert res[f"{cdc.db}.u"]["status"] == "applied", res
    cdc.assert_equal("u")
    # a dump of p1 after the break, then a change through the root (lost: it is not
    # captured): p1 breaks again after the dump's watermarks, so the dump does not release it
    _dump(cdc, "p1")
    _run(src_db, "INSERT INTO p VALUES (3, 3)", "INSERT INTO u VALUES (2, 2)")
    cdc.drain()
    p1 = cdc.apply_local()[f"{cdc.db}.p1"]
    assert p1["status"] == "quarantined" and "published via the root" in p1["quarantined"]["why"], p1


# -- stored generated columns ----------------------------------------------------------------

def test_a_stored_generated_column_is_not_carried_and_its_table_flows(src_db, make_cdc):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id int PRIMARY KEY, a int, g int GENERATED ALWAYS AS (a * 2) STORED")
        src_db.create_table(cur, "u", "id int PRIMARY KEY, v int")
        cur.execute("INSERT INTO t (id, a) VALUES (1, 1), (2, 2)")
    cdc = make_cdc(["t", "u"])
    t = f"{cdc.db}.t"
    assert not cdc.source.check(), cdc.source.check()
    assert cdc.source.table_schema(t).column_names == ["id", "a"]
    cdc.start_tail()
    _dump(cdc, "t")
    _run(src_db, "INSERT INTO t (id, a) VALUES (3, 3)", "UPDATE t SET a = 10 WHERE id = 1",
         "DELETE FROM t WHERE id = 2", "INSERT INTO u VALUES (1, 1)")
    # one added while the tail runs: nothing changes in the log's shape, nor in the captured one
    _run(src_db, "ALTER TABLE t ADD COLUMN g2 int GENERATED ALWAYS AS (a + 1) STORED",
         "INSERT INTO t (id, a) VALUES (4, 4)", "UPDATE t SET a = 5 WHERE id = 3")
    cdc.drain()
    assert cdc.tail_error is None
    res = cdc.apply_local()
    assert res[t]["status"] == "applied" and res[f"{cdc.db}.u"]["status"] == "applied", res
    cdc.assert_equal("t", "u")
    _dump(cdc, "t")
    assert cdc.apply_local()[t]["status"] == "applied"
    cdc.assert_equal("t")


# -- a dump of a table altered with no row written since ----------------------------------------

@pytest.mark.parametrize("ddl", ["ALTER TABLE t ADD COLUMN c int DEFAULT 7", "ALTER TABLE t ALTER COLUMN v SET NOT NULL"],
                         ids=["add-column", "set-not-null"])
def test_a_dump_of_a_table_altered_with_no_row_written_since_ends(src_db, make_cdc, ddl):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id int PRIMARY KEY, v int")
        src_db.create_table(cur, "u", "id int PRIMARY KEY, v int")
        cur.execute("INSERT INTO t SELECT x, x FROM generate_series(1, 100) AS x")
    cdc = make_cdc(["t", "u"])
    t = f"{cdc.db}.t"
    cdc.start_tail()
    _run(src_db, "UPDATE t SET v = 0 WHERE id = 1")
    cdc.drain()
    _run(src_db, ddl)                     # no row of t written after it
    _dump(cdc, "t")
    assert cdc.tail_error is None
    res = cdc.apply_local()
    assert res[t]["status"] == "applied", res
    cdc.assert_equal("t")
    _run(src_db, "UPDATE t SET v = 5 WHERE id = 2", "INSERT INTO u VALUES (1, 1)")
    cdc.drain()
    res = cdc.apply_local()
    assert res[t]["status"] == "applied" and res[f"{cdc.db}.u"]["status"] == "applied", res
    cdc.assert_equal("t", "u")
