"""One table's apply failing for a reason of its own (a constraint added to its target table
by hand, a bug) does not stop the run's other tables: they are applied, the failed one keeps
its position (nothing lost: its next apply after the fix takes the same events), and the run
fails naming it (TablesNotAppliedError, the table's own error as its cause)."""
from __future__ import annotations

import psycopg2.errors
import pytest
from psycopg2 import sql

from airflow_provider_dblog.engine.errors import TablesNotAppliedError
from airflow_provider_dblog.engine.targets import PostgresTarget, target_table_name


@pytest.mark.parametrize("src_db", ["mariadb"], indirect=True)   # (the apply is the engine's, not the source's)
def test_a_table_whose_apply_fails_stops_only_itself(src_db, make_cdc):
    tables = ["a", "t", "u"]
    with src_db.cursor() as cur:
        for n in tables:
            src_db.create_table(cur, n, "id INT PRIMARY KEY, v INT")
            cur.execute(f"INSERT INTO {n} VALUES (1, 1)")
    cdc = make_cdc(tables)
    cdc.start_tail()
    for n in tables:
        cdc.dump_local(n)
    cdc.apply_local()
    tcfg = cdc.cfg.target("tgt")
    t_name = target_table_name(cdc.source.table_schema(f"{cdc.db}.t"))
    with PostgresTarget(tcfg) as tgt, tgt.conn, tgt.conn.cursor() as cur:   # by hand, in the warehouse
        cur.execute(sql.SQL("ALTER TABLE {}.{} ADD CONSTRAINT small CHECK (v < 100)").format(
            sql.Identifier(tcfg.schema), sql.Identifier(t_name)))
    with src_db.cursor() as cur:
        for n in tables:
            cur.execute(f"INSERT INTO {n} VALUES (2, 500)")
    cdc.drain()
    def applied_t():
        with cdc.target() as tgt:
            return tgt.applied_pos("src", cdc.source.table_schema(f"{cdc.db}.t"))
    before = applied_t()
    with pytest.raises(TablesNotAppliedError, match=rf"1 table\(s\) failed.*{cdc.db}\.t: CheckViolation") as caught:
        cdc.apply_local()
    assert isinstance(caught.value.__cause__, psycopg2.errors.CheckViolation)
    results = caught.value.results
    assert results[f"{cdc.db}.t"]["status"] == "failed", results
    assert all(results[f"{cdc.db}.{n}"]["status"] == "applied" for n in ("a", "u")), results
    cdc.assert_equal("a", "u")   # (applied past the failed table, before and after it in the run)
    assert applied_t() == before

    with PostgresTarget(tcfg) as tgt, tgt.conn, tgt.conn.cursor() as cur:   # fixed: the same events go in
        cur.execute(sql.SQL("ALTER TABLE {}.{} DROP CONSTRAINT small").format(
            sql.Identifier(tcfg.schema), sql.Identifier(t_name)))
    assert cdc.apply_local()[f"{cdc.db}.t"]["status"] == "applied"
    cdc.assert_equal(*tables)
