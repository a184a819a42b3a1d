"""Maintenance of an Iceberg target table (issue 28, engine/targets/iceberg_maintain.py):
many small applies make many files; compaction rewrites them into few, the rows and the
applied position unchanged, and later applies and replays go on; expiry removes old
snapshots and files no snapshot references (a killed commit's), never what the current
snapshot reads. Real PostgreSQL/MariaDB source, the catalog in the private PostgreSQL."""
from __future__ import annotations

import os

import pytest

from airflow_provider_dblog.engine.targets import iceberg_maintain, open_target


@pytest.mark.parametrize("src_db", ["mariadb"], indirect=True)
def test_compaction_and_expiry_keep_rows_position_and_applies(src_db, make_cdc, monkeypatch):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT")
        cur.execute("INSERT INTO t VALUES " + ", ".join(f"({i}, {i})" for i in range(1, 201)))
    cdc = make_cdc(["t"], lake="iceberg")
    cdc.start_tail()
    cdc.dump_local("t")
    cdc.apply_local("lake")
    for step in range(12):   # small applies of new keys: each one appends a file
        with src_db.cursor() as cur:
            cur.execute("INSERT INTO t VALUES (%s, 0), (%s, 1)", (1000 + 2 * step, 1001 + 2 * step))
        cdc.drain()
        assert cdc.apply_local("lake")[f"{cdc.db}.t"]["status"] == "applied"
    target = open_target(cdc.cfg.target("lake"))
    schema = cdc.source.table_schema(f"{cdc.db}.t")
    applied, rows = target.applied_pos("src", schema), target.rows(schema, with_pos=True)
    first = target._load(schema).metadata.snapshots[0].snapshot_id   # the dump's

    report = target.maintain(schema, retention_hours=24).to_dict()
    assert report["files_before"] >= 10 and report["files_after"] == 1, report
    assert report["files_compacted"] == report["files_before"], report
    assert report["versions_removed"] == 0 and report["files_vacuumed"] == 0, report   # all within retention
    assert report["version_after"] != report["version_before"], report
    assert target.rows(schema, with_pos=True) == rows and target.applied_pos("src", schema) == applied
    assert target.read(schema, snapshot_id=first).num_rows == 200   # time travel within the retention
    with pytest.raises(ValueError, match="retention must be at least"):
        target.maintain(schema, retention_hours=0)

    # a killed commit's file: on disk, in no snapshot
    t = target._load(schema)
    stray = os.path.join(t.location().removeprefix("file://"), "data", "00000-0-killed.parquet")
    with open(stray, "wb") as f:
        f.write(b"PAR1")
    # expiry with no retention (the floor lowered for the test): every older snapshot and
    # every file the current one does not read go
    monkeypatch.setattr(iceberg_maintain, "MIN_RETENTION_HOURS", 0)
    expired, deleted = iceberg_maintain.expire(t, retention_hours=0)
    assert expired >= 10 and deleted >= 10 and not os.path.exists(stray), (expired, deleted)
    assert target.rows(schema, with_pos=True) == rows

    with src_db.cursor() as cur:   # applies go on after maintenance
        cur.execute("DELETE FROM t WHERE id <= 5")
        cur.execute("UPDATE t SET v = -1 WHERE id = 100")
    cdc.drain()
    assert cdc.apply_local("lake")[f"{cdc.db}.t"]["status"] == "applied"
    cdc.assert_equal("t", target="lake")
    version = target.version(schema)
    assert cdc.apply_local("lake")[f"{cdc.db}.t"]["status"] in ("up_to_date", "empty")
    assert target.version(schema) == version
