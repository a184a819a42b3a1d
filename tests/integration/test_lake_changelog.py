"""The changelog tables of the lake targets (issue 28, ``changelog: true``): one row per
event (a dump's rows and every change, not the latest per key) in position order, with the
row images exact, the source's commit time and its UTC day (the partition column); exactly
once across a replayed batch and a crash between the changelog's commit and the
current-state table's; the same through the Spark apply; a new column and a widening flow
into the images; a type the changelog cannot hold is refused. Delta and Iceberg on both
sources, read back with ``deltalake`` / ``pyiceberg``.
"""
from __future__ import annotations

import datetime as dt
import json

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from airflow_provider_dblog.engine.apply_batch import LocalApplier, ordered
from airflow_provider_dblog.engine.apply_plan import plan_table
from airflow_provider_dblog.engine.dump import DumpRunner
from airflow_provider_dblog.engine.errors import TargetValueError
from airflow_provider_dblog.engine.events import Event, events_to_arrow
from airflow_provider_dblog.engine.local_chunks import LocalChunkReader
from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.requests import DumpSpec
from airflow_provider_dblog.engine.schema import Column, TableSchema
from airflow_provider_dblog.engine.targets import open_target
from airflow_provider_dblog.engine.targets.changelog import changelog_name
from helpers import lake_target


@pytest.fixture(params=["delta", "iceberg"])
def lake(request) -> str:
    return request.param


def _lake_target(kind: str, tmp_path, name: str) -> dict:
    """A lake target keeping changelog tables (the Iceberg catalog in the private PostgreSQL)."""
    return lake_target(kind, tmp_path / name, changelog=True)


def _setup(src_db, make_cdc, tmp_path, lake, rows: int = 20, spark: bool = False):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT, s VARCHAR(40), d DECIMAL(10,2)")
        cur.execute("INSERT INTO t (id, v, s, d) VALUES " + ", ".join(
            f"({i}, {i}, 'row {i}', {i}.5)" for i in range(1, rows + 1)))
    targets = {"lake": _lake_target(lake, tmp_path, "lake")}
    if spark:   # a second lake target of the same kind, applied through spark-submit
        targets["lake2"] = _lake_target(lake, tmp_path, "lake2")
    cdc = make_cdc(["t"], targets=targets)
    cdc.start_tail()
    rid = cdc.request(DumpSpec("table", [f"{cdc.db}.t"]))
    DumpRunner(cdc.source, cdc.state, cdc.store, LocalChunkReader(cdc.source), cdc.cfg.dump).run(rid)
    assert cdc.state.request(rid)["status"] == "done", cdc.state.request(rid)
    return cdc


