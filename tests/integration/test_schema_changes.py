"""Schema changes online (issue 16): a migration of one captured table, with the tail
running and writers on it and on another table.

- A nullable column added (no default) flows: the tail records a schema version at the
  ALTER's position and goes on, the target table gets the column, old rows hold null as
  at the source, and rows written after the ALTER carry their values (both apply paths).
- A tail restarted from a checkpoint before the ALTER decodes the log with the version
  that held there (the catalog is already past it), then takes the new one at the ALTER.
- A dump runner that read the table before the ALTER has its next chunk refused at the
  HW and selected again in the new shape.
- A change the targets cannot follow (a column dropped, one added with a default, a
  TRUNCATE) quarantines that table only: the tail goes on, the other table flows, the table's apply
  stops before the change naming it and the fix (also in `dblog status`), and a full dump
  of the table releases it: its target table is rebuilt in the new shape.
"""
from __future__ import annotations

import threading

import pytest

from airflow_provider_dblog.cli import status
from airflow_provider_dblog.engine.apply import run_apply
from airflow_provider_dblog.engine.dump import DumpRunner
from airflow_provider_dblog.engine.errors import SchemaChangedError
from airflow_provider_dblog.engine.requests import DumpSpec
from airflow_provider_dblog.engine.schema import TableSchema
from airflow_provider_dblog.engine.targets import target_table_name
from airflow_provider_dblog.engine.verify import compare_source_target
from helpers import wait_until


class Writer:
    """Inserts and updates rows of ``tables`` in a thread until stopped (autocommit; column
    lists named, so its statements hold across the ALTER)."""

    def __init__(self, src_db, tables: list[str], first_id: int = 1000):
        self.src_db, self.tables, self.next_id = src_db, tables, first_id
        self.stop, self.error, self.writes = threading.Event(), None, 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            with self.src_db.cursor() as cur:
                while not self.stop.is_set():
                    for t in self.tables:
                        cur.execute(f"INSERT INTO {t} (id, v) VALUES (%s, %s)", (self.next_id, self.next_id))
                        cur.execute(f"UPDATE {t} SET v = v + 1 WHERE id = %s", (self.next_id - 7,))
                        self.writes += 2
                    self.next_id += 1
        except BaseException as e:  # surfaced by __exit__
            self.error = e

    def __enter__(self) -> "Writer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(60)
        assert self.error is None, self.error


def _during_a_dump(src_db, cdc, steps: list[str], rows: int, writes_after: int = 300) -> None:
    """Run ``steps`` one after each chunk of a repair dump of ``t`` (keys 1..``rows``), under
    a writer on ``t`` and ``u``; the tail keeps up after each (a drain within 20 s: the lag
    bound). Then the dump is done and the log drained, the tail never stopped."""
    steps = list(steps)

    def after_chunk(table: str, progress: dict) -> None:
        if steps:
            _run(src_db, steps.pop(0))
            cdc.drain(timeout=20)

    with Writer(src_db, ["t", "u"]) as writer:
        wait_until(lambda: writer.writes > 100, 60, "writes before the changes")
        rid = cdc.request(DumpSpec("keys", [f"{cdc.db}.t"], keys=[[i] for i in range(1, rows + 1)]))
        DumpRunner(cdc.source, cdc.state, cdc.store, None, cdc.cfg.dump, on_chunk=after_chunk).run(rid)
        assert not steps and cdc.state.request(rid)["status"] == "done"
        wait_until(lambda: writer.writes > writes_after, 60, "writes after the changes")
    cdc.drain()
    assert cdc.tail_error is None


def _setup(src_db, make_cdc):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT")
        src_db.create_table(cur, "u", "id INT PRIMARY KEY, v INT")
    cdc = make_cdc(["t", "u"])
    return cdc


def _run(src_db, sql: str, *args) -> None:
    with src_db.cursor() as cur:
        cur.execute(sql, args or None)


def _equal(cdc, *tables: str, target: str = "tgt") -> None:
    for t in tables:
        cdc.source.refresh_schema(f"{cdc.db}.{t}")
        diff = cdc.compare(t, target)
        assert diff.equal, diff.describe()


