"""Break round 6 of the lake targets (issue 28): schema changes on Delta and Iceberg under
each ``schema_changes`` policy (a column renamed and its old name added again, renamed by
case only and back, dropped and added again in the same or another type, widenings of INT,
VARCHAR and DECIMAL in plain and key columns, NOT NULL columns added with defaults), with
writes before, between and after the ALTERs, through the local apply and spark-submit;
TRUNCATE then the same keys (in its batch, the next, and between the chunks of a dump not
yet applied); maintenance between applies and between the steps of a key-list repair (time
travel kept); a PostgreSQL transaction broken twice after changes, its changelog replayed;
odd column and table names, timestamp keys before 1970, edge values. Each test asserts the
correct behaviour on real servers. This round's findings: fixed, ``ignore`` letting a name
that comes back at the source write into the kept column (lakes: mixed values; the PostgreSQL
target: every apply failing): now the table is quarantined there, saying so, and a full dump
releases it (schema_evolution.kept_name_reused); fixed, ``dblog verify`` reporting the columns
``ignore`` did not carry as different (verify_run._carried: named in ``not_carried``); still
xfail(strict) (README, Known limits): a Delta case-only rename under ``lenient`` failing every
apply, and a case-collision hold that the fix it asks for never releases."""
from __future__ import annotations

import datetime as dt
import decimal
import json

import pytest
from deltalake import DeltaTable

from airflow_provider_dblog.engine.dump import DumpRunner
from airflow_provider_dblog.engine.local_chunks import LocalChunkReader
from airflow_provider_dblog.engine.requests import DumpSpec
from airflow_provider_dblog.engine.targets import open_target
from helpers import lake_target
from lake_steps import (MARKERS, apply_all as _apply_all, changelog as _changelog, dump as _dump,
                        ok as _ok, replay as _replay, source_rows as _source_rows, verify as _verify)

POSTGRES = pytest.mark.parametrize("src_db", ["postgres"], indirect=True)
MARIADB = pytest.mark.parametrize("src_db", ["mariadb"], indirect=True)
LAKES = pytest.mark.parametrize("lake", ["delta", "iceberg"])
# all pairs (CI time): every two of source, lake and policy meet once, instead of every triple
ALL_PAIRS_3 = pytest.mark.parametrize("src_db,lake,policy", [
    ("mariadb", "delta", "evolve"), ("mariadb", "iceberg", "lenient"), ("mariadb", "delta", "ignore"),
    ("postgres", "iceberg", "evolve"), ("postgres", "delta", "lenient"), ("postgres", "iceberg", "ignore")],
    indirect=["src_db"])


def all_pairs_2(policies: tuple[str, str]):
    """Every two of source, lake and one of two policies meet once (4 cases, not 8)."""
    a, b = policies
    return pytest.mark.parametrize("src_db,lake,policy", [
        ("mariadb", "delta", a), ("mariadb", "iceberg", b), ("postgres", "delta", b), ("postgres", "iceberg", a)],
        indirect=["src_db"])


def _lake_rows(cdc, target: str, table: str, cols: list[str], key: str = "id") -> list[tuple]:
    t = open_target(cdc.cfg.target(target))
    cdc.source.refresh_schema(f"{cdc.db}.{table}")
    schema = cdc.source.table_schema(f"{cdc.db}.{table}")
    return sorted((tuple(r.get(c) for c in cols) for r in t.read(schema).to_pylist()),
                  key=lambda r: r[cols.index(key)])


def _same_carried(cdc, src_db, table: str = "t", target: str = "lake", key: str = "id") -> None:
    """The lake equals the source in every column both have under one name (under
    lenient/ignore the lake also keeps columns gone at the source, and lacks ignored ones)."""
    cdc.source.refresh_schema(f"{cdc.db}.{table}")
    lake_cols = open_target(cdc.cfg.target(target)).columns(cdc.source.table_schema(f"{cdc.db}.{table}"))
    _same(cdc, src_db, [c for c in cdc.source.table_schema(f"{cdc.db}.{table}").column_names if c in lake_cols],
          table, target)


def _same(cdc, src_db, cols: list[str], table: str = "t", target: str = "lake") -> None:
    def norm(rows):   # (the lake's rows of a PostgreSQL numeric are text)
        return [tuple(str(v) if isinstance(v, decimal.Decimal) else v for v in r) for r in rows]
    lake, src = norm(_lake_rows(cdc, target, table, cols)), norm(_source_rows(src_db, table, cols))
    assert lake == src, f"{cols}\nlake   {lake}\nsource {src}"


# -- 1. schema changes under each policy ----------------------------------------------------------------



RENAME = {"mysql": "ALTER TABLE t RENAME COLUMN v TO w", "postgres": "ALTER TABLE t RENAME COLUMN v TO w"}


