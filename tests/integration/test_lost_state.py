"""Lost state fails closed, and `dblog reset` is the way back (issue 15).

Real servers, the real `dblog` command:

* Redis flushed (FLUSHDB of the test's own Redis database) while rows change: the tail
  refuses to start at the log head (exit 2, naming the evidence and `dblog reset`), and
  writes nothing; `reset` without the confirmation refuses; with it, the tail starts
  again, the full dump it requested (on Spark) and the apply make the target equal to
  the source, rows deleted meanwhile included (orphan sweep). Both sources.
* MariaDB: the binlog file of the checkpoint purged (PURGE BINARY LOGS): the tail refuses.
* PostgreSQL: the replication slot dropped (pg_drop_replication_slot): the tail refuses,
  and does not make a new slot behind the user's back.
In both, `reset` lets the tail start again at the head with a full dump requested.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from airflow_provider_dblog.engine.apply import run_apply
from airflow_provider_dblog.engine.dump import DumpRunner
from airflow_provider_dblog.engine.requests import DumpSpec
from helpers import REDIS_PORT, wait_until

REPO = str(Path(__file__).resolve().parents[2])
REDIS_DB = 3  # this module's own Redis database: FLUSHDB touches nothing of other tests'


def dblog(cdc, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "airflow_provider_dblog.cli", "--config", str(cdc.path), *args],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout)


def _captured(src_db, make_cdc):
    """A table captured and applied once, then the tail stopped."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT NOT NULL")
        cur.execute(f"INSERT INTO t SELECT seq, seq FROM {src_db.series(60)}")
    cdc = make_cdc(["t"], state={"redis_url": f"redis://127.0.0.1:{REDIS_PORT}/{REDIS_DB}"})
    cdc.start_tail()
    rid = cdc.request(DumpSpec("keys", [f"{cdc.db}.t"], keys=[[k] for k in range(1, 61)]))
    DumpRunner(cdc.source, cdc.state, cdc.store, None, cdc.cfg.dump).run(rid)
    with src_db.cursor() as cur:
        cur.execute("UPDATE t SET v = v + 100 WHERE id <= 10")
    cdc.drain()
    run_apply(cdc.cfg, "tgt", via="local")
    assert cdc.compare("t").equal
    cdc.stop_tail()
    return cdc


def _change_meanwhile(src_db) -> None:
    with src_db.cursor() as cur:
        cur.execute("UPDATE t SET v = v + 1000 WHERE id BETWEEN 11 AND 20")
        cur.execute("DELETE FROM t WHERE id BETWEEN 21 AND 25")
        cur.execute(f"INSERT INTO t SELECT seq + 100, seq FROM {src_db.series(5)}")


def _tail_refuses(cdc, *expected: str) -> str:
    before = cdc.state.checkpoint()
    out = dblog(cdc, "tail", "--seconds", "5")
    assert out.returncode == 2, out
    for text in expected:
        assert text in out.stderr, out.stderr[-3000:]
    assert "reset --source src --confirm src" in out.stderr, out.stderr[-3000:]
    assert cdc.state.checkpoint() == before  # nothing moved
    return out.stderr


def _reset(cdc) -> str:
    refused = dblog(cdc, "reset")
    assert refused.returncode == 2 and "repeat its name to confirm (--confirm src)" in refused.stderr, refused
    done = dblog(cdc, "reset", "--confirm", "src")
    assert done.returncode == 0, done
    out = json.loads(done.stdout)
    assert out["dump_request"] and out["targets"]["tgt"] == {"positions_reset": [f"{cdc.db}.t"]}, out
    assert cdc.state.request(out["dump_request"])["spec"]["scope"] == "all"
    assert cdc.state.checkpoint() is None and cdc.store.file_positions() == []
    return out["dump_request"]


def test_lost_redis_state_fails_closed_and_reset_repairs_the_target(src_db, make_cdc):
    cdc = _captured(src_db, make_cdc)
    redis.Redis(port=REDIS_PORT, db=REDIS_DB).flushdb()
    _change_meanwhile(src_db)
    _tail_refuses(cdc, "has no tail checkpoint in Redis", "its event store at", "segment file(s) up to position")
    rid = _reset(cdc)
    cdc.start_tail()
    with src_db.cursor() as cur:
        cur.execute("UPDATE t SET v = v + 1 WHERE id BETWEEN 30 AND 35")  # the log goes on
    cdc.dump_local("t", rid)   # in this process: Spark is not the subject
    cdc.drain()
    result = run_apply(cdc.cfg, "tgt", via="local")
    diff = cdc.compare("t")
    assert diff.equal, diff.describe()
    assert result["orphans_deleted"] == 5, result  # the rows deleted while nothing was captured


@pytest.mark.parametrize("src_db", ["mariadb"], indirect=True)
def test_a_purged_binlog_fails_closed(src_db, make_cdc):
    cdc = _captured(src_db, make_cdc)
    resume = cdc.state.checkpoint().resume
    with src_db.cursor() as cur:
        cur.execute("FLUSH BINARY LOGS")
        _change_meanwhile(src_db)
        cur.execute("FLUSH BINARY LOGS")
        cur.execute("SHOW MASTER STATUS")
        current = cur.fetchone()[0]

        def purged():  # (a file another binlog reader still reads is kept: try again)
            cur.execute("PURGE BINARY LOGS TO %s", (current,))
            cur.execute("SHOW BINARY LOGS")
            files = [r[0] for r in cur.fetchall()]
            return files[0] if resume["file"] not in files else None
        oldest = wait_until(purged, 30, f"{resume['file']} purged")
    _tail_refuses(cdc, f"binlog file {resume['file']}", "is no longer on the server", f"oldest binlog is {oldest}")
    _reset(cdc)
    cdc.start_tail()  # at the log head again
    assert cdc.state.checkpoint().resume["file"] >= current


@pytest.mark.parametrize("src_db", ["postgres"], indirect=True)
def test_a_dropped_replication_slot_fails_closed(src_db, make_cdc):
    cdc = _captured(src_db, make_cdc)
    slot = cdc.src_cfg.slot
    _change_meanwhile(src_db)
    with src_db.cursor() as cur:
        def slot_free():
            cur.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,))
            return cur.fetchone()[0] is None
        wait_until(slot_free, 30, "the stopped tail's walsender gone")
        cur.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    _tail_refuses(cdc, f"replication slot {slot} of source 'src' does not exist (dropped?)")
    with src_db.cursor() as cur:  # the refusal made no new slot behind the user's back
        cur.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (slot,))
        assert cur.fetchone()[0] == 0
    _reset(cdc)
    cdc.start_tail()  # makes the slot again, at the head