def _target_columns(cdc, table: str) -> list[str]:
    schema = cdc.source.table_schema(f"{cdc.db}.{table}")
    with cdc.target() as tgt, tgt.conn.cursor() as cur:
        cur.execute("SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 "
                    "AND NOT attisdropped ORDER BY attnum", (tgt.qualified_stage(target_table_name(schema)),))
        return [r[0] for r in cur.fetchall()]


@pytest.mark.parametrize("via", ["local", "spark"])
def test_an_added_nullable_column_flows_online(src_db, make_cdc, via):
    cdc = _setup(src_db, make_cdc)
    cdc.start_tail()
    with Writer(src_db, ["t", "u"]) as writer:
        wait_until(lambda: writer.writes > 200, 60, "writes before the ALTER")
        cdc.drain()
        run_apply(cdc.cfg, "tgt", via="local")    # the target table exists in the old shape
        assert "note" not in _target_columns(cdc, "t")
        _run(src_db, "ALTER TABLE t ADD COLUMN note VARCHAR(20) NULL")
        wait_until(lambda: writer.writes > 400, 60, "writes after the ALTER")
        _run(src_db, "UPDATE t SET note = CONCAT('n-', id) WHERE MOD(id, 3) = 0")   # old rows get values
        _run(src_db, "INSERT INTO t (id, v, note) VALUES (%s, %s, %s)", 1, 1, "first")
        # a wider VARCHAR: the same logical schema, nothing for the target to do
        _run(src_db, "ALTER TABLE t MODIFY note VARCHAR(40) NULL" if src_db.kind == "mysql"
             else "ALTER TABLE t ALTER COLUMN note TYPE VARCHAR(40)")
        _run(src_db, "INSERT INTO t (id, v, note) VALUES (%s, %s, %s)", 2, 2, "x" * 40)
    cdc.drain()
    assert cdc.tail_error is None
    versions = cdc.store.schema_versions(f"{cdc.db}.t")
    # the wider column is a version of its own (its native type changed; on PostgreSQL the
    # Relation message's type modifier, read as logged even when the tail meets it after the
    # second ALTER). MariaDB's tail reads the catalog at the ADD: one behind both ALTERs
    # takes the wider type there (every value fits it), and the MODIFY changes nothing.
    shapes = [[c[0] for c in v["schema"]["columns"]] for _, v in versions]
    note = [next((n["column_type"] for n in v["native"] if n["name"] == "note"), None) for _, v in versions
            ] if src_db.kind == "mysql" else []
    if src_db.kind == "mysql" and len(shapes) == 2:
        assert shapes == [["id", "v"], ["id", "v", "note"]] and note[1] == "varchar(40)", (shapes, note)
    else:
        assert shapes == [["id", "v"], ["id", "v", "note"], ["id", "v", "note"]], shapes
    assert len(cdc.store.schema_versions(f"{cdc.db}.u")) == 1     # the other table: one shape throughout
    res = run_apply(cdc.cfg, "tgt", via=via)
    assert res["via"] == via and res["tables"][f"{cdc.db}.t"]["status"] == "applied", res
    assert _target_columns(cdc, "t")[-1] == "note"   # added to the existing table
    _equal(cdc, "t", "u")


def test_a_tail_restarted_across_an_alter_reads_with_the_shape_that_held(src_db, make_cdc):
    cdc = _setup(src_db, make_cdc)
    cdc.start_tail()
    _run(src_db, "INSERT INTO t (id, v) VALUES (1, 1), (2, 2)")
    cdc.drain()
    cdc.stop_tail()
    # while the tail is down: rows in the old shape, the ALTER, rows in the new one
    _run(src_db, "INSERT INTO t (id, v) VALUES (3, 3)")
    _run(src_db, "UPDATE t SET v = 20 WHERE id = 2")
    _run(src_db, "ALTER TABLE t ADD COLUMN note VARCHAR(20)")
    _run(src_db, "INSERT INTO t (id, v, note) VALUES (4, 4, 'four')")
    _run(src_db, "UPDATE t SET note = 'one' WHERE id = 1")
    cdc.start_tail()
    cdc.drain()
    assert cdc.tail_error is None
    assert len(cdc.store.schema_versions(f"{cdc.db}.t")) == 2
    run_apply(cdc.cfg, "tgt", via="local")
    _equal(cdc, "t", "u")