@ALL_PAIRS_3
def test_a_column_renamed_then_its_old_name_added_again(src_db, make_cdc, tmp_path, lake, policy):
    """v renamed to w, then a new column v (another type, text) added; writes before,
    between and after, all in the log before one apply run; then more writes in a second
    run: the lake equals the source in every column the source has (kept columns aside),
    and the new v holds the source's values (NULL for rows that never set it), not the
    renamed column's frozen ones."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT, s VARCHAR(20)")
        cur.execute("INSERT INTO t VALUES (1, 1, 'a'), (2, 2, 'b'), (3, 3, 'c')")
    # (no changelog: its images cannot hold v as int, then as text, by design: README)
    cdc = make_cdc(["t"], targets={"lake": lake_target(lake, tmp_path / "lake")},
                   source={"schema_changes": policy})
    cdc.start_tail()
    cdc.dump_local("t")
    table = f"{cdc.db}.t"
    _ok(cdc.apply_local("lake")[table])
    with src_db.cursor() as cur:
        cur.execute("UPDATE t SET v = 10 WHERE id = 1")
        cur.execute(RENAME[src_db.kind])
        cur.execute("UPDATE t SET w = 20 WHERE id = 2")
        cur.execute("INSERT INTO t (id, w, s) VALUES (4, 4, 'd')")
        cdc.drain()   # the tail reads each ALTER before the next (else: the catalog is past the log)
        cur.execute("ALTER TABLE t ADD COLUMN v VARCHAR(20)")
        cur.execute("UPDATE t SET v = 'three' WHERE id = 3")
        cur.execute("INSERT INTO t (id, w, s, v) VALUES (5, 5, 'e', 'five')")
    cdc.drain()
    res = _apply_all(cdc, "lake", table)
    if policy == "ignore":   # the new v under the kept v's name: quarantined, saying so; a dump releases it
        assert res["status"] == "quarantined" and "keeps from before" in json.dumps(res), res
        _dump(cdc, DumpSpec("table", [table]))
        res = _apply_all(cdc, "lake", table)
    _ok(res)
    cols = ["id", "v", "s"] + (["w"] if policy != "ignore" else [])
    _same(cdc, src_db, cols)
    with src_db.cursor() as cur:
        cur.execute("UPDATE t SET v = 'one', s = 'A' WHERE id = 1")
        cur.execute("DELETE FROM t WHERE id = 2")
    cdc.drain()
    _ok(_apply_all(cdc, "lake", table))
    _same(cdc, src_db, cols)
    if policy != "ignore":
        cdc.assert_equal("t", target="lake")


DROP_READD = {"mysql": ["ALTER TABLE t DROP COLUMN v", "ALTER TABLE t ADD COLUMN v VARCHAR(20)"],
              "postgres": ["ALTER TABLE t DROP COLUMN v", "ALTER TABLE t ADD COLUMN v varchar(20)"]}


@ALL_PAIRS_3
def test_a_column_dropped_and_added_again_in_another_type(src_db, make_cdc, tmp_path, lake, policy):
    """v INT dropped, a write, v added again as text, writes: the lake's v holds the
    source's text values (or the table is held/quarantined, named), never the old ints."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT, s VARCHAR(20)")
        cur.execute("INSERT INTO t VALUES (1, 1, 'a'), (2, 2, 'b'), (3, 3, 'c')")
    cdc = make_cdc(["t"], targets={"lake": lake_target(lake, tmp_path / "lake")},
                   source={"schema_changes": policy})
    cdc.start_tail()
    cdc.dump_local("t")
    table = f"{cdc.db}.t"
    _ok(cdc.apply_local("lake")[table])
    drop, add = DROP_READD[src_db.kind]
    with src_db.cursor() as cur:
        cur.execute("UPDATE t SET v = 10 WHERE id = 1")
        cur.execute(drop)
        cur.execute("UPDATE t SET s = 'B' WHERE id = 2")
        cur.execute("INSERT INTO t (id, s) VALUES (4, 'd')")
        cdc.drain()
        cur.execute(add)
        cur.execute("UPDATE t SET v = 'three' WHERE id = 3")
        cur.execute("INSERT INTO t (id, s, v) VALUES (5, 'e', 'five')")
    cdc.drain()
    res = _apply_all(cdc, "lake", table)
    if res["status"] in ("quarantined", "held"):
        _dump(cdc, DumpSpec("table", [table]))
        res = _apply_all(cdc, "lake", table)
    _ok(res)
    _same_carried(cdc, src_db)
    if policy != "ignore":
        cdc.assert_equal("t", target="lake")


@all_pairs_2(("evolve", "lenient"))
def test_widenings_of_int_varchar_and_decimal_with_writes_between(src_db, make_cdc, tmp_path, lake, policy):
    """INT -> BIGINT, VARCHAR(10) -> VARCHAR(200), DECIMAL(5,2) -> DECIMAL(12,4), each with
    writes before and after that use the wider range; one apply run, then another batch:
    values exact on the lake, and the changelog has one row per event."""
    mysql = src_db.kind == "mysql"
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, i INT, c VARCHAR(10), d DECIMAL(5,2)")
        cur.execute("INSERT INTO t VALUES (1, 1, 'a', 1.25), (2, 2, 'b', -999.99), (3, 3, 'c', 0.01)")
    cdc = make_cdc(["t"], targets={"lake": lake_target(lake, tmp_path / "lake", changelog=True)},
                   source={"schema_changes": policy})
    cdc.start_tail()
    cdc.dump_local("t")
    table = f"{cdc.db}.t"
    _ok(cdc.apply_local("lake")[table])
    alter = (lambda c, t: f"ALTER TABLE t MODIFY {c} {t}") if mysql else \
        (lambda c, t: f"ALTER TABLE t ALTER COLUMN {c} TYPE {t}")
    with src_db.cursor() as cur:
        cur.execute("UPDATE t SET i = 2147483647, c = '0123456789', d = 999.99 WHERE id = 1")
        cur.execute(alter("i", "BIGINT"))
        cur.execute("UPDATE t SET i = 9223372036854775807 WHERE id = 2")
        cdc.drain()
        cur.execute(alter("c", "VARCHAR(200)"))
        cur.execute("UPDATE t SET c = %s WHERE id = 3", ("é" * 150,))
        cdc.drain()
        cur.execute(alter("d", "DECIMAL(12,4)"))
        cur.execute("UPDATE t SET d = 12345678.1234 WHERE id = 2")
        cur.execute("INSERT INTO t VALUES (4, -9223372036854775808, %s, -0.0001)", ("x" * 200,))
    cdc.drain()
    res = _apply_all(cdc, "lake", table, runs=8)
    _ok(res)
    cols = ["id", "i", "c", "d"]
    _same(cdc, src_db, cols)
    with src_db.cursor() as cur:
        cur.execute("UPDATE t SET d = -99999999.9999 WHERE id = 1")
    cdc.drain()
    _ok(_apply_all(cdc, "lake", table))
    _same(cdc, src_db, cols)
    cdc.assert_equal("t", target="lake")
    target, schema = open_target(cdc.cfg.target("lake")), cdc.source.table_schema(table)
    events = cdc.store.read_range(schema, None, cdc.state.frontier())
    log = [r for r in _changelog(target, schema) if r["op"] not in MARKERS]
    since = min(r["_dblog_pos"] for r in log)   # (the changelog starts with the table's first batch)
    want = [p for p in events["pos"].to_pylist() if p >= since]
    assert [r["_dblog_pos"] for r in log] == want, since


