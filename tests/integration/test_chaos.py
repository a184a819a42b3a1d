"""The chaos loop, short (issue 15): about 40 s of bench/chaos.py on MariaDB (every fault kind once).

A writer commits small and large transactions to three tables (one with a composite key);
the tail runs as a supervised ``dblog tail`` process; key-list and condition dumps (keys
missing included) run as runner processes, no Spark; applies run every few seconds; and
every fault kind is injected once, in a seeded order: SIGKILL of the tail, a zombie tail
(SIGSTOP past its lease, a new tail takes over, SIGCONT), SIGKILL of a dump runner mid-run,
MariaDB, PostgreSQL (the target) and Redis each stopped and started again. At the end the
harness drains, resumes every unfinished dump, applies, and compares every table row for
row; after each fault's recovery one table is verified (``dblog verify``) while the rest goes
on, and every verification must find it equal (issue 29: no false positives under chaos). The long run is ``python -m bench.chaos --minutes 10`` (README, Faults).

It stops the private servers: run it holding /tmp/dblog-tests.lock like every test that
touches them. The harness drops its databases and its Redis prefix when it ends.
"""
from __future__ import annotations

import json

from bench.chaos import KINDS, run_chaos


def test_a_short_chaos_run_diverges_nowhere_and_recovers_from_every_fault(servers, tmp_path):
    res = run_chaos(minutes=0.4, seed=11, source="mariadb", workdir=tmp_path, spark_every=0,
                    fault_gap=(2.0, 4.0), keep=True)
    summary = json.dumps({k: v for k, v in res.items() if k != "fault_log"}, indent=1, default=str)
    assert res["divergent_rows"] == 0, summary
    for kind in KINDS:
        assert res["faults_injected"].get(kind, 0) >= 1, (kind, summary)
        assert res["faults_recovered"].get(kind, 0) == res["faults_injected"][kind], (kind, summary)
    rec = res["recoveries"]
    assert rec["tail_restarts"] >= 2, summary  # after the kill, and beside the zombie
    assert rec["zombies_ended_by_themselves"] >= 1, summary  # the continued zombie noticed its lost lease
    assert rec["tail_retries"] >= 1 and rec["dump_retries"] + rec["apply_retries"] >= 1, summary
    assert res["dumps"]["killed"] >= 1 and rec["killed_dumps_completed"] == res["dumps"]["killed"], summary
    assert res["dumps"]["completed"] == res["dumps"]["requests"] >= 5, summary
    assert res["writer"]["rows"] > 1000, summary
    # a verification after every recovered fault, under the writer, dumps and applies: all equal
    checks = res["verifications"]
    assert checks["runs"] == sum(res["faults_recovered"].values()) >= len(KINDS), summary
    assert checks["equal"] == checks["runs"] and checks["compared"] > 0, summary
    assert res["ok"], summary
