"""Generated dates and timestamps across and around every boundary (PostgreSQL's own ends
and ±infinity, Python's years 1..9999, year 0 / 1 BC, chrono's ±262143, the int64
nanosecond end in 2262, the int64 microsecond end), written at a real PostgreSQL source
and applied to a real Delta target (engine/targets/lake_values.py): every value either
arrives exactly (verification reads the Delta table back through its integers,
verify.arrow_rows) or its table is held on the Delta target with a message naming the
table, the column and the value, the Delta table unchanged; never silently different.

One CDC set-up for the whole run (one table, rows added, changed and deleted example
after example); each hypothesis example is one batch, and ends with the table released
(the far dates changed at the source) and equal, so the next starts from a clean table.
Which rows Delta must refuse is asked of PostgreSQL itself (``d < '0001-01-01' OR d >
'9999-12-31'``), not of the code under test.
"""
from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from airflow_provider_dblog.engine.targets import open_target
from airflow_provider_dblog.engine.values import (INT64_MAX, days_from_civil, date_from_days,
                                                  pg_date_text, pg_timestamp_text, timestamp_from_us)

POSTGRES = pytest.mark.parametrize("src_db", ["postgres"], indirect=True)
DAY_US = 86_400_000_000


def _days(y: int, m: int = 1, d: int = 1) -> int:
    return days_from_civil(y, m, d)


PG_MIN_DAYS, PG_MAX_DAYS = _days(-4713, 11, 24), _days(5874897, 12, 31)   # 4714-11-24 BC .. 5874897-12-31
PG_MIN_US, TS_MAX_US = PG_MIN_DAYS * DAY_US, INT64_MAX - 1   # past INT64_MAX-1: not carried at all (tail)
DATE_EDGES = [PG_MIN_DAYS, PG_MAX_DAYS, _days(0), _days(1) - 1, _days(1), _days(9999, 12, 31), _days(10000),
              _days(-262143), _days(262142, 12, 31), _days(262143), 0, -1]
TS_EDGES = [PG_MIN_US, TS_MAX_US, _days(1) * DAY_US, _days(1) * DAY_US - 1, _days(10000) * DAY_US - 1,
            _days(10000) * DAY_US, _days(0) * DAY_US, 9_223_372_036_854_775, -9_223_372_036_854_775, -1, 0,
            _days(262143) * DAY_US, _days(-262143) * DAY_US]
IN_DELTA = (_days(1), _days(9999, 12, 31))   # what Delta holds of a date (measured: lake_values.DELTA_RANGES)


def _around(edges: list[int], lo: int, hi: int) -> st.SearchStrategy[int]:
    near = st.tuples(st.sampled_from(edges), st.integers(-2, 2)).map(lambda e: min(max(e[0] + e[1], lo), hi))
    return st.one_of(near, st.integers(lo, hi))


def _date() -> st.SearchStrategy[str | None]:
    plain = st.integers(IN_DELTA[0], IN_DELTA[1]).map(lambda d: pg_date_text(date_from_days(d)))
    far = st.one_of(st.sampled_from(["infinity", "-infinity"]),
                    _around(DATE_EDGES, PG_MIN_DAYS, PG_MAX_DAYS).map(lambda d: pg_date_text(date_from_days(d))))
    # mostly dates Delta holds, so that batches pass as well as stop
    return st.one_of(st.none(), plain, plain, plain, plain, far)


def _timestamp(aware: bool) -> st.SearchStrategy[str | None]:
    values = _around(TS_EDGES, PG_MIN_US, TS_MAX_US).map(lambda us: pg_timestamp_text(timestamp_from_us(us), aware))
    return st.one_of(st.none(), values, st.sampled_from(["infinity", "-infinity"]))


ROWS = st.lists(st.tuples(_date(), _timestamp(False), _timestamp(True)), min_size=1, max_size=4)


def _lake_table(cdc, schema) -> pa.Table:
    with open_target(cdc.cfg.target("lake")) as t:
        return t.read(schema).sort_by("id")


