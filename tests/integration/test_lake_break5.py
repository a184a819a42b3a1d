"""Break round 5 of the lake targets (issue 28): keys held several times by a lake table
(rows written behind the apply, at an old and at a newer position) through log changes, a
full dump and a key-list dump; a quarantine released while the changelog is behind;
mixed batches (a key deleted and inserted again, a key moved away and back, a delete of a
key the lake lacks); values at the edges of what each lake holds (float keys on Delta
included); two lake targets of one source, one of them held. Each test asserts the correct
behaviour on real servers. Its four findings (a Delta key held twice and swept, Iceberg's
counts over keys held several times, a release before the batch up to the break skipping
that batch's changelog rows, a NaN key held twice in Delta) were fixed with these tests."""
from __future__ import annotations

import json

import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable

from airflow_provider_dblog.engine.config import load_config
from airflow_provider_dblog.engine.dump import DumpRunner
from airflow_provider_dblog.engine.local_chunks import LocalChunkReader
from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.quarantine import breaks
from airflow_provider_dblog.engine.requests import DumpSpec
from airflow_provider_dblog.engine.targets import open_target
from airflow_provider_dblog.engine.targets.changelog import changelog_name
from helpers import crash, lake_append_behind, lake_target

POSTGRES = pytest.mark.parametrize("src_db", ["postgres"], indirect=True)
MARIADB = pytest.mark.parametrize("src_db", ["mariadb"], indirect=True)
OLD = Position(0, 1, 0).encode()   # below every position a source writes


def _ok(res) -> None:
    assert res["status"] in ("applied", "up_to_date", "empty"), res


def _dump(cdc, spec: DumpSpec) -> None:
    rid = cdc.request(spec)
    DumpRunner(cdc.source, cdc.state, cdc.store, LocalChunkReader(cdc.source), cdc.cfg.dump).run(rid)
    assert cdc.state.request(rid)["status"] == "done", cdc.state.request(rid)
    cdc.drain()


def _newer(cdc) -> str:
    """A position above every row the lake holds and below every event the source writes
    from now on: what a writer behind the apply stamping "now" would give."""
    head, _ = cdc.source.current_resume()
    return head.just_below().encode()


def _copies(target, schema) -> dict[tuple, int]:
    """How many rows the lake table holds per key."""
    out: dict[tuple, int] = {}
    for r in target.read(schema).select(list(schema.key)).to_pylist():
        k = tuple(r[c] for c in schema.key)
        out[k] = out.get(k, 0) + 1
    return out


def _behind(target, schema, rows: list[dict], copies: list[tuple[dict, str]]) -> None:
    """Rows of the lake table (``rows``: their key and values) written again behind the
    apply, each change ``(values, position)`` one more row of its key."""
    by_key = {tuple(r[c] for c in schema.key): r for r in rows}
    extra = []
    for change, pos in copies:
        k = tuple(change[c] for c in schema.key)
        extra.append({c: by_key[k][c] for c in schema.column_names} | change | {"_dblog_pos": pos,
                                                                                "_dblog_op": "insert"})
    lake_append_behind(target, schema, pa.Table.from_pylist(extra))


# -- 1. keys held several times by the lake table -----------------------------------------------------


