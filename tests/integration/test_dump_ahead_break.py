"""Break round on the pipelined dump (engine/dump_ahead.py): races between the chunk made
ready ahead (worker thread) and the one finishing (runner thread), made deterministic by
holding the worker at a chosen step."""
from __future__ import annotations

import threading

import pytest

from airflow_provider_dblog.engine.dump import DumpRunner
from airflow_provider_dblog.engine.local_chunks import LocalChunkReader
from airflow_provider_dblog.engine.requests import DumpSpec


def _ahead() -> bool:
    return threading.current_thread().name.startswith("dblog-dump-ahead")


def _table(src_db, rows: int) -> None:
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT NOT NULL")
        cur.execute(f"INSERT INTO t SELECT seq, seq * 3 FROM {src_db.series(rows)}")


@pytest.mark.parametrize("src_db", ["mariadb"], indirect=True)
def test_key_list_successor_planned_after_the_chunk_before_completed_skips_no_keys(src_db, make_cdc):
    """The worker reads the table's progress to find the next slice of keys; if chunk k
    completed first (the worker slow: GIL, Redis latency), done_keys already counts k's keys
    and ``successor`` adds them again: a slice of keys is skipped, the request done."""
    _table(src_db, 15)
    cdc = make_cdc(["t"], dump={"window_timeout_s": 30})
    cdc.start_tail()
    rid = cdc.request(DumpSpec("keys", [f"{cdc.db}.t"], keys=[[k] for k in range(1, 16)], chunk_size=5))
    completed = threading.Event()
    real_complete, real_progress = cdc.state.complete_chunk, cdc.state.progress

    def complete_chunk(*a, **kw):
        real_complete(*a, **kw)
        completed.set()

    def progress(rid_, table):
        if _ahead():   # the worker late: chunk k completes before it reads progress
            completed.wait(10)
        return real_progress(rid_, table)
    cdc.state.complete_chunk, cdc.state.progress = complete_chunk, progress
    DumpRunner(cdc.source, cdc.state, cdc.store, LocalChunkReader(cdc.source), cdc.cfg.dump).run(rid)
    p = real_progress(rid, f"{cdc.db}.t")
    assert cdc.state.request(rid)["status"] == "done"
    assert p["done_keys"] == 15 and p["rows"] == 15, p


class _FlagWhileAhead(LocalChunkReader):
    """Sets the request's flag while the chunk ahead is selected (after the worker checked it)."""

    def __init__(self, source, state, rid, flag):
        super().__init__(source)
        self.state, self.rid, self.flag, self.selects = state, rid, flag, 0

    def read(self, table, predicates, dest_uri, keep_file=True):
        self.selects += 1
        if _ahead() and self.selects == 2:
            self.state.set_flag(self.rid, self.flag)
        return super().read(table, predicates, dest_uri, keep_file)


@pytest.mark.parametrize("flag", ["cancel", "pause"])
@pytest.mark.parametrize("src_db", ["mariadb"], indirect=True)
def test_a_flag_set_while_the_next_chunk_is_selected_ahead_stops_before_it_completes(src_db, make_cdc, flag):
    """Set while chunk 2 is selected ahead (chunk 1 finishing): serially chunk 2 would never
    be taken (the flag is met between chunks: next_chunk_of); taken ready, it completes
    (snapshot written, progress moved) after the user's cancel or pause."""
    _table(src_db, 40)
    cdc = make_cdc(["t"], dump={"chunk_size": 10, "window_timeout_s": 30})
    cdc.start_tail()
    rid = cdc.request(DumpSpec("table", [f"{cdc.db}.t"], chunk_size=10, parallelism=1))
    reader = _FlagWhileAhead(cdc.source, cdc.state, rid, flag)
    runner = DumpRunner(cdc.source, cdc.state, cdc.store, reader, cdc.cfg.dump)
    try:
        runner.run(rid)
    except Exception as e:   # DumpCancelledError
        assert flag == "cancel", e
    assert cdc.state.request(rid)["status"] == ("cancelled" if flag == "cancel" else "paused")
    assert [w for w in cdc.state.open_windows() if w.request == rid] == []
    assert cdc.state.progress(rid, f"{cdc.db}.t")["chunks"] == 1, cdc.state.progress(rid, f"{cdc.db}.t")


@pytest.mark.parametrize("pipeline", [True, False])
@pytest.mark.parametrize("src_db", ["mariadb"], indirect=True)
def test_a_non_transient_finish_failure_with_a_chunk_ahead_fails_the_request_and_leaves_no_window(src_db, make_cdc, pipeline):
    """Chunk 1's finish fails for good while chunk 2 is ahead: the request is failed (not
    left 'running' by chunk 2's open), no window stays open, progress did not move."""
    _table(src_db, 40)
    cdc = make_cdc(["t"], dump={"chunk_size": 10, "window_timeout_s": 30, "pipeline": pipeline})
    cdc.start_tail()
    rid = cdc.request(DumpSpec("table", [f"{cdc.db}.t"], chunk_size=10, parallelism=1))

    def write_snapshot(*a, **kw):
        raise ValueError("drawn: a finish that fails for good")
    cdc.store.write_snapshot = write_snapshot
    runner = DumpRunner(cdc.source, cdc.state, cdc.store, LocalChunkReader(cdc.source), cdc.cfg.dump)
    with pytest.raises(ValueError):
        runner.run(rid)
    assert cdc.state.request(rid)["status"] == "failed"
    assert [w for w in cdc.state.open_windows() if w.request == rid] == []
    assert cdc.state.progress(rid, f"{cdc.db}.t")["chunks"] == 0