@POSTGRES
def test_generated_far_dates_and_timestamps_arrive_exactly_or_hold_their_table(src_db, make_cdc):
    with src_db.cursor() as cur:
        src_db.create_table(cur, "t", "id integer PRIMARY KEY, d date, ts timestamp, tz timestamptz")
        src_db.create_table(cur, "u", "id integer PRIMARY KEY, v integer")
    cdc = make_cdc(["t", "u"], lake=True)
    cdc.start_tail()
    t, u = f"{cdc.db}.t", f"{cdc.db}.u"
    ids: list[int] = []
    seen = {"held": 0, "applied": 0}
    cdc.drain()
    assert {r["status"] for r in cdc.apply_local("lake").values()} <= {"empty", "up_to_date"}   # tables made

    @settings(max_examples=30, deadline=None, derandomize=True, database=None,
              phases=[Phase.explicit, Phase.generate])   # no shrinking: the servers' state goes on
    @given(new=ROWS, changed=st.lists(st.tuples(st.integers(0, 10_000), _date(), _timestamp(False),
                                                 _timestamp(True)), max_size=2),
           delete=st.integers(0, 10_000) | st.none())
    def batch(new, changed, delete):
        before = _lake_table(cdc, cdc.source.table_schema(t))
        with src_db.cursor() as cur:
            cur.execute("SET DateStyle = 'ISO, YMD'")
            for row in new:
                ids.append(len(ids) + 1)
                cur.execute("INSERT INTO t VALUES (%s, %s, %s, %s)", (ids[-1],) + row)
            for pick, *row in changed:
                cur.execute("UPDATE t SET d = %s, ts = %s, tz = %s WHERE id = %s", (*row, ids[pick % len(ids)]))
            if delete is not None:
                cur.execute("DELETE FROM t WHERE id = %s", (ids[delete % len(ids)],))
            cur.execute("INSERT INTO u VALUES (%s, %s)", (len(ids), len(new)))
            cur.execute("SELECT d::text FROM t WHERE d < '0001-01-01' OR d > '9999-12-31' ORDER BY id")
            far = [r[0] for r in cur.fetchall()]
        cdc.drain()
        res = cdc.apply_local("lake")
        assert res[u]["status"] == "applied", res   # the other table of the run goes on
        cdc.assert_equal("u", target="lake")
        if not far:
            assert res[t]["status"] == "applied", (res, new, changed)
            cdc.assert_equal("t", target="lake")
            seen["applied"] += 1
            return
        seen["held"] += 1
        assert res[t]["status"] == "held", (res, far)
        error = res[t]["held"]["error"]
        assert any(f"{t}.d = {v!r}" in error for v in far), (error, far)
        assert "0001-01-01 to 9999-12-31" in error, error
        assert _lake_table(cdc, cdc.source.table_schema(t)).equals(before)   # nothing of the batch written
        with src_db.cursor() as cur:   # changed at the source: the table is released
            cur.execute("UPDATE t SET d = NULL WHERE d < '0001-01-01' OR d > '9999-12-31'")
        cdc.drain()
        res = cdc.apply_local("lake")
        assert res[t]["status"] == "applied", res
        cdc.assert_equal("t", "u", target="lake")

    batch()
    assert seen["held"] and seen["applied"], seen   # both outcomes were met
    cdc.assert_equal("t", "u", target="lake")


@POSTGRES
def test_a_far_date_filled_by_a_change_of_shape_holds_only_its_table(src_db, make_cdc):
    """A column added with a default Delta cannot hold fills the existing rows without row
    events: the Delta target's rewrite of the table (delta_evolve) is refused with the
    message, its table held at the change; the other table and the PostgreSQL target go on."""
    with src_db.cursor() as cur:
        src_db.create_table(cur, "f", "id integer PRIMARY KEY, v integer")
        src_db.create_table(cur, "u", "id integer PRIMARY KEY, v integer")
    cdc = make_cdc(["f", "u"], lake=True)
    cdc.start_tail()
    with src_db.cursor() as cur:
        cur.execute("INSERT INTO f VALUES (1, 1), (2, 2)")
    cdc.drain()
    f, u = f"{cdc.db}.f", f"{cdc.db}.u"
    assert cdc.apply_local("lake")[f]["status"] == "applied"
    with src_db.cursor() as cur:
        cur.execute("ALTER TABLE f ADD COLUMN d date NOT NULL DEFAULT 'infinity'")
        cur.execute("INSERT INTO f VALUES (3, 3, '2000-01-01')")   # (the log shows the new shape with it)
        cur.execute("INSERT INTO u VALUES (1, 1)")
    cdc.drain()
    for _ in range(2):   # held again on the next run, the other table still going on
        res = cdc.apply_local("lake")
        assert res[u]["status"] in ("applied", "up_to_date"), res
        assert res[f]["status"] == "held", res
        error = res[f]["held"]["error"]
        assert f"{f}.d = 'infinity'" in error and "0001-01-01 to 9999-12-31" in error, error
    cdc.assert_equal("u", target="lake")
    with open_target(cdc.cfg.target("lake")) as t:   # the table as it was before the change
        assert t.read(f).column_names[:2] == ["id", "v"] and t.count(f) == 2
    for _ in range(2):
        cdc.apply_local("tgt")
    cdc.assert_equal("f", "u")   # the PostgreSQL target holds it