@all_pairs_2(("evolve", "lenient"))
def test_a_not_null_column_added_with_a_default_between_writes(src_db, make_cdc, tmp_path, lake, policy):
    """ADD COLUMN n INT NOT NULL DEFAULT 42 and a text one with a quote in its default, with
    writes before and after in one batch: old rows hold the defaults on the lake."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT")
        cur.execute("INSERT INTO t VALUES (1, 1), (2, 2), (3, 3)")
    cdc = make_cdc(["t"], targets={"lake": lake_target(lake, tmp_path / "lake", changelog=True)},
                   source={"schema_changes": policy})
    cdc.start_tail()
    cdc.dump_local("t")
    table = f"{cdc.db}.t"
    _ok(cdc.apply_local("lake")[table])
    with src_db.cursor() as cur:
        cur.execute("UPDATE t SET v = 10 WHERE id = 1")
        cur.execute("DELETE FROM t WHERE id = 3")
        cur.execute("ALTER TABLE t ADD COLUMN n INT NOT NULL DEFAULT 42")
        cur.execute("INSERT INTO t (id, v) VALUES (5, 5)")
        cdc.drain()
        cur.execute("ALTER TABLE t ADD COLUMN q VARCHAR(20) NOT NULL DEFAULT 'it''s'")
        cur.execute("INSERT INTO t (id, v) VALUES (3, 30)")
        cur.execute("INSERT INTO t VALUES (4, 4, 7, '')")
        cur.execute("UPDATE t SET n = n + 1 WHERE id = 2")
    cdc.drain()
    _ok(_apply_all(cdc, "lake", table))
    cols = ["id", "v", "n", "q"]
    _same(cdc, src_db, cols)
    cdc.assert_equal("t", target="lake")


@POSTGRES
def test_ignore_rename_then_old_name_added_again_on_the_postgres_target(src_db, make_cdc):
    """The same input on the PostgreSQL target (beside the lakes): under ``ignore``, v renamed
    to w, then v added again as text: the apply of that table must not fail for good."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT, s VARCHAR(20)")
        cur.execute("INSERT INTO t VALUES (1, 1, 'a'), (2, 2, 'b')")
    cdc = make_cdc(["t"], source={"schema_changes": "ignore"})
    cdc.start_tail()
    cdc.dump_local("t")
    table = f"{cdc.db}.t"
    _ok(cdc.apply_local("tgt")[table])
    with src_db.cursor() as cur:
        cur.execute(RENAME[src_db.kind])
        cur.execute("UPDATE t SET w = 20 WHERE id = 2")
        cdc.drain()
        cur.execute("ALTER TABLE t ADD COLUMN v VARCHAR(20)")
        cur.execute("UPDATE t SET v = 'one' WHERE id = 1")
    cdc.drain()
    from airflow_provider_dblog.engine.apply import run_apply
    from airflow_provider_dblog.engine.errors import TablesNotAppliedError
    try:
        res = run_apply(cdc.cfg, "tgt", via="local")["tables"][table]
    except TablesNotAppliedError as e:
        pytest.fail(f"the apply fails (each run again): {e}"[:600])
    assert res["status"] == "quarantined" and "keeps from before" in json.dumps(res), res   # named, not failing
    _dump(cdc, DumpSpec("table", [table]))   # releases it: the target table rebuilt in the new shape
    _ok(_apply_all(cdc, "tgt", table))
    cdc.assert_equal("t")


# -- 2. TRUNCATE then the same keys ---------------------------------------------------------------------


@LAKES
def test_a_truncate_then_the_same_keys_in_its_batch_and_the_next(src_db, make_cdc, tmp_path, lake):
    """Rows 1..5; in one run: updates, TRUNCATE, keys 1..3 inserted again with other values,
    one updated and one deleted; the next run: TRUNCATE, keys 2..4 inserted again: the lake
    equals the source each time, and the changelog (by position) replays to it."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT, s VARCHAR(20)")
        cur.execute("INSERT INTO t VALUES " + ", ".join(f"({i}, {i}, 's{i}')" for i in range(1, 6)))
    cdc = make_cdc(["t"], targets={"lake": lake_target(lake, tmp_path / "lake", changelog=True)})
    cdc.start_tail()
    cdc.dump_local("t")
    table = f"{cdc.db}.t"
    _ok(cdc.apply_local("lake")[table])
    target = open_target(cdc.cfg.target("lake"))
    with src_db.cursor() as cur:
        cur.execute("UPDATE t SET v = 100 WHERE id = 1")
        cur.execute("TRUNCATE TABLE t")
        cur.execute("INSERT INTO t VALUES (1, -1, 'again'), (2, -2, 'again'), (3, -3, 'again')")
        cur.execute("UPDATE t SET s = 'changed' WHERE id = 2")
        cur.execute("DELETE FROM t WHERE id = 3")
    cdc.drain()
    _ok(_apply_all(cdc, "lake", table))
    cdc.assert_equal("t", target="lake")
    schema = cdc.source.table_schema(table)
    assert _replay(_changelog(target, schema), schema.column_names) == _source_rows(src_db, "t", ["id", "v", "s"])
    with src_db.cursor() as cur:
        cur.execute("TRUNCATE TABLE t")
        cur.execute("INSERT INTO t VALUES (2, 22, 'x'), (3, 33, 'y'), (4, 44, 'z')")
    cdc.drain()
    _ok(_apply_all(cdc, "lake", table))
    cdc.assert_equal("t", target="lake")
    assert _replay(_changelog(target, schema), schema.column_names) == _source_rows(src_db, "t", ["id", "v", "s"])
    assert sum(r["op"] == "truncate" for r in _changelog(target, schema)) == 2


@pytest.mark.parametrize("in_tx", [False, True], ids=["statements", "one-transaction"])
def test_a_truncate_and_the_same_keys_again_between_the_chunks_of_a_dump_not_yet_applied(src_db, make_cdc, tmp_path,
                                                                                         in_tx):
    """A full dump of 30 rows in chunks of 5 stopped after two chunks (nothing applied yet);
    a TRUNCATE and the same keys inserted again with other values, in the range already
    dumped and ahead of it (as separate statements, or in one transaction with the TRUNCATE
    between inserts); the dump resumed; one apply: both lakes equal the source, and their
    changelogs replay to it."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT, s VARCHAR(20)")
        cur.execute("INSERT INTO t VALUES " + ", ".join(f"({i}, {i}, 's{i}')" for i in range(1, 31)))
    cdc = make_cdc(["t"], targets={"lake": lake_target("delta", tmp_path / "lake", changelog=True),
                                   "ice": lake_target("iceberg", tmp_path / "ice", changelog=True)})
    cdc.start_tail()
    table = f"{cdc.db}.t"
    rid = cdc.request(DumpSpec("table", [table], chunk_size=5))
    runner = DumpRunner(cdc.source, cdc.state, cdc.store, LocalChunkReader(cdc.source), cdc.cfg.dump)
    runner.run(rid, max_chunks=2)
    stmts = ["UPDATE t SET v = -100 WHERE id = 20", "TRUNCATE TABLE t",
             "INSERT INTO t VALUES (1, -1, 'again'), (7, -7, 'again'), (12, -12, 'again'), (29, -29, 'again')",
             "UPDATE t SET s = 'changed' WHERE id = 7", "DELETE FROM t WHERE id = 12"]
    with src_db.cursor() as cur:
        if in_tx and src_db.kind == "postgres":
            cur.execute("; ".join(stmts))
        else:   # (MariaDB's TRUNCATE commits on its own)
            for st in stmts:
                cur.execute(st)
    cdc.drain()
    runner.run(rid)
    assert cdc.state.request(rid)["status"] == "done", cdc.state.request(rid)
    cdc.drain()
    schema = cdc.source.table_schema(table)
    for name in ("lake", "ice"):
        _ok(_apply_all(cdc, name, table))
        cdc.assert_equal("t", target=name)
        _same(cdc, src_db, ["id", "v", "s"], target=name)
        log = _changelog(open_target(cdc.cfg.target(name)), schema)
        assert _replay(log, schema.column_names) == _source_rows(src_db, "t", ["id", "v", "s"]), name


