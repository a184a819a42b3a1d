"""Issue 27's review items on quarantine release and held values, on the real servers (dumps
and applies in this process):

- A table that breaks twice before its re-dump is rebuilt at its *latest* break (in the
  shape holding there, its checkpoint there), by a dump that read it after that break; a
  dump that read it between the two breaks releases nothing.
- Release is per target: each target of the source rebuilds once; the first one's release
  does not lift the quarantine for the others (which would apply across the break).
- Release is qualified by positions, not clocks: a dump requested while the tail lagged
  behind the break (so, by the clock, before the tail recorded it) but which read the table
  after the break releases it.
- A held value (one no target can take) is released by a later event of its row even when
  a change of the table's shape lies between them (the fix, or a re-dump of the row).
"""
from __future__ import annotations

import pytest

from airflow_provider_dblog.cli import status
from airflow_provider_dblog.engine.apply import run_apply
from airflow_provider_dblog.engine.dump import DumpRunner
from airflow_provider_dblog.engine.requests import DumpSpec
from airflow_provider_dblog.engine.targets import target_table_name
from airflow_provider_dblog.engine.verify import compare_source_target
from helpers import POSTGRES_PORT, unique

NARROW = {"mysql": "ALTER TABLE t MODIFY v SMALLINT", "postgres": "ALTER TABLE t ALTER COLUMN v TYPE smallint"}
# a default the source evaluates per row: no row event carries what existing rows hold
VOLATILE = {"mysql": "ALTER TABLE t ADD COLUMN ts TIMESTAMP(6) NULL DEFAULT CURRENT_TIMESTAMP(6)",
            "postgres": "ALTER TABLE t ADD COLUMN ts timestamptz DEFAULT clock_timestamp()"}


def _run(src_db, *statements: str) -> None:
    with src_db.cursor() as cur:
        for s in statements:
            cur.execute(s)


def _setup(src_db, make_cdc, **overrides):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT")
        src_db.create_table(cur, "u", "id INT PRIMARY KEY, v INT")
    return make_cdc(["t", "u"], **overrides)


class _Reader:
    """The chunk select in this process (Spark's JDBC reader runs the same SELECT over
    ``jdbc_table`` with the same predicates): no JVM start."""

    def __init__(self, source, kind: str):
        self.source, self.q = source, "`" if kind == "mysql" else '"'

    def read(self, table, predicates, dest_uri, keep_file=True):
        src, cols = self.source, {c: [] for c in table.column_names}
        names = ", ".join(f"{self.q}{c}{self.q}" for c in table.column_names)
        for pred in predicates:
            text = f"SELECT {names} FROM {src.jdbc_table(table)} WHERE {pred}"
            src._append_rows(table, cols, src._query(text if self.q == "`" else text.replace("%", "%%")))
        return src._arrow(table, cols)


def _dump(cdc, spec: DumpSpec | str) -> str:
    """A dump in this process (the tail running closes its windows), then the log drained."""
    rid = spec if isinstance(spec, str) else cdc.request(spec)
    DumpRunner(cdc.source, cdc.state, cdc.store, _Reader(cdc.source, cdc.sdb.kind), cdc.cfg.dump).run(rid)
    assert cdc.state.request(rid)["status"] == "done", cdc.state.request(rid)
    cdc.drain()
    return rid


def _apply(cdc, target: str = "tgt") -> dict:
    return run_apply(cdc.cfg, target, via="local")["tables"]


def _equal(cdc, table: str, target: str = "tgt") -> None:
    cdc.source.refresh_schema(f"{cdc.db}.{table}")
    schema = cdc.source.table_schema(f"{cdc.db}.{table}")
    diff = compare_source_target(cdc.src_cfg, cdc.cfg.target(target), schema, target_table_name(schema))
    assert diff.equal, f"{target}: {diff.describe()}"


def _target_columns(cdc, table: str, target: str = "tgt") -> list[str]:
    schema = cdc.source.table_schema(f"{cdc.db}.{table}")
    with cdc.target(target) as tgt, tgt.conn.cursor() as cur:
        cur.execute("SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attnum > 0 "
                    "AND NOT attisdropped ORDER BY attnum", (tgt.qualified_stage(target_table_name(schema)),))
        return [r[0] for r in cur.fetchall()]


