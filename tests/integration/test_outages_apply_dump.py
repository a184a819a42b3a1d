"""Outages under the apply and the dump: the target or the source stopped and started again (issue 15).

The private servers themselves are stopped (a clean, fast shutdown that ends every session)
and started again. The apply, stopped inside its merge transaction, redoes the table's batch
with backoff (``apply.retry_for_s``): the target ends equal to the source row for row, with
no stage table left and the retries counted. The dump, with the source stopped at a point
inside a chunk (before the LW, before the select, before the HW), redoes that chunk in a new
window (``dump.retry_for_s``): every chunk completes exactly once and the target ends equal.
Past ``retry_for_s`` both end with a clear error, and a rerun converges. A SQL error with a
SQLSTATE is not retried. The source is MariaDB throughout: PostgreSQL is the target here.
"""
from __future__ import annotations

import threading

import psycopg2
import psycopg2.errors
import pytest
from psycopg2 import sql

from airflow_provider_dblog.devenv import servers as devenv
from airflow_provider_dblog.engine.apply import run_apply
from airflow_provider_dblog.engine.dump import DumpRunner
from airflow_provider_dblog.engine.errors import SourceUnavailableError, TablesNotAppliedError, TargetUnavailableError
from airflow_provider_dblog.engine.requests import DumpSpec
from airflow_provider_dblog.engine.targets import PostgresTarget, target_table_name
from airflow_provider_dblog.engine.targets.pg_tables import STAGE_PREFIX
from helpers import POSTGRES_PORT, pg_connect, wait_until

pytestmark = pytest.mark.parametrize("src_db", ["mariadb"], indirect=True)

KEYS, CHUNK = 40, 10  # a key-list dump of four chunks, selected in-process (no Spark)


def _setup(src_db, make_cdc, **sections):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT NOT NULL")
        cur.execute(f"INSERT INTO t SELECT seq, seq FROM {src_db.series(KEYS)}")
    cdc = make_cdc(["t"], **sections)
    cdc.start_tail()
    return cdc


def _request(cdc) -> str:
    return cdc.request(DumpSpec("keys", [f"{cdc.db}.t"], keys=[[k] for k in range(1, KEYS + 1)], chunk_size=CHUNK))


def _write(src_db, first: int, n: int) -> None:
    with src_db.cursor() as cur:
        cur.execute(f"INSERT INTO t SELECT seq + {first - 1}, seq * 7 FROM {src_db.series(n)}")
        cur.execute(f"UPDATE t SET v = v + 1 WHERE id <= {first // 2}")
        cur.execute("DELETE FROM t WHERE id % 9 = 0")


def _equal(cdc) -> None:
    cdc.drain()
    diff = cdc.compare("t")
    assert diff.equal, diff.describe()


def _logged(caplog, words: str, what: str) -> None:
    wait_until(lambda: any(words in r.getMessage() for r in caplog.records), 60, what)


def _stage_tables(cdc) -> list[str]:
    with PostgresTarget(cdc.cfg.target("tgt")) as t, t.conn.cursor() as cur:
        cur.execute("SELECT relname FROM pg_class WHERE relname LIKE %s", (STAGE_PREFIX.replace("_", r"\_") + "%",))
        return [r[0] for r in cur.fetchall()]


def _in_thread(fn):
    """Run ``fn`` in a thread; ``join()`` returns its result or raises its error."""
    out: dict = {}

    def run():
        try:
            out["result"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to join
            out["error"] = e
    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def join(timeout: float = 120):
        thread.join(timeout)
        assert not thread.is_alive(), f"not finished within {timeout:.0f}s"
        if "error" in out:
            raise out["error"]
        return out["result"]
    return join


# -- the apply -----------------------------------------------------------------------------
def _dumped_and_applied(src_db, make_cdc, retry_for_s: float):
    cdc = _setup(src_db, make_cdc, apply={"retry_for_s": retry_for_s})
    DumpRunner(cdc.source, cdc.state, cdc.store, None, cdc.cfg.dump).run(_request(cdc))
    run_apply(cdc.cfg, "tgt", via="local")  # creates the target table
    _write(src_db, KEYS + 1, 30)
    cdc.drain()
    return cdc


def test_the_apply_rides_out_the_target_stopped_inside_its_merge(src_db, make_cdc, caplog):
    cdc = _dumped_and_applied(src_db, make_cdc, retry_for_s=120)
    tcfg = cdc.cfg.target("tgt")
    name = target_table_name(cdc.source.table_schema(f"{cdc.db}.t"))
    # the merge's INSERT waits for this lock: the apply is inside its merge transaction, its
    # batch staged, when the server goes away
    holder = psycopg2.connect(host="127.0.0.1", port=POSTGRES_PORT, user="postgres", dbname=tcfg.endpoint.database)
    try:
        with holder.cursor() as cur:
            cur.execute(sql.SQL("LOCK TABLE {}.{} IN ACCESS EXCLUSIVE MODE").format(
                sql.Identifier(tcfg.schema), sql.Identifier(name)))
        join = _in_thread(lambda: run_apply(cdc.cfg, "tgt", via="local"))
        watcher = pg_connect()
        try:
            def merge_waiting():
                with watcher.cursor() as cur:
                    cur.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'dblog-apply' "
                                "AND datname = %s AND wait_event_type = 'Lock' AND query LIKE %s",
                                (tcfg.endpoint.database, "%WITH latest AS%"))
                    return cur.fetchone()[0] == 1
            wait_until(merge_waiting, 60, "the apply's merge waiting for the table")
        finally:
            watcher.close()
        assert _stage_tables(cdc), "the batch is staged"
        devenv.stop("postgres")
        try:
            _logged(caplog, "retrying in", "the apply noticing the outage")
        finally:
            devenv.start("postgres")
        result = join()
    finally:
        holder.close()
    assert result["retries"] >= 1 and result["tables"][f"{cdc.db}.t"]["retries"] >= 1, result
    assert result["tables"][f"{cdc.db}.t"]["status"] == "applied", result
    assert cdc.state.counters()["apply_retries"] >= 1  # shown by `dblog status`
    assert _stage_tables(cdc) == []  # the failed attempt's stage was replaced, then merged and dropped
    _equal(cdc)  # row for row: nothing lost, nothing twice
    assert run_apply(cdc.cfg, "tgt", via="local")["events"] == 0  # the checkpoint moved with the rows


