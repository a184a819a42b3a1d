"""The layout and maintenance of a Delta target (issue 28; targets/delta_maintain.py):
a MERGE rewrites only the files its batch's keys can be in (read from delta-rs's merge
metrics, not timed), keys of every renderable type bound exactly; maintenance (compaction,
vacuum, ``dblog maintain``) keeps the rows, the applied position and time travel within
the retention, a later apply and its replay behave, and a MERGE racing a compaction either
commits or fails with a transient error the apply retries, never losing a row.
"""
from __future__ import annotations

import decimal
import json
import subprocess
import sys
import threading

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable

from airflow_provider_dblog.engine.apply_batch import LocalApplier
from airflow_provider_dblog.engine.apply_plan import plan_table
from airflow_provider_dblog.engine.config import TargetConfig
from airflow_provider_dblog.engine.events import DELETE, INSERT, UPDATE
from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.requests import DumpSpec
from airflow_provider_dblog.engine.schema import Column, TableSchema
from airflow_provider_dblog.engine.targets import open_target
from airflow_provider_dblog.engine.targets.delta import DeltaTarget
from airflow_provider_dblog.engine.targets.delta_maintain import CARRIED, applied_in

from test_lake_targets import _dump, _setup

INT = TableSchema("db", "t", (Column("id", "int64", False), Column("v", "string")), ("id",))


def _target(tmp_path) -> DeltaTarget:
    return DeltaTarget(TargetConfig(name="lake", kind="delta", endpoint=None, source="src", path=str(tmp_path)))


def _batch(schema: TableSchema, keys: list, log_no: int, op: str = INSERT, v: str = "v") -> pa.Table:
    """Flattened batch rows (cast to the table's types by merge_batch) for ``keys``."""
    cols: dict[str, list] = {c.name: [] for c in schema.columns}
    for k in keys:
        for name, value in zip(schema.key, k if isinstance(k, tuple) else (k,)):
            cols[name].append(value)
        cols["v"].append(f"{v}{log_no}")
    cols["_dblog_pos"] = [Position(log_no, 0, i).encode() for i in range(len(keys))]
    cols["_dblog_op"] = [op] * len(keys)
    return pa.table(cols)


def _merge(t: DeltaTarget, schema: TableSchema, batch: pa.Table, log_no: int):
    return t.merge_batch(schema, batch, "src", Position(log_no, 1, 0), run_id=f"r{log_no}")


def _metrics(t: DeltaTarget, schema) -> dict:
    return DeltaTable(t.table_path(schema)).history(1)[0]["operationMetrics"]


def _files(t: DeltaTarget, schema) -> int:
    return len(DeltaTable(t.table_path(schema)).file_uris())


def test_a_small_merge_rewrites_only_the_files_its_keys_can_be_in(tmp_path):
    t = _target(tmp_path)
    t.ensure_table(INT)
    for i in range(20):   # 20 inserts of new keys: each matches no file and writes its own
        _merge(t, INT, _batch(INT, list(range(i * 1000, i * 1000 + 1000)), 10 + i), 10 + i)
        assert _metrics(t, INT)["num_target_files_removed"] == 0
    assert _files(t, INT) == 20
    # updates in one file and new keys after the last: that file only is read and rewritten
    res = _merge(t, INT, _batch(INT, list(range(5000, 5100)) + list(range(20000, 20050)), 50, UPDATE, "u"), 50)
    m = _metrics(t, INT)
    assert (res.updated, res.inserted, m["num_target_files_removed"]) == (100, 50, 1), (res, m)
    # (without the key bounds delta-rs reads all 20 files to find the one)
    assert (m["num_target_files_scanned"], m["num_target_files_skipped_during_scan"]) == (1, 19), m
    # two far apart clusters of keys: their two files and the one the last merge wrote
    # (keys 5000-5999 and 20000-20049, so its range spans 18500), not the 16 others
    _merge(t, INT, _batch(INT, [1, 2, 3] + [18500, 18501], 51, UPDATE, "w"), 51)
    m = _metrics(t, INT)
    assert (m["num_target_files_scanned"], m["num_target_files_removed"]) == (3, 2), m
    _merge(t, INT, _batch(INT, [2], 52, DELETE), 52)
    m = _metrics(t, INT)
    assert (m["num_target_files_scanned"], m["num_target_files_removed"]) == (1, 1), m
    rows = {r["id"]: r["v"] for r in t.rows(INT)}
    assert len(rows) == 20049 and 2 not in rows
    assert rows[1] == rows[3] == rows[18500] == "w51" and rows[5000] == rows[20049] == "u50" and rows[4999] == "v14"