# -- item 1a: a second break before the re-dump ------------------------------------------
def test_a_table_broken_twice_is_rebuilt_at_its_latest_break(src_db, make_cdc):
    cdc = _setup(src_db, make_cdc)
    t = f"{cdc.db}.t"
    cdc.start_tail()
    _run(src_db, "INSERT INTO t (id, v) VALUES (1, 1), (2, 2)", "INSERT INTO u (id, v) VALUES (1, 1)")
    cdc.drain()
    _apply(cdc)
    _run(src_db, NARROW[src_db.kind], "INSERT INTO t (id, v) VALUES (3, 3)")          # break 1
    cdc.drain()
    _dump(cdc, DumpSpec("table", [t]))           # read after break 1 only
    _run(src_db, VOLATILE[src_db.kind], "INSERT INTO t (id, v) VALUES (4, 4)",          # break 2
         "UPDATE t SET v = 20 WHERE id = 2", "INSERT INTO u (id, v) VALUES (2, 2)")
    cdc.drain()
    assert cdc.tail_error is None
    res = _apply(cdc)
    assert res[t]["status"] == "quarantined", res      # the first dump read the table before break 2
    assert res[f"{cdc.db}.u"]["status"] == "applied", res
    assert list(status(cdc.cfg, "src")["quarantined"]) == [t]
    _dump(cdc, DumpSpec("table", [t]))           # read after both breaks: releases them
    _run(src_db, "UPDATE t SET v = 30 WHERE id = 3")
    cdc.drain()
    res = _apply(cdc)
    assert res[t]["status"] == "applied", res
    assert _target_columns(cdc, "t") == ["id", "v", "ts", "_dblog_pos"]   # the shape after break 2
    assert status(cdc.cfg, "src")["quarantined"] == {}
    _equal(cdc, "t")
    _equal(cdc, "u")