@MARIADB
def test_iceberg_keys_held_twice_at_old_and_newer_positions_end_as_one_row_each(src_db, make_cdc):
    """Keys held twice and three times in an Iceberg table (copies at an old position and at
    a newer one than the lake's row), then through the log an update, a delete, a key moved
    away, a row deleted at the source without a log event; a full dump, then more copies
    and a key-list dump: one row per key, equal to the source, at each step."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT, s VARCHAR(20)")
        cur.execute("INSERT INTO t VALUES " + ", ".join(f"({i}, {i}, 's{i}')" for i in range(1, 11)))
    cdc = make_cdc(["t"], lake="iceberg")
    cdc.start_tail()
    cdc.dump_local("t")
    table = f"{cdc.db}.t"
    _ok(cdc.apply_local("lake")[table])
    target, schema = open_target(cdc.cfg.target("lake")), cdc.source.table_schema(table)
    rows, newer = target.rows(schema), _newer(cdc)
    _behind(target, schema, rows, [({"id": 2, "v": -2}, OLD), ({"id": 2, "v": -20}, newer),
                                   ({"id": 3, "v": -3}, OLD), ({"id": 3, "v": -30}, newer),
                                   ({"id": 4, "v": -4}, newer), ({"id": 5, "v": -5}, OLD),
                                   ({"id": 6, "v": -6}, OLD), ({"id": 6, "v": -60}, newer),
                                   ({"id": 7, "v": -7}, OLD), ({"id": 8, "v": -8}, newer)])
    with src_db.cursor() as cur:
        cur.execute("UPDATE t SET v = 200 WHERE id = 2")
        cur.execute("DELETE FROM t WHERE id = 3")
        cur.execute("UPDATE t SET id = 40 WHERE id = 4")
        cur.execute("UPDATE t SET s = 'five' WHERE id = 5")
        cur.execute("SET SESSION sql_log_bin = 0")
        cur.execute("DELETE FROM t WHERE id = 6")   # gone at the source with no event: the full dump sweeps it
        cur.execute("SET SESSION sql_log_bin = 1")
    cdc.drain()
    _ok(cdc.apply_local("lake")[table])
    copies = _copies(target, schema)
    assert {k: copies.get((k,), 0) for k in (2, 3, 4, 40, 5)} == {2: 1, 3: 0, 4: 0, 40: 1, 5: 1}, copies
    _dump(cdc, DumpSpec("table", [table]))
    res = cdc.apply_local("lake")[table]
    _ok(res)
    copies = _copies(target, schema)
    assert set(copies.values()) == {1} and 6 not in {k[0] for k in copies}, (copies, res)
    cdc.assert_equal("t", target="lake")
    rows, newer = target.rows(schema), _newer(cdc)
    _behind(target, schema, rows, [({"id": 1, "v": -1}, OLD), ({"id": 1, "v": -10}, newer),
                                   ({"id": 9, "v": -9}, newer), ({"id": 9, "v": -90}, newer),
                                   ({"id": 10, "v": -100}, OLD)])
    with src_db.cursor() as cur:   # 10 gone at the source with no event: the key-list dump deletes it
        cur.execute("SET SESSION sql_log_bin = 0")
        cur.execute("DELETE FROM t WHERE id = 10")
        cur.execute("SET SESSION sql_log_bin = 1")
    _dump(cdc, DumpSpec("keys", [table], keys=[[1], [9], [10]]))
    _ok(cdc.apply_local("lake")[table])
    assert set(_copies(target, schema).values()) == {1}, _copies(target, schema)
    cdc.assert_equal("t", target="lake")


@MARIADB
def test_delta_composite_keys_held_three_times_end_as_one_row_each(src_db, make_cdc):
    """A Delta table with a composite key (text, int): keys held three times (two old
    copies and a newer one) updated, deleted, moved away and back in one batch; a full
    dump; then more copies and a key-list dump (one key gone at the source without an
    event): one row per key, equal to the source."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "k VARCHAR(20), n INT, v INT, PRIMARY KEY (k, n)")
        cur.execute("INSERT INTO t VALUES " + ", ".join(f"('k{i}', {i}, {i})" for i in range(1, 9)))
    cdc = make_cdc(["t"], lake="delta")
    cdc.start_tail()
    cdc.dump_local("t")
    table = f"{cdc.db}.t"
    _ok(cdc.apply_local("lake")[table])
    target, schema = open_target(cdc.cfg.target("lake")), cdc.source.table_schema(table)
    rows, newer = target.rows(schema), _newer(cdc)

    def thrice(i: int) -> list[tuple[dict, str]]:
        return [({"k": f"k{i}", "n": i, "v": -i}, OLD), ({"k": f"k{i}", "n": i, "v": -10 * i}, OLD),
                ({"k": f"k{i}", "n": i, "v": -100 * i}, newer)]
    _behind(target, schema, rows, thrice(1) + thrice(2) + thrice(3) + thrice(5))
    with src_db.cursor() as cur:
        cur.execute("UPDATE t SET v = 100 WHERE k = 'k1'")
        cur.execute("DELETE FROM t WHERE k = 'k2'")
        cur.execute("UPDATE t SET n = 30 WHERE k = 'k3'")
        cur.execute("UPDATE t SET n = 3 WHERE k = 'k3'")
    cdc.drain()
    _ok(cdc.apply_local("lake")[table])
    copies = _copies(target, schema)
    assert {k: copies.get(k, 0) for k in (("k1", 1), ("k2", 2), ("k3", 3), ("k3", 30), ("k5", 5))} == {
        ("k1", 1): 1, ("k2", 2): 0, ("k3", 3): 1, ("k3", 30): 0, ("k5", 5): 4}, copies
    _dump(cdc, DumpSpec("table", [table]))
    _ok(cdc.apply_local("lake")[table])
    assert set(_copies(target, schema).values()) == {1}, _copies(target, schema)
    cdc.assert_equal("t", target="lake")
    rows, newer = target.rows(schema), _newer(cdc)
    _behind(target, schema, rows, thrice(6) + thrice(7))
    with src_db.cursor() as cur:   # k7 gone at the source with no event: the key-list dump deletes it
        cur.execute("SET SESSION sql_log_bin = 0")
        cur.execute("DELETE FROM t WHERE k = 'k7'")
        cur.execute("SET SESSION sql_log_bin = 1")
    _dump(cdc, DumpSpec("keys", [table], keys=[["k6", 6], ["k7", 7]]))
    _ok(cdc.apply_local("lake")[table])
    assert set(_copies(target, schema).values()) == {1}, _copies(target, schema)
    cdc.assert_equal("t", target="lake")


