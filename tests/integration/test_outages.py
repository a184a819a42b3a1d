"""Outages: the source or Redis stopped and started again under a running tail (issue 15).

The private servers themselves are stopped (a clean shutdown) and started again, while a
writer keeps committing around the outage. The tail, which would have failed at the
first connection error, starts again from its checkpoint with backoff (``tail.retry_for_s``)
and counts the restarts; once the server is back every row reaches the target exactly
(the compare is row for row, so nothing is lost and nothing is duplicated). A server
that stays away past ``retry_for_s`` ends the tail with SourceUnavailableError.
"""
from __future__ import annotations

import pytest

from airflow_provider_dblog.devenv import servers as devenv
from airflow_provider_dblog.engine.apply import run_apply
from airflow_provider_dblog.engine.errors import SourceUnavailableError
from airflow_provider_dblog.engine.requests import DumpSpec
from airflow_provider_dblog.engine.dump import DumpRunner
from helpers import wait_until


SERVER = {"mysql": "mariadb", "postgres": "postgres"}  # a source kind's private server


def _down_and_up(server: str, meanwhile=lambda: None):
    """Stop ``server`` (a private one), run ``meanwhile``, start it again (waits until it answers)."""
    devenv.stop(server)
    try:
        meanwhile()
    finally:
        devenv.start(server)


def _setup(src_db, make_cdc, retry_for_s: float):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT NOT NULL")
        cur.execute(f"INSERT INTO t SELECT seq, seq FROM {src_db.series(20)}")
    cdc = make_cdc(["t"], tail={"retry_for_s": retry_for_s})
    cdc.start_tail()
    rid = cdc.request(DumpSpec("keys", [f"{cdc.db}.t"], keys=[[k] for k in range(1, 21)]))
    DumpRunner(cdc.source, cdc.state, cdc.store, None, cdc.cfg.dump).run(rid)
    return cdc


def _write(src_db, first: int, n: int) -> None:
    with src_db.cursor() as cur:
        cur.execute(f"INSERT INTO t SELECT seq + {first - 1}, seq * 7 FROM {src_db.series(n)}")
        cur.execute(f"UPDATE t SET v = v + 1 WHERE id <= {first // 2}")


def _converged(cdc) -> None:
    cdc.drain(timeout=180)
    cdc.stop_tail()  # raises what the tail raised, if anything
    assert cdc.tail_stats[-1].retries >= 1, cdc.tail_stats
    run_apply(cdc.cfg, "tgt", via="local")
    diff = cdc.compare("t")
    assert diff.equal, diff.describe()


def _tail_retried(caplog):
    """Wait until the tail (a thread of this process) has logged a restart after an error."""
    wait_until(lambda: any("starting again from the checkpoint" in r.getMessage() for r in caplog.records),
               60, "the tail noticing the outage")


def test_the_tail_rides_out_a_source_restart(src_db, make_cdc, caplog):
    cdc = _setup(src_db, make_cdc, retry_for_s=180)
    _write(src_db, 21, 30)
    cdc.source.close()
    _down_and_up(SERVER[src_db.kind], lambda: _tail_retried(caplog))
    _write(src_db, 51, 30)  # after the restart
    _converged(cdc)
    assert cdc.state.counters()["tail_retries"] >= 1  # shown by `dblog status`


@pytest.mark.parametrize("src_db", ["mariadb"], indirect=True)  # Redis is the same for both sources
def test_the_tail_rides_out_a_redis_restart(src_db, make_cdc, caplog):
    cdc = _setup(src_db, make_cdc, retry_for_s=180)

    def while_down():
        _write(src_db, 21, 30)  # committed in the source while Redis is away
        _tail_retried(caplog)  # (longer than redis-py's own retries)
    _down_and_up("redis", while_down)
    _write(src_db, 51, 30)
    _converged(cdc)


@pytest.mark.parametrize("src_db", ["mariadb"], indirect=True)
def test_a_source_away_past_retry_for_s_ends_the_tail_with_a_clear_error(src_db, make_cdc):
    cdc = _setup(src_db, make_cdc, retry_for_s=3)
    cdc.source.close()

    def while_down():
        wait_until(lambda: cdc.tail_error is not None, 60, "the tail giving up")
    _down_and_up(SERVER[src_db.kind], while_down)
    with pytest.raises(SourceUnavailableError, match=r"gave up after \d+ failed attempt\(s\) over \d+s "
                                                     r"\(tail.retry_for_s 3\)"):
        cdc.stop_tail()
    cdc.tail_error = None
    # nothing was lost: a new tail goes on from the checkpoint
    _write(src_db, 21, 10)
    cdc.start_tail()
    cdc.drain()
    cdc.stop_tail()
    run_apply(cdc.cfg, "tgt", via="local")
    assert cdc.compare("t").equal
