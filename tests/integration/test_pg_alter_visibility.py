"""An ALTER TABLE and rows in one transaction, committed in the log but not yet visible when
the tail decodes it (a synchronous standby's acknowledgement stands between the two; without
one the gap is short, and the schema fuzzer met it about once in 56 sequences): the tail's
catalog read at the new Relation message waits for the transaction to be visible, so the
table is not taken for changed again since (a false quarantine). The gap is made to last with
a synchronous standby that never answers (helpers.StuckCommit), released after a while."""
from __future__ import annotations

import threading

import pytest

from airflow_provider_dblog.engine.quarantine import quarantined

from helpers import StuckCommit, wait_until

POSTGRES = pytest.mark.parametrize("src_db", ["postgres"], indirect=True)


@POSTGRES
@pytest.mark.parametrize("alter", ["ADD COLUMN w int DEFAULT 5", "ALTER COLUMN v TYPE bigint", "DROP COLUMN note"])
def test_an_alter_with_rows_decoded_before_it_is_visible_is_no_break(src_db, make_cdc, alter):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id int PRIMARY KEY, v int, note text")
        cur.execute("INSERT INTO t VALUES (1, 1, 'a')")
    cdc = make_cdc(["t"])
    db = cdc.db
    cdc.start_tail()   # (its slot made before: making one waits for every running transaction)
    cdc.dump_local("t")
    with StuckCommit(src_db.database, (cdc.cfg.target("tgt").endpoint.database,)) as stuck:
        stuck.start(f"BEGIN; ALTER TABLE {db}.t {alter}; INSERT INTO {db}.t (id, v) VALUES (2, 2); "
                    f"UPDATE {db}.t SET v = 3 WHERE id = 1; COMMIT")

        def logged_and_waiting():   # its commit record in the log, the server waiting for the standby
            (n,), = cdc.source._query("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'")
            return n > 0 and not stuck.committed.is_set()
        wait_until(logged_and_waiting, 30, "the stuck transaction's commit in the log")
        threading.Timer(1.5, stuck.release).start()
        cdc.drain()
    assert quarantined(cdc.state) == {}, quarantined(cdc.state)
    cdc.apply_local()
    cdc.assert_equal("t")
