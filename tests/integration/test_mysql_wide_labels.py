"""ENUM / SET labels with characters outside the BMP, on every path: information_schema and
SHOW CREATE TABLE (utf8mb3) print each such character as '?', so the shape's labels come
from the server's own text of each label's number (catalog._true_labels). A label that
really is '?' stays itself; two labels that differ only in which such character they hold
(a _bin collation) stay two. The log (either decoder), a range dump chunked by an ENUM key
(its bounds are label numbers, convert.key_sql_value) and the apply give the same labels.

The decoders alone: tests/integration/test_mes_break.py (test_enum_and_set_labels_...).
"""
from __future__ import annotations

import pytest

MARIADB = pytest.mark.parametrize("src_db", ["mariadb"], indirect=True)

WIDE = "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
KEYS = ("?", "\U0001d11e", "\U0001f600", "a\U0001d11e")          # the ENUM key's labels
MEMBERS = ("p", "\U0001d11e", "?", "\U0001f600")                  # the SET's
SETS = ("\U0001d11e", "?,\U0001f600", "", "p,\U0001d11e,?,\U0001f600")
GENERAL = ("?", "\U0001d11e")                                     # utf8mb4_general_ci


def _labels(labels) -> str:
    return ", ".join(f"'{v}'" for v in labels)


def _rows(first: int, count: int) -> list[tuple]:
    return [(KEYS[n % len(KEYS)], n, SETS[n % len(SETS)], GENERAL[n % 2]) for n in range(first, first + count)]


@MARIADB
@pytest.mark.parametrize("decoder", ["mysql-event-stream", "mysql-replication"])
def test_labels_outside_the_bmp_reach_the_target_by_log_and_by_dump(make_cdc, src_db, decoder):
    insert = "INSERT INTO w VALUES (%s, %s, %s, %s)"
    with src_db.cursor() as cur:
        src_db.create_table(cur, "w", f"k ENUM({_labels(KEYS)}) {WIDE} NOT NULL, n INT NOT NULL, "
                                      f"s SET({_labels(MEMBERS)}) {WIDE}, g ENUM({_labels(GENERAL)}) "
                                      "CHARACTER SET utf8mb4, PRIMARY KEY (k, n)")
        cur.executemany(insert, _rows(0, 12))                     # there before the tail: the dump carries them
    cdc = make_cdc(["w"], source={"decoder": decoder}, dump={"chunk_size": 3})
    native = cdc.source.native_columns(f"{cdc.db}.w")
    assert (native["k"].set_values, native["s"].set_values, native["g"].set_values) == (KEYS, MEMBERS, GENERAL)
    cdc.start_tail()
    with src_db.cursor() as cur:
        cur.executemany(insert, _rows(100, 12))                   # the log carries them
        cur.execute("UPDATE w SET k = '\U0001f600', s = '?', g = '\U0001d11e' WHERE n = 100")   # a key change
        cur.execute("UPDATE w SET s = '\U0001d11e,\U0001f600' WHERE n = 105")
        cur.execute("DELETE FROM w WHERE n = 106")
    cdc.drain()
    rid = cdc.dump_local("w")   # range chunks bounded by the ENUM key's labels (their numbers)
    assert cdc.state.progress(rid, f"{cdc.db}.w")["chunks"] >= 4
    res = cdc.apply_local()[f"{cdc.db}.w"]
    assert res["status"] == "applied", res
    cdc.assert_equal("w")
    # a dump alone into a damaged target
    with cdc.target() as t, t.conn, t.conn.cursor() as cur:
        cur.execute(f'UPDATE "{t.schema}"."{cdc.db}__w" SET s = \'x\', g = NULL')
        cur.execute(f'DELETE FROM "{t.schema}"."{cdc.db}__w" WHERE n % 3 = 0')
    cdc.dump_local("w")
    assert cdc.apply_local()[f"{cdc.db}.w"]["status"] == "applied"
    cdc.assert_equal("w")
    with cdc.target() as t, t.conn.cursor() as cur:   # the labels themselves, not only equal reads
        cur.execute(f'SELECT n, k, s, g FROM "{t.schema}"."{cdc.db}__w" ORDER BY n')
        expected = {n: (k, s, g) for k, n, s, g in _rows(0, 12) + _rows(100, 12) if n != 106}
        expected[100] = ("\U0001f600", "?", "\U0001d11e")
        expected[105] = (KEYS[1], "\U0001d11e,\U0001f600", "\U0001d11e")
        assert {n: (k, s, g) for n, k, s, g in cur.fetchall()} == expected
