"""DESIGN.md invariants 3 (the log never stalls), 4 (no locks) and 6 (fail closed),
each against the real servers; the ones that touch the source run on each source kind."""
from __future__ import annotations

import threading
import time

import pytest

from airflow_provider_dblog.engine.apply import run_apply
from airflow_provider_dblog.engine.dump import DumpRunner
from airflow_provider_dblog.engine.requests import DumpSpec
from airflow_provider_dblog.engine.errors import WatermarkError, WindowTimeoutError
from airflow_provider_dblog.engine.positions import Position
from helpers import StuckCommit, mysql_connect, pg_connect

MARIADB_ONLY = pytest.mark.parametrize("src_db", ["mariadb"], indirect=True)


def make_table(sdb, rows: int = 5_000) -> None:
    with sdb.cursor() as cur:
        sdb.create_table(cur, "t", "id INT PRIMARY KEY, v INT NOT NULL")
        cur.execute(f"INSERT INTO t SELECT seq, 0 FROM {sdb.series(rows)}")


def test_tail_never_waits_for_an_open_window(src_db, make_cdc):
    """A window whose HW never comes (a dump stuck in its select) does not hold the tail."""
    mysql_db = src_db.name
    make_table(src_db)
    cdc = make_cdc(["t"])
    cdc.start_tail()
    window = cdc.state.open_window("stuck", f"{mysql_db}.t", cdc.state.checkpoint().pos)
    cdc.source.ensure_watermark_table()
    cdc.source.write_watermark(window.lw)  # step 2, and then nothing: no select end, no HW
    with src_db.cursor() as cur:
        for i in range(1, 201):
            cur.execute("UPDATE t SET v = v + 1 WHERE id = %s", (i,))
    cdc.drain(timeout=30)  # the tail reached the log head past the LW
    assert cdc.state.watermark_pos(window.lw) is not None
    events = cdc.store.read_range(cdc.source.table_schema(f"{mysql_db}.t"), None, cdc.state.checkpoint().pos)
    assert events.num_rows == 200
    # but the apply frontier stays below the open window, so no snapshot can land under it
    assert cdc.state.frontier() <= window.floor < cdc.state.checkpoint().pos


def check_dump_statements(stmts: list[tuple[str, str]], table: str, key_range: tuple[str, str],
                          wm_ns: str, chunks: int, parallelism: int) -> None:
    """Invariant 4 on every statement a dump sent, in the order the server logged them
    (``stmts``: (session, SQL)): no lock; every read of the table bounded (a key range, a
    LIMIT, or Spark's schema probe that reads no row); each chunk's key-range selects
    between its LW and its HW (Algorithm 1 steps 2-4), one LW and one HW per chunk."""
    for _, q in stmts:
        upper = q.upper()
        for lock in ("LOCK TABLE", "FOR UPDATE", "LOCK IN SHARE MODE", "FOR SHARE"):
            assert lock not in upper, q
    reads = [(sid, q) for sid, q in stmts if q.lstrip().upper().startswith("SELECT") and table in q]
    ranged = []
    for sid, q in reads:
        compact = q.replace(" ", "")
        if " LIMIT " in q.upper() or "WHERE1=0" in compact:
            continue  # the max key or the chunk plan (LIMIT), or Spark's probe (no row)
        assert any(k in q for k in key_range), f"an unbounded read: {q}"
        ranged.append((sid, q))
    assert len(ranged) >= chunks * parallelism - 1, reads[:10]
    # the order: LW, that chunk's selects, HW; again for each chunk
    marks = [("wm", q) if q.upper().startswith("UPDATE") and wm_ns in q else ("select", q)
             for sid, q in stmts if (sid, q) in ranged or (q.upper().startswith("UPDATE") and wm_ns in q)]
    assert [m for m, _ in marks].count("wm") == 2 * chunks, marks  # one LW and one HW per chunk
    inside, per_window, counts = False, 0, []
    for kind, q in marks:
        if kind == "wm":
            if inside:
                counts.append(per_window)
            inside, per_window = not inside, 0
        else:
            assert inside, f"a chunk select outside any LW..HW window: {q}"
            per_window += 1
    assert not inside and len(counts) == chunks and all(c >= 1 for c in counts), counts
    sessions = {sid for sid, _ in ranged}
    isolation = {sid: q for sid, q in stmts if sid in sessions and "ISOLATION LEVEL" in q.upper()}
    assert set(isolation) == sessions, "a chunk-select session without its isolation level set"
    assert all("READ COMMITTED" in q.upper() for q in isolation.values()), isolation