@MARIADB
def test_a_delta_key_held_twice_and_gone_at_the_source_is_swept_and_stops_no_other_table(src_db, make_cdc):
    """A row deleted at the source without a log event, held twice in the Delta table (a copy
    written behind the apply): the full dump's sweep deletes both copies, and a second table
    of the same target, applied after it in the run, keeps flowing."""
    with src_db.cursor() as cur:
        for name in ("t", "u"):
            src_db.create_table(cur, name, "id INT PRIMARY KEY, v INT")
            cur.execute(f"INSERT INTO {name} VALUES (1, 1), (2, 2), (3, 3)")
    cdc = make_cdc(["t", "u"], lake="delta")
    cdc.start_tail()
    _dump(cdc, DumpSpec("all", []))
    t = f"{cdc.db}.t"
    for res in cdc.apply_local("lake").values():
        _ok(res)
    target, schema = open_target(cdc.cfg.target("lake")), cdc.source.table_schema(t)
    _behind(target, schema, target.rows(schema), [({"id": 2, "v": -2}, OLD)])
    with src_db.cursor() as cur:
        cur.execute("SET SESSION sql_log_bin = 0")
        cur.execute("DELETE FROM t WHERE id = 2")
        cur.execute("SET SESSION sql_log_bin = 1")
        cur.execute("INSERT INTO u VALUES (4, 4)")
    _dump(cdc, DumpSpec("table", [t]))
    try:
        results = cdc.apply_local("lake")
    finally:   # the other table of the run is applied whatever happened to this one
        cdc.assert_equal("u", target="lake")
    assert results[t].get("orphans_deleted") == 2, results[t]
    assert _copies(target, schema) == {(1,): 1, (3,): 1}
    cdc.assert_equal("t", target="lake")


@MARIADB
def test_iceberg_counts_rows_of_keys_held_several_times_once(src_db, make_cdc):
    """A key held three times in an Iceberg table and gone at the source without an event:
    the full dump's sweep deletes its 3 rows and says 3; the dump's merge over copies
    reports no negative count."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT")
        cur.execute("INSERT INTO t VALUES (1, 1), (2, 2)")
    cdc = make_cdc(["t"], lake="iceberg")
    cdc.start_tail()
    cdc.dump_local("t")
    table = f"{cdc.db}.t"
    _ok(cdc.apply_local("lake")[table])
    target, schema = open_target(cdc.cfg.target("lake")), cdc.source.table_schema(table)
    _behind(target, schema, target.rows(schema), [({"id": i, "v": -i}, OLD) for i in (1, 1, 2, 2)])
    with src_db.cursor() as cur:
        cur.execute("SET SESSION sql_log_bin = 0")
        cur.execute("DELETE FROM t WHERE id = 2")
        cur.execute("SET SESSION sql_log_bin = 1")
    cdc.dump_local("t")
    res = cdc.apply_local("lake")[table]
    _ok(res)
    assert _copies(target, schema) == {(1,): 1}
    cdc.assert_equal("t", target="lake")
    assert (res["stale"], res.get("orphans_deleted")) == (0, 3), res


# -- 2. a quarantine released while the changelog is behind ------------------------------------------

NARROW = {"mysql": "ALTER TABLE t MODIFY v SMALLINT", "postgres": "ALTER TABLE t ALTER COLUMN v TYPE smallint"}
MARKERS = ("sweep", "rebuild")


def _changelog(target, schema) -> list[dict]:
    """The changelog in the README's order: by position, a sweep/rebuild row after the log
    event at its position."""
    name = changelog_name(schema)
    if target.config.kind == "delta":
        data = DeltaTable(f"{target.root}/{name}").to_pyarrow_table()
    else:
        data = target.catalog.load_table((target.namespace, name)).scan().to_arrow()
    return sorted(data.to_pylist(), key=lambda r: (r["_dblog_pos"], r["op"] in MARKERS))


def _assert_log_once(cdc, target, schema, rebuilt_at: Position | None, since: Position | None = None) -> None:
    """The changelog: every event of the table in the log (from ``since``) once, in position
    order, with one ``rebuild`` row just below the break (after the event at that position)."""
    log = _changelog(target, schema)
    events = cdc.store.read_range(schema, since, cdc.state.frontier())
    rebuild = [] if rebuilt_at is None else [(rebuilt_at.just_below().encode(), "rebuild", True)]
    want = sorted([*zip(events["pos"].to_pylist(), events["op"].to_pylist(), [False] * events.num_rows), *rebuild],
                  key=lambda w: (w[0], w[2]))
    got = [(r["_dblog_pos"], r["op"], r["op"] in MARKERS) for r in log]
    missing = [w for w in want if w not in got]
    assert got == want, (f"{len(got)} changelog rows, {len(want)} wanted; missing {missing[:6]}, extra "
                         f"{[g for g in got if g not in want][:6]}")


@pytest.mark.parametrize("src_db,lake,at", [
    ("mariadb", "delta", "before-commit"),
    ("postgres", "iceberg", "before-commit"),
    ("mariadb", "iceberg", "after-commit")], indirect=["src_db"])
def test_a_release_after_a_killed_changelog_append_keeps_every_event_in_the_changelog(src_db, make_cdc, tmp_path,
                                                                                    lake, at):
    """Changes, then a column narrowed (a quarantine) with changes after it; the apply that
    would take the changes up to the break is killed inside its changelog append (the
    changelog and the current-state table stay behind), or just after it (the changelog
    ahead); a full dump; the next apply releases the table: the changelog holds every
    event of the log once, in order, and one rebuild row just below the break; the
    current-state table equals the source."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT, s VARCHAR(20)")
        cur.execute("INSERT INTO t VALUES " + ", ".join(f"({i}, {i}, 's{i}')" for i in range(1, 6)))
    cdc = make_cdc(["t"], targets={"lake": lake_target(lake, tmp_path / "lake", changelog=True)})
    cdc.start_tail()
    cdc.dump_local("t")
    table = f"{cdc.db}.t"
    _ok(cdc.apply_local("lake")[table])
    with src_db.cursor() as cur:
        cur.execute("UPDATE t SET s = 'one' WHERE id = 1")
        cur.execute("DELETE FROM t WHERE id = 2")
        cur.execute("INSERT INTO t VALUES (6, 6, 's6')")
        cur.execute(NARROW[src_db.kind])
        cur.execute("UPDATE t SET v = -v WHERE id <= 3")
    cdc.drain()
    info = json.loads(crash("apply", cdc.path, tmp_path / "marker", "--target", "lake", "--in", "changelog",
                            "--at", at, "--commit", "1"))
    assert info["phase"] == ("commit 1" if at == "before-commit" else "committed 1"), info
    cdc.dump_local("t")
    res = cdc.apply_local("lake")[table]
    assert res["status"] == "applied", res
    cdc.assert_equal("t", target="lake")
    last = breaks(json.loads(cdc.state.r.hget(cdc.state.k("quarantined"), table)))[-1]
    target, schema = open_target(cdc.cfg.target("lake")), cdc.source.table_schema(table)
    _assert_log_once(cdc, target, schema, last)