NARROW = {"mysql": "ALTER TABLE t MODIFY v SMALLINT", "postgres": "ALTER TABLE t ALTER COLUMN v TYPE smallint"}
# a default the source evaluates per row (or at the ALTER, unseen): no value to carry
VOLATILE = {"mysql": "ALTER TABLE t ADD COLUMN ts TIMESTAMP(6) NULL DEFAULT CURRENT_TIMESTAMP(6)",
            "postgres": "ALTER TABLE t ADD COLUMN ts timestamptz DEFAULT clock_timestamp()"}


@pytest.mark.parametrize("ddl, named, release", [
    ("narrow", "changed type from int32 to int16", True),
    ("volatile-default", "added with a default", False),
], ids=["narrow-type", "add-column-with-a-volatile-default"])
def test_a_change_the_targets_cannot_follow_quarantines_that_table_only(src_db, make_cdc, ddl, named, release):
    ddl = {"narrow": NARROW, "volatile-default": VOLATILE}.get(ddl, {}).get(src_db.kind, ddl)
    cdc = _setup(src_db, make_cdc)
    cdc.start_tail()
    _run(src_db, "INSERT INTO t (id, v) VALUES (1, 1)")
    _run(src_db, "INSERT INTO u (id, v) VALUES (1, 1)")
    cdc.drain()
    run_apply(cdc.cfg, "tgt", via="local")
    _run(src_db, ddl)
    _run(src_db, "INSERT INTO t (id) VALUES (2)")
    _run(src_db, "INSERT INTO u (id, v) VALUES (2, 2)")
    cdc.drain()
    assert cdc.tail_error is None                       # the tail went on
    res = run_apply(cdc.cfg, "tgt", via="local")["tables"]
    t, u = res[f"{cdc.db}.t"], res[f"{cdc.db}.u"]
    assert u["status"] == "applied" and u["inserted"] == 1, u        # the other table flowed
    assert t["status"] == "quarantined" and named in t["quarantined"]["why"], t
    assert f"dump --table {cdc.db}.t" in t["quarantined"]["fix"]
    shown = status(cdc.cfg, "src")["quarantined"]                   # what `dblog status` shows
    assert list(shown) == [f"{cdc.db}.t"] and named in shown[f"{cdc.db}.t"]["why"]
    _equal(cdc, "u")
    versions = cdc.store.schema_versions(f"{cdc.db}.t")   # a new shape, recorded as quarantined
    assert len(versions) == 2 and named.split(" (")[0] in versions[-1][1]["quarantined"]
    if not release:
        return
    # a full dump of the table, requested after the change, releases it: the target table
    # is rebuilt in the new shape and applied from the change on
    rid = cdc.request(DumpSpec("table", [f"{cdc.db}.t"]))
    cdc.dump_local("t", rid)   # in this process: Spark is not the subject
    cdc.drain()
    res = run_apply(cdc.cfg, "tgt", via="local")["tables"]
    assert res[f"{cdc.db}.t"]["status"] == "applied", res
    assert status(cdc.cfg, "src")["quarantined"] == {}
    assert _target_columns(cdc, "t") == ["id", "v", "_dblog_pos"]   # rebuilt in the shape from the change
    _equal(cdc, "t", "u")


