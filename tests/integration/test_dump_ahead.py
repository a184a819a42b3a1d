"""The pipelined dump (engine/dump_ahead.py, issue 30): chunk k+1 is planned, opened,
selected and given its HW while chunk k finishes.

Generated (hypothesis) over: a range or a key-list dump, the table's size and the chunk
size, writes to the chunk's keys and its neighbours at every select (inside the window),
a transient failure of one chunk's finish (the chunk selected ahead is given up and
planned again) or of one select (the one ahead: its error met when its turn comes), and a
run stopped after a few chunks (``max_chunks``) then resumed. Each history runs the real
DumpRunner against the real source, Redis and tail; then the target, applied, must equal
the source; no window may stay open; the completed windows must follow each other in the
log (each chunk's LW after the HW before it: they never overlap); and in a history without
failures, some chunk was selected while the one before it was still open (every chunk but the first was selected ahead).
"""
from __future__ import annotations

import itertools
import os
import threading

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_dblog.engine.dump import DumpRunner
from airflow_provider_dblog.engine.local_chunks import LocalChunkReader
from airflow_provider_dblog.engine.positions import Position
from airflow_provider_dblog.engine.requests import DumpSpec

from conftest import CDC
from helpers import unique

_tables = itertools.count()


class _Watched:
    """The chunk reader and key select of a run: writes inside each window, a drawn failure,
    and how many chunks were selected ahead (on the pipeline's thread)."""

    def __init__(self, cdc, src_db, table: str, rid: str, writes: list, fail_select: int | None):
        self.cdc, self.src_db, self.table, self.rid = cdc, src_db, table, rid
        self.writes, self.fail_select, self.selects, self.ahead = writes, fail_select, 0, 0
        self.reader = LocalChunkReader(cdc.source)

    def before_select(self) -> None:
        n, self.selects = self.selects, self.selects + 1
        if threading.current_thread().name.startswith("dblog-dump-ahead"):   # while the chunk before finishes
            self.ahead += 1
        with self.src_db.cursor() as cur:
            for stmt in self.writes[n % len(self.writes)] if self.writes else ():
                cur.execute(stmt.format(t=self.table))
        if n == self.fail_select:
            raise redis.ConnectionError("drawn: the select's connection cut")

    def read(self, table, predicates, dest_uri, keep_file=True):
        self.before_select()
        return self.reader.read(table, predicates, dest_uri, keep_file)


def _write(rows: int):
    """A statement on the table (``{t}``), or a key to insert (an int: _insert)."""
    key = st.integers(1, rows + 5)
    return st.one_of(
        key.map(lambda k: f"UPDATE {{t}} SET v = v + 1 WHERE id = {k}"),
        key.map(lambda k: f"DELETE FROM {{t}} WHERE id = {k}"),
        st.tuples(key, key).map(lambda ab: f"UPDATE {{t}} SET v = v * 2 WHERE id BETWEEN {min(ab)} AND {max(ab)}"),
        st.integers(rows + 1, rows + 40))


@st.composite
def _history(draw):
    rows = draw(st.integers(10, 80))
    chunk = draw(st.integers(3, 25))
    writes = draw(st.lists(st.lists(_write(rows), max_size=3), max_size=4))
    chunks = -(-rows // chunk)
    return {"mode": draw(st.sampled_from(["range", "keys"])), "rows": rows, "chunk": chunk, "writes": writes,
            "fail_finish": draw(st.none() | st.integers(0, chunks)),
            "fail_select": draw(st.none() | st.integers(0, chunks)),
            "max_chunks": draw(st.none() | st.integers(1, 3))}


def _insert(src_db, k) -> str:
    return (f"INSERT IGNORE INTO {{t}} VALUES ({k}, {k})" if src_db.kind == "mysql"
            else f"INSERT INTO {{t}} VALUES ({k}, {k}) ON CONFLICT DO NOTHING")


@pytest.mark.parametrize("src_db", ["mariadb", "postgres"], indirect=True)
@settings(max_examples=int(os.environ.get("DUMP_AHEAD_EXAMPLES", 6)), deadline=None, suppress_health_check=list(HealthCheck))
@given(h=_history())
def test_a_pipelined_dump_converges_with_windows_in_log_order(src_db, tmp_path, redis_client, h):
    name, prefix = f"t{next(_tables)}", unique("dblogtest")
    with src_db.cursor() as cur:
        src_db.create_table(cur, name, "id INT PRIMARY KEY, v BIGINT NOT NULL")
        cur.execute(f"INSERT INTO {name} SELECT seq, seq FROM {src_db.series(h['rows'])}")
    writes = [[_insert(src_db, w) if isinstance(w, int) else w for w in ws] for ws in h["writes"]]
    (tmp_path / name).mkdir()
    cdc = CDC(src_db, [name], tmp_path / name, prefix, dump={"chunk_size": h["chunk"], "parallelism": 2,
                                                                "window_timeout_s": 60, "retry_for_s": 60})
    try:
        _run_and_check(cdc, src_db, name, h, writes)
    finally:
        cdc.close()
        if src_db.kind == "postgres":   # its slot (the database's go with it, after the last example)
            with src_db.cursor() as cur:
                cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                            "WHERE slot_name = %s", (cdc.src_cfg.slot,))
        if keys := list(redis_client.scan_iter(match=f"{prefix}:*")):
            redis_client.delete(*keys)


def _run_and_check(cdc, src_db, name: str, h: dict, writes: list) -> None:
    cdc.start_tail()
    table = f"{cdc.db}.{name}"
    spec = (DumpSpec("keys", [table], keys=[[k] for k in range(1, h["rows"] + 6)], chunk_size=h["chunk"])
            if h["mode"] == "keys" else DumpSpec("table", [table], chunk_size=h["chunk"], parallelism=2))
    rid = cdc.request(spec)
    watched = _Watched(cdc, src_db, name, rid, writes, h["fail_select"])
    real_keys, real_snapshot, finishes = cdc.source.select_keys, cdc.store.write_snapshot, itertools.count()

    def select_keys(schema, keys):
        watched.before_select()
        return real_keys(schema, keys)

    def write_snapshot(*args, **kw):
        if next(finishes) == h["fail_finish"]:
            raise redis.ConnectionError("drawn: the finish's connection cut")
        return real_snapshot(*args, **kw)
    cdc.source.select_keys, cdc.store.write_snapshot = select_keys, write_snapshot
    runner = DumpRunner(cdc.source, cdc.state, cdc.store, watched, cdc.cfg.dump)
    if h["max_chunks"] is not None:
        runner.run(rid, max_chunks=h["max_chunks"])
        assert not [w for w in cdc.state.open_windows() if w.request == rid]   # nothing left open ahead
        assert cdc.state.request(rid)["status"] in ("paused", "done"), cdc.state.request(rid)
    runner.run(rid)
    assert cdc.state.request(rid)["status"] == "done", cdc.state.request(rid)
    assert cdc.state.open_windows() == []
    done = sorted((Position.decode(w["lw"]), Position.decode(w["hw"]))
                  for w in cdc.state.closed_windows(10_000) if w["request"] == rid and w["outcome"] == "done")
    assert all(hw < lw for (_, hw), (lw, _) in zip(done, done[1:])), done   # the windows never overlap
    if h["fail_finish"] is None and h["fail_select"] is None and h["max_chunks"] is None and len(done) > 2:
        assert watched.ahead == len(done) - 1, (watched.ahead, len(done))   # every chunk but the first
    cdc.drain()
    cdc.apply_local()
    cdc.assert_equal(name)