def test_a_target_away_past_retry_for_s_ends_the_apply_with_a_clear_error(src_db, make_cdc):
    cdc = _dumped_and_applied(src_db, make_cdc, retry_for_s=2)
    devenv.stop("postgres")
    try:
        with pytest.raises(TargetUnavailableError,
                           match=r"to target tgt \(postgres 127\.0\.0\.1:\d+/tgt_\w+\): gave up after \d+ failed "
                                 r"attempt\(s\) over [23]s \(apply\.retry_for_s 2\): OperationalError: "):
            run_apply(cdc.cfg, "tgt")  # (auto: counting the events meets the outage first)
    finally:
        devenv.start("postgres")
    result = run_apply(cdc.cfg, "tgt")  # a rerun afterwards converges
    assert result["via"] == "local" and result["retries"] == 0, result
    _equal(cdc)


def test_the_apply_rides_out_the_source_stopped_when_it_starts(src_db, make_cdc, caplog):
    """The apply asks the source for the tables' schemas first: that too is retried (found by
    the chaos loop: a scheduled apply failed at once while the source was down)."""
    cdc = _dumped_and_applied(src_db, make_cdc, retry_for_s=120)
    devenv.stop("mariadb")
    try:
        join = _in_thread(lambda: run_apply(cdc.cfg, "tgt", via="local"))
        _logged(caplog, "from source src", "the apply retrying the schemas")
    finally:
        devenv.start("mariadb")
    result = join()
    assert result["tables"][f"{cdc.db}.t"]["status"] == "applied", result
    # (the tail's checkpoint reaches the restarted server's new binlog with its first transaction)
    _write(src_db, 2 * KEYS + 1, 5)
    cdc.drain()
    run_apply(cdc.cfg, "tgt", via="local")
    _equal(cdc)


def test_a_sql_error_is_not_retried(src_db, make_cdc):
    cdc = _dumped_and_applied(src_db, make_cdc, retry_for_s=120)
    tcfg = cdc.cfg.target("tgt")
    name = target_table_name(cdc.source.table_schema(f"{cdc.db}.t"))
    with PostgresTarget(tcfg) as t, t.conn, t.conn.cursor() as cur:  # v * 7 no longer fits
        cur.execute(sql.SQL("ALTER TABLE {}.{} ALTER COLUMN v TYPE smallint").format(
            sql.Identifier(tcfg.schema), sql.Identifier(name)))
    _write(src_db, 1000, 1)
    with src_db.cursor() as cur:
        cur.execute("UPDATE t SET v = 100000 WHERE id = 1000")
    cdc.drain()
    with pytest.raises(TablesNotAppliedError, match="NumericValueOutOfRange") as caught:
        run_apply(cdc.cfg, "tgt", via="local")
    cause = caught.value.__cause__   # the table's own error
    assert isinstance(cause, psycopg2.errors.NumericValueOutOfRange), repr(cause)
    assert PostgresTarget.is_transient(cause) is False and cause.pgcode == "22003"
    assert "apply_retries" not in cdc.state.counters()
    assert _stage_tables(cdc) == []  # a failed merge drops its stage


