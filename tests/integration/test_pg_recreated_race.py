"""PostgreSQL: a table whose changes the tail skips (its REPLICA IDENTITY no longer FULL)
stays quarantined while they are skipped (the schema fuzzer's seed 5, sequence 6).

The tail breaks the table once, at its first Relation that is not FULL, and skips its
changes from there on. A full dump that read the table after that break releases the
quarantine (engine/quarantine.py); the changes skipped after that dump were then lost
without a trace: the target stayed at the dump's rows with status 'applied'. Now the first
change skipped after each watermark (so after any dump's head read) breaks the table
again: the target stops there until a dump after it, which holds those rows.
"""
from __future__ import annotations

import pytest


pytestmark = pytest.mark.parametrize("src_db", ["postgres"], indirect=True)


def _run(src_db, *statements: str) -> None:
    with src_db.cursor() as cur:
        for s in statements:
            cur.execute(s)


def test_changes_skipped_after_a_releasing_dump_quarantine_the_table_again(src_db, make_cdc):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id INT PRIMARY KEY, v INT")
        src_db.create_table(cur, "u", "id INT PRIMARY KEY, v INT")
    cdc = make_cdc(["t", "u"])
    cdc.start_tail()
    _run(src_db, "INSERT INTO t VALUES (1, 1), (2, 2), (3, 3)", "INSERT INTO u VALUES (1, 1)")
    cdc.drain()
    assert cdc.apply_local()[f"{cdc.db}.t"]["status"] == "applied"

    # the break: the table's changes are skipped from its next Relation on
    _run(src_db, "ALTER TABLE t REPLICA IDENTITY DEFAULT", "UPDATE t SET v = 20 WHERE id = 2")
    cdc.drain()
    # a full dump after the break: it reads rows 1, 2 (v 20), 3
    cdc.dump_local("t")
    # changes after the dump, still not FULL: skipped by the tail
    _run(src_db, "DELETE FROM t WHERE id = 1", "INSERT INTO t VALUES (4, 4)", "UPDATE t SET v = 30 WHERE id = 3",
         "INSERT INTO u VALUES (2, 2)")
    cdc.drain()
    assert cdc.tail_error is None
    res = cdc.apply_local()
    assert res[f"{cdc.db}.u"]["status"] == "applied", res
    t = res[f"{cdc.db}.t"]
    # before the fix: 'applied', the target holding 1, 2, 3 (v 3) and not 4: silently different
    assert t["status"] == "quarantined", (t, cdc.compare("t").describe(3))
    assert "skipped" in t["quarantined"]["why"], t

    # a dump after those changes releases it, and the target equals the source
    cdc.dump_local("t")
    res = cdc.apply_local()
    assert res[f"{cdc.db}.t"]["status"] == "applied", res
    cdc.assert_equal("t", "u")

    # still not FULL: a change after that dump stops the table again (never silent)
    _run(src_db, "INSERT INTO t VALUES (5, 5)", "DELETE FROM t WHERE id = 4")
    cdc.drain()
    assert cdc.apply_local()[f"{cdc.db}.t"]["status"] == "quarantined"

    # REPLICA IDENTITY FULL again, then a dump: released, equal, and its changes flow
    _run(src_db, "ALTER TABLE t REPLICA IDENTITY FULL", "UPDATE t SET v = 6 WHERE id = 5")
    cdc.drain()
    cdc.dump_local("t")
    _run(src_db, "UPDATE t SET v = 7 WHERE id = 5", "DELETE FROM t WHERE id = 2")
    cdc.drain()
    res = cdc.apply_local()
    assert res[f"{cdc.db}.t"]["status"] == "applied", res
    cdc.assert_equal("t", "u")