@MARIADB_ONLY
def test_chunk_selects_are_single_bounded_statements_without_locks(src_db, make_cdc):
    """Every statement the dump's sessions sent (MariaDB's general log), in order: no lock,
    every read bounded, each chunk's selects between its LW and HW (check_dump_statements)."""
    mysql_db = src_db.name
    make_table(src_db, 30_000)
    cdc = make_cdc(["t"], dump={"chunk_size": 10_000, "parallelism": 3})
    cdc.start_tail()
    rid = cdc.request(DumpSpec("table", [f"{mysql_db}.t"]))
    with mysql_connect() as conn, conn.cursor() as cur:
        cur.execute("SET GLOBAL log_output = 'TABLE'")
        cur.execute("TRUNCATE mysql.general_log")
        cur.execute("SET GLOBAL general_log = 1")
        try:
            assert cdc.dump_spark(rid)["status"] == "done"
        finally:
            cur.execute("SET GLOBAL general_log = 0")
        # every session of the dump's: the driver's (watermarks, planning) and the executors'
        cur.execute("SELECT thread_id, CONVERT(argument USING utf8mb4) FROM mysql.general_log "
                    "WHERE command_type IN ('Query', 'Execute')")
        log = [(str(tid), q) for tid, q in cur.fetchall()]
    mine = {tid for tid, q in log if mysql_db in q or cdc.wm_ns in q}
    stmts = [(tid, q) for tid, q in log if tid in mine]
    check_dump_statements(stmts, f"`{mysql_db}`.`t`", ("`id` >", "`id` <="), cdc.wm_ns, chunks=3, parallelism=3)
    watermark_writes = [q for _, q in stmts if q.upper().startswith("UPDATE") and cdc.wm_ns in q]
    assert all("WHERE ID = 1" in q.upper().replace("`", "") for q in watermark_writes)


@MARIADB_ONLY  # Redis state only
def test_watermark_seen_twice_fails_its_window(make_cdc, src_db):
    mysql_db = src_db.name
    make_table(src_db, 10)
    cdc = make_cdc(["t"])
    token = cdc.state.acquire_lease("test", 30)
    cdc.state.commit(token, Position(1, 4), {"file": "x", "pos": 4}, [], 0)
    w = cdc.state.open_window("r1", f"{mysql_db}.t", Position(1, 4))
    cdc.state.commit(token, Position(1, 200), {}, [(w.lw, Position(1, 100)), (w.hw, Position(1, 150))], 0)
    cdc.state.commit(token, Position(1, 300), {}, [(w.lw, Position(1, 250))], 0)  # the same LW again
    with pytest.raises(WatermarkError, match="seen twice"):
        cdc.state.wait_window(w, 1)


@MARIADB_ONLY  # Redis state only
def test_high_watermark_before_low_watermark_fails_closed(make_cdc, src_db):
    mysql_db = src_db.name
    make_table(src_db, 10)
    cdc = make_cdc(["t"])
    token = cdc.state.acquire_lease("test", 30)
    cdc.state.commit(token, Position(1, 4), {}, [], 0)
    w = cdc.state.open_window("r1", f"{mysql_db}.t", Position(1, 4))
    cdc.state.commit(token, Position(1, 200), {}, [(w.hw, Position(1, 100)), (w.lw, Position(1, 150))], 0)
    with pytest.raises(WatermarkError, match="not after LW"):
        cdc.state.wait_window(w, 1)


def test_watermark_from_an_earlier_run_is_drained_not_misread(make_cdc, src_db):
    make_table(src_db, 10)
    cdc = make_cdc(["t"])
    cdc.start_tail()
    cdc.source.ensure_watermark_table()
    cdc.source.write_watermark("0f0f0f0f-0000-0000-0000-earlier-run")  # nobody issued it
    cdc.drain()
    assert cdc.state.watermark_pos("0f0f0f0f-0000-0000-0000-earlier-run") is None
    assert cdc.state.counters().get("stale_watermarks_drained", 0) >= 1


def test_window_that_never_closes_fails_the_dump_with_a_recorded_state(src_db, make_cdc):
    mysql_db = src_db.name
    make_table(src_db, 100)
    cdc = make_cdc(["t"], dump={"window_timeout_s": 1.5, "chunk_size": 50})
    # no tail is running: the HW is never seen

    class Reader:
        def read(self, table, predicates, dest, keep_file=True):
            return cdc.source.select_keys(table, [(i,) for i in range(1, 51)])
    runner = DumpRunner(cdc.source, cdc.state, cdc.store, Reader(), cdc.cfg.dump)
    rid = runner.submit(DumpSpec("table", [f"{mysql_db}.t"]))
    token = cdc.state.acquire_lease("test", 30)
    cdc.state.commit(token, Position(1, 4), {}, [], 0)
    t0 = time.monotonic()
    with pytest.raises(WindowTimeoutError, match="Is the log tail running"):
        runner.run(rid)
    assert time.monotonic() - t0 < 10
    req = cdc.state.request(rid)
    assert req["status"] == "failed" and "did not close" in req["error"]
    assert not cdc.state.open_windows()  # recorded as failed, not left holding apply back
    assert cdc.state.progress(rid, f"{mysql_db}.t").get("chunks", 0) == 0


