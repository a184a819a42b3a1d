"""DBLogVerifyOperator (issue 29) on real servers: a damaged target fails the task with the
differing keys in the log and an Asset event carrying the counts per table; ``repair`` dumps,
applies and verifies them again (the task succeeds); a bad key list fails at once without a
request. The apply runs in a thread beside it (the apply DAG's part)."""
from __future__ import annotations

import contextlib
import threading

import pytest

from airflow_provider_dblog.engine.apply import run_apply
from airflow_provider_dblog.exceptions import DBLogInvalidRequest, DBLogVerificationFailed
from airflow_provider_dblog.operators.verify import DBLogVerifyOperator

ITEMS = {"items": "id INT PRIMARY KEY, v VARCHAR(20)"}


@contextlib.contextmanager
def _applying(setup):
    stop, errors = threading.Event(), []

    def run():
        while not stop.is_set():
            try:
                run_apply(setup.config, "tgt", via="local")
            except Exception as e:   # noqa: BLE001 - surfaced below
                errors.append(e)
                return
            stop.wait(0.2)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(60)
    assert not errors, errors


def test_the_operator_fails_on_a_difference_with_an_asset_event_and_repairs_it(dblog_setup, context, caplog):
    from airflow_provider_dblog.assets import verify_asset
    from airflow_provider_dblog.engine.targets import target_table_name
    from helpers import TailThread, pg_connect

    s = dblog_setup(ITEMS)
    (table,) = s.tables
    tail = TailThread(s).start()
    try:
        s.execute("INSERT INTO items VALUES " + ", ".join(f"({i}, 'v{i}')" for i in range(1, 21)))
        tail.drain()
        run_apply(s.config, "tgt", via="local")
        schema = s.source().table_schema(table)
        tcfg = s.config.target("tgt")
        with contextlib.closing(pg_connect(tcfg.endpoint.database)) as conn, conn.cursor() as cur:
            cur.execute(f'UPDATE "{tcfg.schema}"."{target_table_name(schema)}" SET v = %s WHERE id = 3', ("bad",))
        kw = dict(config_path=str(s.path), target="tgt", scope="keys", table=table, keys="[1, 2, 3]")
        requests = s.state().requests(100)
        with pytest.raises(DBLogInvalidRequest, match="expected 1 value"):
            DBLogVerifyOperator(task_id="bad", **(kw | {"keys": "[[1, 2]]"})).execute(context)
        assert s.state().requests(100) == requests
        with _applying(s):
            op = DBLogVerifyOperator(task_id="verify", repair="False", **kw)
            assert op.outlets == [verify_asset("tgt")]
            with pytest.raises(DBLogVerificationFailed, match=table):
                op.execute(context)
            extra = context["outlet_events"][verify_asset("tgt")].extra
            counts = extra["tables"][table]
            assert (extra["target"], counts["different"], counts["compared"], counts["equal"]) == ("tgt", 1, 3, False)
            assert "[{'key': [3], 'columns': ['v']}]" in caplog.text
            result = DBLogVerifyOperator(task_id="verify", repair="True", **kw).execute(context)
            assert result["repaired"] and result["repair"][table]["keys"] == 1, result
            assert context["outlet_events"][verify_asset("tgt")].extra["tables"][table]["repaired"] is True
    finally:
        tail.stop()
    from airflow_provider_dblog.engine.targets import open_target
    with open_target(s.config.target("tgt")) as target:
        assert [(r["id"], r["v"]) for r in target.rows(schema)] == [(i, f"v{i}") for i in range(1, 21)]