# -- 3. maintenance between applies and inside a key-list repair -------------------------------------


def _version(target, schema):
    if target.config.kind == "delta":
        return DeltaTable(target.table_path(schema)).version()
    return target._load(schema).current_snapshot().snapshot_id


def _as_of(target, schema, version) -> list[tuple]:
    if target.config.kind == "delta":
        data = DeltaTable(target.table_path(schema), version=version).to_pyarrow_table()
    else:
        data = target.read(schema, snapshot_id=version)
    return sorted((r["id"], r["v"]) for r in data.select(["id", "v"]).to_pylist())


@LAKES
def test_maintenance_between_applies_and_between_the_steps_of_a_key_list_repair(src_db, make_cdc, tmp_path, lake):
    """Several small applies, ``dblog maintain``, the next apply; then a key-list repair (a
    row changed and one deleted at the source without a log event): its request, its dump,
    maintenance, then its apply: rows, the applied position and the next apply as without
    maintenance; the version before the repair still shows the old rows."""
    from airflow_provider_dblog.engine.maintain import run_maintain
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT")
        cur.execute("INSERT INTO t VALUES " + ", ".join(f"({i}, {i})" for i in range(1, 11)))
    cdc = make_cdc(["t"], targets={"lake": lake_target(lake, tmp_path / "lake", changelog=True)})
    cdc.start_tail()
    cdc.dump_local("t")
    table = f"{cdc.db}.t"
    _ok(cdc.apply_local("lake")[table])
    target, schema = open_target(cdc.cfg.target("lake")), cdc.source.table_schema(table)
    for i in range(3):
        with src_db.cursor() as cur:
            cur.execute(f"UPDATE t SET v = v + 100 WHERE id = {i + 1}")
        cdc.drain()
        _ok(cdc.apply_local("lake")[table])
    rows, pos = target.rows(schema, with_pos=True), target.applied_pos("src", schema)
    keep = 168 if lake == "delta" else 1
    assert run_maintain(cdc.cfg, "lake", retention_hours=keep)["status"] == "done"
    assert target.rows(schema, with_pos=True) == rows and target.applied_pos("src", schema) == pos
    with src_db.cursor() as cur:
        cur.execute("UPDATE t SET v = -4 WHERE id = 4")
    cdc.drain()
    res = cdc.apply_local("lake")[table]
    assert res["status"] == "applied" and res["events"] == 1, res
    cdc.assert_equal("t", target="lake")
    before = _version(target, schema)
    old = _as_of(target, schema, before)
    with src_db.cursor() as cur:   # changed at the source with no log event: the repair restores it
        if src_db.kind == "mysql":
            cur.execute("SET SESSION sql_log_bin = 0")
            cur.execute("UPDATE t SET v = 555 WHERE id = 5")
            cur.execute("DELETE FROM t WHERE id = 6")
            cur.execute("SET SESSION sql_log_bin = 1")
        else:   # (PostgreSQL decodes every change: here they are in the log too)
            cur.execute("UPDATE t SET v = 555 WHERE id = 5")
            cur.execute("DELETE FROM t WHERE id = 6")
    rid = cdc.request(DumpSpec("keys", [table], keys=[[5], [6], [7]]))
    assert run_maintain(cdc.cfg, "lake", retention_hours=keep)["status"] == "done"
    DumpRunner(cdc.source, cdc.state, cdc.store, LocalChunkReader(cdc.source), cdc.cfg.dump).run(rid)
    assert cdc.state.request(rid)["status"] == "done", cdc.state.request(rid)
    cdc.drain()
    assert run_maintain(cdc.cfg, "lake", retention_hours=keep)["status"] == "done"
    assert _as_of(target, schema, before) == old
    _ok(cdc.apply_local("lake")[table])
    cdc.assert_equal("t", target="lake")
    assert run_maintain(cdc.cfg, "lake", retention_hours=keep)["status"] == "done"
    assert _as_of(target, schema, before) == old and (5, 5) in old and (6, 6) in old
    cdc.assert_equal("t", target="lake")
    with src_db.cursor() as cur:
        cur.execute("UPDATE t SET v = 77 WHERE id = 7")
    cdc.drain()
    res = cdc.apply_local("lake")[table]
    assert res["status"] == "applied" and res["events"] == 1, res
    cdc.assert_equal("t", target="lake")


