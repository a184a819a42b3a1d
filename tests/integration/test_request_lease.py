"""One runner per dump request, and no source held back by a dead one (issue 15).

Real MariaDB, Redis and runner processes (a dump runner is ``DumpRunner.run`` in its own
Python process, as in the Spark dump job's driver; a key-list request needs no Spark):

* a second runner of a request that is running refuses at once (``dblog dump --request``,
  exit 2, naming the runner and when its lease expires); once the first is SIGKILLed, a
  runner waiting for the lease takes the request over after its TTL and finishes it;
* a runner SIGSTOPped mid-window (a zombie) loses its lease; a new runner finishes the
  request; the zombie, continued, stops without writing: the request stays done, its
  progress, snapshots and chunk counter untouched;
* a runner SIGKILLed mid-window, never resumed: the tail closes its window as abandoned
  once it is older than ``dump.abandon_after_s``, the apply frontier moves on to the
  checkpoint, the request is ``interrupted`` and ``dblog status`` shows why; a resume
  redoes the chunk and the target equals the source;
* the fencing rule itself: a chunk completion with a token that lost the lease moves
  nothing.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from airflow_provider_dblog.engine.apply import run_apply
from airflow_provider_dblog.engine.dump import DumpRunner
from airflow_provider_dblog.engine.errors import LeaseLostError
from airflow_provider_dblog.engine.requests import DumpSpec
from helpers import wait_until

pytestmark = pytest.mark.parametrize("src_db", ["mariadb"], indirect=True)  # leases live in Redis alone

LEASE_S = 2.0
REPO = str(Path(__file__).resolve().parents[2])

# a dump runner process: the engine's runner on one request, as the Spark dump job drives it
RUNNER = """
import logging, sys
logging.basicConfig(level=logging.INFO)
from airflow_provider_dblog.engine.config import load_config
from airflow_provider_dblog.engine.wiring import Wiring
runner = Wiring(load_config(sys.argv[1])).runner()
try:
    runner.run(sys.argv[2])
finally:
    runner.source.close()