@pytest.mark.parametrize("src_db,lake", [("postgres", "delta"), ("mariadb", "iceberg")], indirect=["src_db"])
def test_a_changelog_enabled_before_a_quarantine_holds_every_event_from_then_on(src_db, make_cdc, tmp_path, lake):
    """A target applied without a changelog, then ``changelog: true`` (the changelog starts
    at the next batch: behind the current-state table's history); changes, a column
    narrowed, more changes; the apply stops at the break, a full dump releases it: the
    changelog holds every event from the first batch after it was enabled, once, in order,
    and one rebuild row. (A PostgreSQL ALTER inside a transaction after a change, the tie
    of the rebuild row with that change, is test_lake_changelog's.)"""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT, s VARCHAR(20)")
        cur.execute("INSERT INTO t VALUES " + ", ".join(f"({i}, {i}, 's{i}')" for i in range(1, 6)))
    cdc = make_cdc(["t"], targets={"lake": lake_target(lake, tmp_path / "lake")})
    cdc.start_tail()
    cdc.dump_local("t")
    table = f"{cdc.db}.t"
    _ok(cdc.apply_local("lake")[table])
    target, schema = open_target(cdc.cfg.target("lake")), cdc.source.table_schema(table)
    since = target.applied_pos("src", schema)
    raw = yaml.safe_load(cdc.path.read_text())
    raw["targets"]["lake"]["changelog"] = True
    cdc.path.write_text(yaml.safe_dump(raw))
    cdc.cfg = load_config(cdc.path)
    target = open_target(cdc.cfg.target("lake"))
    with src_db.cursor() as cur:
        cur.execute("UPDATE t SET s = 'one' WHERE id = 1")
        cur.execute("DELETE FROM t WHERE id = 2")
        cur.execute("UPDATE t SET v = 7 WHERE id = 4")
        cur.execute(NARROW[src_db.kind])
        cur.execute("UPDATE t SET v = -v WHERE id <= 3")
    cdc.drain()
    assert cdc.apply_local("lake")[table]["status"] == "quarantined"
    cdc.dump_local("t")
    with src_db.cursor() as cur:
        cur.execute("INSERT INTO t VALUES (6, 6, 's6')")
    cdc.drain()
    res = cdc.apply_local("lake")[table]
    assert res["status"] == "applied", res
    cdc.assert_equal("t", target="lake")
    last = breaks(json.loads(cdc.state.r.hget(cdc.state.k("quarantined"), table)))[-1]
    _assert_log_once(cdc, target, schema, last, since)


