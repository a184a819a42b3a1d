"""One table's trouble stops only that table at every step (issue 27 item 3): a captured
table renamed away while the tail was stopped, and on PostgreSQL one whose REPLICA
IDENTITY is no longer FULL. The `dblog tail` command starts anyway (its checks name the
table and go on: it is captured already), the table is quarantined, and the other table
flows; an apply without a table list applies it."""
from __future__ import annotations

import subprocess
import sys

import pytest

from airflow_provider_dblog.engine.apply import run_apply


def _run(src_db, *sql: str) -> None:
    with src_db.cursor() as cur:
        for s in sql:
            cur.execute(s)


def _tail_command(cdc) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "airflow_provider_dblog.cli", "--config", str(cdc.path),
                           "tail", "--seconds", "3"], capture_output=True, text=True, timeout=120)


def _setup(src_db, make_cdc):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT")
        src_db.create_table(cur, "u", "id INT PRIMARY KEY, v INT")
    cdc = make_cdc(["t", "u"])
    out = _tail_command(cdc)   # the first start: every table checked, versions recorded
    assert out.returncode == 0, out.stderr
    _run(src_db, "INSERT INTO t (id, v) VALUES (1, 1)", "INSERT INTO u (id, v) VALUES (1, 1)")
    return cdc


def test_a_table_renamed_away_while_the_tail_was_stopped_stops_only_itself(src_db, make_cdc):
    cdc = _setup(src_db, make_cdc)
    _run(src_db, "ALTER TABLE t RENAME TO t_gone", "INSERT INTO u (id, v) VALUES (2, 2)")
    out = _tail_command(cdc)
    assert out.returncode == 0, out.stderr
    assert "t" in out.stderr and "only it stops" in out.stderr
    res = run_apply(cdc.cfg, "tgt", via="local")["tables"]
    assert res[f"{cdc.db}.u"]["status"] == "applied" and res[f"{cdc.db}.u"]["inserted"] == 2, res
    assert res[f"{cdc.db}.t"]["status"] == "quarantined", res
    assert cdc.compare("u").equal


@pytest.mark.parametrize("src_db", ["postgres"], indirect=True)
def test_a_replica_identity_no_longer_full_stops_only_its_table(src_db, make_cdc):
    cdc = _setup(src_db, make_cdc)
    cdc.start_tail()
    _run(src_db, "ALTER TABLE t REPLICA IDENTITY DEFAULT", "UPDATE t SET v = 2 WHERE id = 1",
         "INSERT INTO u (id, v) VALUES (2, 2)")
    cdc.drain()
    assert cdc.tail_error is None
    cdc.stop_tail()
    _run(src_db, "INSERT INTO u (id, v) VALUES (3, 3)")
    out = _tail_command(cdc)   # a restart with the table still not FULL
    assert out.returncode == 0, out.stderr
    res = run_apply(cdc.cfg, "tgt", via="local")["tables"]
    assert res[f"{cdc.db}.u"]["status"] == "applied" and res[f"{cdc.db}.u"]["inserted"] == 3, res
    t = res[f"{cdc.db}.t"]
    assert t["status"] == "quarantined" and "REPLICA IDENTITY FULL" in t["quarantined"]["why"], t
    assert cdc.compare("u").equal