@pytest.mark.parametrize("src_db", ["mariadb"], indirect=True)
def test_a_dropped_and_created_table_quarantines_until_a_dump(src_db, make_cdc):
    """DROP TABLE (and RENAME, CREATE OR REPLACE) change a table's rows without row events:
    its targets stop before it (the target keeps its rows) until a dump of the new table."""
    cdc = _setup(src_db, make_cdc)
    cdc.start_tail()
    _run(src_db, "INSERT INTO t (id, v) VALUES (1, 1), (2, 2)")
    cdc.drain()
    run_apply(cdc.cfg, "tgt", via="local")
    _run(src_db, "DROP TABLE t")
    _run(src_db, "CREATE TABLE t (id INT PRIMARY KEY, v INT)")
    _run(src_db, "INSERT INTO t (id, v) VALUES (3, 3)")
    _run(src_db, "INSERT INTO u (id, v) VALUES (1, 1)")
    cdc.drain()
    assert cdc.tail_error is None
    res = run_apply(cdc.cfg, "tgt", via="local")["tables"]
    assert res[f"{cdc.db}.t"]["status"] == "quarantined" and "DROP TABLE" in res[f"{cdc.db}.t"]["quarantined"]["why"]
    assert res[f"{cdc.db}.u"]["status"] == "applied"
    with cdc.target() as tgt:
        assert tgt.count(f"{cdc.db}.t") == 2        # kept as it was before the DROP
    rid = cdc.request(DumpSpec("table", [f"{cdc.db}.t"]))
    cdc.dump_local("t", rid)   # in this process: Spark is not the subject
    cdc.drain()
    assert run_apply(cdc.cfg, "tgt", via="local")["tables"][f"{cdc.db}.t"]["status"] == "applied"
    _equal(cdc, "t", "u")


@pytest.mark.parametrize("behaviour", ["evolve", "lenient"])
def test_a_truncate_empties_the_target_under_evolve_and_lenient_keeps_its_rows(src_db, make_cdc, behaviour):
    """TRUNCATE is a step of the table's history, in the middle of a repair dump of the
    table and a writer: the apply empties the target there (evolve) and goes on with the
    rows written after it; lenient keeps the target's rows from before it."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT")
        src_db.create_table(cur, "u", "id INT PRIMARY KEY, v INT")
    cdc = make_cdc(["t", "u"], source={"schema_changes": behaviour}, dump={"chunk_size": 5})
    cdc.start_tail()
    _run(src_db, f"INSERT INTO t (id, v) SELECT seq, seq FROM {src_db.series(30)}")
    cdc.drain()
    run_apply(cdc.cfg, "tgt", via="local")
    _during_a_dump(src_db, cdc, ["TRUNCATE TABLE t",
                                 f"INSERT INTO t (id, v) SELECT seq, seq * 2 FROM {src_db.series(10)}"], rows=30)
    t = run_apply(cdc.cfg, "tgt", via="local")["tables"][f"{cdc.db}.t"]
    assert t["status"] == "applied", t
    if behaviour == "evolve":
        assert [e["change"] for e in t["evolved"]] == ["emptied (TRUNCATE)"]
        _equal(cdc, "t", "u")
    else:   # the writer's rows the TRUNCATE removed stay in the target (11..30: the repair dump of
        # those keys found them gone at the source, and deleted them, as a repair does)
        assert "evolved" not in t
        schema = cdc.source.refresh_schema(f"{cdc.db}.t")
        with cdc.target() as tgt:
            target = {r["id"]: r["v"] for r in tgt.rows(schema)}
        with src_db.cursor() as cur:
            cur.execute("SELECT id, v FROM t")
            source = dict(cur.fetchall())
        kept = set(target) - set(source)
        assert {k: target[k] for k in source} == source and kept and min(kept) >= 1000, kept
        _equal(cdc, "u")


def test_a_dump_chunk_selected_in_an_old_shape_is_redone(src_db, make_cdc):
    """A dump runner that read the table before an ALTER selects its next chunk in the old
    shape: reconciled, those rows would set the new column to null at the HW, over values
    the log had given it. The chunk is refused at its HW (the shape holding there is
    another) and selected again in the new shape."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT")
        src_db.create_table(cur, "u", "id INT PRIMARY KEY, v INT")
        cur.execute(f"INSERT INTO t (id, v) SELECT seq, seq FROM {src_db.series(30)}")
    cdc = make_cdc(["t", "u"], dump={"chunk_size": 10})
    cdc.start_tail()
    cdc.source.table_schema(f"{cdc.db}.t")      # the runner's source has read the old shape

    def after_chunk(table: str, progress: dict) -> None:
        if progress["chunks"] == 1:
            _run(src_db, "ALTER TABLE t ADD COLUMN note VARCHAR(20)")
            _run(src_db, "UPDATE t SET note = CONCAT('n-', id)")
    rid = cdc.request(DumpSpec("keys", [f"{cdc.db}.t"], keys=[[i] for i in range(1, 31)]))
    DumpRunner(cdc.source, cdc.state, cdc.store, None, cdc.cfg.dump, on_chunk=after_chunk).run(rid)
    assert cdc.state.request(rid)["status"] == "done"
    cdc.drain()
    run_apply(cdc.cfg, "tgt", via="local")
    _equal(cdc, "t")
    counters = cdc.state.counters()   # the chunk was redone at once: not an outage's retry
    assert int(counters.get("chunks_redone", 0)) >= 1 and not int(counters.get("dump_retries", 0)), counters


