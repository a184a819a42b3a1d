"""Two dump requests on one table at once (issue 15): two runners, each holding its own
request's lease, with windows open on the same table at the same time, and rows of both
windows changed while both are open. Each window is reconciled against its own LW/HW, and
the target takes the latest event per key by position, so whatever the interleaving the
target ends equal to the source.

The rows exist before the tail starts, so only the dumps can bring them to the target.
Each runner's first select waits at a barrier until the other's is there too: both
windows are open (LW written, HW not yet) when the barrier's action updates and deletes
rows in both chunks' key ranges.
"""
from __future__ import annotations

import threading

import pytest

from airflow_provider_dblog.engine.apply import run_apply
from airflow_provider_dblog.engine.dump import DumpRunner
from airflow_provider_dblog.engine.requests import DumpSpec
from airflow_provider_dblog.engine.sources import open_source

ROWS, CHUNK = 150, 20


@pytest.mark.parametrize("src_db", ["mariadb"], indirect=True)  # the dump's rules are the engine's
def test_two_dump_requests_on_one_table_at_once_converge(src_db, make_cdc):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT NOT NULL")
        cur.execute(f"INSERT INTO t SELECT seq, seq FROM {src_db.series(ROWS)}")
    cdc = make_cdc(["t"])
    cdc.start_tail()
    table = f"{cdc.db}.t"
    first = cdc.request(DumpSpec("keys", [table], keys=[[k] for k in range(1, 101)], chunk_size=CHUNK))
    second = cdc.request(DumpSpec("keys", [table], keys=[[k] for k in range(51, ROWS + 1)], chunk_size=CHUNK))

    def change_both_chunks():  # runs once, while both first windows are open
        open_windows = {w.request for w in cdc.state.open_windows()}
        assert open_windows == {first, second}, open_windows
        with src_db.cursor() as cur:
            cur.execute("UPDATE t SET v = v + 1000 WHERE id BETWEEN 1 AND 20 OR id BETWEEN 51 AND 70")
            cur.execute("DELETE FROM t WHERE id IN (10, 60)")
    barrier = threading.Barrier(2, action=change_both_chunks, timeout=60)

    results, errors = {}, []

    def run(rid: str) -> None:
        source = open_source(cdc.src_cfg)
        real, met = source.select_keys, []

        def select_keys(schema, keys):
            if not met:   # the first chunk: wait for the other runner's window
                met.append(True)
                barrier.wait()
            return real(schema, keys)
        source.select_keys = select_keys
        try:
            results[rid] = DumpRunner(source, cdc.state, cdc.store, None, cdc.cfg.dump).run(rid)
        except BaseException as e:  # noqa: BLE001 - asserted below
            errors.append(e)
        finally:
            source.close()
    threads = [threading.Thread(target=run, args=(rid,), daemon=True) for rid in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not errors and not any(t.is_alive() for t in threads), errors
    for rid, chunks in ((first, 5), (second, 5)):
        assert cdc.state.request(rid)["status"] == "done", cdc.state.request(rid)
        assert results[rid].tables[table]["chunks"] == chunks, results[rid]
    assert cdc.state.open_windows() == []
    cdc.drain()
    run_apply(cdc.cfg, "tgt", via="local")
    diff = cdc.compare("t")
    assert diff.equal, diff.describe()
