"""A transaction larger than ``tail.flush_events`` (issue 15): the tail writes it in parts
as it reads it, so its memory stays bounded, and the parts stay invisible until the
transaction's commit moves the checkpoint past them.

A real `dblog tail` process reads one INSERT ... SELECT of ROWS rows in a single
transaction (MariaDB: the binlog reader gives a transaction's changes out early; PostgreSQL:
the pgoutput assembler does, for a table whose key is not DEFERRABLE), with flush_events 5,000: its peak resident memory (VmHWM) grows by less
than BOUND_MB over its idle size (held whole, as before, it grew by 441 MB; 2,000,000 rows
grew it by 46 MB), the table's files at one start are the transaction's parts, and the
target equals the source after the apply.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from airflow_provider_dblog.engine.apply import run_apply
from helpers import wait_until

ROWS = 300_000
FLUSH_EVENTS = 5_000
BOUND_MB = 120


def _kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


@pytest.mark.parametrize("src_db", ["mariadb", "postgres"], indirect=True)
def test_a_large_transaction_is_tailed_in_bounded_memory(src_db, make_cdc):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v VARCHAR(64) NOT NULL")
    cdc = make_cdc(["t"], tail={"flush_events": FLUSH_EVENTS, "flush_seconds": 0.2, "lease_seconds": 5})
    tail = subprocess.Popen([sys.executable, "-m", "airflow_provider_dblog.cli", "--config", str(cdc.path),
                             "tail", "--seconds", "600"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: tail.poll() is None and cdc.state.checkpoint(), 60, "the tail's first checkpoint")
        idle_kib = _kib(tail.pid, "VmRSS")
        with src_db.cursor() as cur:   # one statement, one transaction
            cur.execute(f"INSERT INTO t SELECT seq, CONCAT('row-', seq, '-', REPEAT('x', 40)) "
                        f"FROM {src_db.series(ROWS)}")
        cdc.drain(timeout=300)
        peak_kib = _kib(tail.pid, "VmHWM")
    finally:
        os.kill(tail.pid, signal.SIGKILL)
        _, err = tail.communicate(timeout=30)
    grown_mb = (peak_kib - idle_kib) / 1024
    assert grown_mb < BOUND_MB, (grown_mb, err.decode()[-2000:])
    # the transaction's parts: files of one start (the commit point it began after)
    names = [p.name for p in Path(cdc.store.table_dir(f"{cdc.db}.t")).glob("log-*")]
    by_start = Counter(n.split(".", 1)[0] for n in names)
    assert max(by_start.values()) >= ROWS // FLUSH_EVENTS, sorted(names)
    assert "written in" in err.decode()  # the tail said it wrote a transaction in parts

    res = run_apply(cdc.cfg, "tgt", via="local")
    assert res["tables"][f"{cdc.db}.t"]["inserted"] == ROWS, res
    diff = cdc.compare("t")
    assert diff.equal, diff.describe()