@pytest.mark.parametrize("src_db", ["postgres"], indirect=True)
def test_postgres_chunk_selects_are_single_bounded_statements_without_locks(src_db, make_cdc, servers):
    """The same as on MariaDB, read from PostgreSQL's statement log (log_statement=all for
    the source database only): key-range SELECTs in READ COMMITTED sessions, single-row
    watermark UPDATEs, no LOCK TABLE / FOR UPDATE / FOR SHARE."""
    import re
    from airflow_provider_dblog.devenv.servers import POSTGRES, default_base
    make_table(src_db, 30_000)
    cdc = make_cdc(["t"], dump={"chunk_size": 10_000, "parallelism": 3})
    cdc.start_tail()
    rid = cdc.request(DumpSpec("table", [f"{src_db.name}.t"]))
    log_path = POSTGRES.paths(default_base()).log
    with pg_connect() as admin:
        admin.autocommit = True
        with admin.cursor() as cur:
            cur.execute(f'ALTER DATABASE "{src_db.database}" SET log_statement = \'all\'')
    start = log_path.stat().st_size
    try:
        assert cdc.dump_spark(rid)["status"] == "done"
    finally:
        with pg_connect() as admin:
            admin.autocommit = True
            with admin.cursor() as cur:
                cur.execute(f'ALTER DATABASE "{src_db.database}" RESET log_statement')
    with open(log_path, "rb") as f:
        f.seek(start)
        text = f.read().decode("utf-8", "replace")
    # '<time> [pid] LOG:  statement: ...' or '... LOG:  execute <unnamed>: ...' (JDBC)
    stmts = [(pid, q) for pid, q in re.findall(
        r"\[(\d+)\] LOG:  (?:statement|execute [^:]*): (.*)", text)]
    check_dump_statements(stmts, f'"{src_db.name}"."t"', ('"id" >', '"id" <='), cdc.wm_ns,
                          chunks=3, parallelism=3)
    watermark_writes = [q for _, q in stmts if q.upper().startswith("UPDATE") and cdc.wm_ns in q]
    assert all(q.endswith("WHERE id = 1") for q in watermark_writes), watermark_writes


POSTGRES_ONLY = pytest.mark.parametrize("src_db", ["postgres"], indirect=True)


def _stale_row_setup(src_db, make_cdc):
    make_table(src_db, 100)
    cdc = make_cdc(["t"])
    stuck = StuckCommit(src_db.database, (cdc.cfg.target("tgt").endpoint.database,))
    cdc.start_tail()
    # in the log (the tail passes it), not visible: a synchronous standby that never answers
    stuck.start(f'UPDATE "{src_db.name}".t SET v = 7 WHERE id = 5')
    cdc.drain()
    with src_db.cursor() as cur:
        cur.execute("SELECT v FROM t WHERE id = 5")
        assert cur.fetchone() == (0,) and not stuck.committed.is_set()
    return cdc, stuck


@POSTGRES_ONLY
def test_a_commit_logged_before_the_low_watermark_is_seen_by_the_chunk(src_db, make_cdc):
    """Invariant 2 when PostgreSQL makes a commit visible after logging it: a chunk select
    that did not see it would emit the old row at the HW, over the newer log event, and the
    target would keep it. The watermark waits until no logged commit is invisible."""
    cdc, stuck = _stale_row_setup(src_db, make_cdc)
    try:
        rid = cdc.request(DumpSpec("keys", [f"{src_db.name}.t"], keys=[[5], [6]]))
        waited = time.monotonic()
        threading.Timer(2.0, stuck.release).start()   # the standby answers, later
        DumpRunner(cdc.source, cdc.state, cdc.store, None, cdc.cfg.dump).run(rid)
        assert time.monotonic() - waited >= 1.5 and stuck.committed.is_set()
    finally:
        stuck.close()
    cdc.drain()
    run_apply(cdc.cfg, "tgt", via="local")
    with cdc.target() as t, t.conn.cursor() as cur:   # the dumped rows, as the source has them
        cur.execute(f'SELECT id, v FROM "public"."{src_db.name}__t" ORDER BY id')
        assert cur.fetchall() == [(5, 7), (6, 0)]


@POSTGRES_ONLY
def test_a_commit_that_never_becomes_visible_fails_the_watermark(src_db, make_cdc):
    cdc, stuck = _stale_row_setup(src_db, make_cdc)
    try:
        cdc.source.visible_timeout_s = 1.0
        rid = cdc.request(DumpSpec("keys", [f"{src_db.name}.t"], keys=[[5]]))
        with pytest.raises(WatermarkError, match="synchronous standby"):
            DumpRunner(cdc.source, cdc.state, cdc.store, None, cdc.cfg.dump).run(rid)
        assert cdc.state.request(rid)["status"] == "failed"
    finally:
        stuck.close()
