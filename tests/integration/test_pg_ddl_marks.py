"""PostgreSQL: DDL that rewrites a captured table's values with no row change in the log
and no shape a Relation message shows (issue 27, case 1's last blind spots): an enum
label renamed, a composite type's attributes changed, a column rewritten by ALTER ...
TYPE ... USING. The tail's event trigger marks each ALTER TABLE / ALTER TYPE in the log
(engine/sources/postgres/ddl_marks.py); the table is quarantined there, the others go on,
and a dump releases it. DDL that keeps every value (ADD VALUE, a type without USING, a
rename of the type) flows.
"""
from __future__ import annotations

import pytest

from airflow_provider_dblog.engine.sources.postgres.ddl_marks import rewrites, trigger_name

pytestmark = pytest.mark.parametrize("src_db", ["postgres"], indirect=True)


def _run(src_db, *statements: str) -> None:
    with src_db.cursor() as cur:
        for s in statements:
            cur.execute(s)


CASES = {
    # id: (types, t's columns, first row, DDL and writes, rewrites?, named in the quarantine)
    "enum-label-renamed": ("CREATE TYPE mood AS ENUM ('sad', 'ok')", "m mood", "'sad'",
                           ["ALTER TYPE mood RENAME VALUE 'sad' TO 'glum'"], True, "RENAME VALUE"),
    "enum-array-label-renamed": ("CREATE TYPE mood AS ENUM ('sad', 'ok')", "m mood[]", "'{sad,ok}'",
                                 ["ALTER TYPE mood RENAME VALUE 'ok' TO 'fine'"], True, "RENAME VALUE"),
    "enum-domain-label-renamed": ("CREATE TYPE mood AS ENUM ('sad', 'ok'); CREATE DOMAIN dmood AS mood",
                                  "m dmood", "'ok'", ["ALTER TYPE mood RENAME VALUE 'ok' TO 'fine'"], True,
                                  "RENAME VALUE"),
    "composite-attribute-added": ("CREATE TYPE pair AS (a int, b int)", "m pair[]", "'{\"(1,2)\"}'",
                                  ["ALTER TYPE pair ADD ATTRIBUTE c int"], True, "ADD ATTRIBUTE"),
    "same-type-using": ("", "m numeric(10,2)", "12.34",
                        ["ALTER TABLE t ALTER COLUMN m TYPE numeric(10,2) USING m * 2"], True, "USING"),
    "wider-type-using": ("", "m int", "7", ["ALTER TABLE t ALTER COLUMN m SET DATA TYPE bigint USING m + 1000"],
                         True, "USING"),
    "using-in-a-do-block": ("", "m int", "7",
                            ["DO $$ BEGIN ALTER TABLE t ALTER m TYPE int USING m * 3; END $$"], True, "USING"),
    "using-with-other-clauses": ("", "m text", "'a'",
                                 ["ALTER TABLE ONLY t ADD COLUMN z int, ALTER COLUMN m TYPE text USING upper(m)"],
                                 True, "USING"),
    "enum-value-added": ("CREATE TYPE mood AS ENUM ('sad', 'ok')", "m mood", "'sad'",
                         ["ALTER TYPE mood ADD VALUE 'happy'"], False, ""),
    "enum-type-renamed": ("CREATE TYPE mood AS ENUM ('sad', 'ok')", "m mood", "'sad'",
                          ["ALTER TYPE mood RENAME TO feeling"], False, ""),
    "widened-without-using": ("", "m int", "7", ["ALTER TABLE t ALTER COLUMN m TYPE bigint"], False, ""),
    "another-tables-using": ("", "m int", "7",
                             ["CREATE TABLE other (id int PRIMARY KEY, m int)",
                              "ALTER TABLE other ALTER COLUMN m TYPE int USING m * 2"], False, ""),
}


@pytest.mark.parametrize("how", ["live", "tail-stopped"])
@pytest.mark.parametrize("case", list(CASES))
def test_ddl_that_rewrites_values_without_row_changes_quarantines_only_its_table(src_db, make_cdc, case, how):
    types, column, first, ddl, rewritten, named = CASES[case]
    if types:
        _run(src_db, *types.split("; "))
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", f"id INT PRIMARY KEY, {column}")
        src_db.create_table(cur, "u", "id INT PRIMARY KEY, v INT")
    cdc = make_cdc(["t", "u"])
    cdc.start_tail()
    _run(src_db, f"INSERT INTO t VALUES (1, {first}), (2, NULL)", "INSERT INTO u VALUES (1, 1)")
    cdc.drain()
    assert cdc.apply_local()[f"{cdc.db}.t"]["status"] == "applied"
    if how == "tail-stopped":
        cdc.stop_tail()
    _run(src_db, *ddl, "INSERT INTO t (id) VALUES (3)", "INSERT INTO u VALUES (2, 2)")
    if how == "tail-stopped":
        cdc.start_tail()
    cdc.drain()
    assert cdc.tail_error is None
    res = cdc.apply_local()
    assert res[f"{cdc.db}.u"]["status"] == "applied", res
    t = res[f"{cdc.db}.t"]
    if rewritten:
        assert t["status"] == "quarantined" and named in t["quarantined"]["why"], t
        cdc.dump_local("t")
        assert cdc.apply_local()[f"{cdc.db}.t"]["status"] == "applied"
    else:
        assert t["status"] == "applied", t
    cdc.source.refresh_schema(f"{cdc.db}.t")
    cdc.assert_equal("t", "u")


def test_the_event_trigger_is_dropped_with_the_log(src_db, make_cdc):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT")
    cdc = make_cdc(["t"])
    cdc.source.prepare_log()
    name = trigger_name(cdc.source.namespace)
    with src_db.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_event_trigger WHERE evtname = %s", (name,))
        assert cur.fetchone()[0] == 1
        cdc.source.drop_log()
        cur.execute("SELECT count(*) FROM pg_event_trigger WHERE evtname = %s", (name,))
        assert cur.fetchone()[0] == 0


@pytest.mark.parametrize("query, table, why", [
    ("alter table Shop.T alter column m type int using m", "shop.t", "column m"),
    ('ALTER TABLE "T" ALTER m TYPE int USING m', "app.T", "column m"),
    # the trigger names t, and no statement shown alters it: assumed a rewrite if it may be one
    ('ALTER TABLE "T" ALTER m TYPE int USING m', "app.t", "dynamic SQL"),
    ("ALTER TABLE t ADD CONSTRAINT c EXCLUDE USING gist (m WITH =)", "app.t", ""),
    ("ALTER TABLE t ADD PRIMARY KEY USING INDEX i, ALTER m TYPE bigint", "app.t", ""),
    ("ALTER TABLE IF EXISTS ONLY t ALTER COLUMN m SET DATA TYPE int USING (m + 1)", "app.t", "column m"),
    ("SELECT 1; ALTER TABLE u ALTER m TYPE int USING m; ALTER TABLE t ADD x int", "app.t", ""),
    ("SELECT run_ddl('t')", "app.t", ""),                                 # nothing that may rewrite
    ("SELECT run_ddl('t', 'TYPE int USING m * 2')", "app.t", "dynamic SQL"),
], ids=range(9))
def test_which_alter_table_statements_rewrite_a_table(query, table, why, src_db):
    got = rewrites({"tag": "ALTER TABLE", "object": table, "query": query}, table)
    assert (why in got if why else got == ""), got