# each step: (what, statement per source kind, behaviours it runs under); the statements
# between the DDL give the changed columns values in old rows
CHANGES = [
    ("add", {"mysql": "ALTER TABLE t ADD COLUMN note VARCHAR(20) NULL",
             "postgres": "ALTER TABLE t ADD COLUMN note VARCHAR(20) NULL"}, ALL := ("evolve", "lenient", "ignore")),
    ("set", {"mysql": "UPDATE t SET note = CONCAT('n-', id) WHERE MOD(id, 3) = 0",
             "postgres": "UPDATE t SET note = 'n-' || id WHERE id % 3 = 0"}, ALL),
    ("add-default", {"mysql": "ALTER TABLE t ADD COLUMN s VARCHAR(10) NOT NULL DEFAULT 'it''s', "
                              "ADD COLUMN k DECIMAL(10,2) DEFAULT 1.50",
                     "postgres": "ALTER TABLE t ADD COLUMN s VARCHAR(10) NOT NULL DEFAULT 'it''s', "
                                 "ADD COLUMN k numeric(10,2) DEFAULT 1.50"}, ALL),
    ("drop", {"mysql": "ALTER TABLE t DROP COLUMN b", "postgres": "ALTER TABLE t DROP COLUMN b"}, ALL),
    ("rename", {"mysql": "ALTER TABLE t RENAME COLUMN a TO a2",
                "postgres": "ALTER TABLE t RENAME COLUMN a TO a2"}, ALL),
    ("set", {"mysql": "UPDATE t SET a2 = a2 + 1 WHERE MOD(id, 2) = 0",
             "postgres": "UPDATE t SET a2 = a2 + 1 WHERE id % 2 = 0"}, ALL),
    ("widen", {"mysql": "ALTER TABLE t MODIFY d DECIMAL(12,3), MODIFY v BIGINT",
               "postgres": "ALTER TABLE t ALTER COLUMN d TYPE numeric(12,3), ALTER COLUMN v TYPE bigint"},
     ("evolve", "lenient")),
    ("set", {"mysql": "UPDATE t SET d = d + 1000.125, v = v + 5000000000 WHERE MOD(id, 5) = 0",
             "postgres": "UPDATE t SET d = d + 1000.125, v = v + 5000000000 WHERE id % 5 = 0"},
     ("evolve", "lenient")),
]
# the target's columns after them, by behaviour (besides _dblog_pos)
TARGET_COLUMNS = {"evolve": {"id", "v", "a2", "d", "note", "s", "k"},
                  "lenient": {"id", "v", "a", "b", "d", "note", "a2", "s", "k"},
                  "ignore": {"id", "v", "a", "b", "d"}}