# -- 3. mixed batches ----------------------------------------------------------------------------------


def _delete_behind(target, schema, key: int) -> None:
    if target.config.kind == "delta":
            DeltaTable(target.table_path(schema)).delete(f'"id" = {key}')
    else:
        from pyiceberg.expressions import EqualTo
        target._load(schema).delete(EqualTo("id", key))


@pytest.mark.parametrize("src_db,lake,via", [("mariadb", "delta", "local"), ("mariadb", "iceberg", "local"),
                                             ("postgres", "delta", "local"), ("postgres", "iceberg", "local"),
                                             ("mariadb", "iceberg", "spark")], indirect=["src_db"])
def test_one_batch_of_reinserts_key_moves_and_deletes_of_absent_keys(src_db, make_cdc, tmp_path, lake, via):
    """One apply batch holding: a new key inserted, deleted, inserted again; a key moved
    away and back (a -> b -> a) with a change between; a key moved away and its old key
    taken by a new row; a new key moved twice; a key swapped through a free one; a delete
    of a key the lake table does not hold (removed from it behind the apply), and a new key
    inserted and deleted: the lake equals the source, and its changelog holds each event
    once; through the local apply, and once through spark-submit."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT, s VARCHAR(20)")
        cur.execute("INSERT INTO t VALUES " + ", ".join(f"({i}, {i}, 's{i}')" for i in range(1, 9)))
    cdc = make_cdc(["t"], targets={"lake": lake_target(lake, tmp_path / "lake", changelog=True)})
    cdc.start_tail()
    cdc.dump_local("t")
    table = f"{cdc.db}.t"
    _ok(cdc.apply_local("lake")[table])
    target, schema = open_target(cdc.cfg.target("lake")), cdc.source.table_schema(table)
    _delete_behind(target, schema, 5)
    with src_db.cursor() as cur:
        cur.execute("INSERT INTO t VALUES (10, 10, 'a')")
        cur.execute("DELETE FROM t WHERE id = 10")
        cur.execute("INSERT INTO t VALUES (10, 11, 'b')")
        cur.execute("UPDATE t SET id = 100 WHERE id = 1")
        cur.execute("UPDATE t SET v = 101 WHERE id = 100")
        cur.execute("UPDATE t SET id = 1, s = 'back' WHERE id = 100")
        cur.execute("UPDATE t SET id = 20 WHERE id = 2")
        cur.execute("INSERT INTO t VALUES (2, 22, 'taken')")
        cur.execute("INSERT INTO t VALUES (11, 11, 'n')")
        cur.execute("UPDATE t SET id = 12 WHERE id = 11")
        cur.execute("UPDATE t SET id = 13, v = 13 WHERE id = 12")
        cur.execute("UPDATE t SET id = 0 WHERE id = 3")   # 3 and 4 swapped through 0
        cur.execute("UPDATE t SET id = 3 WHERE id = 4")
        cur.execute("UPDATE t SET id = 4 WHERE id = 0")
        cur.execute("DELETE FROM t WHERE id = 5")   # not in the lake table
        cur.execute("INSERT INTO t VALUES (14, 14, 'gone')")
        cur.execute("DELETE FROM t WHERE id = 14")
    cdc.drain()
    res = (cdc.apply_local("lake") if via == "local" else cdc.apply_spark("lake")["tables"])[table]
    _ok(res)
    assert res["events"] > 15, res   # one batch
    assert set(_copies(target, schema).values()) == {1}
    cdc.assert_equal("t", target="lake")
    _assert_log_once(cdc, target, schema, None)


# -- 4. values at the edges of what each lake holds ----------------------------------------------------

BIG = "x" * (1 << 20)
PG_EDGES = {   # each column's edge values, row by row (NULL: None)
    "d0": ["99999999999999999999999999999999999999", "-99999999999999999999999999999999999999", "0"],
    "d10": ["9999999999999999999999999999.9999999999", "-9999999999999999999999999999.9999999999",
            "-0.0000000001"],
    "f": ["NaN", "-Infinity", "-0"],
    "r": ["Infinity", "-0", "NaN"],
    "dt": ["0001-01-01", "9999-12-31", "2000-02-29"],
    "ts": ["0001-01-01 00:00:00.000001", "9999-12-31 23:59:59.999999", "2020-01-01 00:00:00.5"],
    "tz": ["9999-12-31 23:59:59.999999+00", "0001-01-01 00:00:00+00", "2020-06-30 23:59:59.999999-07"],
    "s": ["", None, " "],
    "b": [b"\x00", b"\x00a\x00\xff", b""],
    "j": ['{"a": "\\u00e9\\ud83d\\ude00", "z":1,  "a":2}', '"\\u0000"', "[]"],
    "jb": ['{"a": "\\u00e9\\ud83d\\ude00"}', '{"q": "\\"\\\\"}', "null"],
    "big": [BIG, "", None],
}
PG_TYPES = {"d0": "numeric(38,0)", "d10": "numeric(38,10)", "f": "double precision", "r": "real", "dt": "date",
            "ts": "timestamp(6)", "tz": "timestamptz", "s": "text", "b": "bytea", "j": "json", "jb": "jsonb",
            "big": "text"}
MY_EDGES = {
    "d0": PG_EDGES["d0"], "d10": PG_EDGES["d10"],
    "f": [-0.0, 1.7976931348623157e308, -2.2250738585072014e-308],
    "r": [-0.0, 3.4028234663852886e38, 1.401298464324817e-45],
    "dt": ["0001-01-01", "9999-12-31", "2000-02-29"],
    "ts": ["0001-01-01 00:00:00.000001", "9999-12-31 23:59:59.999999", "2020-01-01 00:00:00.5"],
    "tz": ["1970-01-01 00:00:01", "2038-01-19 03:14:07.999999", None],
    "s": ["", None, " "],
    "b": [b"\x00", b"\x00a\x00\xff", b""],
    "j": ['{"a": "\\u00e9\\ud83d\\ude00", "z":1,  "a":2}', '"\\u0000"', "[]"],
    "big": [BIG, "", None],
}
TEXT_KEYS = ["", " x", "'", "\\", "a'b\"c", "é", "z" * 700]
MY_TYPES = {"d0": "DECIMAL(38,0)", "d10": "DECIMAL(38,10)", "f": "DOUBLE", "r": "FLOAT", "dt": "DATE",
            "ts": "DATETIME(6)", "tz": "TIMESTAMP(6) NULL",
            "s": "VARCHAR(10)", "b": "BLOB", "j": "JSON", "big": "LONGTEXT"}


def test_edge_values_reach_both_lakes_exactly_by_dump_and_by_log(src_db, make_cdc):
    """Decimals at ±(10^38 - 1) (key columns too), NaN / ±Infinity / -0.0, dates at years 1
    and 9999, timestamps to the microsecond at both ends, '' and NULL, bytes with NULs,
    JSON with unicode escapes and repeated names, 1 MB of text; text keys '', ' ', quotes,
    backslashes, 700 characters: equal on Delta and Iceberg after a dump, after updates
    that move each row's values to another row's, key moves, and deletes."""
    edges, types = (PG_EDGES, PG_TYPES) if src_db.kind == "postgres" else (MY_EDGES, MY_TYPES)
    names = list(edges)
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, " + ", ".join(f"{c} {types[c]}" for c in names))
        src_db.create_table(cur, "k", f"n {types['d0']}, m {types['d10']}, d DATE, v INT, PRIMARY KEY (n, m, d)")
        src_db.create_table(cur, "s", f"k {'text' if src_db.kind == 'postgres' else 'VARCHAR(768)'} PRIMARY KEY, v INT")
        cur.execute("INSERT INTO s VALUES " + ", ".join(["(%s, %s)"] * len(TEXT_KEYS)),
                    [x for i, k in enumerate(TEXT_KEYS) for x in (k, i)])
        for i in range(3):
            cur.execute(f"INSERT INTO t VALUES (%s, {', '.join(['%s'] * len(names))})",
                        [i + 1] + [edges[c][i] for c in names])
            cur.execute("INSERT INTO k VALUES (%s, %s, %s, %s)", (edges["d0"][i], edges["d10"][i], edges["dt"][i], i))
    cdc = make_cdc(["t", "k", "s"], lake="both")
    cdc.start_tail()
    _dump(cdc, DumpSpec("all", []))
    for target in ("lake", "ice"):
        for res in cdc.apply_local(target).values():
            _ok(res)
        cdc.assert_equal("t", "k", "s", target=target)
    with src_db.cursor() as cur:
        for i in range(3):   # each row takes the next row's values
            j = (i + 1) % 3
            cur.execute(f"UPDATE t SET {', '.join(f'{c} = %s' for c in names)} WHERE id = %s",
                        [edges[c][j] for c in names] + [i + 1])
        cur.execute("UPDATE k SET v = v + 10")
        cur.execute("DELETE FROM k WHERE d = %s", (edges["dt"][1],))
        cur.execute("INSERT INTO t (id) VALUES (4)")
        cur.execute("UPDATE s SET v = v + 100")
        cur.execute("UPDATE s SET k = 'moved' WHERE k = ''")
        cur.execute("UPDATE s SET k = '' WHERE k = ' x'")
        cur.execute("DELETE FROM s WHERE k = %s", (TEXT_KEYS[-1],))
    cdc.drain()
    raw = ["f", "s", "b", "j", "big"] + (["r"] if src_db.kind == "postgres" else [])   # (MariaDB prints FLOAT rounded)
    with src_db.cursor() as cur:   # the source's own values of the columns a verify normalises least
        cols = [c + "::text" if c == "j" and src_db.kind == "postgres" else c for c in raw]   # (json unparsed)
        cur.execute(f"SELECT id, {', '.join(cols)} FROM t ORDER BY id")
        want = [tuple(repr(v) if isinstance(v, float) else bytes(v) if isinstance(v, memoryview) else v for v in r)
                for r in cur.fetchall()]
    for target in ("lake", "ice"):
        for res in cdc.apply_local(target).values():
            _ok(res)
        cdc.assert_equal("t", "k", "s", target=target)
        lake_t = open_target(cdc.cfg.target(target))
        got = [tuple(repr(r[c]) if isinstance(r[c], float) else r[c] for c in ["id"] + raw)
               for r in lake_t.rows(cdc.source.table_schema(f"{cdc.db}.t"))]
        assert got == want, target


@POSTGRES
def test_float_keys_at_their_edges_in_delta_stay_one_row_each(src_db, make_cdc):
    """A double precision key (Delta takes float keys; Iceberg refuses them) holding NaN,
    ±Infinity, 0 and a tiny subnormal: updated, moved to -0 (one key with 0 at the source),
    deleted, moved to another value; then a full dump and its sweep: one row per key, equal."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "f", "k double precision PRIMARY KEY, v integer")
        cur.execute("INSERT INTO f VALUES ('NaN', 1), ('Infinity', 2), ('-Infinity', 3), (0, 4), (5e-324, 5), (1.5, 6)")
    cdc = make_cdc(["f"], lake="delta")
    cdc.start_tail()
    cdc.dump_local("f")
    table = f"{cdc.db}.f"
    _ok(cdc.apply_local("lake")[table])
    cdc.assert_equal("f", target="lake")
    with src_db.cursor() as cur:
        cur.execute("UPDATE f SET v = 10 WHERE k = 'NaN'")
        cur.execute("UPDATE f SET k = '-0', v = 40 WHERE k = 0")
        cur.execute("DELETE FROM f WHERE k = 'Infinity'")
        cur.execute("UPDATE f SET k = 2.5 WHERE k = '-Infinity'")
        cur.execute("UPDATE f SET v = 50 WHERE k = 5e-324")
    cdc.drain()
    _ok(cdc.apply_local("lake")[table])
    target, schema = open_target(cdc.cfg.target("lake")), cdc.source.table_schema(table)
    assert set(_copies(target, schema).values()) == {1}, _copies(target, schema)
    cdc.assert_equal("f", target="lake")
    with src_db.cursor() as cur:
        cur.execute("UPDATE f SET k = 0 WHERE k = '-0'")
        cur.execute("DELETE FROM f WHERE k = 'NaN'")
    cdc.drain()
    cdc.dump_local("f")
    _ok(cdc.apply_local("lake")[table])
    assert target.count(schema) == 4, target.rows(schema)
    cdc.assert_equal("f", target="lake")


