"""The slot is never confirmed past the tail's checkpoint (CI of stop 37: a LogGapError after
a clean stop). psycopg2 moves its flush LSN to a keepalive's wal_end by itself once every
message received is confirmed, and sends it with any feedback; WAL written by tables the
source does not capture moves wal_end while the captured tables are quiet. A tail killed
(SIGKILL) right after a feedback, or stopped, must leave a checkpoint at or past what the
slot confirms, or the next tail refuses to start (a gap) and asks for a full reset."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from airflow_provider_dblog.engine.sources.postgres.lsn import lsn_to_int

from helpers import pg_connect, wait_until

POSTGRES = pytest.mark.parametrize("src_db", ["postgres"], indirect=True)


class Noise:
    """Rows written into a table the source does not capture, as fast as they commit."""

    def __init__(self, database: str):
        self.conn = pg_connect(database)
        self.conn.autocommit = True
        with self.conn.cursor() as cur:
            cur.execute("CREATE TABLE noise (id bigserial PRIMARY KEY, pad text)")
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        with self.conn.cursor() as cur:
            while not self.stop.is_set():
                cur.execute("INSERT INTO noise (pad) SELECT repeat('x', 200) FROM generate_series(1, 20)")

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(30)
        self.conn.close()


def _slot(cdc) -> tuple[int | None, int | None]:
    """(confirmed_flush_lsn, active_pid) of the source's slot."""
    with pg_connect(cdc.sdb.database) as conn, conn.cursor() as cur:
        cur.execute("SELECT confirmed_flush_lsn::text, active_pid FROM pg_replication_slots WHERE slot_name = %s",
                    (cdc.source.slot.slot_name,))
        confirmed, pid = cur.fetchone()
    conn.close()
    return (lsn_to_int(confirmed) if confirmed else None), pid


def _checkpoint_lsn(cdc) -> int:
    return lsn_to_int(cdc.state.checkpoint().resume["lsn"])


def _start_tail(cdc) -> subprocess.Popen:
    cdc.state.r.delete(cdc.state.k("lease"))   # the killed tail's lease: gone at once
    return subprocess.Popen([sys.executable, "-m", "airflow_provider_dblog.cli", "--config", str(cdc.path),
                             "tail", "--seconds", "600"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _inactive_confirmed(cdc) -> int:
    """The slot's confirmed LSN once no walsender streams it any more."""
    out = {}

    def released():
        out["c"], pid = _slot(cdc)
        return pid is None
    wait_until(released, 60, "the killed tail's walsender to let the slot go")
    return out["c"]


@POSTGRES
def test_a_tail_killed_after_a_feedback_or_stopped_leaves_the_slot_at_or_before_its_checkpoint(src_db, make_cdc):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT")
        cur.execute("INSERT INTO t VALUES (1, 1)")
    # the product's flush interval: the checkpoint follows a keepalive up to a second late
    cdc = make_cdc(["t"], tail={"flush_seconds": 1.0})
    rng = random.Random(int(os.environ.get("DBLOG_SEED", "5")))
    kills = 0
    with Noise(cdc.sdb.database):
        for round_no in range(4):
            proc = _start_tail(cdc)
            try:
                wait_until(lambda: proc.poll() is None and cdc.state.checkpoint() is not None, 60,
                           "the tail's first checkpoint")
                before, _ = _slot(cdc)

                # the dangerous instant: just after the tail's walsender got a feedback
                def confirmed_moved():
                    assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
                    return _slot(cdc)[0] != before
                wait_until(confirmed_moved, 30, "a feedback that moves the slot", poll=0.01)
                if rng.random() < 0.2:
                    time.sleep(rng.uniform(0, 1.5))   # (a few kills later, at a random instant)
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(30)
                kills += 1
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(30)
            confirmed = _inactive_confirmed(cdc)
            assert confirmed <= _checkpoint_lsn(cdc), (round_no, confirmed, _checkpoint_lsn(cdc))
            assert cdc.source.log_gap(cdc.state.checkpoint().resume) is None

        # and a clean stop (the tail's own deadline) in the same traffic
        cdc.state.r.delete(cdc.state.k("lease"))
        done = subprocess.run([sys.executable, "-m", "airflow_provider_dblog.cli", "--config", str(cdc.path),
                               "tail", "--seconds", "4"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        confirmed = _inactive_confirmed(cdc)
        assert confirmed <= _checkpoint_lsn(cdc), (confirmed, _checkpoint_lsn(cdc))

    # the captured table's change made meanwhile arrives: nothing skipped
    with src_db.cursor() as cur:
        cur.execute("INSERT INTO t VALUES (2, 2)")
    cdc.start_tail()
    cdc.drain()
    cdc.stop_tail()
    assert kills == 4