def _writes(src_db, base: int = 0) -> None:
    """Several updates of one key, a delete then re-insert of another, an insert, a delete."""
    with src_db.cursor() as cur:
        for i in range(3):
            cur.execute("UPDATE t SET v = v + 1, s = %s WHERE id = 1", (f"u{base + i}",))
        cur.execute("DELETE FROM t WHERE id = 2")
        cur.execute("INSERT INTO t (id, v, s, d) VALUES (2, %s, 'again', 2.75)", (200 + base,))
        cur.execute("INSERT INTO t (id, v, s, d) VALUES (%s, 100, 'new', 100.5)", (100 + base,))
        cur.execute("DELETE FROM t WHERE id = %s", (3 + base // 10,))


def _changelog(target, schema) -> pa.Table:
    name = changelog_name(schema)
    if target.config.kind == "delta":
        data = DeltaTable(f"{target.root}/{name}").to_pyarrow_table()
    else:
        data = target.catalog.load_table((target.namespace, name)).scan().to_arrow()
    return data.sort_by([("_dblog_pos", "ascending")])


def _version(target, schema):
    name = changelog_name(schema)
    if target.config.kind == "delta":
        return DeltaTable(f"{target.root}/{name}").version()
    return target.catalog.load_table((target.namespace, name)).metadata_location


def _partitioning(target, schema) -> list[str]:
    name = changelog_name(schema)
    if target.config.kind == "delta":
        return DeltaTable(f"{target.root}/{name}").metadata().partition_columns
    t = target.catalog.load_table((target.namespace, name))
    return [f"{str(f.transform)}({t.schema().find_field(f.source_id).name})" for f in t.spec().fields]


def _assert_log_is_the_events(log: pa.Table, events: pa.Table) -> None:
    """One changelog row per event, in position order, every value exact."""
    assert log["_dblog_pos"].to_pylist() == events["pos"].to_pylist()
    assert log["op"].to_pylist() == events["op"].to_pylist()
    ms = events["source_ts"].to_pylist()
    assert log["source_ts"].cast(pa.int64()).to_pylist() == [m * 1000 for m in ms]
    assert log["commit_date"].to_pylist() == [dt.datetime.fromtimestamp(m / 1000, dt.timezone.utc).date()
                                              for m in ms]
    for image in ("before", "after"):
        assert log[image].to_pylist() == events[image].to_pylist(), image


def _ops(log: pa.Table, key: int) -> list[str]:
    return [r["op"] for r in log.to_pylist() if (r["after"] or r["before"])["id"] == key]


@pytest.mark.parametrize("src_db,lake", [("mariadb", "delta"), ("postgres", "iceberg")], indirect=True)  # (CI time)
def test_the_changelog_holds_every_event_once_in_position_order(src_db, make_cdc, tmp_path, lake):
    cdc = _setup(src_db, make_cdc, tmp_path, lake)
    _writes(src_db)
    cdc.drain()
    target = open_target(cdc.cfg.target("lake"))
    schema = cdc.source.table_schema(f"{cdc.db}.t")
    applier = LocalApplier(target, cdc.store, cdc.state, "src")
    batch = plan_table(target, cdc.store, cdc.state, "src", schema)
    events = cdc.store.read_range(schema, None, batch.frontier)
    first = applier.apply_batch(batch)
    assert first["status"] == "applied" and first["changelog_rows"] == events.num_rows == 20 + 7, first
    version = _version(target, schema)
    again = applier.apply_batch(batch)   # the same batch after a crash past both commits: nothing appended
    assert again["changelog_rows"] == 0 and _version(target, schema) == version, again
    log = _changelog(target, schema)
    _assert_log_is_the_events(log, events)
    assert _ops(log, 1) == ["snapshot", "update", "update", "update"]   # three updates in one batch, each a row
    assert _ops(log, 2) == ["snapshot", "delete", "insert"]             # a delete then a re-insert, in order
    assert _ops(log, 3) == ["snapshot", "delete"]
    assert _partitioning(target, schema) in (["commit_date"], ["identity(commit_date)"])

    # a crash between the changelog's commit and the current-state table's, then more
    # writes: the next batch starts before the changelog's position and appends only past it
    _writes(src_db, base=10)
    cdc.drain()
    batch = plan_table(target, cdc.store, cdc.state, "src", schema)
    appended = target.append_changelog(batch.schema, ordered(applier.read_batch(batch)), "src", batch.frontier)
    assert appended == 7
    _writes(src_db, base=20)
    cdc.drain()
    batch = plan_table(target, cdc.store, cdc.state, "src", schema)
    res = applier.apply_batch(batch)
    assert res["status"] == "applied" and res["events"] == 14 and res["changelog_rows"] == 7, res
    assert res["inserted"] == 2, res
    log = _changelog(target, schema)
    _assert_log_is_the_events(log, cdc.store.read_range(schema, None, batch.frontier))
    # the latest image of each key is the source's row (the current-state table equals it)
    cdc.assert_equal("t", target="lake")
    latest = {}
    for r in log.to_pylist():
        latest[(r["after"] or r["before"])["id"]] = None if r["op"] == "delete" else r["after"]
    assert sorted((r for r in latest.values() if r), key=lambda r: r["id"]) == target.rows(schema)


@pytest.mark.parametrize("src_db,lake", [("mariadb", "delta"), ("postgres", "iceberg")], indirect=True)  # (CI time)
def test_a_truncate_is_a_changelog_row_once(src_db, make_cdc, tmp_path, lake):
    """A TRUNCATE that empties the target (schema_changes evolve) is a row of the
    changelog (op ``truncate``, no images, its source time) at its place in the log: with
    the events before it in one batch, and alone in a batch (the path with no events);
    a replay appends nothing; the current-state table equals the source after each."""
    cdc = _setup(src_db, make_cdc, tmp_path, lake, rows=5)
    with src_db.cursor() as cur:
        cur.execute("UPDATE t SET v = 10 WHERE id = 1")
        cur.execute("TRUNCATE TABLE t")
        cur.execute("INSERT INTO t (id, v, s, d) VALUES (7, 7, 'after', 7.5)")
    cdc.drain()
    res = cdc.apply_local("lake")[f"{cdc.db}.t"]   # two batches: up to the TRUNCATE, then on from it
    assert res["changelog_rows"] == 5 + 1 + 1 + 1 and len(res["evolved"]) == 1, res
    cdc.assert_equal("t", target="lake")
    with src_db.cursor() as cur:   # a TRUNCATE alone in its batch
        cur.execute("TRUNCATE TABLE t")
    cdc.drain()
    res = cdc.apply_local("lake")[f"{cdc.db}.t"]
    assert res["events"] == 0 and res["changelog_rows"] == 1 and len(res["evolved"]) == 1, res
    target = open_target(cdc.cfg.target("lake"))
    schema = cdc.source.table_schema(f"{cdc.db}.t")
    assert target.count(schema) == 0
    version = _version(target, schema)
    assert cdc.apply_local("lake")[f"{cdc.db}.t"].get("changelog_rows", 0) == 0   # nothing new: no commit
    assert _version(target, schema) == version
    log = _changelog(target, schema).to_pylist()
    assert [r["op"] for r in log] == ["snapshot"] * 5 + ["update", "truncate", "insert", "truncate"]
    cuts = [r for r in log if r["op"] == "truncate"]
    assert all(r["before"] is None and r["after"] is None and r["error"] is None for r in cuts)
    stamps = [r["source_ts"] for r in log[5:]]   # the source's commit times, in log order
    assert stamps == sorted(stamps) and stamps[0].year >= 2025, stamps
    assert cuts[0]["commit_date"] == cuts[0]["source_ts"].date()
    # each TRUNCATE row sits at the position the tail recorded it at
    truncated = [p for p, v in cdc.store.schema_versions(f"{cdc.db}.t") if v.get("truncated")]
    assert [r["_dblog_pos"] for r in cuts] == [p.encode() for p in truncated]


# one kind: the driver's ordered read is the kind's own code only past append_changelog,
# which every other test here drives on both kinds (a spark-submit costs ~50 s)
@pytest.mark.parametrize("src_db", ["mariadb"], indirect=True)
@pytest.mark.parametrize("lake", ["iceberg"])
def test_the_spark_apply_gives_the_same_changelog(src_db, make_cdc, tmp_path, lake):
    """A batch applied through spark-submit: the driver streams the batch's event files in
    position order into the changelog table (never the batch in one list), as the
    in-process apply does."""
    cdc = _setup(src_db, make_cdc, tmp_path, lake, rows=1500, spark=True)
    _writes(src_db, base=2000)
    with src_db.cursor() as cur:
        cur.execute("UPDATE t SET v = -v WHERE id % 3 = 0")
        cur.execute("DELETE FROM t WHERE id % 7 = 0")
    cdc.drain()
    local = cdc.apply_local("lake")[f"{cdc.db}.t"]
    spark = cdc.apply_spark("lake2")["tables"][f"{cdc.db}.t"]
    assert local["status"] == spark["status"] == "applied", (local, spark)
    assert local["changelog_rows"] == spark["changelog_rows"] == local["events"], (local, spark)
    schema = cdc.source.table_schema(f"{cdc.db}.t")
    log = _changelog(open_target(cdc.cfg.target("lake2")), schema)
    assert log.to_pylist() == _changelog(open_target(cdc.cfg.target("lake")), schema).to_pylist()
    _assert_log_is_the_events(log, cdc.store.read_range(schema, None, Position.decode(spark["to"])))
    cdc.assert_equal("t", target="lake2")


def test_a_new_column_and_a_widening_flow_into_the_images(src_db, make_cdc, tmp_path, lake):
    cdc = _setup(src_db, make_cdc, tmp_path, lake, rows=5)
    cdc.drain()
    cdc.apply_local("lake")
    mysql = src_db.kind == "mysql"
    for ddl, write in (("ALTER TABLE t ADD COLUMN note VARCHAR(20) NULL", "UPDATE t SET note = 'n' WHERE id = 1"),
                       ("ALTER TABLE t MODIFY v BIGINT" if mysql else "ALTER TABLE t ALTER COLUMN v TYPE bigint",
                        "UPDATE t SET v = 5000000000 WHERE id = 2")):
        with src_db.cursor() as cur:
            cur.execute(ddl)
            cur.execute(write)
        cdc.drain()   # the tail reads each ALTER before the next
    res = cdc.apply_local("lake")[f"{cdc.db}.t"]
    assert res["status"] == "applied" and res.get("changelog_rows") == res["events"] == 2, res   # both batches
    cdc.assert_equal("t", target="lake")
    target = open_target(cdc.cfg.target("lake"))
    schema = cdc.source.table_schema(f"{cdc.db}.t")
    log = _changelog(target, schema)
    assert log.schema.field("after").type.field("v").type == pa.int64()   # widened, every value kept
    assert [f.name for f in log.schema.field("after").type] == ["id", "v", "s", "d", "note"]
    rows = log.to_pylist()
    assert [r["op"] for r in rows] == ["snapshot"] * 5 + ["update", "update"]
    assert [r["after"]["v"] for r in rows] == [1, 2, 3, 4, 5, 1, 5000000000]
    assert [r["after"]["note"] for r in rows] == [None] * 5 + ["n", None]   # null before the column existed
    assert rows[-1]["before"]["v"] == 2 and rows[-1]["after"]["s"] == "row 2"

    # a column of the same name whose type holds neither's values: refused, never cast
    odd = TableSchema(cdc.db, "t", (Column("id", "int32", False), Column("v", "string")), ("id",))
    page = events_to_arrow(odd, [Event(f"{cdc.db}.t", "update", (1,), {"id": 1, "v": "x"}, {"id": 1, "v": "y"},
                                       Position(2**31, 0, 0), 1_700_000_000_000)])
    with pytest.raises(TargetValueError, match=rf"{cdc.db}\.t\.v: the changelog table .* holds it as int64"):
        target.append_changelog(odd, [page], "src", Position(2**31, 1, 0))
    assert _changelog(target, schema).num_rows == 7


def test_the_spark_drivers_read_merges_event_files_in_position_order_once_each(tmp_path):
    """apply_batch.ordered_events (no servers): log segments, a snapshot whose positions lie
    inside a segment's range, a zombie tail's copy of a segment, a file out of order, an
    older file without the ``error`` column; pages smaller than the files."""
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    from airflow_provider_dblog.engine.apply_batch import ordered_events
    from airflow_provider_dblog.engine.events import event_arrow_schema

    schema = TableSchema("db", "t", (Column("id", "int32", False), Column("v", "int64")), ("id",))

    def file(name: str, positions: list[tuple[int, int]], op: str = "update", error: bool = True) -> str:
        events = [Event("db.t", op, (k,), None, {"id": k, "v": off}, Position(1, off, seq), off)
                  for k, (off, seq) in enumerate(positions)]
        data = events_to_arrow(schema, events)
        path = str(tmp_path / name)
        pq.write_table(data if error else data.drop_columns(["error"]), path)
        return path

    files = [file("log-a", [(10, 0), (10, 1), (30, 0), (50, 0)]),
             file("snap", [(20, 0), (20, 1), (20, 2)], op="snapshot"),
             file("log-a.zombie", [(10, 0), (10, 1), (30, 0)]),
             file("log-b", [(90, 0), (70, 0), (60, 0)], error=False),   # not in order: read whole, sorted
             file("log-c", [(80, 0), (95, 0)])]
    lo, hi = Position(1, 10, 1).encode(), Position(1, 95, 0).encode()
    pages = list(ordered_events(pafs.LocalFileSystem(), files, event_arrow_schema(schema), lo, hi, rows=2))
    got = [(p.offset, p.seq) for page in pages for p in map(Position.decode, page["pos"].to_pylist())]
    assert got == [(10, 1), (20, 0), (20, 1), (20, 2), (30, 0), (50, 0), (60, 0), (70, 0), (80, 0), (90, 0)]
    assert len(pages) > 1 and all(page.schema == event_arrow_schema(schema) for page in pages)


@pytest.mark.parametrize("src_db", ["postgres"], indirect=True)
def test_a_far_date_is_named_in_the_changelog_row_and_holds_only_the_current_state_table(src_db, make_cdc,
                                                                                        tmp_path, lake):
    """A date the lake cannot hold ('infinity'): the changelog row keeps the event with that
    field null and the exact value named in ``error`` (an event stays in the log: refusing
    it would hold the table for good); the current-state table holds the row until it
    changes at the source, then both go on."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "f", "id integer PRIMARY KEY, d date, v integer")
    cdc = make_cdc(["f"], targets={"lake": _lake_target(lake, tmp_path, "lake")})
    cdc.start_tail()
    with src_db.cursor() as cur:
        cur.execute("INSERT INTO f VALUES (1, '2024-02-29', 1), (2, 'infinity', 2)")
    cdc.drain()
    table = f"{cdc.db}.f"
    res = cdc.apply_local("lake")[table]
    assert res["status"] == "held" and "'infinity'" in res["held"]["error"], res
    target = open_target(cdc.cfg.target("lake"))
    schema = cdc.source.table_schema(table)
    log = _changelog(target, schema).to_pylist()
    assert [(r["op"], r["after"]["id"]) for r in log] == [("insert", 1), ("insert", 2)], log
    assert log[0]["after"]["d"] == dt.date(2024, 2, 29) and log[0]["error"] is None
    assert log[1]["after"]["d"] is None and log[1]["after"]["v"] == 2
    assert "after.d = 'infinity' is not carried" in log[1]["error"], log[1]["error"]
    assert cdc.apply_local("lake")[table]["status"] == "held"   # held again; the changelog has it already
    assert _changelog(target, schema).num_rows == 2
    with src_db.cursor() as cur:
        cur.execute("UPDATE f SET d = '2030-01-01' WHERE id = 2")
    cdc.drain()
    assert cdc.apply_local("lake")[table]["status"] == "applied"
    cdc.assert_equal("f", target="lake")
    log = _changelog(target, schema).to_pylist()
    assert len(log) == 3 and log[2]["before"]["d"] is None and log[2]["after"]["d"] == dt.date(2030, 1, 1)
    assert "before.d = 'infinity' is not carried" in log[2]["error"], log[2]["error"]


@pytest.mark.parametrize("src_db,lake", [("mariadb", "delta"), ("postgres", "iceberg")], indirect=True)  # (CI time)
def test_maintenance_of_a_target_with_changelogs_keeps_every_table_and_position(src_db, make_cdc, tmp_path,
                                                                                  lake):
    """``dblog maintain`` takes every table of the target, changelog tables included
    (Iceberg: sorted by position, they have no key): rows and positions unchanged, and the
    next batch appends only its own events."""
    from airflow_provider_dblog.engine.maintain import run_maintain
    cdc = _setup(src_db, make_cdc, tmp_path, lake)
    for base in (0, 10, 20):   # a few applies: a few files in each table
        _writes(src_db, base=base)
        cdc.drain()
        assert cdc.apply_local("lake")[f"{cdc.db}.t"]["status"] == "applied"
    target = open_target(cdc.cfg.target("lake"))
    schema = cdc.source.table_schema(f"{cdc.db}.t")
    log, rows = _changelog(target, schema), target.rows(schema, with_pos=True)
    out = run_maintain(cdc.cfg, "lake", retention_hours=168 if lake == "delta" else 1)
    assert set(out["tables"]) == {f"{cdc.db}__t", changelog_name(schema)}, out
    assert _changelog(target, schema).equals(log) and target.rows(schema, with_pos=True) == rows
    _writes(src_db, base=30)
    cdc.drain()
    res = cdc.apply_local("lake")[f"{cdc.db}.t"]
    assert res["status"] == "applied" and res["changelog_rows"] == 7, res
    assert _changelog(target, schema).num_rows == log.num_rows + 7
    cdc.assert_equal("t", target="lake")


# -- changes of the current-state table with no log event of their own ----------------------
class _Killed(Exception):
    """The sweep dying at a chosen point (as a kill would: nothing after it runs)."""


def _dying(target, after: str):
    """``target`` whose delete_orphans dies after handing its rows to the sweep and before
    its delete commit (``after="rows"``), or just after that commit (``"commit"``)."""
    real = target.delete_orphans

    def delete_orphans(*args, before_delete=None, **kwargs):
        def then_die(rows):
            before_delete(rows)
            raise _Killed("between the changelog rows and the delete")
        real(*args, before_delete=then_die if after == "rows" else before_delete, **kwargs)
        raise _Killed("after the delete commit")
    target.delete_orphans = delete_orphans
    return target


def _replay(log: pa.Table | list[dict], schema) -> list[dict]:
    """The rows a reader gets by replaying the changelog in position order: a truncate or
    rebuild row empties it, a delete or sweep row removes its key (its before image)."""
    state = {}
    for r in (log.to_pylist() if isinstance(log, pa.Table) else log):
        if r["op"] in ("truncate", "rebuild"):
            state.clear()
        elif r["op"] in ("delete", "sweep"):
            state.pop(r["before"]["id"], None)
        else:
            state[r["after"]["id"]] = {c: r["after"][c] for c in schema.column_names}
    return [state[k] for k in sorted(state)]


@pytest.mark.parametrize("src_db,lake", [("mariadb", "delta"), ("postgres", "iceberg")], indirect=["src_db"])
def test_a_sweeps_deletes_are_changelog_rows_once_across_reruns(src_db, make_cdc, tmp_path, lake):
    """Rows only the lake table holds (written behind the apply, at an old position), swept
    by a full dump: one ``sweep`` row per deleted row (its before image the row, no after
    image) just below the sweep's ``until``, once although the sweep dies between its
    changelog rows and its delete, and again just after its delete commit; the rerun
    reports the rows the killed run deleted; replaying the changelog gives the table."""
    from airflow_provider_dblog.engine.sweep import sweep_table
    from helpers import lake_append_behind
    cdc = _setup(src_db, make_cdc, tmp_path, lake, rows=5)
    table, target = f"{cdc.db}.t", open_target(cdc.cfg.target("lake"))
    schema = cdc.source.table_schema(table)
    assert cdc.apply_local("lake")[table]["status"] == "applied"
    lake_append_behind(target, schema, pa.table({
        "id": [100, 101], "v": [0, 1], "s": ["ghost", "ghost"], "d": pa.nulls(2, pa.decimal128(10, 2)),
        "_dblog_pos": [Position(0, 1, 0).encode()] * 2, "_dblog_op": ["insert"] * 2}))
    cdc.dump_local("t")
    applier = LocalApplier(target, cdc.store, cdc.state, "src")   # the dump's batch, without its sweep
    assert applier.apply_batch(plan_table(target, cdc.store, cdc.state, "src", schema))["status"] == "applied"
    until = Position.decode(cdc.state.pending_sweep(table, "lake")["until"])
    assert target.applied_pos("src", schema) >= until

    def swept() -> list[tuple]:
        log = _changelog(target, schema).to_pylist()
        return [(r["_dblog_pos"], r["before"]["id"], r["before"]["s"], r["after"]) for r in log if r["op"] == "sweep"]
    want = [(until.just_below().encode(), k, "ghost", None) for k in (100, 101)]
    for after, ghosts in (("rows", {100, 101}), ("commit", set())):
        with pytest.raises(_Killed):
            sweep_table(_dying(open_target(cdc.cfg.target("lake")), after), "lake", cdc.store, cdc.state,
                        cdc.src_cfg, schema)
        assert sorted(swept()) == want, after
        assert {r["id"] for r in target.rows(schema)} & {100, 101} == ghosts, after
    res = cdc.apply_local("lake")[table]
    assert res.get("orphans_deleted") == 2, res   # the killed run's delete, counted once
    assert sorted(swept()) == want and cdc.state.pending_sweep(table, "lake") is None
    cdc.assert_equal("t", target="lake")
    version = _version(target, schema)
    assert not cdc.apply_local("lake")[table].get("orphans_deleted") and _version(target, schema) == version
    assert _replay(_changelog(target, schema), schema) == target.rows(schema)


NARROW = {"mysql": "ALTER TABLE t MODIFY v SMALLINT", "postgres": "ALTER TABLE t ALTER COLUMN v TYPE smallint"}
MARKERS = ("sweep", "rebuild")


def _in_order(log: list[dict]) -> list[dict]:
    """The changelog in the order the README gives: by position, a marker row after the log
    event at its position."""
    return sorted(log, key=lambda r: (r["_dblog_pos"], r["op"] in MARKERS))


@pytest.mark.parametrize("src_db,lake,mid", [("postgres", "delta", False), ("mariadb", "iceberg", False),
                                             ("postgres", "iceberg", True)], indirect=["src_db"],
                         ids=["postgres-delta", "mariadb-iceberg", "postgres-iceberg-break-inside-a-transaction"])
def test_a_quarantine_rebuild_is_a_changelog_row_once_across_a_rerun(src_db, make_cdc, tmp_path, lake, mid):
    """A change the lake cannot follow (a column narrowed) quarantines the table; a full
    dump releases it and the current-state table is rebuilt empty: one ``rebuild`` row (no
    images) just below the break, before every event after it; the rebuild run again (its
    record lost, as a kill before it is recorded leaves it) appends no second one; replaying
    the changelog gives the table. ``mid``: the ALTER follows a change in its transaction,
    so just below the break is that change's position: the rebuild row ties with it and
    orders after it."""
    from airflow_provider_dblog.engine.quarantine import REBUILT, breaks
    cdc = _setup(src_db, make_cdc, tmp_path, lake, rows=5)
    table, target = f"{cdc.db}.t", open_target(cdc.cfg.target("lake"))
    assert cdc.apply_local("lake")[table]["status"] == "applied"
    with src_db.cursor() as cur:
        if mid:   # one statement string: one transaction on PostgreSQL (the session is in autocommit)
            cur.execute(f"UPDATE t SET v = 7 WHERE id = 4; {NARROW[src_db.kind]}; UPDATE t SET v = -v WHERE id <= 2")
        else:
            cur.execute(NARROW[src_db.kind])
            cur.execute("UPDATE t SET v = -v WHERE id <= 2")
    cdc.drain()
    assert cdc.apply_local("lake")[table]["status"] == "quarantined"
    cdc.dump_local("t")
    with src_db.cursor() as cur:
        cur.execute("DELETE FROM t WHERE id = 3")
    cdc.drain()
    last = breaks(json.loads(cdc.state.r.hget(cdc.state.k("quarantined"), table)))[-1]
    schema = cdc.source.table_schema(table)
    for run in ("release", "rerun"):
        assert cdc.apply_local("lake")[table]["status"] == "applied", run
        cdc.assert_equal("t", target="lake")
        log = _in_order(_changelog(target, schema).to_pylist())
        rebuilt = [i for i, r in enumerate(log) if r["op"] == "rebuild"]
        assert len(rebuilt) == 1, (run, rebuilt)
        row = log[rebuilt[0]]
        assert row["_dblog_pos"] == last.just_below().encode() and row["before"] is row["after"] is None, row
        tied = [r for r in log if r["_dblog_pos"] == row["_dblog_pos"] and r is not row]
        if mid:   # the change before the ALTER in its transaction: at the same position, before the rebuild
            assert last.seq > 0 and [(r["op"], r["after"]["id"], r["after"]["v"]) for r in tied] == [
                ("update", 4, 7)] and log[rebuilt[0] - 1] is tied[0], (last, tied)
        else:
            assert not tied, tied
        after = log[rebuilt[0] + 1:]   # the events after the break, the dump's rows among them
        assert all(r["_dblog_pos"] >= last.encode() for r in after) and "snapshot" in {r["op"] for r in after}
        assert _replay(log, schema) == target.rows(schema), run
        cdc.state.r.hdel(cdc.state.k(REBUILT), f"{table}|lake")   # the rebuild not recorded: redone