@pytest.mark.parametrize("schema, keys", [
    (TableSchema("db", "s", (Column("k", "string", False), Column("v", "string")), ("k",)),
     ["a'b", "c\\d", "é'\\'", "", 'x"y', "z' OR 1=1 --", "\U0001f600"]),
    (TableSchema("db", "c", (Column("k", "string", False), Column("n", "int32", False), Column("v", "string")),
                 ("k", "n")),
     [("a", -(1 << 31)), ("a", (1 << 31) - 1), ("b'", 0), ("b'", 7)]),
    (TableSchema("db", "d", (Column("k", "decimal(12,2)", False), Column("v", "string")), ("k",)),
     [decimal.Decimal("-9999999999.99"), decimal.Decimal("0.10"), decimal.Decimal("9999999999.99")]),
    (TableSchema("db", "m", (Column("id", "int64", False), Column("v", "string")), ("id",)),
     [-(1 << 63), -1, 0, (1 << 63) - 1]),
])
def test_bounds_of_every_key_type_are_exact_so_each_row_is_still_found(tmp_path, schema, keys):
    t = _target(tmp_path)
    t.ensure_table(schema)
    for i, k in enumerate(keys):   # one file per key: every bound decides which file is read
        _merge(t, schema, _batch(schema, [k], 10 + i), 10 + i)
    _merge(t, schema, _batch(schema, keys[:1] + keys[-1:], 40, UPDATE, "u"), 40)
    _merge(t, schema, _batch(schema, keys[1:2], 41, DELETE), 41)
    got = {tuple(r[k] for k in schema.key): r["v"] for r in t.rows(schema)}
    want = {(k if isinstance(k, tuple) else (k,)): f"v{10 + i}" for i, k in enumerate(keys)}
    want[next(iter(want))] = want[list(want)[-1]] = "u40"
    del want[list(want)[1]]
    assert got == want


def test_maintenance_commits_never_move_the_applied_position(tmp_path):
    t = _target(tmp_path)
    t.ensure_table(INT)
    for i in range(5):
        _merge(t, INT, _batch(INT, [i], 10 + i), 10 + i)
    rep = t.maintain(INT)
    assert (rep.files_before, rep.files_after, rep.files_compacted) == (5, 1, 5), rep
    dt = DeltaTable(t.table_path(INT))
    newest = dt.history(1)[0]
    assert "dblog.applied.src" not in newest and newest[CARRIED + "src"] == Position(14, 1, 0).encode()
    assert t.applied_pos("src", INT) == Position(14, 1, 0)
    # an apply's own commit wins over an older carried copy
    _merge(t, INT, _batch(INT, [9], 20), 20)
    from deltalake import write_deltalake
    write_deltalake(dt, pa.schema(dt.schema().to_arrow()).empty_table(), mode="append",
                    commit_properties=CommitProperties(custom_metadata={CARRIED + "src": Position(14, 1, 0).encode()}))
    assert t.applied_pos("src", INT) == Position(20, 1, 0)
    # once no apply commit is left in the log (expired), the carried copy is the position
    other = _target(tmp_path / "other")
    other.ensure_table(INT)
    dt = DeltaTable(other.table_path(INT))
    write_deltalake(dt, pa.schema(dt.schema().to_arrow()).empty_table(), mode="append",
                    commit_properties=CommitProperties(custom_metadata={CARRIED + "src": Position(3, 0, 0).encode()}))
    assert applied_in(dt, "src") == Position(3, 0, 0).encode() and other.applied_pos("src", INT) == Position(3, 0, 0)


def test_vacuum_keeps_time_travel_within_the_retention_and_refuses_a_shorter_one(tmp_path):
    t = _target(tmp_path)
    t.ensure_table(INT)
    for i in range(4):
        _merge(t, INT, _batch(INT, [i], 10 + i), 10 + i)
    before = DeltaTable(t.table_path(INT)).version()
    t.maintain(INT)   # 168 h by default: the replaced files stay
    assert DeltaTable(t.table_path(INT), version=before).to_pyarrow_table().num_rows == 4
    with pytest.raises(ValueError, match="retention"):
        t.maintain(INT, retention_hours=1)
    rep = t.maintain(INT, retention_hours=0, enforce_retention=False)   # asked for explicitly
    assert rep.files_vacuumed == 4 and t.count(INT) == 4
    with pytest.raises(Exception):
        DeltaTable(t.table_path(INT), version=before).to_pyarrow_table()