def test_a_compatible_change_after_a_break_is_taken_after_the_rebuild(src_db, make_cdc):
    """The review's own example, a narrowing then a column dropped, did not diverge before
    either: the drop flows (no second break), so the rebuild at the narrowing is followed by
    the drop as a change of shape, and the dump's rows (in the shape after it) land there."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT, w INT")
    cdc = make_cdc(["t"])
    t = f"{cdc.db}.t"
    cdc.start_tail()
    _run(src_db, "INSERT INTO t (id, v, w) VALUES (1, 1, 1), (2, 2, 2)")
    cdc.drain()
    _apply(cdc)
    _run(src_db, NARROW[src_db.kind], "INSERT INTO t (id, v, w) VALUES (3, 3, 3)",
         "ALTER TABLE t DROP COLUMN w", "INSERT INTO t (id, v) VALUES (4, 4)")
    cdc.drain()
    assert _apply(cdc)[t]["status"] == "quarantined"
    _dump(cdc, DumpSpec("table", [t]))
    res = _apply(cdc)[t]
    assert res["status"] == "applied", res
    assert _target_columns(cdc, "t") == ["id", "v", "_dblog_pos"]
    _equal(cdc, "t")


# -- item 1b: two targets of one source ----------------------------------------------------
def test_each_target_of_the_source_is_released_on_its_own(src_db, make_cdc):
    second = {"kind": "postgres", "source": "src", "host": "127.0.0.1", "port": POSTGRES_PORT,
              "user": "postgres", "database": unique("tgt2")}
    cdc = _setup(src_db, make_cdc, targets={"tgt2": second})
    t = f"{cdc.db}.t"
    cdc.start_tail()
    _run(src_db, "INSERT INTO t (id, v) VALUES (1, 1), (2, 2)")
    cdc.drain()
    for target in ("tgt", "tgt2"):
        assert _apply(cdc, target)[t]["status"] == "applied"
    _run(src_db, NARROW[src_db.kind], "INSERT INTO t (id, v) VALUES (3, 3)", "DELETE FROM t WHERE id = 1")
    cdc.drain()
    assert _apply(cdc, "tgt2")[t]["status"] == "quarantined"
    _dump(cdc, DumpSpec("table", [t]))
    _run(src_db, "INSERT INTO t (id, v) VALUES (4, 4)")
    cdc.drain()
    assert _apply(cdc, "tgt")[t]["status"] == "applied"
    _equal(cdc, "t", "tgt")
    shown = status(cdc.cfg, "src")["quarantined"]     # tgt2 has not rebuilt yet
    assert list(shown) == [t] and shown[t]["waiting"] == ["tgt2"], shown
    res = _apply(cdc, "tgt2")[t]
    assert res["status"] == "applied", res
    _equal(cdc, "t", "tgt2")
    assert status(cdc.cfg, "src")["quarantined"] == {}
    # released once per target: more writes flow to both, nothing is rebuilt again
    _run(src_db, "UPDATE t SET v = 5 WHERE id = 4")
    cdc.drain()
    for target in ("tgt", "tgt2"):
        assert _apply(cdc, target)[t]["updated"] == 1
        _equal(cdc, "t", target)


# -- item 2: positions, not clocks --------------------------------------------------------
def test_a_dump_that_read_the_table_after_its_break_releases_it_whenever_the_tail_saw_the_break(
        src_db, make_cdc):
    cdc = _setup(src_db, make_cdc)
    t = f"{cdc.db}.t"
    cdc.start_tail()
    _run(src_db, "INSERT INTO t (id, v) VALUES (1, 1), (2, 2)")
    cdc.drain()
    _apply(cdc)
    cdc.stop_tail()                                  # the tail lags behind the break
    _run(src_db, NARROW[src_db.kind], "INSERT INTO t (id, v) VALUES (3, 3)", "UPDATE t SET v = 7 WHERE id = 1")
    rid = cdc.request(DumpSpec("table", [t]))        # requested after the break, before the tail saw it
    cdc.start_tail()
    cdc.drain()                                      # the tail records the break now
    assert _apply(cdc)[t]["status"] == "quarantined"
    _dump(cdc, rid)                                  # every read of it after the break
    res = _apply(cdc)
    assert res[t]["status"] == "applied", res
    assert status(cdc.cfg, "src")["quarantined"] == {}
    _equal(cdc, "t")


# -- item 3: a held value, then a change of the table's shape, then its fix -----------------
BAD = {"mysql": ("ts TIMESTAMP NULL DEFAULT NULL", "'0000-00-00 00:00:00'", "zero TIMESTAMP"),
       "postgres": ("ts timestamp", "'294276-12-31 23:59:59'", "294276-12-31 23:59:59")}


def test_a_held_value_is_released_by_its_fix_after_a_change_of_the_table(src_db, make_cdc):
    column, bad, named = BAD[src_db.kind]
    mode = ["SET SESSION sql_mode = ''"] if src_db.kind == "mysql" else []
    with src_db.cursor() as cur:
        src_db.create_table(cur, "h", f"id INT PRIMARY KEY, {column}")
        src_db.create_table(cur, "u", "id INT PRIMARY KEY, v INT")
    cdc = make_cdc(["h", "u"])
    h = f"{cdc.db}.h"
    cdc.start_tail()
    _run(src_db, *mode, "INSERT INTO h (id, ts) VALUES (1, '2024-01-01 00:00:00')",
         f"INSERT INTO h (id, ts) VALUES (2, {bad})", f"INSERT INTO h (id, ts) VALUES (3, {bad})",
         "INSERT INTO h (id, ts) VALUES (4, '2024-01-04 00:00:00')")
    cdc.drain()
    res = _apply(cdc)[h]
    assert res["status"] == "held" and named in res["held"]["error"], res
    _run(src_db, "ALTER TABLE h ADD COLUMN note VARCHAR(20) NULL",           # a compatible change
         "INSERT INTO h (id, ts, note) VALUES (5, '2024-01-05 00:00:00', 'five')",
         "UPDATE h SET ts = '2024-01-02 00:00:00' WHERE id = 2",                # the fix of row 2
         "DELETE FROM h WHERE id = 3")                                           # row 3 gone
    cdc.drain()
    assert cdc.tail_error is None
    res = _apply(cdc)[h]
    assert res["status"] == "applied", res
    assert _target_columns(cdc, "h") == ["id", "ts", "_dblog_pos", "note"]
    _equal(cdc, "h")
    assert status(cdc.cfg, "src")["held"] == {}


@pytest.mark.parametrize("src_db", ["mariadb"], indirect=True)
def test_a_held_value_is_released_by_a_re_dump_after_a_change_of_the_table(src_db, make_cdc):
    """The row repaired at the source without a log event (``sql_log_bin = 0``): a key-list
    dump of it, after a change of the table's shape, releases the held value."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "h", "id INT PRIMARY KEY, ts TIMESTAMP NULL DEFAULT NULL")
    cdc = make_cdc(["h"])
    h = f"{cdc.db}.h"
    cdc.start_tail()
    _run(src_db, "SET SESSION sql_mode = ''", "INSERT INTO h VALUES (1, '2024-01-01 00:00:00'), "
         "(2, '0000-00-00 00:00:00')")
    cdc.drain()
    assert _apply(cdc)[h]["status"] == "held"
    _run(src_db, "ALTER TABLE h ADD COLUMN note VARCHAR(20) NULL",
         "INSERT INTO h (id, ts, note) VALUES (3, '2024-01-03 00:00:00', 'three')",
         "SET SESSION sql_log_bin = 0", "UPDATE h SET ts = '2024-01-02 00:00:00' WHERE id = 2",
         "SET SESSION sql_log_bin = 1")
    cdc.drain()
    assert _apply(cdc)[h]["status"] == "held"      # nothing in the log says the row was repaired
    _dump(cdc, DumpSpec("keys", [h], keys=[[2]]))
    res = _apply(cdc)[h]
    assert res["status"] == "applied", res
    _equal(cdc, "h")