@pytest.mark.parametrize("behaviour", ["evolve", "lenient", "ignore"])
def test_compatible_changes_flow_under_each_behaviour(src_db, make_cdc, behaviour):
    """Add, drop and rename a column, widen two types (one a column the writer updates),
    one at a time in the middle of a repair dump of the table, under writers on it and on
    another table: the tail never stops and keeps up after each change (the lag bound: a
    drain within 20 s), the apply takes the changes in order, and the target equals the
    source in the columns it carries; under lenient and ignore the columns kept hold the
    values they had at the change."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT, a INT, b VARCHAR(10), d DECIMAL(10,2)")
        src_db.create_table(cur, "u", "id INT PRIMARY KEY, v INT")
    cdc = make_cdc(["t", "u"], source={"schema_changes": behaviour}, dump={"chunk_size": 5}, lake="both")
    cdc.start_tail()
    with src_db.cursor() as cur:   # in the log (the target has them before the changes)
        cur.execute(f"INSERT INTO t (id, v, a, b, d) SELECT seq, seq, seq * 10, CONCAT('b-', seq), seq + 0.25 "
                    f"FROM {src_db.series(60)}" if src_db.kind == "mysql" else
                    f"INSERT INTO t (id, v, a, b, d) SELECT seq, seq, seq * 10, 'b-' || seq, seq + 0.25 "
                    f"FROM {src_db.series(60)}")
    cdc.drain()
    for target in ("tgt", "lake", "ice"):
        run_apply(cdc.cfg, target, via="local")
    _during_a_dump(src_db, cdc, [sql[src_db.kind] for _, sql, under in CHANGES if behaviour in under],
                   rows=60, writes_after=600)
    res = run_apply(cdc.cfg, "tgt", via="spark" if behaviour == "evolve" else "local")
    t = res["tables"][f"{cdc.db}.t"]
    assert t["status"] == "applied" and len(t["evolved"]) == len([1 for w, _, u in CHANGES
                                                                   if behaviour in u and w != "set"]), t
    assert status(cdc.cfg, "src")["quarantined"] == {}
    assert set(_target_columns(cdc, "t")) == TARGET_COLUMNS[behaviour] | {"_dblog_pos"}
    schema = cdc.source.refresh_schema(f"{cdc.db}.t")
    carried = TableSchema(schema.database, schema.name,
                          tuple(c for c in schema.columns if c.name in TARGET_COLUMNS[behaviour]), schema.key)
    diff = compare_source_target(cdc.src_cfg, cdc.cfg.target("tgt"), carried, target_table_name(schema))
    assert diff.equal, diff.describe()
    _equal(cdc, "u")
    if behaviour != "evolve":   # kept columns: frozen at the change (the rows that existed then)
        with cdc.target() as tgt, tgt.conn.cursor() as cur:
            cur.execute(f"SELECT id, a, b FROM {tgt.schema}.{target_table_name(schema)} WHERE id <= 60 ORDER BY id")
            assert cur.fetchall() == [(i, i * 10, f"b-{i}") for i in range(1, 61)]
            cur.execute(f"SELECT count(*) FROM {tgt.schema}.{target_table_name(schema)} "
                        "WHERE id >= 1000 AND b IS NOT NULL")
            assert cur.fetchone()[0] == 0
    # the lake targets (Delta, Iceberg) take the same changes from the same log (issue 28)
    for lake in ("lake", "ice"):
        t = run_apply(cdc.cfg, lake, via="local")["tables"][f"{cdc.db}.t"]
        assert t["status"] == "applied", (lake, t)
        with cdc.target(lake) as tgt:
            assert set(tgt.columns(schema)) == TARGET_COLUMNS[behaviour] | {"_dblog_pos", "_dblog_op"}, lake
            rows = tgt.read(schema).sort_by("id").to_pylist()
        diff = compare_source_target(cdc.src_cfg, cdc.cfg.target(lake), carried, target_table_name(schema))
        assert diff.equal, (lake, diff.describe())
        _equal(cdc, "u", target=lake)
        if behaviour != "evolve":
            assert [(r["id"], r["a"], r["b"]) for r in rows if r["id"] <= 60] == \
                [(i, i * 10, f"b-{i}") for i in range(1, 61)], lake
            assert not [r for r in rows if r["id"] >= 1000 and r["b"] is not None], lake


def test_fail_stops_the_tail_at_a_change_and_names_the_setting(src_db, make_cdc):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT")
        src_db.create_table(cur, "u", "id INT PRIMARY KEY, v INT")
    cdc = make_cdc(["t", "u"], source={"schema_changes": {"default": "evolve", f"{src_db.name}.t": "fail"}})
    cdc.start_tail()
    _run(src_db, "ALTER TABLE u ADD COLUMN note VARCHAR(20) NULL")   # evolve: flows
    _run(src_db, "INSERT INTO u (id, v, note) VALUES (1, 1, 'y')")
    _run(src_db, "INSERT INTO t (id, v) VALUES (1, 1)")
    cdc.drain()
    _run(src_db, "ALTER TABLE t ADD COLUMN note VARCHAR(20) NULL")
    _run(src_db, "INSERT INTO t (id, v, note) VALUES (2, 2, 'x')")   # PostgreSQL: the new Relation comes with it
    wait_until(lambda: cdc.tail_error is not None, 30, "the tail to stop")
    error, cdc.tail_error = cdc.tail_error, None
    assert isinstance(error, SchemaChangedError)
    assert "added note" in str(error) and "schema_changes" in str(error)
    # nothing recorded past the change: a tail started again (the setting changed) meets it again
    assert len(cdc.store.schema_versions(f"{cdc.db}.t")) == 1 and len(cdc.store.schema_versions(f"{cdc.db}.u")) == 2


def test_a_table_added_to_the_config_is_captured_from_the_checkpoint_and_its_dump_requested(src_db, make_cdc):
    """A table added to the config of a source already captured: the next tail captures it
    from its checkpoint and requests a full dump of it, once; the dump brings the rows it
    held (some changed while no tail ran), and the target equals the source."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT")
        src_db.create_table(cur, "u", "id INT PRIMARY KEY, v INT")
        cur.execute(f"INSERT INTO u (id, v) SELECT seq, seq FROM {src_db.series(40)}")   # before any capture
    first = make_cdc(["t"])
    first.start_tail()
    _run(src_db, "INSERT INTO t (id, v) VALUES (1, 1)")
    first.drain()
    first.stop_tail()
    _run(src_db, "UPDATE u SET v = v + 100 WHERE id <= 10")     # while no tail reads
    _run(src_db, "DELETE FROM u WHERE id > 35")
    same_log = ({"slot": first.src_cfg.slot, "publication": first.src_cfg.publication}
                if src_db.kind == "postgres" else {})
    cdc = make_cdc(["t", "u"], source=same_log)                 # the same state and storage: u is new
    cdc.start_tail()

    def requested() -> list[dict]:
        reqs = [cdc.state.request(r) for r in cdc.state.requests(10)]
        return [r for r in reqs if r["spec"]["tables"] == [f"{cdc.db}.u"]]
    (req,) = wait_until(requested, 30, "the tail to request a dump of the new table")
    assert req["spec"]["scope"] == "table" and "new to the capture" in req["spec"]["requested_by"]
    _run(src_db, "INSERT INTO u (id, v) VALUES (100, 100)")      # its changes are captured meanwhile
    _run(src_db, "UPDATE u SET v = 0 WHERE id = 5")
    _run(src_db, "INSERT INTO t (id, v) VALUES (2, 2)")
    cdc.dump_local("u", req["spec"]["id"])
    cdc.drain()
    cdc.stop_tail()
    assert cdc.tail_stats[-1].dump_requests == [{"table": f"{cdc.db}.u", "request_id": req["spec"]["id"]}]
    cdc.start_tail()                                             # a restart asks nothing more
    cdc.drain()
    assert len(requested()) == 1
    run_apply(cdc.cfg, "tgt", via="local")
    _equal(cdc, "t", "u")