"""


def _setup(src_db, make_cdc, **dump):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT NOT NULL")
        cur.execute(f"INSERT INTO t SELECT seq, seq * 3 FROM {src_db.series(100)}")
    cdc = make_cdc(["t"], dump={"lease_seconds": LEASE_S, "window_timeout_s": 600, **dump})
    rid = cdc.request(DumpSpec("keys", [f"{cdc.db}.t"], keys=[[k] for k in range(1, 101)], chunk_size=25))
    return cdc, rid


def _start_runner(cdc, rid) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", RUNNER, str(cdc.path), rid], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _in_window(cdc, rid, proc) -> str:
    """Wait until ``proc`` holds the request and its first window is open (with no tail running
    it then waits for its HW); its lease token."""
    def holding():
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
        holder = cdc.state.lease_holder(rid)
        windows = [w for w in cdc.state.open_windows() if w.request == rid]
        return holder if holder and windows and holder.split("|")[0].endswith(f":{proc.pid}") else None
    return wait_until(holding, 60, "the runner holding the request, its first window open")


def _snapshots(cdc) -> list[str]:
    return sorted(p.name for p in Path(cdc.store.table_dir(f"{cdc.db}.t")).glob("snap-*.parquet"))


def _repaired(cdc) -> None:
    cdc.drain()
    run_apply(cdc.cfg, "tgt", via="local")
    diff = cdc.compare("t")
    assert diff.equal, diff.describe()


def test_a_second_runner_refuses_then_takes_over_a_dead_ones_request(src_db, make_cdc):
    cdc, rid = _setup(src_db, make_cdc)
    first = _start_runner(cdc, rid)
    try:
        token = _in_window(cdc, rid, first)
        second = subprocess.run([sys.executable, "-m", "airflow_provider_dblog.cli", "--config", str(cdc.path),
                                 "dump", "--request", rid], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert second.returncode == 2, second
        assert f"dump request {rid} is being run by {token}" in second.stderr, second.stderr
        assert "its lease expires in" in second.stderr and "--wait-lease" in second.stderr, second.stderr
        assert cdc.state.lease_holder(rid) == token  # the refusal took nothing
    finally:
        first.kill()
        first.wait()
    # the dead runner's windows: its chunk's, and the next chunk's it was selecting ahead (dump_ahead.py)
    left = {w.id for w in cdc.state.open_windows() if w.request == rid}
    assert 1 <= len(left) <= 2, left
    cdc.start_tail()
    runner = DumpRunner(cdc.source, cdc.state, cdc.store, None, cdc.cfg.dump)
    summary = runner.run(rid, wait_lease=30)  # waits out the dead runner's TTL, then owns the request
    assert cdc.state.request(rid)["status"] == "done"
    assert summary.tables[f"{cdc.db}.t"]["done_keys"] == 100
    closed = [w for w in cdc.state.closed_windows(50) if w["request"] == rid]
    assert {w["id"] for w in closed if w["outcome"] == "abandoned"} == left, closed
    _repaired(cdc)


def test_a_stalled_runner_that_lost_its_lease_writes_nothing(src_db, make_cdc):
    cdc, rid = _setup(src_db, make_cdc)
    zombie = _start_runner(cdc, rid)
    try:
        _in_window(cdc, rid, zombie)
        os.kill(zombie.pid, signal.SIGSTOP)
        wait_until(lambda: cdc.state.lease_holder(rid) is None, 30, "the stopped runner's lease expired")
        cdc.start_tail()
        DumpRunner(cdc.source, cdc.state, cdc.store, None, cdc.cfg.dump).run(rid)
        req = cdc.state.request(rid)
        assert req["status"] == "done", req
        before = (req, _snapshots(cdc), cdc.state.counters().get("chunks"))
        cdc.drain()  # the zombie's HW, if the tail saw it, was drained: its window was closed
        os.kill(zombie.pid, signal.SIGCONT)
        zombie.wait(60)
    finally:
        if zombie.poll() is None:
            os.kill(zombie.pid, signal.SIGCONT)
            zombie.kill()
            zombie.wait()
    err = zombie.stderr.read().decode()
    assert zombie.returncode != 0, err[-3000:]
    assert "LeaseLostError" in err and f"lease of dump request {rid}" in err, err[-3000:]
    cdc.drain()
    after = (cdc.state.request(rid), _snapshots(cdc), cdc.state.counters().get("chunks"))
    assert after == before  # status, error, progress, snapshot files and counters: untouched
    _repaired(cdc)


def _dead_runners_window(src_db, make_cdc):
    """A runner SIGKILLed inside its first window (abandon_after_s 6): (cdc, rid, that window)."""
    cdc, rid = _setup(src_db, make_cdc, abandon_after_s=6)
    dead = _start_runner(cdc, rid)
    try:
        _in_window(cdc, rid, dead)
    finally:
        dead.kill()
        dead.wait()
    [window] = [w for w in cdc.state.open_windows() if w.request == rid]
    return cdc, rid, window


def test_a_dead_runners_window_is_closed_as_abandoned_and_the_frontier_moves_on(src_db, make_cdc):
    cdc, rid, window = _dead_runners_window(src_db, make_cdc)
    cdc.start_tail()
    with src_db.cursor() as cur:  # the log moves on meanwhile
        cur.execute("UPDATE t SET v = v + 1 WHERE id > 90")
    cdc.drain()
    wait_until(lambda: not cdc.state.window_is_open(window.id), 60, "the dead runner's window closed")
    cdc.drain()
    assert cdc.state.frontier() == cdc.state.checkpoint().pos  # no longer held back at the window's floor
    req = cdc.state.request(rid)
    assert req["status"] == "interrupted", req
    assert f"window {window.id} of {cdc.db}.t" in req["error"] and "resume the request" in req["error"], req
    assert cdc.state.progress(rid, f"{cdc.db}.t")["done_keys"] == 0  # its chunk is redone on resume

    status = subprocess.run([sys.executable, "-m", "airflow_provider_dblog.cli", "--config", str(cdc.path),
                             "status"], cwd=REPO, capture_output=True, text=True, timeout=60, check=True)
    shown = json.loads(status.stdout)
    assert shown["open_windows"] == []
    [abandoned] = [w for w in shown["windows_abandoned"] if w["request"] == rid]
    assert abandoned["id"] == window.id and abandoned["reason"] == "no runner" and abandoned["age_s"] >= 6
    assert {"id": rid, "status": "interrupted"}.items() <= next(r for r in shown["requests"] if r["id"] == rid).items()
    assert cdc.state.counters()["windows_abandoned"] == 1

    DumpRunner(cdc.source, cdc.state, cdc.store, None, cdc.cfg.dump).run(rid)  # resume
    assert cdc.state.request(rid)["status"] == "done"
    _repaired(cdc)


def test_a_dead_runners_window_is_closed_while_the_log_is_busy(src_db, make_cdc):
    """Commits to other tables all the time (a production source): the tail flushes, and so
    renews its lease, every flush_seconds; its check for abandoned windows must still run
    (it shared the renewal's clock, and a busy log kept it from ever coming due)."""
    cdc, rid, window = _dead_runners_window(src_db, make_cdc)
    with src_db.cursor() as cur:
        src_db.create_table(cur, "busy", "id INT PRIMARY KEY")
    done = threading.Event()

    def busy() -> None:   # a commit every 0.2 s, to a table the tail does not capture
        with src_db.cursor() as cur:
            n = 0
            while not done.wait(0.2):
                n += 1
                cur.execute("INSERT INTO busy VALUES (%s)", (n,))
    writer = threading.Thread(target=busy, daemon=True)
    cdc.start_tail()
    writer.start()
    try:
        wait_until(lambda: not cdc.state.window_is_open(window.id), 40, "the dead runner's window closed")
    finally:
        done.set()
        writer.join(10)
    assert cdc.state.request(rid)["status"] == "interrupted"


def test_a_chunk_completion_fenced_by_a_lost_lease_moves_nothing(src_db, make_cdc):
    cdc, rid = _setup(src_db, make_cdc)
    cdc.start_tail()
    runner = DumpRunner(cdc.source, cdc.state, cdc.store, None, cdc.cfg.dump)
    task = runner.next_chunk_of(rid)
    window, _ = runner.open_chunk(task, abandon_after_s=0)
    old = cdc.state.acquire_lease("old", 0.3, request=rid)
    wait_until(lambda: cdc.state.lease_holder(rid) is None, 10, "the old token's lease expired")
    new = cdc.state.acquire_lease("new", 30, request=rid)
    assert int(new.split("|")[1]) > int(old.split("|")[1])  # fencing tokens only grow
    progress = {"done_keys": 10, "chunks": 1, "rows": 10, "dropped": 0, "missing": [], "missing_count": 0}
    with pytest.raises(LeaseLostError, match=f"held by {new}"):
        cdc.state.complete_chunk(rid, task.table, progress, window, {"rows": 10}, lease_token=old)
    assert cdc.state.window_is_open(window.id)
    assert cdc.state.progress(rid, task.table)["done_keys"] == 0
    cdc.state.complete_chunk(rid, task.table, progress, window, {"rows": 10}, lease_token=new)
    assert not cdc.state.window_is_open(window.id)
    assert cdc.state.progress(rid, task.table)["done_keys"] == 10
