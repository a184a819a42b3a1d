"""The `dblog tail` command and the tail lease after a SIGKILL (issue 15): the dead tail's
lease outlives it until it expires. A tail started in that time says who holds the lease
and when it expires, and exits non-zero (3) unless told ``--skip-ok``; with
``--wait-lease`` it waits for the expiry and takes over, resuming from the checkpoint."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import wait_until

# the dead tail's lease lives this long after its last renewal (renewed every LEASE_S / 3):
# two `dblog tail` start-ups fit well inside what is left of it
LEASE_S = 20


def dblog_tail(cdc, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "airflow_provider_dblog.cli", "--config", str(cdc.path),
                           "tail", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("src_db", ["mariadb"], indirect=True)  # the lease is the engine's, not the source's
def test_a_tail_after_a_sigkill_reports_the_lease_and_waits_for_it_with_wait_lease(src_db, make_cdc):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT NOT NULL")
    cdc = make_cdc(["t"], tail={"lease_seconds": LEASE_S, "flush_seconds": 0.1})
    first = subprocess.Popen([sys.executable, "-m", "airflow_provider_dblog.cli", "--config", str(cdc.path),
                              "tail", "--seconds", "600"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def started():
        assert first.poll() is None, first.stderr.read().decode()
        return cdc.state.checkpoint()
    wait_until(started, 60, "the first tail's first checkpoint")
    holder = cdc.state.lease_holder()
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    with src_db.cursor() as cur:  # written while no tail runs
        cur.execute("INSERT INTO t VALUES (1, 1), (2, 2)")
    killed_at = cdc.state.checkpoint().pos

    # the lease still holds (a new one would have a new token): the next tail says so and fails
    refused = dblog_tail(cdc, "--seconds", "1")
    assert refused.returncode == 3, refused.stderr[-2000:]
    out = json.loads(refused.stdout.strip().splitlines()[-1])
    assert out["skipped"] is True and out["lease_holder"] == holder, out
    assert 0 < out["lease_expires_in_s"] <= LEASE_S, out
    assert "holds the lease" in refused.stderr and "--wait-lease" in refused.stderr, refused.stderr
    assert dblog_tail(cdc, "--seconds", "1", "--skip-ok").returncode == 0
    assert cdc.state.lease_holder() == holder and cdc.state.checkpoint().pos == killed_at  # nothing done

    # --wait-lease: waits for the dead tail's lease to expire, then tails from the checkpoint
    t0 = time.monotonic()
    waited = dblog_tail(cdc, "--seconds", "3", "--wait-lease", "120")
    assert waited.returncode == 0, waited.stderr[-3000:]
    out = json.loads(waited.stdout.strip().splitlines()[-1])
    assert out["skipped"] is False and out["events"] >= 2, out
    assert out["start"] == killed_at.encode(), out
    assert time.monotonic() - t0 < LEASE_S + 60
    assert cdc.state.checkpoint().pos > killed_at
    assert cdc.state.lease_holder() is None  # released at the end
