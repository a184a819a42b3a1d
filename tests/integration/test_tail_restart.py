"""A tail killed anywhere (mid-segment, between the segment write and the
checkpoint) and restarted loses and duplicates nothing (invariant 5), on each
source kind. What was stored is checked against an independent read of the log
(another binlog connection; another replication slot)."""
from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time

import pyarrow.parquet as pq

from airflow_provider_dblog.engine.requests import DumpSpec
from airflow_provider_dblog.engine.sources import open_source
from airflow_provider_dblog.engine.sources.base import Idle, RowChange
from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.store import LOG_PREFIX
from helpers import crash, unique, wait_until


def make_table(sdb) -> None:
    with sdb.cursor() as cur:
        sdb.create_table(cur, "t", "id INT PRIMARY KEY, v INT NOT NULL, note TEXT")
        cur.execute(f"INSERT INTO t SELECT seq, 0, NULL FROM {sdb.series(1000)}")


def write_forever(sdb, stop: threading.Event, counter: list) -> None:
    upsert = sdb.upsert("t", "%s, 1, 'new'", "id", "v = t.v + 1")
    with sdb.cursor() as cur:
        i = 0
        while not stop.is_set():
            i += 1
            cur.execute("BEGIN")
            cur.execute("UPDATE t SET v = v + 1 WHERE id = %s", (i % 1000 + 1,))
            cur.execute(upsert, (1000 + i,))
            if i % 5 == 0:
                cur.execute("DELETE FROM t WHERE id = %s", (1000 + i - 3,))
            cur.execute("COMMIT")
            counter[0] += 1


def raw_log_positions(cdc, table: str) -> list[str]:
    """Every committed event position in the log files, duplicates included."""
    cp = cdc.state.checkpoint().pos.encode()
    out = []
    for info in cdc.store._files(cdc.store.table_dir(table)):
        if info.base_name.startswith(LOG_PREFIX):
            pos = pq.read_table(info.path, columns=["pos"])["pos"].to_pylist()
            out += [p for p in pos if p < cp]
    return out


class IndependentLog:
    """A second reader of the source's log, set up before the writes start: another
    binlog connection (server id) for MariaDB, another replication slot for PostgreSQL."""

    def __init__(self, cdc):
        self.cdc = cdc
        if cdc.sdb.kind == "postgres":
            self.source = open_source(dataclasses.replace(cdc.src_cfg, slot=unique("audit")))
            self.source.prepare_log()  # the slot keeps the WAL from now on
            self.extra = {}
        else:
            self.source, self.extra = cdc.source, {"server_id": cdc.src_cfg.server_id + 7}

    def positions(self, table: str, start: dict) -> list[str]:
        """Every event position of ``table`` from ``start`` to the log's current head."""
        head, _ = self.cdc.source.current_resume()
        out, done = [], [False]
        deadline = time.monotonic() + 120
        for item in self.source.read_log(start, lambda: done[0], **self.extra):
            if isinstance(item, RowChange) and item.event.table == table:
                out.append(item.event.pos.encode())
            if getattr(item, "pos", None) is not None and item.pos >= head:
                done[0] = True
            assert not isinstance(item, Idle) or time.monotonic() < deadline, "log head not reached"
        return out


def assert_exactly_once(cdc, table: str, start: dict, independent: IndependentLog) -> None:
    stored = raw_log_positions(cdc, table)
    assert len(stored) == len(set(stored)), "an event was stored twice"
    expected = independent.positions(table, start)
    assert sorted(stored) == sorted(expected), (len(stored), len(expected))


def test_tail_killed_mid_segment_restarts_without_loss_or_duplicates(src_db, make_cdc):
    make_table(src_db)
    cdc = make_cdc(["t"], tail={"flush_events": 50, "flush_seconds": 0.05})
    stop, counter = threading.Event(), [0]
    # the first tail runs as its own process, and is killed with SIGKILL mid-flight
    proc = subprocess.Popen([sys.executable, "-m", "airflow_provider_dblog.cli", "--config", str(cdc.path),
                             "tail", "--seconds", "600"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    def started():
        assert proc.poll() is None, proc.stderr.read().decode()
        return cdc.state.checkpoint()
    wait_until(started, 60, "the first tail's first checkpoint")
    first = cdc.state.checkpoint().resume
    independent = IndependentLog(cdc)
    writer = threading.Thread(target=write_forever, args=(src_db, stop, counter), daemon=True)
    writer.start()
    wait_until(lambda: cdc.state.counters().get("flushes", 0) >= 10, 60, "10 flushes of the first tail")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = cdc.state.checkpoint().pos
    cdc.state.r.delete(cdc.state.k("lease"))  # a killed tail's lease would expire; don't wait
    cdc.start_tail()  # the second tail resumes from the checkpoint
    wait_until(lambda: cdc.state.checkpoint().pos > killed_at, 60, "the second tail passing the kill")
    stop.set()
    writer.join()
    cdc.drain()
    cdc.stop_tail()
    assert cdc.state.checkpoint().pos > killed_at
    assert counter[0] > 20
    assert_exactly_once(cdc, f"{src_db.name}.t", first, independent)
    # and the target built from that log equals the source
    rid = cdc.request(DumpSpec("all", []))
    cdc.start_tail()
    cdc.dump_local("t", rid)   # in this process: Spark is not the subject
    cdc.drain()
    cdc.apply_local()
    diff = cdc.compare("t")
    assert diff.equal, diff.describe()


def test_crash_between_segment_write_and_checkpoint(src_db, make_cdc, tmp_path):
    """The tail process dies (SIGKILL) inside a checkpoint commit: the segment's files are
    written, its checkpoint never moves. The next tail rewrites that segment: stored once."""
    make_table(src_db)
    cdc = make_cdc(["t"], tail={"flush_events": 20, "flush_seconds": 0.05})
    cdc.start_tail()  # the log's start position, then the crashing process takes over
    first = cdc.state.checkpoint().resume
    cdc.stop_tail()
    independent = IndependentLog(cdc)
    stop, counter = threading.Event(), [0]
    writer = threading.Thread(target=write_forever, args=(src_db, stop, counter), daemon=True)
    writer.start()
    try:
        dying_at = Position.decode(crash("tail", cdc.path, tmp_path / "marker", "--at-commit", "4"))
        cp = cdc.state.checkpoint().pos
        assert cp < dying_at  # the commit it died in never happened
        table = f"{src_db.name}.t"
        beyond = [p for info in cdc.store._files(cdc.store.table_dir(table))
                  if info.base_name.startswith(LOG_PREFIX)
                  for p in pq.read_table(info.path, columns=["pos"])["pos"].to_pylist() if p >= cp.encode()]
        assert beyond, "the dying segment's files were not written: this crash proves nothing"
        cdc.state.r.delete(cdc.state.k("lease"))  # a killed tail's lease would expire; don't wait
        cdc.start_tail()
        wait_until(lambda: cdc.state.checkpoint().pos > dying_at, 60, "the restarted tail passing the crash")
    finally:
        stop.set()
        writer.join()
    cdc.drain()
    cdc.stop_tail()
    assert counter[0] > 10
    assert_exactly_once(cdc, table, first, independent)