def test_a_catalog_past_the_log_quarantines_that_table_and_the_tail_goes_on(src_db, make_cdc):
    """Two ALTERs while the tail was stopped: when it reads the rows between them the
    catalog already has both. On PostgreSQL no shape it can read them with is known: only
    that table stops (quarantined at the first such row); the tail reads on, the other
    table flows, and a dump of the table releases it. On MariaDB the shape between is
    computed on a scratch copy (sources/mysql/shape_replay.py), even before any dump made
    dblog's database: the table flows."""
    cdc = _setup(src_db, make_cdc)
    cdc.start_tail()
    _run(src_db, "INSERT INTO t (id, v) VALUES (1, 1)")
    cdc.drain()
    cdc.stop_tail()
    _run(src_db, "ALTER TABLE t ADD COLUMN w INT")
    _run(src_db, "INSERT INTO t (id, v, w) VALUES (2, 2, 2)")
    _run(src_db, "INSERT INTO u (id, v) VALUES (1, 1)")
    _run(src_db, "ALTER TABLE t ADD COLUMN z INT")
    _run(src_db, "INSERT INTO t (id, v, w, z) VALUES (3, 3, 3, 3)")
    _run(src_db, "INSERT INTO u (id, v) VALUES (2, 2)")
    cdc.start_tail()
    cdc.drain()
    assert cdc.tail_error is None
    res = run_apply(cdc.cfg, "tgt", via="local")["tables"]
    assert res[f"{cdc.db}.u"]["status"] == "applied"
    _equal(cdc, "u")
    if src_db.kind == "mysql":
        assert res[f"{cdc.db}.t"]["status"] == "applied", res
        _equal(cdc, "t")
        return
    assert res[f"{cdc.db}.t"]["status"] == "quarantined" and "past" in res[f"{cdc.db}.t"]["quarantined"]["why"]
    rid = cdc.request(DumpSpec("table", [f"{cdc.db}.t"]))
    cdc.dump_local("t", rid)   # in this process: Spark is not the subject
    cdc.drain()
    assert run_apply(cdc.cfg, "tgt", via="local")["tables"][f"{cdc.db}.t"]["status"] == "applied"
    _equal(cdc, "t", "u")