@POSTGRES
def test_a_nan_key_held_twice_in_delta_is_collapsed_by_the_merge_and_a_full_dump(src_db, make_cdc):
    """A NaN key (one key at the source: PostgreSQL's NaN equals itself) held twice in the
    Delta table (a copy written behind the apply): an update of it, then a full dump, leave
    one row."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "f", "k double precision PRIMARY KEY, v integer")
        cur.execute("INSERT INTO f VALUES ('NaN', 1), (1.5, 2)")
    cdc = make_cdc(["f"], lake="delta")
    cdc.start_tail()
    cdc.dump_local("f")
    table = f"{cdc.db}.f"
    _ok(cdc.apply_local("lake")[table])
    target, schema = open_target(cdc.cfg.target("lake")), cdc.source.table_schema(table)
    lake_append_behind(target, schema, pa.table({"k": [float("nan"), 1.5], "v": [-1, -2], "_dblog_pos": [OLD, OLD],
                                                 "_dblog_op": ["insert", "insert"]}))
    with src_db.cursor() as cur:
        cur.execute("UPDATE f SET v = 10")
    cdc.drain()
    _ok(cdc.apply_local("lake")[table])
    cdc.dump_local("f")
    _ok(cdc.apply_local("lake")[table])
    assert target.count(schema) == 2, target.rows(schema)
    cdc.assert_equal("f", target="lake")



# -- 5. two lake targets of one source, one of them held ---------------------------------------------


@POSTGRES
def test_a_far_date_key_held_on_both_lakes_is_released_by_moving_the_key(src_db, make_cdc):
    """A row whose key date is past year 9999 (neither lake holds it): that table is held on
    both lakes only (PostgreSQL and another table go on); the key moved at the source to a
    date they hold (a delete of the far key, an insert): both lakes equal the source."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "d date, n integer, v integer, PRIMARY KEY (d, n)")
        src_db.create_table(cur, "u", "id integer PRIMARY KEY, v integer")
        cur.execute("INSERT INTO t VALUES ('2000-01-01', 1, 1)")
        cur.execute("INSERT INTO u VALUES (1, 1)")
    cdc = make_cdc(["t", "u"], lake="both")
    cdc.start_tail()
    _dump(cdc, DumpSpec("all", []))
    t = f"{cdc.db}.t"
    with src_db.cursor() as cur:
        cur.execute("INSERT INTO t VALUES ('10000-01-01', 2, 2)")
        cur.execute("UPDATE t SET v = 10 WHERE n = 1")
        cur.execute("INSERT INTO u VALUES (2, 2)")
    cdc.drain()
    for name in ("tgt", "lake", "ice"):
        res = cdc.apply_local(name)
        assert res[t]["status"] == ("applied" if name == "tgt" else "held"), (name, res[t])
        cdc.assert_equal("u", target=name)
    with src_db.cursor() as cur:
        cur.execute("UPDATE t SET d = '9999-12-31' WHERE n = 2")
    cdc.drain()
    for name in ("tgt", "lake", "ice"):
        for res in cdc.apply_local(name).values():
            _ok(res)
        cdc.assert_equal("t", "u", target=name)