def test_the_target_tells_a_server_away_from_a_fault_by_real_errors(src_db, make_cdc):
    cdc = _dumped_and_applied(src_db, make_cdc, retry_for_s=120)
    t = PostgresTarget(cdc.cfg.target("tgt"))
    conn = t.conn  # one session throughout: the last statement meets it closed
    errors = []
    for statement in ("SELECT 'x'::int", "SELECT * FROM no_such_table", "SELECT pg_terminate_backend(pg_backend_pid())",
                      "SELECT 1"):
        try:
            with conn.cursor() as cur:
                cur.execute(statement)
            conn.rollback()
        except psycopg2.Error as e:
            errors.append((type(e).__name__, e.pgcode, PostgresTarget.is_transient(e)))
            try:
                conn.rollback()
            except psycopg2.Error:
                pass
    t.close()
    assert errors[:2] == [("InvalidTextRepresentation", "22P02", False), ("UndefinedTable", "42P01", False)]
    # the backend ended under us ("terminating connection due to administrator command": psycopg2
    # reports it without its SQLSTATE, or as 57P01 AdminShutdown), then the dead connection
    assert [(name in ("OperationalError", "AdminShutdown"), transient) for name, _, transient in errors[2:3]] \
        == [(True, True)], errors
    assert errors[3:] == [("InterfaceError", None, True)], errors
    with pytest.raises(psycopg2.OperationalError) as refused:
        psycopg2.connect(host="127.0.0.1", port=1, user="postgres", connect_timeout=5)
    assert PostgresTarget.is_transient(refused.value)


# -- the dump ------------------------------------------------------------------------------
class StopsServerAt:
    """The runner's real source, except that the ``nth`` call of ``method`` first stops the
    private ``server`` (a point inside a chunk: the LW write, the select, the HW write)."""

    def __init__(self, source, method: str, nth: int, server: str = "mariadb"):
        self._source, self._method, self._nth, self._server = source, method, nth, server
        self.calls = 0

    def __getattr__(self, name):
        attr = getattr(self._source, name)
        if name != self._method:
            return attr

        def call(*args, **kwargs):
            self.calls += 1
            if self.calls == self._nth:
                devenv.stop(self._server)
            return attr(*args, **kwargs)
        return call


def _windows_of(cdc, rid: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for w in cdc.state.closed_windows(1000):
        if w["request"] == rid:
            out[w["outcome"]] = out.get(w["outcome"], 0) + 1
    return out


# chunk 2's LW is the 3rd watermark written, its HW the 4th; its select the 2nd
POINTS = {"lw": ("write_watermark", 3), "select": ("select_keys", 2), "hw": ("write_watermark", 4)}


@pytest.mark.parametrize("point", sorted(POINTS))
def test_the_dump_redoes_a_chunk_the_source_was_stopped_in(src_db, make_cdc, caplog, point):
    cdc = _setup(src_db, make_cdc, dump={"retry_for_s": 120})
    rid = _request(cdc)
    source = StopsServerAt(cdc.source, *POINTS[point])
    join = _in_thread(lambda: DumpRunner(source, cdc.state, cdc.store, None, cdc.cfg.dump).run(rid))
    try:
        wait_until(lambda: source.calls >= POINTS[point][1], 60, f"the dump reaching chunk 2's {point}")
        _logged(caplog, "retrying in", "the dump noticing the outage")
    finally:
        devenv.start("mariadb")
    summary = join()
    assert summary.retries >= 1 and cdc.state.request(rid)["status"] == "done", summary
    progress = cdc.state.progress(rid, f"{cdc.db}.t")
    assert progress["chunks"] == KEYS // CHUNK and progress["rows"] == KEYS, progress
    windows = _windows_of(cdc, rid)
    assert windows.get("done") == KEYS // CHUNK, windows  # every chunk completed once
    assert windows.get("failed", 0) + windows.get("abandoned", 0) >= 1, windows  # the window of the outage
    assert cdc.state.counters()["dump_retries"] >= 1
    assert [w for w in cdc.state.open_windows() if w.request == rid] == []  # none holds the apply back
    _write(src_db, KEYS + 1, 20)
    cdc.drain()
    run_apply(cdc.cfg, "tgt", via="local")
    _equal(cdc)


def test_a_source_away_past_retry_for_s_fails_the_dump_and_a_rerun_resumes(src_db, make_cdc):
    cdc = _setup(src_db, make_cdc, dump={"retry_for_s": 2})
    rid = _request(cdc)
    source = StopsServerAt(cdc.source, "select_keys", 2)
    try:
        with pytest.raises(SourceUnavailableError,
                           match=rf"^dump request {rid} of source src: gave up after \d+ failed attempt\(s\) over "
                                 r"[23]s \(dump\.retry_for_s 2\): OperationalError: "):
            DumpRunner(source, cdc.state, cdc.store, None, cdc.cfg.dump).run(rid)
    finally:
        devenv.start("mariadb")
    req = cdc.state.request(rid)
    assert req["status"] == "failed" and "dump.retry_for_s 2" in req["error"], req
    assert cdc.state.progress(rid, f"{cdc.db}.t")["chunks"] == 1  # the chunk before the outage is kept
    assert [w for w in cdc.state.open_windows() if w.request == rid] == []  # its failed window was closed
    summary = DumpRunner(cdc.source, cdc.state, cdc.store, None, cdc.cfg.dump).run(rid)  # a rerun resumes
    assert summary.retries == 0 and cdc.state.request(rid)["status"] == "done"
    assert _windows_of(cdc, rid).get("done") == KEYS // CHUNK  # chunk 1 not redone
    cdc.drain()
    run_apply(cdc.cfg, "tgt", via="local")
    _equal(cdc)