# -- 4. a PostgreSQL quarantine broken twice inside one transaction ----------------------------------


@POSTGRES
@LAKES
def test_two_breaks_inside_one_transaction_after_changes_replay_to_the_source(src_db, make_cdc, tmp_path, lake):
    """One transaction: an update, an insert, a delete, v narrowed (a break at seq > 0), an
    update, s narrowed (a second break), an insert; a full dump releases the table: the
    changelog, sorted by position (a rebuild row after the event it ties with), replays to
    the source's rows, and the lake equals the source."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id integer PRIMARY KEY, v integer, s varchar(20)")
        cur.execute("INSERT INTO t VALUES " + ", ".join(f"({i}, {i}, 's{i}')" for i in range(1, 7)))
    cdc = make_cdc(["t"], targets={"lake": lake_target(lake, tmp_path / "lake", changelog=True)})
    cdc.start_tail()
    cdc.dump_local("t")
    table = f"{cdc.db}.t"
    _ok(cdc.apply_local("lake")[table])
    with src_db.cursor() as cur:
        cur.execute("UPDATE t SET v = 40 WHERE id = 4; INSERT INTO t VALUES (7, 7, 's7'); DELETE FROM t WHERE id = 6; "
                    "ALTER TABLE t ALTER COLUMN v TYPE smallint; UPDATE t SET v = -v WHERE id <= 2; "
                    "ALTER TABLE t ALTER COLUMN s TYPE varchar(5); INSERT INTO t VALUES (8, 8, 's8')")
    cdc.drain()
    res = _apply_all(cdc, "lake", table)
    assert res["status"] == "quarantined", res
    cdc.dump_local("t")
    with src_db.cursor() as cur:
        cur.execute("UPDATE t SET s = 'z' WHERE id = 1")
    cdc.drain()
    _ok(_apply_all(cdc, "lake", table))
    cdc.assert_equal("t", target="lake")
    target, schema = open_target(cdc.cfg.target("lake")), cdc.source.table_schema(table)
    log = _changelog(target, schema)
    assert sum(r["op"] == "rebuild" for r in log) == 1, [(r["_dblog_pos"], r["op"]) for r in log]
    assert _replay(log, ["id", "v", "s"]) == _source_rows(src_db, "t", ["id", "v", "s"])


# -- 5. odd names and edge values ----------------------------------------------------------------------

ODD = ['Mixed Case', 'quote"d', "it's", "naïve 名前", "a`b", "tab\tname", "ünï.cöde"]


def test_odd_table_and_column_names_and_edge_values_on_both_lakes(src_db, make_cdc):
    """A table named with a space, mixed case and non-ASCII letters; columns named with
    quotes, a backquote, a tab, mixed case, non-ASCII letters; values: '' and NULL, -0.0,
    a 1 MB text, decimal(38,10) at full precision, timestamps to the microsecond before
    1970: equal on Delta and Iceberg after a dump, and after updates, key moves and deletes
    through the log."""
    mysql = src_db.kind == "mysql"
    q = (lambda n: "`" + n.replace("`", "``") + "`") if mysql else (lambda n: '"' + n.replace('"', '""') + '"')
    name = "Odd_Tbl$x"   # (the config takes plain identifiers only: mixed case and a $)
    text = "LONGTEXT" if mysql else "text"
    ts = "DATETIME(6)" if mysql else "timestamp(6)"
    dbl = "DOUBLE" if mysql else "double precision"
    cols = {ODD[0]: "INT PRIMARY KEY", ODD[1]: "VARCHAR(20)", ODD[2]: dbl, ODD[3]: text, ODD[4]: "DECIMAL(38,10)",
            ODD[5]: ts, ODD[6]: "DATE"}
    with src_db.cursor() as cur:
        src_db.create_table(cur, q(name), ", ".join(f"{q(c)} {t}" for c, t in cols.items()))
        ins = f"INSERT INTO {q(name)} ({', '.join(q(c) for c in cols)}) VALUES ({', '.join(['%s'] * len(cols))})"
        rows = [(1, "", -0.0, "x" * (1 << 20), "-9999999999999999999999999999.9999999999",
                 "1969-12-31 23:59:59.999999", "1969-12-31"),
                (2, None, 0.0, "", "0.0000000001", "1900-01-01 00:00:00.000001", "0001-01-01"),
                (3, "é\"'", None, None, None, "1950-06-15 12:00:00.5", None)]
        for r in rows:
            cur.execute(ins, r)
    cdc = make_cdc([name], lake="both")
    cdc.start_tail()
    _dump(cdc, DumpSpec("all", []))
    colnames = list(cols)
    for target in ("lake", "ice"):
        for res in cdc.apply_local(target).values():
            _ok(res)
        cdc.assert_equal(name, target=target)
    with src_db.cursor() as cur:
        k, a, f = q(ODD[0]), q(ODD[1]), q(ODD[2])
        cur.execute(f"UPDATE {q(name)} SET {a} = NULL, {f} = %s, {q(ODD[5])} = %s WHERE {k} = 1",
                    (-0.0, "1969-12-31 23:59:59.000001"))
        cur.execute(f"UPDATE {q(name)} SET {a} = '', {q(ODD[3])} = %s WHERE {k} = 2", ("y" * (1 << 20),))
        cur.execute(f"UPDATE {q(name)} SET {k} = 30 WHERE {k} = 3")
        cur.execute(ins, (4, "", -0.0, "", "9999999999999999999999999999.9999999999", "1970-01-01 00:00:00.000001",
                          "1969-01-01"))
        cur.execute(f"DELETE FROM {q(name)} WHERE {k} = 2")
    cdc.drain()
    for target in ("lake", "ice"):
        for res in cdc.apply_local(target).values():
            _ok(res)
        cdc.assert_equal(name, target=target)
        got = _lake_rows(cdc, target, name, colnames, key=ODD[0])
        want = _source_rows(src_db, q(name), colnames, key=ODD[0])
        norm = (lambda rs: [tuple(repr(v) if isinstance(v, float) else str(v) if isinstance(
            v, (decimal.Decimal, dt.datetime, dt.date)) else v for v in r) for r in rs])
        assert norm(got) == norm(want), target


# -- 1b. renames by case, renames back, widened keys -------------------------------------------------


@ALL_PAIRS_3
def test_a_column_renamed_by_case_only_then_renamed_back(src_db, make_cdc, tmp_path, lake, policy, request):
    """v renamed to V (Delta's names are case-insensitive), writes, then V renamed to w,
    then w renamed back to v; writes between, one run, then another: the lake equals the
    source in the columns it carries. (MariaDB: the case-only rename quarantines the table
    at the ALTER, "the catalog is already past" it; a dump releases it.)"""
    mysql = src_db.kind == "mysql"
    q = (lambda n: f"`{n}`") if mysql else (lambda n: f'"{n}"')
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT, s VARCHAR(20)")
        cur.execute("INSERT INTO t VALUES (1, 1, 'a'), (2, 2, 'b'), (3, 3, 'c')")
    cdc = make_cdc(["t"], targets={"lake": lake_target(lake, tmp_path / "lake")},
                   source={"schema_changes": policy})
    cdc.start_tail()
    cdc.dump_local("t")
    table = f"{cdc.db}.t"
    _ok(cdc.apply_local("lake")[table])
    steps = [("v", "V"), ("V", "w"), ("w", "v")]
    for i, (a, b) in enumerate(steps):
        with src_db.cursor() as cur:
            cur.execute(f"ALTER TABLE t RENAME COLUMN {q(a)} TO {q(b)}")
            cur.execute(f"UPDATE t SET {q(b)} = {10 * (i + 1)} WHERE id = {i + 1}")
            cur.execute(f"INSERT INTO t (id, {q(b)}, s) VALUES ({10 + i}, {i}, 'n')")
        cdc.drain()
    res = _apply_all(cdc, "lake", table, runs=8)
    if res["status"] in ("quarantined", "held"):   # (a change the lake cannot follow: named, then released)
        if lake == "delta" and policy == "lenient":   # v kept beside V: one name to Delta (kept_name_reused)
            assert "column names ignore case" in json.dumps(res), res
        _dump(cdc, DumpSpec("table", [table]))
        for _ in range(3):   # a later break of the same kind (w -> v beside the kept V): the same dump releases it
            res = _apply_all(cdc, "lake", table)
            if res["status"] != "quarantined":
                break
    _ok(res)
    _same_carried(cdc, src_db)
    with src_db.cursor() as cur:
        cur.execute("UPDATE t SET v = -1, s = 'z' WHERE id = 1")
    cdc.drain()
    _ok(_apply_all(cdc, "lake", table))
    _same_carried(cdc, src_db)
    if policy != "ignore":
        cdc.assert_equal("t", target="lake")


@LAKES
def test_widened_key_columns_with_keys_past_the_old_type_in_one_run(src_db, make_cdc, tmp_path, lake):
    """A composite key (INT, DECIMAL(5,2)) widened to (BIGINT, DECIMAL(12,4)), keys past the
    old types inserted, updated, moved and deleted around the ALTERs; one run, then a
    full dump: one row per key, equal to the source."""
    mysql = src_db.kind == "mysql"
    alter = (lambda c, t: f"ALTER TABLE t MODIFY {c} {t} NOT NULL") if mysql else \
        (lambda c, t: f"ALTER TABLE t ALTER COLUMN {c} TYPE {t}")
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "a INT, d DECIMAL(5,2), v INT, PRIMARY KEY (a, d)")
        cur.execute("INSERT INTO t VALUES (1, 1.5, 1), (2, -999.99, 2), (3, 0.01, 3)")
    cdc = make_cdc(["t"], targets={"lake": lake_target(lake, tmp_path / "lake", changelog=True)})
    cdc.start_tail()
    cdc.dump_local("t")
    table = f"{cdc.db}.t"
    _ok(cdc.apply_local("lake")[table])
    with src_db.cursor() as cur:
        cur.execute("UPDATE t SET v = 10 WHERE a = 1")
        cur.execute(alter("a", "BIGINT"))
        cur.execute("UPDATE t SET a = 9223372036854775807 WHERE a = 2")
        cdc.drain()
        cur.execute(alter("d", "DECIMAL(12,4)"))
        cur.execute("INSERT INTO t VALUES (-9223372036854775808, 12345678.1234, 4)")
        cur.execute("UPDATE t SET d = 0.0001 WHERE a = 3")
        cur.execute("UPDATE t SET v = 30 WHERE a = 3 AND d = 0.0001")
        cur.execute("DELETE FROM t WHERE a = 1")
        cur.execute("INSERT INTO t VALUES (1, 1.5, 11)")
    cdc.drain()
    _ok(_apply_all(cdc, "lake", table, runs=8))
    cdc.assert_equal("t", target="lake")
    target, schema = open_target(cdc.cfg.target("lake")), cdc.source.table_schema(table)
    rows = target.rows(schema)
    assert len({(r["a"], decimal.Decimal(str(r["d"]))) for r in rows}) == len(rows) == 4, rows
    cdc.dump_local("t")
    _ok(cdc.apply_local("lake")[table])
    assert target.count(schema) == 4
    cdc.assert_equal("t", target="lake")


@POSTGRES
@pytest.mark.parametrize("when,lake,changelog", [   # all pairs (CI time)
    ("from-the-start", "delta", False), ("from-the-start", "iceberg", True),
    ("added-later", "delta", True), ("added-later", "iceberg", False)])
def test_a_table_held_for_columns_differing_only_by_case_is_released_by_the_rename_it_asks(src_db, make_cdc,
                                                                                         tmp_path, lake, when,
                                                                                         changelog):
    """Columns "v" and "V" of one PostgreSQL table (from its first row, or "V" added later),
    and another table beside it: each lake holds that table alone, naming the fix ("rename
    one at the source"); "V" renamed to v2, a write, then a full dump of the table: the table
    flows and equals the source (and a changelog, replayed, too: a rebuild row empties it)."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id integer PRIMARY KEY, v integer" + (', "V" text' if when[0] == "f" else ""))
        src_db.create_table(cur, "u", "id integer PRIMARY KEY, v integer")
        cur.execute("INSERT INTO t (id, v) VALUES (1, 1), (2, 2)")
        cur.execute("INSERT INTO u VALUES (1, 1)")
    cdc = make_cdc(["t", "u"], targets={"lake": lake_target(lake, tmp_path / "lake", changelog=changelog)})
    cdc.start_tail()
    _dump(cdc, DumpSpec("all", []))
    t = f"{cdc.db}.t"
    if when == "added-later":
        _ok(cdc.apply_local("lake")[t])
        with src_db.cursor() as cur:
            cur.execute('ALTER TABLE t ADD COLUMN "V" text')
            cur.execute('UPDATE t SET "V" = \'two\' WHERE id = 2')
        cdc.drain()
    res = cdc.apply_local("lake")
    _ok(res[f"{cdc.db}.u"])
    assert res[t]["status"] == "held" and "rename one at the source" in res[t]["held"]["error"], res[t]
    with src_db.cursor() as cur:
        cur.execute('UPDATE t SET "V" = \'uno\', v = 10 WHERE id = 1')
        cur.execute('ALTER TABLE t RENAME COLUMN "V" TO v2')
        cur.execute("UPDATE t SET v2 = 'dos' WHERE id = 2")
        cur.execute("INSERT INTO u VALUES (2, 2)")
    cdc.drain()
    res = _apply_all(cdc, "lake", t)   # the rows of the v/V shape still wait: only a dump read after it brings them
    assert res["status"] == "held" and "re-dump the table" in res["held"]["error"], res
    _dump(cdc, DumpSpec("table", [t]))
    _ok(_apply_all(cdc, "lake", t))
    cdc.assert_equal("t", "u", target="lake")
    with src_db.cursor() as cur:   # and it flows on
        cur.execute("UPDATE t SET v2 = 'tres', v = 30 WHERE id = 2")
        cur.execute("DELETE FROM t WHERE id = 1")
    cdc.drain()
    _ok(_apply_all(cdc, "lake", t))
    cdc.assert_equal("t", target="lake")
    if changelog:
        log = _changelog(open_target(cdc.cfg.target("lake")), cdc.source.table_schema(t))
        assert [r["op"] for r in log].count("rebuild") == 1, log
        assert _replay(log, ["id", "v", "v2"]) == _source_rows(src_db, "t", ["id", "v", "v2"])


@POSTGRES
@pytest.mark.parametrize("lake", ["delta", "iceberg"])
def test_a_table_held_for_an_unconstrained_numeric_key_is_released_by_a_fixed_scale_and_a_dump(src_db, make_cdc,
                                                                                             tmp_path, lake):
    """A key of unconstrained ``numeric`` is held on a lake (1.5 and 1.50 are one key at the
    source); the key declared ``numeric(10,2)`` at the source, then a full dump: the table
    flows and equals the source."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id numeric PRIMARY KEY, v integer")
        cur.execute("INSERT INTO t VALUES (1.5, 1), (2, 2)")
    cdc = make_cdc(["t"], targets={"lake": lake_target(lake, tmp_path / "lake")})
    cdc.start_tail()
    _dump(cdc, DumpSpec("all", []))
    t = f"{cdc.db}.t"
    res = cdc.apply_local("lake")[t]
    assert res["status"] == "held" and "numeric" in res["held"]["error"], res
    with src_db.cursor() as cur:
        cur.execute("ALTER TABLE t ALTER COLUMN id TYPE numeric(10,2)")
        cur.execute("UPDATE t SET v = 20 WHERE id = 2")
        cur.execute("INSERT INTO t VALUES (3.25, 3)")
    cdc.drain()
    assert _apply_all(cdc, "lake", t)["status"] in ("held", "quarantined")
    _dump(cdc, DumpSpec("table", [t]))
    _ok(_apply_all(cdc, "lake", t))
    cdc.assert_equal("t", target="lake")


@all_pairs_2(("lenient", "ignore"))
def test_a_column_dropped_then_added_again_in_the_same_type_under_kept_policies(src_db, make_cdc, tmp_path, lake,
                                                                                 policy):
    """Under lenient/ignore a dropped column v is kept (frozen); v added again (same type):
    the lake's v must not show the frozen values for rows the source holds NULL in."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT, s VARCHAR(20)")
        cur.execute("INSERT INTO t VALUES (1, 1, 'a'), (2, 2, 'b'), (3, 3, 'c')")
    cdc = make_cdc(["t"], targets={"lake": lake_target(lake, tmp_path / "lake")},
                   source={"schema_changes": policy})
    cdc.start_tail()
    cdc.dump_local("t")
    table = f"{cdc.db}.t"
    _ok(cdc.apply_local("lake")[table])
    with src_db.cursor() as cur:
        cur.execute("ALTER TABLE t DROP COLUMN v")
        cur.execute("UPDATE t SET s = 'B' WHERE id = 2")
        cdc.drain()
        cur.execute("ALTER TABLE t ADD COLUMN v INT")
        cur.execute("UPDATE t SET v = 30 WHERE id = 3")
    cdc.drain()
    res = _apply_all(cdc, "lake", table)
    if res["status"] in ("quarantined", "held"):
        _dump(cdc, DumpSpec("table", [table]))
        res = _apply_all(cdc, "lake", table)
    _ok(res)
    _same_carried(cdc, src_db)
    if policy != "ignore":
        cdc.assert_equal("t", target="lake")


@pytest.mark.parametrize("src_db", ["mariadb"], indirect=True)
@LAKES
def test_verify_of_a_lake_table_missing_a_column_ignore_did_not_carry(src_db, make_cdc, tmp_path, lake):
    """Under ``ignore`` an added column is not carried: the lake table lacks it; ``dblog
    verify`` (run_verify) compares the columns the lake carries, and finds it equal; an
    added column the lake lacks with a row changed only in it, too."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT")
        cur.execute("INSERT INTO t VALUES (1, 1), (2, 2)")
    cdc = make_cdc(["t"], targets={"lake": lake_target(lake, tmp_path / "lake")}, source={"schema_changes": "ignore"})
    cdc.start_tail()
    cdc.dump_local("t")
    table = f"{cdc.db}.t"
    _ok(cdc.apply_local("lake")[table])
    with src_db.cursor() as cur:
        cur.execute("ALTER TABLE t ADD COLUMN x INT")
        cur.execute("UPDATE t SET x = 5, v = 10 WHERE id = 1")
        cur.execute("UPDATE t SET x = 6 WHERE id = 2")
    cdc.drain()
    _ok(_apply_all(cdc, "lake", table))
    _same(cdc, src_db, ["id", "v"])
    out = _verify(cdc, "lake", table)
    assert out["equal"], json.dumps(out, default=str)[:3000]
    assert out["tables"][table]["not_carried"] == ["x"], out["tables"][table]   # said, not hidden


# -- the Spark apply path on the same inputs (each ~10 s) ---------------------------------------------


@pytest.mark.parametrize("src_db,lake", [("mariadb", "delta"), ("postgres", "iceberg")], indirect=["src_db"])
def test_the_spark_apply_takes_a_rename_then_the_old_name_again_and_widenings(src_db, make_cdc, tmp_path, lake):
    """Through spark-submit (one apply run takes every change): v renamed to w and v added
    again as text (lenient), INT -> BIGINT and DECIMAL(5,2) -> DECIMAL(12,4) with values past
    the old types, writes between: the lake equals the source, the changelog one row per
    event."""
    mysql = src_db.kind == "mysql"
    alter = (lambda c, t: f"ALTER TABLE t MODIFY {c} {t}") if mysql else \
        (lambda c, t: f"ALTER TABLE t ALTER COLUMN {c} TYPE {t}")
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT, i INT, d DECIMAL(5,2)")
        cur.execute("INSERT INTO t VALUES (1, 1, 1, 1.25), (2, 2, 2, -999.99), (3, 3, 3, 0.01)")
    cdc = make_cdc(["t"], targets={"lake": lake_target(lake, tmp_path / "lake")},
                   source={"schema_changes": "lenient"})
    cdc.start_tail()
    cdc.dump_local("t")
    table = f"{cdc.db}.t"
    _ok(cdc.apply_local("lake")[table])
    with src_db.cursor() as cur:
        cur.execute("UPDATE t SET v = 10 WHERE id = 1")
        cur.execute(RENAME[src_db.kind])
        cur.execute("UPDATE t SET w = 20 WHERE id = 2")
        cdc.drain()
        cur.execute("ALTER TABLE t ADD COLUMN v VARCHAR(20)")
        cur.execute("UPDATE t SET v = 'three' WHERE id = 3")
        cdc.drain()
        cur.execute(alter("i", "BIGINT"))
        cur.execute("UPDATE t SET i = 9223372036854775807 WHERE id = 2")
        cdc.drain()
        cur.execute(alter("d", "DECIMAL(12,4)"))
        cur.execute("INSERT INTO t (id, w, i, d, v) VALUES (4, 4, -9223372036854775808, 12345678.1234, 'four')")
        cur.execute("DELETE FROM t WHERE id = 1")
    cdc.drain()
    _ok(_apply_all(cdc, "lake", table, runs=3, via="spark"))
    _same(cdc, src_db, ["id", "v", "w", "i", "d"])
    cdc.assert_equal("t", target="lake")


# -- 5b. timestamp keys with microseconds before 1970 -------------------------------------------------

PRE_1970 = ["1969-12-31 23:59:59.999999", "1969-12-31 23:59:59.999001", "1969-12-31 23:59:59.000001",
            "1900-01-01 00:00:00.000001", "1950-06-15 12:00:00.5005", "1970-01-01 00:00:00.000001",
            "1969-12-31 23:59:59.9995"]


def test_timestamp_keys_with_microseconds_before_1970_are_updated_and_deleted_in_place(src_db, make_cdc):
    """A key (timestamp(6), int) whose timestamps lie just before 1970 (negative epoch
    microseconds, not on a millisecond: a file's min/max statistics rounded toward zero
    would exclude them), each in its own apply so each lands in its own file; then updates
    and deletes of each key by the log, and a key-list dump: one row per key, equal, on
    Delta and Iceberg."""
    ts = "DATETIME(6)" if src_db.kind == "mysql" else "timestamp(6)"
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", f"k {ts} NOT NULL, n INT NOT NULL, v INT, PRIMARY KEY (k, n)")
    cdc = make_cdc(["t"], lake="both")
    cdc.start_tail()
    cdc.dump_local("t")
    table = f"{cdc.db}.t"
    for i, k in enumerate(PRE_1970):   # one insert per apply: one file per key
        with src_db.cursor() as cur:
            cur.execute("INSERT INTO t VALUES (%s, %s, %s)", (k, i, i))
        cdc.drain()
        for name in ("lake", "ice"):
            _ok(cdc.apply_local(name)[table])
    with src_db.cursor() as cur:
        for i, k in enumerate(PRE_1970):
            if i % 3 == 0:
                cur.execute("DELETE FROM t WHERE k = %s AND n = %s", (k, i))
            else:
                cur.execute("UPDATE t SET v = %s WHERE k = %s AND n = %s", (-i - 100, k, i))
    cdc.drain()
    for name in ("lake", "ice"):
        _ok(cdc.apply_local(name)[table])
        t = open_target(cdc.cfg.target(name))
        schema = cdc.source.table_schema(table)
        assert t.count(schema) == len([i for i in range(len(PRE_1970)) if i % 3]), t.rows(schema)
        cdc.assert_equal("t", target=name)
    _dump(cdc, DumpSpec("keys", [table], keys=[[k, i] for i, k in enumerate(PRE_1970)]))
    for name in ("lake", "ice"):
        _ok(cdc.apply_local(name)[table])
        cdc.assert_equal("t", target=name)