@pytest.mark.parametrize("src_db", ["mariadb"], indirect=True)
def test_a_change_on_a_quiet_table_reaches_the_target_without_a_later_write(src_db, make_cdc):
    """An ALTER with no row event after it (MariaDB logs the statement; PostgreSQL's log
    shows a change only with the table's next row change): the tail's checkpoint stops at
    the change itself, and the apply takes it there: the target gets the column, its
    existing rows the source's default."""
    cdc = _setup(src_db, make_cdc)
    cdc.start_tail()
    _run(src_db, "INSERT INTO t (id, v) VALUES (1, 1), (2, 2)")
    cdc.drain()
    run_apply(cdc.cfg, "tgt", via="local")
    _run(src_db, "ALTER TABLE t ADD COLUMN s VARCHAR(10) NOT NULL DEFAULT 'quiet'")
    cdc.drain()
    t = run_apply(cdc.cfg, "tgt", via="local")["tables"][f"{cdc.db}.t"]
    assert [e["change"] for e in t.get("evolved", [])] == ["existing rows given the default of s; added s"], t
    _equal(cdc, "t", "u")


@pytest.mark.parametrize("ddl", ["narrow", "volatile-default"])
def test_a_quarantining_change_in_the_middle_of_a_dump_and_writes_holds_only_that_table(src_db, make_cdc, ddl):
    """A change the targets cannot follow, made after a chunk of a running repair dump of
    the table, under writers on it and on another table: the dump finishes (its chunks in
    the new shape), the tail keeps up, the other table flows and equals the source, the
    table stops at the change; a full dump requested after it releases it."""
    ddl = {"narrow": NARROW, "volatile-default": VOLATILE}[ddl][src_db.kind]
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT")
        src_db.create_table(cur, "u", "id INT PRIMARY KEY, v INT")
    cdc = make_cdc(["t", "u"], dump={"chunk_size": 5})
    cdc.start_tail()
    _run(src_db, f"INSERT INTO t (id, v) SELECT seq, seq FROM {src_db.series(30)}")
    cdc.drain()
    run_apply(cdc.cfg, "tgt", via="local")
    _during_a_dump(src_db, cdc, [ddl], rows=30)
    res = run_apply(cdc.cfg, "tgt", via="local")["tables"]
    assert res[f"{cdc.db}.t"]["status"] == "quarantined" and res[f"{cdc.db}.u"]["status"] == "applied", res
    _equal(cdc, "u")
    rid = cdc.request(DumpSpec("table", [f"{cdc.db}.t"], chunk_size=10_000))
    cdc.dump_local("t", rid)   # in this process: Spark is not the subject
    cdc.drain()
    assert run_apply(cdc.cfg, "tgt", via="local")["tables"][f"{cdc.db}.t"]["status"] == "applied"
    _equal(cdc, "t", "u")
