"""A `dblog dump` killed with SIGKILL takes its Spark job with it (issue 15): spark-submit's
JVM and the Python driver under it die with the command, so no orphan driver goes on with
the request (and races a resumed run of it). Without a tail the dump's first window waits
for its HW: the job would otherwise live on until the window timeout."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest

from airflow_provider_dblog.engine.requests import DumpSpec
from helpers import wait_until


def spark_processes(root: psutil.Process) -> list[psutil.Process]:
    """The Spark processes under ``root``: the spark-submit JVM and the job's Python driver."""
    out = []
    for p in root.children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.NoSuchProcess:
            continue
        if "SparkSubmit" in cmd or "spark_jobs" in cmd:
            out.append(p)
    return out


@pytest.mark.parametrize("src_db", ["mariadb"], indirect=True)  # the job's process tree is the same for both
def test_a_killed_dump_command_leaves_no_spark_driver_running(src_db, make_cdc):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT NOT NULL")
        cur.execute(f"INSERT INTO t SELECT seq, 0 FROM {src_db.series(100)}")
    cdc = make_cdc(["t"], dump={"window_timeout_s": 600})
    rid = cdc.request(DumpSpec("all", []))
    dump = subprocess.Popen([sys.executable, "-m", "airflow_provider_dblog.cli", "--config", str(cdc.path),
                             "dump", "--request", rid], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    root = psutil.Process(dump.pid)
    try:
        def job_running():
            assert dump.poll() is None, dump.stderr.read().decode()[-3000:]
            procs = spark_processes(root)
            has_jvm = any("SparkSubmit" in " ".join(p.cmdline()) for p in procs)
            has_driver = any("dump_job" in " ".join(p.cmdline()) for p in procs)
            window_open = any(w.request == rid for w in cdc.state.open_windows())
            return procs if has_jvm and has_driver and window_open else None
        procs = wait_until(job_running, 180, "the dump's Spark job running, its first window open")
    except BaseException:
        dump.kill()
        raise
    os.kill(dump.pid, signal.SIGKILL)
    dump.wait()
    gone, alive = psutil.wait_procs(procs, timeout=60)
    for p in alive:  # (so a failure leaves nothing behind either)
        p.kill()
    assert not alive, [" ".join(p.cmdline())[:200] for p in alive]