def test_a_merge_racing_compactions_commits_or_fails_transiently_and_loses_no_row(tmp_path):
    t = _target(tmp_path)
    t.ensure_table(INT)
    stop, errors, retried = threading.Event(), [], []

    def compact():
        try:
            while not stop.is_set():
                t.maintain(INT)
        except BaseException as e:   # surfaced below
            errors.append(e)
    thread = threading.Thread(target=compact, daemon=True)
    thread.start()
    try:
        for i in range(40):   # new keys (a new file each), every 4th batch an update of an old one too
            batch = _batch(INT, [1000 + 2 * i, 1001 + 2 * i] + [i // 2] * (i % 4 == 3), 10 + i, UPDATE, "x")
            for attempt in range(20):
                try:
                    _merge(t, INT, batch, 10 + i)
                    break
                except Exception as e:   # noqa: BLE001 - the apply's retry rule, exactly
                    assert t.is_transient(e), e
                    retried.append(e)
            else:
                pytest.fail("a merge lost the race 20 times in a row")
    finally:
        stop.set()
        thread.join(60)
    assert not errors, errors
    got = t.rows(INT)
    rows = {r["id"]: r["v"] for r in got}
    assert len(rows) == len(got), "a row doubled by a merge and a compaction both rewriting its file"
    want = {}
    for i in range(40):
        for k in [1000 + 2 * i, 1001 + 2 * i] + [i // 2] * (i % 4 == 3):
            want[k] = f"x{10 + i}"
    assert rows == want and t.applied_pos("src", INT) == Position(49, 1, 0)


def _dblog(cdc, *args) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "airflow_provider_dblog.cli", "--config", str(cdc.path), *args],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def test_dblog_maintain_compacts_a_lake_table_after_many_small_applies(src_db, make_cdc):
    cdc = _setup(src_db, make_cdc, True, rows=50)
    _dump(cdc, DumpSpec("table", [f"{cdc.db}.t"]))
    cdc.drain()
    cdc.apply_local("lake")
    for i in range(15):   # small applies of new rows: a new small file each
        with src_db.cursor() as cur:
            cur.execute("INSERT INTO t (id, v, s, d) VALUES (%s, %s, %s, %s)", (1000 + i, i, f"n{i}", "1.25"))
        cdc.drain()
        assert cdc.apply_local("lake")[f"{cdc.db}.t"]["status"] == "applied"
    target = open_target(cdc.cfg.target("lake"))
    schema = cdc.source.table_schema(f"{cdc.db}.t")
    path = target.table_path(schema)
    version, rows, pos = DeltaTable(path).version(), target.rows(schema, with_pos=True), target.applied_pos("src", schema)
    files = len(DeltaTable(path).file_uris())
    assert files >= 15
    dry = _dblog(cdc, "maintain", "--target", "lake", "--dry-run")
    assert [(r["table"], r["files_before"], r["files_after"], r["dry_run"]) for r in dry] == \
        [(path.rsplit("/", 1)[1], files, files, True)]
    assert DeltaTable(path).version() == version
    [rep] = _dblog(cdc, "maintain", "--target", "lake", "--table", f"{cdc.db}.t")
    assert rep["files_before"] == files and rep["files_after"] < files, rep
    assert target.rows(schema, with_pos=True) == rows and target.applied_pos("src", schema) == pos
    assert DeltaTable(path, version=version).to_pyarrow_table().num_rows == len(rows)   # time travel
    nothing = _dblog(cdc, "maintain", "--target", "tgt")
    assert nothing[0]["status"] == "nothing to do", nothing
    # an apply after maintenance, then its replay: nothing changes
    with src_db.cursor() as cur:
        cur.execute("UPDATE t SET v = -5 WHERE id <= 3")
        cur.execute("DELETE FROM t WHERE id = 1000")
    cdc.drain()
    applier = LocalApplier(target, cdc.store, cdc.state, "src")
    batch = plan_table(target, cdc.store, cdc.state, "src", schema)
    assert applier.apply_batch(batch)["status"] == "applied"
    version, rows = DeltaTable(path).version(), target.rows(schema, with_pos=True)
    again = applier.apply_batch(batch)
    assert again["inserted"] == again["updated"] == again["deleted"] == 0, again
    assert DeltaTable(path).version() == version and target.rows(schema, with_pos=True) == rows
    cdc.assert_equal("t", target="lake")