@POSTGRES
def test_two_lakes_of_one_source_one_held_the_other_going_on_then_both_equal(src_db, make_cdc, tmp_path):
    """A timestamp past year 9999 (Delta holds it, Iceberg cannot): the Iceberg table is held
    while Delta, the PostgreSQL target and another table go on; then a date past 9999 holds
    the Delta table too; each value fixed at the source: every target equal, Iceberg's
    changelog every event once."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id integer PRIMARY KEY, d date, ts timestamp, v integer")
        src_db.create_table(cur, "u", "id integer PRIMARY KEY, v integer")
        cur.execute("INSERT INTO t VALUES (1, '2000-01-01', '2000-01-01', 1), (2, '2000-01-02', '2000-01-02', 2)")
        cur.execute("INSERT INTO u VALUES (1, 1)")
    cdc = make_cdc(["t", "u"], targets={"lake": lake_target("delta", tmp_path / "lake"),
                                        "ice": lake_target("iceberg", tmp_path / "ice", changelog=True)})
    cdc.start_tail()
    _dump(cdc, DumpSpec("all", []))
    t, u = f"{cdc.db}.t", f"{cdc.db}.u"
    names = ("tgt", "lake", "ice")

    def run() -> dict[str, dict]:
        return {name: cdc.apply_local(name) for name in names}
    for results in run().values():
        for res in results.values():
            _ok(res)
    with src_db.cursor() as cur:
        cur.execute("UPDATE t SET ts = '10000-01-01 00:00:00.000001' WHERE id = 2")
        cur.execute("INSERT INTO t VALUES (3, '2000-01-03', '2000-01-03', 3)")
        cur.execute("INSERT INTO u VALUES (2, 2)")
    cdc.drain()
    results = run()
    held = results["ice"][t]
    assert held["status"] == "held" and f"{t}.ts = " in held["held"]["error"], held
    for name in ("tgt", "lake"):
        _ok(results[name][t])
        cdc.assert_equal("t", target=name)
    for name in names:
        _ok(results[name][u])
        cdc.assert_equal("u", target=name)
    with src_db.cursor() as cur:
        cur.execute("UPDATE t SET d = '10000-01-01', v = 30 WHERE id = 3")
        cur.execute("UPDATE t SET v = 10 WHERE id = 1")
        cur.execute("INSERT INTO u VALUES (3, 3)")
    cdc.drain()
    results = run()
    for name in ("lake", "ice"):
        assert results[name][t]["status"] == "held", (name, results[name][t])
    assert f"{t}.d = " in results["lake"][t]["held"]["error"], results["lake"][t]
    _ok(results["tgt"][t])
    cdc.assert_equal("t", target="tgt")
    for name in names:
        cdc.assert_equal("u", target=name)
    with src_db.cursor() as cur:
        cur.execute("UPDATE t SET ts = '2001-01-01 00:00:00.000001' WHERE id = 2")
        cur.execute("UPDATE t SET d = '2001-01-03' WHERE id = 3")
        cur.execute("UPDATE u SET v = 20 WHERE id = 2")
    cdc.drain()
    for name, results in run().items():
        for table, res in results.items():
            assert res["status"] == "applied", (name, table, res)
        cdc.assert_equal("t", "u", target=name)
    ice = open_target(cdc.cfg.target("ice"))
    _assert_log_once(cdc, ice, cdc.source.table_schema(t), None)
